"""`update_from_output`: the step's second half, driven with made-up runner output (no model).

Covers what the engine used to do itself: advancing over computed KV, committing full blocks,
stop conditions, several tokens per sequence (speculative decoding), aborts while the forward
runs, and the injectable clock a simulator drives.
"""

import pytest

from hintkv.cache.hashing import namespace_root
from hintkv.cache.types import CacheEdit, SessionRef
from hintkv.config import EngineConfig
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.engine.types import SamplingParams

BS = 4
ROOT = namespace_root("test", "float32", BS, None)
EOS = 2


def make(num_blocks: int = 32, budget: int = 64, clock=None, **cfg) -> Scheduler:
    config = EngineConfig(block_size=BS, max_num_batched_tokens=budget, **cfg)
    kwargs = {"clock": clock} if clock else {}
    return Scheduler.from_config(config, num_blocks, eos_token_ids=[EOS], max_model_len=64, **kwargs)


def seq(rid: str, prompt: list[int], max_tokens: int = 8, session: SessionRef | None = None,
        **sampling) -> Sequence:
    return Sequence(rid, list(prompt), len(prompt), SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                   **sampling), ROOT, session=session)


def step(sched: Scheduler, token: int = 7):
    out = sched.schedule()
    outputs = sched.update_from_output(
        out, ModelRunnerOutput.from_tokens([token if s.samples else None for s in out.scheduled]))
    sched.check_integrity()
    return out, outputs


def test_chunked_prefill_commits_full_blocks_and_counts_computed_prompt_tokens():
    sched = make(budget=6)
    a = seq("a", list(range(10, 23)), max_tokens=2)  # 13 tokens: chunks of 6, 6, 1
    sched.add_request(a)
    out, outputs = step(sched)
    assert out.num_batched_tokens == 6 and outputs == []  # a chunk samples nothing
    assert a.num_computed_tokens == 6 and a.num_registered_blocks == 1
    step(sched)
    _, outputs = step(sched)
    assert [o.new_token_ids for o in outputs] == [[7]] and a.num_computed_tokens == 13
    assert a.num_registered_blocks == 3
    _, outputs = step(sched)
    assert outputs[0].finished and outputs[0].finish_reason == "length"
    assert outputs[0].new_token_ids == [7] and outputs[0].num_output_tokens == 2
    assert sched.num_prompt_tokens == sched.num_prompt_tokens_computed == 13
    assert a.status is SeqStatus.FINISHED and not sched.has_work()
    assert sched.kv.pool.num_in_use == 0


def test_eos_and_stop_tokens_finish_unless_ignored():
    sched = make()
    a, b, c = seq("a", [5, 6, 7]), seq("b", [5, 6, 8], stop_token_ids=(9,)), seq("c", [5, 6, 9], ignore_eos=True)
    for s in (a, b, c):
        sched.add_request(s)
    out = sched.schedule()
    outputs = sched.update_from_output(out, ModelRunnerOutput([[EOS], [9], [EOS]]))
    assert [(o.request_id, o.finished, o.finish_reason) for o in outputs] == [
        ("a", True, "stop"), ("b", True, "stop"), ("c", False, None)]
    sched.check_integrity()


def test_several_tokens_per_sequence_advance_over_accepted_drafts_only():
    sched = make()
    a = seq("a", list(range(10, 17)), max_tokens=20)
    sched.add_request(a)
    step(sched, token=30)  # prefill: 7 tokens + 1 sampled
    out = sched.schedule()
    (s,) = out.scheduled
    assert s.num_new_tokens == 1 and a.num_computed_tokens == 7
    # a drafter proposes three tokens after the last one; the runner verifies all four positions
    s.spec_token_ids = [31, 32, 33]
    sched.kv.append(a, s.num_new_tokens + 3)
    s.num_new_tokens += 3
    assert s.samples
    outputs = sched.update_from_output(out, ModelRunnerOutput([[31, 32, 40]]))  # two accepted + one
    assert outputs[0].new_token_ids == [31, 32, 40]
    assert a.token_ids[7:] == [30, 31, 32, 40]
    assert a.num_computed_tokens == 10  # 30, 31, 32 have KV; 40 is next step's input
    assert a.num_registered_blocks == 2
    sched.check_integrity()
    _, outputs = step(sched, token=41)
    assert outputs[0].new_token_ids == [41] and a.num_computed_tokens == 11


def test_a_stop_token_among_several_drops_the_rest():
    sched = make()
    a = seq("a", list(range(10, 17)), max_tokens=20)
    sched.add_request(a)
    step(sched, token=30)
    out = sched.schedule()
    (s,) = out.scheduled
    s.spec_token_ids = [31, EOS, 33]
    sched.kv.append(a, 4)
    s.num_new_tokens += 3
    outputs = sched.update_from_output(out, ModelRunnerOutput([[31, EOS, 33, 50]]))
    assert outputs[0].finished and outputs[0].finish_reason == "stop"
    assert outputs[0].new_token_ids == [31, EOS] and a.token_ids[7:] == [30, 31, EOS]
    sched.check_integrity()


def test_max_tokens_cuts_several_tokens():
    sched = make()
    a = seq("a", [5, 6, 7], max_tokens=2)
    sched.add_request(a)
    out = sched.schedule()
    outputs = sched.update_from_output(out, ModelRunnerOutput([[8, 9, 10]]))
    assert outputs[0].new_token_ids == [8, 9] and outputs[0].finish_reason == "length"


def test_runner_output_must_match_the_schedule():
    sched = make()
    sched.add_request(seq("a", [5, 6, 7]))
    out = sched.schedule()
    with pytest.raises(ValueError, match="1 scheduled"):
        sched.update_from_output(out, ModelRunnerOutput([]))


def test_abort_while_the_forward_runs_is_skipped_and_frees_everything():
    sched = make()
    ref = SessionRef("t", "s", "s")
    a, b = seq("a", list(range(10, 19)), session=ref), seq("b", [5, 6, 7])
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert sched.abort_request("a") and not sched.abort_request("a")
    outputs = sched.update_from_output(out, ModelRunnerOutput([[1], [1]]))
    assert [o.request_id for o in outputs] == ["b"]
    assert a.status is SeqStatus.FINISHED and a.finish_reason == "abort"
    assert sched.sessions.get("t", "s").num_inflight == 0
    sched.check_integrity()


def test_duplicate_request_ids_are_refused():
    sched = make()
    sched.add_request(seq("a", [5, 6, 7]))
    with pytest.raises(ValueError, match="already running"):
        sched.add_request(seq("a", [5, 6, 7]))


def test_sessions_follow_the_injected_clock():
    now = [1000.0]
    sched = make(clock=lambda: now[0])
    ref = SessionRef("t", "s", "s")
    a = seq("a", list(range(10, 19)), max_tokens=1, session=ref)
    sched.add_request(a)
    assert a.arrival == 1000.0
    now[0] = 1005.0
    step(sched)
    s = sched.sessions.get("t", "s")
    assert s.last_arrival == 1000.0 and s.last_done == 1005.0
    assert len(s.held) == 2  # the full blocks of prompt + completion (9 + 1 tokens)
    now[0] = 1065.0
    sched.add_request(seq("b", list(range(10, 19)), max_tokens=1, session=ref))
    assert s.gaps.n == 1 and s.gaps.mean == 60.0 and s.last_arrival == 1065.0


def test_ignore_hints_keeps_sessions_out():
    sched = make(hints=False)
    a = seq("a", [5, 6, 7, 8, 9], max_tokens=1, session=SessionRef("t", "s", "s"))
    sched.add_request(a)
    step(sched)
    assert a.session_key is None and sched.describe_session("t", "s") is None
    (outcome,) = sched.manage(SessionRef("t", "s", "s"), [CacheEdit("evict")])
    assert outcome.action == "none"


def test_a_sequence_is_what_the_cache_reads():
    from hintkv.cache.types import KVSequence

    s = seq("a", [5, 6, 7])
    fields = set(KVSequence.__annotations__) | {"num_tokens"}
    assert len(fields) == 12
    assert all(hasattr(s, f) for f in fields), fields - {f for f in fields if hasattr(s, f)}
