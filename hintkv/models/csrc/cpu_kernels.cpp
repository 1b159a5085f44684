// hintkv's CPU kernels for a float32 model step: causal attention over the paged KV cache and the
// fused element-wise regions between the GEMMs (cpu_kernels.py builds this with cpp_extension).
//
// attention(q [T, Hq, D], k, v [T, Hkv, D], slots [T], kv [2, NB, BS, Hkv, D], tables: B i64 tensors,
//           qsl: B+1 ints, ctx: B ints, scale) -> o [T, Hq, D]: writes the step's k / v rows into their
//   slots of the cache first (empty k: already written), then attends. Sequence b's rows are qsl[b] .. qsl[b+1]; its query j sits at position
//   ctx[b] - q_len + j and sees keys 0 .. that position, read through its block table. Flash style
//   (vLLM's CPU attention is the model): one work item is (sequence, KV head, a tile of queries),
//   the GQA group folded into the tile's rows so a KV head is read once per tile; keys go in tiles
//   of 32: scores by an 8-row x 32-key register tile over K transposed to [D, keys] (broadcast q,
//   no horizontal sums), an online softmax per row, then P V into an output tile of rows x D.
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
// Vector code is AVX-512 (guarded by __AVX512F__), else AVX2 + FMA (HK_AVX2: 8 lanes, the score tile as 4 rows x
// 16 keys, P V as 2 rows x 32 columns, so the accumulators fit AVX2's 16 registers), else a plain loop of the same
// arithmetic. On the AVX2-only AMD EPYC (Zen, 2 GHz) the plain loops' compiler vectorisation ran a dummy:tiny
// layer's attention at 29.7 / 463 ms (512 / 2048 tokens, one thread) against 12.1 / 190 ms for the AVX2 path, and
// SiLU-mul at 2.3-3.4x its time. simd() says which paths the build took. exp is a Cephes-style polynomial
// (relative error ~2e-7 on the range softmax uses).
#include <torch/extension.h>
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

constexpr int KT = 32;        // keys per tile
constexpr int MR = 8;         // query rows per score micro-tile
constexpr int TILE_ROWS = 64; // query rows (tokens x group) per work item, at most
constexpr int DIRECT_ROWS = 16; // a sequence with at most this many rows reads K untransposed
// A step whose attention is fewer multiply-adds than this runs on the calling thread alone: an OpenMP
// region costs a worker's wake-up (tens of us when the pool's threads sleep between regions, as in the
// server, whose engine thread is not the process's first OpenMP thread), more than a decode step's
// attention (decode b8 at a 128-token context: 1M multiply-adds, ~50 us on one thread per layer).
constexpr int64_t SERIAL_MACS = int64_t(1) << 21;

#if defined(__AVX512F__)
inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#elif defined(HK_AVX2)
// exp16's polynomial, 8 lanes; 2^n built in the exponent bits (n in [-126, 127] after the clamp)
inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

inline float hmax8(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

// R <= 4 rows x 16 keys of S = Q Kt: 8 accumulators, two K vectors loaded per d and shared by the rows
template <int R>
inline void score_block8(const float* q, int64_t D, const float* kt, float* s) {
    __m256 c[R][2];
    for (int i = 0; i < R; ++i) c[i][0] = c[i][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
        const __m256 b0 = _mm256_loadu_ps(kt + d * KT), b1 = _mm256_loadu_ps(kt + d * KT + 8);
        for (int i = 0; i < R; ++i) {
            const __m256 a = _mm256_broadcast_ss(q + i * D + d);
            c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
        }
    }
    for (int i = 0; i < R; ++i) {
        _mm256_storeu_ps(s + i * KT, c[i][0]);
        _mm256_storeu_ps(s + i * KT + 8, c[i][1]);
    }
}

// R <= 2 rows x 32 output columns of O += P V: 8 accumulators, four V vectors loaded per key
template <int R>
inline void pv_block8(const float* p, const float* const* v, int nk, int64_t d0, int64_t D, float* o) {
    __m256 c[R][4];
    for (int i = 0; i < R; ++i)
        for (int u = 0; u < 4; ++u) c[i][u] = _mm256_loadu_ps(o + i * D + d0 + 8 * u);
    for (int j = 0; j < nk; ++j) {
        const float* vr = v[j] + d0;
        const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8), v2 = _mm256_loadu_ps(vr + 16),
                     v3 = _mm256_loadu_ps(vr + 24);
        for (int i = 0; i < R; ++i) {
            const __m256 a = _mm256_broadcast_ss(p + i * KT + j);
            c[i][0] = _mm256_fmadd_ps(a, v0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(a, v1, c[i][1]);
            c[i][2] = _mm256_fmadd_ps(a, v2, c[i][2]);
            c[i][3] = _mm256_fmadd_ps(a, v3, c[i][3]);
        }
    }
    for (int i = 0; i < R; ++i)
        for (int u = 0; u < 4; ++u) _mm256_storeu_ps(o + i * D + d0 + 8 * u, c[i][u]);
}
#endif

// S[M][KT] = Q[M][D] Kt[D][KT] (Q rows at stride D, Kt rows at stride KT)
template <int M>
inline void score_tile(const float* q, int64_t D, const float* kt, float* s) {
#if defined(__AVX512F__)
    __m512 c[M][2];
    for (int i = 0; i < M; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
        const __m512 b0 = _mm512_loadu_ps(kt + d * KT), b1 = _mm512_loadu_ps(kt + d * KT + 16);
        for (int i = 0; i < M; ++i) {
            const __m512 a = _mm512_set1_ps(q[i * D + d]);
            c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
        }
    }
    for (int i = 0; i < M; ++i) {
        _mm512_storeu_ps(s + i * KT, c[i][0]);
        _mm512_storeu_ps(s + i * KT + 16, c[i][1]);
    }
#elif defined(HK_AVX2)
    static_assert(KT == 32, "two halves of 16 keys");
    for (int h = 0; h < KT; h += 16) {
        int i = 0;
        for (; i + 4 <= M; i += 4) score_block8<4>(q + i * D, D, kt + h, s + i * KT + h);
        for (; i < M; ++i) score_block8<1>(q + i * D, D, kt + h, s + i * KT + h);
    }
#else
    for (int i = 0; i < M; ++i) {
        float acc[KT] = {0};
        for (int64_t d = 0; d < D; ++d)
            for (int j = 0; j < KT; ++j) acc[j] += q[i * D + d] * kt[d * KT + j];
        std::memcpy(s + i * KT, acc, sizeof(acc));
    }
#endif
}

// O[M][D] += P[M][KT] V[nk][D] (V row j at v[j], in the cache), in chunks of 64 output columns
template <int M>
inline void pv_tile(const float* p, const float* const* v, int nk, int64_t D, float* o) {
#if defined(__AVX512F__)
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) {
        __m512 c[M][4];
        for (int i = 0; i < M; ++i)
            for (int u = 0; u < 4; ++u) c[i][u] = _mm512_loadu_ps(o + i * D + d0 + 16 * u);
        for (int j = 0; j < nk; ++j) {
            const float* vr = v[j] + d0;
            const __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16), v2 = _mm512_loadu_ps(vr + 32),
                         v3 = _mm512_loadu_ps(vr + 48);
            for (int i = 0; i < M; ++i) {
                const __m512 a = _mm512_set1_ps(p[i * KT + j]);
                c[i][0] = _mm512_fmadd_ps(a, v0, c[i][0]);
                c[i][1] = _mm512_fmadd_ps(a, v1, c[i][1]);
                c[i][2] = _mm512_fmadd_ps(a, v2, c[i][2]);
                c[i][3] = _mm512_fmadd_ps(a, v3, c[i][3]);
            }
        }
        for (int i = 0; i < M; ++i)
            for (int u = 0; u < 4; ++u) _mm512_storeu_ps(o + i * D + d0 + 16 * u, c[i][u]);
    }
    for (; d0 + 16 <= D; d0 += 16) {
        __m512 c[M];
        for (int i = 0; i < M; ++i) c[i] = _mm512_loadu_ps(o + i * D + d0);
        for (int j = 0; j < nk; ++j) {
            const __m512 vv = _mm512_loadu_ps(v[j] + d0);
            for (int i = 0; i < M; ++i) c[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[i * KT + j]), vv, c[i]);
        }
        for (int i = 0; i < M; ++i) _mm512_storeu_ps(o + i * D + d0, c[i]);
    }
    for (; d0 < D; ++d0)
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < nk; ++j) o[i * D + d0] += p[i * KT + j] * v[j][d0];
#elif defined(HK_AVX2)
    int64_t d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) {
        int i = 0;
        for (; i + 2 <= M; i += 2) pv_block8<2>(p + i * KT, v, nk, d0, D, o + i * D);
        for (; i < M; ++i) pv_block8<1>(p + i * KT, v, nk, d0, D, o + i * D);
    }
    for (; d0 + 8 <= D; d0 += 8)
        for (int i = 0; i < M; ++i) {
            __m256 c = _mm256_loadu_ps(o + i * D + d0);
            for (int j = 0; j < nk; ++j)
                c = _mm256_fmadd_ps(_mm256_broadcast_ss(p + i * KT + j), _mm256_loadu_ps(v[j] + d0), c);
            _mm256_storeu_ps(o + i * D + d0, c);
        }
    for (; d0 < D; ++d0)
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < nk; ++j) o[i * D + d0] += p[i * KT + j] * v[j][d0];
#else
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < nk; ++j) {
            const float pj = p[i * KT + j];
            for (int64_t d = 0; d < D; ++d) o[i * D + d] += pj * v[j][d];
        }
#endif
}

// S[r][j] = Q[r] . K[j] for R rows and nk key rows (k[j], in the cache): few-row items (decodes)
// read K where it lies instead of transposing it first
inline void score_direct(const float* q, int64_t R, int64_t D, const float* const* k, int nk, float* s) {
    for (int j = 0; j < nk; ++j) {
        const float* kr = k[j];
        int64_t r = 0;
#if defined(__AVX512F__)
        if (D % 16 == 0) {
            for (; r + 4 <= R; r += 4) {  // four independent chains, K's row loaded once
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t d = 0; d < D; d += 16) {
                    const __m512 kv = _mm512_loadu_ps(kr + d);
                    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * D + d), kv, a0);
                    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + (r + 1) * D + d), kv, a1);
                    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + (r + 2) * D + d), kv, a2);
                    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + (r + 3) * D + d), kv, a3);
                }
                s[r * KT + j] = _mm512_reduce_add_ps(a0);
                s[(r + 1) * KT + j] = _mm512_reduce_add_ps(a1);
                s[(r + 2) * KT + j] = _mm512_reduce_add_ps(a2);
                s[(r + 3) * KT + j] = _mm512_reduce_add_ps(a3);
            }
        }
#endif
        for (; r < R; ++r) {
            const float* qr = q + r * D;
            float sum = 0.f;
            for (int64_t d = 0; d < D; ++d) sum += qr[d] * kr[d];
            s[r * KT + j] = sum;
        }
    }
}

// Row r's online softmax over one score tile s[KT] (keys k0 .. k0+nk-1, visible while k <= last):
// p[KT] = exp(s - m_new) (0 for hidden keys), returns alpha = exp(m_old - m_new), updates m, l.
inline float softmax_row(float* s, int nk, int64_t k0, int64_t last, float& m, float& l) {
    const int vis = static_cast<int>(std::min<int64_t>(nk, std::max<int64_t>(0, last - k0 + 1)));
    if (vis == 0) {
        std::fill(s, s + KT, 0.f);
        return 1.f;
    }
#if defined(__AVX512F__)
    static_assert(KT == 32, "two vectors per tile");
    const uint32_t bits = vis >= 32 ? 0xffffffffu : ((1u << vis) - 1u);
    const __mmask16 k0m = static_cast<__mmask16>(bits & 0xffff), k1m = static_cast<__mmask16>(bits >> 16);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512 s0 = _mm512_mask_loadu_ps(ninf, k0m, s), s1 = _mm512_mask_loadu_ps(ninf, k1m, s + 16);
    const float mt = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    const float mn = std::max(m, mt);
    const float alpha = mn == m ? 1.f : std::exp(m - mn);  // m = -inf at the first tile: alpha = 0
    const __m512 vm = _mm512_set1_ps(mn);
    const __m512 e0 = _mm512_maskz_mov_ps(k0m, exp16(_mm512_sub_ps(s0, vm)));
    const __m512 e1 = _mm512_maskz_mov_ps(k1m, exp16(_mm512_sub_ps(s1, vm)));
    _mm512_storeu_ps(s, e0);
    _mm512_storeu_ps(s + 16, e1);
    const float sum = _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
#elif defined(HK_AVX2)
    static_assert(KT == 32, "four vectors per tile");
    __m256 sv[4];
    __m256 vmask[4];
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 mx = ninf;
    for (int u = 0; u < 4; ++u) {  // hidden keys (j >= vis) read as -inf
        vmask[u] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(vis - 8 * u), lane));
        sv[u] = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * u), vmask[u]);
        mx = _mm256_max_ps(mx, sv[u]);
    }
    const float mt = hmax8(mx);
    const float mn = std::max(m, mt);
    const float alpha = mn == m ? 1.f : std::exp(m - mn);  // m = -inf at the first tile: alpha = 0
    const __m256 vm = _mm256_set1_ps(mn);
    __m256 acc = _mm256_setzero_ps();
    for (int u = 0; u < 4; ++u) {
        const __m256 e = _mm256_and_ps(vmask[u], exp8(_mm256_sub_ps(sv[u], vm)));
        _mm256_storeu_ps(s + 8 * u, e);
        acc = _mm256_add_ps(acc, e);
    }
    const float sum = hsum8(acc);
#else
    float mt = s[0];
    for (int j = 1; j < vis; ++j) mt = std::max(mt, s[j]);
    const float mn = std::max(m, mt);
    const float alpha = mn == m ? 1.f : std::exp(m - mn);
    float sum = 0.f;
    for (int j = 0; j < KT; ++j) {
        s[j] = j < vis ? std::exp(s[j] - mn) : 0.f;
        sum += s[j];
    }
#endif
    l = l * alpha + sum;
    m = mn;
    return alpha;
}

struct Item {
    int64_t b, h, t0, t1;  // sequence, KV head, query tokens [t0, t1) of the sequence's new tokens
};

// scratch that outlives a call: fresh multi-MB vectors per layer cost page faults and zeroing
float* scratch(std::vector<float>& buf, int64_t n) {
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
    return buf.data();
}

}  // namespace

torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor slots, torch::Tensor kv,
                        std::vector<torch::Tensor> tables, std::vector<int64_t> qsl, std::vector<int64_t> ctx,
                        double scale) {
    TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat32 && q.stride(2) == 1, "q must be float32 [T, Hq, D]");
    TORCH_CHECK(kv.dim() == 5 && kv.scalar_type() == torch::kFloat32 && kv.is_contiguous(),
                "kv must be contiguous float32 [2, NB, BS, Hkv, D]");
    const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2);
    const int64_t NB = kv.size(1), BS = kv.size(2), Hkv = kv.size(3);
    TORCH_CHECK(kv.size(4) == D && Hq % Hkv == 0, "head shapes disagree");
    const int64_t G = Hq / Hkv, B = static_cast<int64_t>(ctx.size());
    TORCH_CHECK(static_cast<int64_t>(qsl.size()) == B + 1 && qsl[0] == 0 && qsl[B] == T &&
                static_cast<int64_t>(tables.size()) == B, "qsl must have B+1 entries from 0 to T, tables B");
    const int64_t* qp = qsl.data();
    const int64_t* cp = ctx.data();
    std::vector<const int64_t*> tp(B);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t n = qp[b + 1] - qp[b];
        tables[b] = tables[b].contiguous();
        TORCH_CHECK(tables[b].scalar_type() == torch::kInt64, "block tables must be int64");
        TORCH_CHECK(n > 0 && n <= cp[b] && (cp[b] + BS - 1) / BS <= tables[b].numel(), "sequence ", b, ": bad lengths");
        tp[b] = tables[b].data_ptr<int64_t>();
        for (int64_t i = 0; i < (cp[b] + BS - 1) / BS; ++i)
            TORCH_CHECK(tp[b][i] >= 0 && tp[b][i] < NB, "sequence ", b, ": block id out of range");
    }
    if (k.numel() > 0) {  // the step's new K / V rows into their slots first
        TORCH_CHECK(k.dim() == 3 && v.dim() == 3 && k.size(0) == T && v.size(0) == T && k.size(1) == Hkv &&
                    v.size(1) == Hkv && k.size(2) == D && v.size(2) == D && k.stride(2) == 1 && v.stride(2) == 1 &&
                    k.scalar_type() == torch::kFloat32 && v.scalar_type() == torch::kFloat32,
                    "k, v must be float32 [T, Hkv, D]");
        TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.numel() == T, "slots must be int64 [T]");
        auto sl = slots.contiguous();
        const int64_t* sp = sl.data_ptr<int64_t>();
        float* kvp = kv.data_ptr<float>();
        const float* kp = k.data_ptr<float>();
        const float* vp = v.data_ptr<float>();
        const int64_t nslots = NB * BS, half_n = nslots * Hkv * D;
        for (int64_t t = 0; t < T; ++t) {
            TORCH_CHECK(sp[t] >= 0 && sp[t] < nslots, "slot out of range");
            for (int64_t h = 0; h < Hkv; ++h) {
                std::memcpy(kvp + (sp[t] * Hkv + h) * D, kp + t * k.stride(0) + h * k.stride(1), D * sizeof(float));
                std::memcpy(kvp + half_n + (sp[t] * Hkv + h) * D, vp + t * v.stride(0) + h * v.stride(1),
                            D * sizeof(float));
            }
        }
    }
    auto out = torch::empty({T, Hq, D}, q.options());
    const float* qd = q.data_ptr<float>();
    const float* kd = kv.data_ptr<float>();
    float* od = out.data_ptr<float>();
    const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
    const int64_t half = NB * BS * Hkv * D;  // K -> V

    // K of every (sequence, KV head) in key tiles, each transposed [D][KT] (tile t at t * D * KT):
    // gathered once, shared by the sequence's query tiles (V rows are read where they lie)
    std::vector<int64_t> koff(B * Hkv + 1, 0), spad(B);
    std::vector<char> direct(B);
    for (int64_t b = 0; b < B; ++b) {
        direct[b] = (qp[b + 1] - qp[b]) * G <= DIRECT_ROWS;
        spad[b] = direct[b] ? 0 : (cp[b] + KT - 1) / KT * KT;
        for (int64_t h = 0; h < Hkv; ++h) koff[b * Hkv + h + 1] = koff[b * Hkv + h] + D * spad[b];
    }
    const int64_t tq = std::max<int64_t>(1, TILE_ROWS / G);  // query tokens per work item
    int64_t macs = 0;  // QK and PV multiply-adds of the whole step (upper bound: full key tiles)
    for (int64_t b = 0; b < B; ++b) {
        const int64_t n = qp[b + 1] - qp[b];
        macs += 2 * Hkv * G * D * n * cp[b];
    }
    const bool serial = macs < SERIAL_MACS;
    static thread_local std::vector<float> kbuf;  // per calling thread: engines may run in several
    float* kt = scratch(kbuf, koff[B * Hkv]);
    auto transpose = [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t b = i / Hkv, h = i % Hkv, S = direct[b] ? 0 : cp[b], P = spad[b];
            float* kb = kt + koff[i];
            for (int64_t s0 = 0; s0 < S; s0 += BS) {
                const int64_t blk = tp[b][s0 / BS], n = std::min(BS, S - s0);
                for (int64_t j = 0; j < n; ++j) {
                    const float* src = kd + ((blk * BS + j) * Hkv + h) * D;
                    const int64_t key = s0 + j;
                    float* kdst = kb + (key / KT) * D * KT + key % KT;
                    for (int64_t d = 0; d < D; ++d) kdst[d * KT] = src[d];
                }
            }
            for (int64_t key = S; key < P; ++key)
                for (int64_t d = 0; d < D; ++d) kb[(key / KT) * D * KT + d * KT + key % KT] = 0.f;
        }
    };
    if (koff[B * Hkv] > 0) {  // none when every sequence reads K directly (decodes)
        if (serial) transpose(0, B * Hkv);
        else at::parallel_for(0, B * Hkv, 1, transpose);
    }

    std::vector<Item> items;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t0 = 0, n = qp[b + 1] - qp[b]; t0 < n; t0 += tq)
            for (int64_t h = 0; h < Hkv; ++h) items.push_back({b, h, t0, std::min(n, t0 + tq)});
    const int64_t ni = static_cast<int64_t>(items.size());
    // Dynamic schedule: each thread takes the next item off a shared counter, costliest first (a causal
    // tile's keys grow along its sequence), so a thread the OS deschedules (a loaded machine) holds up
    // at most one item instead of its whole static share; on free cores it splits like the old
    // round-robin. An item's arithmetic does not depend on which thread runs it: outputs are identical.
    std::stable_sort(items.begin(), items.end(), [&](const Item& x, const Item& y) {
        return cp[x.b] - (qp[x.b + 1] - qp[x.b]) + x.t1 > cp[y.b] - (qp[y.b + 1] - qp[y.b]) + y.t1;
    });
    std::atomic<int64_t> next{0};
    const int64_t nt = serial ? 1 : std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), ni));
    auto work = [&](int64_t, int64_t) {
        const int64_t rmax = tq * G;
        std::vector<float> qb(rmax * D), ob(rmax * D), sb(rmax * KT), mb(rmax), lb(rmax);
        std::vector<int64_t> lastb(rmax);
        const float* kr[KT];
        const float* vr[KT];
        for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < ni;) {
            const Item& item = items[it];
            const int64_t b = item.b, h = item.h, S = cp[b], n = qp[b + 1] - qp[b];
            const int64_t R = (item.t1 - item.t0) * G;
            const float* kb = kt + koff[b * Hkv + h];
            for (int64_t t = item.t0; t < item.t1; ++t)
                for (int64_t g = 0; g < G; ++g) {
                    const int64_t r = (t - item.t0) * G + g;
                    const float* src = qd + (qp[b] + t) * qs0 + (h * G + g) * qs1;
                    for (int64_t d = 0; d < D; ++d) qb[r * D + d] = src[d] * static_cast<float>(scale);
                    lastb[r] = S - n + t;
                }
            std::fill(ob.begin(), ob.begin() + R * D, 0.f);
            std::fill(mb.begin(), mb.begin() + R, -std::numeric_limits<float>::infinity());
            std::fill(lb.begin(), lb.begin() + R, 0.f);
            const int64_t kend = S - n + item.t1;  // keys the tile's last row sees
            for (int64_t k0 = 0; k0 < kend; k0 += KT) {
                const int nk = static_cast<int>(std::min<int64_t>(KT, kend - k0));
                for (int j = 0; j < nk; ++j) {
                    const int64_t key = k0 + j;
                    kr[j] = kd + ((tp[b][key / BS] * BS + key % BS) * Hkv + h) * D;
                    vr[j] = kr[j] + half;
                }
                int64_t r = 0;
                if (direct[b]) {
                    score_direct(qb.data(), R, D, kr, nk, sb.data());
                } else {
                    const float* ktile = kb + k0 * D;  // tile k0 / KT: [D][KT]
                    for (; r + MR <= R; r += MR) score_tile<MR>(qb.data() + r * D, D, ktile, sb.data() + r * KT);
                    for (; r + 4 <= R; r += 4) score_tile<4>(qb.data() + r * D, D, ktile, sb.data() + r * KT);
                    for (; r < R; ++r) score_tile<1>(qb.data() + r * D, D, ktile, sb.data() + r * KT);
                }
                for (r = 0; r < R; ++r) {
                    const float alpha = softmax_row(sb.data() + r * KT, nk, k0, lastb[r], mb[r], lb[r]);
                    if (alpha != 1.f)
                        for (int64_t d = 0; d < D; ++d) ob[r * D + d] *= alpha;
                }
                for (r = 0; r + 4 <= R; r += 4) pv_tile<4>(sb.data() + r * KT, vr, nk, D, ob.data() + r * D);
                for (; r < R; ++r) pv_tile<1>(sb.data() + r * KT, vr, nk, D, ob.data() + r * D);
            }
            for (int64_t t = item.t0; t < item.t1; ++t)
                for (int64_t g = 0; g < G; ++g) {
                    const int64_t r = (t - item.t0) * G + g;
                    const float inv = 1.f / lb[r];
                    float* dst = od + ((qp[b] + t) * Hq + h * G + g) * D;
                    for (int64_t d = 0; d < D; ++d) dst[d] = ob[r * D + d] * inv;
                }
        }
    };
    if (nt == 1) work(0, 1);
    else at::parallel_for(0, nt, 1, work);
    return out;
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
        for (int64_t t = t0; t < t1; ++t) {
            const float* xr = xp + t * xs;
            float* src;
            if (has_res) {
                src = rp + t * H;
                for (int64_t i = 0; i < H; ++i) src[i] += xr[i];
            } else {
                src = const_cast<float*>(xr);
            }
            double ss = 0.0;
            float acc[16] = {0};
            int64_t i = 0;
            for (; i + 16 <= H; i += 16)
                for (int j = 0; j < 16; ++j) acc[j] += src[i + j] * src[i + j];
            for (int j = 0; j < 16; ++j) ss += acc[j];
            for (; i < H; ++i) ss += src[i] * src[i];
            const float inv = 1.0f / std::sqrt(static_cast<float>(ss / H) + static_cast<float>(eps));
            float* orow = op + t * H;
            for (int64_t k = 0; k < H; ++k) orow[k] = src[k] * inv * wp[k];
        }
    });
    return {out, has_res ? residual : x};
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
        for (int64_t t = t0; t < t1; ++t) {
            const float* c = cp + t * half;
            const float* s = sp + t * half;
            for (int64_t h = 0; h < heads; ++h) {
                float* x1 = xp + t * row + h * D;
                float* x2 = x1 + half;
                for (int64_t i = 0; i < half; ++i) {
                    const float a = x1[i], b = x2[i];
                    x1[i] = a * c[i] - b * s[i];
                    x2[i] = b * c[i] + a * s[i];
                }
            }
        }
    });
}

torch::Tensor silu_mul(torch::Tensor gu) {
    TORCH_CHECK(gu.dim() == 2 && gu.scalar_type() == torch::kFloat32 && gu.is_contiguous(),
                "gate_up must be contiguous float32 [T, 2I]");
    const int64_t T = gu.size(0), I = gu.size(1) / 2;
    auto out = torch::empty({T, I}, gu.options());
    const float* gp = gu.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            const float* g = gp + t * 2 * I;
            const float* u = g + I;
            float* o = op + t * I;
            int64_t i = 0;
#if defined(__AVX512F__)
            for (; i + 16 <= I; i += 16) {
                const __m512 x = _mm512_loadu_ps(g + i);
                const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
                const __m512 sg = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
                _mm512_storeu_ps(o + i, _mm512_mul_ps(sg, _mm512_loadu_ps(u + i)));
            }
#elif defined(HK_AVX2)
            for (; i + 8 <= I; i += 8) {
                const __m256 x = _mm256_loadu_ps(g + i);
                const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
                const __m256 sg = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.f), e));
                _mm256_storeu_ps(o + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
            }
#endif
            for (; i < I; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
        }
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
