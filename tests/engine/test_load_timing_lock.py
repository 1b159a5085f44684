"""A same-step load wait runs with the engine's state lock released (`LLMEngine._unlocked`), so
the reads and edits other threads make under it (`manage`, `describe_session`, `sweep_sessions`,
`tier_stats` for /metrics) do not wait for a copy, while adds and aborts (engine thread, between
steps) are refused there; and the driver's flush before the forward pass is checked
(`Scheduler.check_flushed`, `cache.write_downs`)."""

from __future__ import annotations

import threading

import pytest
from load_gate import MoverGate, slow_but_worth_loading
from tier_engine_helpers import BLOCK, generate, prompt, session, settle, tiny_engine

from hintkv.cache.types import CacheEdit
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.sequence import SeqStatus
from hintkv.engine.types import GenerateRequest, SamplingParams

A = prompt(1)  # 4 blocks
FILL = [prompt(i, 7 * BLOCK) for i in (2, 3)]  # each needs the whole 8-block pool: A goes down


def _a_on_the_host(engine) -> int:
    """A computed, then pushed to the host by the fills; A's first greedy token."""
    (first, *_), _ = generate(engine, A, "a")
    for i, p in enumerate(FILL):
        generate(engine, p, f"fill{i}")
    assert engine.tiers.where(engine.sessions.get("t", "a").held[:3])["host"] == 3
    return first


def _again(engine) -> GenerateRequest:
    return GenerateRequest("again", list(A), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                           session=session("a"))


def _during_a_held_load(engine, during) -> list:
    """Step once with A's host load held up by the gate; `during()` runs on another thread while
    the step waits for it (joined before the gate opens: a `during` that waits for the load fails
    the join's deadline, not a timing check); the step's outputs."""
    slow_but_worth_loading(engine.tiers)
    gate = MoverGate(engine.tiers.stack.mover)
    engine.add_request(_again(engine))
    outs = []
    stepper = threading.Thread(target=lambda: outs.extend(engine.step()))
    stepper.start()
    try:
        assert _wait_loading(engine.scheduler.requests["again"]), "the request never started its load"
        worker = threading.Thread(target=during)
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive(), "a locked read or edit waited for the same-step load"
    finally:
        gate.release()
        stepper.join(timeout=120)
    assert not stepper.is_alive()
    return outs


def test_reads_and_edits_during_a_same_step_load_wait_do_not_wait_for_it():
    """The step waits for A's host load (held up by the gate) for up to minutes; meanwhile another
    thread's locked reads and state-changing edits return: an evict of the loading request's own
    session (its host copies, being loaded, are removed below) and an offload of another live
    session. Only then is the load let through: it lands in the step that started it, the
    request's token is A's greedy one and the engine's bookkeeping holds. With the wait under
    the lock the reads wait the whole limit."""
    engine = tiny_engine(host_cache_memory="4MiB", load_timing="same-step", offload_mode="lazy")  # writes at the hint
    want = _a_on_the_host(engine)
    got = {}

    def read() -> None:
        seq = engine.scheduler.requests["again"]
        got["describe"] = engine.describe_session("t", "a")
        got["stats"] = engine.tier_stats()
        got["offload"] = engine.manage(session("fill1"), [CacheEdit("offload")])
        got["evict"] = engine.manage(session("a"), [CacheEdit("evict")])
        got["swept"] = engine.sweep_sessions()
        got["status"] = seq.status  # still waiting for its load: the gate is shut
    outs = _during_a_held_load(engine, read)
    assert got["status"] is SeqStatus.LOADING and got["stats"]["enabled"] and got["describe"] is not None
    assert [o.action for o in got["offload"] + got["evict"]] == ["offloaded", "evicted"]
    assert got["offload"][0].num_scheduled > 0 and got["evict"][0].tiers["host"][0] < 0  # they moved KV
    assert engine.describe_session("t", "a").state == "ended"  # the evict took effect
    # the load landed in the step that started it: A's first token came out of that one step
    assert [o.request_id for o in outs] == ["again"] and outs[0].finished and outs[0].num_cached_tokens == 48
    assert outs[0].new_token_ids == [want]
    stats = engine.tier_stats()
    assert stats["num_load_timeouts"] == 0 and stats["num_load_failed"] == 0
    engine.check_integrity()
    settle(engine)  # the offload lands after the gate: still consistent
    engine.check_integrity()
    engine.close()


def test_a_prefetch_during_the_wait_that_takes_the_room_defers_the_landed_request():
    """A prefetch of another live session during the wait takes the device blocks the landed
    request's chunk needed: what runs after the wait re-checks its room, so the request lands
    (RUNNING) but is not computed in that step; it finishes in a later one with A's token."""
    engine = tiny_engine(host_cache_memory="4MiB", load_timing="same-step", offload_mode="lazy")  # writes at the hint
    want = _a_on_the_host(engine)
    got = {}
    outs = _during_a_held_load(engine, lambda: got.update(
        prefetch=engine.manage(session("fill0"), [CacheEdit("prefetch")])))
    (edit,) = got["prefetch"]
    assert edit.action == "prefetched" and edit.num_scheduled > 0
    seq = engine.scheduler.requests["again"]
    assert outs == [] and seq.status is SeqStatus.RUNNING and seq.num_computed_tokens == 48
    engine.check_integrity()
    for _ in range(1000):
        outs = engine.step()
        engine.check_integrity()
        if outs:
            break
    assert [(o.request_id, o.new_token_ids, o.num_cached_tokens) for o in outs] == [("again", [want], 48)]
    settle(engine)
    engine.check_integrity()
    engine.close()


def test_add_and_abort_during_a_same_step_load_wait_are_refused():
    """Requests are added and aborted between steps (on the engine's thread): during the wait the
    step still holds the indices and blocks it scheduled (an abort of the loading request would
    cancel the load the step is about to land). Another thread's add or abort then raises, and
    the step completes untouched."""
    engine = tiny_engine(host_cache_memory="4MiB", load_timing="same-step")
    want = _a_on_the_host(engine)
    errors = {}

    def meddle() -> None:
        for name, call in [("abort", lambda: engine.abort_request("again")),
                           ("add", lambda: engine.add_request(GenerateRequest(
                               "late", prompt(9), SamplingParams(temperature=0, max_tokens=1))))]:
            try:
                call()
            except RuntimeError as e:
                errors[name] = str(e)
    outs = _during_a_held_load(engine, meddle)
    assert set(errors) == {"abort", "add"}, errors
    assert all("between steps" in e for e in errors.values())
    assert [o.request_id for o in outs] == ["again"] and outs[0].new_token_ids == [want]
    assert set(engine.scheduler.requests) == set()  # "late" was never added
    engine.check_integrity()
    engine.abort_request("nobody")  # between steps: allowed again
    engine.close()


def _wait_loading(seq, tries: int = 6000) -> bool:
    ev = threading.Event()
    for _ in range(tries):
        if seq.status is SeqStatus.LOADING:
            return True
        ev.wait(0.01)
    return False


def test_a_forward_pass_without_the_flush_is_refused():
    """The driver must flush the write-downs `schedule()` queued before the forward pass writes
    the reused blocks: `update_from_output` raises when it did not (the flush checked, not only
    done by LLMEngine.step), and accepts the same step once flushed."""
    engine = tiny_engine(host_cache_memory="4MiB")
    generate(engine, A, "a")  # A's 4 blocks cached, held by session a
    sch = engine.scheduler
    sch.add_request(engine.make_sequence(GenerateRequest(
        "fill", FILL[0], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), session=session("f"))))
    out = sch.schedule()  # needs 7 of 8 blocks: A's cached blocks are victims, queued for a write-down
    assert out.write_down_mark > 0 and engine.tiers.num_write_downs_queued > 0
    runner_out = ModelRunnerOutput.from_tokens([7])
    with pytest.raises(RuntimeError, match="flush_write_downs"):
        sch.check_flushed(out)  # what LLMEngine.step asks just before its forward pass
    with pytest.raises(RuntimeError, match="flush_write_downs"):
        sch.update_from_output(out, runner_out)
    assert engine.kv.flush_write_downs() > 0
    sch.check_flushed(out)
    (done,) = sch.update_from_output(out, runner_out)
    assert done.finished
    engine.check_integrity()
    engine.close()
