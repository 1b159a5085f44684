"""`LLMEngine(cfg, loaded=...)`: engines that share one loaded model (tests building an engine per
scheduling policy) compute what an engine with its own copy computes, and a model of another
dtype, quantization, model or a compiling config is refused."""

from __future__ import annotations

import pytest
import torch

from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.models.loader import load_model

CFG = dict(model="dummy:tiny", dtype="float32", device="cpu", block_size=16, kv_cache_tokens=512)


def _greedy(engine: LLMEngine) -> list[int]:
    engine.add_request(GenerateRequest("r", list(range(100, 140)), SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True)))
    out: list[int] = []
    while engine.has_work():
        for o in engine.step():
            out += o.new_token_ids
    return out


def test_engines_sharing_a_loaded_model_match_one_with_its_own():
    own = _greedy(LLMEngine(EngineConfig(**CFG)))
    shared = load_model("dummy:tiny", torch.float32, "cpu")
    first = _greedy(LLMEngine(EngineConfig(**CFG), loaded=shared))
    second = _greedy(LLMEngine(EngineConfig(**CFG, scheduling_policy="short-first"), loaded=shared))
    assert len(own) == 6 and first == own and second == own


def test_a_loaded_model_of_another_dtype_is_refused():
    with pytest.raises(ValueError, match="bfloat16"):
        LLMEngine(EngineConfig(**CFG), loaded=load_model("dummy:tiny", torch.bfloat16, "cpu"))


@pytest.mark.parametrize("other,match", [
    (dict(quantization="w8a8"), "quantization"),  # float kernels under a w8a8 config
    (dict(model="dummy:smollm2-135m"), "model"),
    (dict(compile_step="on"), "compil"),  # compile would change the model every sharer runs
])
def test_a_loaded_model_for_another_config_is_refused(other, match):
    shared = load_model("dummy:tiny", torch.float32, "cpu")
    with pytest.raises(ValueError, match=match):
        LLMEngine(EngineConfig(**{**CFG, **other}), loaded=shared)
