"""W8A8's parts (int8.py, calibration.py, the LM head kernel): two-level activation quantization,
the one-row path, SmoothQuant's identity, calibration, and the head's exact top logits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hintkv.bench.accuracy import FIXED_TEXTS
from hintkv.models.calibration import (
    CALIBRATION_TEXTS,
    calibrate,
    calibration_token_lists,
)
from hintkv.models.int8 import fine_int8_rows, int8_linear, quantize_rows, quantize_weight, smoothing
from hintkv.models.linear import KERNELS, Linear
from hintkv.models.loader import load_model


def _x(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x[:, 3] *= 40.0  # an outlier channel, as LLM activations have
    return x


def test_two_level_rows_are_finer_than_one_level():
    x = _x(5, 256)
    q1, s1 = quantize_rows(x, 1)
    q2, s2 = quantize_rows(x, 2)
    assert q1.dtype == q2.dtype == torch.int8 and q2.shape == (10, 256) and s2.shape == (10, 1)
    one = q1.float() * s1
    two = q2[:5].float() * s2[:5] + q2[5:].float() * s2[5:]
    err1, err2 = (x - one).abs().amax(1), (x - two).abs().amax(1)
    assert torch.all(err1 <= s1[:, 0] / 2 + 1e-6)
    assert torch.all(err2 <= s2[5:, 0] / 2 + 1e-6)
    assert float(err2.max()) < float(err1.max()) / 50


def test_one_row_path_matches_the_batched_path():
    """A decode row takes two one-row GEMMs; the same row inside a batch takes one stacked GEMM."""
    w = torch.randn(96, 128)
    w_t, w_scale = quantize_weight(w)
    x = _x(8, 128, seed=1)
    batched = int8_linear(x, w_t, w_scale, None)
    for i in range(8):
        torch.testing.assert_close(int8_linear(x[i:i + 1], w_t, w_scale, None), batched[i:i + 1])
    ref = x @ w.t()
    assert float((batched - ref).norm() / ref.norm()) < 0.01


def test_smoothing_keeps_the_product_and_flattens_the_outlier():
    w = torch.randn(64, 128) * 0.05
    x = _x(6, 128, seed=2)
    s = smoothing(x.abs().amax(0), w)
    torch.testing.assert_close((x / s) @ (w * s).t(), x @ w.t(), rtol=1e-4, atol=1e-4)
    xs = (x / s).abs().amax(0)
    assert float(xs.max() / xs.median()) < float(x.abs().amax(0).max() / x.abs().amax(0).median())
    # smoothed int8 is closer to float than plain int8 with an outlier channel
    plain = int8_linear(x, *quantize_weight(w), None, levels=1)
    smooth = int8_linear(x, *quantize_weight(w, s), 1.0 / s, levels=1)
    ref = x @ w.t()
    assert float((smooth - ref).norm()) < float((plain - ref).norm())


def test_head_kernel_rescores_its_top_logits_exactly():
    lin = Linear(64, 500, False, torch.float32, "cpu")
    with torch.no_grad():
        lin.weight.copy_(torch.randn(500, 64))
    x = torch.randn(3, 64)
    ref = F.linear(x, lin.weight)
    head = KERNELS["w8a8-head"](lin.weight, None)
    out = head(x)
    approx = KERNELS["w8a8"].__call__(head, x)  # the int8 logits before rescoring
    assert float((approx - ref).abs().max()) > 1e-3
    top = approx.topk(head.RESCORE, dim=-1).indices
    torch.testing.assert_close(out.gather(-1, top), ref.gather(-1, top), rtol=1e-5, atol=1e-5)
    assert torch.equal(out.argmax(-1), ref.argmax(-1))


def test_calibration_texts_are_not_the_evaluation_texts():
    assert not set(CALIBRATION_TEXTS) & set(FIXED_TEXTS)
    for cal in CALIBRATION_TEXTS:
        assert all(ev[:60] not in cal for ev in FIXED_TEXTS)


def test_calibrate_records_every_linear_input():
    lm = load_model("dummy:tiny", torch.float32, "cpu")
    absmax = calibrate(lm.model, [ids[:40] for ids in calibration_token_lists(lm.tokenizer)])
    linears = {n: m for n, m in lm.model.named_modules() if isinstance(m, Linear)}
    assert set(absmax) == set(linears)
    for name, a in absmax.items():
        assert a.shape == (linears[name].weight.shape[1],) and bool(torch.all(a >= 0)) and float(a.max()) > 0
    # the hooks are gone: a second forward records nothing more
    assert not any(m._forward_pre_hooks for m in linears.values())


def test_w8a8_dummy_model_calibrates_and_stays_close():
    ref = load_model("dummy:tiny", torch.float32, "cpu")
    q = load_model("dummy:tiny", torch.float32, "cpu", quantization="w8a8")
    smoothed = [m.kernel.inv_smooth is not None for m in q.model.modules()
                if isinstance(m, Linear) and m.kernel.name == "w8a8"]
    assert q.model.calibration and len(smoothed) == 3 * 8 and all(smoothed)
    from hintkv.models.one_sequence import OneSequence

    ids = list(range(200, 260))
    a, b = OneSequence(ref.model, 64).step(ids), OneSequence(q.model, 64).step(ids)
    assert float((a - b).norm() / a.norm()) < 0.05


def test_fused_cpu_ops_give_the_eager_int8_values(monkeypatch):
    """int8_cpu's two fused calls do the eager ops' arithmetic: the same int8 rows, scales to an ulp, the
    same GEMM output (the eager path is what runs where the extension cannot be built)."""
    from hintkv.models import cpu_ext, int8_cpu

    fused = int8_cpu.ops()
    assert fused is not None, "the C++ extension should build on this machine (g++ and ninja)"
    x = _x(7, 320, seed=4)
    inv = torch.rand(320, generator=torch.Generator().manual_seed(5)) + 0.5
    for levels in (1, 2):
        q, s = fused.quantize_rows(x, inv, levels)
        qe, se = quantize_rows(x * inv, levels)
        assert torch.equal(q, qe)
        torch.testing.assert_close(s, se, rtol=1e-5, atol=0)  # the residual may differ by an ulp (FMA)
    w_t, w_scale = quantize_weight(torch.randn(96, 320), 1.0 / inv)
    for rows in (1, 7):
        got = int8_linear(x[:rows], w_t, w_scale, inv)
        monkeypatch.setitem(cpu_ext._built, "hintkv_int8_cpu", None)
        want = int8_linear(x[:rows], w_t, w_scale, inv)
        monkeypatch.setitem(cpu_ext._built, "hintkv_int8_cpu", fused)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("amx", [True, False])
def test_few_row_kernel_gives_the_int_mm_result(monkeypatch, amx):
    """int8_cpu.gemv (decode / verify steps: the weight in 16-channel blocks; on AMX tiles where the CPU
    has them, else AVX512-VNNI with u8 activations and the offset taken back out, or AVX2's vpmaddubsw on
    |a| and sign(a) w) sums the same int8 products as torch._int_mm, for shapes that need padding."""
    from hintkv.models import int8, int8_cpu
    from hintkv.models.int8 import GEMV_ROWS, block_weight

    fused = int8_cpu.ops()
    assert fused is not None
    if not fused.has_fast_gemv():
        pytest.skip("neither AVX512-VNNI nor AVX2 here: int8_linear keeps torch._int_mm for few rows")
    if amx and not fused.has_amx():
        pytest.skip("no AMX here: gemv runs the VNNI or AVX2 loop")
    monkeypatch.setattr(int8, "AMX", amx)
    # the head's path ("-i16": the layers' steps run the int16 kernel, `test_int16_gemv.py`; this test's weights are
    # blocked for the int8 loop)
    assert int8.gemv_path().removesuffix("-i16") == ("amx" if amx else fused.gemv_isa())
    assert fused.gemv_isa() in ("vnni", "avx2")
    before, calls = fused.gemv_calls(), 0
    for k, n in ((90, 100), (200, 260)):  # neither a multiple of 64 / 16: the blocks are padded
        inv = torch.rand(k, generator=torch.Generator().manual_seed(1)) + 0.5
        w_t, w_scale = quantize_weight(torch.randn(n, k, generator=torch.Generator().manual_seed(2)), 1.0 / inv)
        blocked = block_weight(w_t)
        assert blocked[0].shape == (-(-n // 16), -(-k // 64) * 16, 16, 4)
        for levels in (1, 2):
            for rows in (1, 2, 3, 5, GEMV_ROWS // levels):  # every row-group size of both loops (8, 4, 2, 1)
                x = _x(rows, k, seed=rows)
                got = int8_linear(x, w_t, w_scale, inv, levels, blocked)
                calls += 1
                want = int8_linear(x, w_t, w_scale, inv, levels)  # no blocks: quantize + _int_mm + rescale
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    ran = [a - b for a, b in zip(fused.gemv_calls(), before)]
    assert ran == ([calls, 0] if amx else [0, calls])  # every call took the path under test (a fallback is exact too)


def test_few_row_loop_gives_the_eager_rescale_bit_for_bit():
    """gemv's vector loop (not AMX): one 16-channel block a pass, two at 1-2 int8 rows, and the AVX-512 rescale of a
    whole block, equal bit for bit the eager formula on the same quantized rows: int32 dot products, then
    (float(dot_1) s_1 + float(dot_2) s_2) w_scale per channel in that order. Odd and even block counts, a partial
    last block, every row count of a decode step (1-8 rows, two levels: 2-16 int8 rows)."""
    from hintkv.models import int8_cpu
    from hintkv.models.int8 import GEMV_ROWS, block_weight

    fused = int8_cpu.ops()
    if fused is None or not fused.has_fast_gemv():
        pytest.skip("neither AVX512-VNNI nor AVX2 here: int8_linear keeps torch._int_mm for few rows")
    for k, n in ((128, 96), (200, 260), (512, 768)):  # 6 blocks, 17 (the last 4 channels), 48
        g = torch.Generator().manual_seed(n)
        inv = torch.rand(k, generator=g) + 0.5
        w_t, w_scale = quantize_weight(torch.randn(n, k, generator=g), 1.0 / inv)
        wb, w_comp = block_weight(w_t)
        for levels in (1, 2):
            for rows in range(1, GEMV_ROWS // levels + 1):
                x = _x(rows, k, seed=rows)
                got = fused.gemv(x, inv, wb, w_scale, w_comp, levels, False)
                q, s = fused.quantize_rows(x, inv, levels)
                dots = (q.long() @ w_t.long()).float()  # exact int32 sums, then float as the kernel converts
                want = dots[:rows] * s[:rows]
                for level in range(1, levels):
                    want = want + dots[level * rows:(level + 1) * rows] * s[level * rows:(level + 1) * rows]
                assert torch.equal(got, want * w_scale), (k, n, levels, rows)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def test_few_row_kernel_has_a_vector_loop_wherever_the_cpu_has_avx2():
    """A CPU with AVX2 but no AVX512-VNNI (AMD Zen 1-3, Intel before Ice Lake) runs w8a8's few-row steps on
    gemv's AVX2 loop: before it, such a CPU took torch._int_mm there (qkv at one row 1272 us vs 156 us,
    dummy:tiny's head at 8 rows 231 ms vs 14 ms, one thread) and the fused decode call declined w8a8."""
    from hintkv.models import int8, int8_cpu

    flags = _cpu_flags()
    fused = int8_cpu.ops()
    if "avx2" not in flags or fused is None:
        pytest.skip("no AVX2 (or no /proc/cpuinfo, or no extension) here")
    assert fused.has_fast_gemv()
    want = "vnni" if {"avx512_vnni", "avx512bw"} <= flags else "avx2"
    assert fused.gemv_isa() == want
    assert int8.gemv_path() in ("amx", want, f"{want}-i16", "amx-i16")
    assert int8.gemv_kernel() == ("i16" if want == "avx2" else "i8") or os.environ.get("HINTKV_INT8_GEMV")


_ZERO_ROWS = """
import torch
from hintkv.models import int8
from hintkv.models.int8 import block_weight, int8_linear, quantize_weight
int8.AMX = {amx}
w_t, w_scale = quantize_weight(torch.randn(64, 128))
for depth, levels in ((4, 1), (4, 2), (2, 2)):  # depth 2: the int16 kernel
    y = int8_linear(torch.randn(0, 128), w_t, w_scale, None, levels, block_weight(w_t, depth))
    print(tuple(y.shape), end=" ")
print(int8.gemv_path().removesuffix("-i16"))
"""


@pytest.mark.parametrize("amx", [True, False])
def test_few_row_kernel_takes_zero_rows(amx):
    """A 0-row step (a one-token text's empty continuation in bench/accuracy) gives an empty result on
    both gemv paths; AMX's tile config with 0 rows faulted the process, hence a child process."""
    from hintkv.models import int8_cpu

    fused = int8_cpu.ops()
    if fused is None or not fused.has_fast_gemv():
        pytest.skip("neither AVX512-VNNI nor AVX2 here: int8_linear keeps torch._int_mm for few rows")
    if amx and not fused.has_amx():
        pytest.skip("no AMX here: gemv runs the VNNI or AVX2 loop")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _ZERO_ROWS.format(amx=amx)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["(0,", "64)"] * 3 + ["amx" if amx else fused.gemv_isa()]


def test_fine_kernel_is_float_on_many_rows_and_two_level_on_few():
    """down_proj's kernel (W8A8_FINE): many rows run the float weight (exact; on AVX2 from 3 rows, where an
    int8 multiply-add costs a float one and the two levels double them); a few rows run two int8 levels of
    the weight, several times closer to float than one level."""
    from hintkv.models import int8_cpu

    lin = Linear(192, 64, False, torch.float32, "cpu")
    with torch.no_grad():
        lin.weight.copy_(torch.randn(64, 192, generator=torch.Generator().manual_seed(3)) * 0.05)
    x = _x(40, 192, seed=6)
    ref = F.linear(x, lin.weight)
    lin.set_kernel("w8a8-fine")
    torch.testing.assert_close(lin(x), ref, atol=1e-5, rtol=1e-5)
    if lin.kernel.blocked is None:
        assert not int8_cpu.ops() or not int8_cpu.ops().has_fast_gemv()
        return
    rows = lin.kernel.int8_rows
    assert rows == fine_int8_rows() >= 2
    torch.testing.assert_close(lin(x[:rows + 1]), lin.kernel.float_kernel(x[:rows + 1]), atol=0, rtol=0)
    few = x[:rows]
    fine_err = float((lin(few) - F.linear(few, lin.weight)).norm())
    lin.set_kernel("w8a8")
    one_level_err = float((lin(few) - F.linear(few, lin.weight)).norm())
    assert fine_err < one_level_err / 3, (fine_err, one_level_err)


def test_topk_indices_is_the_set_torch_topk_picks():
    """int8_cpu.topk_indices (the LM head's rescoring set): the same indices as torch.topk, in any order,
    where the largest sit anywhere in the row (its first k, its tail past the last 16-value chunk)."""
    from hintkv.models import int8_cpu

    fused = int8_cpu.ops()
    assert fused is not None
    g = torch.Generator().manual_seed(8)
    for m, v, k in ((1, 49152, 16), (8, 1000, 16), (3, 37, 5), (2, 16, 16)):
        logits = torch.randn(m, v, generator=g)
        logits[0, :k] += 10.0  # the first row's best are its first k (the initial set)
        logits[-1, -3:] += 10.0  # the last row's three best are in its tail
        got = fused.topk_indices(logits, k)
        assert got.shape == (m, k) and got.dtype == torch.int64
        want = logits.topk(k, dim=-1).indices
        assert torch.equal(got.sort(-1).values, want.sort(-1).values)


def test_block_weight_refuses_minus_128():
    """-128 has no int8 negation: the AVX2 loop's sign(a) x w would be wrong, so the layout refuses it."""
    from hintkv.models.int8 import block_weight

    w_t = torch.zeros(64, 16, dtype=torch.int8)
    block_weight(w_t)
    w_t[3, 5] = -128
    with pytest.raises(ValueError, match="-127, 127"):
        block_weight(w_t)
