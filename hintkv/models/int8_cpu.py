"""W8A8's per-token quantize and its rescale as two fused CPU ops (a C++ extension built on first use).

Eager PyTorch spends ~20 operator calls per int8 GEMM around `torch._int_mm` (the smoothing
multiply, two levels of norm / clamp / div / round / residual, the int8 cast, then the int32 ->
float rescale per level): on dummy:tiny's decode step at load 5-7 that was 41 ms of 72 against
31 ms of GEMMs (torch.profiler), more than the int8 GEMMs saved. These two functions do the same
arithmetic in one call each, in the same order (x * (1 / smooth), row max / 127, x / s rounded half
to even, residual x - q s), so they give the eager path's int8 values:

    quantize_rows(x [M, K] f32, inv_smooth [K] f32 or empty, levels) -> q int8 [levels*M, K], s f32 [levels*M, 1]
    rescale(acc [levels*M, N] i32, s [levels*M, 1] f32, w_scale [N] f32, levels) -> y f32 [M, N]

`ops()` builds them with torch.utils.cpp_extension (g++, ~1 minute the first time on this machine,
then cached under ~/.cache/torch_extensions) and returns None, after one warning, when it cannot
(no compiler, no ninja): `int8.py` then runs the eager ops.
"""

from __future__ import annotations

import warnings
from types import ModuleType

_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <vector>

std::vector<torch::Tensor> quantize_rows(torch::Tensor x, torch::Tensor inv_smooth, int64_t levels) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be float32 [M, K]");
    x = x.contiguous();
    const int64_t M = x.size(0), K = x.size(1);
    const bool smooth = inv_smooth.numel() > 0;
    TORCH_CHECK(!smooth || (inv_smooth.numel() == K && inv_smooth.scalar_type() == torch::kFloat32),
                "inv_smooth must be float32 [K]");
    auto sm = smooth ? inv_smooth.contiguous() : inv_smooth;
    auto q = torch::empty({levels * M, K}, torch::kInt8);
    auto s = torch::empty({levels * M, 1}, torch::kFloat32);
    const float* xp = x.data_ptr<float>();
    const float* sp = smooth ? sm.data_ptr<float>() : nullptr;
    int8_t* qp = q.data_ptr<int8_t>();
    float* op = s.data_ptr<float>();
    std::vector<float> r(K);
    for (int64_t m = 0; m < M; ++m) {
        const float* row = xp + m * K;
        for (int64_t k = 0; k < K; ++k) r[k] = smooth ? row[k] * sp[k] : row[k];
        for (int64_t l = 0; l < levels; ++l) {
            float amax = 0.f;
            for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(r[k]));
            const float scale = std::max(amax, 1e-30f) / 127.0f;
            int8_t* qrow = qp + (l * M + m) * K;
            for (int64_t k = 0; k < K; ++k) {
                const float v = std::nearbyint(r[k] / scale);
                qrow[k] = static_cast<int8_t>(v);
                r[k] = r[k] - v * scale;
            }
            op[l * M + m] = scale;
        }
    }
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
    for (int64_t m = 0; m < M; ++m) {
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
    return y;
}
"""

_state: dict[str, ModuleType | None] = {}


def ops() -> ModuleType | None:
    """The built extension (quantize_rows, rescale), or None when it cannot be built (warned once)."""
    if "mod" not in _state:
        try:
            from torch.utils.cpp_extension import load_inline

            _state["mod"] = load_inline(name="hintkv_int8_cpu", cpp_sources=_SOURCE,
                                        functions=["quantize_rows", "rescale"], extra_cflags=["-O3"],
                                        verbose=False)
        except Exception as e:  # noqa: BLE001 - any build failure means: run the eager ops
            warnings.warn(f"W8A8's fused CPU ops unavailable ({type(e).__name__}: {str(e)[:200]}); "
                          "running eager ops", RuntimeWarning, stacklevel=2)
            _state["mod"] = None
    return _state["mod"]
