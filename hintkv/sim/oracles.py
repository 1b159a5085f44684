"""The oracles of a `hintkv sim` report, taken run by run so that no run's accesses outlive it.

    book = OracleBook({"oracle": 52_000, "oracle+host": 260_000}, block_size=16, costs, budget=8192)
    for name in runs: res = simulate(...); book.take(name, res)   # res.accesses is emptied
    book.hit_rates, book.schedules, book.bounds()

A run's accesses (every call's prompt block hashes) are the biggest thing a run leaves: at full
scale (10 users, the whole trace set, 16-token blocks: 11,898 calls, 1.0G prompt tokens) about
63M references, 0.5 GB a run, and a report keeps 6-8 runs. The oracle of a tier is Belady at its
capacity over each run's own access order, best over the runs (a tie keeps the earlier run), and
the TTFT bound (`sim.bound`) needs the best order's accesses and per-access hits. So each run's
Belady passes run as soon as it ends (one `replay.farthest.AccessIndex` for all its capacities),
the bound's tier's bounds (at its hits and at compulsory misses) are taken when an order becomes
the best, and no run's accesses are kept. The figures are the ones the passes over all runs at
the end gave.
"""

from __future__ import annotations

from hintkv.replay.farthest import AccessIndex
from hintkv.replay.oracle import belady_at
from hintkv.sim.bound import bound_at_hits_s
from hintkv.sim.costs import CostModel

BOUND_TIERS = ("oracle+pool", "oracle+host")  # the TTFT bound's oracle: the first of these that runs


class OracleBook:
    def __init__(self, capacities: dict[str, int], block_size: int, costs: CostModel, budget: int) -> None:
        self.capacities = capacities  # oracle name -> capacity in blocks
        self.block_size, self.costs, self.budget = block_size, costs, budget
        self.hit_rates: dict[str, float] = {}
        self.schedules: dict[str, str] = {}  # oracle -> the run whose access order gave it
        self.num_accesses = 0
        self.bound_tier = next((n for n in BOUND_TIERS if n in capacities), None)
        self._bound_s: float | None = None
        self._compulsory_s: float | None = None  # at compulsory misses, on the bound's best order
        self.own_hits: dict[str, tuple[int, ...]] = {}  # run -> the bound tier's Belady hits per access
        self.own_compulsory: dict[str, tuple[int, ...]] = {}  # run -> its hits per access, unbounded

    def take(self, run: str, result) -> None:
        """Belady at each capacity over `result`'s accesses, then drop them."""
        accesses, result.accesses = result.accesses, []
        self.num_accesses = self.num_accesses or len(accesses)
        if not self.capacities:  # no oracle asked for: no index (5% of a 100-user run without one)
            return
        index = AccessIndex(accesses)  # hashes -> ids and next reads once for every capacity
        compulsory = ()
        if self.bound_tier is not None:  # the contended bound's hits at compulsory misses (sim.contended)
            compulsory = self.own_compulsory[run] = belady_at(index, None, self.block_size).access_hit_tokens
        for name, cap in self.capacities.items():
            best = belady_at(index, cap, self.block_size)
            if name == self.bound_tier:  # on the run's own order: where its TTFT is over it (sim.gap)
                self.own_hits[run] = best.access_hit_tokens
            if name in self.hit_rates and best.hit_rate <= self.hit_rates[name]:
                continue
            self.hit_rates[name], self.schedules[name] = best.hit_rate, run
            if name == self.bound_tier:
                self._bound_s = bound_at_hits_s(self.costs, accesses, best.access_hit_tokens, self.budget)
                self._compulsory_s = bound_at_hits_s(self.costs, accesses, compulsory, self.budget)

    def bounds(self) -> dict:
        """The TTFT bounds a report prints: at the bound tier's hits on its best order, and at
        compulsory misses on the same order ({} when no bound tier ran)."""
        if self.bound_tier is None or self._bound_s is None:
            return {}
        return {"oracle": self.bound_tier, "bound_s": self._bound_s, "compulsory_s": self._compulsory_s}
