"""gemv_cpu.py: the few-row float32 GEMM equals F.linear (row and column tails, bias, every row count
it takes), and the `mkl` linear kernel runs it for few rows only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hintkv.models import cpu_kernels, gemv_cpu
from hintkv.models.linear import MklPackedKernel

pytestmark = pytest.mark.skipif(not cpu_kernels.enabled() or gemv_cpu.ops() is None,
                                reason="C++ kernels off or not built: linear.py runs MKL")


@pytest.mark.parametrize("n,k", [(768, 512), (13, 80), (40, 1536), (7, 16), (9, 77), (5, 3)])  # 77, 3: column tails
def test_gemv_equals_f_linear(n, k):
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen) * 0.05
    b = torch.randn(n, generator=gen)
    for m in range(1, gemv_cpu.ROWS + 1):
        x = torch.randn(m, k, generator=gen)
        torch.testing.assert_close(gemv_cpu.gemv(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gemv_cpu.gemv(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    wide = torch.randn(3, 2 * k, generator=gen)[:, :k]  # strided rows: copied first
    torch.testing.assert_close(gemv_cpu.gemv(wide, w, b), F.linear(wide, w, b), rtol=1e-5, atol=1e-5)


def test_gemv_declines_what_it_does_not_serve():
    w = torch.randn(32, 64)
    assert gemv_cpu.gemv(torch.randn(gemv_cpu.ROWS + 1, 64), w, None) is None
    assert gemv_cpu.gemv(torch.randn(2, 64).double(), w.double(), None) is None
    assert gemv_cpu.gemv(torch.randn(2, 64), w.t().contiguous().t(), None) is None  # a transposed weight


def test_the_mkl_kernel_runs_few_rows_in_cpp_and_many_in_mkl(monkeypatch):
    w = torch.randn(300, 128) * 0.05
    kernel = MklPackedKernel(w, None)
    calls, real = [], gemv_cpu.gemv
    monkeypatch.setattr(gemv_cpu, "gemv", lambda x, w, b: calls.append(x.shape[0]) or real(x, w, b))
    for m in (1, 5, gemv_cpu.ROWS, gemv_cpu.ROWS + 1, 40):
        x = torch.randn(1, m, 128)  # a leading dim: the kernel flattens it
        torch.testing.assert_close(kernel(x), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert calls == [1, 5, gemv_cpu.ROWS]
    assert set(kernel.packed) == {16}  # only the 13-row call packed a bucket: C++ served the few-row ones


def test_an_avx2_cpu_runs_the_vector_loop():
    """A CPU with AVX2 + FMA and no AVX-512 (this AMD EPYC, Zen 1) runs gemv's AVX2 loop, not the plain one (one
    FMA chain per dot: dummy:tiny's qkv at one row 751 us vs 172, gate_up at 8 rows 16.6 ms vs 1.7, one thread)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    if not {"avx2", "fma"} <= flags:
        pytest.skip("no AVX2 + FMA here")
    assert gemv_cpu.ops().gemv_isa() == ("avx512" if "avx512f" in flags else "avx2")


def test_an_avx2_cpu_screens_the_greedy_head():
    """The greedy head's int8 screen (greedy_head.py) runs on an AVX2 CPU without AVX512-VNNI too (before, such a
    CPU computed the float32 logits: dummy:tiny's head at one row 10.3 ms of reads, the screen a quarter of them);
    tests/models/test_greedy_head.py then checks its answers here."""
    from hintkv.models.greedy_head import GreedyHead

    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    if "avx2" not in flags:
        pytest.skip("no AVX2 here")
    assert GreedyHead(torch.zeros(2, 64)).applies()
