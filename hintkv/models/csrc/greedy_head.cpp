// Greedy decoding's LM head on a CPU (greedy_head.py): each row's argmax of x W^T, reading W's int8 copy.
//
// screened_argmax(x [N, H] f32, wq, scale [V], err [3, V], wsum [V] i32, w [V, H] f32) -> N ints
//   wq: the int8 copy in 16-row blocks [ceil(V/16), Hq, 16, 4] (int8.block_weight's, zero padded; greedy_head
//   .quantise_rows makes it and err), read by both builds
//   1. x's rows quantised per row: x ~ sx xq (|xq| <= 127 VNNI, <= 64 AVX2), dx = |x - sx xq|_1, dx2 = |x - sx xq|_2
//      (exact, in double)
//   2. approximate logits a_r = sx scale_r (xq . wq_r): integer dot products (AVX-512 VNNI: 64
//      multiply-adds per instruction on u8 = xq + 128, minus 128 wsum_r; AVX2: vpmaddubsw on u8 = xq + 64, 32 an
//      instruction, then vpmaddwd to widen, minus 64 wsum_r), so the step reads a quarter of the float weight's bytes
//   3. |x . w_r - a_r| <= |x|_1 err_r + dx 127 scale_r =: b_r (err[0]: the row's largest rounding error plus float
//      summation's margin); the AVX2 screen takes the smaller of that and |x|_2 err[1]_r + dx2 err[2]_r (err[1]:
//      |w_r - scale_r q_r|_2 plus the margin times sqrt(H), err[2]: |scale_r q_r|_2: Cauchy-Schwarz on each part of
//      x . w - x~ . w~ = x . (w - w~) + (x - x~) . w~). lo = max_r (a_r - b_r) is below the argmax's value, so the
//      argmax is among the rows with a_r + b_r >= lo, which get exact float32 dot products
//   The first of equal exact values wins (torch.argmax's rule); every token is < V. Empty result (the caller
//   computes the logits): a row of x not finite, or a bound that is not finite in float (|x|_1 past float's range)
// last_recomputed() -> int: rows the calling thread's last screened_argmax recomputed in float (all x rows together)
// has_screen() -> bool: whether this build has the screen (AVX-512 VNNI, or AVX2's vpmaddubsw on 7-bit x and q,
// e.g. AMD Zen 1 and 3; else greedy_head.py computes the logits). isa() says which ("vnni", "avx2", "").
// torch: cpu_ext.HEADERS, put first when it is built
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HINTKV_VNNI 1
#define HINTKV_SCREEN 1
#elif defined(__AVX2__)
#define HINTKV_SCREEN 1  // AVX2 without VNNI (AMD Zen 1 and 3): vpmaddubsw on u8 x (7 bits) and s8 q
#endif

namespace {

constexpr int64_t PREFETCH_ROWS = 16;
#if defined(HINTKV_VNNI)
constexpr int kLevels = 127;  // x's rows in 8 bits, |xq| <= 127
constexpr int kShift = 7;  // x's int8 values go in as u8 = xq + 128 (dpbusd is u8 x s8): 128 wsum_r comes back out
#else
constexpr int kLevels = 64;  // x's rows in 7 bits, |xq| <= 64: vpmaddubsw's int16 pair sums of u8 = xq + 64 (at
constexpr int kShift = 6;   // most 128) and q (|q| <= 127) fit (2 x 128 x 127 = 32512); 64 wsum_r comes back out
#endif
constexpr int kOffset = 1 << kShift;

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

thread_local int64_t recomputed_rows = 0;
#if defined(HINTKV_SCREEN)
thread_local std::vector<int64_t> scratch_rows;  // one x row's candidates (pass 2), per thread

constexpr int64_t kAhead = 4;  // candidate rows fetched ahead of their dot product
inline void fetch_row(const float* w, int64_t H) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(w) / 64, last = (reinterpret_cast<uintptr_t>(w + H) - 1) / 64;
    for (uintptr_t line = first; line <= last; ++line) _mm_prefetch(reinterpret_cast<const char*>(line * 64), _MM_HINT_T0);
}
#endif

template <typename T>
T* scratch(std::vector<T>& buf, int64_t n) {
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
    return buf.data();
}

}  // namespace

int64_t last_recomputed() { return recomputed_rows; }

bool has_screen() {
#if defined(HINTKV_SCREEN)
    return true;
#else
    return false;
#endif
}

#if defined(HINTKV_SCREEN)
namespace {

struct Screen {
    const uint8_t* u;                   // x's rows (u8 xq + kOffset), row stride 4 Hq (read 4 at a time: memcpy)
    const int8_t* wb;                   // the blocked copy [Vb][Hq][16][4]
    const float *sp, *ep, *sx, *l1, *dx;
    const float *e2p, *n2p, *l2, *dx2;  // the Euclidean bound's terms (AVX2): rows' |w - w~|_2 (+ margin), |w~|_2;
                                        // x rows' |x|_2, |x - x~|_2
    const int32_t* wsp;
    int64_t N, V, Hq, ld;               // ld = Vb * 16
    float* hi;                          // [N][ld]: a_r + b_r (-inf past V)
};

#if defined(HINTKV_VNNI)

// blocks [v0, v0 + B) (16 rows each, [Hq][16][4] int8: block_weight's layout) against G x rows: each block's 16
// dot products per x row land in one register (the row-major screen reduced every (row, x row) pair's register
// horizontally: ~40% of its instructions at 8 rows); a dpbusd does 64 multiply-adds with x's 4 bytes broadcast.
// Then hi for each x row, and the rows' a_r - b_r folded into lo [G] (vector maxima). Registers: B x G
// accumulators, G broadcasts, one weight line (of 32).
template <int B, int G>
inline void screen_blocks(const Screen& sc, int64_t v0, __m512* lo) {
    __m512i acc[B][G];
    for (int b = 0; b < B; ++b)
        for (int g = 0; g < G; ++g) acc[b][g] = _mm512_setzero_si512();
    const int8_t* wb = sc.wb + v0 * sc.Hq * 64;
    for (int64_t kq = 0; kq < sc.Hq; ++kq) {
        __m512i xb[G];
        for (int g = 0; g < G; ++g) {
            int32_t quad;  // x's 4 bytes; memcpy, not an int32_t* into the u8 buffer (strict aliasing)
            std::memcpy(&quad, sc.u + (g * sc.Hq + kq) * 4, sizeof quad);
            xb[g] = _mm512_set1_epi32(quad);
        }
        for (int b = 0; b < B; ++b) {
            const int8_t* line = wb + (b * sc.Hq + kq) * 64;
            _mm_prefetch(reinterpret_cast<const char*>(line + 1024), _MM_HINT_T0);  // hardware prefetch stops at 4 KiB pages
            const __m512i wv = _mm512_loadu_si512(line);
            for (int g = 0; g < G; ++g) acc[b][g] = _mm512_dpbusd_epi32(acc[b][g], xb[g], wv);
        }
    }
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int b = 0; b < B; ++b) {
        const int64_t r = (v0 + b) * 16;
        const __mmask16 live = sc.V - r >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(0, sc.V - r)) - 1);
        const __m512 s = _mm512_maskz_loadu_ps(live, sc.sp + r), e = _mm512_maskz_loadu_ps(live, sc.ep + r);
        const __m512i comp = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(live, sc.wsp + r), 7);  // 128 wsum_r
        for (int g = 0; g < G; ++g) {
            // a = sx s_r dot, b = |x|_1 err_r + dx 127 s_r (1 + 1e-6): the row-major screen's arithmetic, 16 rows a time
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[b][g], comp));
            const __m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sc.sx[g]), s), dot);
            const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sc.dx[g] * 127.f), s), _mm512_set1_ps(1.f + 1e-6f));
            const __m512 bnd = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(sc.l1[g]), e), t);
            lo[g] = _mm512_mask_max_ps(lo[g], live, lo[g], _mm512_sub_ps(a, bnd));
            _mm512_storeu_ps(sc.hi + g * sc.ld + r, _mm512_mask_blend_ps(live, ninf, _mm512_add_ps(a, bnd)));
        }
    }
}

template <int G>
void screen_all(const Screen& sc, float* lo_out) {
    constexpr int B = G == 1 ? 4 : 1;  // one row: 4 chains in flight; more: B > 1 measured slower (spills)
    const int64_t Vb = (sc.V + 15) / 16;
    std::mutex merge;
    at::parallel_for(0, (Vb + B - 1) / B, 64, [&](int64_t c0, int64_t c1) {
        __m512 lo[G];
        for (int g = 0; g < G; ++g) lo[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        for (int64_t c = c0; c < c1; ++c) {
            const int64_t v0 = c * B;
            if (v0 + B <= Vb) screen_blocks<B, G>(sc, v0, lo);
            else
                for (int64_t v = v0; v < Vb; ++v) screen_blocks<1, G>(sc, v, lo);
        }
        std::lock_guard<std::mutex> hold(merge);
        for (int g = 0; g < G; ++g) lo_out[g] = std::max(lo_out[g], _mm512_reduce_max_ps(lo[g]));
    });
}

#else
// AVX2 (no VNNI): the same blocks, x in 7 bits as u8 = xq + 64 (kOffset). vpmaddubsw multiplies u8 x by the s8 copy
// into int16 pair sums, exact since 2 x 128 x 127 < 2^15, and vpmaddwd by 1 widens them to int32 quad sums: a block's
// 16 dot products per x row in two registers (channels 0-7, 8-15), no horizontal sums. Three vector ops a 32 products
// (8-bit x took five: vpmaddubsw on |x| and sign(x) q, a vpsignb per weight vector and a vpabsb per broadcast). A
// pass takes at most 4 x rows (8 accumulators of 16 ymm registers); a group's further rows take further passes over
// the same block, then in L1.
// The copy is read as one stream (a block's 16 rows, then the next block's); a line is fetched 4 KiB ahead. At 512
// bytes (the VNNI screen's distance) the first vpmaddubsw on each new line held a fifth of the pass's samples (perf).
// dummy:tiny's head, its captured decode rows, one thread, CPU time, 9 interleaved rounds (load 3-4): 512 bytes took
// 0.97-1.17x the time of 2 KiB per round at 8 rows and 1.08-1.67x at 1 row; 4 KiB against 2 KiB 0.91-1.09 at 8 rows.
constexpr int64_t kFetchAhead = 4096;

template <int P>
inline void block_pass(const uint8_t* u, int64_t Hq, const int8_t* wb, __m256i (*out)[2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[P][2];  // local (registers); `out` only at the end
    for (int p = 0; p < P; ++p) acc[p][0] = acc[p][1] = _mm256_setzero_si256();
    for (int64_t kq = 0; kq < Hq; ++kq) {
        const int8_t* line = wb + kq * 64;
        _mm_prefetch(reinterpret_cast<const char*>(line + kFetchAhead), _MM_HINT_T0);
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32));
        for (int p = 0; p < P; ++p) {
            int32_t quad;  // x's 4 bytes; memcpy, not an int32_t* into the u8 buffer (strict aliasing)
            std::memcpy(&quad, u + (p * Hq + kq) * 4, sizeof quad);
            const __m256i av = _mm256_set1_epi32(quad);
            acc[p][0] = _mm256_add_epi32(acc[p][0], _mm256_madd_epi16(_mm256_maddubs_epi16(av, w0), ones));
            acc[p][1] = _mm256_add_epi32(acc[p][1], _mm256_madd_epi16(_mm256_maddubs_epi16(av, w1), ones));
        }
    }
    for (int p = 0; p < P; ++p) out[p][0] = acc[p][0], out[p][1] = acc[p][1];
}

// hi and lo for x rows [g0, g0 + P) from their dots with block v: the VNNI screen's arithmetic, 8 rows of V a time
template <int P>
inline void block_bounds(const Screen& sc, int64_t v, int g0, const __m256i (*acc)[2], __m256* lo) {
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int h = 0; h < 2; ++h) {
        const int64_t r = v * 16 + h * 8;
        const int count = static_cast<int>(std::clamp<int64_t>(sc.V - r, 0, 8));
        const __m256i livei = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 live = _mm256_castsi256_ps(livei);
        const __m256 s = _mm256_maskload_ps(sc.sp + r, livei), e = _mm256_maskload_ps(sc.ep + r, livei);
        const __m256 e2 = _mm256_maskload_ps(sc.e2p + r, livei), n2 = _mm256_maskload_ps(sc.n2p + r, livei);
        const __m256i comp = _mm256_slli_epi32(_mm256_maskload_epi32(sc.wsp + r, livei), kShift);  // 64 wsum_r
        const __m256 up = _mm256_set1_ps(1.f + 1e-6f);
        for (int p = 0; p < P; ++p) {
            const int g = g0 + p;
            const __m256 dot = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[p][h], comp));
            const __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(sc.sx[g]), s), dot);
            const __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(sc.dx[g] * 127.f), s), up);
            // the smaller of two bounds: |x|_1 err_r + |x - x~|_1 127 s_r, and |x|_2 |w - w~|_2 + |x - x~|_2 |w~|_2
            // (Cauchy-Schwarz on each part; float's margin is in e2: greedy_head.quantise_rows)
            const __m256 b1 = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(sc.l1[g]), e), t);
            const __m256 b2 = _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(sc.l2[g]), e2),
                                                          _mm256_mul_ps(_mm256_set1_ps(sc.dx2[g]), n2)), up);
            const __m256 bnd = _mm256_min_ps(b2, b1);  // b1 where b2 is NaN
            lo[g] = _mm256_blendv_ps(lo[g], _mm256_max_ps(lo[g], _mm256_sub_ps(a, bnd)), live);
            _mm256_storeu_ps(sc.hi + g * sc.ld + r, _mm256_blendv_ps(ninf, _mm256_add_ps(a, bnd), live));
        }
    }
}

// block v against the group's G x rows: passes of 4 rows, then the rest
template <int G>
inline void screen_block(const Screen& sc, int64_t v, __m256* lo) {
    const int8_t* wb = sc.wb + v * sc.Hq * 64;
    __m256i acc[4][2];
    for (int g0 = 0; g0 + 4 <= G; g0 += 4) {
        block_pass<4>(sc.u + g0 * sc.Hq * 4, sc.Hq, wb, acc);
        block_bounds<4>(sc, v, g0, acc, lo);
    }
    constexpr int rest = G % 4;
    if constexpr (rest > 0) {
        block_pass<rest>(sc.u + (G - rest) * sc.Hq * 4, sc.Hq, wb, acc);
        block_bounds<rest>(sc, v, G - rest, acc, lo);
    }
}

template <int G>
void screen_all(const Screen& sc, float* lo_out) {
    const int64_t Vb = (sc.V + 15) / 16;
    std::mutex merge;
    at::parallel_for(0, Vb, 64, [&](int64_t v0, int64_t v1) {
        __m256 lo[G];
        for (int g = 0; g < G; ++g) lo[g] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
        for (int64_t v = v0; v < v1; ++v) screen_block<G>(sc, v, lo);
        std::lock_guard<std::mutex> hold(merge);
        for (int g = 0; g < G; ++g) {
            __m128 m = _mm_max_ps(_mm256_castps256_ps128(lo[g]), _mm256_extractf128_ps(lo[g], 1));
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            m = _mm_max_ss(m, _mm_movehdup_ps(m));
            lo_out[g] = std::max(lo_out[g], _mm_cvtss_f32(m));
        }
    });
}
#endif

// bit i: rows r0 + i of 16 whose hi is not below lo (NaN either way counts: the caller masks the padding)
inline uint32_t candidates(const float* hi, float lo) {
#if defined(HINTKV_VNNI)
    return _mm512_cmp_ps_mask(_mm512_loadu_ps(hi), _mm512_set1_ps(lo), _CMP_NLT_UQ);
#else
    const __m256 lov = _mm256_set1_ps(lo);
    const uint32_t low = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(hi), lov, _CMP_NLT_UQ));
    return low | uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(hi + 8), lov, _CMP_NLT_UQ))) << 8;
#endif
}

// G x rows at a time (the blocks are read once per group), up to 12
void screen_rows(Screen sc, float* lo) {
    const int64_t N = sc.N, ld = sc.ld;
    for (int64_t n0 = 0; n0 < N;) {
        Screen part = sc;
        part.u += n0 * sc.Hq * 4, part.sx += n0, part.l1 += n0, part.dx += n0, part.hi += n0 * ld;
        part.l2 += n0, part.dx2 += n0;
        const int64_t g = std::min<int64_t>(N - n0, 12);
        switch (g) {
            case 1: screen_all<1>(part, lo + n0); break;
            case 2: screen_all<2>(part, lo + n0); break;
            case 3: screen_all<3>(part, lo + n0); break;
            case 4: screen_all<4>(part, lo + n0); break;
            case 5: screen_all<5>(part, lo + n0); break;
            case 6: screen_all<6>(part, lo + n0); break;
            case 7: screen_all<7>(part, lo + n0); break;
            case 8: screen_all<8>(part, lo + n0); break;
            case 9: screen_all<9>(part, lo + n0); break;
            case 10: screen_all<10>(part, lo + n0); break;
            case 11: screen_all<11>(part, lo + n0); break;
            default: screen_all<12>(part, lo + n0); break;
        }
        n0 += g;
    }
}

}  // namespace
#endif

// blocked() -> bool: the screen reads the int8 copy in 16-row blocks (`int8.block_weight`'s [ceil(V/16), Hq, 16, 4]):
// every build that has the screen (VNNI and AVX2)
bool blocked() {
#if defined(HINTKV_SCREEN)
    return true;
#else
    return false;
#endif
}

// isa() -> str: the screen's integer dot products: "vnni" (dpbusd), "avx2" (vpmaddubsw) or "" (no screen)
std::string isa() {
#if defined(HINTKV_VNNI)
    return "vnni";
#elif defined(HINTKV_SCREEN)
    return "avx2";
#else
    return "";
#endif
}

std::vector<int64_t> screened_argmax(torch::Tensor x, torch::Tensor wq, torch::Tensor scale, torch::Tensor err,
                                     torch::Tensor wsum, torch::Tensor w) {
#if !defined(HINTKV_SCREEN)
    TORCH_CHECK(false, "screened_argmax needs AVX-512 VNNI or AVX2 (check has_screen() first)");
    return {};
#else
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32 [N, H]");
    const int64_t N = x.size(0), H = x.size(1), V = w.size(0);
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.is_contiguous() && V > 0 && w.size(1) == H,
                "w must be contiguous float32 [V, H]");
    TORCH_CHECK(wq.dim() == 4 && wq.scalar_type() == torch::kInt8 && wq.is_contiguous() && wq.size(0) == (V + 15) / 16 &&
                wq.size(2) == 16 && wq.size(3) == 4 && wq.size(1) * 4 >= H, "wq must be contiguous int8 [ceil(V/16), Hq, 16, 4]");
    TORCH_CHECK(err.dim() == 2 && err.scalar_type() == torch::kFloat32 && err.is_contiguous() && err.size(0) == 3 &&
                err.size(1) == V, "err must be contiguous float32 [3, V] (greedy_head.quantise_rows)");
    TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous() && scale.numel() == V &&
                wsum.scalar_type() == torch::kInt32 && wsum.is_contiguous() && wsum.numel() == V,
                "scale must be contiguous float32 [V], wsum int32 [V]");
    const int64_t Hp = wq.size(1) * 4;
    const float* xp = x.data_ptr<float>();
    const int8_t* qp = wq.data_ptr<int8_t>();
    const float* sp = scale.data_ptr<float>();
    const float* ep = err.data_ptr<float>();
    const int32_t* wsp = wsum.data_ptr<int32_t>();
    const float* wp = w.data_ptr<float>();
    static thread_local std::vector<uint8_t> ubuf;
    uint8_t* u = scratch(ubuf, N * Hp);
    std::vector<float> l1(N), dx(N), sx(N), l2(N), dx2(N);
    recomputed_rows = 0;
    for (int64_t n = 0; n < N; ++n) {
        const float* xr = xp + n * H;
        double amax = 0.0, s1 = 0.0, s2 = 0.0;
        for (int64_t d = 0; d < H; ++d) {
            const double v = std::fabs(xr[d]);
            amax = std::max(amax, v), s1 += v, s2 += v * v;
        }
        if (!std::isfinite(s1)) return {};
        const float s = amax > 0 ? static_cast<float>(amax / kLevels) : 1.f;
        double e = 0.0, e2 = 0.0;
        for (int64_t d = 0; d < H; ++d) {
            const float qv = std::min(float(kLevels), std::max(-float(kLevels), std::nearbyint(xr[d] / s)));
            u[n * Hp + d] = static_cast<uint8_t>(static_cast<int>(qv) + kOffset);
            const double r = std::fabs(double(xr[d]) - double(qv) * double(s));
            e += r, e2 += r * r;
        }
        std::fill(u + n * Hp + H, u + (n + 1) * Hp, uint8_t(0));
        sx[n] = s;
        l1[n] = static_cast<float>(s1 * (1.0 + 1e-6));  // rounded up: the bound stays a bound
        dx[n] = static_cast<float>(e * (1.0 + 1e-6));
        l2[n] = static_cast<float>(std::sqrt(s2) * (1.0 + 1e-6));
        dx2[n] = static_cast<float>(std::sqrt(e2) * (1.0 + 1e-6));
        if (!std::isfinite(l1[n]) || !std::isfinite(dx[n])) return {};  // an infinite bound screens nothing out
    }
    std::atomic<int64_t> recomputed{0};
    std::vector<int64_t> best(N);
    // pass 1: every row's bounds from the blocked copy (the weight's padding is 0, so u's padding adds nothing);
    // pass 2: per x row, the rows with a_r + b_r >= lo, in increasing r, get float dots
    const int64_t ld = (V + 15) / 16 * 16;
    static thread_local std::vector<float> hbuf;
    float* hi = scratch(hbuf, N * ld);
    std::vector<float> lo(N, -std::numeric_limits<float>::infinity());  // lo: below the argmax's exact value
    screen_rows(Screen{u, qp, sp, ep, sx.data(), l1.data(), dx.data(), ep + V, ep + 2 * V, l2.data(), dx2.data(), wsp,
                       N, V, Hp / 4, ld, hi}, lo.data());
    at::parallel_for(0, N, 1, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
            const float* hn = hi + n * ld;
            if (!std::isfinite(lo[n])) {  // a bound overflowed float: no screen (best -1 -> the logits)
                best[n] = -1;
                continue;
            }
            std::vector<int64_t>& rows = scratch_rows;
            rows.clear();
            for (int64_t r0 = 0; r0 < ld; r0 += 16) {  // increasing r
                // rows >= V are padding (hi -inf, but a NaN lo would take them): never candidates
                const uint32_t live = V - r0 >= 16 ? 0xffffu : (1u << (V - r0)) - 1;
                for (uint32_t m = candidates(hn + r0, lo[n]) & live; m; m &= m - 1) rows.push_back(r0 + __builtin_ctz(m));
            }
            // the candidates' float rows are scattered over the weight (hundreds of 2 KiB rows at 8 x rows on
            // dummy:tiny): each is fetched kAhead candidates before its dot product instead of at its first miss
            const int64_t count = static_cast<int64_t>(rows.size());
            for (int64_t i = 0; i < std::min(kAhead, count); ++i) fetch_row(wp + rows[i] * H, H);
            float top = -std::numeric_limits<float>::infinity();
            int64_t arg = -1;
            for (int64_t i = 0; i < count; ++i) {  // strict >: the first maximum, like torch.argmax
                if (i + kAhead < count) fetch_row(wp + rows[i + kAhead] * H, H);
                const float e = float_dot(xp + n * H, wp + rows[i] * H, H);
                if (arg < 0 || e > top) top = e, arg = rows[i];
            }
            recomputed += count;
            best[n] = arg;
        }
    });
    recomputed_rows = recomputed.load();
    for (const int64_t b : best)
        if (b < 0 || b >= V) return {};  // no candidate (a NaN bound): the caller computes the logits
    return best;
#endif
}
