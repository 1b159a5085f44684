"""How a linear layer runs: the one place that picks the GEMM kernel for a weight.

Every projection of the model (fused q/k/v, o, fused gate/up, down, and the LM head) is a `Linear`
whose `forward` calls a kernel chosen once, after the weights are loaded, by `prepare_linears`:

    name    when                               kernel
    dense   default (any device / dtype)       F.linear
    mkl     CPU, float32, MKL present          <= 12 rows: `gemv_cpu.gemv` (C++, reads W where it lies;
                                               dummy:tiny's layer GEMMs, CPU time: 1.17x MKL's packed
                                               GEMM at 1 row, 1.67x at 2, 1.26x at 8), or without
                                               the C++ kernels the weight packed for MKL
                                               (torch.ops.mkl._mkl_linear) per row bucket (1, 8, 16;
                                               rows padded up); more rows run F.linear
    onednn  CPU, float32, `cpu_gemm()` says    <= 12 rows as `mkl`; more rows: the weight prepacked once
            onednn (auto: a non-Intel CPU      for oneDNN (torch.ops.mkldnn._linear_pointwise, vLLM's
            with AVX-512)                      `onednn_mm`), one copy for every row count. MKL's sgemm
                                               takes its AVX2 code on AMD: on Zen 4, 1 thread, oneDNN's
                                               avx512 brgemm ran dummy:tiny's 128-2048-row GEMMs at
                                               99-104 GFLOP/s, MKL's at 63-85 (a prefill's four
                                               projections: 1.23-1.32x; docs/benchmarks/history/engine.md)
    packed  CPU, float32, `cpu_gemm()` says    <= 12 rows as `mkl`; more rows: our GEMM on the weight packed
            packed (auto: a non-Intel CPU      once at load (`packed_gemm.py`: 16-column panels, a 6 x 16
            with AVX2 + FMA, no AVX-512)       AVX2 + FMA micro-kernel); on Zen 3, one thread, in the engine,
                                               a cold prefill's GEMMs took 0.74-0.81x MKL's time at 128
                                               tokens, 0.91-0.95x at 512 (docs/benchmarks/history/engine.md)
    w8a8    --quantization w8a8                int8 weight (per output channel scale, SmoothQuant-
                                               scaled from calibration), activations quantized per
                                               token in two levels at run time, one torch._int_mm
                                               (int8 x int8 -> int32); <= 16 int8 rows (decode,
                                               verify): one few-row call, `int8_cpu.gemv`, on AMX
                                               tiles where the CPU has them, else AVX512-VNNI, else
                                               AVX2: `int8.gemv_kernel()` "i16" (one 14-bit row a
                                               token, vpmaddwd); more rows on a CPU without VNNI
                                               or AMX: the float weight (`int8_gemm_rows_run_int8`)
    w8a8-head  the LM head under w8a8          w8a8 (one int8 level, the int8 loop), then each row's top 16
                                               logits recomputed in float
    w8a8-fine  down_proj under w8a8            two int8 levels of the weight in few-row steps (gemv;
                                               `int8.fine_int8_rows`), the float
                                               weight (`mkl` / `onednn`, as `cpu_gemm()`) in more rows

A kernel remembers the (data_ptr, version) of the weight it was prepared from and re-prepares
when the weight changed, so a packed or quantized copy is never stale after a write that bumps the
weight's version (`weight.mul_`, `copy_`). A write through `.data` (the loader's) is not seen: call
`prepare_linears` again (`LlamaForCausalLM.prepare`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from hintkv.models import cpu_kernels, gemv_cpu, int8_cpu, packed_gemm
from hintkv.models.cpu_choice import env_choice, float_gemm_for, read_cpuinfo, this_cpu_capability
from hintkv.models.int8 import (
    GEMV_ROWS,
    LEVELS,
    block_weight,
    fine_int8_rows,
    gemv_kernel,
    gemv_levels,
    int8_gemm_rows_run_int8,
    int8_linear,
    quantize_weight,
    smoothing,
)

QUANTIZATIONS = ("w8a8",)
# Projections whose weight w8a8 keeps finer (measured on SmolLM2, 295 fixed tokens, KL/token to
# float32): every projection int8 0.0051, top-1 0.969; down_proj (the MLP's 1536-wide output GEMM,
# the most sensitive one) in float 0.0037, top-1 0.983. down_proj is a quarter of a layer's weights:
# `W8A8FineKernel` runs it on two int8 levels of its weight in few-row steps, in float otherwise.
W8A8_FINE = ("down_proj",)


class LinearKernel:
    """Runs y = x W^T (+ b) for one weight; `prepare` may build a packed or quantized copy."""

    name = "dense"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 act_absmax: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias
        self.act_absmax = act_absmax  # calibrated max |x| per input channel (w8a8's SmoothQuant)
        self._key: tuple[int, int] | None = None
        self.refresh()

    def refresh(self) -> None:
        key = (self.weight.data_ptr(), self.weight._version)
        if key != self._key:
            self.prepare()
            self._key = key

    def prepare(self) -> None:
        pass

    def warm(self) -> None:
        """Build now what a first many-row call would build (at model load, not in a request's step)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MklPackedKernel(LinearKernel):
    """CPU float32: the weight packed in MKL's GEMM layout (what inductor's freezing does).

    A packed copy serves exactly the row count it was packed for (`_mkl_linear` runs any other
    count as a plain GEMM on the unpacked weight), and a plain GEMM of 2-16 rows costs 2-3x one
    packed row here (SmolLM2 shapes, 1 thread), so rows are padded up to a bucket with its own
    copy: a speculative verify of 1 + k tokens and a decode batch of up to 16 sequences then cost
    about one packed row. Each bucket's copy is one more weight's worth of memory, packed on first
    use (a process that never batches never pays for it)."""

    name = "mkl"
    BUCKETS = (1, 8, 16)

    @staticmethod
    def available(weight: torch.Tensor) -> bool:
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch._C.has_mkl

    def prepare(self) -> None:
        self.packed: dict[int, torch.Tensor] = {}
        if cpu_kernels.enabled():
            gemv_cpu.ops()  # its C++ builds now, at load, not in the first request's decode step (minutes)

    def _pack(self, rows: int) -> torch.Tensor:
        packed = self.packed.get(rows)
        if packed is None:
            packed = self.packed[rows] = torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), rows)
        return packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        y = gemv_cpu.gemv(x2, self.weight, self.bias) if x2.shape[0] <= gemv_cpu.ROWS else None
        if y is None:
            y = self._many(x2)
        return y.view(*shape[:-1], y.shape[-1])

    def _many(self, x2: torch.Tensor) -> torch.Tensor:
        """A 2-D x past the few-row kernel: a packed bucket up to 16 rows, F.linear above."""
        m = x2.shape[0]
        bucket = next((b for b in self.BUCKETS if b >= m), None)
        if bucket is None:
            return F.linear(x2, self.weight, self.bias)
        if m != bucket:
            x2 = F.pad(x2, (0, 0, 0, bucket - m))
        elif not x2.is_contiguous():
            x2 = x2.contiguous()
        return torch.ops.mkl._mkl_linear(x2, self._pack(bucket), self.weight, self.bias, bucket)[:m]


class OneDnnKernel(MklPackedKernel):
    """CPU float32 where `cpu_gemm()` picks oneDNN: few rows as `mkl` (gemv_cpu), more through the weight
    prepacked for oneDNN's matmul, the GEMM vLLM's CPU build runs (`onednn_mm`).

    One packed copy serves every row count (oneDNN's blocked weight layout does not depend on M: no
    per-call reorder in DNNL_VERBOSE at 17, 512 or 2048 rows). The copy is a second float32 weight
    (gemv reads the plain one): the layers' projections pack once at load (`warm`, in `prepare_linears`);
    the LM head at engine start when a step can give it more than 12 rows (`LlamaForCausalLM.warm_head`: its
    49152 x 576 reorder took 406 ms inside a request's step before), else on its first many-row call, so a
    head only ever run on few rows (a prefill's last-row cut, decode) costs no copy. float32 accumulation
    (torch's default fp32 math mode): it agrees with F.linear to rounding."""

    name = "onednn"
    PACK_ROWS = 32  # the row-count hint for the reorder (vLLM's); any M runs on the same copy
    num_packs = 0  # weights reordered in this process (each a weight's memory and load time; tests count them)

    @staticmethod
    def available(weight: torch.Tensor) -> bool:
        return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))

    def prepare(self) -> None:
        super().prepare()
        self.onednn_weight: torch.Tensor | None = None

    def warm(self) -> None:
        if self.onednn_weight is None:
            self.onednn_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), self.PACK_ROWS)
            OneDnnKernel.num_packs += 1

    def _many(self, x2: torch.Tensor) -> torch.Tensor:
        self.warm()
        return torch.ops.mkldnn._linear_pointwise(x2.contiguous(), self.onednn_weight, self.bias, "none", [], "")


class PackedKernel(MklPackedKernel):
    """CPU float32 where `cpu_gemm()` picks packed: few rows as `mkl` (gemv_cpu), more through our own GEMM on the
    weight packed once at load into 16-column panels (`packed_gemm.py`: a 6 x 16 AVX2 + FMA micro-kernel, BLIS's
    loops, the work taken in units by torch's OpenMP team as each thread gets to them; any thread count gives the
    same bits). Like `onednn`'s, the packed copy is a second float32 weight, one for every row count, built at load
    (`warm`); the LM head's when a step can give it more than 12 rows (`LlamaForCausalLM.warm_head`)."""

    name = "packed"
    num_packs = 0  # weights packed in this process (tests count them)

    @staticmethod
    def available(weight: torch.Tensor) -> bool:
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and packed_gemm.ops() is not None

    def prepare(self) -> None:
        super().prepare()
        self.packed_weight: torch.Tensor | None = None

    def warm(self) -> None:
        if self.packed_weight is None:
            self.packed_weight = packed_gemm.pack(self.weight)
            PackedKernel.num_packs += 1

    def _many(self, x2: torch.Tensor) -> torch.Tensor:
        self.warm()
        y = packed_gemm.gemm(x2, self.packed_weight, self.weight.shape[0], self.bias)
        return y if y is not None else super()._many(x2)  # not its case (e.g. another dtype): as mkl


CPU_GEMMS = ("mkl", "onednn", "packed")


@functools.cache
def cpu_gemm() -> str:
    """Which library runs CPU float32 GEMMs past the few-row kernel: HINTKV_CPU_GEMM=mkl|onednn, or auto
    (`cpu_choice.float_gemm_for`: onednn on a non-Intel CPU with AVX-512). Decided once per process, so every
    step of a server runs the same kernels (greedy output does not depend on the step)."""
    want = env_choice("HINTKV_CPU_GEMM", CPU_GEMMS)
    if want != "auto":
        return want
    return float_gemm_for(read_cpuinfo(), this_cpu_capability())


def float_kernel_name(weight: torch.Tensor) -> str:
    """The float kernel for a weight: `cpu_gemm()`'s CPU float32 kernel where it applies, else dense."""
    first = {"onednn": (OneDnnKernel,), "packed": (PackedKernel,)}.get(cpu_gemm(), ())
    for kind in (*first, MklPackedKernel):
        if kind.available(weight):
            return kind.name
    return LinearKernel.name


class W8A8Kernel(LinearKernel):
    """int8 weights (symmetric, per output channel, SmoothQuant-scaled when calibrated) x int8
    activations (per token, two levels: `int8.py`) through one `torch._int_mm`."""

    name = "w8a8"
    levels = LEVELS

    def gemv_depth(self) -> int:
        """The few-row kernel's weight layout: 2 (int16 pairs) where `gemv_kernel()` is "i16", else 4 (int8 quads)."""
        return 2 if gemv_kernel() == "i16" else 4

    def prepare(self) -> None:
        smooth = None if self.act_absmax is None else smoothing(self.act_absmax, self.weight)
        self.inv_smooth = None if smooth is None else (1.0 / smooth).to(self.weight.device)
        self.w_int8_t, self.w_scale = quantize_weight(self.weight, smooth)
        # the few-row kernel's copy (CPU): another int8 weight's memory, a quarter of the float one
        self.blocked = None if self.weight.is_cuda else block_weight(self.w_int8_t, self.gemv_depth())
        # activation rows a token takes in gemv (`int8.gemv_levels`: one 14-bit row on the int16 kernel)
        self.gemv_levels = self.levels if self.blocked is None else gemv_levels(self.blocked, self.levels)
        # past gemv's rows on a CPU without a fast int8 GEMM: the float weight (`int8_gemm_rows_run_int8`)
        self.float_kernel = (None if self.weight.is_cuda or int8_gemm_rows_run_int8()
                             else KERNELS[float_kernel_name(self.weight)](self.weight, self.bias))

    def warm(self) -> None:
        if self.float_kernel is not None:
            self.float_kernel.warm()

    def in_float(self, x2: torch.Tensor) -> bool:
        """This 2-D x runs the float weight: a CPU without a fast int8 GEMM, more int8 rows than gemv's."""
        return self.float_kernel is not None and x2.shape[0] * self.gemv_levels > GEMV_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if self.in_float(x.reshape(-1, shape[-1])):
            return self.float_kernel(x)
        y = int8_linear(x.reshape(-1, shape[-1]), self.w_int8_t, self.w_scale, self.inv_smooth, self.levels,
                        self.blocked)
        if self.bias is not None:
            y.add_(self.bias.float())
        return y.to(x.dtype).view(*shape[:-1], y.shape[-1])


class W8A8HeadKernel(W8A8Kernel):
    """The LM head in W8A8, then its top `RESCORE` logits of each row recomputed from the float weight.

    The head is the largest GEMM of a decode step (49152 x 576 on SmolLM2: a fifth of its weights,
    half of dummy:tiny's), so it runs in int8 like the rest. The argmax is then taken over all the logits:
    the top `RESCORE` exact, the others with their int8 error (which sampling at temperature > 0 reads too).
    So it is the float argmax when that is in the int8 top `RESCORE` and its exact logit is at least every
    int8 logit outside them, not always: an outside row's int8 logit can beat it (near-equal rows; SmolLM2
    w8a8's 2,301 eval rows: never). A greedy step's float argmax is `greedy_head.py`'s (2-12 rows, VNNI)."""

    name = "w8a8-head"
    RESCORE = 16
    levels = 1  # the rescoring makes the top logits exact; a second level would double the GEMM

    def gemv_depth(self) -> int:
        """4 always: one int8 level costs the AVX2 loop the multiply work of one int16 row, and `greedy_head` reads
        these blocks as the VNNI build's int8 copy."""
        return 4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if self.in_float(x2):
            return self.float_kernel(x)  # float logits: nothing to rescore
        logits = super().__call__(x2)  # [M, V] in x's dtype
        k, fused = min(self.RESCORE, logits.shape[-1]), None if x.is_cuda else int8_cpu.ops()
        if fused is not None and logits.dtype == torch.float32:
            top = fused.topk_indices(logits, k)  # [M, R], the same set as topk's, in no order
        else:
            top = logits.topk(k, dim=-1).indices
        exact = torch.bmm(self.weight[top], x2.unsqueeze(-1)).squeeze(-1)  # [M, R]
        if self.bias is not None:
            exact = exact + self.bias[top]
        logits.scatter_(-1, top, exact.to(logits.dtype))
        return logits.view(*x.shape[:-1], logits.shape[-1])


class W8A8FineKernel(W8A8Kernel):
    """A w8a8-sensitive projection (`W8A8_FINE`): its weight in two int8 levels, W ~ s1 q1 + s2 q2 (the
    rounding residual quantized again, ~1/127 of one level's error), stacked as 2N output channels.

    Few-row steps (decode, verify) run it through `int8_cpu.gemv`: 2 bytes per weight read, half of
    float32, where a one-row step is bound by the bytes it reads. More rows run the float weight
    (MKL-packed where it applies): a GEMM of many rows reuses each weight, and float is exact."""

    name = "w8a8-fine"

    def prepare(self) -> None:
        smooth = None if self.act_absmax is None else smoothing(self.act_absmax, self.weight)
        self.inv_smooth = None if smooth is None else (1.0 / smooth).to(self.weight.device)
        w = self.weight.detach().float() * (1.0 if smooth is None else smooth)
        q1_t, s1 = quantize_weight(w)
        q2_t, s2 = quantize_weight(w - q1_t.t().float() * s1[:, None])
        self.w_int8_t, self.w_scale = torch.cat((q1_t, q2_t), dim=1), torch.cat((s1, s2))
        fast = not self.weight.is_cuda and int8_cpu.ops() is not None and int8_cpu.ops().has_fast_gemv()
        self.blocked = block_weight(self.w_int8_t, self.gemv_depth()) if fast else None
        self.gemv_levels = self.levels if self.blocked is None else gemv_levels(self.blocked, self.levels)
        self.int8_rows = fine_int8_rows() if fast else 0  # more rows: the float weight (AVX2's int8 loop: > 2)
        self.float_kernel = KERNELS[float_kernel_name(self.weight)](self.weight, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape, n = x.shape, self.weight.shape[0]
        x2 = x.reshape(-1, shape[-1])
        if self.blocked is None or x2.shape[0] > self.int8_rows:
            return self.float_kernel(x)
        y2 = int8_linear(x2, self.w_int8_t, self.w_scale, self.inv_smooth, self.levels, self.blocked)
        y = y2[:, :n].add_(y2[:, n:])
        if self.bias is not None:
            y.add_(self.bias.float())
        return y.to(x.dtype).view(*shape[:-1], n)


KERNELS: dict[str, type[LinearKernel]] = {
    k.name: k for k in (LinearKernel, MklPackedKernel, OneDnnKernel, PackedKernel, W8A8Kernel, W8A8HeadKernel,
                        W8A8FineKernel)}


def choose_kernel(weight: torch.Tensor, quantization: str | None, *, is_lm_head: bool = False) -> str:
    """Kernel name for a weight: w8a8 (w8a8-head for the LM head) when asked, else `float_kernel_name`."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} or None, not {quantization!r}")
    if quantization == "w8a8":
        return "w8a8-head" if is_lm_head else "w8a8"
    return float_kernel_name(weight)


class Linear(nn.Module):
    """A projection whose GEMM is run by a kernel from `KERNELS` (dense until prepared)."""

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=dtype, device=device), requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(n_out, dtype=dtype, device=device), requires_grad=False)
                     if bias else None)
        self.kernel: LinearKernel = LinearKernel(self.weight, self.bias)

    def set_kernel(self, name: str, act_absmax: torch.Tensor | None = None) -> None:
        self.kernel = KERNELS[name](self.weight, self.bias, act_absmax)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kernel.refresh()
        return self.kernel(x)


def prepare_linears(model: nn.Module, quantization: str | None = None,
                    act_absmax: dict[str, torch.Tensor] | None = None) -> dict[str, int]:
    """Pick and prepare every `Linear`'s kernel (call after the weights are loaded); {kernel: count}.
    `act_absmax` ({module name: max |x| per input channel}, `calibration.py`) smooths w8a8 kernels."""
    counts: dict[str, int] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, Linear):
            fine = quantization == "w8a8" and name.rpartition(".")[2] in W8A8_FINE
            kind = "w8a8-fine" if fine else choose_kernel(mod.weight, quantization)
            mod.set_kernel(kind, (act_absmax or {}).get(name))
            mod.kernel.warm()
            counts[kind] = counts.get(kind, 0) + 1
    return counts
