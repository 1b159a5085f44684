"""The last layer past its K/V for the sampled rows only (`LlamaForCausalLM.forward(keep_last=...)`, the runner's
default; HINTKV_LAST_LAYER_ROWS=all runs every row), and on oneDNN its q projected for those rows only
(`Attention.split_qkv`: k/v of every row from the weight's k/v slice, the same bits as the fused GEMM's).

Every row's K/V is still written (the caches are equal bit for bit), the kept rows' hidden states agree with the
whole step's to float32 rounding (they run GEMMs and attention at another row count), the last layer's MLP sees
only the kept rows, and an engine's greedy tokens are the same either way — through chunked prefills (chunks that
sample nothing) and speculative drafts (1 + k kept rows).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from model_steps import ModelSteps, drain

from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.models.compile import Regions
from hintkv.models.attention import suffix_rows
from hintkv.models.linear import OneDnnKernel
from hintkv.models.llama import Attention
from hintkv.models.loader import load_model
from hintkv.models.presets import preset_config


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


class _Rows:
    """A kernel that records the row count of each call (`Attention.q_kv_kernels`' items)."""

    def __init__(self, kernel, seen: list[int]) -> None:
        self.kernel, self.seen = kernel, seen

    def refresh(self) -> None:
        self.kernel.refresh()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.shape[0])
        return self.kernel(x)


def test_the_last_layer_projects_q_for_the_kept_rows_only_and_writes_the_same_kv(onednn_tiny):
    layers = onednn_tiny.model.layers
    assert [layer.self_attn.q_kv_kernels is not None for layer in layers] == [False] * (len(layers) - 1) + [True]
    attn = layers[-1].self_attn
    q_rows, kv_rows, fused_rows = [], [], []
    split = attn.q_kv_kernels
    rng = random.Random(7)
    full, _ = _steps(onednn_tiny, random.Random(7))
    kept, _ = _steps(onednn_tiny, random.Random(7))
    batch = [("a", [rng.randrange(100, 40000) for _ in range(40)]), ("c", [rng.randrange(100, 40000) for _ in range(25)])]
    _, in_full = full.prepare(batch)
    _, in_kept = kept.prepare(batch)
    hook = attn.qkv_proj.register_forward_pre_hook(lambda m, args: fused_rows.append(args[0].shape[0]))
    try:
        h_full = full.runner.forward(in_full)
        attn.q_kv_kernels = (_Rows(split[0], q_rows), _Rows(split[1], kv_rows))
        h_kept = kept.runner.forward(in_kept, [2, 1])
    finally:
        hook.remove()
        attn.q_kv_kernels = split
    assert fused_rows == [65] and kv_rows == [65] and q_rows == [3]  # the unsplit run, then k/v of all, q of 3
    rows, _ = suffix_rows(in_full.meta, [2, 1])
    torch.testing.assert_close(h_kept, h_full[rows], rtol=1e-5, atol=1e-5)
    for a, b in zip(full.runner.kv_caches, kept.runner.kv_caches, strict=True):
        assert torch.equal(a, b)  # the k/v slice gives the whole weight's bits: the caches are equal


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 12, 13, 40, 512])
def test_the_split_kernels_give_the_fused_columns_bit_for_bit_with_a_bias(rows, threads):
    """`Attention.split_qkv` on a Qwen2-style layer (q/k/v bias): each slice's columns are the fused GEMM's, to
    the bit (gemv's few rows and oneDNN's many), on 1 and 2 threads."""
    if not OneDnnKernel.available(torch.zeros(1, 1)):
        pytest.skip("no oneDNN in this torch build")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _split_bits(rows)
    finally:
        torch.set_num_threads(saved)


def _split_bits(rows: int) -> None:
    cfg = dataclasses.replace(preset_config("tiny"), attention_bias=True)
    attn = Attention(cfg, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(rows)
    with torch.no_grad():
        attn.qkv_proj.weight.normal_(0, 0.05, generator=gen)
        attn.qkv_proj.bias.normal_(0, 0.1, generator=gen)
    attn.qkv_proj.set_kernel("onednn")
    assert attn.split_qkv()
    x = torch.randn(rows, cfg.hidden_size, generator=gen)
    fused = attn.qkv_proj.kernel(x)
    q, kv = (kernel(x) for kernel in attn.q_kv_kernels)
    assert torch.equal(kv, fused[:, attn.q_size:])
    assert torch.equal(q, fused[:, :attn.q_size])
    attn.qkv_proj.set_kernel("mkl")
    assert not attn.split_qkv() and attn.q_kv_kernels is None  # no split off oneDNN


def test_w8a8_keeps_the_last_layer_unsplit(onednn_tiny):
    onednn_tiny.model.prepare("w8a8")
    try:
        assert all(layer.self_attn.q_kv_kernels is None for layer in onednn_tiny.model.layers)
    finally:
        onednn_tiny.model.prepare(None)
    assert onednn_tiny.model.layers[-1].self_attn.q_kv_kernels is not None


def test_every_row_builds_no_split_packs(onednn_tiny, monkeypatch):
    """review_eng22 finding 7: under HINTKV_LAST_LAYER_ROWS=all no step keeps rows, so the split's q and k/v packs
    (a copy of the last layer's qkv weight) are memory for nothing: `prepare` builds them only when rows are kept."""
    model = onednn_tiny.model
    monkeypatch.setenv("HINTKV_LAST_LAYER_ROWS", "all")
    model.prepare(None)
    assert all(layer.self_attn.q_kv_kernels is None for layer in model.layers)
    monkeypatch.delenv("HINTKV_LAST_LAYER_ROWS")
    model.prepare(None)
    assert model.layers[-1].self_attn.q_kv_kernels is not None


@pytest.mark.parametrize("off", ["mkl kernel", "compiled regions", "every row kept"])
def test_the_forward_runs_the_fused_qkv_when_the_split_does_not_apply(onednn_tiny, off):
    """The split kernels stay set, but the forward takes the fused qkv when qkv_proj left oneDNN (`set_kernel`
    without a re-prepare), under compiled regions (one rope graph) and when the step keeps every row."""
    model = onednn_tiny.model
    attn = model.layers[-1].self_attn
    split, regions, q_rows, kv_rows, fused_rows = attn.q_kv_kernels, model.regions, [], [], []
    rng = random.Random(9)
    full, _ = _steps(onednn_tiny, random.Random(9))
    kept, _ = _steps(onednn_tiny, random.Random(9))
    batch = [("a", [rng.randrange(100, 40000) for _ in range(30)])]
    keep = 30 if off == "every row kept" else 1
    _, in_full = full.prepare(batch)
    _, in_kept = kept.prepare(batch)
    hook = attn.qkv_proj.register_forward_pre_hook(lambda m, args: fused_rows.append(args[0].shape[0]))
    try:
        if off == "mkl kernel":
            attn.qkv_proj.set_kernel("mkl")
        elif off == "compiled regions":
            model.regions = Regions(add_rmsnorm=regions.add_rmsnorm, rope=regions.rope, silu_mul=regions.silu_mul,
                                    compiled=True)
        h_full = full.runner.forward(in_full)
        attn.q_kv_kernels = (_Rows(split[0], q_rows), _Rows(split[1], kv_rows))
        h_kept = kept.runner.forward(in_kept, [keep])
    finally:
        hook.remove()
        attn.q_kv_kernels, model.regions = split, regions
        attn.qkv_proj.set_kernel("onednn")
        attn.qkv_proj.kernel.warm()
    assert q_rows == [] and kv_rows == [] and fused_rows == [30, 30]  # the fused qkv, all rows, in both runs
    torch.testing.assert_close(h_kept, h_full[-keep:], rtol=1e-5, atol=1e-5)
    for a, b in zip(full.runner.kv_caches, kept.runner.kv_caches, strict=True):
        assert torch.equal(a, b)
