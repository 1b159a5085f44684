"""Draft scheduling and rollback in the scheduler, driven with made-up runner output (no model)."""

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.config import EngineConfig
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.spec import make_proposer
from hintkv.engine.types import SamplingParams

BS = 4
ROOT = namespace_root("test", "float32", BS, None)
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6]  # "5 6" was followed by 7 8 9 10 ...


def make(k: int = 4, max_tokens: int = 16) -> tuple[Scheduler, Sequence]:
    s = Scheduler.from_config(EngineConfig(block_size=BS), 32, max_model_len=64)
    s.proposer = make_proposer("ngram", k)
    q = Sequence("r", list(PROMPT), len(PROMPT), SamplingParams(temperature=0, max_tokens=max_tokens), ROOT)
    s.add_request(q)
    out = s.schedule()  # prefill: no drafts
    assert out.scheduled[0].spec_token_ids == []
    s.update_from_output(out, ModelRunnerOutput([[7]]))
    return s, q


def test_drafts_are_scheduled_and_rejected_ones_rolled_back():
    s, q = make()
    out = s.schedule()
    sched = out.scheduled[0]
    assert sched.spec_token_ids == [8, 9, 10, 11] and sched.num_new_tokens == 5 and sched.samples
    assert len(q.block_table) == -(-(q.num_tokens + 4) // BS)  # room for the drafts' KV
    # the model accepts 8 and 9, then says 42 instead of 10
    s.update_from_output(out, ModelRunnerOutput([[8, 9, 42]]))
    s.check_integrity()
    assert q.token_ids[len(PROMPT):] == [7, 8, 9, 42]
    assert q.num_computed_tokens == q.num_tokens - 1  # KV for everything but the new token
    assert len(q.block_table) == -(-q.num_tokens // BS)  # the rejected drafts' block went back
    n = q.num_registered_blocks
    assert [b.hash for b in q.block_table[:n]] == hash_blocks(ROOT, q.token_ids[:n * BS], BS)
    assert (s.num_draft_tokens, s.num_accepted_tokens) == (4, 2)


def test_drafts_never_pass_the_output_limit():
    s, _ = make(k=8, max_tokens=3)
    out = s.schedule()
    assert len(out.scheduled[0].spec_token_ids) == 1  # 1 output so far, room for 2 more: 1 draft + 1
    outs = s.update_from_output(out, ModelRunnerOutput([[8, 9]]))
    assert outs[0].finished and outs[0].finish_reason == "length"
    assert s.kv.pool.num_in_use == 0
    s.check_integrity()



def test_request_metrics_on_the_schedulers_clock():
    now = [100.0]
    s = Scheduler.from_config(EngineConfig(block_size=BS), 32, max_model_len=64, clock=lambda: now[0])
    s.proposer = make_proposer("ngram", 4)
    q = Sequence("r", list(PROMPT), len(PROMPT), SamplingParams(temperature=0, max_tokens=5), ROOT)
    s.add_request(q)
    now[0] = 101.0
    s.update_from_output(s.schedule(), ModelRunnerOutput([[7]]))  # first token at t=101
    now[0] = 101.5
    out = s.schedule()
    assert out.scheduled[0].spec_token_ids == [8, 9, 10]  # 3 = room for 4 more outputs - 1
    s.update_from_output(out, ModelRunnerOutput([[8, 9, 42]]))
    now[0] = 103.0
    out = s.schedule()
    assert out.scheduled[0].spec_token_ids == []  # one output left: no room for a draft
    (done,) = s.update_from_output(out, ModelRunnerOutput([[43]]))
    m = done.metrics
    assert done.finished and done.finish_reason == "length"
    assert (m.ttft_s, m.e2e_s, m.itl_s, m.decode_tokens_per_s) == (1.0, 3.0, 0.5, 2.0)
    assert m.peak_kv_blocks == 4  # 11 prompt + 1 + 3 drafts = 15 tokens of KV at once
    assert (m.num_draft_tokens, m.num_accepted_tokens, m.acceptance) == (3, 2, 2 / 3)
