"""Many-row float32 GEMMs on an AVX2 + FMA CPU: the weight packed once at load, our own 6 x 16 micro-kernel.

The source is `csrc/packed_gemm.cpp` (its header gives the layout and the loops), built by `cpu_ext.load`.
`linear.py`'s `packed` kernel runs every step of more than `gemv_cpu.ROWS` rows through it.

    pack(w) -> packed                  w [N, K] float32 -> [ceil(N / 16), K, 16], zeros past N (once, at load)
    gemm(x, packed, n, b) -> y | None  y = x W^T (+ b), x [M, K]; None: not its case (not CPU float32, no build)
    ops().gemm_isa() -> str            the build's micro-kernel: "avx2" (AVX2 + FMA) or "plain"
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from hintkv.models import cpu_ext

_SOURCE = (Path(__file__).parent / "csrc" / "packed_gemm.cpp").read_text()
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # built on the machine that runs it


def ops() -> ModuleType | None:
    return cpu_ext.load("hintkv_packed_gemm", _SOURCE, ["pack_weight", "gemm", "gemm_isa"], _CFLAGS)


def pack(w: torch.Tensor) -> torch.Tensor:
    return ops().pack_weight(w.detach())


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int, b: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] W^T (+ b) from `pack(W)` (W [n, K]); None when x is not CPU float32 2-D or there is no build."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or ops() is None:
        return None
    return ops().gemm(x.contiguous(), packed, n, b.contiguous() if b is not None else x.new_empty(0))
