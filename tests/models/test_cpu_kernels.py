"""cpu_kernels (C++): the paged attention kernel against a dense reference and against attention.py's
PyTorch paths, the fused RMSNorm / RoPE / SiLU-mul against compile.py's eager functions, and the
greedy tokens of dummy:tiny with the kernels on and off.

Tolerances: float32 throughout; the kernel sums scores and outputs in another order than SDPA and
uses a polynomial exp (relative error ~2e-7), so outputs agree to atol 2e-5 (values O(1)); the fused
norm / RoPE / SiLU-mul to rtol 1e-5; the greedy tokens exactly.
"""

from __future__ import annotations

import pytest
import torch
from paged_case import PagedCase, dense_reference

from hintkv.models import cpu_ext, cpu_kernels
from hintkv.models.compile import Regions, add_rmsnorm_, rope_, silu_mul

pytestmark = pytest.mark.skipif(cpu_kernels.ops() is None,
                                reason="no C++ build: the PyTorch paths run (tests/test_ci_prebuild.py says why)")


STEPS = [
    [(70, 70)],                          # cold prefill, several query tiles, a partial key tile
    [(40, 130), (3, 3)],                 # prefill over a cached prefix + a tiny cold one
    [(1, 1), (1, 33), (1, 200), (1, 64)],  # decodes of mixed lengths (the untransposed path)
    [(5, 90), (2, 7), (4, 41)],          # speculative verifies
    [(1, 50), (30, 95), (6, 6)],         # a mixed step: decode, prefix prefill, cold prefill
]


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("hq,hkv,d,bs", [(8, 2, 64, 16), (6, 2, 32, 4), (3, 3, 16, 8), (4, 1, 128, 16)])
def test_kernel_matches_dense_reference_and_the_torch_path(monkeypatch, steps, hq, hkv, d, bs):
    nblocks = sum(-(-c // bs) for _, c in steps) + 3
    case = PagedCase.build(steps, seed=1, d=d, hq=hq, hkv=hkv, bs=bs, nblocks=nblocks)
    caches = [torch.zeros(2, nblocks, bs, hkv, d) for _ in range(2)]
    for c in caches:
        case.fill(c)
    got = case.attend(caches[0])  # the kernel (float32 on a CPU)
    monkeypatch.setenv("HINTKV_CPU_KERNELS", "0")
    assert cpu_kernels.attention(torch.cat(case.qs), None, None, caches[1], case.metadata(), 0.1) is None
    torch_path = case.attend(caches[1])
    assert torch.equal(caches[0], caches[1])  # both wrote the same K/V
    torch.testing.assert_close(got, torch_path, atol=2e-5, rtol=0)
    qsl = case.qsl
    for i, _ in enumerate(steps):
        ref = dense_reference(case.qs[i], case.full_k[i], case.full_v[i], d ** -0.5, torch.float64)
        torch.testing.assert_close(got[qsl[i]:qsl[i + 1]], ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("steps", [[(300, 400)], [(200, 300), (7, 7)], [(1, 120)] * 8])
@pytest.mark.parametrize("hq,hkv,d,bs", [(8, 2, 64, 16), (6, 2, 32, 4)])
def test_kernel_gives_the_same_bits_on_one_thread_and_two(steps, hq, hkv, d, bs):
    """Above SERIAL_MACS (a 300-token prefill over 100 cached) the work items are split over the
    threads (taken dynamically, costliest first), below it (a decode batch) the calling thread runs
    them all: items are independent, so the output is bitwise the same either way and equal to the
    reference — also for 3 query heads per KV head with partial query tiles and a tiny second
    sequence (the odd shapes of the test above stay under SERIAL_MACS, so they run serially there)."""
    nblocks = sum(-(-c // bs) for _, c in steps) + 3
    case = PagedCase.build(steps, seed=4, d=d, hq=hq, hkv=hkv, bs=bs, nblocks=nblocks)
    cache = torch.zeros(2, nblocks, bs, hkv, d)
    case.fill(cache)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = case.attend(cache)
        torch.set_num_threads(1)
        one = case.attend(cache)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    for i, _ in enumerate(steps):
        ref = dense_reference(case.qs[i], case.full_k[i], case.full_v[i], d ** -0.5, torch.float64)
        torch.testing.assert_close(two[case.qsl[i]:case.qsl[i + 1]], ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_follows_a_maximum_that_rises_in_later_key_tiles(threads):
    """The online softmax rescales a row's output and sum when a later key tile holds a larger score: in a tile the
    row sees whole (scored and softmaxed in one pass, csrc/cpu_attention_tiles.cpp's score_softmax_tile) and in the
    diagonal tile (some keys hidden). Keys 64-95 (cached, whole to every query) and 150-157 (new, on the diagonal)
    are scaled up so their scores dominate late; scores of one row then span ~100, so exp underflows for the rest."""
    case = PagedCase.build([(48, 160), (20, 20)], seed=7, d=64, hq=8, hkv=2, bs=16, nblocks=16)
    with torch.no_grad():
        case.full_k[0][64:96] *= 6.0
        case.full_k[0][150:158] *= 9.0
    cache = torch.zeros(2, 16, 16, 2, 64)
    case.fill(cache)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = case.attend(cache)
    finally:
        torch.set_num_threads(saved)
    for i, _ in enumerate(case.steps):
        ref = dense_reference(case.qs[i], case.full_k[i], case.full_v[i], 64 ** -0.5, torch.float64)
        torch.testing.assert_close(got[case.qsl[i]:case.qsl[i + 1]], ref, atol=2e-5, rtol=0)


def test_kernel_on_the_cached_step_shape(monkeypatch):
    """The bench's cached step (#11): 128 new tokens over 2,048 (1,920 cached), 8 / 2 heads, D 64, blocks of 16 in
    shuffled order, plus a length-1 context, q and k / v as strided views of one qkv buffer, as the model passes them.
    On AVX2 the GQA group's query tiles take 15 tokens (60 rows: whole 6-row blocks) and the last one 8 (32 rows:
    12 + 12 + 6 + 1 + 1); in the third tile (tokens 30-44, keys up to 1,964) tokens 30 and 31 see none of the last
    key tile's keys (1,952-1,964); the fused softmax runs in log2 units with exp2_8. Held to float64 and to the
    PyTorch path (SDPA) at atol 2e-5, one thread equal to two."""
    steps = [(128, 2048), (1, 1)]
    nblocks = sum(-(-c // 16) for _, c in steps) + 3
    case = PagedCase.build(steps, seed=11, d=64, hq=8, hkv=2, bs=16, nblocks=nblocks)
    caches = [torch.zeros(2, nblocks, 16, 2, 64) for _ in range(2)]
    for c in caches:
        case.fill(c)
    qkv = torch.cat([torch.cat(case.qs), torch.cat(case.ks), torch.cat(case.vs)], dim=1)  # [T, 8 + 2 + 2, 64]
    meta, threads = case.metadata(), torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = cpu_kernels.attention(qkv[:, :8], qkv[:, 8:10], qkv[:, 10:], caches[0], meta, 0.125)
        torch.set_num_threads(1)
        one = cpu_kernels.attention(qkv[:, :8], None, None, caches[0], meta, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    monkeypatch.setenv("HINTKV_CPU_KERNELS", "0")
    torch_path = case.attend(caches[1])
    assert torch.equal(caches[0], caches[1])
    torch.testing.assert_close(two, torch_path, atol=2e-5, rtol=0)
    for i, _ in enumerate(steps):
        ref = dense_reference(case.qs[i], case.full_k[i], case.full_v[i], 0.125, torch.float64)
        torch.testing.assert_close(two[case.qsl[i]:case.qsl[i + 1]], ref, atol=2e-5, rtol=0)


@pytest.mark.skipif(not cpu_kernels.enabled(), reason="HINTKV_CPU_KERNELS=0: greedy rows use torch")
def test_argmax_is_torchs():
    """Greedy sampling's argmax: the first maximum, a NaN counts as the maximum (torch's rule), -0.0 ties
    0.0, rows of any length (a vector body and a scalar tail) and strided rows; other cases: None."""
    gen = torch.Generator().manual_seed(5)
    for n, v in ((1, 49152), (8, 49152), (3, 17), (2, 5), (4, 1)):
        x = torch.randn(n, v, generator=gen)
        assert cpu_kernels.argmax(x) == x.argmax(-1).tolist()
    x = torch.zeros(7, 100)
    x[0, 50] = x[0, 80] = 1.0              # a tie: the first
    x[1, 70] = x[1, 90] = float("nan")     # NaNs beat everything: the first NaN
    x[2, 5] = float("inf")
    x[3] = -float("inf")                   # every value -inf: index 0
    x[4, 99] = float("nan")                # a NaN in the scalar tail
    x[5] = -0.0
    x[5, 20] = 0.0                         # -0.0 == 0.0: index 0
    x[6, 3] = float("nan")
    x[6, 40] = float("inf")
    assert cpu_kernels.argmax(x) == x.argmax(-1).tolist() == [50, 70, 5, 0, 99, 0, 3]
    wide = torch.randn(3, 130, generator=gen)
    assert cpu_kernels.argmax(wide[:, 7:107]) == wide[:, 7:107].argmax(-1).tolist()  # rows at stride 130
    assert cpu_kernels.argmax(torch.randn(2, 10).double()) is None
    assert cpu_kernels.argmax(torch.randn(10)) is None


def test_kernel_reads_a_strided_query_and_leaves_other_cases_to_torch():
    """q as the model passes it (a view into the fused qkv rows); bf16 or head_dim % 16 != 0: None."""
    case = PagedCase.build([(9, 20), (1, 5)], seed=2, d=16, hq=4, hkv=2, bs=4, nblocks=10)
    cache = torch.zeros(2, 10, 4, 2, 16)
    case.fill(cache)
    q = torch.cat(case.qs)
    qkv = torch.cat([q, torch.randn(q.shape[0], 4, 16)], dim=1)  # [T, Hq + 4, D]
    meta = case.metadata()
    k, v = torch.cat(case.ks), torch.cat(case.vs)
    kv_rows = torch.cat([k, v], dim=1)  # [T, 2 Hkv, D]: k and v as strided views, as the model passes them
    strided = cpu_kernels.attention(qkv[:, :4], kv_rows[:, :2], kv_rows[:, 2:], cache, meta, 0.25)
    again = cache.clone()
    torch.testing.assert_close(strided, cpu_kernels.attention(q.contiguous(), None, None, cache, meta, 0.25),
                               atol=0, rtol=0)
    assert torch.equal(cache, again)
    assert cpu_kernels.attention(q.bfloat16(), None, None, cache.bfloat16(), meta, 0.25) is None
    odd = PagedCase.build([(3, 3)], seed=2, d=8, hq=4, hkv=2, bs=4, nblocks=2)
    assert cpu_kernels.attention(torch.cat(odd.qs), None, None, torch.zeros(2, 2, 4, 2, 8), odd.metadata(), 0.3) is None


def test_kernel_rejects_inconsistent_metadata():
    case = PagedCase.build([(4, 9)], seed=3, d=16, hq=2, hkv=1, bs=4, nblocks=4)
    cache = torch.zeros(2, 4, 4, 1, 16)
    q, none = torch.cat(case.qs), torch.empty(0)
    with pytest.raises(RuntimeError, match="bad lengths"):
        cpu_kernels.ops().attention(q, none, none, none, cache, [case.tables[0][:1]], [0, 4], [9], 0.25)  # short table
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_kernels.ops().attention(q, none, none, none, cache, [torch.tensor([0, 1, 7])], [0, 4], [9], 0.25)
    with pytest.raises(RuntimeError, match="slot out of range"):
        k = torch.zeros(4, 1, 16)
        cpu_kernels.ops().attention(q, k, k, torch.tensor([0, 1, 2, 99]), cache, case.tables, [0, 4], [9], 0.25)
    # a head_dim off the vector width: the fused softmax's row rescale would write past each row (review_rev24 A5)
    case = PagedCase.build([(4, 9)], seed=3, d=12, hq=2, hkv=1, bs=4, nblocks=4)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        cpu_kernels.ops().attention(torch.cat(case.qs), none, none, none, torch.zeros(2, 4, 4, 1, 12), case.tables,
                                    [0, 4], [9], 12 ** -0.5)


@pytest.mark.parametrize("t", [1, 5, 37])
def test_fused_regions_match_the_eager_functions(t):
    gen = torch.Generator().manual_seed(t)
    fused = cpu_kernels.regions()
    x, res, w = torch.randn(t, 96, generator=gen), torch.randn(t, 96, generator=gen), torch.randn(96, generator=gen)
    for residual in (None, res):
        r_eager = None if residual is None else residual.clone()
        r_fused = None if residual is None else residual.clone()
        out_e, new_e = add_rmsnorm_(x.clone(), r_eager, w, 1e-5)
        out_f, new_f = fused.add_rmsnorm(x.clone(), r_fused, w, 1e-5)
        torch.testing.assert_close(out_f, out_e, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(new_f, new_e, rtol=0, atol=0)
        if residual is not None:
            assert new_f.data_ptr() == r_fused.data_ptr()  # the residual stream is updated in place
        wide = torch.cat([x, x], dim=1)[:, :96]  # rows at a stride (a W8A8 GEMM's output view)
        out_w, _ = fused.add_rmsnorm(wide, None if residual is None else residual.clone(), w, 1e-5)
        torch.testing.assert_close(out_w, add_rmsnorm_(x.clone(), None if residual is None else residual.clone(),
                                                       w, 1e-5)[0], rtol=1e-5, atol=1e-6)
    hq, hkv, d = 6, 2, 32
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen)
    cos, sin = torch.randn(t, 1, d // 2, generator=gen), torch.randn(t, 1, d // 2, generator=gen)
    e, f = rope_(qkv.clone(), cos, sin, hq, hkv, d), fused.rope(qkv.clone(), cos, sin, hq, hkv, d)
    for a, b in zip(e, f, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    gu = torch.randn(t, 2 * 200, generator=gen) * 6
    torch.testing.assert_close(fused.silu_mul(gu), silu_mul(gu), rtol=1e-5, atol=1e-6)


def test_the_build_takes_this_cpus_vector_paths():
    """A CPU with AVX2 + FMA and no AVX-512 (this project's AMD EPYCs) runs the 8-wide paths, not the plain
    loops the compiler vectorised: with those a dummy:tiny layer's attention took 2.4x, SiLU-mul 2.3-3.4x the
    CPU time (csrc/cpu_kernels.cpp's header)."""
    flags = set(cpu_ext.cpu_flags().split())
    want = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "scalar"
    assert cpu_kernels.ops().simd() == want


@pytest.mark.parametrize("rows,keys,d", [(3, 32, 64), (16, 17, 128), (1, 5, 64), (7, 30, 16), (4, 8, 256),
                                           (2, 1, 64)])
def test_direct_scores_add_each_rows_products_in_order(rows, keys, d):
    """A few-row item's scores (decodes: csrc/cpu_attention_tiles.cpp's score_direct, whose AVX2 path runs the
    keys in lanes) are each (row, key)'s rounded products q[i] k[i] added in order i = 0, 1, ... from 0, as the
    plain loop adds them: the vector path changes no bit of a decode's attention. AVX-512 sums in 16 lanes."""
    if cpu_kernels.ops().simd() == "avx512":
        pytest.skip("the AVX-512 path sums each score in 16 lanes (another order)")
    g = torch.Generator().manual_seed(rows * 1000 + keys * 10 + d)
    q, k = torch.randn(rows, d, generator=g), torch.randn(keys, d, generator=g)
    ref = torch.zeros(rows, keys)
    for i in range(d):
        ref = ref + q[:, i:i + 1] * k[:, i]
    assert torch.equal(cpu_kernels.ops().direct_scores(q, k), ref)
    assert not torch.equal(ref, q @ k.T) or d < 32  # the order matters: a matmul's sum differs in some bits


def test_silu_mul_over_the_whole_range_of_exp():
    """The vector exp clamps to [-87.3, 88.3] and builds 2^n in the exponent bits: SiLU-mul stays within
    rtol 1e-5 of eager from -100 to 100 (saturated both ends; an odd width leaves a scalar tail)."""
    g = torch.linspace(-100, 100, 3 * 1333).view(3, 1333)
    gu = torch.cat([g, torch.linspace(-3, 3, 3 * 1333).view(3, 1333)], dim=1)
    torch.testing.assert_close(cpu_kernels.regions().silu_mul(gu), silu_mul(gu), rtol=1e-5, atol=1e-6)


def test_greedy_tokens_are_the_same_with_the_kernels_on_and_off(monkeypatch):
    """dummy:tiny: a 48-token prompt, then 24 greedy decode steps, with the C++ kernels (default on a
    float32 CPU model) and with HINTKV_CPU_KERNELS=0 and eager regions."""
    from hintkv.models.loader import load_model
    from hintkv.models.one_sequence import OneSequence

    model = load_model("dummy:tiny", torch.float32, "cpu", seed=7).model
    assert model.regions.add_rmsnorm.__module__ == "hintkv.models.cpu_kernels"

    def greedy() -> tuple[list[int], torch.Tensor]:
        seq = OneSequence(model, 128)
        logits = seq.step(list(range(300, 348)))
        first = logits.clone()
        out = []
        for _ in range(24):
            out.append(int(logits[-1].argmax()))
            logits = seq.step([out[-1]])
        return out, first

    on, first_on = greedy()
    monkeypatch.setenv("HINTKV_CPU_KERNELS", "0")
    model.regions = Regions()
    off, first_off = greedy()
    assert on == off
    torch.testing.assert_close(first_on, first_off, atol=1e-3, rtol=1e-4)


def test_a_cpu_step_reuses_freed_memory_instead_of_faulting_it_in():
    """host_memory.keep_freed_memory (set by the model runner on a CPU): a repeated 1024-token step of
    dummy:tiny takes (almost) no fresh pages; with glibc's defaults 0.3K-24K per step (its dynamic
    thresholds follow the allocation history)."""
    import resource

    from hintkv.models.host_memory import keep_freed_memory
    from hintkv.models.loader import load_model
    from hintkv.models.one_sequence import OneSequence

    assert keep_freed_memory()
    model = load_model("dummy:tiny", torch.float32, "cpu", seed=7).model
    seqs = [OneSequence(model, 1040) for _ in range(3)]
    faults = []
    for seq in seqs:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seq.hidden(list(range(1024)))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert faults[-1] < 1000, faults
