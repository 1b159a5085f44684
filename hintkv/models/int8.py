"""int8 tensor arithmetic for W8A8: weight and activation quantization, the int8 GEMM and its rescale.

    smoothing(absmax, w)        -> SmoothQuant's per-input-channel scale s [K]
    quantize_weight(w, smooth)  -> int8 [K, N] view (what torch._int_mm's fast path takes), scale [N]
    quantize_rows(x, levels)    -> int8 [levels*M, K], scale [levels*M, 1]   (symmetric, per token)
    block_weight(w_t, depth)    -> the weight in gemv's 16-channel blocks, its u8 offset per channel
    gemv_kernel()               -> "i8" or "i16": the few-row kernel W8A8's layers run on this machine
    int8_linear(x, ...)         -> float y [M, N]

`levels=2` quantizes each row twice: q1 = round(x / s1), then the residual x - s1 q1 the same way.
Both go through ONE `torch._int_mm` over the 2M stacked rows (y = s1 (q1 W) + s2 (q2 W)): _int_mm
costs about the same at 8 and 16 rows here; a single row takes two one-row calls instead (its
one-row path is 3-10x faster than its 2-row GEMM on this CPU). The activation error is
then ~1/127 of one int8 step: on SmolLM2 the activations, not the weights, were W8A8's error (KL
to float32 per token, 295 fixed tokens: weights and activations int8 0.0116, weights only 0.0024,
two-level activations 0.0024; see docs/benchmarks/history/engine.md).

On a CPU the quantize and the rescale are one fused call each (`int8_cpu.py`, same arithmetic;
eager ops when it cannot be built), and a step of a few rows is one call (`gemv`) that reads the
weight once for both levels of every row.

On AVX2 without VNNI the layers' few-row steps run `gemv_kernel()` "i16" instead: each row quantized once to 14 bits
(|q| <= 8191) against the int8 weight widened to int16 (`csrc/int16_gemv.cpp` says why: half the multiply work of the
two int8 levels there).

SmoothQuant (`smooth`, per input channel, from `calibration.py`): W' = W diag(s), x' = x / s moves
activation outliers into the weight, where per-channel scales absorb them.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from hintkv.models import int8_cpu
from hintkv.models.cpu_choice import cpu_flags, env_choice, int8_rows_for, read_cpuinfo

LEVELS = 2
# Steps of at most this many int8 rows (levels x tokens: a decode batch of 8, a 1 + k verify) run the
# few-row kernel `int8_cpu.gemv`; more rows go through torch._int_mm (a GEMM that reuses each weight). Written once,
# in int8_cpu.py, whose build sizes gemv's stack scratch by it.
GEMV_ROWS = int8_cpu.GEMV_ROWS
_EMPTY = torch.empty(0)
AMX = True  # gemv on AMX tiles where the CPU has them (`int8_cpu.has_amx()`); False: the VNNI (or AVX2) loop
ALPHA = 0.5  # SmoothQuant's migration strength (calibration.py says how it was chosen)


def smoothing(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """SmoothQuant's per-input-channel s [K] = max|x|^a / max|W|^(1-a): x / s and W diag(s) leave
    x W^T unchanged and split the activation outliers between the two."""
    w_max = weight.detach().float().abs().amax(dim=0).clamp_min(1e-5)
    return (act_absmax.clamp_min(1e-5) ** alpha / w_max ** (1 - alpha)).clamp_min(1e-5)


def quantize_weight(w: torch.Tensor, smooth: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 of `w` [N, K] (times `smooth` [K] per input channel)."""
    w = w.detach().float()
    if smooth is not None:
        w = w * smooth
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)  # [N]
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.t(), scale


def quantize_rows(x: torch.Tensor, levels: int = LEVELS) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of float `x` [M, K]; `levels=2` stacks the residual's rows below."""
    qs, scales = [], []
    for level in range(levels):
        s = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True).clamp_min_(1e-30).div_(127.0)
        q = torch.mul(x, s.reciprocal()).round_()  # |x / s| <= 127: no clamp needed; x * (1/s) as the fused op
        qs.append(q)
        scales.append(s)
        if level + 1 < levels:
            x = torch.addcmul(x, q, s, value=-1.0)
    if levels == 1:
        return qs[0].to(torch.int8), scales[0]
    return torch.cat(qs).to(torch.int8), torch.cat(scales)


def block_weight(w_t: torch.Tensor, depth: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """`int8_cpu.gemv`'s layout of an int8 `w_t` [K, N]: 16-channel blocks [ceil(N/16), ceil(K/64) * 16, 16, 4]
    (zero padded: K to 64, AMX's tile depth), and w_comp [N] int32 = 128 sum_k w[n, k] (the VNNI path's
    u8-activation offset). Weights must lie in [-127, 127]: the AVX2 loop multiplies |a| by sign(a) w, and
    sign(-1) x -128 does not fit an int8 (every quantizer here clamps to +-127).
    `depth=2`: the int16 kernel's layout (`gemv_kernel()` "i16"), [ceil(N/16), ceil(K/2), 16, 2] (K padded to even:
    per k pair, 16 channels' two int8 each), w_comp zeros (no offset); gemv then takes one 14-bit row per token."""
    if depth not in (2, 4):
        raise ValueError(f"block_weight's depth is 4 (int8 quads) or 2 (int16 pairs), not {depth}")
    if w_t.numel() and int(w_t.min()) < -127:
        raise ValueError("int8 gemv weights must lie in [-127, 127] (-128 breaks the AVX2 sign trick)")
    w = w_t.t()
    (n, k), pad_n, pad_k = w.shape, -w.shape[0] % 16, -w.shape[1] % (64 if depth == 4 else 2)
    wp = F.pad(w, (0, pad_k, 0, pad_n))
    blocks = wp.reshape((n + pad_n) // 16, 16, (k + pad_k) // depth, depth).permute(0, 2, 1, 3).contiguous()
    if depth == 2:
        return blocks, torch.zeros(n, dtype=torch.int32)
    return blocks, w.sum(dim=1, dtype=torch.int32).mul_(128)


def gemv_levels(blocked: tuple[torch.Tensor, torch.Tensor], levels: int) -> int:
    """The activation rows a token takes in gemv on this blocked weight: one 14-bit row on a depth-2 weight (the
    int16 kernel), else `levels` int8 rows."""
    return 1 if blocked[0].shape[-1] == 2 else levels


GEMV_KERNELS = ("i8", "i16")


@functools.cache
def gemv_kernel() -> str:
    """The few-row kernel of W8A8's layer projections (w8a8, w8a8-fine; the head keeps "i8"): "i8", gemv's int8 loop
    on `LEVELS` activation levels (AMX, VNNI or AVX2's vpmaddubsw), or "i16", `csrc/int16_gemv.cpp` (one 14-bit row
    a token, vpmaddwd on the weight widened to int16). HINTKV_INT8_GEMV=i8|i16 overrides; auto: i16 where gemv's loop
    is AVX2 (no VNNI: there i16 does half the multiply work; Zen 3, one thread, SmolLM2's shapes: 8 tokens 2.2-2.3x,
    1 token 1.65x), i8 elsewhere (VNNI's dpbusd does 64 int8 products an instruction). Decided once per process."""
    want = env_choice("HINTKV_INT8_GEMV", GEMV_KERNELS)
    if want != "auto":
        return want
    fused = int8_cpu.ops()
    return "i16" if fused is not None and fused.has_fast_gemv() and fused.gemv_isa() == "avx2" else "i8"


def gemv_path() -> str:
    """The GEMM a decode / verify step's int8 rows (<= GEMV_ROWS) run on this machine: "amx" (gemv on
    AMX tiles), "vnni" (gemv's AVX512-VNNI loop), "avx2" (its AVX2 loop: vpmaddubsw, CPUs without VNNI),
    "<that>-i16" (the layers on `gemv_kernel()` "i16", the head on that path; auto: "avx2-i16") or "int_mm"
    (torch._int_mm: no extension, or neither). w8a8's decode speed depends on it (bench engine records it with its figures)."""
    fused = int8_cpu.ops()
    if fused is None or not fused.has_fast_gemv():
        return "int_mm"
    head = "amx" if AMX and fused.has_amx() else fused.gemv_isa()
    return f"{head}-i16" if gemv_kernel() == "i16" else head


def fine_int8_rows() -> int:
    """Up to how many rows `W8A8FineKernel` (down_proj: two int8 levels of its weight, 2N channels) runs gemv;
    more rows run its float weight. The int16 kernel (`gemv_kernel()` "i16") halves the AVX2 loop's multiply work and
    takes one row a token: every few-row step (GEMV_ROWS tokens) then stays in int8. Before it: On AVX2 (no VNNI) an int8 multiply-add costs what a float one does and the
    fine weight doubles them: down_proj at one thread, CPU us, fine / float: 1 row 309-371 / 352-539, 2 rows
    487-521 / 691, 3 rows 724 / 513, 8 rows 1818-1860 / 776-1197. AMX and VNNI keep every few-row step in int8.
    So on AVX2, w8a8 is not batch-invariant across this edge: a sequence's down_proj output in a step of 1-2 rows
    (two-level int8) differs slightly from the same row in a step of 3+ (its float weight), and a speculative
    verify (k + 1 >= 3 rows) runs the float weight; float32 serving is unaffected (w8a8 promises a tolerance)."""
    if gemv_kernel() == "i16":
        return GEMV_ROWS
    return 2 if gemv_path() == "avx2" else GEMV_ROWS // LEVELS


@functools.cache
def int8_gemm_rows_run_int8() -> bool:
    """Whether a CPU w8a8 step past the few-row gemv (prefill) runs `torch._int_mm`; False: the float weight.

    `torch._int_mm` on a CPU is fast only with VNNI or AMX: on AVX2 alone (Zen 1, 14th session) w8a8's prefill
    ran 17-20x slower than float32, so there its many-row steps take the float weight (exact, as W8A8FineKernel
    already does past a few rows). With AVX512-VNNI the int8 prefill is the faster one (Zen 4, 15th session:
    docs/benchmarks/history/engine.md, "w8a8 prefill with VNNI"). HINTKV_W8A8_PREFILL=int8|float|auto overrides (auto:
    `cpu_choice.int8_rows_for`, int8 where /proc/cpuinfo lists avx512_vnni or amx_int8). Decided once per process."""
    want = env_choice("HINTKV_W8A8_PREFILL", ("int8", "float"))
    if want != "auto":
        return want == "int8"
    return int8_rows_for(cpu_flags(read_cpuinfo()))


def int8_linear(x: torch.Tensor, w_t: torch.Tensor, w_scale: torch.Tensor, inv_smooth: torch.Tensor | None,
                levels: int = LEVELS, blocked: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """float32 y [M, N] ~= x [M, K] @ W^T for an int8 `w_t` [K, N] from `quantize_weight`; with
    `blocked` (`block_weight(w_t, depth)`), steps of up to GEMV_ROWS activation rows (`gemv_levels` a token) run
    `int8_cpu.gemv`; more rows quantize to `levels` int8 rows."""
    fused = None if x.is_cuda else int8_cpu.ops()
    rows = None if blocked is None else gemv_levels(blocked, levels)
    if fused is not None and rows is not None and x.shape[0] * rows <= GEMV_ROWS and fused.has_fast_gemv():
        return fused.gemv(x.float(), _EMPTY if inv_smooth is None else inv_smooth, blocked[0], w_scale,
                          blocked[1], rows, AMX)
    if fused is not None:  # the same arithmetic in two calls instead of ~20 (`int8_cpu.py`)
        xq, x_scale = fused.quantize_rows(x.float(), _EMPTY if inv_smooth is None else inv_smooth, levels)
        if x.shape[0] == 1 and levels == 2:
            acc = torch.cat((torch._int_mm(xq[:1], w_t), torch._int_mm(xq[1:], w_t)))
        else:
            acc = torch._int_mm(xq, w_t)
        return fused.rescale(acc, x_scale, w_scale, levels)
    xf = x.float()
    if inv_smooth is not None:
        xf = xf * inv_smooth
    xq, x_scale = quantize_rows(xf, levels)
    m = x.shape[0]
    if m == 1 and levels == 2 and not xq.is_cuda:
        # one row: two GEMV calls (_int_mm's one-row path is 3-10x its 2-row GEMM here), same sum
        lo, hi = torch._int_mm(xq[:1], w_t), torch._int_mm(xq[1:], w_t)
        return torch.addcmul(lo.float().mul_(x_scale[:1]), hi.float(), x_scale[1:]).mul_(w_scale)
    rows = xq.shape[0]
    if xq.is_cuda and rows <= 16:  # CUDA's int8 GEMM wants more than 16 rows: pad with zeros
        xq = F.pad(xq, (0, 0, 0, 17 - rows))
    acc = torch._int_mm(xq, w_t)[:rows]  # int32 [levels*M, N]
    y = acc.float().mul_(x_scale)
    if levels == 2:
        y = y[:m].add_(y[m:])
    return y.mul_(w_scale)
