"""GEMM kernels (linear.py): each matches F.linear (exactly enough, or within w8a8's tolerance),
never runs on a stale copy, and the prepared real SmolLM2 decodes the same greedy tokens as plain
float32 F.linear (fusion + packing are exact); w8a8 stays within its stated accuracy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hintkv.bench.accuracy import compare, fixed_token_lists, greedy
from hintkv.models.linear import KERNELS, Linear, MklPackedKernel, choose_kernel
from hintkv.models.loader import load_model


def _linear(n_in: int, n_out: int, bias: bool, seed: int = 0) -> Linear:
    lin = Linear(n_in, n_out, bias, torch.float32, "cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n_out, n_in, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(n_out, generator=g))
    return lin


def _all_dense(model) -> None:
    for mod in model.modules():
        if isinstance(mod, Linear):
            mod.set_kernel("dense")
    model._lm_head_kernel = KERNELS["dense"](model.lm_head, None)


@pytest.mark.parametrize("rows", [1, 3, 17, 130])
@pytest.mark.parametrize("bias", [False, True])
def test_kernels_match_f_linear(rows, bias):
    lin = _linear(96, 80, bias)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    ref = F.linear(x, lin.weight, lin.bias)
    for name in KERNELS:
        if name == "mkl" and not MklPackedKernel.available(lin.weight):
            continue
        lin.set_kernel(name)
        out = lin(x)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        if name.startswith("w8a8"):  # int8 weights, two-level int8 activations: ~0.5% on random data
            assert float((out - ref).norm() / ref.norm()) < 0.01
        else:
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_three_dim_input_keeps_its_shape():
    lin = _linear(32, 48, False)
    x = torch.randn(2, 5, 32)
    for name in KERNELS:
        lin.set_kernel(name)
        assert lin(x).shape == (2, 5, 48)


@pytest.mark.parametrize("name", ["mkl", "w8a8"])
def test_prepared_copy_follows_weight_changes(name):
    """A packed or quantized copy is rebuilt when the weight is written: never a stale GEMM."""
    if name == "mkl" and not torch._C.has_mkl:
        pytest.skip("no MKL in this torch build")
    lin = _linear(64, 64, False)
    lin.set_kernel(name)
    x = torch.randn(4, 64)
    before = lin(x)
    with torch.no_grad():
        lin.weight.mul_(-2.0)
    after = lin(x)
    torch.testing.assert_close(after, -2.0 * before, atol=0.05 * float(before.abs().max()), rtol=0.05)


def test_unknown_quantization_is_rejected():
    with pytest.raises(ValueError, match="quantization"):
        choose_kernel(torch.zeros(2, 2), "int3")
    assert choose_kernel(torch.zeros(2, 2), "w8a8") == "w8a8"
    assert choose_kernel(torch.zeros(2, 2), "w8a8", is_lm_head=True) == "w8a8-head"


@pytest.fixture(scope="module")
def smollm2():
    return load_model(None, torch.float32, "cpu")


def _prompt(lm, question: str) -> list[int]:
    return lm.tokenizer.encode(lm.tokenizer.apply_chat_template([{"role": "user", "content": question}]))


def test_prepared_smollm2_decodes_like_plain_float32(smollm2):
    """Fused norms, in-place RoPE and packed GEMMs vs every GEMM through F.linear: same greedy tokens."""
    prompt = _prompt(smollm2, "Write a Python function that reverses a string.")
    fast = greedy(smollm2.model, prompt, 24)
    plain = load_model(None, torch.float32, "cpu")
    _all_dense(plain.model)
    assert greedy(plain.model, prompt, 24) == fast


def test_w8a8_smollm2_accuracy(smollm2):
    """Stated tolerance: top-1 agreement >= 95% and perplexity within 2% of float32 on the fixed text set
    (the benchmark reports the measured figures: 0.983 with SmoothQuant, two-level activations and
    down_proj in float, 0.915 and +4.6% before; the issue's goal is 97%)."""
    q = load_model(None, torch.float32, "cpu", quantization="w8a8")
    kinds = {n: m.kernel.name for n, m in q.model.named_modules() if isinstance(m, Linear)}
    assert sum(k == "w8a8" for k in kinds.values()) == 3 * 30  # down_proj is finer: W8A8_FINE
    assert all(k == "w8a8-fine" for n, k in kinds.items() if n.endswith("down_proj"))
    assert all(m.kernel.inv_smooth is not None for m in q.model.modules()
               if isinstance(m, Linear) and m.kernel.name == "w8a8")
    assert q.model._lm_head_kernel.name == "w8a8-head"
    for one_by_one in (False, True):  # the prefill kernels, then the decode (few-row) kernels
        r = compare(smollm2.model, q.model, fixed_token_lists(smollm2.tokenizer), one_by_one=one_by_one)
        assert r["tokens"] > 200
        assert r["top1_agreement"] >= 0.95, r
        assert r["ppl_candidate"] <= 1.02 * r["ppl_reference"], r
    # the answer's first token is a near tie in float32 ("The" 25.33 vs "L" 25.24), so start it
    prompt = _prompt(q, "What is the capital of France?") + q.tokenizer.encode("The capital of France is")
    assert "Paris" in smollm2.tokenizer.decode(greedy(q.model, prompt, 4))


def test_the_mkl_kernels_few_row_cpp_is_built_when_a_weight_is_prepared(monkeypatch):
    """Before, `gemv_cpu`'s C++ was built inside the first decode step: a fresh `hintkv serve` said it
    was ready, then its first request waited minutes for the compiler (TTFT 253 s under load). It is
    built (or found cached) when the kernel is prepared, i.e. at model load."""
    from hintkv.models import cpu_ext, cpu_kernels

    lin = _linear(32, 16, False)
    if not MklPackedKernel.available(lin.weight) or not cpu_kernels.enabled():
        pytest.skip("no MKL float32 CPU kernel here")
    monkeypatch.delitem(cpu_ext._built, "hintkv_gemv", raising=False)
    KERNELS["mkl"](lin.weight, None)
    assert "hintkv_gemv" in cpu_ext._built  # loaded (or its failure recorded) at prepare, before any call
