// W8A8's CPU ops (int8_cpu.py says what each computes and why; built by cpu_ext.load).
// torch: cpu_ext.HEADERS, put first when it is built
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#define HINTKV_AMX 1
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

// Each row's k largest values' indices (any order): one pass that keeps the best k seen, where a
// 16-value chunk with nothing above the k-th best costs one compare (almost every chunk of a vocab
// row). torch.topk took 1.4 ms of a 49152-wide 8-row head step here; the LM head rescoring
// (`W8A8HeadKernel`) needs only the set.
torch::Tensor topk_indices(torch::Tensor logits, int64_t k) {
    TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == torch::kFloat32, "logits must be float32 [M, V]");
    logits = logits.contiguous();
    const int64_t M = logits.size(0), V = logits.size(1);
    TORCH_CHECK(k >= 1 && k <= V, "k must be in [1, V]");
    auto out = torch::empty({M, k}, torch::kInt64);
    const float* lp = logits.data_ptr<float>();
    int64_t* op = out.data_ptr<int64_t>();
    at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
        std::vector<float> val(k);
        for (int64_t m = m0; m < m1; ++m) {
            const float* row = lp + m * V;
            int64_t* idx = op + m * k;
            for (int64_t j = 0; j < k; ++j) val[j] = row[j], idx[j] = j;
            int64_t lo = std::min_element(val.begin(), val.end()) - val.begin();
            auto offer = [&](int64_t i) {
                if (row[i] > val[lo]) {
                    val[lo] = row[i], idx[lo] = i;
                    lo = std::min_element(val.begin(), val.end()) - val.begin();
                }
            };
            int64_t i = k;
#if defined(__AVX512F__)
            for (; i < V && i % 16; ++i) offer(i);
            for (; i + 16 <= V; i += 16) {
                __mmask16 above = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), _mm512_set1_ps(val[lo]), _CMP_GT_OQ);
                for (; above; above &= above - 1) offer(i + __builtin_ctz(above));
            }
#elif defined(__AVX2__)
            for (; i < V && i % 8; ++i) offer(i);
            for (; i + 8 <= V; i += 8) {  // AMD Zen 3: the scalar pass was ~0.6 ms of a w8a8 b8 step's head
                int above = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), _mm256_set1_ps(val[lo]), _CMP_GT_OQ));
                for (; above; above &= above - 1) offer(i + __builtin_ctz(above));
            }
#endif
            for (; i < V; ++i) offer(i);
        }
    });
    return out;
}


// The few-row int8 GEMM (`gemv`, the decode team's entry points) follows in csrc/int8_gemv.cpp (int8_cpu.py
// builds the two files as one source).
