// attention(): the paged causal attention kernel's driver (see csrc/cpu_kernels.cpp's header): the step's K / V
// written into the cache, work items of (sequence, KV head, query tile) over OpenMP, K gathered transposed once
// per (sequence, KV head). Built last, after csrc/cpu_kernels.cpp and csrc/cpu_attention_tiles.cpp.

namespace {

constexpr int TILE_ROWS = 64; // query rows (tokens x group) per work item, at most
constexpr int DIRECT_ROWS = 16; // a sequence with at most this many rows reads K untransposed
// A direct sequence is then one query tile (make_items), so its item's rows (<= DIRECT_ROWS) fit a scratch of
// DIRECT_ROWS rows: the decode team (csrc/decode_team.cpp) relies on both.
static_assert(TILE_ROWS >= DIRECT_ROWS, "a direct sequence must fit one query tile");
// A step whose attention is fewer multiply-adds than this runs on the calling thread alone: an OpenMP
// region costs a worker's wake-up (tens of us when the pool's threads sleep between regions, as in the
// server, whose engine thread is not the process's first OpenMP thread), more than a decode step's
// attention (decode b8 at a 128-token context: 1M multiply-adds, ~50 us on one thread per layer).
constexpr int64_t SERIAL_MACS = int64_t(1) << 21;

#if defined(__AVX512F__)
constexpr bool FUSED = true;  // softmax_row16: the row max reduced only when it rises, the sum in 16 lanes
inline float row_sum(const float* l16) { return _mm512_reduce_add_ps(_mm512_loadu_ps(l16)); }
#elif defined(HK_AVX2)
constexpr bool FUSED = true;  // softmax_row8: the same on 8 lanes
inline float row_sum(const float* l8) { return hsum8(_mm256_loadu_ps(l8)); }
#else
constexpr bool FUSED = false;
inline float row_sum(const float*) { return 0.f; }
#endif

struct Item {
    int64_t b, h, t0, t1;  // sequence, KV head, query tokens [t0, t1) of the sequence's new tokens
};

// scratch that outlives a call: fresh multi-MB vectors per layer cost page faults and zeroing
float* scratch(std::vector<float>& buf, int64_t n) {
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
    return buf.data();
}

// one layer's attention over a step as the driver laid it out; attend_item runs one work item of it (the
// driver's threads, and the team step's items in csrc/decode_team.cpp)
struct AttnStep {
    const float* qd;  // queries: row t, head j at qd + t * qs0 + j * qs1
    int64_t qs0, qs1;
    const float* kd;  // the layer's cache; V at kd + half
    int64_t half;
    float* od;  // output [T, Hq, D]
    int64_t Hq, Hkv, G, D, BS, tq;
    double scale;
    const int64_t* qp;  // qsl
    const int64_t* cp;  // ctx
    const int64_t* const* tp;  // block tables
    const float* kt;  // K transposed (sequences that do not read K directly)
    const int64_t* koff;
    const char* direct;
};

struct AttnScratch {  // one thread's buffers for items of at most rmax rows
    std::vector<float> qb, ob, sb, mb, lb, l16;
    std::vector<int64_t> lastb;
    AttnScratch(int64_t rmax, int64_t D)
        : qb(rmax * D), ob(rmax * D), sb(rmax * KT), mb(rmax), lb(rmax), l16(FUSED ? rmax * LANE_SUMS : 0),
          lastb(rmax) {}
};

inline void attend_item(const AttnStep& a, const Item& item, AttnScratch& w) {
    const int64_t* qp = a.qp;
    const int64_t G = a.G, D = a.D, BS = a.BS, Hkv = a.Hkv;
    const int64_t b = item.b, h = item.h, S = a.cp[b], n = qp[b + 1] - qp[b];
    const int64_t R = (item.t1 - item.t0) * G;
    const float* kb = a.kt + a.koff[b * Hkv + h];
    const int64_t* tb = a.tp[b];
    const bool fused = FUSED && !a.direct[b];  // softmax_row16 / softmax_row8 (vector builds, transposed-K items)
    float* qb = w.qb.data();
    float* ob = w.ob.data();
    float* sb = w.sb.data();
    const float* kr[KT];
    const float* vr[KT];
    const float qscale = static_cast<float>(a.scale) * (fused ? kFusedUnit : 1.f);
    for (int64_t t = item.t0; t < item.t1; ++t)
        for (int64_t g = 0; g < G; ++g) {
            const int64_t r = (t - item.t0) * G + g;
            const float* src = a.qd + (qp[b] + t) * a.qs0 + (h * G + g) * a.qs1;
            for (int64_t d = 0; d < D; ++d) qb[r * D + d] = src[d] * qscale;
            w.lastb[r] = S - n + t;
        }
    std::fill(ob, ob + R * D, 0.f);
    std::fill(w.mb.begin(), w.mb.begin() + R, -std::numeric_limits<float>::infinity());
    std::fill(w.lb.begin(), w.lb.begin() + R, 0.f);
    if (fused) std::fill(w.l16.begin(), w.l16.begin() + R * LANE_SUMS, 0.f);
    const int64_t kend = S - n + item.t1;  // keys the tile's last row sees
    for (int64_t k0 = 0; k0 < kend; k0 += KT) {
        const int nk = static_cast<int>(std::min<int64_t>(KT, kend - k0));
        for (int j = 0; j < nk;) {  // the tile's rows block by block: one division per block, not per key
            const int64_t key = k0 + j, off = key % BS;
            const float* row = a.kd + ((tb[key / BS] * BS + off) * Hkv + h) * D;
            for (int64_t i = off; i < BS && j < nk; ++i, ++j, row += Hkv * D) {
                kr[j] = row;
                vr[j] = row + a.half;
            }
        }
#if defined(HK_AVX2)
        // the tile's V rows (scattered over the paged cache) fetched while the score tile runs: P V missed on
        // their first lines (Zen 3, a 128-row item over 2,048 cached keys; twenty-third session, history/engine.md)
        if (!a.direct[b])
            for (int j = 0; j < nk; ++j)
                for (int64_t d = 0; d < D; d += 16) __builtin_prefetch(vr[j] + d, 0, 3);
#endif
        int64_t r = 0;
        if (a.direct[b]) {
            score_direct(qb, R, D, kr, nk, sb);
#if defined(__AVX512F__) || defined(HK_AVX2)
        } else if (fused) {  // scores and softmax in one pass over each group of rows
            const float* ktile = kb + k0 * D;
            float* ls = w.l16.data();
            const int64_t* lb = w.lastb.data();
            for (; r + MR <= R; r += MR)
                score_softmax_tile<MR>(qb + r * D, D, ktile, sb + r * KT, k0, lb + r, w.mb.data() + r,
                                       ls + r * LANE_SUMS, ob + r * D);
#if defined(HK_AVX2)
            for (; r + 6 <= R; r += 6)  // the 6-row blocks' rate for a partial tile's rows (AVX2)
                score_softmax_tile<6>(qb + r * D, D, ktile, sb + r * KT, k0, lb + r, w.mb.data() + r,
                                      ls + r * LANE_SUMS, ob + r * D);
#endif
            for (; r + 4 <= R; r += 4)
                score_softmax_tile<4>(qb + r * D, D, ktile, sb + r * KT, k0, lb + r, w.mb.data() + r,
                                      ls + r * LANE_SUMS, ob + r * D);
            for (; r < R; ++r)
                score_softmax_tile<1>(qb + r * D, D, ktile, sb + r * KT, k0, lb + r, w.mb.data() + r,
                                      ls + r * LANE_SUMS, ob + r * D);
#endif
        } else {
            const float* ktile = kb + k0 * D;  // tile k0 / KT: [D][KT]
            for (; r + MR <= R; r += MR) score_tile<MR>(qb + r * D, D, ktile, sb + r * KT);
            for (; r + 4 <= R; r += 4) score_tile<4>(qb + r * D, D, ktile, sb + r * KT);
            for (; r < R; ++r) score_tile<1>(qb + r * D, D, ktile, sb + r * KT);
        }
        if (!fused) {
            for (r = 0; r < R; ++r) {
                const float alpha = softmax_row(sb + r * KT, nk, k0, w.lastb[r], w.mb[r], w.lb[r]);
                if (alpha != 1.f)
                    for (int64_t d = 0; d < D; ++d) ob[r * D + d] *= alpha;
            }
        }
        for (r = 0; r + PR <= R; r += PR) pv_tile<PR>(sb + r * KT, vr, nk, D, ob + r * D);
#if defined(HK_AVX2)
        for (; r + 6 <= R; r += 6) pv_tile<6>(sb + r * KT, vr, nk, D, ob + r * D);
#endif
        for (; r + 4 <= R; r += 4) pv_tile<4>(sb + r * KT, vr, nk, D, ob + r * D);
        for (; r < R; ++r) pv_tile<1>(sb + r * KT, vr, nk, D, ob + r * D);
    }
    for (int64_t t = item.t0; t < item.t1; ++t)
        for (int64_t g = 0; g < G; ++g) {
            const int64_t r = (t - item.t0) * G + g;
            const float inv = 1.f / (fused ? row_sum(w.l16.data() + r * LANE_SUMS) : w.lb[r]);
            float* dst = a.od + ((qp[b] + t) * a.Hq + h * G + g) * D;
            for (int64_t d = 0; d < D; ++d) dst[d] = ob[r * D + d] * inv;
        }
}

// The rules attention() and the decode team (csrc/decode_team.cpp) share, written once here:
// a sequence of n new rows (x its GQA group G) at most DIRECT_ROWS reads K untransposed (the team's whole case),
inline bool is_direct(int64_t n, int64_t G) { return n * G <= DIRECT_ROWS; }
// query tokens per work item (a query tile of at most TILE_ROWS rows: a direct sequence's rows fit one; on AVX2,
// whose score and P V blocks take 6 rows, the most tokens whose rows are a multiple of 6, if that keeps >= 48 rows:
// G = 4 takes 15 tokens (60 rows) where 16 (64) left every tile a 4-row block at about half the 6-row blocks' rate
// per row, Zen 3, perf),
inline int64_t tile_tokens(int64_t G) {
    const int64_t most = std::max<int64_t>(1, TILE_ROWS / G);
#if defined(HK_AVX2)
    for (int64_t t = most; t * G >= 48; --t)
        if ((t * G) % 6 == 0) return t;
#endif
    return most;
}
// and the step's query offsets: B+1 entries from 0 to T, one block table a sequence (B of them).
// `what` names the caller in the error.
void check_qsl(const char* what, const std::vector<int64_t>& qsl, size_t B, size_t ntables, int64_t T) {
    TORCH_CHECK(qsl.size() == B + 1 && qsl[0] == 0 && qsl[B] == T && ntables == B,
                what, ": qsl must have B+1 entries from 0 to T, tables B");
}

// The step's block tables checked against its lengths (the rules of every caller: attention(), decode_team()):
// each sequence has 0 < new rows <= context, a table covering its context, block ids in [0, NB). Returns the
// tables' data (`tables` made contiguous in place, so the pointers outlive the call).
std::vector<const int64_t*> check_tables(std::vector<torch::Tensor>& tables, const std::vector<int64_t>& qsl,
                                         const std::vector<int64_t>& ctx, int64_t NB, int64_t BS) {
    const int64_t B = static_cast<int64_t>(ctx.size());
    std::vector<const int64_t*> tp(B);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t n = qsl[b + 1] - qsl[b], nblocks = (ctx[b] + BS - 1) / BS;
        tables[b] = tables[b].contiguous();
        TORCH_CHECK(tables[b].scalar_type() == torch::kInt64, "block tables must be int64");
        TORCH_CHECK(n > 0 && n <= ctx[b] && nblocks <= tables[b].numel(), "sequence ", b, ": bad lengths");
        tp[b] = tables[b].data_ptr<int64_t>();
        for (int64_t i = 0; i < nblocks; ++i)
            TORCH_CHECK(tp[b][i] >= 0 && tp[b][i] < NB, "sequence ", b, ": block id out of range");
    }
    return tp;
}

// The step's T cache slots, int64 and each in [0, nslots) (contiguous: the caller reads its data)
torch::Tensor check_slots(const torch::Tensor& slots, int64_t T, int64_t nslots) {
    TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.numel() == T, "slots must be int64 [T]");
    auto sl = slots.contiguous();
    const int64_t* sp = sl.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sp[t] >= 0 && sp[t] < nslots, "slot out of range");
    return sl;
}

// The step's work items: (sequence, KV head, query tile of tq tokens), costliest first (a causal tile's keys grow
// along its sequence). A thread takes the next item off a shared counter, so a thread the OS deschedules (a loaded
// machine) holds up at most one item instead of its whole static share; on free cores it splits like a
// round-robin. An item's arithmetic does not depend on which thread runs it: outputs are identical.
std::vector<Item> make_items(const std::vector<int64_t>& qsl, const std::vector<int64_t>& ctx, int64_t Hkv,
                             int64_t tq) {
    std::vector<Item> items;
    const int64_t B = static_cast<int64_t>(ctx.size());
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t0 = 0, n = qsl[b + 1] - qsl[b]; t0 < n; t0 += tq)
            for (int64_t h = 0; h < Hkv; ++h) items.push_back({b, h, t0, std::min(n, t0 + tq)});
    const int64_t* qp = qsl.data();
    const int64_t* cp = ctx.data();
    std::stable_sort(items.begin(), items.end(), [&](const Item& x, const Item& y) {
        return cp[x.b] - (qp[x.b + 1] - qp[x.b]) + x.t1 > cp[y.b] - (qp[y.b + 1] - qp[y.b]) + y.t1;
    });
    return items;
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
    // the fused softmax rescales an output row in whole vectors (16 floats on AVX-512, 8 on AVX2)
    TORCH_CHECK(D % 16 == 0, "attention: head_dim must be a multiple of 16, got ", D);
    const int64_t G = Hq / Hkv, B = static_cast<int64_t>(ctx.size());
    check_qsl("attention", qsl, ctx.size(), tables.size(), T);
    const int64_t* qp = qsl.data();
    const int64_t* cp = ctx.data();
    const std::vector<const int64_t*> tp = check_tables(tables, qsl, ctx, NB, BS);
    if (k.numel() > 0) {  // the step's new K / V rows into their slots first
        TORCH_CHECK(k.dim() == 3 && v.dim() == 3 && k.size(0) == T && v.size(0) == T && k.size(1) == Hkv &&
                    v.size(1) == Hkv && k.size(2) == D && v.size(2) == D && k.stride(2) == 1 && v.stride(2) == 1 &&
                    k.scalar_type() == torch::kFloat32 && v.scalar_type() == torch::kFloat32,
                    "k, v must be float32 [T, Hkv, D]");
        auto sl = check_slots(slots, T, NB * BS);
        const int64_t* sp = sl.data_ptr<int64_t>();
        float* kvp = kv.data_ptr<float>();
        const float* kp = k.data_ptr<float>();
        const float* vp = v.data_ptr<float>();
        const int64_t half_n = NB * BS * Hkv * D;
        for (int64_t t = 0; t < T; ++t) {
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
        direct[b] = is_direct(qp[b + 1] - qp[b], G);
        spad[b] = direct[b] ? 0 : (cp[b] + KT - 1) / KT * KT;
        for (int64_t h = 0; h < Hkv; ++h) koff[b * Hkv + h + 1] = koff[b * Hkv + h] + D * spad[b];
    }
    const int64_t tq = tile_tokens(G);
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
                int64_t j = 0;
#if defined(HK_AVX2)
                if (s0 + BS < S)  // the next block's rows (anywhere in the paged cache) on their way
                    for (int64_t i = 0, nxt = tp[b][s0 / BS + 1]; i < BS; ++i)
                        for (int64_t d = 0; d < D; d += 16) __builtin_prefetch(kd + ((nxt * BS + i) * Hkv + h) * D + d);
                if (BS % 8 == 0)  // 8 keys (one block's, inside one key tile) at a time, 8 x 8 in registers
                    for (; j + 8 <= n; j += 8) {
                        const int64_t key = s0 + j;
                        transpose8_rows(kd + ((blk * BS + j) * Hkv + h) * D, Hkv * D, D,
                                        kb + (key / KT) * D * KT + key % KT);
                    }
#endif
                for (; j < n; ++j) {
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

    const std::vector<Item> items = make_items(qsl, ctx, Hkv, tq);
    const int64_t ni = static_cast<int64_t>(items.size());
    std::atomic<int64_t> next{0};
    const int64_t nt = serial ? 1 : std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), ni));
    const AttnStep step{qd, qs0, qs1, kd, half, od, Hq, Hkv, G, D, BS, tq, scale, qp, cp, tp.data(), kt,
                        koff.data(), direct.data()};
    auto work = [&](int64_t, int64_t) {
        AttnScratch w(tq * G, D);
        for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < ni;) attend_item(step, items[it], w);
    };
    if (nt == 1) work(0, 1);
    else at::parallel_for(0, nt, 1, work);
    return out;
}

// The test entry: the few-row items' scores (score_direct) of the rows q [R, D] (R <= DIRECT_ROWS) against the key
// rows k [nk, D] (nk <= KT), [R, nk]
torch::Tensor direct_scores(torch::Tensor q, torch::Tensor k) {
    TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && q.scalar_type() == torch::kFloat32 &&
                k.scalar_type() == torch::kFloat32 && q.is_contiguous() && k.is_contiguous() && q.size(1) == k.size(1),
                "q, k must be contiguous float32 [R, D], [nk, D]");
    const int64_t R = q.size(0), D = q.size(1), nk = k.size(0);
    TORCH_CHECK(R <= DIRECT_ROWS && nk <= KT, "direct_scores: at most ", DIRECT_ROWS, " rows and ", KT, " keys");
    std::vector<const float*> rows(nk);
    for (int64_t j = 0; j < nk; ++j) rows[j] = k.data_ptr<float>() + j * D;
    std::vector<float> s(R * KT);
    score_direct(q.data_ptr<float>(), R, D, rows.data(), static_cast<int>(nk), s.data());
    auto out = torch::empty({R, nk}, torch::kFloat32);
    for (int64_t r = 0; r < R; ++r) std::memcpy(out.data_ptr<float>() + r * nk, s.data() + r * KT, nk * sizeof(float));
    return out;
}
