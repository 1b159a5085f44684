"""Load timing (`engine/load_timing.py`) on the real scheduler, KV manager and host tier, no model:
`same-step` computes a host hit in the step its load starts; it leaves a load the step cannot
afford to wait for (or `next-step` leaves every load) to a later step."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.config import EngineConfig
from hintkv.engine.load_timing import load_timing_names
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack
from tests.engine.scheduler_helpers import BS, ROOT, seq_of, store_blocks

GENEROUS_S_PER_TOKEN = 1.0  # the step's estimated forward: seconds per batched token (a long wait allowed)


def _setup(timing: str, num_blocks: int = 16, budget: int = 64, admission: str = "fcfs"):
    kv = KVCacheManager(num_blocks, BS, make_policy("lru", sessions=SessionRegistry()))
    io = DeviceBlockIO([torch.zeros(2, num_blocks, BS, 1, 2) for _ in range(2)])
    stack = TierStack([HostTier(io.layout, 16 * io.layout.nbytes)])
    kv.tiers = TierConnector(kv.pool, BS, stack, io, kv.ranking, hints=False)
    kv.tiers.costs.prefill_s_per_token = GENEROUS_S_PER_TOKEN
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=budget, load_timing=timing, admission=admission)
    return sched, kv, io, stack


_seq, _store = seq_of, store_blocks


def _add_host_hit(sched: Scheduler, stack: TierStack, io: DeviceBlockIO) -> tuple[Sequence, list]:
    """Request "a": 13 tokens whose 3 full blocks are on the host tier only (a host hit), added to the scheduler."""
    a = _seq("a", list(range(13)))
    payloads = _store(stack, io, a.token_ids, 3)
    sched.add_request(a)
    return a, payloads


def _flush_until_ready(kv: KVCacheManager, stack: TierStack, seq: Sequence) -> None:
    """Run the host tier's copies until `seq`'s load has landed. A flush returns once the copies' futures
    are set, which can be before the mover thread has run their done-callbacks (readiness is one of
    them), so this waits for readiness itself, up to a generous bound (not a timing check)."""
    deadline = time.monotonic() + 60
    while not kv.load_ready(seq) and time.monotonic() < deadline:
        stack.flush()
        time.sleep(0.001)
    assert kv.load_ready(seq), "the load never landed"


def _running_decode(sched: Scheduler) -> Sequence:
    """A sequence past its prompt, decoding (so the step has another sequence in it)."""
    b = _seq("b", list(range(100, 106)))
    sched.add_request(b)
    out = sched.schedule()
    assert [s.seq for s in out.scheduled] == [b]
    sched.update_from_output(out, ModelRunnerOutput.from_tokens([7]))
    assert b.num_output_tokens == 1 and b.status is SeqStatus.RUNNING
    return b


def test_same_step_computes_a_host_hit_in_the_step_its_load_starts():
    sched, kv, io, stack = _setup("same-step")
    ticks = itertools.count()
    sched.clock = lambda: float(next(ticks))  # every reading distinct: the step's start is exact
    b = _running_decode(sched)
    a, payloads = _add_host_hit(sched, stack, io)
    out = sched.schedule()
    assert a.status is SeqStatus.RUNNING
    assert {s.seq.request_id: s.num_new_tokens for s in out.scheduled} == {"b": 1, "a": 1}
    assert a.num_computed_tokens == 12 and a.num_cached_tokens == 12
    assert kv.hit_tokens_by_tier == {"device": 0, "host": 12}
    got = torch.empty((3, *io.layout.shape))
    io.read([blk.block_id for blk in a.block_table[:3]], got)
    assert all(torch.equal(got[i], p) for i, p in enumerate(payloads))
    # the step's forward starts when the load landed (a's mark), not when schedule() began: the
    # wait is load time (a.ttft.load_s), not the step's forward (ttft.stepped, the step costs)
    assert out.started == a.ttft_mark and a.ttft.load_s > 0 and a.ttft.compute_s == 0
    assert b.status is SeqStatus.RUNNING
    sched.check_integrity()
    stack.close()


def test_same_step_leaves_a_load_the_step_cannot_afford_for_a_later_step():
    """The expected copy (2 s a block, 6 s for the three: still cheaper than recomputing, 4 s a
    block) costs the decode beside it more than the step it saves (1 s of estimated forward for
    its one token): no wait; the load lands and computes in a later step."""
    sched, kv, io, stack = _setup("same-step")
    kv.tiers.costs.bandwidth["host"] = io.layout.nbytes / 2.0
    b = _running_decode(sched)
    a, _ = _add_host_hit(sched, stack, io)
    out = sched.schedule()
    assert a.status is SeqStatus.LOADING and [s.seq for s in out.scheduled] == [b]
    assert kv.tiers.counters.load_wait_s == 0
    _flush_until_ready(kv, stack, a)
    out = sched.schedule()
    assert a.status is SeqStatus.RUNNING and a.num_cached_tokens == 12
    sched.check_integrity()
    stack.close()


def test_a_landed_load_runs_before_the_prefills_that_yielded_and_only_once():
    """short-first: a long running prefill yields the step to the host hit, which lands in the
    step; the pass that then gives the yielded prefill what is left must not schedule the landed
    sequence a second time (it did when the landed one went to the end of the running list: the
    same KV appended twice, a live engine step failed)."""
    sched, kv, io, stack = _setup("same-step", num_blocks=32, budget=16, admission="short-first")
    b = _running_decode(sched)
    long = _seq("long", list(range(200, 240)))
    sched.add_request(long)
    out = sched.schedule()
    assert {s.seq.request_id: s.num_new_tokens for s in out.scheduled} == {"b": 1, "long": 15}
    a, _ = _add_host_hit(sched, stack, io)
    out = sched.schedule()
    ids = [s.seq.request_id for s in out.scheduled]
    assert a.status is SeqStatus.RUNNING and sorted(ids) == ["a", "b", "long"]
    assert {s.seq.request_id: s.num_new_tokens for s in out.scheduled} == {"b": 1, "a": 1, "long": 14}
    assert sched.running.index(a) < sched.running.index(long)
    sched.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
    sched.check_integrity()
    stack.close()


def test_a_step_whose_prefill_yielded_is_not_idle():
    """short-first: the running prefill that yields to the host hit runs later in the same step,
    so the step is not idle and the idle wait (up to 3 expected copies: 9 s here) does not apply;
    a copy the step cannot afford leaves the hit LOADING (review_policy F6: it waited)."""
    sched, kv, io, stack = _setup("same-step", num_blocks=32, budget=16, admission="short-first")
    kv.tiers.costs.bandwidth["host"] = io.layout.nbytes / 1.0  # 1 s a block expected
    long = _seq("long", list(range(200, 240)))
    sched.add_request(long)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput.from_tokens([None]))
    a, _ = _add_host_hit(sched, stack, io)
    out = sched.schedule()
    assert a.status is SeqStatus.LOADING and [s.seq for s in out.scheduled] == [long]
    assert kv.tiers.counters.load_wait_s == 0
    sched.check_integrity()
    stack.close()


def test_the_wait_limit_is_the_steps_not_each_loads():
    """Two loads start beside a decode; the clock says each wait takes 1 s and the step may wait
    1 s (its forward estimate over the sequences in it): the first wait spends it, so the second
    load is left for a later step (review_policy F7: each load had its own limit)."""
    sched, kv, io, stack = _setup("same-step")
    ticks = itertools.count()
    sched.clock = lambda: float(next(ticks))
    b = _running_decode(sched)
    a, c = _seq("a", list(range(13))), _seq("c", list(range(50, 63)))
    _store(stack, io, a.token_ids, 3)
    _store(stack, io, c.token_ids, 3)
    sched.add_request(a)
    sched.add_request(c)
    out = sched.schedule()
    assert a.status is SeqStatus.RUNNING and c.status is SeqStatus.LOADING
    assert [s.seq for s in out.scheduled] == [b, a]
    sched.check_integrity()
    stack.close()


def test_next_step_computes_a_host_hit_after_its_load_landed():
    sched, kv, io, stack = _setup("next-step")
    a, _ = _add_host_hit(sched, stack, io)
    out = sched.schedule()
    assert a.status is SeqStatus.LOADING and out.scheduled == []
    _flush_until_ready(kv, stack, a)
    out = sched.schedule()
    assert a.status is SeqStatus.RUNNING
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(a, 1)]
    sched.check_integrity()
    stack.close()


def test_load_timing_is_validated_at_the_edge():
    assert {"next-step", "same-step"} <= set(load_timing_names())
    assert EngineConfig(model="dummy:tiny").load_timing == "next-step"  # same-step is opt-in
    with pytest.raises(ValueError, match="load_timing"):
        EngineConfig(model="dummy:tiny", load_timing="soon")
