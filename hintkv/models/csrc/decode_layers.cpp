// Every decoder layer of a few-row decode step in one call (decode_layers.py builds this).
//
// decode_layers(h, residual, tensors, codes, cos, sin, kvs, slots, tables, qsl, ctx, scale, eps, hq, hkv, D, amx,
//               int8_gemv_address, fine_rows)
//   -> {h, residual} after the last layer (the final norm's input, as llama.py's layer loop leaves them).
// Per layer l: tensors[l * PER_LAYER ...] = norm1 w, norm2 w, then 4 linears (qkv, o, gate_up, down) of
// LIN tensors each: float weight [N, K], bias [N] or empty, inv_smooth, blocked int8 weight, w_scale, w_comp
// (the last four empty for a float linear); codes[l * 8 ...] = each linear's kind (0 float32 gemv, 1 w8a8,
// 2 w8a8-fine: 2N stacked channels summed; its float weight past fine_rows rows, `int8.fine_int8_rows()`) then
// its activation levels.
// It runs, per layer, exactly the C++ functions the per-op path runs (add_rmsnorm, gemv or the int8 gemv,
// rope_, attention, silu_mul), in the same order on the same tensors: the outputs are bit-identical to it.
// What it removes is the Python between them (~15% of a float32 one-row step: module calls, argument
// checks, the kernels' env switch) and the GIL round trips (taken back and released once per op).
//
// The per-op extensions' own cpu_kernels.cpp and gemv.cpp come before this text (decode_layers.py prepends
// them, each inside its own namespace, same flags); W8A8's int8 gemv runs in int8_cpu's own build (built
// without FMA contraction), called through the address `int8_cpu.gemv_address()` gives.
#define HK_PER_LAYER 26
#define HK_LIN 6

namespace {

// int8_cpu.cpp's gemv(x, inv_smooth, wb, w_scale, w_comp, levels, amx), in its own build (its address passed in)
using Int8Gemv = torch::Tensor (*)(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, int64_t,
                                   bool);

torch::Tensor linear(const torch::Tensor* t, int64_t kind, int64_t levels, bool amx, Int8Gemv int8_gemv,
                     int64_t fine_rows, const torch::Tensor& x) {
    torch::Tensor y;
    // the bias inside, as gemv_cpu.gemv; w8a8-fine past fine_rows rows runs its float weight, as W8A8FineKernel
    if (kind == 0 || (kind == 2 && x.size(0) > fine_rows)) return hk_gemv::gemv(x.contiguous(), t[0], t[1]);
    TORCH_CHECK(int8_gemv != nullptr, "decode_layers: an int8 linear needs int8_cpu's gemv address");
    y = int8_gemv(x, t[2], t[3], t[4], t[5], levels, amx);
    if (kind == 2) {
        const int64_t n = t[0].size(0);
        y = y.slice(1, 0, n).add_(y.slice(1, n, 2 * n));
    }
    if (t[1].numel()) y.add_(t[1]);
    return y;
}

}  // namespace

std::vector<torch::Tensor> decode_layers(torch::Tensor h, torch::Tensor residual, std::vector<torch::Tensor> tensors,
                                         std::vector<int64_t> codes, torch::Tensor cos, torch::Tensor sin,
                                         std::vector<torch::Tensor> kvs, torch::Tensor slots,
                                         std::vector<torch::Tensor> tables, std::vector<int64_t> qsl,
                                         std::vector<int64_t> ctx, double scale, double eps, int64_t hq, int64_t hkv,
                                         int64_t D, bool amx, int64_t int8_gemv_address, int64_t fine_rows) {
    const auto int8_gemv = reinterpret_cast<Int8Gemv>(int8_gemv_address);
    const int64_t L = static_cast<int64_t>(kvs.size()), T = h.size(0);
    TORCH_CHECK(static_cast<int64_t>(tensors.size()) == L * HK_PER_LAYER && static_cast<int64_t>(codes.size()) == L * 8,
                "decode_layers: ", HK_PER_LAYER, " tensors and 8 codes per layer");
    for (int64_t l = 0; l < L; ++l) {
        const torch::Tensor* t = tensors.data() + l * HK_PER_LAYER;
        const int64_t* c = codes.data() + l * 8;
        auto nr = hk_kernels::add_rmsnorm(h, residual, t[0], eps);
        residual = nr[1];
        auto qkv = linear(t + 2, c[0], c[4], amx, int8_gemv, fine_rows, nr[0]);
        TORCH_CHECK(qkv.is_contiguous(), "decode_layers: qkv must be contiguous");
        hk_kernels::rope_(qkv, cos, sin, hq, hkv, D);
        auto heads = qkv.view({T, hq + 2 * hkv, D});
        auto o = hk_kernels::attention(heads.slice(1, 0, hq), heads.slice(1, hq, hq + hkv),
                                       heads.slice(1, hq + hkv, hq + 2 * hkv), slots, kvs[l], tables, qsl, ctx, scale);
        auto x = linear(t + 2 + HK_LIN, c[1], c[5], amx, int8_gemv, fine_rows, o.reshape({T, hq * D}));
        nr = hk_kernels::add_rmsnorm(x, residual, t[1], eps);
        residual = nr[1];
        auto gu = linear(t + 2 + 2 * HK_LIN, c[2], c[6], amx, int8_gemv, fine_rows, nr[0]);
        TORCH_CHECK(gu.is_contiguous(), "decode_layers: gate_up must be contiguous");
        h = linear(t + 2 + 3 * HK_LIN, c[3], c[7], amx, int8_gemv, fine_rows, hk_kernels::silu_mul(gu));
    }
    return {h, residual};
}
