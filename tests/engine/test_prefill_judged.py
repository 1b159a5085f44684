"""`prefill-judged` (engine/swap_gain.py): a swap happens only when the newcomer's wait it saves,
scaled by the engine's load, exceeds the displaced decodes' delay; costs measured from steps."""

from __future__ import annotations

import pytest
from tier_engine_helpers import BLOCK, prompt, run_arrivals, tiny_engine

from hintkv.cache.block import Block
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.engine.admission import make_admission
from hintkv.engine.swap_gain import StepCosts
from tests.engine.test_prefill_fair import ARRIVALS
from tests.engine.test_scheduler import make_seq


def decode(rid: str, blocks: int, output: int, max_tokens: int):
    """A running decode holding `blocks` blocks alone, `output` tokens out of `max_tokens`."""
    seq = make_seq(rid, prompt(hash(rid) % 1000, blocks * BLOCK - output), max_tokens=max_tokens)
    seq.token_ids += [7] * output
    seq.num_computed_tokens = seq.num_tokens - 1
    seq.first_token_time = 1.0
    seq.block_table = [Block(i, ref_cnt=1) for i in range(blocks)]
    return seq


def judged(decode_s=0.01, token_s=0.001, busy=0.0):
    policy = make_admission("prefill-judged")
    c = policy.costs
    c.decode_s, c.token_s = decode_s, token_s
    c.busy_s, c.elapsed_s = busy, 1.0
    return policy


@pytest.fixture
def kv():
    return KVCacheManager(64, BLOCK, make_policy("lru"))


def test_an_idle_engine_swaps_only_for_a_newcomer_shorter_than_what_the_decode_has_left(kv):
    victim = decode("v", 4, 10, 110)  # 100 tokens to go: 1.0 s of decode steps
    short = make_seq("h", prompt(1, 4 * BLOCK), max_tokens=4)  # prefill 0.074 s + 0.04 s of decode
    long_ = make_seq("g", prompt(2, 4 * BLOCK), max_tokens=200)  # holds the room 2 s
    idle = judged()
    assert idle.swap_pays(short, [victim], [victim], 4, kv)
    assert not idle.swap_pays(long_, [victim], [victim], 4, kv)  # 0.074 + min(2, 1) > 1.0
    assert (idle.num_swaps_judged, idle.num_swaps_declined) == (2, 1)
    # the same swap on an engine busy 90% of the time: the wait it saves is worth 10x
    assert judged(busy=0.9).swap_pays(long_, [victim], [victim], 4, kv)


def test_a_decode_about_to_end_is_left_to_end(kv):
    ending = decode("e", 4, 108, 110)  # 2 tokens to go: its room comes back in 0.02 s
    head = make_seq("h", prompt(1, 4 * BLOCK), max_tokens=4)
    assert not judged().swap_pays(head, [ending], [ending], 4, kv)
    far = decode("f", 4, 10, 110)
    # the room comes from the one that ends first, so displacing the far one is judged against 0.02 s
    assert not judged().swap_pays(head, [far], [far, ending], 4, kv)
    assert judged().swap_pays(head, [far], [far], 4, kv)


def test_unmeasured_or_no_room_from_decodes_swaps_as_prefill_fair(kv):
    victim = decode("v", 2, 108, 110)
    head = make_seq("h", prompt(1, 4 * BLOCK), max_tokens=200)
    assert make_admission("prefill-judged").swap_pays(head, [victim], [victim], 2, kv)  # nothing measured
    assert judged().swap_pays(head, [victim], [victim], 20, kv)  # it frees 7 blocks when it ends, never 20


def test_step_costs_from_hand_timed_steps():
    c = StepCosts(window=4)
    c.observe(0.0, 0.01, num_seqs=2, prefill_tokens=0)  # decodes only
    assert c.decode_s == pytest.approx(0.01) and c.token_s is None
    c.observe(0.01, 0.11, num_seqs=3, prefill_tokens=100)  # 0.1 s: 0.01 decode + 100 x 0.001
    assert c.token_s == pytest.approx(0.0009)
    assert c.busy == pytest.approx(1.0)
    c.observe(1.11, 1.12, num_seqs=2, prefill_tokens=0)  # after a 1 s idle gap
    assert c.decode_s == pytest.approx(0.01)
    busy = 0.75 * (0.75 * 0.01 + 0.1) + 0.01
    assert c.busy == pytest.approx(busy / (busy + 1.0))
    c.observe(1.12, 1.2, num_seqs=0, prefill_tokens=0)  # a step that only waited for loads: idle
    assert c.busy < busy / (busy + 1.0)


def test_outputs_on_the_engine_are_a_roomy_devices(tmp_path):
    reference = run_arrivals(tiny_engine(kv_tokens=64 * BLOCK), ARRIVALS)[0]
    engine = tiny_engine(host_cache_memory="4MiB", scheduling_policy="prefill-judged", eviction_policy="sam")
    out, first, end = run_arrivals(engine, ARRIVALS)
    assert out == reference
    policy = engine.scheduler.admission
    assert policy.name == "prefill-judged" and policy.costs.decode_s is not None
