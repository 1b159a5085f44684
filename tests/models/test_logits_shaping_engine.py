"""Penalties, logit_bias and min_tokens through the real engine: its greedy tokens are those of a
reference decoder that shapes the model's own logits by the formulas written out here (not the
engine's code), with and without speculative decoding (a shaped request takes no drafts)."""

from __future__ import annotations

import functools

import pytest
import torch
from model_steps import ModelSteps, drain

from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.models.loader import LoadedModel, load_model

N = 12
PROMPT = [5, 17, 5, 17, 5, 17, 42, 7, 42, 7, 42, 7, 9]  # repetitive: ngram drafts have something to copy


@functools.cache
def _tiny() -> LoadedModel:
    return load_model("dummy:tiny", torch.float32, "cpu")


@pytest.fixture(scope="module", autouse=True)
def _let_go_of_the_model():
    yield
    _tiny.cache_clear()


def _reference(p: SamplingParams, eos: frozenset[int]) -> list[int]:
    steps = ModelSteps(_tiny(), 16, block_size=16)
    row = steps.logits([("s", PROMPT)])[0][-1]
    out: list[int] = []
    while len(out) < p.max_tokens:
        row = row.clone().double()
        for t, b in p.logit_bias:
            row[t] += b
        if len(out) < p.min_tokens:
            for t in eos | set(p.stop_token_ids):
                row[t] = float("-inf")
        for t in set(PROMPT + out):
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
        for t in set(out):
            row[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
        tok = int(row.argmax())
        out.append(tok)
        if tok in eos or tok in p.stop_token_ids:
            break
        row = steps.logits([("s", [tok])])[0][-1]
    return out


def _engine(spec: str | None) -> LLMEngine:
    return LLMEngine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=16, kv_cache_tokens=1024, speculative=spec, num_speculative_tokens=3,
                                  enforce_eager=True), loaded=_tiny())


CASES = {
    "frequency+presence": dict(frequency_penalty=1.5, presence_penalty=0.5),
    "repetition": dict(repetition_penalty=1.8),
    "negative penalties": dict(frequency_penalty=-1.0, repetition_penalty=0.7, logit_bias=((31727, -100.0),)),
    "bias": dict(logit_bias=((3, 4.0), (8, -100.0), (100, 2.5))),
}


@pytest.mark.parametrize("spec", [None, "ngram"])
@pytest.mark.parametrize("case", list(CASES))
def test_shaped_greedy_tokens_are_the_reference_decoders(case, spec):
    p = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, **CASES[case])
    e = _engine(spec)
    e.add_request(GenerateRequest("r", list(PROMPT), p))
    plain = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    e.add_request(GenerateRequest("plain", list(PROMPT), plain))
    got = drain(e)
    assert got["r"] == _reference(p, frozenset())
    assert got["plain"] == _reference(plain, frozenset())
    assert got["r"] != got["plain"]  # the shaping changed the output (else this test could not fail)
    if spec:
        assert e.scheduler.num_draft_tokens > 0  # the plain request drafted; the shaped one cannot have
    e.check_integrity()


def test_min_tokens_holds_back_a_stop_token():
    plain = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
    first = _reference(plain, frozenset())[0]
    e = _engine(None)
    e.add_request(GenerateRequest("stops", list(PROMPT), SamplingParams(temperature=0, max_tokens=N,
                                                                         stop_token_ids=(first,))))
    held = SamplingParams(temperature=0, max_tokens=N, stop_token_ids=(first,), min_tokens=4, ignore_eos=True)
    e.add_request(GenerateRequest("held", list(PROMPT), held))
    got = drain(e)
    assert got["stops"] == [first]
    assert len(got["held"]) >= 4 and first not in got["held"][:4]
    assert got["held"] == _reference(held, e.eos_token_ids)
