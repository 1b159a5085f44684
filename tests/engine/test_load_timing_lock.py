"""A same-step load wait runs with the engine's state lock released (`LLMEngine._unlocked`), so
the reads and edits other threads make under it (`manage`, `describe_session`, `sweep_sessions`,
`tier_stats` for /metrics) do not wait for a copy; and the driver's flush before the forward pass
is a checked contract (`cache.write_downs`)."""

from __future__ import annotations

import threading

import pytest
from load_gate import MoverGate, slow_but_worth_loading
from tier_engine_helpers import BLOCK, generate, prompt, session, tiny_engine

from hintkv.cache.types import CacheEdit
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.sequence import SeqStatus
from hintkv.engine.types import GenerateRequest, SamplingParams

A = prompt(1)  # 4 blocks
FILL = [prompt(i, 7 * BLOCK) for i in (2, 3)]  # each needs the whole 8-block pool: A goes down


def _a_on_the_host(engine) -> None:
    generate(engine, A, "a")
    for i, p in enumerate(FILL):
        generate(engine, p, f"fill{i}")
    assert engine.tiers.where(engine.sessions.get("t", "a").held[:3])["host"] == 3


def test_reads_and_edits_during_a_same_step_load_wait_do_not_wait_for_it():
    """The step waits for A's host load (held up by the gate) for up to minutes; meanwhile another
    thread's locked reads and an edit return, and only then is the load let through: it lands in
    the step that started it. With the wait under the lock the reads wait the whole limit
    (the join's deadline fails the test; it is not a timing check)."""
    engine = tiny_engine(host_cache_memory="4MiB", load_timing="same-step")
    _a_on_the_host(engine)
    slow_but_worth_loading(engine.tiers)
    gate = MoverGate(engine.tiers.stack.mover)
    engine.add_request(GenerateRequest("again", list(A), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                                       session=session("a")))
    outs = []
    stepper = threading.Thread(target=lambda: outs.extend(engine.step()))
    stepper.start()
    seq = engine.scheduler.requests["again"]
    got = {}

    def read() -> None:
        got["describe"] = engine.describe_session("t", "a")
        got["stats"] = engine.tier_stats()
        got["manage"] = engine.manage(session("other"), [CacheEdit("evict")])
        got["swept"] = engine.sweep_sessions()
        got["status"] = seq.status  # still waiting for its load: the gate is shut
    try:
        assert _wait_loading(seq), "the request never started its load"
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(timeout=60)
        assert not reader.is_alive(), "a locked read waited for the same-step load"
    finally:
        gate.release()
        stepper.join(timeout=120)
    assert got["status"] is SeqStatus.LOADING and got["stats"]["enabled"] and got["describe"] is not None
    # the load landed in the step that started it: A's first token came out of that one step
    assert [o.request_id for o in outs] == ["again"] and outs[0].finished and outs[0].num_cached_tokens == 48
    assert engine.tier_stats()["num_load_timeouts"] == 0
    engine.check_integrity()
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
        sch.update_from_output(out, runner_out)
    assert engine.kv.flush_write_downs() > 0
    (done,) = sch.update_from_output(out, runner_out)
    assert done.finished
    engine.check_integrity()
    engine.close()
