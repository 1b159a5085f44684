"""`packed_gemm` (csrc/packed_gemm.cpp), the `packed` linear kernel's GEMM: y = x W^T (+ b) on the weight packed in
16-column panels, against a float64 matmul over ragged shapes (M, N, K off the 6 x 16 tile and the 256-deep K block),
the same bits at one thread, two and three, bad operands refused. (The real SmolLM2 on the `packed` kernel decodes the same
greedy tokens as every GEMM through F.linear: tests/models/test_linear_kernels.py.)

Tolerance (stated): |y - y64| <= 1e-6 K^0.5 (|x| |W|^T) + 1e-6 per value. Each y value is one float32 FMA chain per
256-deep K block, the blocks added in order: a few float32 roundings (6e-8 each) of its K terms, which a random-sign
sum grows as K^0.5; a dropped or doubled product is far outside it (`test_a_wrong_product_is_caught`). Inputs are
seeded, so a pass does not depend on chance."""

from __future__ import annotations

import pytest
import torch

from hintkv.models import packed_gemm
from hintkv.models.linear import Linear, PackedKernel

pytestmark = pytest.mark.skipif(packed_gemm.ops() is None, reason="no C++ build of packed_gemm here")

SHAPES = [  # (M, N, K): one row, tile edges and one past them, a K block and one past it, several K blocks
    (1, 1, 1), (1, 17, 5), (5, 16, 7), (6, 15, 256), (7, 33, 257), (13, 40, 300), (145, 31, 511), (300, 100, 600),
    (12, 768, 512), (131, 770, 513)]


def _operands(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g)


def _assert_within_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    bound = 1e-6 * (x.double().abs() @ w.double().abs().T) * x.shape[1] ** 0.5 + 1e-6
    err = (y.double() - ref).abs()
    assert y.dtype == torch.float32 and y.shape == ref.shape
    assert bool((err <= bound).all()), f"max error {float(err.max()):.3g}, at its bound {float(bound.flatten()[err.argmax()]):.3g}"


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_matches_float64_over_ragged_shapes(m, n, k, bias):
    x, w, b = _operands(m, n, k, seed=m * 7 + n * 3 + k)
    packed = packed_gemm.pack(w)
    assert packed.shape == ((n + 15) // 16, k, 16)
    y = packed_gemm.gemm(x, packed, n, b if bias else None)
    _assert_within_bound(y, x, w, b if bias else None)


def test_a_wrong_product_is_caught():
    """The bound is tight enough to fail a kernel that drops one K product (a sanity check of the test itself)."""
    x, w, _ = _operands(7, 33, 257)
    y = packed_gemm.gemm(x, packed_gemm.pack(w), 33, None)
    y_missing = y - x[:, 256:257] @ w[:, 256:257].T
    with pytest.raises(AssertionError, match="max error"):
        _assert_within_bound(y_missing, x, w, None)


def test_packed_columns_past_n_are_zero_and_x_may_be_a_view():
    x, w, _ = _operands(20, 17, 40)
    packed = packed_gemm.pack(w)
    assert bool((packed[1, :, 1:] == 0).all())  # columns 17..31 of the last panel
    wide = torch.randn(20, 80)
    wide[:, 10:50] = x
    y = packed_gemm.gemm(wide[:, 10:50], packed, 17, None)  # not contiguous: copied, not misread
    _assert_within_bound(y, x, w, None)


# one row block, three (x packed once, shared by row block x panel group units), nine (a row block a unit), three of
# an x past SHARED_X_MAX (2^21 floats: a row block a unit)
@pytest.mark.parametrize(("m", "k"), [(128, 700), (301, 700), (1200, 700), (300, 7200)])
def test_any_thread_count_gives_the_same_bits(m, k):
    """The team takes the work in units (row blocks, or row blocks x panel groups) as it gets to them, and each y
    value's sum runs in the same order in any unit: one thread, two and three give the same bits, call after call."""
    x, w, b = _operands(m, 200, k, seed=m)
    packed = packed_gemm.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = packed_gemm.gemm(x, packed, 200, b)
        for threads in (2, 3):
            torch.set_num_threads(threads)
            for _ in range(3):
                assert torch.equal(packed_gemm.gemm(x, packed, 200, b), one)
    finally:
        torch.set_num_threads(before)
    _assert_within_bound(one, x, w, b)


def test_empty_operands():
    x, w, b = _operands(0, 16, 8)
    assert packed_gemm.gemm(x, packed_gemm.pack(w), 16, b).shape == (0, 16)
    x, w, b = _operands(3, 5, 0)
    torch.testing.assert_close(packed_gemm.gemm(x, packed_gemm.pack(w), 5, b), b.expand(3, 5))


def test_mismatched_operands_are_refused():
    x, w, b = _operands(4, 20, 32)
    packed = packed_gemm.pack(w)
    with pytest.raises(RuntimeError, match="packed must be pack_weight"):
        packed_gemm.gemm(torch.randn(4, 31), packed, 20, None)  # K differs
    with pytest.raises(RuntimeError, match="packed must be pack_weight"):
        packed_gemm.gemm(x, packed, 40, None)  # n past the panels
    with pytest.raises(RuntimeError, match="b must be float32"):
        packed_gemm.gemm(x, packed, 20, b[:5])
    assert packed_gemm.gemm(x.double(), packed, 20, None) is None  # not its case: the caller runs another kernel


def test_an_avx2_cpu_builds_the_vector_kernel():
    from hintkv.models.cpu_ext import cpu_flags

    flags = set(cpu_flags().split())
    if not {"avx2", "fma"} <= flags:
        pytest.skip("no AVX2 + FMA on this CPU")
    assert packed_gemm.ops().gemm_isa() == "avx2"


def test_the_packed_kernel_packs_once_and_follows_a_weight_write():
    lin = Linear(40, 24, True, torch.float32, "cpu")
    with torch.no_grad():
        lin.weight.copy_(torch.randn(24, 40) * 0.1)
        lin.bias.copy_(torch.randn(24))
    lin.set_kernel("packed")
    packs = PackedKernel.num_packs
    lin.kernel.warm()
    x = torch.randn(30, 40)  # past gemv's 12 rows: the packed GEMM
    lin(x)
    lin(x)
    assert PackedKernel.num_packs == packs + 1
    with torch.no_grad():
        lin.weight.mul_(2)  # bumps the version: re-prepared, packed again
    _assert_within_bound(lin(x), x, lin.weight, lin.bias)
    assert PackedKernel.num_packs == packs + 2

