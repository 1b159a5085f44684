"""`prefill-judged` (engine/swap_gain.py): a swap happens only when the newcomer's wait it saves,
scaled by the engine's load, exceeds the displaced decodes' delay; costs measured from steps."""

from __future__ import annotations

import pytest
import torch
from tier_engine_helpers import BLOCK, prompt, run_arrivals, tiny_engine

from hintkv.cache.block import Block
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.tier_connector import TierConnector
from hintkv.engine.admission import make_admission
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.swap_gain import StepCosts, remaining
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack
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


def judged(kv, decode_s=0.01, token_s=0.001, busy=0.0):
    """A prefill-judged policy with preset costs: a decode step `decode_s` (its own measurement),
    a prefill token `token_s` (the tier connector's, the one owner of that figure)."""
    policy = make_admission("prefill-judged")
    c = policy.costs
    c.average = decode_s
    c.busy_s, c.elapsed_s = busy, 1.0
    kv.tiers.costs.prefill_s_per_token = token_s
    return policy


def tiered_kv(blocks: int, block_size: int) -> KVCacheManager:
    """A device pool of `blocks` blocks over a host tier (swaps need somewhere to go)."""
    kv = KVCacheManager(blocks, block_size, make_policy("lru"))
    io = DeviceBlockIO([torch.zeros(2, blocks, block_size, 1, 2) for _ in range(2)])
    kv.tiers = TierConnector(kv.pool, block_size, TierStack([HostTier(io.layout, 4 * blocks * io.layout.nbytes)]),
                             io, kv.ranking, hints=False)
    return kv


@pytest.fixture
def kv():
    return tiered_kv(64, BLOCK)


def test_an_idle_engine_swaps_only_for_a_newcomer_shorter_than_what_the_decode_has_left(kv):
    victim = decode("v", 4, 10, 110)  # 100 tokens to go: 1.0 s of decode steps
    short = make_seq("h", prompt(1, 4 * BLOCK), max_tokens=4)  # prefill 0.074 s + 0.04 s of decode
    long_ = make_seq("g", prompt(2, 4 * BLOCK), max_tokens=200)  # holds the room 2 s
    idle = judged(kv)
    assert idle.swap_pays(short, [victim], [victim], 4, 0, kv)
    assert not idle.swap_pays(long_, [victim], [victim], 4, 0, kv)  # 0.074 + min(2, 1) > 1.0
    assert (idle.num_judgements, idle.num_declined) == (2, 1)
    # the same swap on an engine busy 90% of the time: the wait it saves is worth 10x
    assert judged(kv, busy=0.9).swap_pays(long_, [victim], [victim], 4, 0, kv)
    # its prompt cached on the device but for one block: the prefill left is 16 tokens
    assert not judged(kv, token_s=0.3).swap_pays(short, [victim], [victim], 4, 0, kv)
    assert judged(kv, token_s=0.03).swap_pays(short, [victim], [victim], 4, 3, kv)
    assert not judged(kv, token_s=0.03).swap_pays(short, [victim], [victim], 4, 0, kv)


def test_a_sequence_about_to_end_is_left_to_end(kv):
    ending = decode("e", 4, 108, 110)  # 2 tokens to go: its room comes back in 0.02 s
    head = make_seq("h", prompt(1, 4 * BLOCK), max_tokens=4)
    assert not judged(kv).swap_pays(head, [ending], [ending], 4, 0, kv)
    far = decode("f", 4, 10, 110)
    # the room comes from the one that ends first, so displacing the far one is judged against 0.02 s
    assert not judged(kv).swap_pays(head, [far], [far, ending], 4, 0, kv)
    assert judged(kv).swap_pays(head, [far], [far], 4, 0, kv)
    # any running sequence that ends frees room: a decode swapped before (no victim) or a prefill
    ending.num_preemptions = 1
    assert not judged(kv).swap_pays(head, [far], [far, ending], 4, 0, kv)
    prefill = decode("p", 4, 0, 1)
    prefill.num_computed_tokens = 3 * BLOCK  # 16 prompt tokens then 1 output: 0.016 + 0.01 s
    prefill.first_token_time = None
    assert not judged(kv).swap_pays(head, [far], [far, prefill], 4, 0, kv)


def test_remaining_outputs_are_capped_by_the_models_length():
    seq = decode("d", 4, 10, 1000)  # 64 tokens now, 990 outputs to go by max_tokens
    assert remaining(seq) == 990
    assert remaining(seq, max_model_len=100) == 36


def test_unmeasured_or_no_room_from_decodes_swaps_as_prefill_fair(kv):
    victim = decode("v", 2, 108, 110)
    head = make_seq("h", prompt(1, 4 * BLOCK), max_tokens=200)
    assert make_admission("prefill-judged").swap_pays(head, [victim], [victim], 2, 0, kv)  # nothing measured
    assert judged(kv).swap_pays(head, [victim], [victim], 20, 0, kv)  # it frees 7 blocks when it ends, never 20


def test_step_costs_from_hand_timed_steps():
    c = StepCosts(window=4)
    c.observe(0.0, 0.6, num_seqs=1, prefill_tokens=0)  # a fresh engine's first (warm-up) decode step
    c.observe(0.6, 0.61, num_seqs=2, prefill_tokens=0)
    assert c.decode_s is None  # two samples: not measured yet
    c.observe(0.61, 0.71, num_seqs=3, prefill_tokens=100)  # a prefill step: no decode sample
    c.observe(0.71, 0.72, num_seqs=2, prefill_tokens=0)
    assert c.decode_s == pytest.approx(0.01)  # the median: the warm-up step does not count
    assert c.busy == pytest.approx(1.0)
    for _ in range(5):
        c.observe(c.last_end, c.last_end + 0.01, num_seqs=2, prefill_tokens=0)
    assert c.average == pytest.approx(0.01)  # 8 samples: their median seeds the moving average
    c.observe(1.8, 1.82, num_seqs=2, prefill_tokens=0)  # after an idle gap of ~1 s
    assert c.decode_s == pytest.approx(0.75 * 0.01 + 0.25 * 0.02)
    assert c.busy < 0.5
    c.observe(1.82, 1.9, num_seqs=0, prefill_tokens=0)  # a step that only waited for loads: idle
    frozen = StepCosts()
    for _ in range(10):  # a clock that does not move measures nothing: swaps as prefill-fair
        frozen.observe(5.0, 5.0, num_seqs=2, prefill_tokens=0)
    assert frozen.decode_s is None


class StepClock:
    """Time moves only while a step runs: 1 ms per batched token."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def swap_scenario(token_s: float, *first_seqs, admission: str = "prefill-judged"
                  ) -> tuple[Scheduler, dict[str, int], dict[str, int]]:
    """A decode `a` holds 6 of the device's 8 blocks (to its end); after 6 steps `b` arrives,
    needing 4: a swap gives it the room at once. Decode steps are measured on the scheduler's
    clock (1 ms), a prefill token is `token_s`; (scheduler, step of the first token, of the end)."""
    kv = tiered_kv(8, 4)
    kv.tiers.costs.prefill_s_per_token = token_s
    clock = StepClock()
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, admission=admission, clock=clock)
    for seq in first_seqs or (make_seq("a", list(range(100, 112)), max_tokens=12),):
        sched.add_request(seq)
    first: dict[str, int] = {}
    end: dict[str, int] = {}
    for i in range(60):
        if i == 6:
            sched.add_request(make_seq("b", list(range(200, 212)), max_tokens=4))
        out = sched.schedule()
        kv.flush_write_downs()  # as LLMEngine.step: the victims this pass reuses go down first
        clock.t += 0.001 * out.num_batched_tokens
        outs = sched.update_from_output(
            out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
        sched.check_integrity()
        sched.admission.check_integrity()
        for o in outs:
            if o.new_token_ids:
                first.setdefault(o.request_id, i)
            if o.finished:
                end[o.request_id] = i
        if len(end) == 1 + max(1, len(first_seqs)):
            return sched, first, end
    raise AssertionError("the requests never finished")


def test_a_declined_swap_keeps_the_decode_running_and_a_paying_one_swaps():
    # b's prefill at 50 ms a token (0.6 s) costs far more than the 6 ms a's end saves it: declined
    sched, first, end = swap_scenario(token_s=0.05)
    policy = sched.admission
    assert policy.num_declined > 0 and sched.num_preemptions == 0
    assert end["a"] < first["b"]  # b waited for a's room
    # at 1 ms a token (12 ms) the wait it saves, x20 on this saturated engine (0.12 s), pays
    sched, first, end = swap_scenario(token_s=0.001)
    assert sched.num_preemptions == 1 and sched.admission.num_declined == 0
    assert first["b"] < end["a"]
def test_outputs_on_the_engine_are_a_roomy_devices(tmp_path):
    reference = run_arrivals(tiny_engine(kv_tokens=64 * BLOCK), ARRIVALS)[0]
    engine = tiny_engine(host_cache_memory="4MiB", scheduling_policy="prefill-judged", eviction_policy="sam")
    out, first, end = run_arrivals(engine, ARRIVALS)
    assert out == reference
    policy = engine.scheduler.admission
    assert policy.name == "prefill-judged" and policy.costs.decode_s is not None


def test_a_sequence_that_cannot_be_swapped_but_ends_first_makes_the_room():
    """`a` (4 blocks to its end, 6 outputs to go at b's arrival) can be swapped; `c` (4 blocks,
    2 outputs to go) was swapped once before, so it is no victim, but its end frees b's room in
    2 steps: judged against that wait (x20: 0.08 s), b's prefill (12 x 10 ms) does not pay and a
    keeps running. Judged against a's end alone (0.24 s) it would swap."""
    c = make_seq("c", list(range(300, 308)), max_tokens=8)
    c.num_preemptions = 1  # a decode that came back after a swap: never swapped again
    sched, first, end = swap_scenario(0.01, make_seq("a", list(range(100, 104)), max_tokens=12), c)
    assert sched.admission.num_judgements > 0 and sched.num_preemptions == 0
    assert end["c"] <= first["b"]
