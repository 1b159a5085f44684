// W8A8's few-row int8 GEMM: `gemv` (decode and verify steps) and decode_team.cpp's entry points. int8_cpu.py
// appends this file to int8_cpu.cpp (its includes, quantize_range and check_x) and builds them as one extension.

// The table team_address() gives decode_team.cpp: `Int8Team`, csrc/int8_team.h (int8_cpu.py prepends it)

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static constexpr bool kFastGemv = true;
static constexpr const char* kGemvIsa = "vnni";
static constexpr int kMaxG = 8;
static constexpr bool kU8Offset = true;  // dpbusd takes u8 x s8: activations go in as q + 128
static constexpr int64_t kTwoBlockRows = 2;  // block_dot_two's pass up to this many int8 rows (Zen 4, below)
// G activation rows (u8, q + 128, as int32 groups of 4) against one 16-channel block of the weight
// ([Kq][16][4] int8): acc[g] holds the block's 16 dot products, no horizontal sums.
template <int G>
static inline void block_dot_one(const int32_t* const* a, const int8_t* wb, int64_t Kq, int32_t (*out)[16]) {
    __m512i acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
    for (int64_t kq = 0; kq < Kq; ++kq) {
        const __m512i wv = _mm512_loadu_si512(wb + kq * 64);
        for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_set1_epi32(a[g][kq]), wv);
    }
    for (int g = 0; g < G; ++g) _mm512_storeu_si512(out[g], acc[g]);
}
// The same against two consecutive blocks (out[g], out[ostride + g]): each broadcast row value feeds two dpbusd.
// Only for 1-2 rows (a one-row step's two levels): Zen 4, one thread, CPU us, old one-block / two-block loop, a
// dummy:tiny layer's four int8 linears: 1 row 145 / 67 (2.2x); at 2-8 rows the one-block loop stays faster.
template <int G>
static inline void block_dot_two(const int32_t* const* a, const int8_t* wb, int64_t Kq, int32_t (*out)[16],
                                 int64_t ostride) {
    __m512i acc0[G], acc1[G];
    for (int g = 0; g < G; ++g) acc0[g] = acc1[g] = _mm512_setzero_si512();
    const int8_t* wb1 = wb + Kq * 64;
    for (int64_t kq = 0; kq < Kq; ++kq) {
        const __m512i w0 = _mm512_loadu_si512(wb + kq * 64), w1 = _mm512_loadu_si512(wb1 + kq * 64);
        for (int g = 0; g < G; ++g) {
            const __m512i av = _mm512_set1_epi32(a[g][kq]);
            acc0[g] = _mm512_dpbusd_epi32(acc0[g], av, w0);
            acc1[g] = _mm512_dpbusd_epi32(acc1[g], av, w1);
        }
    }
    for (int g = 0; g < G; ++g) {
        _mm512_storeu_si512(out[g], acc0[g]);
        _mm512_storeu_si512(out[ostride + g], acc1[g]);
    }
}
#elif defined(__AVX2__)
// AVX2 without VNNI (e.g. AMD Zen 1): activations stay signed (q, no u8 offset, so no w_comp); vpmaddubsw
// multiplies |a| (u8) by sign(a) w (s8) into int16 pair sums, exact since 2 x 127 x 127 < 2^15, and
// vpmaddwd by 1 widens them to int32 quad sums: the same int32 dot products as dpbusd's, 8 channels a register.
static constexpr bool kFastGemv = true;
static constexpr const char* kGemvIsa = "avx2";
static constexpr int kMaxG = 4;  // 8 int32 accumulators of 16 ymm registers for 4 rows
static constexpr bool kU8Offset = false;
// block_dot_two's passes (each row against two blocks) up to 2 int8 rows (a one-row step's two levels), as with VNNI.
// AMD EPYC Zen 3, one thread, CPU us, main / this, same process interleaved, load 6-8: one-row steps 1.13-1.21x
// (with the vector rescale); two-block passes for 16 rows (b8) measured 0.89-1.0x the 4-row one-block passes.
static constexpr int64_t kTwoBlockRows = 2;
// |a| and sign(a) w for one activation quad against one 32-byte half of a block: 8 int32 quad sums
static inline __m256i quad_dots(__m256i ax, __m256i av, __m256i w, __m256i ones) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, av)), ones);
}
template <int G>
static inline void block_dot_one(const int32_t* const* a, const int8_t* wb, int64_t Kq, int32_t (*out)[16]) {
    __m256i acc[G][2];
    for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t kq = 0; kq < Kq; ++kq) {
        // 8 lines on (the block's stream crosses into the next block): dummy:tiny's one-row head 2.50 -> 2.05 ms
        _mm_prefetch(reinterpret_cast<const char*>(wb + kq * 64 + 512), _MM_HINT_T0);
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kq * 64));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kq * 64 + 32));
        for (int g = 0; g < G; ++g) {
            const __m256i av = _mm256_set1_epi32(a[g][kq]), ax = _mm256_abs_epi8(av);
            acc[g][0] = _mm256_add_epi32(acc[g][0], quad_dots(ax, av, w0, ones));
            acc[g][1] = _mm256_add_epi32(acc[g][1], quad_dots(ax, av, w1, ones));
        }
    }
    for (int g = 0; g < G; ++g) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[g]), acc[g][0]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[g] + 8), acc[g][1]);
    }
}
// The same against two consecutive blocks (out[g], out[ostride + g]), 1-2 rows a pass: each row's broadcast and |a|
// feed four vpmaddubsw instead of two, in 8 accumulators + 4 weight registers (kTwoBlockRows above).
template <int G>
static inline void block_dot_two(const int32_t* const* a, const int8_t* wb, int64_t Kq, int32_t (*out)[16],
                                 int64_t ostride) {
    __m256i acc[G][4];
    for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t* wb1 = wb + Kq * 64;
    for (int64_t kq = 0; kq < Kq; ++kq) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + kq * 64 + 512), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(wb1 + kq * 64 + 512), _MM_HINT_T0);
        const __m256i w[4] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kq * 64)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kq * 64 + 32)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb1 + kq * 64)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb1 + kq * 64 + 32))};
        for (int g = 0; g < G; ++g) {
            const __m256i av = _mm256_set1_epi32(a[g][kq]), ax = _mm256_abs_epi8(av);
            for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_add_epi32(acc[g][j], quad_dots(ax, av, w[j], ones));
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
static constexpr bool kFastGemv = false;
static constexpr const char* kGemvIsa = "plain";
static constexpr int kMaxG = 8;
static constexpr bool kU8Offset = true;
static constexpr int64_t kTwoBlockRows = 2;
template <int G>
static inline void block_dot_one(const int32_t* const* a, const int8_t* wb, int64_t Kq, int32_t (*out)[16]) {
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
#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__)) && !defined(__AVX2__)
// one block after the other
template <int G>
static inline void block_dot_two(const int32_t* const* a, const int8_t* wb, int64_t Kq, int32_t (*out)[16],
                                 int64_t ostride) {
    block_dot_one<G>(a, wb, Kq, out);
    block_dot_one<G>(a, wb + Kq * 64, Kq, out + ostride);
}
#endif

// every row against one block (kMaxG rows a pass, then 4, then 1; 2 where kMaxG < 8), as before the two-block loop
static void rows_dot_one(const int32_t* const* rows, int64_t R, const int8_t* wb, int64_t Kq, int32_t (*out)[16]) {
    int64_t r = 0;
    if constexpr (kMaxG >= 8)
        for (; r + 8 <= R; r += 8) block_dot_one<8>(rows + r, wb, Kq, out + r);
    for (; r + 4 <= R; r += 4) block_dot_one<4>(rows + r, wb, Kq, out + r);
    if constexpr (kMaxG < 8)
        for (; r + 2 <= R; r += 2) block_dot_one<2>(rows + r, wb, Kq, out + r);
    for (; r < R; ++r) block_dot_one<1>(rows + r, wb, Kq, out + r);
}

// One 16-channel block's outputs from its int32 dot products out[l * M + m] (levels x M rows): y[m, n] =
// (sum over levels of float(dot - comp[n]) * s[l * M + m]) * w_scale[n], n < count; y's rows ldy apart. The
// AVX-512 and AVX2 loops run the scalar loop's operations in its order (no FMA: this file is built without
// contraction), so the same bits; the AVX-512 one cut a 16-row (w8a8 b8) gate_up call's ~50 us of scalar rescale (Zen 4,
// one thread).
static inline void rescale_block(const int32_t (*out)[16], int64_t M, int64_t levels, const float* s,
                                 const int32_t* comp, const float* wsc, float* y, int64_t ldy, int64_t count) {
#if defined(__AVX512F__)
    if (count == 16) {
        const __m512i c = comp ? _mm512_loadu_si512(comp) : _mm512_setzero_si512();
        const __m512 w = _mm512_loadu_ps(wsc);
        for (int64_t m = 0; m < M; ++m) {
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(out[m]), c)),
                                     _mm512_set1_ps(s[m]));
            for (int64_t l = 1; l < levels; ++l) {
                const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(out[l * M + m]), c));
                v = _mm512_add_ps(v, _mm512_mul_ps(dot, _mm512_set1_ps(s[l * M + m])));
            }
            _mm512_storeu_ps(y + m * ldy, _mm512_mul_ps(v, w));
        }
        return;
    }
#elif defined(__AVX2__)
    if (count == 16) {  // the same operations 8 channels at a time (Zen 3: the scalar loop was ~15% of gemv's time)
        for (int h = 0; h < 16; h += 8) {
            const __m256i c = comp ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(comp + h))
                                   : _mm256_setzero_si256();
            const __m256 w = _mm256_loadu_ps(wsc + h);
            for (int64_t m = 0; m < M; ++m) {
                const __m256i d0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out[m] + h));
                __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(d0, c)), _mm256_set1_ps(s[m]));
                for (int64_t l = 1; l < levels; ++l) {
                    const __m256i dl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out[l * M + m] + h));
                    v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dl, c)),
                                                       _mm256_set1_ps(s[l * M + m])));
                }
                _mm256_storeu_ps(y + m * ldy + h, _mm256_mul_ps(v, w));
            }
        }
        return;
    }
#endif
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < count; ++n) {
            const int32_t cn = comp ? comp[n] : 0;
            float v = static_cast<float>(out[m][n] - cn) * s[m];
            for (int64_t l = 1; l < levels; ++l) v += static_cast<float>(out[l * M + m][n] - cn) * s[l * M + m];
            y[m * ldy + n] = v * wsc[n];
        }
    }
}

bool has_fast_gemv() { return kFastGemv; }
// the few-row loop this build runs without AMX: "vnni" (AVX512-VNNI), "avx2" (vpmaddubsw) or "plain"
std::string gemv_isa() { return kGemvIsa; }

// How many gemv calls each path ran in this process: [AMX, VNNI / plain loop] (what tests and the
// bench read to know the AMX path really ran; relaxed atomics, a call costs one add).
static std::atomic<int64_t> gemv_path_calls[2];
std::vector<int64_t> gemv_calls() { return {gemv_path_calls[0].load(), gemv_path_calls[1].load()}; }

#ifdef HINTKV_AMX
// AMX: one tdpbssd multiplies a tile of up to 16 int8 activation rows x 64 k by 16 k-quads x 16
// channels of the weight (gemv's 16-channel blocks, 16 quads at a time: block_weight pads K to 64),
// 16 x 16 x 64 multiply-adds where a dpbusd does 16 x 4 for one activation row. Linux hands a
// process the tile registers only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA), once.
static bool amx_ready() {
    static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ok;
}

struct TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// tiles 0-3: accumulators (R rows x 16 int32), 4: activations (R x 64 int8), 5-7: weight (16 x 64)
static void amx_configure(int R) {
    TileConfig c;
    for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = t < 5 ? R : 16;
    _tile_loadconfig(&c);
}

// G (1-4) consecutive 16-channel blocks against R activation rows a [R, Kq * 4] (row stride lda):
// out [G][R][16] int32
template <int G>
static void amx_blocks(const int8_t* a, int64_t lda, const int8_t* wb, int64_t Kq, int32_t* out, int R) {
    _tile_zero(0);
    if (G > 1) _tile_zero(1);
    if (G > 2) _tile_zero(2);
    if (G > 3) _tile_zero(3);
    for (int64_t kq = 0; kq < Kq; kq += 16) {
        _tile_loadd(4, a + kq * 4, lda);
        _tile_loadd(5, wb + kq * 64, 64);
        _tile_dpbssd(0, 4, 5);
        if (G > 1) { _tile_loadd(6, wb + (Kq + kq) * 64, 64); _tile_dpbssd(1, 4, 6); }
        if (G > 2) { _tile_loadd(7, wb + (2 * Kq + kq) * 64, 64); _tile_dpbssd(2, 4, 7); }
        if (G > 3) { _tile_loadd(5, wb + (3 * Kq + kq) * 64, 64); _tile_dpbssd(3, 4, 5); }
    }
    _tile_stored(0, out, 64);
    if (G > 1) _tile_stored(1, out + R * 16, 64);
    if (G > 2) _tile_stored(2, out + 2 * R * 16, 64);
    if (G > 3) _tile_stored(3, out + 3 * R * 16, 64);
}

// gemv's AMX path: the quantized rows qp [R, K] (R = levels * M <= 16) against the blocked weight,
// signed x signed (no u8 offset), each group of 4 blocks rescaled as gemv's VNNI path does.
static torch::Tensor gemv_amx(const int8_t* qp, const std::vector<float>& s, int64_t M, int64_t K, int64_t levels,
                              const torch::Tensor& wb, const torch::Tensor& w_scale) {
    const int64_t R = levels * M, Nb = wb.size(0), Kq = wb.size(1), lda = Kq * 4, N = w_scale.numel();
    std::vector<int8_t> a(R * lda, 0);
    for (int64_t r = 0; r < R; ++r) std::copy(qp + r * K, qp + (r + 1) * K, a.data() + r * lda);
    auto y = torch::empty({M, N}, torch::kFloat32);
    float* yp = y.data_ptr<float>();
    const int8_t* wp = wb.data_ptr<int8_t>();
    auto wsc = w_scale.contiguous();
    const float* wsp = wsc.data_ptr<float>();
    const int64_t groups = (Nb + 3) / 4;
    // a chunk of at least ~4M multiply-adds (a tile multiply does ~16x a dpbusd row's work)
    const int64_t grain = std::max<int64_t>(4, (1 << 22) / std::max<int64_t>(1, 64 * Kq * 4 * R));
    at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
        amx_configure(static_cast<int>(R));
        std::vector<int32_t> acc(4 * R * 16);
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t nb0 = g * 4, nblocks = std::min<int64_t>(4, Nb - nb0);
            const int8_t* wbp = wp + nb0 * Kq * 64;
            switch (nblocks) {
                case 4: amx_blocks<4>(a.data(), lda, wbp, Kq, acc.data(), R); break;
                case 3: amx_blocks<3>(a.data(), lda, wbp, Kq, acc.data(), R); break;
                case 2: amx_blocks<2>(a.data(), lda, wbp, Kq, acc.data(), R); break;
                default: amx_blocks<1>(a.data(), lda, wbp, Kq, acc.data(), R); break;
            }
            for (int64_t b = 0; b < nblocks; ++b) {
                const int32_t* ob = acc.data() + b * R * 16;
                const int64_t n0 = (nb0 + b) * 16, n1 = std::min<int64_t>(n0 + 16, N);
                for (int64_t m = 0; m < M; ++m) {
                    for (int64_t n = n0; n < n1; ++n) {
                        float v = static_cast<float>(ob[m * 16 + n - n0]) * s[m];
                        for (int64_t l = 1; l < levels; ++l)
                            v += static_cast<float>(ob[(l * M + m) * 16 + n - n0]) * s[l * M + m];
                        yp[m * N + n] = v * wsp[n];
                    }
                }
            }
        }
        _tile_release();
    });
    return y;
}
bool has_amx() { return amx_ready(); }
#else
bool has_amx() { return false; }
#endif

// The loop's activation rows a [R][Kq] int32 from q [R, K]: u8 q + 128 padded with 128 (q = 0) where the loop
// takes u8 activations, else q padded with 0.
static void loop_rows(const int8_t* qp, int64_t R, int64_t K, int64_t Kq, int32_t* a) {
    const uint8_t offset = kU8Offset ? 0x80 : 0;
    std::fill(a, a + R * Kq, kU8Offset ? 0x80808080 : 0);
    for (int64_t r = 0; r < R; ++r) {
        uint8_t* ar = reinterpret_cast<uint8_t*>(a + r * Kq);
        for (int64_t k = 0; k < K; ++k) ar[k] = static_cast<uint8_t>(qp[r * K + k]) ^ offset;
    }
}

// every row against two consecutive blocks (out[r], out[R + r]): two rows a pass, then one
static void rows_dot_two(const int32_t* const* rows, int64_t R, const int8_t* wb, int64_t Kq, int32_t (*out)[16]) {
    int64_t r = 0;
    for (; r + 2 <= R; r += 2) block_dot_two<2>(rows + r, wb, Kq, out + r, R);
    if (r < R) block_dot_two<1>(rows + r, wb, Kq, out + r, R);
}

#ifndef HK_GEMV_ROWS
#error "HK_GEMV_ROWS: int8_cpu.py's GEMV_ROWS, passed by its build"
#endif
constexpr int64_t kStackRows = HK_GEMV_ROWS;  // int8_cpu.py's GEMV_ROWS: every decode / verify step's int8 rows
// Output channels [n0, n1) from the loop's rows a (levels x M rows, scales s), on the calling thread, into y (channel
// n0 of row m at y[m * ldy]): the blocks that hold them, only those channels written (a range may start or end
// inside a block).
static void block_range(const int32_t* a, int64_t M, int64_t levels, int64_t Kq, const int8_t* wp, const float* s,
                        const int32_t* cp, const float* wsp, int64_t N, float* y, int64_t ldy, int64_t n0, int64_t n1) {
    const int64_t R = levels * M, b0 = n0 / 16, b1 = (n1 + 15) / 16;
    // scratch on the stack up to kStackRows rows (the team calls this once per item, hundreds of times a w8a8 step:
    // review_int8team finding 8), on the heap past it (gemv's own callers may pass more rows)
    int32_t acc_s[2 * kStackRows * 16];  // two blocks' dot products (R <= kTwoBlockRows), else one's
    float tmp_s[kStackRows * 16];
    const int32_t* rows_s[kStackRows];
    std::vector<int32_t> acc_h;
    std::vector<float> tmp_h;
    std::vector<const int32_t*> rows_h;
    int32_t* acc = acc_s;
    float* tmp = tmp_s;
    const int32_t** rows = rows_s;
    if (R > kStackRows) {
        acc_h.resize(2 * R * 16), tmp_h.resize(M * 16), rows_h.resize(R);
        acc = acc_h.data(), tmp = tmp_h.data(), rows = rows_h.data();
    }
    auto out = reinterpret_cast<int32_t (*)[16]>(acc);
    for (int64_t r = 0; r < R; ++r) rows[r] = a + r * Kq;
    const int64_t step = R <= kTwoBlockRows ? 2 : 1;
    for (int64_t nb = b0; nb < b1; nb += step) {
        const int64_t nblocks = std::min<int64_t>(step, b1 - nb);
        const int8_t* wbp = wp + nb * Kq * 64;
        if (nblocks == 1 || R == 0)  // R == 0: a 0-row call (rows_dot_one runs no pass)
            rows_dot_one(rows, R, wbp, Kq, out);
        else
            rows_dot_two(rows, R, wbp, Kq, out);
        for (int64_t b = 0; b < nblocks; ++b) {
            const int64_t c0 = (nb + b) * 16, lo = std::max(c0, n0), hi = std::min({c0 + 16, n1, N});
            if (lo >= hi) continue;
            if (lo == c0 && hi == c0 + 16) {  // a whole block: straight into y
                rescale_block(out + b * R, M, levels, s, kU8Offset ? cp + c0 : nullptr, wsp + c0, y + (c0 - n0), ldy,
                              16);
                continue;
            }
            const int64_t count = std::min<int64_t>(16, N - c0);
            rescale_block(out + b * R, M, levels, s, kU8Offset ? cp + c0 : nullptr, wsp + c0, tmp, 16, count);
            for (int64_t m = 0; m < M; ++m) std::copy(tmp + m * 16 + (lo - c0), tmp + m * 16 + (hi - c0),
                                                      y + m * ldy + (lo - n0));
        }
    }
}

// y [M, N] ~= x [M, K] W^T for a few rows: quantize x (levels), then read the int8 weight once for
// all levels*M activation rows. `wb` is the weight in 16-channel blocks [ceil(N/16), ceil(K/4), 16, 4]
// (`block_weight` in int8.py) so AVX512-VNNI's dpbusd (u8 x s8, 4 products per int32 lane) fills 16
// channels per instruction; activations go in as q + 128 and w_comp [>= N] = 128 sum_k w[n, k]
// takes the offset back out. Then each row's levels are rescaled and summed.
torch::Tensor gemv(torch::Tensor x, torch::Tensor inv_smooth, torch::Tensor wb, torch::Tensor w_scale,
                   torch::Tensor w_comp, int64_t levels, bool amx) {
    check_x(x, inv_smooth);
    if (wb.dim() == 4 && wb.size(3) == 2) {  // depth 2: int16_gemv.cpp's kernel, one 14-bit level a row
        TORCH_CHECK(levels == 1, "a depth-2 weight takes levels = 1 (one 14-bit row per token)");
        gemv_path_calls[1].fetch_add(1, std::memory_order_relaxed);
        return gemv_pairs(x.contiguous(), inv_smooth.contiguous(), wb, w_scale);
    }
    TORCH_CHECK(wb.dim() == 4 && wb.scalar_type() == torch::kInt8 && wb.is_contiguous() && wb.size(2) == 16 &&
                wb.size(3) == 4 && wb.size(1) * 4 >= x.size(1), "wb must be contiguous int8 [Nb, Kq, 16, 4] or [Nb, Kp, 16, 2]");
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
#ifdef HINTKV_AMX
    // R >= 1: a 0-row tile config (rows = 0, colsb = 64) faults in ldtilecfg
    if (amx && R >= 1 && R <= 16 && Kq % 16 == 0 && amx_ready()) {
        gemv_path_calls[0].fetch_add(1, std::memory_order_relaxed);
        return gemv_amx(qp, s, M, K, levels, wb, w_scale);
    }
#endif
    gemv_path_calls[1].fetch_add(1, std::memory_order_relaxed);
    std::vector<int32_t> a(R * Kq);
    loop_rows(qp, R, K, Kq, a.data());
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
        block_range(a.data(), M, levels, Kq, wp, s.data(), cp, wsp, N, yp + b0 * 16, N, b0 * 16, std::min(N, b1 * 16));
    });
    return y;
}

// gemv's address, for decode_layers.cpp's fused step to call this build of it (compiled with this file's
// flags, which differ from the fused file's): an int64 that is a `torch::Tensor (*)(...)` of gemv's signature.
int64_t gemv_address() { return reinterpret_cast<int64_t>(&gemv); }

// For decode_team.cpp (another build: it calls these through the table's address). team_prepare quantizes x [M, K]
// (times inv_smooth, or null) as gemv does and lays out its loop rows: q [levels*M, K], a [levels*M, Kq], s
// [levels*M]; team_blocks then computes y's channels [n0, n1) on the calling thread, the same bits as gemv's (no AMX:
// integer sums are exact, so AMX's would be the same values). depth 2 (a [Nb, Kp, 16, 2] weight, levels 1): the
// int16 kernel's rows a [M, Kp] (q unused) and pair_range.
static void team_prepare(const float* x, const float* inv_smooth, int64_t M, int64_t K, int64_t levels, int64_t Kq,
                         int64_t depth, int8_t* q, int32_t* a, float* s) {
    if (depth == 2) return quantize_pairs(x, inv_smooth, M, K, Kq, a, s);
    quantize_range(x, inv_smooth, M, K, levels, q, s, 0, M);
    loop_rows(q, levels * M, K, Kq, a);
}
static void team_blocks(const int32_t* a, int64_t M, int64_t levels, int64_t Kq, int64_t depth, const int8_t* wp,
                        const float* s, const int32_t* cp, const float* wsp, int64_t N, float* y, int64_t ldy,
                        int64_t n0, int64_t n1) {
    if (depth == 2) return pair_range(a, M, Kq, wp, s, wsp, N, y, ldy, n0, n1);
    block_range(a, M, levels, Kq, wp, s, cp, wsp, N, y, ldy, n0, n1);
}
static const Int8Team kInt8Team{INT8_TEAM_ABI, team_prepare, team_blocks};
int64_t team_address() { return kFastGemv ? reinterpret_cast<int64_t>(&kInt8Team) : 0; }
