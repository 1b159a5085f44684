// Greedy decoding's LM head on a CPU (greedy_head.py): each row's argmax of x W^T, reading W's int8 copy.
//
// screened_argmax(x [N, H] f32, wq [V, H] i8, scale [V], err [V], wsum [V] i32, w [V, H] f32) -> N ints
//   1. x's rows quantised per row: x ~ sx xq (|xq| <= 127), dx = |x - sx xq|_1 (exact, in double)
//   2. approximate logits a_r = sx scale_r (xq . wq_r): integer dot products (AVX-512 VNNI: 64
//      multiply-adds per instruction on u8 = xq + 128, minus 128 wsum_r), so the step reads a quarter
//      of the float weight's bytes and is bound by them, not by arithmetic
//   3. |x . w_r - a_r| <= |x|_1 err_r + dx 127 scale_r =: b_r (err_r: the row's largest rounding error
//      plus float summation's margin); lo = max_r (a_r - b_r) is below the argmax's value, so the
//      argmax is among the rows with a_r + b_r >= lo, which get exact float32 dot products
//   The first of equal exact values wins (torch.argmax's rule). Empty result: a row of x not finite.
// has_screen() -> bool: whether this build has the screen (AVX-512 VNNI, or AVX2's vpmaddubsw on |x| and sign(x) q,
// e.g. AMD Zen 1; else greedy_head.py computes the logits).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HINTKV_VNNI 1
#define HINTKV_SCREEN 1
#elif defined(__AVX2__)
#define HINTKV_SCREEN 1  // AVX2 without VNNI (AMD Zen 1): vpmaddubsw on |x| and sign(x) q
#endif

namespace {

constexpr int64_t PREFETCH_ROWS = 16;
#if defined(HINTKV_VNNI)
constexpr int kOffset = 128;  // x's int8 values go in as u8 = xq + 128 (dpbusd is u8 x s8): 128 wsum_r comes back out
#else
constexpr int kOffset = 0;  // AVX2 keeps them signed
#endif

#if defined(HINTKV_VNNI)
// out[r * ldo + i] = u_i . q_r (u8 x s8, int32) for R weight rows and M x rows, all of H bytes (row
// stride H for q, Hp for u, which is zero past H): R x M independent accumulator chains
template <int R, int M>
inline void dots_u8s8(const uint8_t* u, int64_t Hp, const int8_t* q, int64_t H, int32_t* out, int64_t ldo) {
    __m512i c[R][M];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) c[r][i] = _mm512_setzero_si512();
    for (int64_t d = 0; d < H; d += 64) {
        const __mmask64 m = H - d >= 64 ? ~__mmask64(0) : ((__mmask64(1) << (H - d)) - 1);
        __m512i xv[M];
        for (int i = 0; i < M; ++i) xv[i] = _mm512_loadu_si512(u + i * Hp + d);
        for (int r = 0; r < R; ++r) {
            // the block PREFETCH_ROWS rows on: hardware prefetchers stop at each 4 KiB page, which
            // 8 rows of 512 bytes fill (a one-row step ran at half the bandwidth without this)
            _mm_prefetch(reinterpret_cast<const char*>(q + (r + PREFETCH_ROWS) * H + d), _MM_HINT_T0);
            const __m512i wv = _mm512_maskz_loadu_epi8(m, q + r * H + d);
            for (int i = 0; i < M; ++i) c[r][i] = _mm512_dpbusd_epi32(c[r][i], xv[i], wv);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) out[r * ldo + i] = _mm512_reduce_add_epi32(c[r][i]);
}
#elif defined(HINTKV_SCREEN)
// The same sums on AVX2, x kept signed (u holds xq as int8, kOffset 0): vpmaddubsw multiplies |x| (u8) by
// sign(x) q (s8) into int16 pair sums, exact since 2 x 127 x 127 < 2^15, vpmaddwd by 1 widens them to int32.
template <int R, int M>
inline void dots_u8s8(const uint8_t* u, int64_t Hp, const int8_t* q, int64_t H, int32_t* out, int64_t ldo) {
    const int8_t* x = reinterpret_cast<const int8_t*>(u);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c[R][M];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) c[r][i] = _mm256_setzero_si256();
    int64_t d = 0;
    for (; d + 32 <= H; d += 32) {
        __m256i xv[M], xa[M];
        for (int i = 0; i < M; ++i) {
            xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i * Hp + d));
            xa[i] = _mm256_abs_epi8(xv[i]);
        }
        for (int r = 0; r < R; ++r) {
            if (d % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(q + (r + PREFETCH_ROWS) * H + d), _MM_HINT_T0);
            const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * H + d));
            for (int i = 0; i < M; ++i)
                c[r][i] = _mm256_add_epi32(c[r][i], _mm256_madd_epi16(_mm256_maddubs_epi16(xa[i], _mm256_sign_epi8(wv, xv[i])), ones));
        }
    }
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < M; ++i) {
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(c[r][i]), _mm256_extracti128_si256(c[r][i], 1));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
            int32_t v = _mm_cvtsi128_si32(s);
            for (int64_t e = d; e < H; ++e) v += int32_t(x[i * Hp + e]) * q[r * H + e];
            out[r * ldo + i] = v;
        }
}
#endif

inline float float_dot(const float* x, const float* w, int64_t H) {
    int64_t d = 0;
    float sum = 0.f;
#if defined(__AVX512F__)
    __m512 c = _mm512_setzero_ps();
    for (; d + 16 <= H; d += 16) c = _mm512_fmadd_ps(_mm512_loadu_ps(x + d), _mm512_loadu_ps(w + d), c);
    sum = _mm512_reduce_add_ps(c);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 c = _mm256_setzero_ps();
    for (; d + 8 <= H; d += 8) c = _mm256_fmadd_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(w + d), c);
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    sum = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
#endif
    for (; d < H; ++d) sum += x[d] * w[d];
    return sum;
}

template <typename T>
T* scratch(std::vector<T>& buf, int64_t n) {
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
    return buf.data();
}

}  // namespace

bool has_screen() {
#if defined(HINTKV_SCREEN)
    return true;
#else
    return false;
#endif
}

std::vector<int64_t> screened_argmax(torch::Tensor x, torch::Tensor wq, torch::Tensor scale, torch::Tensor err,
                                     torch::Tensor wsum, torch::Tensor w) {
#if !defined(HINTKV_SCREEN)
    TORCH_CHECK(false, "screened_argmax needs AVX-512 VNNI or AVX2 (check has_screen() first)");
    return {};
#else
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32 [N, H]");
    const int64_t N = x.size(0), H = x.size(1), V = wq.size(0);
    TORCH_CHECK(wq.dim() == 2 && wq.scalar_type() == torch::kInt8 && wq.is_contiguous() && wq.size(1) == H && V > 0,
                "wq must be contiguous int8 [V, H]");
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.is_contiguous() && w.size(0) == V &&
                w.size(1) == H, "w must be contiguous float32 [V, H]");
    TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && err.scalar_type() == torch::kFloat32 &&
                wsum.scalar_type() == torch::kInt32 && scale.is_contiguous() && err.is_contiguous() &&
                wsum.is_contiguous() && scale.numel() == V && err.numel() == V && wsum.numel() == V,
                "scale, err must be contiguous float32 [V], wsum int32 [V]");
    const float* xp = x.data_ptr<float>();
    const int8_t* qp = wq.data_ptr<int8_t>();
    const float* sp = scale.data_ptr<float>();
    const float* ep = err.data_ptr<float>();
    const int32_t* wsp = wsum.data_ptr<int32_t>();
    const float* wp = w.data_ptr<float>();
    const int64_t Hp = (H + 63) / 64 * 64;
    static thread_local std::vector<uint8_t> ubuf;
    static thread_local std::vector<int32_t> dbuf;
    uint8_t* u = scratch(ubuf, N * Hp);
    int32_t* dots = scratch(dbuf, N * V);  // dots[r * N + n]: u_n . q_r
    std::vector<float> l1(N), dx(N), sx(N);
    for (int64_t n = 0; n < N; ++n) {
        const float* xr = xp + n * H;
        double amax = 0.0, s1 = 0.0;
        for (int64_t d = 0; d < H; ++d) amax = std::max(amax, double(std::fabs(xr[d]))), s1 += std::fabs(xr[d]);
        if (!std::isfinite(s1)) return {};
        const float s = amax > 0 ? static_cast<float>(amax / 127.0) : 1.f;
        double e = 0.0;
        for (int64_t d = 0; d < H; ++d) {
            const float qv = std::min(127.f, std::max(-127.f, std::nearbyint(xr[d] / s)));
            u[n * Hp + d] = static_cast<uint8_t>(static_cast<int>(qv) + kOffset);
            e += std::fabs(double(xr[d]) - double(qv) * double(s));
        }
        std::fill(u + n * Hp + H, u + (n + 1) * Hp, uint8_t(0));
        sx[n] = s;
        l1[n] = static_cast<float>(s1 * (1.0 + 1e-6));  // rounded up: the bound stays a bound
        dx[n] = static_cast<float>(e * (1.0 + 1e-6));
    }
    // the u8 offset 128 is 0 past H, so a row's correction is 128 wsum_r whatever the padding
    at::parallel_for(0, V, 2048, [&](int64_t r0, int64_t r1) {
        int64_t r = r0;
        for (; r + 8 <= r1; r += 8) {
            int64_t n = 0;
#if defined(HINTKV_VNNI)
            for (; n + 2 <= N; n += 2) dots_u8s8<8, 2>(u + n * Hp, Hp, qp + r * H, H, dots + r * N + n, N);
#else  // 16 ymm registers: 4 x 2 accumulators (8 x 2 would spill)
            for (; n + 2 <= N; n += 2) {
                dots_u8s8<4, 2>(u + n * Hp, Hp, qp + r * H, H, dots + r * N + n, N);
                dots_u8s8<4, 2>(u + n * Hp, Hp, qp + (r + 4) * H, H, dots + (r + 4) * N + n, N);
            }
#endif
            for (; n < N; ++n) dots_u8s8<8, 1>(u + n * Hp, Hp, qp + r * H, H, dots + r * N + n, N);
        }
        for (; r < r1; ++r)
            for (int64_t n = 0; n < N; ++n) dots_u8s8<1, 1>(u + n * Hp, Hp, qp + r * H, H, dots + r * N + n, N);
    });
    std::vector<int64_t> best(N);
    at::parallel_for(0, N, 1, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
            auto bounds = [&](int64_t r, float& a, float& b) {
                const int64_t dot = int64_t(dots[r * N + n]) - kOffset * int64_t(wsp[r]);
                a = sx[n] * sp[r] * static_cast<float>(dot);
                b = l1[n] * ep[r] + dx[n] * 127.f * sp[r] * (1.f + 1e-6f);
            };
            float lo = -std::numeric_limits<float>::infinity(), a, b;  // lo: below the argmax's exact value
            for (int64_t r = 0; r < V; ++r) bounds(r, a, b), lo = std::max(lo, a - b);
            float top = -std::numeric_limits<float>::infinity();
            int64_t arg = -1;
            for (int64_t r = 0; r < V; ++r) {  // increasing r, strict >: the first maximum, like torch.argmax
                bounds(r, a, b);
                if (a + b < lo) continue;
                const float e = float_dot(xp + n * H, wp + r * H, H);
                if (arg < 0 || e > top) top = e, arg = r;
            }
            best[n] = arg;
        }
    });
    return best;
#endif
}
