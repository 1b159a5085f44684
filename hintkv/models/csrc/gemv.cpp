// Few-row float32 GEMMs on a CPU (gemv_cpu.py): y [M, N] = x [M, K] W^T (+ b) for M <= 12 rows (decode
// steps, short verifies), W [N, K] read where it lies, row-major.
//
// Such a step reads every weight once and does little arithmetic per byte, so it is bound by memory:
// MKL's packed GEMM read dummy:tiny's layer weights at ~9 GB/s where its LM head (one 100 MB GEMM)
// reached ~18, the difference being per-call ramp-up. Here blocks of weight rows are dotted with all
// x rows at once (R x M independent FMA chains; x stays in L1), and each block prefetches the block
// PREFETCH_ROWS rows on, because hardware prefetchers stop at every 4 KiB page.
// Vector code: AVX-512 (16 floats a register), else AVX2 + FMA (8; a CPU without AVX-512, e.g. AMD Zen 1, ran
// the plain loop: one FMA chain per dot, dummy:tiny's qkv at one row 751 us), else a plain loop.
// gemv(x [M, K] contiguous, w [N, K] contiguous, b [N] or empty) -> y [M, N], all float32.
// torch: cpu_ext.HEADERS, put first when it is built
#include <ATen/Parallel.h>
#include <cstdint>
#include <string>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t PREFETCH_ROWS = 16;

// y[i * ldy + r] = x_i . w_r for R weight rows and M x rows (both of K values, row stride K)
template <int R, int M>
inline void dots(const float* x, int64_t K, const float* w, float* y, int64_t ldy) {
#if defined(__AVX512F__)
    __m512 c[R][M];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) c[r][i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < K; d += 16) {
        const __mmask16 m = K - d >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - d)) - 1);
        __m512 xv[M];
        for (int i = 0; i < M; ++i) xv[i] = _mm512_maskz_loadu_ps(m, x + i * K + d);
        for (int r = 0; r < R; ++r) {
            _mm_prefetch(reinterpret_cast<const char*>(w + (r + PREFETCH_ROWS) * K + d), _MM_HINT_T0);
            const __m512 wv = _mm512_maskz_loadu_ps(m, w + r * K + d);
            for (int i = 0; i < M; ++i) c[r][i] = _mm512_fmadd_ps(xv[i], wv, c[r][i]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) y[i * ldy + r] = _mm512_reduce_add_ps(c[r][i]);
#elif defined(__AVX2__) && defined(__FMA__)
    // AVX2 (e.g. AMD Zen 1, no AVX-512): 8 floats a register, the tail past the last 8 in scalar
    __m256 c[R][M];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) c[r][i] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 8 <= K; d += 8) {
        __m256 xv[M];
        for (int i = 0; i < M; ++i) xv[i] = _mm256_loadu_ps(x + i * K + d);
        for (int r = 0; r < R; ++r) {
            if (d % 16 == 0)  // one prefetch per 64-byte line
                _mm_prefetch(reinterpret_cast<const char*>(w + (r + PREFETCH_ROWS) * K + d), _MM_HINT_T0);
            const __m256 wv = _mm256_loadu_ps(w + r * K + d);
            for (int i = 0; i < M; ++i) c[r][i] = _mm256_fmadd_ps(xv[i], wv, c[r][i]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) {
            const __m128 h = _mm_add_ps(_mm256_castps256_ps128(c[r][i]), _mm256_extractf128_ps(c[r][i], 1));
            const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
            float s = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
            for (int64_t e = d; e < K; ++e) s += x[i * K + e] * w[r * K + e];
            y[i * ldy + r] = s;
        }
#else
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) {
            float s = 0.f;
            for (int64_t d = 0; d < K; ++d) s += x[i * K + d] * w[r * K + d];
            y[i * ldy + r] = s;
        }
#endif
}

// every x row against weight rows [r, r + R)
template <int R>
inline void block(const float* x, int64_t M, int64_t K, const float* w, float* y, int64_t N) {
    int64_t i = 0;
    if constexpr (R == 8) {
        if (M == 1) return dots<8, 1>(x, K, w, y, N);  // 8 chains for a lone row
#if defined(__AVX512F__)
        for (; i + 4 <= M; i += 4) {
            dots<4, 4>(x + i * K, K, w, y + i * N, N);
            dots<4, 4>(x + i * K, K, w + 4 * K, y + i * N + 4, N);
        }
#else  // 16 vector registers (AVX2): 4 x 3 accumulators, the x rows and a weight fill them; 4 x 4 would spill
        for (; i + 3 <= M; i += 3) {
            dots<4, 3>(x + i * K, K, w, y + i * N, N);
            dots<4, 3>(x + i * K, K, w + 4 * K, y + i * N + 4, N);
        }
#endif
    }
    for (; i < M; ++i) dots<R, 1>(x + i * K, K, w, y + i * N, N);
}

}  // namespace

// y columns of the weight-row blocks [b0, b1) of w [N, K] (block b: rows 8b .. 8b+7; block N / 8 the rows past the
// last full block), every x row, y's rows ldy apart: what gemv() splits over its threads, and the team step
// (csrc/decode_team.cpp) over its items. Each y value's arithmetic is the same whatever the blocking (16-lane
// partial sums over K in order, then one horizontal sum), so any split gives the same bits.
inline void gemv_blocks(const float* xp, int64_t M, int64_t K, const float* wp, float* yp, int64_t ldy, int64_t N,
                        int64_t b0, int64_t b1) {
    const int64_t nb = N / 8;
    for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t r = blk * 8;
        if (blk < nb) block<8>(xp, M, K, wp + r * K, yp + r, ldy);
        else
            for (int64_t rr = r; rr < N; ++rr) block<1>(xp, M, K, wp + rr * K, yp + rr, ldy);
    }
}

torch::Tensor gemv(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32 [M, K]");
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.is_contiguous() && w.size(1) == x.size(1),
                "w must be contiguous float32 [N, K]");
    const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
    const bool has_b = b.numel() > 0;
    TORCH_CHECK(!has_b || (b.scalar_type() == torch::kFloat32 && b.is_contiguous() && b.numel() == N), "b must be float32 [N]");
    auto y = torch::empty({M, N}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, N / 8 + 1, 16, [&](int64_t b0, int64_t b1) { gemv_blocks(xp, M, K, wp, yp, N, N, b0, b1); });
    if (has_b) y.add_(b);
    return y;
}

// the vector loop this build runs: "avx512", "avx2" or "plain" (a test checks an AVX2 CPU does not run "plain")
std::string gemv_isa() {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2";
#else
    return "plain";
#endif
}
