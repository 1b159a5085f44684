"""`prefill-first` (engine/admission_swap.py): a new prefill without room swaps running decodes out to
the host tier, on the real engine (dummy:tiny, a host tier): the newcomer's first token comes
before the decode it displaced finishes (under `short-first` it waits for it), the displaced
decode comes back by loading what it computed from the host (its session holds those blocks
while it waits: `SessionRegistry.hold`), each request is displaced at most once, and every
output is the one a roomy device gives. Without a lower tier nobody is swapped."""

from __future__ import annotations

from tier_engine_helpers import BLOCK, prompt, run_arrivals, tiny_engine

from tests.engine.test_scheduler import make_seq
from tests.engine.test_scheduling_policies import make_sched, step

A = prompt(11, 4 * BLOCK)  # a decodes 40 tokens: 7 of the 8 blocks by its end
B = prompt(12, 5 * BLOCK)  # arrives while a decodes; needs 6 blocks to its end: 2 of a's full ones


def run_pair(engine, hints: bool) -> tuple[dict[str, list[int]], dict[str, int], dict[str, int]]:
    """a starts and decodes a few tokens, then b arrives; (outputs, step of the first token, step
    of the end) per request."""
    return run_arrivals(engine, [("a", A, 40, 0), ("b", B, 4, 6)], hints)


def reference() -> dict[str, list[int]]:
    out, _, _ = run_pair(tiny_engine(kv_tokens=64 * BLOCK), hints=False)
    return out


def test_a_new_prefill_swaps_a_decode_out_to_the_host_and_outputs_stay_identical():
    ref = reference()
    for hints, policy in ((True, "sam"), (False, "lru")):
        engine = tiny_engine(host_cache_memory="4MiB", scheduling_policy="prefill-first", eviction_policy=policy,
                             hints=hints)
        out, first, end = run_pair(engine, hints)
        assert out == ref, (hints, policy)
        assert first["b"] < end["a"], "b waited for the decode to finish"
        assert engine.scheduler.num_preemptions == 1  # a, once
        stats = engine.tier_stats()
        assert stats["num_written_down"] >= 2  # what b took of a's computed blocks went down
        assert stats["blocks_moved"].get("host->device", 0) >= 2, "a was recomputed, not loaded back"
        assert stats["prompt_tokens_computed"] == len(A) + len(B)  # nothing was computed twice


def test_short_first_makes_the_newcomer_wait_for_the_decode():
    engine = tiny_engine(host_cache_memory="4MiB", scheduling_policy="short-first")
    _, first, end = run_pair(engine, hints=False)
    assert first["b"] > end["a"] - 1 and engine.scheduler.num_preemptions == 0


def test_without_a_lower_tier_nothing_is_swapped():
    """Device only, `prefill-first` schedules exactly as `short-first` (a swap would recompute)."""
    firsts = {}
    for policy in ("short-first", "prefill-first"):
        sched, clock = make_sched(policy, blocks=12, budget=32, seqs=4)
        got: dict[str, float] = {}
        sched.add_request(make_seq("a", list(range(20)), 24))
        for i in range(400):
            if i == 4:
                sched.add_request(make_seq("b", list(range(100, 130)), 2))
            got |= step(sched, clock, 32)
            if not sched.has_work():
                break
        assert sched.num_preemptions == 0
        firsts[policy] = got
    assert firsts["short-first"] == firsts["prefill-first"]
