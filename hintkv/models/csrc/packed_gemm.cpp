// Many-row float32 GEMMs on an AVX2 + FMA CPU (packed_gemm.py): y [M, N] = x [M, K] W^T (+ b), the weight
// prepacked once at load, BLIS's loops (Goto's algorithm) with our own 6 x 16 micro-kernel.
//
// Why: on AMD Zen 3 (AVX2 + FMA, no AVX-512) MKL's sgemm and oneDNN reached 55-75% of the core's FMA peak on
// dummy:tiny's prefill GEMMs (twenty-third session), and those GEMMs are ~83% of a 512-token step.
//
// Layout. The weight W [N, K] is packed into panels of NR = 16 output columns, each panel K-major: panel p holds
// W[16p + j, k] at [k * 16 + j] (columns past N are zeros). The micro-kernel keeps a 6 x 16 block of y in 12 ymm
// accumulators; each k step loads 16 weights (2 ymm) and broadcasts 6 x values (MR = 6 rows), 12 FMAs: 2 FMA
// pipes on Zen 3 stay busy while the loads (8 a step) use 2 of its 3 load ports.
// Loops (per thread, over its rows): K in blocks of KC (a 16-column panel's KC rows, 16 KiB at KC = 256, stay in
// L1 while every row tile of the block passes over them); rows in blocks of MC, packed MR-row K-major (the
// broadcasts read one contiguous stream; the MC x KC block, 144 KiB, stays in L2); then panels; then row tiles.
// The work is shared by torch's OpenMP team (at::parallel_for, as the other C++ ops) in units that each thread takes
// from a counter as it gets to them (as cpu_attention's items), not in one fixed share a thread: the step then
// waits for the work left, not for the slower thread's half. A served 128-token step's two threads ran 45-60 ms
// when both had a CPU and up to twice that when one shared its CPU or its vCPU was stolen by the host, the other
// then idle at every GEMM's end (history/engine.md, "Twenty-ninth session, eng29"). A unit is a block of MC rows
// (many rows: each unit packs its own rows, as before) or, with fewer row blocks than UNITS_PER_THREAD a thread, a
// block of rows x a group of panels; x (up to SHARED_X_MAX) is then packed once for the call into a buffer the units
// share, each (row block, K block) packed by the first unit to reach it (a unit that finds it still being packed
// packs its own copy instead of waiting). Every y value sums its K products in the same order in any unit, so any
// thread count and any split give the same bits.
//
//   pack_weight(w [N, K]) -> packed [ceil(N / 16), K, 16]
//   gemm(x [M, K], packed, n, b [N] or empty) -> y [M, N]
//   gemm_isa() -> "avx2" (AVX2 + FMA) or "plain" (portable loop, for tests on other CPUs)
// torch: cpu_ext.HEADERS, put first when it is built
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>
#include <cstdint>
#include <cstring>
#include <string>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t MR = 6, NR = 16, KC = 256, MC = 144;  // MC: a multiple of MR
constexpr int64_t UNITS_PER_THREAD = 4;  // the units a call is cut into, per thread of the team (at least)
constexpr int64_t SHARED_X_MAX = int64_t(2) << 20;  // floats (8 MiB): the most of x packed whole for a call

// c[i * ldc + j] (+)= sum_k a[k * MR + i] * b[k * NR + j] (+ bias[j]) for the first `rows` x `cols` of the tile.
// first: this is the first K block (store, and add the bias), else accumulate onto c.
inline void micro(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t rows, int64_t cols,
                  bool first, const float* bias) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
           c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
           c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c40 = _mm256_setzero_ps(),
           c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    for (int64_t i = 0; i < rows; ++i) {  // the y tile's lines arrive while the FMAs run (~+4%, 512 x 768 x 512)
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + NR - 1), _MM_HINT_T0);
    }
    for (int64_t k = 0; k < kc; ++k) {
        _mm_prefetch(reinterpret_cast<const char*>(b + 8 * NR), _MM_HINT_T0);
        const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        // row i of the tile: x value i broadcast against the 16 weights (named registers: an accumulator array
        // looped over was kept in memory by this build, 0.4x)
#define HINTKV_ROW(i)                                       \
    {                                                       \
        const __m256 av = _mm256_broadcast_ss(a + i);       \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);         \
        c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);         \
    }
        HINTKV_ROW(0) HINTKV_ROW(1) HINTKV_ROW(2) HINTKV_ROW(3) HINTKV_ROW(4) HINTKV_ROW(5)
#undef HINTKV_ROW
        a += MR;
        b += NR;
    }
    const __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (rows == MR && cols == NR) {
        const __m256 b0 = first && bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
        const __m256 b1 = first && bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
        for (int64_t i = 0; i < MR; ++i) {
            float* ci = c + i * ldc;
            if (first) {
                _mm256_storeu_ps(ci, _mm256_add_ps(acc[i][0], b0));
                _mm256_storeu_ps(ci + 8, _mm256_add_ps(acc[i][1], b1));
            } else {
                _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]));
                _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]));
            }
        }
        return;
    }
    alignas(32) float tile[MR * NR];
    for (int64_t i = 0; i < MR; ++i) {
        _mm256_store_ps(tile + i * NR, acc[i][0]);
        _mm256_store_ps(tile + i * NR + 8, acc[i][1]);
    }
#else
    float tile[MR * NR] = {};
    for (int64_t k = 0; k < kc; ++k)
        for (int64_t i = 0; i < MR; ++i)
            for (int64_t j = 0; j < NR; ++j) tile[i * NR + j] += a[k * MR + i] * b[k * NR + j];
#endif
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
            c[i * ldc + j] = first ? tile[i * NR + j] + (bias ? bias[j] : 0.f) : c[i * ldc + j] + tile[i * NR + j];
}

// x rows [i0, i0 + rows) x columns [k0, k0 + kc) -> MR-row tiles, each K-major ([k * MR + i]), rows past the end zero
inline void pack_rows(const float* x, int64_t K, int64_t i0, int64_t rows, int64_t k0, int64_t kc, float* out) {
    for (int64_t t = 0; t < rows; t += MR) {
        const int64_t r = std::min(MR, rows - t);
        float* o = out + t * kc;
        for (int64_t k = 0; k < kc; ++k)
            for (int64_t i = 0; i < MR; ++i) o[k * MR + i] = i < r ? x[(i0 + t + i) * K + k0 + k] : 0.f;
    }
}

// y rows [m0, m1) (m0 a multiple of MR) of y = x W^T (+ b)
void gemm_rows(const float* x, int64_t K, const float* w, int64_t N, const float* bias, float* y, int64_t m0,
               int64_t m1) {
    const int64_t panels = (N + NR - 1) / NR;
    // the packed row block, one per thread, kept (a fresh 144 KiB buffer was an mmap and 36 page faults a call)
    alignas(64) static thread_local float a[MC * KC];
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min(KC, K - k0);
        for (int64_t i0 = m0; i0 < m1; i0 += MC) {
            const int64_t mc = std::min(MC, m1 - i0);
            pack_rows(x, K, i0, mc, k0, kc, a);
            for (int64_t p = 0; p < panels; ++p) {
                const float* b = w + p * K * NR + k0 * NR;
                const int64_t cols = std::min(NR, N - p * NR);
                for (int64_t t = 0; t < mc; t += MR)
                    micro(kc, a + t * kc, b, y + (i0 + t) * N + p * NR, N, std::min(MR, mc - t), cols, k0 == 0,
                          bias ? bias + p * NR : nullptr);
            }
        }
    }
}

// y rows [r0, r1) (one row block) x panels [p0, p1); `packed(kb, kc)` gives K block kb of these rows packed as
// pack_rows lays them out (the shared copy, or this thread's own when another thread is still packing it)
template <typename Packed>
void gemm_unit(int64_t K, const float* w, int64_t N, const float* bias, float* y, int64_t r0, int64_t r1, int64_t p0,
               int64_t p1, Packed packed) {
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min(KC, K - k0);
        const float* a = packed(k0 / KC, kc);
        for (int64_t p = p0; p < p1; ++p) {
            const float* b = w + p * K * NR + k0 * NR;
            const int64_t cols = std::min(NR, N - p * NR);
            for (int64_t t = r0; t < r1; t += MR)
                micro(kc, a + (t - r0) * kc, b, y + t * N + p * NR, N, std::min(MR, r1 - t), cols, k0 == 0,
                      bias ? bias + p * NR : nullptr);
        }
    }
}

// y = x W^T (+ b) over the team in units (the header): row blocks, or row blocks x panel groups on x packed once
void gemm_shared(const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias, float* y) {
    const int64_t panels = (N + NR - 1) / NR, rblocks = (M + MC - 1) / MC;
    const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), ((M + MR - 1) / MR) * panels));
    std::atomic<int64_t> next{0};
    const int64_t mpad = ((M + MR - 1) / MR) * MR;
    // enough row blocks (or an x too large to pack whole): a row block a unit, each packing its own, as one thread does
    if (nt == 1 || rblocks >= UNITS_PER_THREAD * nt || mpad * K > SHARED_X_MAX) {
        auto rows = [&](int64_t, int64_t) {
            for (int64_t rb; (rb = next.fetch_add(1, std::memory_order_relaxed)) < rblocks;)
                gemm_rows(x, K, w, N, bias, y, rb * MC, std::min(M, (rb + 1) * MC));
        };
        if (nt == 1) rows(0, 1);
        else at::parallel_for(0, nt, 1, rows);
        return;
    }
    const int64_t per_block = std::min(panels, (UNITS_PER_THREAD * nt + rblocks - 1) / rblocks);
    const int64_t group = (panels + per_block - 1) / per_block, groups = (panels + group - 1) / group;
    const int64_t kblocks = (K + KC - 1) / KC, units = rblocks * groups;
    // x packed whole on the calling thread's buffer (kept: no page faults a call), shared by the team's units
    static thread_local std::vector<float> xbuf;
    if (static_cast<int64_t>(xbuf.size()) < mpad * K) xbuf.resize(mpad * K);
    float* ax = xbuf.data();
    // per (row block, K block): 0 not packed, 1 being packed, 2 packed
    std::unique_ptr<std::atomic<int>[]> state(new std::atomic<int>[rblocks * kblocks]);
    for (int64_t i = 0; i < rblocks * kblocks; ++i) state[i].store(0, std::memory_order_relaxed);
    auto work = [&](int64_t, int64_t) {
        alignas(64) static thread_local float own[MC * KC];  // a block another thread is still packing, packed here
        for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
            const int64_t rb = u / groups, g = u % groups, r0 = rb * MC, r1 = std::min(M, r0 + MC);
            std::atomic<int>* st = state.get() + rb * kblocks;
            // the shared copy once packed; the first to reach a block packs it there; one that finds it being packed
            // packs its own copy rather than wait (a packer the OS took off its CPU would hold every other thread)
            auto packed = [&](int64_t kb, int64_t kc) -> const float* {
                const int64_t k0 = kb * KC;
                float* shared = ax + k0 * mpad + r0 * kc;
                int s0 = st[kb].load(std::memory_order_acquire);
                if (s0 == 2) return shared;
                if (s0 == 0 && st[kb].compare_exchange_strong(s0, 1, std::memory_order_acquire)) {
                    pack_rows(x, K, r0, r1 - r0, k0, kc, shared);
                    st[kb].store(2, std::memory_order_release);
                    return shared;
                }
                if (s0 == 2) return shared;  // packed between the load and the exchange
                pack_rows(x, K, r0, r1 - r0, k0, kc, own);
                return own;
            };
            gemm_unit(K, w, N, bias, y, r0, r1, g * group, std::min(panels, (g + 1) * group), packed);
        }
    };
    at::parallel_for(0, nt, 1, work);
}

}  // namespace

torch::Tensor pack_weight(torch::Tensor w) {
    TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32, "w must be float32 [N, K]");
    w = w.contiguous();
    const int64_t N = w.size(0), K = w.size(1), panels = (N + NR - 1) / NR;
    auto packed = torch::zeros({panels, K, NR}, w.options());
    const float* wp = w.data_ptr<float>();
    float* pp = packed.data_ptr<float>();
    at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
            for (int64_t j = 0; j < NR && p * NR + j < N; ++j)
                for (int64_t k = 0; k < K; ++k) pp[(p * K + k) * NR + j] = wp[(p * NR + j) * K + k];
    });
    return packed;
}

torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t n, torch::Tensor b) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x must be contiguous float32 [M, K]");
    const int64_t M = x.size(0), K = x.size(1);
    TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kFloat32 && packed.is_contiguous() &&
                    packed.size(1) == K && packed.size(2) == NR && packed.size(0) == (n + NR - 1) / NR,
                "packed must be pack_weight's [ceil(n / 16), K, 16] for this x");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr<float>()) % 32 == 0, "packed must be 32-byte aligned");
    const bool has_b = b.numel() > 0;
    TORCH_CHECK(!has_b || (b.scalar_type() == torch::kFloat32 && b.is_contiguous() && b.numel() == n),
                "b must be float32 [N]");
    auto y = torch::empty({M, n}, x.options());
    if (M == 0 || n == 0) return y;
    if (K == 0) return has_b ? y.copy_(b.expand({M, n})) : y.zero_();
    const float* xp = x.data_ptr<float>();
    const float* wp = packed.data_ptr<float>();
    const float* bp = has_b ? b.data_ptr<float>() : nullptr;
    float* yp = y.data_ptr<float>();
    gemm_shared(xp, M, K, wp, n, bp, yp);
    return y;
}

std::string gemm_isa() {
#if defined(__AVX2__) && defined(__FMA__)
    return "avx2";
#else
    return "plain";
#endif
}
