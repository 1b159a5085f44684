// W8A8's few-row int16 kernel for AVX2 without VNNI (`int8.gemv_kernel()` "i16"): int8_gemv.cpp's gemv and team
// entries run it on a weight blocked with depth 2 (`int8.block_weight(w_t, depth=2)`, [Nb, Kp, 16, 2]). int8_cpu.py
// appends this file after int8_cpu.cpp and int8_team.h, before int8_gemv.cpp.
//
// Why: on AVX2 the int8 loop multiplies |a| by sign(a) w (vpmaddubsw, int16 pair sums) then widens by vpmaddwd x 1:
// two multiply-port ops per 32 products, for each of W8A8's two activation levels, the multiply work of float FMAs.
// Here each token row is quantized ONCE to 14 bits (per-row symmetric scale, |q| <= 8191), the weight's int8 is
// widened to int16 (vpmovsxbw, once per pass, shared by the pass's rows), a row's k pair broadcast (vpbroadcastd),
// and one vpmaddwd does 16 products: 1 multiply op per 16 real products, no sign / abs. Zen 3, one thread, CPU time,
// a standalone copy on SmolLM2's shapes (/work/notes/s25/w8/mb.cpp): 8 tokens 2.25-2.3x the int8 loop's 16 rows (75-79
// against 34 GMAC/s), one token 1.65x. The 14-bit row's rounding error (max|x| / 16382) is ~4x the two-level int8's
// (its second scale follows the residual) and 64x finer than one int8 level.
//
// Layout: per k pair, 32 bytes: channels 0-7 then 8-15, each channel's two k (int8). Activations: a row's int16 q as
// int32 pairs a [M][Kp] (zero padded). int32 sums are exact up to kPairChunk pairs (2048 k: 1024 x 2 x 8191 x 127 <
// 2^31); longer K is summed in chunks, each converted to float and added (llama3-8b's down_proj: 14336 = 7 chunks).

constexpr float kQ14 = 8191.0f;
constexpr int64_t kPairChunk = 1024;

// One row x [K] (times inv_smooth, or null) -> int16 pairs a [Kp] (zero padded), its scale: x * (1 / s) rounded
// half to even, s = max|x| / 8191, the operations and order of quantize_row's first level.
static void quantize_pairs_row(const float* x, const float* sp, int64_t K, int64_t Kp, int32_t* a, float* s,
                               std::vector<float>& r) {
    r.resize(K);
    if (sp) {
        for (int64_t k = 0; k < K; ++k) r[k] = x[k] * sp[k];
    } else {
        std::copy(x, x + K, r.begin());
    }
    float amax = 0.f;
    int64_t k = 0;
#if defined(__AVX2__)
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(r.data() + k), absmask));
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (float v : lanes) amax = std::max(amax, v);
#endif
    for (; k < K; ++k) amax = std::max(amax, std::fabs(r[k]));
    const float scale = std::max(amax, 1e-30f) / kQ14;
    const float inv = 1.0f / scale;
    int16_t* q = reinterpret_cast<int16_t*>(a);
    k = 0;
#if defined(__AVX2__)
    const __m256 vinv = _mm256_set1_ps(inv);
    for (; k + 16 <= K; k += 16) {
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(r.data() + k), vinv),
                                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(r.data() + k + 8), vinv),
                                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        // packs works per 128-bit lane: [i0 lo, i1 lo, i0 hi, i1 hi] -> 64-bit lanes 0, 2, 1, 3
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8));
    }
#endif
    for (; k < K; ++k) q[k] = static_cast<int16_t>(std::nearbyint(r[k] * inv));
    std::fill(q + K, q + 2 * Kp, int16_t{0});
    *s = scale;
}

static void quantize_pairs(const float* x, const float* sp, int64_t M, int64_t K, int64_t Kp, int32_t* a, float* s) {
    std::vector<float> r;
    for (int64_t m = 0; m < M; ++m) quantize_pairs_row(x + m * K, sp, K, Kp, a + m * Kp, s + m, r);
}

#if defined(__AVX2__)
// How far ahead pair_dot_one fetches the weight (one stream: a block's pairs, then the next block's): 4 KiB. At 512 bytes
// (pair_dot_two's, kept: its one- and two-token steps read no faster with 4 KiB) a w8a8 dummy:tiny b8 decode step took
// 1.02-1.21x its CPU time with 4 KiB (one thread, three engines in one process, 7 interleaved rounds, load 3.7-4.1;
// 8 KiB read the same as 4 KiB): at 8 rows a 16-channel block of 512 k is read in ~1 us, the DRAM stream's latency
// needs more than 512 bytes in flight.
constexpr int64_t kFetchAhead = 4096;

// G rows' pairs [0, P) against one 16-channel block's: out[g] its 16 int32 sums
template <int G>
static inline void pair_dot_one(const int32_t* const* a, const int8_t* wb, int64_t P, int32_t (*out)[16]) {
    __m256i acc[G][2];
    for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
    for (int64_t p = 0; p < P; ++p) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + p * 32 + kFetchAhead), _MM_HINT_T0);
        const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + p * 32)));
        const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + p * 32 + 16)));
        for (int g = 0; g < G; ++g) {
            const __m256i av = _mm256_set1_epi32(a[g][p]);
            acc[g][0] = _mm256_add_epi32(acc[g][0], _mm256_madd_epi16(av, w0));
            acc[g][1] = _mm256_add_epi32(acc[g][1], _mm256_madd_epi16(av, w1));
        }
    }
    for (int g = 0; g < G; ++g) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[g]), acc[g][0]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[g] + 8), acc[g][1]);
    }
}
// The same against two consecutive blocks (wb, wb + bstride; out[g], out[ostride + g]), for 1-2 rows: each broadcast
// feeds four vpmaddwd (the int8 loop's block_dot_two, for the same reason: a one-token step reads more per product)
template <int G>
static inline void pair_dot_two(const int32_t* const* a, const int8_t* wb, int64_t bstride, int64_t P,
                                int32_t (*out)[16], int64_t ostride) {
    __m256i acc[G][4];
    for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = _mm256_setzero_si256();
    const int8_t* wb1 = wb + bstride;
    for (int64_t p = 0; p < P; ++p) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + p * 32 + 512), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(wb1 + p * 32 + 512), _MM_HINT_T0);
        const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + p * 32)));
        const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + p * 32 + 16)));
        const __m256i w2 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb1 + p * 32)));
        const __m256i w3 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb1 + p * 32 + 16)));
        for (int g = 0; g < G; ++g) {
            const __m256i av = _mm256_set1_epi32(a[g][p]);
            acc[g][0] = _mm256_add_epi32(acc[g][0], _mm256_madd_epi16(av, w0));
            acc[g][1] = _mm256_add_epi32(acc[g][1], _mm256_madd_epi16(av, w1));
            acc[g][2] = _mm256_add_epi32(acc[g][2], _mm256_madd_epi16(av, w2));
            acc[g][3] = _mm256_add_epi32(acc[g][3], _mm256_madd_epi16(av, w3));
        }
    }
    for (int g = 0; g < G; ++g) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[g]), acc[g][0]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[g] + 8), acc[g][1]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[ostride + g]), acc[g][2]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[ostride + g] + 8), acc[g][3]);
    }
}
#else
template <int G>
static inline void pair_dot_one(const int32_t* const* a, const int8_t* wb, int64_t P, int32_t (*out)[16]) {
    for (int g = 0; g < G; ++g) {
        const int16_t* ag = reinterpret_cast<const int16_t*>(a[g]);
        for (int j = 0; j < 16; ++j) {
            int32_t sum = 0;
            for (int64_t p = 0; p < P; ++p)
                for (int t = 0; t < 2; ++t) sum += static_cast<int32_t>(ag[p * 2 + t]) * wb[p * 32 + j * 2 + t];
            out[g][j] = sum;
        }
    }
}
template <int G>
static inline void pair_dot_two(const int32_t* const* a, const int8_t* wb, int64_t bstride, int64_t P,
                                int32_t (*out)[16], int64_t ostride) {
    pair_dot_one<G>(a, wb, P, out);
    pair_dot_one<G>(a, wb + bstride, P, out + ostride);
}
#endif

// M rows against nblocks (1, or 2 where M <= 2) consecutive blocks, pairs [p0, p0 + P): int32 out[b * M + m]
static void pair_blocks(const int32_t* const* rows, int64_t M, const int8_t* wb, int64_t bstride, int64_t P,
                        int64_t nblocks, int32_t (*out)[16]) {
    if (nblocks == 2) {
        if (M == 2) pair_dot_two<2>(rows, wb, bstride, P, out, M);
        else pair_dot_two<1>(rows, wb, bstride, P, out, M);
        return;
    }
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) pair_dot_one<4>(rows + m, wb, P, out + m);
    for (; m + 2 <= M; m += 2) pair_dot_one<2>(rows + m, wb, P, out + m);
    for (; m < M; ++m) pair_dot_one<1>(rows + m, wb, P, out + m);
}

// Output channels [n0, n1) from the rows a [M][Kp] (scales s), on the calling thread, into y (channel n0 of row m at
// y[m * ldy]): y[m, n] = (sum over K chunks of float(int32 chunk sum)) * s[m] * w_scale[n], in that order. `dots`
// (not null: pair_dots, the test entry) takes each chunk's int32 sums instead, [M][N] int64 added to.
static void pair_range(const int32_t* a, int64_t M, int64_t Kp, const int8_t* wp, const float* s, const float* wsp,
                       int64_t N, float* y, int64_t ldy, int64_t n0, int64_t n1, int64_t* dots = nullptr) {
    if (M == 0) return;  // a 0-row step: nothing to write (a pass would read row pointers never set)
    constexpr int64_t kRows = HK_GEMV_ROWS;
    int32_t acc_s[2 * kRows * 16];
    float sum_s[2 * kRows * 16];
    const int32_t* rows_s[kRows];
    std::vector<int32_t> acc_h;
    std::vector<float> sum_h;
    std::vector<const int32_t*> rows_h;
    int32_t* acc = acc_s;
    float* sum = sum_s;
    const int32_t** rows = rows_s;
    if (M > kRows) {
        acc_h.resize(2 * M * 16), sum_h.resize(2 * M * 16), rows_h.resize(M);
        acc = acc_h.data(), sum = sum_h.data(), rows = rows_h.data();
    }
    auto out = reinterpret_cast<int32_t (*)[16]>(acc);
    const int64_t b0 = n0 / 16, b1 = (n1 + 15) / 16, step = M <= 2 ? 2 : 1, bstride = Kp * 32;
    for (int64_t nb = b0; nb < b1; nb += step) {
        const int64_t nblocks = std::min<int64_t>(step, b1 - nb), cells = nblocks * M * 16;
        const int8_t* wbp = wp + nb * bstride;
        std::fill(sum, sum + cells, 0.f);
        for (int64_t p0 = 0; p0 < Kp || p0 == 0; p0 += kPairChunk) {
            const int64_t P = std::min(kPairChunk, Kp - p0);
            for (int64_t m = 0; m < M; ++m) rows[m] = a + m * Kp + p0;
            pair_blocks(rows, M, wbp + p0 * 32, bstride, P, nblocks, out);
            for (int64_t i = 0; i < cells; ++i) sum[i] += static_cast<float>(acc[i]);
            if (dots) {
                for (int64_t b = 0; b < nblocks; ++b)
                    for (int64_t m = 0; m < M; ++m)
                        for (int64_t j = 0; j < 16 && (nb + b) * 16 + j < N; ++j)
                            dots[m * N + (nb + b) * 16 + j] += acc[(b * M + m) * 16 + j];
            }
        }
        if (dots) continue;
        for (int64_t b = 0; b < nblocks; ++b) {
            const int64_t c0 = (nb + b) * 16, lo = std::max(c0, n0), hi = std::min({c0 + 16, n1, N});
            for (int64_t m = 0; m < M; ++m) {
                const float* sr = sum + (b * M + m) * 16;
                float* yr = y + m * ldy - n0;
                int64_t n = lo;
#if defined(__AVX2__)
                const __m256 sm = _mm256_set1_ps(s[m]);
                for (; n + 8 <= hi; n += 8)
                    _mm256_storeu_ps(yr + n, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(sr + n - c0), sm),
                                                           _mm256_loadu_ps(wsp + n)));
#endif
                for (; n < hi; ++n) yr[n] = sr[n - c0] * s[m] * wsp[n];
            }
        }
    }
}

static void check_pairs_weight(const torch::Tensor& wb, int64_t K, int64_t N) {
    TORCH_CHECK(wb.dim() == 4 && wb.scalar_type() == torch::kInt8 && wb.is_contiguous() && wb.size(2) == 16 &&
                wb.size(3) == 2 && wb.size(1) * 2 >= K && wb.size(0) * 16 >= N,
                "a depth-2 weight must be contiguous int8 [>= N/16, >= K/2, 16, 2]");
}

// gemv on a depth-2 weight: y [M, N] ~= x [M, K] W^T, x quantized to 14 bits per row (gemv checked x)
static torch::Tensor gemv_pairs(const torch::Tensor& x, const torch::Tensor& sm, const torch::Tensor& wb,
                                const torch::Tensor& w_scale) {
    const int64_t M = x.size(0), K = x.size(1), N = w_scale.numel(), Kp = wb.size(1);
    check_pairs_weight(wb, K, N);
    std::vector<int32_t> a(M * Kp);
    std::vector<float> s(M);
    quantize_pairs(x.data_ptr<float>(), sm.numel() ? sm.data_ptr<float>() : nullptr, M, K, Kp, a.data(), s.data());
    auto y = torch::empty({M, N}, torch::kFloat32);
    float* yp = y.data_ptr<float>();
    const int8_t* wp = wb.data_ptr<int8_t>();
    auto wsc = w_scale.contiguous();
    const float* wsp = wsc.data_ptr<float>();
    // ~1M multiply-adds a chunk at least, in whole pairs of blocks (the 1-2-row passes take two): any thread count
    // splits at the same block boundaries, and each block's sums do not depend on the split
    const int64_t Nb = (N + 15) / 16, grain = std::max<int64_t>(8, (1 << 20) / std::max<int64_t>(1, 16 * Kp * 2 * M));
    at::parallel_for(0, (Nb + 1) / 2, grain / 2, [&](int64_t p0, int64_t p1) {
        const int64_t n0 = p0 * 32, n1 = std::min(N, p1 * 32);
        pair_range(a.data(), M, Kp, wp, s.data(), wsp, N, yp + n0, N, n0, n1);
    });
    return y;
}

// The test entry: the int16 rows q [M, K] against a depth-2 weight, each row's exact sums int64 [M, N] (the kernel's
// int32 chunk sums added in int64)
torch::Tensor pair_dots(torch::Tensor q, torch::Tensor wb, int64_t N) {
    TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kInt16, "q must be int16 [M, K]");
    TORCH_CHECK(q.numel() == 0 || q.abs().max().item<int64_t>() <= static_cast<int64_t>(kQ14),
                "q must lie in [-8191, 8191]");
    const int64_t M = q.size(0), K = q.size(1), Kp = wb.size(1);
    check_pairs_weight(wb, K, N);
    auto padded = torch::zeros({M, 2 * Kp}, torch::kInt16);
    padded.slice(1, 0, K).copy_(q);
    auto dots = torch::zeros({M, N}, torch::kInt64);
    pair_range(reinterpret_cast<const int32_t*>(padded.data_ptr<int16_t>()), M, Kp, wb.data_ptr<int8_t>(), nullptr,
               nullptr, N, nullptr, 0, 0, N, dots.data_ptr<int64_t>());
    return dots;
}
