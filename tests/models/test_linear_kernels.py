"""GEMM kernels (linear.py): each matches F.linear (exactly enough, or within w8a8's tolerance),
never runs on a stale copy, and the prepared real SmolLM2 decodes the same greedy tokens as plain
float32 F.linear (fusion + packing are exact); w8a8 stays within its stated accuracy; the CPU GEMM
library (`cpu_gemm`) is chosen once, by HINTKV_CPU_GEMM or the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hintkv.bench.accuracy import compare, fixed_token_lists, greedy
from hintkv.models import gemv_cpu, linear
from hintkv.models.linear import KERNELS, Linear, MklPackedKernel, OneDnnKernel, PackedKernel, choose_kernel
from hintkv.models.loader import load_model


def _linear(n_in: int, n_out: int, bias: bool, seed: int = 0) -> Linear:
    lin = Linear(n_in, n_out, bias, torch.float32, "cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n_out, n_in, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(n_out, generator=g))
    return lin


def _runs_here(name: str, weight: torch.Tensor) -> bool:
    kind = KERNELS[name]
    return not isinstance(kind.__dict__.get("available"), staticmethod) or kind.available(weight)


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
        if not _runs_here(name, lin.weight):
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
        if not _runs_here(name, lin.weight):
            continue
        lin.set_kernel(name)
        assert lin(x).shape == (2, 5, 48)


@pytest.mark.parametrize("rows", [4, 40])  # few rows (gemv, MKL buckets) and many (F.linear, oneDNN's packed copy)
@pytest.mark.parametrize("name", ["mkl", "onednn", "packed", "w8a8"])
def test_prepared_copy_follows_weight_changes(name, rows):
    """A packed or quantized copy is rebuilt when the weight is written: never a stale GEMM."""
    lin = _linear(64, 64, False)
    if not _runs_here(name, lin.weight):
        pytest.skip(f"no {name} kernel in this torch build")
    lin.set_kernel(name)
    lin.kernel.warm()  # oneDNN's copy exists before the write, as after a model load
    x = torch.randn(rows, 64)
    before = lin(x)
    with torch.no_grad():
        lin.weight.mul_(-2.0)
    after = lin(x)
    torch.testing.assert_close(after, -2.0 * before, atol=0.05 * float(before.abs().max()), rtol=0.05)


def test_one_onednn_copy_serves_every_row_count():
    """oneDNN's weight is packed once (at `warm`), every row count past the few-row kernel reads that copy, and 12
    rows or fewer read the plain weight (gemv). oneDNN matches F.linear bit for bit at these shapes, so the copy
    is swapped for one of -W: the sign of the output says which weight a row count read."""
    lin = _linear(96, 80, False)
    if not OneDnnKernel.available(lin.weight):
        pytest.skip("no oneDNN in this torch build")
    lin.set_kernel("onednn")
    packs = OneDnnKernel.num_packs
    lin.kernel.warm()
    lin.kernel.warm()
    assert OneDnnKernel.num_packs == packs + 1
    lin.kernel.onednn_weight = torch.ops.mkldnn._reorder_linear_weight(-lin.weight, OneDnnKernel.PACK_ROWS)
    gemv_here = gemv_cpu.gemv(torch.zeros(1, 96), lin.weight, None) is not None  # else few rows run oneDNN too
    for rows in (1, 12, 13, 17, 64, 300):
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
        sign = 1.0 if rows <= gemv_cpu.ROWS and gemv_here else -1.0
        torch.testing.assert_close(lin(x), sign * F.linear(x, lin.weight), atol=1e-5, rtol=1e-5)
    assert OneDnnKernel.num_packs == packs + 1


def test_cpu_gemm_is_chosen_by_name_or_cpu(monkeypatch):
    """HINTKV_CPU_GEMM names the library; auto follows the CPU; a bad name is refused, not ignored."""
    w = torch.zeros(8, 8)
    try:
        for want in linear.CPU_GEMMS:
            monkeypatch.setenv("HINTKV_CPU_GEMM", want)
            linear.cpu_gemm.cache_clear()
            assert linear.cpu_gemm() == want
            if KERNELS[want].available(w):
                assert choose_kernel(w, None) == want
        monkeypatch.setenv("HINTKV_CPU_GEMM", "auto")  # auto's decision: test_cpu_choice.py, on fixed cpuinfo
        linear.cpu_gemm.cache_clear()
        assert linear.cpu_gemm() in linear.CPU_GEMMS
        assert choose_kernel(w.to(torch.bfloat16), None) == "dense"
        monkeypatch.setenv("HINTKV_CPU_GEMM", "blas9")
        linear.cpu_gemm.cache_clear()
        with pytest.raises(ValueError, match="HINTKV_CPU_GEMM"):
            linear.cpu_gemm()
    finally:
        monkeypatch.undo()
        linear.cpu_gemm.cache_clear()


# the row counts each side of `in_float`'s edge: w8a8 quantizes 2 levels per row, 16 int8 rows in gemv (one 14-bit
# row per token on the int16 kernel, `int8.gemv_kernel()`)
@pytest.mark.parametrize("name", ["w8a8", "w8a8-head"])
def test_w8a8_prefill_rows_take_the_float_weight_where_int8_gemm_is_slow(name, monkeypatch):
    """HINTKV_W8A8_PREFILL=float (auto on a CPU without VNNI / AMX, where torch._int_mm ran w8a8's prefill
    17-20x slower than float32): past gemv's 16 activation rows (w8a8: 8 rows of 2 int8 levels, or 16 on the int16
    kernel; the head: 16 of 1) the float weight runs (float32's result), up to them int8; =int8 keeps every row in
    int8; a bad value is refused."""
    from hintkv.models import int8

    int8_rows = 8 if name == "w8a8" and int8.gemv_kernel() == "i8" else 16
    lin = _linear(96, 80, False)
    xs = {rows: torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
          for rows in (4, int8_rows, int8_rows + 1, 40)}
    try:
        for want in ("float", "int8"):
            monkeypatch.setenv("HINTKV_W8A8_PREFILL", want)
            int8.int8_gemm_rows_run_int8.cache_clear()
            lin.set_kernel(name)
            lin.kernel.warm()
            for rows, x in xs.items():
                ref, out = F.linear(x, lin.weight), lin(x)
                if want == "float" and rows > int8_rows:
                    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
                else:
                    assert not torch.allclose(out, ref, atol=1e-5, rtol=1e-5), rows  # int8
                    assert float((out - ref).norm() / ref.norm()) < 0.01
        monkeypatch.setenv("HINTKV_W8A8_PREFILL", "fast")
        int8.int8_gemm_rows_run_int8.cache_clear()
        with pytest.raises(ValueError, match="HINTKV_W8A8_PREFILL"):
            int8.int8_gemm_rows_run_int8()
    finally:
        monkeypatch.undo()
        int8.int8_gemm_rows_run_int8.cache_clear()


def test_unknown_quantization_is_rejected():
    with pytest.raises(ValueError, match="quantization"):
        choose_kernel(torch.zeros(2, 2), "int3")
    assert choose_kernel(torch.zeros(2, 2), "w8a8") == "w8a8"
    assert choose_kernel(torch.zeros(2, 2), "w8a8", is_lm_head=True) == "w8a8-head"


@pytest.fixture(scope="module")
def smollm2_load():
    """The real SmolLM2 on the `onednn` kernel (pinned: auto picks mkl on Intel), whether it could be pinned
    (a torch with oneDNN), and how many weights its load reordered."""
    pinned = OneDnnKernel.available(torch.zeros(1, 1))
    with pytest.MonkeyPatch.context() as mp:
        if pinned:
            mp.setenv("HINTKV_CPU_GEMM", "onednn")
        linear.cpu_gemm.cache_clear()
        packs = OneDnnKernel.num_packs
        lm = load_model(None, torch.float32, "cpu")
        packs = OneDnnKernel.num_packs - packs
    linear.cpu_gemm.cache_clear()
    return lm, pinned, packs


@pytest.fixture(scope="module")
def smollm2(smollm2_load):
    return smollm2_load[0]


def _prompt(lm, question: str) -> list[int]:
    return lm.tokenizer.encode(lm.tokenizer.apply_chat_template([{"role": "user", "content": question}]))


@pytest.fixture(scope="module")
def plain_smollm2():
    """The real SmolLM2 with every GEMM through F.linear: the reference of the prepared kernels' greedy tokens."""
    plain = load_model(None, torch.float32, "cpu")
    _all_dense(plain.model)
    return plain


def test_prepared_smollm2_decodes_like_plain_float32(smollm2_load, plain_smollm2):
    """Fused norms, in-place RoPE and packed GEMMs (`onednn`, each layer weight reordered once at load, not
    twice; the last layer's q projected for the sampled rows only) vs every GEMM through F.linear: same greedy
    tokens."""
    smollm2, pinned, packs = smollm2_load
    layers = [m for m in smollm2.model.modules() if isinstance(m, Linear)]
    if pinned:
        assert {m.kernel.name for m in layers} == {"onednn"}
        assert smollm2.model._lm_head_kernel.name == "onednn"
        # the head packs at engine start (`warm_head`) or on demand; the last layer's q and k/v slices once more
        # (`Attention.split_qkv`)
        assert packs == len(layers) + 2 == 122
        assert smollm2.model.layers[-1].self_attn.q_kv_kernels is not None
        assert all(m.kernel.onednn_weight is not None for m in layers)
    prompt = _prompt(smollm2, "Write a Python function that reverses a string.")
    assert greedy(plain_smollm2.model, prompt, 24) == greedy(smollm2.model, prompt, 24)


def test_packed_smollm2_decodes_like_plain_float32(plain_smollm2):
    """HINTKV_CPU_GEMM=packed (our packed GEMM past 12 rows, so every prefill GEMM of this 30+ token prompt; gemv
    below) vs every GEMM through F.linear: same greedy tokens."""
    if not PackedKernel.available(torch.zeros(1, 1)):
        pytest.skip("no C++ build of packed_gemm here")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HINTKV_CPU_GEMM", "packed")
        linear.cpu_gemm.cache_clear()
        packs = PackedKernel.num_packs
        lm = load_model(None, torch.float32, "cpu")
    linear.cpu_gemm.cache_clear()
    layers = [m for m in lm.model.modules() if isinstance(m, Linear)]
    assert {m.kernel.name for m in layers} == {"packed"} and lm.model._lm_head_kernel.name == "packed"
    assert PackedKernel.num_packs - packs == len(layers)  # each layer weight packed once, at load
    prompt = _prompt(lm, "Write a Python function that reverses a string.")
    assert len(prompt) > gemv_cpu.ROWS
    assert greedy(plain_smollm2.model, prompt, 24) == greedy(lm.model, prompt, 24)


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
