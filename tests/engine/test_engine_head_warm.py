"""The LM head's many-row copy (`onednn`: a second float32 head, reordered in ~0.4 s for SmolLM2) is built when
the engine starts, if its steps can give the head more than 12 rows, never inside a request's step."""

from __future__ import annotations

from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.models.linear import OneDnnKernel

CFG = dict(model="dummy:tiny", dtype="float32", device="cpu", block_size=16, kv_cache_tokens=1024)


def test_head_packs_at_engine_start_only_when_a_step_can_exceed_twelve_rows(onednn_tiny):
    head = onednn_tiny.model._lm_head_kernel
    assert head.name == "onednn"
    LLMEngine(EngineConfig(**CFG, max_num_seqs=12), loaded=onednn_tiny)
    assert head.onednn_weight is None  # 12 sequences: the head runs gemv / the greedy screen
    LLMEngine(EngineConfig(**CFG, max_num_seqs=4, speculative="ngram", speculative_max_rows=16), loaded=onednn_tiny)
    assert head.onednn_weight is not None  # a verify of 16 rows


def test_a_thirteen_sequence_step_packs_nothing(onednn_tiny):
    engine = LLMEngine(EngineConfig(**CFG, max_num_seqs=16), loaded=onednn_tiny)
    packs = OneDnnKernel.num_packs
    for i in range(13):
        engine.add_request(GenerateRequest(f"r{i}", list(range(100 + i, 120 + i)), SamplingParams(
            temperature=0, max_tokens=2, ignore_eos=True)))
    rows = 0
    while engine.has_work():
        rows = max(rows, sum(len(o.new_token_ids) for o in engine.step()))
    assert rows == 13  # one step sampled 13 rows through the head's many-row path
    assert OneDnnKernel.num_packs == packs
