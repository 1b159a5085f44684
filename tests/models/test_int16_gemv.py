"""The int16 few-row kernel (`csrc/int16_gemv.cpp`, `int8.gemv_kernel()` "i16"): exact integer sums, the 14-bit
quantize and rescale bit for bit, any thread count the same bits."""

from __future__ import annotations

import pytest
import torch

from hintkv.models import int8, int8_cpu
from hintkv.models.int8 import block_weight, quantize_weight

CHUNK = 2048  # k values summed in int32 before the kernel adds the chunk into float (int16_gemv.cpp's kPairChunk x 2)


@pytest.fixture(scope="module")
def fused():
    ops = int8_cpu.ops()
    if ops is None:
        pytest.skip("int8_cpu's extension cannot be built here")
    return ops


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(-127, 128, (n, k), generator=torch.Generator().manual_seed(seed), dtype=torch.int8)


def test_block_weight_depth_2_lays_out_k_pairs_of_16_channels():
    """[ceil(N/16), ceil(K/2), 16, 2]: block b, pair p, channel j, t holds w[16 b + j, 2 p + t], zero padded."""
    w = _weight(20, 7, seed=1)
    wb, comp = block_weight(w.t(), depth=2)
    assert wb.shape == (2, 4, 16, 2) and comp.shape == (20,) and not comp.any()
    for n, k in ((0, 0), (5, 6), (19, 3), (16, 1)):
        assert wb[n // 16, k // 2, n % 16, k % 2] == w[n, k]
    assert not wb[1, :, 4:].any() and not wb[:, 3, :, 1].any()  # channels 20-31 and k 7 are padding
    with pytest.raises(ValueError, match="depth"):
        block_weight(w.t(), depth=3)


@pytest.mark.parametrize("k", [1, 90, 577, CHUNK, CHUNK + 3, 2 * CHUNK + 100])
def test_pair_sums_are_the_integer_matmul(fused, k):
    """Every row count of a few-row step (1-16: the two-block passes at 1-2 rows, 4 / 2 / 1-row passes above), K odd,
    past one int32 chunk, and the extreme values: at K = 2 x 2048 + 100 the all-max sum (8191 x 127 x K) overflows
    int32, so a missing flush fails it."""
    n = 40  # 2.5 blocks: a two-block pass, then one block alone, its last 8 channels padding
    w = _weight(n, k, seed=k)
    wb, _ = block_weight(w.t(), depth=2)
    g = torch.Generator().manual_seed(k + 1)
    for rows in range(1, 17):
        q = torch.randint(-8191, 8192, (rows, k), generator=g, dtype=torch.int16)
        q[0] = 8191  # the extreme row against the extreme channel
        w_row = w.clone()
        w_row[0] = 127
        wb_ext, _ = block_weight(w_row.t(), depth=2)
        for weight, blocked in ((w, wb), (w_row, wb_ext)):
            got = fused.pair_dots(q, blocked, n)
            assert torch.equal(got, q.long() @ weight.t().long()), (k, rows)
    assert int(fused.pair_dots(torch.full((1, k), 8191, dtype=torch.int16), wb_ext, n)[0, 0]) == 8191 * 127 * k


def _quantize14(x: torch.Tensor, inv_smooth: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's quantize in torch's float32 ops, same order: r = x * inv_smooth, s = max|r| / 8191, round half
    to even of r * (1 / s)."""
    r = x if inv_smooth is None else x * inv_smooth
    s = r.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 8191.0
    return torch.round(r * (1.0 / s)).long(), s


@pytest.mark.parametrize("k,n", [(90, 100), (576, 960), (CHUNK + 50, 48)])
def test_gemv_on_a_depth_2_weight_is_the_quantized_product_bit_for_bit(fused, k, n):
    """gemv on `block_weight(w_t, depth=2)` (levels 1): each row quantized once to 14 bits, then y = (sum over
    2048-k chunks of float(int32 chunk sum)) * s_row * w_scale, in that order; K past one chunk adds in float."""
    g = torch.Generator().manual_seed(n)
    inv = torch.rand(k, generator=g) + 0.5
    w_t, w_scale = quantize_weight(torch.randn(n, k, generator=g), 1.0 / inv)
    wb, comp = block_weight(w_t, depth=2)
    for rows in (1, 2, 3, 8, 16):
        x = torch.randn(rows, k, generator=g) * torch.linspace(0.1, 10.0, k)  # uneven channels
        got = fused.gemv(x, inv, wb, w_scale, comp, 1, False)
        q, s = _quantize14(x, inv)
        assert int(q.abs().max()) == 8191
        total = torch.zeros(rows, n)
        for k0 in range(0, k, CHUNK):
            total = total + (q[:, k0:k0 + CHUNK] @ w_t[k0:k0 + CHUNK].long()).float()
        assert torch.equal(got, total * s * w_scale), (k, n, rows)
        with pytest.raises(RuntimeError, match="levels = 1"):
            fused.gemv(x, inv, wb, w_scale, comp, 2, False)


def test_gemv_on_a_depth_2_weight_gives_the_same_bits_on_1_and_2_threads(fused):
    """The blocks split over threads in whole two-block pairs, and each block's sums do not depend on the split."""
    g = torch.Generator().manual_seed(7)
    w_t, w_scale = quantize_weight(torch.randn(3072 + 16 * 3 + 5, 576, generator=g))
    wb, comp = block_weight(w_t, depth=2)
    before = torch.get_num_threads()
    try:
        for rows in (1, 2, 8, 16):
            x = torch.randn(rows, 576, generator=g)
            torch.set_num_threads(1)
            one = fused.gemv(x, torch.empty(0), wb, w_scale, comp, 1, False)
            torch.set_num_threads(2)
            two = fused.gemv(x, torch.empty(0), wb, w_scale, comp, 1, False)
            assert torch.equal(one, two), rows
    finally:
        torch.set_num_threads(before)


def test_the_layers_take_the_int16_kernel_on_avx2_without_vnni(fused, monkeypatch):
    """auto: "i16" where gemv's loop is AVX2 (no VNNI), "i8" elsewhere; a w8a8 layer then blocks its weight with depth
    2 and runs one row a token, up to GEMV_ROWS tokens, while the head keeps the int8 loop's blocks."""
    from hintkv.models.linear import W8A8HeadKernel, W8A8Kernel

    monkeypatch.delenv("HINTKV_INT8_GEMV", raising=False)
    int8.gemv_kernel.cache_clear()
    try:
        want = "i16" if fused.has_fast_gemv() and fused.gemv_isa() == "avx2" else "i8"
        assert int8.gemv_kernel() == want
        monkeypatch.setenv("HINTKV_INT8_GEMV", "i16")
        int8.gemv_kernel.cache_clear()
        w = torch.randn(64, 96)
        layer, head = W8A8Kernel(w, None), W8A8HeadKernel(w, None)
        assert layer.blocked[0].shape[-1] == 2 and layer.gemv_levels == 1
        assert head.blocked[0].shape[-1] == 4 and head.gemv_levels == 1
        x = torch.randn(int8.GEMV_ROWS, 96)
        ref = x @ w.t()
        assert float((layer(x) - ref).norm() / ref.norm()) < 0.01  # int8 weights' error (~0.5%), 14-bit rows
        monkeypatch.setenv("HINTKV_INT8_GEMV", "i32")
        int8.gemv_kernel.cache_clear()
        with pytest.raises(ValueError, match="HINTKV_INT8_GEMV"):
            int8.gemv_kernel()
    finally:
        int8.gemv_kernel.cache_clear()
