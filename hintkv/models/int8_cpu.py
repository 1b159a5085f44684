"""W8A8's CPU ops: the per-token quantize, the rescale, and a few-row int8 GEMM (a C++ extension built on first use).

Eager PyTorch spends ~20 operator calls per int8 GEMM around `torch._int_mm` (the smoothing
multiply, two levels of norm / clamp / div / round / residual, the int8 cast, then the int32 ->
float rescale per level): on dummy:tiny's decode step at load 5-7 that was 41 ms of 72 against
31 ms of GEMMs (torch.profiler), more than the int8 GEMMs saved. These functions do the same
arithmetic in one call each, in the same order (x * (1 / smooth), row max / 127, x * (1 / s) rounded
half to even, residual x - q s), so they give the eager path's int8 values:

    quantize_rows(x [M, K] f32, inv_smooth [K] f32 or empty, levels) -> q int8 [levels*M, K], s f32 [levels*M, 1]
    rescale(acc [levels*M, N] i32, s [levels*M, 1] f32, w_scale [N] f32, levels) -> y f32 [M, N]
    gemv(x [M, K] f32, inv_smooth, wb, w_scale [N], w_comp, levels) -> y f32 [M, N]
    has_fast_gemv() -> bool: gemv runs on AVX512-VNNI (else a plain loop: int8.py then keeps _int_mm)

The quantize and the rescale are vectorised (AVX2) and split over rows (at::parallel_for): a
2048 x 512 two-level quantize went from 7 ms (a scalar loop, a division per value) to 0.8 ms on
one thread. `gemv` serves decode and verify steps (a few rows): the weight in 16-channel blocks
(`int8.block_weight`) is read once for all levels x rows, dpbusd fills 16 channels per instruction
with no horizontal sums, the rescale is folded in; `_int_mm` at one row reads the weight once per
level (two calls) and its kernel ran the SmolLM2-sized LM head (49152 x 512) at 1/3 of memory speed.

`ops()` builds them through `cpu_ext.load` (cached; None, after one warning, when it cannot be
built: `int8.py` then runs the eager ops).
"""

from __future__ import annotations

from types import ModuleType

from hintkv.models import cpu_ext

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// One row's `levels` int8 rows: r [K] (smoothed; overwritten by the residual), level l's row at
// q + l * qstride, its scale at s[l * sstride]. x * (1 / s) rounded half to even, then r - v s.
static void quantize_row(float* r, int64_t K, int64_t levels, int8_t* q, int64_t qstride, float* s,
                         int64_t sstride) {
    for (int64_t l = 0; l < levels; ++l) {
        float amax = 0.f;
        int64_t k = 0;
#if defined(__AVX2__)
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 vmax = _mm256_setzero_ps();
        for (; k + 8 <= K; k += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(r + k), absmask));
        float lanes[8];
        _mm256_storeu_ps(lanes, vmax);
        for (float v : lanes) amax = std::max(amax, v);
#endif
        for (; k < K; ++k) amax = std::max(amax, std::fabs(r[k]));
        const float scale = std::max(amax, 1e-30f) / 127.0f;
        const float inv = 1.0f / scale;
        int8_t* qrow = q + l * qstride;
        k = 0;
#if defined(__AVX2__)
        const __m256 vinv = _mm256_set1_ps(inv), vs = _mm256_set1_ps(scale);
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (; k + 32 <= K; k += 32) {
            __m256i i32[4];
            for (int j = 0; j < 4; ++j) {
                const __m256 x = _mm256_loadu_ps(r + k + 8 * j);
                const __m256 v = _mm256_round_ps(_mm256_mul_ps(x, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm256_storeu_ps(r + k + 8 * j, _mm256_sub_ps(x, _mm256_mul_ps(v, vs)));
                i32[j] = _mm256_cvtps_epi32(v);
            }
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(qrow + k), _mm256_permutevar8x32_epi32(p, order));
        }
#endif
        for (; k < K; ++k) {
            const float v = std::nearbyint(r[k] * inv);
            qrow[k] = static_cast<int8_t>(v);
            r[k] = r[k] - v * scale;
        }
        s[l * sstride] = scale;
    }
}

// rows [m0, m1) of x (times inv_smooth) into q [levels*M, K] and s [levels*M]
static void quantize_range(const float* xp, const float* sp, int64_t M, int64_t K, int64_t levels, int8_t* qp,
                           float* op, int64_t m0, int64_t m1) {
    std::vector<float> r(K);
    for (int64_t m = m0; m < m1; ++m) {
        const float* row = xp + m * K;
        if (sp) {
            for (int64_t k = 0; k < K; ++k) r[k] = row[k] * sp[k];
        } else {
            std::copy(row, row + K, r.begin());
        }
        quantize_row(r.data(), K, levels, qp + m * K, M * K, op + m, M);
    }
}

static void check_x(const torch::Tensor& x, const torch::Tensor& inv_smooth) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be float32 [M, K]");
    TORCH_CHECK(inv_smooth.numel() == 0 || (inv_smooth.numel() == x.size(1) && inv_smooth.scalar_type() == torch::kFloat32),
                "inv_smooth must be float32 [K]");
}

std::vector<torch::Tensor> quantize_rows(torch::Tensor x, torch::Tensor inv_smooth, int64_t levels) {
    check_x(x, inv_smooth);
    x = x.contiguous();
    const int64_t M = x.size(0), K = x.size(1);
    auto sm = inv_smooth.contiguous();
    auto q = torch::empty({levels * M, K}, torch::kInt8);
    auto s = torch::empty({levels * M, 1}, torch::kFloat32);
    const float* xp = x.data_ptr<float>();
    const float* sp = sm.numel() ? sm.data_ptr<float>() : nullptr;
    int8_t* qp = q.data_ptr<int8_t>();
    float* op = s.data_ptr<float>();
    at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) { quantize_range(xp, sp, M, K, levels, qp, op, m0, m1); });
    return {q, s};
}

torch::Tensor rescale(torch::Tensor acc, torch::Tensor s, torch::Tensor w_scale, int64_t levels) {
    TORCH_CHECK(acc.scalar_type() == torch::kInt32 && acc.dim() == 2, "acc must be int32 [levels*M, N]");
    acc = acc.contiguous();
    const int64_t N = acc.size(1), M = acc.size(0) / levels;
    auto sc = s.contiguous(), ws = w_scale.contiguous();
    auto y = torch::empty({M, N}, torch::kFloat32);
    const int32_t* ap = acc.data_ptr<int32_t>();
    const float* sp = sc.data_ptr<float>();
    const float* wp = ws.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
            float* yrow = yp + m * N;
            const int32_t* a0 = ap + m * N;
            const float s0 = sp[m];
            for (int64_t n = 0; n < N; ++n) yrow[n] = static_cast<float>(a0[n]) * s0;
            for (int64_t l = 1; l < levels; ++l) {
                const int32_t* al = ap + (l * M + m) * N;
                const float sl = sp[l * M + m];
                for (int64_t n = 0; n < N; ++n) yrow[n] += static_cast<float>(al[n]) * sl;
            }
            for (int64_t n = 0; n < N; ++n) yrow[n] *= wp[n];
        }
    });
    return y;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static constexpr bool kVnni = true;
// G activation rows (u8, q + 128, as int32 groups of 4) against one 16-channel block of the weight
// ([Kq][16][4] int8): acc[g] holds the block's 16 dot products, no horizontal sums.
template <int G>
static inline void block_dot(const int32_t* const* a, const int8_t* wb, int64_t Kq, int32_t (*out)[16]) {
    __m512i acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
    for (int64_t kq = 0; kq < Kq; ++kq) {
        const __m512i wv = _mm512_loadu_si512(wb + kq * 64);
        for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_set1_epi32(a[g][kq]), wv);
    }
    for (int g = 0; g < G; ++g) _mm512_storeu_si512(out[g], acc[g]);
}
#else
static constexpr bool kVnni = false;
template <int G>
static inline void block_dot(const int32_t* const* a, const int8_t* wb, int64_t Kq, int32_t (*out)[16]) {
    for (int g = 0; g < G; ++g) {
        const uint8_t* ag = reinterpret_cast<const uint8_t*>(a[g]);
        for (int j = 0; j < 16; ++j) {
            int32_t sum = 0;
            for (int64_t kq = 0; kq < Kq; ++kq)
                for (int t = 0; t < 4; ++t) sum += static_cast<int32_t>(ag[kq * 4 + t]) * wb[kq * 64 + j * 4 + t];
            out[g][j] = sum;
        }
    }
}
#endif

bool has_fast_gemv() { return kVnni; }

// y [M, N] ~= x [M, K] W^T for a few rows: quantize x (levels), then read the int8 weight once for
// all levels*M activation rows. `wb` is the weight in 16-channel blocks [ceil(N/16), ceil(K/4), 16, 4]
// (`block_weight` in int8.py) so AVX512-VNNI's dpbusd (u8 x s8, 4 products per int32 lane) fills 16
// channels per instruction; activations go in as q + 128 and w_comp [>= N] = 128 sum_k w[n, k]
// takes the offset back out. Then each row's levels are rescaled and summed.
torch::Tensor gemv(torch::Tensor x, torch::Tensor inv_smooth, torch::Tensor wb, torch::Tensor w_scale,
                   torch::Tensor w_comp, int64_t levels) {
    check_x(x, inv_smooth);
    TORCH_CHECK(wb.dim() == 4 && wb.scalar_type() == torch::kInt8 && wb.is_contiguous() && wb.size(2) == 16 &&
                wb.size(3) == 4 && wb.size(1) * 4 >= x.size(1), "wb must be contiguous int8 [Nb, Kq, 16, 4]");
    const int64_t N = w_scale.numel();
    TORCH_CHECK(w_comp.scalar_type() == torch::kInt32 && w_comp.numel() >= N && wb.size(0) * 16 >= N,
                "w_comp must be int32 [>= N]");
    x = x.contiguous();
    const int64_t M = x.size(0), K = x.size(1), R = levels * M, Nb = wb.size(0), Kq = wb.size(1);
    auto sm = inv_smooth.contiguous();
    auto q = torch::empty({R, K}, torch::kInt8);
    std::vector<float> s(R);
    quantize_range(x.data_ptr<float>(), sm.numel() ? sm.data_ptr<float>() : nullptr, M, K, levels,
                   q.data_ptr<int8_t>(), s.data(), 0, M);
    const int8_t* qp = q.data_ptr<int8_t>();
    std::vector<int32_t> a(R * Kq, 0x80808080);  // u8 rows, q + 128, padded with 128 (q = 0)
    for (int64_t r = 0; r < R; ++r) {
        uint8_t* ar = reinterpret_cast<uint8_t*>(a.data() + r * Kq);
        for (int64_t k = 0; k < K; ++k) ar[k] = static_cast<uint8_t>(qp[r * K + k]) ^ 0x80;
    }
    auto y = torch::empty({M, N}, torch::kFloat32);
    float* yp = y.data_ptr<float>();
    const int8_t* wp = wb.data_ptr<int8_t>();
    auto wsc = w_scale.contiguous();
    auto wcc = w_comp.contiguous();
    const float* wsp = wsc.data_ptr<float>();
    const int32_t* cp = wcc.data_ptr<int32_t>();
    // a chunk of at least ~1M multiply-adds: a small weight's call stays on one thread (a fork / join
    // costs about as much as its whole GEMV)
    const int64_t grain = std::max<int64_t>(8, (1 << 20) / std::max<int64_t>(1, 16 * Kq * 4 * R));
    at::parallel_for(0, Nb, grain, [&](int64_t b0, int64_t b1) {
        std::vector<int32_t> acc(R * 16);
        auto out = reinterpret_cast<int32_t (*)[16]>(acc.data());
        std::vector<const int32_t*> rows(R);
        for (int64_t r = 0; r < R; ++r) rows[r] = a.data() + r * Kq;
        for (int64_t nb = b0; nb < b1; ++nb) {
            const int8_t* wbp = wp + nb * Kq * 64;
            int64_t r = 0;
            for (; r + 8 <= R; r += 8) block_dot<8>(rows.data() + r, wbp, Kq, out + r);
            for (; r + 4 <= R; r += 4) block_dot<4>(rows.data() + r, wbp, Kq, out + r);
            for (; r < R; ++r) block_dot<1>(rows.data() + r, wbp, Kq, out + r);
            const int64_t n0 = nb * 16, n1 = std::min<int64_t>(n0 + 16, N);
            for (int64_t m = 0; m < M; ++m) {
                for (int64_t n = n0; n < n1; ++n) {
                    float v = static_cast<float>(out[m][n - n0] - cp[n]) * s[m];
                    for (int64_t l = 1; l < levels; ++l)
                        v += static_cast<float>(out[l * M + m][n - n0] - cp[n]) * s[l * M + m];
                    yp[m * N + n] = v * wsp[n];
                }
            }
        }
    });
    return y;
}
"""

# -march=native: the extension is built on the machine that runs it (cached per machine); the
# vector paths are guarded by the compiler's __AVX2__ / __AVX512VNNI__, a plain loop otherwise.
# No FMA contraction, so the residual is rounded as the eager ops round it.
_CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]


def ops() -> ModuleType | None:
    """The built extension (quantize_rows, rescale, gemv, has_fast_gemv), or None when it cannot be built (warned once)."""
    return cpu_ext.load("hintkv_int8_cpu", _SOURCE, ["quantize_rows", "rescale", "gemv", "has_fast_gemv"], _CFLAGS)
