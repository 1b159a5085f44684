// Every decoder layer of a few-row decode step in ONE OpenMP region (decode_layers.py calls it when
// HINTKV_DECODE_TEAM=1, or when auto, the default, chooses it (team_choice.py): it wins on free cores and loses under
// a shared machine's load; its docstring).
//
// decode_team(h, tensors, codes, cos, sin, kvs, slots, tables, qsl, ctx, scale, eps, hq, hkv, D, int8_team,
//             fine_rows)
//   -> {h, residual} after the last layer, as decode_layers() (same tensor layout), or {} when the step is not its
//   case (a sequence whose rows x GQA group exceed attention's DIRECT_ROWS). W8A8's int8 linears run int8_cpu's
//   own build through the table at `int8_team` (int8_cpu.team_address(): quantize the input rows once, in the tail
//   of the phase that wrote them, then each item's output channels), the same bits as its gemv in decode_layers().
//
// Why: decode_layers() runs each kernel as its own OpenMP region: 4 gemv + 1 attention (more than SERIAL_MACS, e.g.
// decode b8) per layer, 40 regions in a dummy:tiny b8 step. Between regions hintkv's workers sleep (GOMP_SPINCOUNT
// =100, openmp_env.py), so each region pays a futex wake-up; and a region splits its work statically, so a worker
// the OS preempted (the server's event loop, the client, another process) holds the whole step at the join.
// Here the step forks once. Its work is 5 phases per layer (q/k/v heads with RoPE and the K/V write, attention
// items, o_proj column chunks, gate/up column chunks with SiLU-mul, down column chunks); every thread takes the
// next item of the current phase off a shared counter and waits (spin, then a futex) only for the phase's end: its
// last item, then its tail, the next norm over the step's few rows, run by the thread that finished that item
// (o_proj's: norm2; down's: the next layer's norm1; layer 0's norm1 runs before the fork). A late or preempted
// thread holds up at most the item it holds: the others take the rest. One thread alone runs every phase (the same
// code, no region).
//
// Each item runs the per-op kernels' own functions (hk_kernels' add_rmsnorm_row, rope_head, silu_mul_span,
// attend_item; hk_gemv's gemv_blocks; int8_cpu's quantize and block loop through its table) on the same values in the
// same per-element order: the outputs are bit-identical to decode_layers() and to the per-op layers
// (tests/models/test_decode_layers.py).

namespace {

// int8_cpu's table: `Int8Team`, csrc/int8_team.h (decode_layers.py prepends it; its abi checked in decode_team())

// One linear of a team step: its tensors (decode_layers.cpp's LIN layout), its code, and for an int8 one the input
// rows prepared by `prepare` (once per step, before the phase whose items read them)
struct TeamLinear {
    const torch::Tensor* t = nullptr;
    bool int8 = false;  // false: the float weight (code 0, or w8a8-fine past fine_rows rows, as decode_layers.cpp)
    bool fine = false;  // w8a8-fine: 2N stacked channels, the second N added to the first
    int64_t levels = 1, K = 0, Kq = 0, N = 0, depth = 4;  // depth: the blocked weight's (4 int8 quads, 2 int16 pairs)
    std::vector<int8_t> q;
    std::vector<int32_t> a;
    std::vector<float> s;
};

// Futex sleeps, and those of them that ran to their 1 ms timeout although the phase was already done: a missed
// wake-up (team_futex_counts(): tests check wake() is sent). A timeout before the phase is done is not counted: on a
// loaded machine the thread with the last item can be off its CPU for milliseconds, and its waiter then times out
// and sleeps again, woken when that thread ends the phase.
std::atomic<int64_t> futex_sleeps{0};
std::atomic<int64_t> futex_missed_wakes{0};

constexpr int64_t TEAM_COLS = 64;  // weight rows (output columns) per gemv item: 8 of gemv's 8-row blocks
constexpr int SPIN = 1024;         // pauses before a waiting thread sleeps (~20-60 us)

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// The first exception an item or a tail threw. Items run the per-op kernels' functions, which check nothing today
// (every check is made before the region); should one throw, its thread could not end the phase, and every other
// thread would wait for it forever with the GIL released (a hung server, not an error). Instead the thrower records
// it here, every thread leaves its phase, and decode_team rethrows it after the region.
struct Abort {
    std::atomic<bool> set{false};
    std::exception_ptr error;  // written once, by the thread that first sets `set` (then read after the region)
    std::atomic<bool> taken{false};
    void raise(std::exception_ptr e) {
        if (!taken.exchange(true)) error = e;
        set.store(true);
    }
};

struct alignas(64) Phase {
    std::atomic<int64_t> next{0};
    char pad[56];
    std::atomic<int32_t> finished{0};  // items done
    std::atomic<int32_t> done{0};      // 1 once every item and the tail ran: a futex word
    std::atomic<int32_t> sleepers{0};
    int32_t n = 0;
};

// Every thread of the region calls run_phase() for each phase in order: items off the counter; the thread that
// finishes the last item runs the phase's `tail` (a norm over the step's few rows: no phase of its own, so no wait
// of its own) and marks the phase done. A waiter spins SPIN pauses (free cores: the last item ends within
// microseconds), then sleeps on the phase's futex until that thread wakes it. Not sched_yield: on a loaded machine a
// yielding waiter gave its CPU to other processes for whole time slices while its partner still held an item (b8
// steps at load 7-9, in process: 53-55 ms median against 31-44 for the per-kernel regions, whose waiters sleep in
// libgomp's futex, and 32-41 for this futex wait). Returns false once an item threw (`abort`): the caller stops.
template <class F, class Tail>
inline bool run_phase(Phase& p, Abort& abort, F&& item, Tail&& tail) {
    auto wake = [&p] {
        if (p.sleepers.load() > 0) syscall(SYS_futex, &p.done, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
    };
    for (int64_t i; (i = p.next.fetch_add(1, std::memory_order_relaxed)) < p.n;) {
        try {
            item(i);
            if (p.finished.fetch_add(1, std::memory_order_acq_rel) + 1 == p.n) {  // acq_rel: the tail sees every item
                tail();
                p.done.store(1);  // seq_cst, as the waiter's sleepers increment: it sees done, or this thread sees it
                wake();
            }
        } catch (...) {
            abort.raise(std::current_exception());
            wake();
            return false;
        }
    }
    for (int spins = 0; p.done.load(std::memory_order_acquire) == 0; ++spins) {
        if (abort.set.load(std::memory_order_relaxed)) return false;
        if (spins < SPIN) {
            cpu_relax();
            continue;
        }
        p.sleepers.fetch_add(1);
        if (p.done.load() == 0) {  // returns at once if done is no longer 0; 1 ms bounds a lost wake-up (or an abort
            const struct timespec ms{0, 1000000};  // raised in another phase)
            futex_sleeps.fetch_add(1, std::memory_order_relaxed);
            if (syscall(SYS_futex, &p.done, FUTEX_WAIT_PRIVATE, 0, &ms, nullptr, 0) == -1 && errno == ETIMEDOUT
                && p.done.load() != 0)
                futex_missed_wakes.fetch_add(1, std::memory_order_relaxed);
        }
        p.sleepers.fetch_sub(1);
    }
    return !abort.set.load();
}

// Runs `body` on every thread of one region (on the caller alone at one thread or inside a region), then rethrows
// what an item threw
template <class Body>
void run_team(Abort& abort, Body&& body) {
    const int64_t nt = at::get_num_threads();
    if (nt <= 1 || at::in_parallel_region()) body();
    else at::parallel_for(0, nt, 1, [&](int64_t, int64_t) { body(); });
    if (abort.set.load()) std::rethrow_exception(abort.error);
}

// y[:, r0:r1] (+ b) = x W[r0:r1]^T for x [M, K], W [N, K] row-major, y's rows ldy apart
inline void gemv_rows(const float* x, int64_t M, int64_t K, const torch::Tensor& w, const torch::Tensor& b,
                      float* y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t n = r1 - r0;
    hk_gemv::gemv_blocks(x, M, K, w.data_ptr<float>() + r0 * K, y + r0, ldy, n, 0, n / 8 + 1);
    if (b.numel()) {
        const float* bp = b.data_ptr<float>();
        for (int64_t i = 0; i < M; ++i)
            for (int64_t r = r0; r < r1; ++r) y[i * ldy + r] += bp[r];
    }
}

void check_linear(const torch::Tensor* t, int64_t n, int64_t k, const char* what) {
    TORCH_CHECK(t[0].scalar_type() == torch::kFloat32 && t[0].is_contiguous() && t[0].dim() == 2 && t[0].size(0) == n &&
                t[0].size(1) == k, "decode_team: ", what, " weight must be contiguous float32 [", n, ", ", k, "]");
    TORCH_CHECK(t[1].numel() == 0 || (t[1].scalar_type() == torch::kFloat32 && t[1].is_contiguous() &&
                                      t[1].numel() == n), "decode_team: ", what, " bias must be float32 [", n, "]");
}

// A linear's TeamLinear for T rows, its int8 tensors checked (code 1 w8a8, 2 w8a8-fine)
TeamLinear team_linear(const torch::Tensor* t, int64_t code, int64_t levels, int64_t n, int64_t k, int64_t T,
                       int64_t fine_rows, const Int8Team* team, const char* what) {
    check_linear(t, n, k, what);
    TeamLinear lin;
    lin.t = t;
    TORCH_CHECK(code >= 0 && code <= 2, "decode_team: ", what, " has an unknown linear code");
    if (code == 0 || (code == 2 && T > fine_rows)) return lin;
    TORCH_CHECK(team != nullptr, "decode_team: an int8 linear needs int8_cpu's team table (int8_cpu.team_address())");
    lin.int8 = true;
    lin.fine = code == 2;
    lin.levels = levels;
    lin.K = k;
    lin.N = lin.fine ? 2 * n : n;
    const torch::Tensor &inv = t[2], &wb = t[3], &wsc = t[4], &comp = t[5];
    TORCH_CHECK(levels >= 1 && levels * T <= 16, "decode_team: ", what, " int8 rows (levels x rows) must be <= 16");
    TORCH_CHECK(inv.numel() == 0 || (inv.scalar_type() == torch::kFloat32 && inv.is_contiguous() && inv.numel() == k),
                "decode_team: ", what, " inv_smooth must be float32 [", k, "]");
    TORCH_CHECK(wb.dim() == 4 && wb.scalar_type() == torch::kInt8 && wb.is_contiguous() && wb.size(2) == 16 &&
                (wb.size(3) == 4 || (wb.size(3) == 2 && levels == 1)) && wb.size(1) * wb.size(3) >= k &&
                wb.size(0) * 16 >= lin.N, "decode_team: ", what, " blocked int8 weight must be contiguous [>= N/16, ",
                ">= K/4, 16, 4], or [>= N/16, >= K/2, 16, 2] with one level");
    TORCH_CHECK(wsc.scalar_type() == torch::kFloat32 && wsc.is_contiguous() && wsc.numel() == lin.N &&
                comp.scalar_type() == torch::kInt32 && comp.is_contiguous() && comp.numel() >= lin.N,
                "decode_team: ", what, " w_scale / w_comp must be float32 [N] / int32 [>= N]");
    lin.Kq = wb.size(1);
    lin.depth = wb.size(3);
    lin.q.resize(levels * T * k);
    lin.a.resize(levels * T * lin.Kq);
    lin.s.resize(levels * T);
    return lin;
}

// An int8 linear's input rows x [T, K], once per step (a phase's tail, or before the fork)
void prepare(TeamLinear& lin, const Int8Team* team, const float* x, int64_t T) {
    if (!lin.int8) return;
    const float* inv = lin.t[2].numel() ? lin.t[2].data_ptr<float>() : nullptr;
    team->prepare(x, inv, T, lin.K, lin.levels, lin.Kq, lin.depth, lin.q.data(), lin.a.data(), lin.s.data());
}

// y[:, c0:c1) (+ b) = x W[c0:c1)^T: the float weight (gemv_rows) or the prepared int8 rows; w8a8-fine adds its
// second N channels (into `second`, T x (c1 - c0) floats), then the bias, as decode_layers.cpp's linear() (its
// y[:, :n] += y[:, n:], then y += b)
void linear_cols(const TeamLinear& lin, const Int8Team* team, const float* x, int64_t T, float* y, int64_t ldy,
                 int64_t c0, int64_t c1, float* second) {
    const torch::Tensor* t = lin.t;
    if (!lin.int8) return gemv_rows(x, T, t[0].size(1), t[0], t[1], y, ldy, c0, c1);
    const int8_t* wb = t[3].data_ptr<int8_t>();
    const float* wsc = t[4].data_ptr<float>();
    const int32_t* comp = t[5].data_ptr<int32_t>();
    team->blocks(lin.a.data(), T, lin.levels, lin.Kq, lin.depth, wb, lin.s.data(), comp, wsc, lin.N, y + c0, ldy, c0,
                 c1);
    if (lin.fine) {
        const int64_t n = lin.N / 2, w = c1 - c0;
        team->blocks(lin.a.data(), T, lin.levels, lin.Kq, lin.depth, wb, lin.s.data(), comp, wsc, lin.N, second, w,
                     n + c0, n + c1);
        for (int64_t i = 0; i < T; ++i)
            for (int64_t c = 0; c < w; ++c) y[i * ldy + c0 + c] += second[i * w + c];
    }
    if (t[1].numel()) {
        const float* bp = t[1].data_ptr<float>();
        for (int64_t i = 0; i < T; ++i)
            for (int64_t r = c0; r < c1; ++r) y[i * ldy + r] += bp[r];
    }
}

}  // namespace

std::vector<torch::Tensor> decode_team(torch::Tensor h, std::vector<torch::Tensor> tensors, std::vector<int64_t> codes,
                                       torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> kvs,
                                       torch::Tensor slots, std::vector<torch::Tensor> tables, std::vector<int64_t> qsl,
                                       std::vector<int64_t> ctx, double scale, double eps, int64_t hq, int64_t hkv,
                                       int64_t D, int64_t int8_team, int64_t fine_rows) {
    const auto* team = reinterpret_cast<const Int8Team*>(int8_team);
    TORCH_CHECK(team == nullptr || team->abi == INT8_TEAM_ABI, "decode_team: int8_cpu's team table is abi ",
                team ? team->abi : 0, ", this build reads ", INT8_TEAM_ABI, " (csrc/int8_team.h)");
    const int64_t L = static_cast<int64_t>(kvs.size()), T = h.size(0), H = h.size(1);
    const int64_t B = static_cast<int64_t>(ctx.size()), G = hq / hkv, QKV = (hq + 2 * hkv) * D, half = D / 2;
    TORCH_CHECK(static_cast<int64_t>(tensors.size()) == L * HK_PER_LAYER && static_cast<int64_t>(codes.size()) == L * 8,
                "decode_team: ", HK_PER_LAYER, " tensors and 8 codes per layer");
    TORCH_CHECK(L > 0 && T > 0 && h.dim() == 2 && h.scalar_type() == torch::kFloat32 && h.is_contiguous(),
                "decode_team: h must be contiguous float32 [T, H]");
    TORCH_CHECK(hq % hkv == 0 && D % 2 == 0, "decode_team: head shapes disagree");
    hk_kernels::check_qsl("decode_team", qsl, ctx.size(), tables.size(), T);
    for (int64_t b = 0; b < B; ++b)
        if (!hk_kernels::is_direct(qsl[b + 1] - qsl[b], G)) return {};  // attention's transposed path
    const int64_t I = tensors[2 + 2 * HK_LIN].size(0) / 2;
    std::vector<TeamLinear> lins;  // 4 a layer: qkv, o, gate_up, down
    lins.reserve(L * 4);
    for (int64_t l = 0; l < L; ++l) {
        const torch::Tensor* t = tensors.data() + l * HK_PER_LAYER;
        TORCH_CHECK(t[0].numel() == H && t[1].numel() == H && t[0].is_contiguous() && t[1].is_contiguous() &&
                    t[0].scalar_type() == torch::kFloat32 && t[1].scalar_type() == torch::kFloat32,
                    "decode_team: norm weights must be float32 [H]");
        const int64_t* c = codes.data() + l * 8;
        lins.push_back(team_linear(t + 2, c[0], c[4], QKV, H, T, fine_rows, team, "qkv"));
        lins.push_back(team_linear(t + 2 + HK_LIN, c[1], c[5], H, hq * D, T, fine_rows, team, "o_proj"));
        lins.push_back(team_linear(t + 2 + 2 * HK_LIN, c[2], c[6], 2 * I, H, T, fine_rows, team, "gate_up"));
        lins.push_back(team_linear(t + 2 + 3 * HK_LIN, c[3], c[7], H, I, T, fine_rows, team, "down"));
        TORCH_CHECK(kvs[l].dim() == 5 && kvs[l].scalar_type() == torch::kFloat32 && kvs[l].is_contiguous() &&
                    kvs[l].sizes() == kvs[0].sizes() && kvs[l].size(3) == hkv && kvs[l].size(4) == D,
                    "decode_team: kv caches must be contiguous float32 [2, NB, BS, Hkv, D], all alike");
    }
    auto cc = cos.contiguous(), sc = sin.contiguous();
    TORCH_CHECK(cc.numel() == T * half && sc.numel() == T * half, "decode_team: cos / sin must be [T, D/2]");
    const int64_t NB = kvs[0].size(1), BS = kvs[0].size(2), vhalf = NB * BS * hkv * D;
    auto sl = hk_kernels::check_slots(slots, T, NB * BS);
    const int64_t* sp = sl.data_ptr<int64_t>();
    const std::vector<const int64_t*> tp = hk_kernels::check_tables(tables, qsl, ctx, NB, BS);

    // buffers: the residual stream is h itself from the first norm on (as add_rmsnorm with no residual returns it)
    auto opts = h.options();
    auto xn = torch::empty({T, H}, opts), qkv = torch::empty({T, QKV}, opts), o = torch::empty({T, hq * D}, opts);
    auto x2 = torch::empty({T, H}, opts), gu = torch::empty({T, 2 * I}, opts), act = torch::empty({T, I}, opts);
    auto hout = torch::empty({T, H}, opts);
    float *res = h.data_ptr<float>(), *xnp = xn.data_ptr<float>(), *qkvp = qkv.data_ptr<float>();
    float *op = o.data_ptr<float>(), *x2p = x2.data_ptr<float>(), *gup = gu.data_ptr<float>();
    float *actp = act.data_ptr<float>(), *hp = hout.data_ptr<float>();
    const float *cp = cc.data_ptr<float>(), *snp = sc.data_ptr<float>();

    // attention: one item per (sequence, KV head) in attention()'s order, all of the sequence's rows (a direct
    // sequence is one query tile: TILE_ROWS >= DIRECT_ROWS, cpu_attention.cpp), so a scratch of DIRECT_ROWS rows
    const int64_t tq = hk_kernels::tile_tokens(G);
    const std::vector<hk_kernels::Item> items = hk_kernels::make_items(qsl, ctx, hkv, tq);
    std::vector<int64_t> koff(B * hkv + 1, 0);
    std::vector<char> direct(B, 1);
    auto chunks = [](int64_t n) { return (n + TEAM_COLS - 1) / TEAM_COLS; };
    const int64_t heads = hq + 2 * hkv, n_o = chunks(H), n_gu = chunks(I), n_down = chunks(H);
    std::vector<Phase> phases(L * 5);
    Abort abort;
    for (int64_t l = 0; l < L; ++l) {
        const int64_t n[5] = {heads, static_cast<int64_t>(items.size()), n_o, n_gu, n_down};
        for (int j = 0; j < 5; ++j) phases[l * 5 + j].n = static_cast<int32_t>(n[j]);
    }
    // norm1 of layer l over every row: the residual takes the previous layer's down output (layer 0: h is the residual)
    auto norm1 = [&](int64_t l) {
        const float* w = tensors[l * HK_PER_LAYER].data_ptr<float>();
        for (int64_t r = 0; r < T; ++r) {
            if (l == 0) hk_kernels::add_rmsnorm_row(res + r * H, nullptr, w, xnp + r * H, H, eps);
            else hk_kernels::add_rmsnorm_row(hp + r * H, res + r * H, w, xnp + r * H, H, eps);
        }
    };

    auto body = [&]() {
        hk_kernels::AttnScratch scratch(hk_kernels::DIRECT_ROWS, D);
        // a w8a8-fine linear's second channels of one item: a column chunk (TEAM_COLS) or a q/k/v head (D, wider at
        // head_dim 128: only down is fine today, linear.W8A8_FINE, but team_linear accepts code 2 for any linear)
        std::vector<float> second(T * std::max<int64_t>(TEAM_COLS, D));
        for (int64_t l = 0; l < L; ++l) {
            const torch::Tensor* t = tensors.data() + l * HK_PER_LAYER;
            const TeamLinear *qkv_l = &lins[l * 4], *o_l = qkv_l + 1, *gu_l = qkv_l + 2, *down_l = qkv_l + 3;
            Phase* ph = phases.data() + l * 5;
            float* kvp = kvs[l].data_ptr<float>();
            auto none = [] {};
            if (!run_phase(ph[0], abort, [&](int64_t j) {  // head j of q / k / v: its columns, RoPE (q, k), the cache (k, v)
                linear_cols(*qkv_l, team, xnp, T, qkvp, QKV, j * D, (j + 1) * D, second.data());
                for (int64_t r = 0; r < T; ++r) {
                    float* x = qkvp + r * QKV + j * D;
                    if (j < hq + hkv) hk_kernels::rope_head(x, cp + r * half, snp + r * half, half);
                    if (j >= hq) {
                        const int64_t kvh = j < hq + hkv ? j - hq : j - hq - hkv, off = j < hq + hkv ? 0 : vhalf;
                        std::memcpy(kvp + off + (sp[r] * hkv + kvh) * D, x, D * sizeof(float));
                    }
                }
            }, none)) return;
            const hk_kernels::AttnStep step{qkvp, QKV, D, kvp, vhalf, op, hq, hkv, G, D, BS, tq, scale, qsl.data(),
                                            ctx.data(), tp.data(), nullptr, koff.data(), direct.data()};
            if (!run_phase(ph[1], abort, [&](int64_t i) { hk_kernels::attend_item(step, items[i], scratch); },
                           [&] { prepare(lins[l * 4 + 1], team, op, T); }))
                return;
            const float* n2 = t[1].data_ptr<float>();
            if (!run_phase(ph[2], abort, [&](int64_t c) {
                linear_cols(*o_l, team, op, T, x2p, H, c * TEAM_COLS, std::min(H, (c + 1) * TEAM_COLS), second.data());
            }, [&] {  // norm2 over every row
                for (int64_t r = 0; r < T; ++r)
                    hk_kernels::add_rmsnorm_row(x2p + r * H, res + r * H, n2, xnp + r * H, H, eps);
                prepare(lins[l * 4 + 2], team, xnp, T);
            })) return;
            if (!run_phase(ph[3], abort, [&](int64_t c) {  // gate and up columns [c0, c1), then their SiLU-mul
                const int64_t c0 = c * TEAM_COLS, c1 = std::min(I, c0 + TEAM_COLS);
                linear_cols(*gu_l, team, xnp, T, gup, 2 * I, c0, c1, second.data());
                linear_cols(*gu_l, team, xnp, T, gup, 2 * I, I + c0, I + c1, second.data());
                for (int64_t r = 0; r < T; ++r)
                    hk_kernels::silu_mul_span(gup + r * 2 * I, gup + r * 2 * I + I, actp + r * I, c0, c1);
            }, [&] { prepare(lins[l * 4 + 3], team, actp, T); })) return;
            if (!run_phase(ph[4], abort, [&](int64_t c) {
                linear_cols(*down_l, team, actp, T, hp, H, c * TEAM_COLS, std::min(H, (c + 1) * TEAM_COLS),
                            second.data());
            }, [&] {
                if (l + 1 < L) {
                    norm1(l + 1);
                    prepare(lins[(l + 1) * 4], team, xnp, T);
                }
            })) return;
        }
    };
    norm1(0);  // before the fork: the first phase reads it
    prepare(lins[0], team, xnp, T);
    run_team(abort, body);
    return {hout, h};
}

// The phase runner alone, for tests/models/test_decode_layers.py: `phases` phases of `items` items each on every
// thread of one region, item `throw_item` of phase `throw_phase` throwing (-1: none), each phase's first item sleeping
// `item0_us` microseconds first (so that the other threads wait on the phase's futex). Returns how many items ran;
// a throw comes back as this call's error on every thread count, not as a hang.
int64_t team_phases(int64_t phases, int64_t items, int64_t throw_phase, int64_t throw_item, int64_t item0_us) {
    TORCH_CHECK(phases > 0 && items > 0 && items < INT32_MAX && item0_us >= 0 && item0_us < 1000000,
                "team_phases: bad sizes");
    std::vector<Phase> ph(phases);
    for (auto& p : ph) p.n = static_cast<int32_t>(items);
    Abort abort;
    std::atomic<int64_t> ran{0};
    run_team(abort, [&] {
        for (int64_t j = 0; j < phases; ++j) {
            auto item = [&](int64_t i) {
                TORCH_CHECK(j != throw_phase || i != throw_item, "team_phases: item ", i, " of phase ", j, " threw");
                if (i == 0 && item0_us > 0) {
                    const struct timespec t{0, static_cast<long>(item0_us) * 1000};
                    nanosleep(&t, nullptr);
                }
                ran.fetch_add(1);
            };
            if (!run_phase(ph[j], abort, item, [] {})) return;
        }
    });
    return ran.load();
}

// The abi of the Int8Team table at `address` (int8_cpu.team_address()) and the one this build reads: DecodeLayers
// compares them once when it is built and runs its int8 linears without the team on a mismatch (a stale int8_cpu
// build), so decode_team()'s own check above is only the last guard.
int64_t team_table_abi(int64_t address) { return address ? reinterpret_cast<const Int8Team*>(address)->abi : 0; }
int64_t team_abi() { return INT8_TEAM_ABI; }

// This process's team futex sleeps so far, and how many of them ran to their timeout after their phase was done (a
// lost or missing wake-up costs up to 1 ms): {sleeps, missed wake-ups}
std::vector<int64_t> team_futex_counts() { return {futex_sleeps.load(), futex_missed_wakes.load()}; }
