"""How a linear layer runs: the one place that picks the GEMM kernel for a weight.

Every projection of the model (fused q/k/v, o, fused gate/up, down, and the LM head) is a `Linear`
whose `forward` calls a kernel chosen once, after the weights are loaded, by `prepare_linears`:

    name    when                               kernel
    dense   default (any device / dtype)       F.linear
    mkl     CPU, float32, MKL present          weight packed for MKL (torch.ops.mkl._mkl_linear) per row
                                               bucket (1, 8, 16; rows padded up): 1.3-3x faster than
                                               F.linear at those rows; more rows run F.linear
    w8a8    --quantization w8a8                int8 weight (per output channel scale), activations
                                               quantized per token at run time, torch._int_mm
                                               (int8 x int8 -> int32), rescaled to the input dtype

A kernel remembers the (data_ptr, version) of the weight it was prepared from and re-prepares
when the weight changed, so a packed or quantized copy is never stale. The LM head stays in the
activation dtype under w8a8 (its top-1 is what sampling reads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

QUANTIZATIONS = ("w8a8",)


class LinearKernel:
    """Runs y = x W^T (+ b) for one weight; `prepare` may build a packed or quantized copy."""

    name = "dense"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self._key: tuple[int, int] | None = None
        self.refresh()

    def refresh(self) -> None:
        key = (self.weight.data_ptr(), self.weight._version)
        if key != self._key:
            self.prepare()
            self._key = key

    def prepare(self) -> None:
        pass

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

    def _pack(self, rows: int) -> torch.Tensor:
        packed = self.packed.get(rows)
        if packed is None:
            packed = self.packed[rows] = torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), rows)
        return packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        m = x2.shape[0]
        bucket = next((b for b in self.BUCKETS if b >= m), None)
        if bucket is None:
            y = F.linear(x2, self.weight, self.bias)
        else:
            if m != bucket:
                x2 = F.pad(x2, (0, 0, 0, bucket - m))
            elif not x2.is_contiguous():
                x2 = x2.contiguous()
            y = torch.ops.mkl._mkl_linear(x2, self._pack(bucket), self.weight, self.bias, bucket)[:m]
        return y.view(*shape[:-1], y.shape[-1])


class W8A8Kernel(LinearKernel):
    """int8 weights (symmetric, per output channel) x int8 activations (symmetric, per token)."""

    name = "w8a8"

    def prepare(self) -> None:
        w = self.weight.detach().float()
        self.w_scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)  # [N]
        q = torch.round(w / self.w_scale[:, None]).clamp_(-127, 127).to(torch.int8)
        self.w_int8_t = q.t()  # [K, N] view of a row-major [N, K]: what _int_mm's fast path takes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xf = x.reshape(-1, shape[-1]).float()
        x_scale = (xf.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min_(1e-12)  # [M, 1]
        xq = torch.round(xf / x_scale).clamp_(-127, 127).to(torch.int8)
        m = xq.shape[0]
        if xq.is_cuda and m <= 16:  # CUDA's int8 GEMM wants more than 16 rows: pad with zeros
            xq = F.pad(xq, (0, 0, 0, 17 - m))
        acc = torch._int_mm(xq, self.w_int8_t)[:m]  # [M, N] int32
        y = acc.float().mul_(x_scale).mul_(self.w_scale)
        if self.bias is not None:
            y.add_(self.bias.float())
        return y.to(x.dtype).view(*shape[:-1], y.shape[-1])


KERNELS: dict[str, type[LinearKernel]] = {k.name: k for k in (LinearKernel, MklPackedKernel, W8A8Kernel)}


def choose_kernel(weight: torch.Tensor, quantization: str | None, *, is_lm_head: bool = False) -> str:
    """Kernel name for a weight: w8a8 when asked (not the LM head), else MKL-packed where it applies."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} or None, not {quantization!r}")
    if quantization == "w8a8" and not is_lm_head:
        return "w8a8"
    return "mkl" if MklPackedKernel.available(weight) else "dense"


class Linear(nn.Module):
    """A projection whose GEMM is run by a kernel from `KERNELS` (dense until prepared)."""

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=dtype, device=device), requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(n_out, dtype=dtype, device=device), requires_grad=False)
                     if bias else None)
        self.kernel: LinearKernel = LinearKernel(self.weight, self.bias)

    def set_kernel(self, name: str) -> None:
        self.kernel = KERNELS[name](self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kernel.refresh()
        return self.kernel(x)


def prepare_linears(model: nn.Module, quantization: str | None = None) -> dict[str, int]:
    """Pick and prepare every `Linear`'s kernel (call after the weights are loaded); {kernel: count}."""
    counts: dict[str, int] = {}
    for mod in model.modules():
        if isinstance(mod, Linear):
            kind = choose_kernel(mod.weight, quantization)
            mod.set_kernel(kind)
            counts[kind] = counts.get(kind, 0) + 1
    return counts
