// The attention kernel's tile micro-kernels (see csrc/cpu_kernels.cpp's header for the algorithm): scores of a
// query tile against a key tile, P V into an output tile, and a row's online softmax; AVX-512, AVX2 + FMA or
// plain loops. Built after csrc/cpu_kernels.cpp (its includes, HK_AVX2, exp16_core / exp16 / exp8_core / exp8), before csrc/cpu_attention.cpp.

namespace {

constexpr int KT = 32;        // keys per tile
#if defined(HK_AVX2)
constexpr int MR = 12;        // query rows per score micro-tile (AVX2: two 6-row blocks)
constexpr int PR = 12;        // query rows per P V tile (AVX2: two 6-row blocks)
#else
constexpr int MR = 8;         // query rows per score micro-tile
constexpr int PR = 4;         // query rows per P V tile
#endif
constexpr int LANE_SUMS = 16; // floats per row of the fused softmax's lane sums (AVX-512's 16; AVX2 uses 8)
#if defined(HK_AVX2)
constexpr float kFusedUnit = kLog2e;  // the fused softmax's scores in log2 units (softmax_row8: exp2_8, no multiply)
#else
constexpr float kFusedUnit = 1.f;
#endif

#if defined(HK_AVX2)

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

// K rows src, src + rs, ..., src + 7 rs (D floats each) into 8 columns of a transposed key tile: dst[d * KT + j] =
// src[j * rs + d], 8 x 8 blocks transposed in registers (the scalar loop's 64 strided stores per block took ~3% of a
// 128-over-2,048 attention call, Zen 3)
inline void transpose8_rows(const float* src, int64_t rs, int64_t D, float* dst) {
    for (int64_t d = 0; d < D; d += 8) {
        __m256 r[8], t[8], u[8];
        for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src + j * rs + d);
        for (int j = 0; j < 8; j += 2) {
            t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
            t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
        }
        for (int j = 0; j < 8; j += 4) {
            u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
            u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
            u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
            u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
        }
        for (int k = 0; k < 4; ++k) {
            _mm256_storeu_ps(dst + (d + k) * KT, _mm256_permute2f128_ps(u[k], u[k + 4], 0x20));
            _mm256_storeu_ps(dst + (d + k + 4) * KT, _mm256_permute2f128_ps(u[k], u[k + 4], 0x31));
        }
    }
}

// R <= 6 rows x 16 keys of S = Q Kt: 2R accumulators (12 of AVX2's 16 registers at 6 rows, enough independent FMA
// chains to cover two pipes of 4-cycle FMAs), two K vectors loaded per d and shared by the rows
template <int R>
inline void score_block(const float* q, int64_t D, const float* kt, float* s) {
    static_assert(R <= 6, "2R accumulators + 2 K vectors + a broadcast within 16 registers");
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

// R <= 6 rows x 16 output columns of O += P V: 2R accumulators (as score_block), two V vectors loaded per key
template <int R>
inline void pv_block(const float* p, const float* const* v, int nk, int64_t d0, int64_t D, float* o) {
    static_assert(R <= 6, "2R accumulators + 2 V vectors + a broadcast within 16 registers");
    __m256 c[R][2];
    for (int i = 0; i < R; ++i)
        for (int u = 0; u < 2; ++u) c[i][u] = _mm256_loadu_ps(o + i * D + d0 + 8 * u);
    for (int j = 0; j < nk; ++j) {
        const float* vr = v[j] + d0;
        const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
        for (int i = 0; i < R; ++i) {
            const __m256 a = _mm256_broadcast_ss(p + i * KT + j);
            c[i][0] = _mm256_fmadd_ps(a, v0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(a, v1, c[i][1]);
        }
    }
    for (int i = 0; i < R; ++i)
        for (int u = 0; u < 2; ++u) _mm256_storeu_ps(o + i * D + d0 + 8 * u, c[i][u]);
}
#endif

#if defined(__AVX512F__)
// c[M][2] = Q[M][D] Kt[D][KT] in registers (Q rows at stride D, Kt rows at stride KT): the one AVX-512 score loop,
// which score_tile stores and score_softmax_tile feeds straight into the softmax
template <int M>
inline void score_regs(const float* q, int64_t D, const float* kt, __m512 (&c)[M][2]) {
    for (int i = 0; i < M; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
        const __m512 b0 = _mm512_loadu_ps(kt + d * KT), b1 = _mm512_loadu_ps(kt + d * KT + 16);
        for (int i = 0; i < M; ++i) {
            const __m512 a = _mm512_set1_ps(q[i * D + d]);
            c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
        }
    }
}
#endif

// S[M][KT] = Q[M][D] Kt[D][KT] (Q rows at stride D, Kt rows at stride KT)
template <int M>
inline void score_tile(const float* q, int64_t D, const float* kt, float* s) {
#if defined(__AVX512F__)
    __m512 c[M][2];
    score_regs<M>(q, D, kt, c);
    for (int i = 0; i < M; ++i) {
        _mm512_storeu_ps(s + i * KT, c[i][0]);
        _mm512_storeu_ps(s + i * KT + 16, c[i][1]);
    }
#elif defined(HK_AVX2)
    static_assert(KT == 32, "two halves of 16 keys");
    for (int h = 0; h < KT; h += 16) {
        int i = 0;
        for (; i + 6 <= M; i += 6) score_block<6>(q + i * D, D, kt + h, s + i * KT + h);
        for (; i + 4 <= M; i += 4) score_block<4>(q + i * D, D, kt + h, s + i * KT + h);
        for (; i < M; ++i) score_block<1>(q + i * D, D, kt + h, s + i * KT + h);
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
    for (; d0 + 16 <= D; d0 += 16) {
        int i = 0;
        for (; i + 6 <= M; i += 6) pv_block<6>(p + i * KT, v, nk, d0, D, o + i * D);
        for (; i + 4 <= M; i += 4) pv_block<4>(p + i * KT, v, nk, d0, D, o + i * D);
        for (; i < M; ++i) pv_block<1>(p + i * KT, v, nk, d0, D, o + i * D);
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

#if defined(__AVX512F__)
// One row's online-softmax update from its two score vectors s0, s1 (keys k0 .. k0+31; m0 / m1: the visible lanes,
// hidden ones read -inf): the max's horizontal reduction and exp(m_old - m_new) run only when a score exceeds the
// running max m (the output row o[D] and the lane sums l16 then rescaled), P = exp(s - m) (0 for hidden keys) stored
// to s[32] and added to l16. softmax_row16 (masked loads) and score_softmax_tile's whole-tile rows (scores in
// registers, full masks) both call it: one copy of the arithmetic, so both give the same bits.
inline void softmax16_regs(__m512 s0, __m512 s1, __mmask16 m0, __mmask16 m1, float* s, float& m, float* l16, float* o,
                           int64_t D) {
    const __m512 mx = _mm512_max_ps(s0, s1);
    __m512 vm = _mm512_set1_ps(m);
    if (_mm512_cmp_ps_mask(mx, vm, _CMP_GT_OQ)) {  // a new maximum
        const float mn = _mm512_reduce_max_ps(mx);
        if (m != -INFINITY) {  // before the first visible tile o and l16 are zero: nothing to rescale
            const __m512 alpha = _mm512_set1_ps(std::exp(m - mn));
            for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), alpha));
            _mm512_storeu_ps(l16, _mm512_mul_ps(_mm512_loadu_ps(l16), alpha));
        }
        m = mn;
        vm = _mm512_set1_ps(mn);
    }
    const __m512 e0 = _mm512_maskz_mov_ps(m0, exp16_core(_mm512_sub_ps(s0, vm)));
    const __m512 e1 = _mm512_maskz_mov_ps(m1, exp16_core(_mm512_sub_ps(s1, vm)));
    _mm512_storeu_ps(s, e0);
    _mm512_storeu_ps(s + 16, e1);
    _mm512_storeu_ps(l16, _mm512_add_ps(_mm512_loadu_ps(l16), _mm512_add_ps(e0, e1)));
}
#endif

#if defined(__AVX512F__)
// Row r's online softmax over one score tile s[KT] (keys k0 .. k0+KT-1, visible while k <= last), as softmax_row
// computes it, with the sum kept as 16 lane sums l16[16] (reduced once, after the last tile) and the output row
// o[D] rescaled here when the max rises: the max's horizontal reduction and exp(m_old - m_new) run only when a
// score exceeds the running max m, which past the first tiles is rare. s becomes P = exp(s - m), 0 for hidden keys.
// One difference in P: a score more than 87.3 below the running max gives 0 or a denormal here (exp16_core,
// unclamped), 1.2e-38 in softmax_row (exp16 and exp8 clamp): either is below the last bit of the row's sum,
// which holds the max's exp(0) = 1.
inline void softmax_row16(float* s, int64_t k0, int64_t last, float& m, float* l16, float* o, int64_t D) {
    static_assert(KT == 32, "two vectors per tile");
    const int64_t vis = std::min<int64_t>(KT, std::max<int64_t>(0, last - k0 + 1));
    if (vis == 0) {
        _mm512_storeu_ps(s, _mm512_setzero_ps());
        _mm512_storeu_ps(s + 16, _mm512_setzero_ps());
        return;
    }
    const uint32_t bits = vis >= KT ? 0xffffffffu : ((1u << vis) - 1u);
    const __mmask16 m0 = static_cast<__mmask16>(bits & 0xffff), m1 = static_cast<__mmask16>(bits >> 16);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512 s0 = _mm512_mask_loadu_ps(ninf, m0, s), s1 = _mm512_mask_loadu_ps(ninf, m1, s + 16);
    softmax16_regs(s0, s1, m0, m1, s, m, l16, o, D);
}
// M query rows against one transposed key tile (keys k0 .. k0+KT-1), scored and run through the online softmax in
// one pass: a row that sees the whole tile (k0 + KT - 1 <= last[i]) hands its score registers (score_regs) to
// softmax16_regs, softmax_row16's own arithmetic (no masked load, no store and reload of its scores); a diagonal row
// stores them and calls softmax_row16. s[M][KT] becomes P, m / l16 / o as softmax_row16 leaves them: the same bits.
// Measured in one process, one thread, CPU time (twenty-second session): see history/engine.md.
template <int M>
inline void score_softmax_tile(const float* q, int64_t D, const float* kt, float* s, int64_t k0, const int64_t* last,
                               float* m, float* l16, float* o) {
    __m512 c[M][2];
    score_regs<M>(q, D, kt, c);
    for (int i = 0; i < M; ++i) {
        float* si = s + i * KT;
        if (last[i] < k0 + KT - 1) {  // the diagonal: some keys hidden
            _mm512_storeu_ps(si, c[i][0]);
            _mm512_storeu_ps(si + 16, c[i][1]);
            softmax_row16(si, k0, last[i], m[i], l16 + i * LANE_SUMS, o + i * D, D);
        } else {
            softmax16_regs(c[i][0], c[i][1], 0xffff, 0xffff, si, m[i], l16 + i * LANE_SUMS, o + i * D, D);
        }
    }
}
#endif

#if defined(HK_AVX2)
// softmax_row16 on 8 lanes (AVX2), in log2 units: row r's online softmax over one score tile s[KT] (keys k0 ..
// k0+KT-1, visible while k <= last; scores of queries scaled by log2 e as well, kFusedUnit): the max's horizontal
// reduction and 2^(m_old - m_new) only when a score exceeds the running max m (the output row o[D] and the 8 lane
// sums l8 then rescaled), P = 2^(s - m) (exp2_8 on s - m clamped at -125; 0 for hidden keys) stored to s and added to
// l8; a row that sees the whole tile skips the masks. The sum is kept in 8 lanes (reduced once, after the last tile).
inline void softmax_row8(float* s, int64_t k0, int64_t last, float& m, float* l8, float* o, int64_t D) {
    static_assert(KT == 32, "four vectors per tile");
    const int64_t vis = std::min<int64_t>(KT, std::max<int64_t>(0, last - k0 + 1));
    if (vis == 0) {
        std::fill(s, s + KT, 0.f);
        return;
    }
    __m256 sv[4], vmask[4];
    if (vis == KT) {
        for (int u = 0; u < 4; ++u) sv[u] = _mm256_loadu_ps(s + 8 * u);
    } else {  // hidden keys (j >= vis) read as -inf
        const __m256 ninf = _mm256_set1_ps(-INFINITY);
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (int u = 0; u < 4; ++u) {
            vmask[u] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(vis) - 8 * u), lane));
            sv[u] = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * u), vmask[u]);
        }
    }
    const __m256 mx = _mm256_max_ps(_mm256_max_ps(sv[0], sv[1]), _mm256_max_ps(sv[2], sv[3]));
    __m256 vm = _mm256_set1_ps(m);
    if (_mm256_movemask_ps(_mm256_cmp_ps(mx, vm, _CMP_GT_OQ))) {  // a new maximum
        const float mn = hmax8(mx);
        if (m != -INFINITY) {  // before the first visible tile o and l8 are zero: nothing to rescale
            const __m256 alpha = _mm256_set1_ps(std::exp2(m - mn));
            for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), alpha));
            _mm256_storeu_ps(l8, _mm256_mul_ps(_mm256_loadu_ps(l8), alpha));
        }
        m = mn;
        vm = _mm256_set1_ps(mn);
    }
    const __m256 lo = _mm256_set1_ps(kExp2Min);
    __m256 e[4];
    for (int u = 0; u < 4; ++u) {
        e[u] = exp2_8(_mm256_max_ps(_mm256_sub_ps(sv[u], vm), lo));
        if (vis < KT) e[u] = _mm256_and_ps(vmask[u], e[u]);
        _mm256_storeu_ps(s + 8 * u, e[u]);
    }
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(e[0], e[1]), _mm256_add_ps(e[2], e[3]));
    _mm256_storeu_ps(l8, _mm256_add_ps(_mm256_loadu_ps(l8), sum));
}

// M query rows against one transposed key tile (keys k0 .. k0+KT-1): scored (score_tile), then each row through
// softmax_row8; s[M][KT] becomes P, m / l8 / o as softmax_row8 leaves them (AVX-512: the one-pass tile above)
template <int M>
inline void score_softmax_tile(const float* q, int64_t D, const float* kt, float* s, int64_t k0, const int64_t* last,
                               float* m, float* l8, float* o) {
    score_tile<M>(q, D, kt, s);
    for (int i = 0; i < M; ++i) softmax_row8(s + i * KT, k0, last[i], m[i], l8 + i * LANE_SUMS, o + i * D, D);
}
#endif

#if defined(HK_AVX2)
constexpr int64_t DIRECT_MAX_D = 256;  // head dims the AVX2 direct scores take (their K tile on the stack: 32 KB)

// 8 key rows' floats [d, d + 8) (k[j] + d, j < 8) into kt[(d + i) * KT + j0 + j]: the 8 x 8 transpose
inline void transpose8_keys(const float* const* k, int64_t d, float* kt, int j0) {
    const __m256 r0 = _mm256_loadu_ps(k[0] + d), r1 = _mm256_loadu_ps(k[1] + d), r2 = _mm256_loadu_ps(k[2] + d),
                 r3 = _mm256_loadu_ps(k[3] + d), r4 = _mm256_loadu_ps(k[4] + d), r5 = _mm256_loadu_ps(k[5] + d),
                 r6 = _mm256_loadu_ps(k[6] + d), r7 = _mm256_loadu_ps(k[7] + d);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                 t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    float* o = kt + d * KT + j0;
    _mm256_storeu_ps(o + 0 * KT, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(o + 1 * KT, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(o + 2 * KT, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(o + 3 * KT, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(o + 4 * KT, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(o + 5 * KT, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(o + 6 * KT, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(o + 7 * KT, _mm256_permute2f128_ps(u3, u7, 0x31));
}

// RM rows' scores against NV groups of 8 keys of the transposed tile kt (from key j0): lanes are keys, and each
// lane adds its rounded products q[d] k[d] in order d = 0, 1, ..., from 0: the plain loop's sum, bit for bit
template <int RM, int NV>
inline void score_lanes(const float* q, int64_t D, const float* kt, int j0, float* s) {
    __m256 acc[RM][NV];
    for (int i = 0; i < RM; ++i)
        for (int u = 0; u < NV; ++u) acc[i][u] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
        __m256 kv[NV];
        for (int u = 0; u < NV; ++u) kv[u] = _mm256_loadu_ps(kt + d * KT + j0 + 8 * u);
        for (int i = 0; i < RM; ++i) {
            const __m256 qv = _mm256_broadcast_ss(q + i * D + d);
            for (int u = 0; u < NV; ++u) {
                __m256 p = _mm256_mul_ps(qv, kv[u]);
                __asm__("" : "+x"(p));  // the product rounded before the add: the compiler may not fuse them (FMA)
                acc[i][u] = _mm256_add_ps(acc[i][u], p);
            }
        }
    }
    for (int i = 0; i < RM; ++i)
        for (int u = 0; u < NV; ++u) _mm256_storeu_ps(s + i * KT + j0 + 8 * u, acc[i][u]);
}

// score_direct's AVX2 path (D a multiple of 8, at most DIRECT_MAX_D): the tile's keys transposed once into kt
// (a short last group reads a zero row), then the rows 4 at a time, two key groups a pass. The plain loop's sum is
// a chain of adds per (row, key) (~64 dependent adds at D = 64, its products' reduction scalar): it was ~3/4 of a
// decode step's attention on Zen 3 (perf, dummy:smollm2-135m b8), about as much as w8a8's layer GEMMs.
inline void score_direct_avx2(const float* q, int64_t R, int64_t D, const float* const* k, int nk, float* s) {
    alignas(32) float kt[DIRECT_MAX_D * KT];
    static const float zeros[DIRECT_MAX_D] = {};
    const int ng = (nk + 7) / 8;
    for (int g = 0; g < ng; ++g) {
        const float* rows[8];
        for (int j = 0; j < 8; ++j) rows[j] = g * 8 + j < nk ? k[g * 8 + j] : zeros;
        for (int64_t d = 0; d < D; d += 8) transpose8_keys(rows, d, kt, g * 8);
    }
    // s has KT floats a row: a short last group's lanes past nk get 0 there, which no reader takes (the softmax
    // masks keys past nk, P V reads nk)
    auto rows_of = [&](auto rm, int64_t r) {
        constexpr int RM = decltype(rm)::value;
        int g = 0;
        for (; g + 2 <= ng; g += 2) score_lanes<RM, 2>(q + r * D, D, kt, g * 8, s + r * KT);
        for (; g < ng; ++g) score_lanes<RM, 1>(q + r * D, D, kt, g * 8, s + r * KT);
    };
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) rows_of(std::integral_constant<int, 4>{}, r);
    for (; r + 2 <= R; r += 2) rows_of(std::integral_constant<int, 2>{}, r);
    for (; r < R; ++r) rows_of(std::integral_constant<int, 1>{}, r);
}
#endif

// S[r][j] = Q[r] . K[j] for R rows and nk key rows (k[j], in the cache): few-row items (decodes)
// read K where it lies instead of transposing it first
inline void score_direct(const float* q, int64_t R, int64_t D, const float* const* k, int nk, float* s) {
#if defined(HK_AVX2)
    if (D % 8 == 0 && D <= DIRECT_MAX_D) {
        score_direct_avx2(q, R, D, k, nk, s);
        return;
    }
#endif
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
// p[KT] = exp(s - m_new) (0 for hidden keys), returns alpha = exp(m_old - m_new), updates m, l. Its exp clamps
// (exp16 / exp8): a score more than 87.3 below m_new gives 1.2e-38, where softmax_row16 gives 0 or a denormal.
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

}  // namespace
