// hintkv's CPU kernels for a float32 model step: causal attention over the paged KV cache and the
// fused element-wise regions between the GEMMs (cpu_kernels.py builds this with cpp_extension).
//
//   (the attention kernel itself is csrc/cpu_attention.cpp: its work items, threading and paging; its tile
//   micro-kernels, score / P V / online softmax, are csrc/cpu_attention_tiles.cpp. cpu_kernels.py builds the three
//   files as one translation unit, in this order: this one first, with the includes and the exp polynomials)
// attention(q [T, Hq, D], k, v [T, Hkv, D], slots [T], kv [2, NB, BS, Hkv, D], tables: B i64 tensors,
//           qsl: B+1 ints, ctx: B ints, scale) -> o [T, Hq, D]: writes the step's k / v rows into their
//   slots of the cache first (empty k: already written), then attends. Sequence b's rows are qsl[b] .. qsl[b+1]; its query j sits at position
//   ctx[b] - q_len + j and sees keys 0 .. that position, read through its block table. Flash style
//   (vLLM's CPU attention is the model): one work item is (sequence, KV head, a tile of queries),
//   the GQA group folded into the tile's rows so a KV head is read once per tile; keys go in tiles
//   of 32: scores by an 8-row x 32-key register tile over K transposed to [D, keys] (broadcast q,
//   no horizontal sums), an online softmax per row, then P V into an output tile of rows x D. In vector builds
//   the softmax reduces a row's max only when a score exceeds it and keeps its sum as lane sums (softmax_row16: 6% of a
//   causal 2048-token layer's attention, seventeenth session; softmax_row8 on AVX2); on AVX-512 a row that sees a
//   whole key tile takes its scores into the softmax straight from the score registers (score_softmax_tile, bit for
//   bit the same).
//   K of each (sequence, KV head) is gathered transposed from the paged cache once per call and
//   shared by that sequence's query tiles; V rows are read where they lie. A sequence of at most
//   DIRECT_ROWS rows (decodes, short verifies) skips the transpose: dot products over K's rows.
// add_rmsnorm(x, residual, w, eps) -> (norm(x + residual) * w, x + residual), residual updated in place
//   (x's rows may be strided: a W8A8 GEMM returns a view of a wider buffer)
// rope_(qkv [T, (Hq + 2 Hkv) D], cos [T, D/2], sin [T, D/2], Hq, Hkv, D): q and k rotated in place
// silu_mul(gate_up [T, 2 I]) -> [T, I]
// argmax_rows(x [N, V]) -> N ints: torch.argmax(x, -1) (first maximum; a NaN counts as the maximum),
//   vectorised and without an OpenMP region (greedy sampling's few rows)
// simd() -> "avx512" | "avx2" | "scalar": the vector paths this build takes
//
// Vector code is AVX-512 (guarded by __AVX512F__), else AVX2 + FMA (HK_AVX2: 8 lanes, the score tile in blocks of
// 6 rows x 16 keys, P V of 6 rows x 16 columns: 12 accumulators of AVX2's 16 registers), else a plain loop of the
// same arithmetic. On the AVX2-only AMD EPYC (Zen, 2 GHz) the plain loops' compiler vectorisation ran a dummy:tiny
// layer's attention at 29.7 / 463 ms (512 / 2048 tokens, one thread) against 12.1 / 190 ms for the AVX2 path, and
// SiLU-mul at 2.3-3.4x its time. simd() says which paths the build took. exp is a Cephes-style polynomial
// (relative error ~2e-7 on the range softmax uses); AVX2's fused softmax works in log2 units (its queries scaled by
// log2 e as well) with exp2_8, a degree-4 polynomial of 2^f (relative error <= 1.7e-7). On AVX2 a GQA group's query
// tile takes whole 6-row blocks (tile_tokens) and K is transposed 8 x 8 in registers.
// torch: cpu_ext.HEADERS, put first when it is built
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
// AVX2 + FMA (no AVX-512: the AMD EPYCs this runs on) takes 8-wide paths of the same algorithm
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define HK_AVX2 1
#endif

namespace {

// The exp polynomial's constants, one table for both widths (exp16_core and exp8): x = n ln2 + r with
// n = round(x log2 e) and ln2 split in two parts (r exact for |n| <= 128), exp(r) = 1 + r + r^2 p(r) with p's
// coefficients kExpPoly from the highest power down; the clamp keeps exp8's 2^n within float's normal exponents
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
constexpr float kExpMin = -87.3f, kExpMax = 88.3f;

#if defined(__AVX512F__)
// exp(x) for x <= 88.3, or -inf (NaN there: callers mask it): a finite x below -87.3 gives 0 or a denormal
// (scalef scales by 2^n in any range). The one AVX-512 polynomial core: exp16 clamps into [-87.3, 88.3] first (a
// floor of 1.2e-38 below it); the online softmax softmax_row16, whose argument is s - max <= 0 and masked, calls
// it directly
inline __m512 exp16_core(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
    __m512 p = _mm512_set1_ps(kExpPoly[0]);
    for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

inline __m512 exp16(__m512 x) {
    return exp16_core(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax)));
}
#elif defined(HK_AVX2)
// exp16's polynomial (the same table), 8 lanes, for x already in [-87.3, 88.3]; 2^n built in the exponent bits (n in
// [-126, 127] there). exp8 clamps first; the online softmax (softmax_row8), whose argument s - max is <= 0, clamps
// only from below and calls this: the same bits as exp8 there.
inline __m256 exp8_core(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kExpPoly[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline __m256 exp8(__m256 x) {
    return exp8_core(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax)));
}

// 2^x for x in [-125, 0]: the online softmax's (softmax_row8's) argument, s - max in log2 units (the fused path's
// queries carry log2 e in their scale) clamped from below. x = n + f, n = round(x), f in [-0.5, 0.5], 2^f = 1 + f p(f)
// with p of degree 4 (a relative-error minimax fit, as SLEEF's and oneDNN's exp reduce to 2^f), 2^n added into the
// exponent bits (the result stays normal: 2^f >= 0.707, n >= -125). Relative error <= 1.7e-7 over [-125, 0] (FMA
// evaluation; exp8's ~2e-7), in 11 vector ops where exp8_core on s - max takes 15 (and a multiply by log2 e).
constexpr float kExp2Poly[5] = {1.3264727318e-3f, 9.6715127853e-3f, 5.5507337442e-2f, 2.4022242083e-1f,
                                6.9314697760e-1f};
constexpr float kExp2Min = -125.f;
inline __m256 exp2_8(__m256 x) {
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(kExp2Poly[0]);
    for (int i = 1; i < 5; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}
#endif

}  // namespace

// one row of add_rmsnorm: res (when not null) += x, then out = norm(res or x) * w; the team step
// (csrc/decode_team.cpp) runs this same function per row
inline void add_rmsnorm_row(const float* xr, float* res, const float* wp, float* orow, int64_t H, double eps) {
    const float* src = xr;
    if (res != nullptr) {
        for (int64_t i = 0; i < H; ++i) res[i] += xr[i];
        src = res;
    }
    double ss = 0.0;
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= H; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += src[i + j] * src[i + j];
    for (int j = 0; j < 16; ++j) ss += acc[j];
    for (; i < H; ++i) ss += src[i] * src[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / H) + static_cast<float>(eps));
    for (int64_t k = 0; k < H; ++k) orow[k] = src[k] * inv * wp[k];
}

std::vector<torch::Tensor> add_rmsnorm(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.stride(1) == 1,
                "x must be float32 [T, H] with contiguous rows");
    const bool has_res = residual.numel() > 0;
    TORCH_CHECK(!has_res || (residual.sizes() == x.sizes() && residual.is_contiguous() &&
                             residual.scalar_type() == torch::kFloat32), "residual must match x");
    const int64_t T = x.size(0), H = x.size(1), xs = x.stride(0);
    auto wc = w.contiguous();
    auto out = torch::empty({T, H}, x.options());
    const float* xp = x.data_ptr<float>();
    float* rp = has_res ? residual.data_ptr<float>() : nullptr;
    const float* wp = wc.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            add_rmsnorm_row(xp + t * xs, has_res ? rp + t * H : nullptr, wp, op + t * H, H, eps);
    });
    return {out, has_res ? residual : x};
}

// one head of one row rotated in place (x1: its first half, x2 = x1 + half); the team step runs it per head
inline void rope_head(float* x1, const float* c, const float* s, int64_t half) {
    float* x2 = x1 + half;
    for (int64_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
    }
}

void rope_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t hq, int64_t hkv, int64_t D) {
    TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == torch::kFloat32 && qkv.is_contiguous() &&
                qkv.size(1) == (hq + 2 * hkv) * D, "qkv must be contiguous float32 [T, (Hq + 2 Hkv) D]");
    const int64_t T = qkv.size(0), half = D / 2, heads = hq + hkv, row = qkv.size(1);
    auto cc = cos.contiguous(), sc = sin.contiguous();
    TORCH_CHECK(cc.numel() == T * half && sc.numel() == T * half, "cos / sin must be [T, D/2]");
    float* xp = qkv.data_ptr<float>();
    const float* cp = cc.data_ptr<float>();
    const float* sp = sc.data_ptr<float>();
    at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            for (int64_t h = 0; h < heads; ++h) rope_head(xp + t * row + h * D, cp + t * half, sp + t * half, half);
    });
}

// o[i] = silu(g[i]) * u[i] for i in [i0, i1), i0 a multiple of 16: the vector loop runs while 16 fit before i1,
// so a span ending at the row's end takes the same path per element as the whole row (the team step's spans)
inline void silu_mul_span(const float* g, const float* u, float* o, int64_t i0, int64_t i1) {
    int64_t i = i0;
#if defined(__AVX512F__)
    for (; i + 16 <= i1; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 sg = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
        _mm512_storeu_ps(o + i, _mm512_mul_ps(sg, _mm512_loadu_ps(u + i)));
    }
#elif defined(HK_AVX2)
    for (; i + 8 <= i1; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 sg = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < i1; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

torch::Tensor silu_mul(torch::Tensor gu) {
    TORCH_CHECK(gu.dim() == 2 && gu.scalar_type() == torch::kFloat32 && gu.is_contiguous(),
                "gate_up must be contiguous float32 [T, 2I]");
    const int64_t T = gu.size(0), I = gu.size(1) / 2;
    auto out = torch::empty({T, I}, gu.options());
    const float* gp = gu.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) silu_mul_span(gp + t * 2 * I, gp + t * 2 * I + I, op + t * I, 0, I);
    });
    return out;
}

// the vector paths this build takes: "avx512", "avx2" (AVX2 + FMA) or "scalar" (tests, benchmarks)
std::string simd() {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(HK_AVX2)
    return "avx2";
#else
    return "scalar";
#endif
}

std::vector<int64_t> argmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.stride(1) == 1 && x.size(1) > 0,
                "x must be float32 [N, V > 0] with contiguous rows");
    const int64_t N = x.size(0), V = x.size(1), xs = x.stride(0);
    std::vector<int64_t> out(N);
    for (int64_t n = 0; n < N; ++n) {  // few rows (one per sampling sequence): no OpenMP region
        const float* r = x.data_ptr<float>() + n * xs;
        int64_t i = 0, nan_at = -1;
        float m = -std::numeric_limits<float>::infinity();
#if defined(__AVX512F__)
        __m512 vm = _mm512_set1_ps(m);
        __mmask16 nan = 0;
        for (; i + 16 <= V; i += 16) {
            const __m512 v = _mm512_loadu_ps(r + i);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            vm = _mm512_max_ps(vm, v);
        }
        m = _mm512_reduce_max_ps(vm);
        if (nan) nan_at = 0;  // rescanned below for the first NaN's index
#endif
        for (; i < V; ++i) {
            if (r[i] != r[i]) { nan_at = 0; break; }
            m = std::max(m, r[i]);
        }
        int64_t best = -1;
        if (nan_at >= 0) {  // torch.argmax: a NaN is the maximum, the first one wins
            for (int64_t j = 0; j < V && best < 0; ++j)
                if (r[j] != r[j]) best = j;
        } else {  // the first index holding the maximum (-0.0 == 0.0, like torch's comparison)
            int64_t j = 0;
#if defined(__AVX512F__)
            const __m512 vmax = _mm512_set1_ps(m);
            for (; j + 16 <= V && best < 0; j += 16) {
                const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(r + j), vmax, _CMP_EQ_OQ);
                if (eq) best = j + __builtin_ctz(static_cast<unsigned>(eq));
            }
#endif
            for (; j < V && best < 0; ++j)
                if (r[j] == m) best = j;
        }
        out[n] = best;
    }
    return out;
}
