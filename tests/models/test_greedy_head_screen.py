"""greedy_head's screen itself (review of c2689c6): tokens are always < V and never read a padding row, a bound
past float's range falls back to the logits, padding lanes do not raise lo (all-negative logits), every x-row
group size 1..12 (one compiled instance each) gives the float64 argmax, many random heads do, and the screen
screens: only a few rows are recomputed in float. Past 12 rows (the VNNI build's max_rows()) x is screened in groups
of 12: each group's bound must use its own rows' |x|_1 and |x - x~|_1 (test_greedy_head_groups.py)."""

from __future__ import annotations

import pytest
import torch

from hintkv.models import greedy_head
from hintkv.models.greedy_head import GreedyHead

pytestmark = pytest.mark.skipif(not GreedyHead(torch.zeros(2, 64)).applies(),
                                reason="no C++ kernels or neither AVX-512 VNNI nor AVX2: greedy rows use the logits")


def exact(x: torch.Tensor, w: torch.Tensor) -> list[int]:
    return (x.double() @ w.double().T).argmax(-1).tolist()


def test_a_bound_past_floats_range_never_takes_a_padding_row():
    """|x|_1 = 6.4e38 fits a double, not a float: the bound is inf and lo -inf. The blocked screen then took the
    padding rows [300, 304) as candidates and read them from the memory after w (here: rows of -1, which win):
    it returned 300. The logits are finite; the screen must give their argmax or None (the logits)."""
    big = torch.randn(316, 64, generator=torch.Generator().manual_seed(0)) * 0.02
    big[300:] = -1
    w = big[:300]  # a contiguous view: what follows it is big's rows of -1
    x = torch.full((1, 64), -1e37)
    assert torch.isfinite(x @ w.T).all()
    got = GreedyHead(w)(x)
    assert got is None or got == (x @ w.T).argmax(-1).tolist()
    for s in (-1e36, 1e35):  # large but finite bounds: screened, tokens < V
        x = torch.full((2, 64), s)
        x[1, ::2] *= -1
        got = GreedyHead(w)(x)
        assert got is None or got == exact(x, w)


def test_all_negative_logits_with_a_partial_last_block():
    """V % 16 != 0 and every logit < 0: padding lanes (a = 0, b = 0) folded into lo would put lo at 0, above
    every real row's bound, and leave no candidate."""
    gen = torch.Generator().manual_seed(4)
    w = torch.rand(3001, 80, generator=gen) + 0.01
    x = -torch.rand(4, 80, generator=gen)
    assert (x @ w.T).max() < 0
    assert GreedyHead(w)(x) == exact(x, w)


@pytest.mark.parametrize("n", range(1, 13))
def test_every_row_group_size(n):
    """screen_all<G> is compiled once per G = 1..12: each must give the float64 argmax. V = 3001: a partial
    last block, and more than 64 blocks, so several threads' lo are merged."""
    gen = torch.Generator().manual_seed(100 + n)
    w = torch.randn(3001, 200, generator=gen) * 0.05
    x = torch.randn(n, 200, generator=gen)
    assert GreedyHead(w)(x) == exact(x, w)


def test_many_random_heads_give_the_float64_argmax():
    gen = torch.Generator().manual_seed(7)
    wrong = []
    for trial in range(60):
        v = int(torch.randint(1, 5000, (1,), generator=gen))
        h = [1, 17, 64, 80, 200, 512][trial % 6]
        n = int(torch.randint(1, 13, (1,), generator=gen))
        w = torch.randn(v, h, generator=gen) * float(torch.rand(1, generator=gen)) + 0.1 * (trial % 3 - 1)
        x = torch.randn(n, h, generator=gen) * 10 ** float(torch.randint(-2, 3, (1,), generator=gen))
        got = GreedyHead(w)(x)
        if got != exact(x, w):
            wrong.append((trial, v, h, n, got, exact(x, w)))
    assert wrong == []


def test_the_screen_recomputes_few_rows():
    """The point of the screen: on a head like a model's (rows of one scale, x a hidden state) only the rows
    near the top are recomputed in float (an unmerged lo recomputes all of them)."""
    gen = torch.Generator().manual_seed(11)
    v, h = 8192, 256
    w = torch.randn(v, h, generator=gen) * 0.05
    x = torch.randn(8, h, generator=gen)
    assert GreedyHead(w)(x) == exact(x, w)
    rows = greedy_head.ops().last_recomputed()
    assert 8 <= rows < 0.01 * v * 8, rows


def test_x_and_the_copy_at_their_extremes():
    """Every x value at +-max|x| (quantised to the largest level) against rows whose every int8 value is +-127: the
    AVX2 screen's int16 pair sums are then at their largest (2 x 128 x 127 with x in 7 bits, u8 = xq + 64). With x in 8
    bits on that loop (u8 up to 255) they saturate, the top rows' approximate logits fall by half and drop out."""
    gen = torch.Generator().manual_seed(13)
    w = torch.randn(4099, 256, generator=gen) * 0.01
    w[5], w[6] = 0.05, -0.05
    w[7, ::2], w[7, 1::2] = -0.05, 0.05
    x = torch.ones(4, 256)
    x[1] *= -1
    x[2, ::2] = -1
    x[3, 1::2] = -1
    assert exact(x, w)[:3] == [5, 6, 7]
    assert GreedyHead(w)(x) == exact(x, w)


@pytest.mark.skipif(not GreedyHead(torch.zeros(2, 64)).applies() or greedy_head.ops().isa() != "avx2",
                    reason="the Euclidean bound is the AVX2 screen's")
def test_the_euclidean_bound_recomputes_fewer_rows():
    """The AVX2 screen's bound is the smaller of |x|_1 err_r + |x - x~|_1 127 s_r and |x|_2 |w - w~|_2 + |x - x~|_2
    |w~|_2: on a head like a model's the second is ~3x tighter, which pays for x's 7 bits. Here the first alone
    (with 8-bit x: the VNNI screen) recomputes 272 rows; the smaller of the two, 139."""
    gen = torch.Generator().manual_seed(11)
    v, h = 8192, 256
    w = torch.randn(v, h, generator=gen) * 0.05
    x = torch.randn(8, h, generator=gen)
    assert GreedyHead(w)(x) == exact(x, w)
    assert 8 <= greedy_head.ops().last_recomputed() < 200


@pytest.mark.skipif(not GreedyHead(torch.zeros(2, 64)).applies() or greedy_head.ops().isa() != "vnni",
                    reason="the native build is already the AVX2 one, which the tests above run")
def test_the_avx2_build_and_the_vnni_one_give_the_same_tokens():
    """A VNNI machine never builds the AVX2 screen (CPUs without VNNI, e.g. AMD Zen 1 and 3): build it here without
    AVX-512. Both read the same blocked copy; the AVX2 one quantises x to 7 bits and bounds by the smaller of two
    bounds, so they may recompute different rows, never give different tokens."""
    from hintkv.models import cpu_ext

    avx2 = cpu_ext.load("hintkv_greedy_head_novnni", greedy_head._SOURCE,
                        ["screened_argmax", "has_screen", "blocked", "isa", "last_recomputed"],
                        greedy_head._CFLAGS + ["-mno-avx512f"])
    assert avx2 is not None and avx2.has_screen() and avx2.blocked() and avx2.isa() == "avx2"
    native = greedy_head.ops()
    gen = torch.Generator().manual_seed(12)
    for v, h, n in [(3001, 200, 8), (4099, 80, 1), (17, 64, 12), (1, 1, 3), (5000, 512, 5)]:
        w = torch.randn(v, h, generator=gen) * 0.05
        x = torch.randn(n, h, generator=gen) * 3
        copy = greedy_head.quantise_rows(w, blocked=True)
        rows = avx2.screened_argmax(x, *copy, w)
        rows_count = avx2.last_recomputed()
        blocks = native.screened_argmax(x, *copy, w)
        assert rows == blocks == exact(x, w), (v, h, n)
        assert 0 < rows_count and 0 < native.last_recomputed(), (v, h, n)


def test_one_thread_and_two_give_the_same_tokens_and_recompute_the_same_rows():
    """Pass 1 splits the blocks over threads and merges each x row's lo; pass 2 splits x rows. Ragged shapes: V not a
    multiple of 16 nor of a thread's 64-block chunk, H not a multiple of 64 (the copy's zero padding), 1-12 x rows
    (every pass shape: 4-row passes and a 1-3-row rest)."""
    gen = torch.Generator().manual_seed(21)
    threads = torch.get_num_threads()
    try:
        for v, h, n in [(4099, 80, 1), (3001, 200, 7), (2063, 17, 12), (5000, 512, 8), (33, 64, 6)]:
            w = torch.randn(v, h, generator=gen) * 0.05
            x = torch.randn(n, h, generator=gen)
            copy = greedy_head.quantise_rows(w, blocked=greedy_head.ops().blocked())
            got = []
            for t in (1, 2):
                torch.set_num_threads(t)
                got.append((greedy_head.ops().screened_argmax(x, *copy, w), greedy_head.ops().last_recomputed()))
            assert got[0] == got[1], (v, h, n)
            assert got[0][0] == exact(x, w), (v, h, n)
    finally:
        torch.set_num_threads(threads)
