"""`sim.oracles.OracleBook`: the report's oracles taken run by run give what Belady over every run's
accesses at the end gives, and no run's accesses outlive it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hintkv.replay import belady
from hintkv.replay.offline import Access
from hintkv.sim.bound import bound_at_hits_s, ttft_bound_s
from hintkv.sim.oracles import OracleBook

BS = 16


@dataclass
class _Run:
    accesses: list = field(default_factory=list)


def _acc(*chains: str) -> list[Access]:
    """One access per string: its prompt blocks are the string's letters (a 4-block prompt is 64 tokens
    plus one more, so every block counts), it writes the same blocks."""
    return [Access([c.encode() for c in s], len(s) * BS + 1, [c.encode() for c in s]) for s in chains]


def test_run_by_run_gives_the_end_of_report_figures_and_drops_the_accesses(costs):
    # at 2 blocks the first two orders hit differently; at 3 the last ties the second on hit rate
    # with other prompts and other hits per access, so its bound is not the best order's
    orders = {"lru": _acc("ab", "cd", "ab", "cd", "ab"),
              "lru+host": _acc("ab", "ab", "ab", "cd", "cd"),
              "sam+hints+host": _acc("ab", "ab", "a", "abcd", "a")}
    caps = {"oracle": 2, "oracle+host": 3}
    budget = 32  # below the prompts: the chunking shows in the bound
    want = {n: max(((belady(a, c, BS).hit_rate, r) for r, a in orders.items()), key=lambda x: x[0])
            for n, c in caps.items()}  # max keeps the first of a tie
    assert belady(orders["lru"], 2, BS).hit_rate < belady(orders["lru+host"], 2, BS).hit_rate
    last = belady(orders["sam+hints+host"], caps["oracle+host"], BS)
    second = belady(orders["lru+host"], caps["oracle+host"], BS)
    assert last.hit_rate == second.hit_rate and last.access_hit_tokens != second.access_hit_tokens
    assert (bound_at_hits_s(costs, orders["sam+hints+host"], last.access_hit_tokens, budget)
            != bound_at_hits_s(costs, orders["lru+host"], second.access_hit_tokens, budget))
    best = orders[want["oracle+host"][1]]
    book = OracleBook(caps, BS, costs, budget)
    runs = {r: _Run(list(a)) for r, a in orders.items()}
    for name, run in runs.items():
        book.take(name, run)
        assert run.accesses == []  # dropped as soon as its passes ran
    assert book.hit_rates == {n: w[0] for n, w in want.items()}
    assert book.schedules == {n: w[1] for n, w in want.items()}
    assert book.schedules["oracle+host"] == "lru+host"  # the tie went to the earlier run
    assert book.num_accesses == 5
    assert book.own_hits == {r: belady(a, caps["oracle+host"], BS).access_hit_tokens for r, a in orders.items()}
    hits = belady(best, caps["oracle+host"], BS).access_hit_tokens
    assert book.bounds() == {"oracle": "oracle+host", "bound_s": bound_at_hits_s(costs, best, hits, budget),
                             "compulsory_s": ttft_bound_s(costs, best, None, BS, budget)}


def test_no_bound_without_a_host_or_pool_oracle(costs):
    book = OracleBook({"oracle": 2}, BS, costs, 8192)
    book.take("lru", _Run(_acc("ab", "ab")))
    assert book.bounds() == {} and book.hit_rates["oracle"] == belady(_acc("ab", "ab"), 2, BS).hit_rate
