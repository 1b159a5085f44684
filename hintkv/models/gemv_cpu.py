"""Few-row float32 GEMMs on a CPU: decode steps and short verifies, bound by the bytes they read.

The source is `csrc/gemv.cpp` (its header says why it beats MKL's packed GEMM there), built by
`cpu_ext.load`. `linear.py`'s `mkl` and `onednn` kernels run steps of at most `ROWS` rows through it.

    gemv(x, w, b) -> y | None    y = x W^T (+ b) for CPU float32, x of at most ROWS rows; None: not its case
    ops().gemv_isa() -> str      the build's vector loop: "avx512", "avx2" (+ FMA) or "plain"
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from hintkv.models import cpu_ext, cpu_kernels

ROWS = 12  # at 16 rows MKL's packed GEMM costs the same (0.96x), at 1-12 rows it costs 1.2-1.7x
_SOURCE = (Path(__file__).parent / "csrc" / "gemv.cpp").read_text()
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # built on the machine that runs it


def ops() -> ModuleType | None:
    return cpu_ext.load("hintkv_gemv", _SOURCE, ["gemv", "gemv_isa"], _CFLAGS)


def gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor | None:
    """x [M, K] W^T (+ b) in C++ when M <= ROWS, all CPU float32 and the kernels on (HINTKV_CPU_KERNELS)."""
    if (x.dim() != 2 or x.shape[0] > ROWS or x.dtype != torch.float32 or w.dtype != torch.float32
            or x.device.type != "cpu" or not w.is_contiguous() or (b is not None and b.dtype != torch.float32)
            or not cpu_kernels.enabled() or ops() is None):
        return None
    return ops().gemv(x.contiguous(), w, b.contiguous() if b is not None else x.new_empty(0))
