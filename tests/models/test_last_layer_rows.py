"""The last layer past its K/V for the sampled rows only (`LlamaForCausalLM.forward(keep_last=...)`, the runner's
default; HINTKV_LAST_LAYER_ROWS=all runs every row).

Every row's K/V is still written (the caches are equal bit for bit), the kept rows' hidden states agree with the
whole step's to float32 rounding (they run GEMMs and attention at another row count), the last layer's MLP sees
only the kept rows, and an engine's greedy tokens are the same either way — through chunked prefills (chunks that
sample nothing) and speculative drafts (1 + k kept rows).
"""

from __future__ import annotations

import random

import pytest
import torch
from model_steps import ModelSteps, drain

from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.models.attention import suffix_rows
from hintkv.models.loader import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("dummy:tiny")


def _steps(lm, rng: random.Random) -> tuple[ModelSteps, list[tuple[str, list[int]]]]:
    steps = ModelSteps(lm, 64)
    first = [("a", [rng.randrange(100, 40000) for _ in range(70)]), ("b", [rng.randrange(100, 40000) for _ in range(9)])]
    scheduled, inputs = steps.prepare(first)
    steps.runner.forward(inputs)
    for s in scheduled:
        s.seq.num_computed_tokens += s.num_new_tokens
    return steps, first


def test_kept_rows_match_the_whole_step_and_every_kv_row_is_written(tiny):
    rng = random.Random(3)
    full, _ = _steps(tiny, random.Random(3))
    kept, _ = _steps(tiny, random.Random(3))
    # a prefill over a cached prefix, a decode, a cold prefill (rows 40 + 1 + 25)
    batch = [("a", [rng.randrange(100, 40000) for _ in range(40)]), ("b", [rng.randrange(100, 40000)]),
             ("c", [rng.randrange(100, 40000) for _ in range(25)])]
    keep_last = [3, 0, 1]
    _, in_full = full.prepare(batch)
    _, in_kept = kept.prepare(batch)
    seen = []
    hook = tiny.model.layers[-1].mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    try:
        h_full = full.runner.forward(in_full)
        h_kept = kept.runner.forward(in_kept, keep_last)
    finally:
        hook.remove()
    assert seen == [66, 4]  # the last layer's MLP: every row, then the kept ones
    rows, sub = suffix_rows(in_full.meta, keep_last)
    assert rows.tolist() == [37, 38, 39, 65] and sub.query_start_loc == [0, 3, 4] and sub.context_lens == [110, 25]
    assert h_kept.shape == (4, tiny.config.hidden_size)
    torch.testing.assert_close(h_kept, h_full[rows], rtol=1e-5, atol=1e-5)
    for a, b in zip(full.runner.kv_caches, kept.runner.kv_caches, strict=True):
        assert torch.equal(a, b)
    # a step that samples nothing (a prefill chunk) still writes its K/V and returns no rows
    more = [("c", [rng.randrange(100, 40000) for _ in range(30)])]
    _, in_full = full.prepare(more)
    _, in_kept = kept.prepare(more)
    full.runner.forward(in_full)
    assert kept.runner.forward(in_kept, [0]).shape == (0, tiny.config.hidden_size)
    for a, b in zip(full.runner.kv_caches, kept.runner.kv_caches, strict=True):
        assert torch.equal(a, b)


def test_suffix_rows_rejects_more_rows_than_the_sequence_brings(tiny):
    steps, _ = _steps(tiny, random.Random(5))
    _, inputs = steps.prepare([("a", [7, 8, 9])])
    with pytest.raises(ValueError, match="keep_last 4"):
        suffix_rows(inputs.meta, [4])


def _greedy(monkeypatch, rows: str, speculative: str | None, **cfg) -> list[list[int]]:
    monkeypatch.setenv("HINTKV_LAST_LAYER_ROWS", rows)
    engine = LLMEngine(EngineConfig(**{**dict(model="dummy:tiny", dtype="float32", kv_cache_tokens=4096,
                                              max_num_batched_tokens=48, speculative=speculative), **cfg}))
    rng = random.Random(11)
    base = [rng.randrange(100, 40000) for _ in range(60)]
    for i in range(3):  # a shared head, then each its own text and a repeat the ngram proposer can draft from
        tail = [rng.randrange(100, 40000) for _ in range(20 + 17 * i)]
        engine.add_request(GenerateRequest(f"r{i}", base + tail + tail, SamplingParams(temperature=0, max_tokens=12,
                                                                                     ignore_eos=True)))
    out = drain(engine)
    assert engine.runner.model_keeps_rows == (rows != "all")
    return [out[f"r{i}"] for i in range(3)]


@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_greedy_tokens_are_the_same_with_every_row_or_the_sampled_ones(monkeypatch, speculative):
    assert _greedy(monkeypatch, "sampled", speculative) == _greedy(monkeypatch, "all", speculative)


@pytest.mark.parametrize("cfg", [dict(kv_cache_dtype="int8"), dict(dtype="bfloat16")])
def test_a_chunk_that_samples_nothing_runs_on_the_pytorch_attention_path(monkeypatch, cfg):
    """A prefill chunk alone in its step keeps no row; attention paths other than the float32 C++ kernel
    (int8 KV, bfloat16) took its 0 query rows into `_derive_short`'s max() and failed the step."""
    sampled = _greedy(monkeypatch, "sampled", None, **cfg)
    assert [len(t) for t in sampled] == [12, 12, 12]
    assert sampled == _greedy(monkeypatch, "all", None, **cfg)
