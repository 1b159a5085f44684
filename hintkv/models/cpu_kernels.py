"""hintkv's C++ CPU kernels for a float32 step: paged causal attention and fused norm / RoPE / SiLU-mul.

The source is `csrc/cpu_kernels.cpp` (its header says what each function computes and how), with the
attention kernel in `csrc/cpu_attention_tiles.cpp` and `csrc/cpu_attention.cpp` (`SOURCE`: the three as one), built
by `cpu_ext.load` like W8A8's ops. Measured by `python -m hintkv.bench.engine_cputime` (CPU time,
one thread): eager PyTorch's attention cost hintkv 65 ms of a 316 ms 512-token prefill where vLLM's
CPU attention kernel took ~29, and the unfused RMSNorm / RoPE / SiLU-mul 34 vs ~21 ms.

    ops() -> module | None          the built extension; None (warned once) when it cannot be built
    enabled() -> bool               whether the model step uses them: built, and HINTKV_CPU_KERNELS != 0
    attention(q, k, v, kv_cache, meta, scale) -> o | None   K/V written and attended; None: not its case
    regions() -> Regions            compile.py's Regions running the fused element-wise kernels
    argmax(logits) -> list | None   each row's argmax, as logits.argmax(-1).tolist(); None: not its case
    ops().simd() -> str             the vector paths the build took: "avx512", "avx2" (AVX2 + FMA: the AMD
                                    EPYCs here; attention 2.4x, SiLU-mul 2.3-3.4x the plain loops) or "scalar"

The kernel's case: a CPU float32 query and float32 cache, head_dim a multiple of 16, no CUDA-graph
metadata; everything else (bf16, int8 / fp8 caches, CUDA) stays on `attention.py`'s PyTorch paths,
which the tests hold the kernel to (float32 summation order differs: tolerances are in the tests).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import torch

from hintkv.models import cpu_ext
from hintkv.models.compile import Regions, add_rmsnorm_, rope_, silu_mul

# one translation unit: includes and exp polynomials first, then the attention's tile micro-kernels, then its driver
_FILES = ("cpu_kernels.cpp", "cpu_attention_tiles.cpp", "cpu_attention.cpp")
SOURCE = "\n".join((Path(__file__).parent / "csrc" / name).read_text() for name in _FILES)
# -march=native: built on the machine that runs it; vector code is guarded by __AVX512F__
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]
_FUNCTIONS = ["attention", "add_rmsnorm", "rope_", "silu_mul", "argmax_rows", "simd", "direct_scores"]


def ops() -> ModuleType | None:
    return cpu_ext.load("hintkv_cpu_kernels", SOURCE, _FUNCTIONS, _CFLAGS)


def enabled() -> bool:
    """The one switch: HINTKV_CPU_KERNELS=0 keeps the PyTorch ops (comparisons, bisecting)."""
    return os.environ.get("HINTKV_CPU_KERNELS", "1") != "0" and ops() is not None


def attention(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, kv_cache: torch.Tensor, meta,
              scale: float) -> torch.Tensor | None:
    """The step's attention output [T, Hq, D] from the C++ kernel, which first writes the step's k / v
    rows into their slots (None: already written), or None, writing nothing, when the step is not its case."""
    if (q.device.type != "cpu" or q.dtype != torch.float32 or kv_cache.dtype != torch.float32
            or meta.static is not None or q.shape[-1] % 16 or not enabled()
            or (k is not None and (k.dtype != torch.float32 or v.dtype != torch.float32))):
        return None
    if k is None:
        k = v = q.new_empty(0)
    return ops().attention(q, k, v, meta.slot_mapping, kv_cache, meta.block_tables, meta.query_start_loc,
                           meta.context_lens, scale)


def argmax(logits: torch.Tensor) -> list[int] | None:
    """Each row's argmax of CPU float32 logits [N, V] (torch.argmax's ties and NaNs), or None when not
    its case. torch's argmax took 0.83 ms for 8 x 49152 (one thread): ~3% of a dummy:tiny b8 decode step."""
    if (logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2 or logits.shape[1] == 0
            or logits.stride(1) != 1 or not enabled()):
        return None
    return ops().argmax_rows(logits)


def _add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, w: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1 or (residual is not None and not residual.is_contiguous()):
        return add_rmsnorm_(x, residual, w, eps)
    return ops().add_rmsnorm(x, residual if residual is not None else x.new_empty(0), w, eps)


def _rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
          head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if qkv.dtype != torch.float32 or not qkv.is_contiguous():
        return rope_(qkv, cos, sin, num_heads, num_kv_heads, head_dim)
    ops().rope_(qkv, cos, sin, num_heads, num_kv_heads, head_dim)
    x = qkv.view(qkv.shape[0], num_heads + 2 * num_kv_heads, head_dim)
    return x[:, :num_heads], x[:, num_heads:num_heads + num_kv_heads], x[:, num_heads + num_kv_heads:]


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if gate_up.dtype != torch.float32 or not gate_up.is_contiguous():
        return silu_mul(gate_up)
    return ops().silu_mul(gate_up)


def regions():
    """compile.py's Regions with the fused C++ element-wise kernels (call only when `enabled()`)."""
    return Regions(add_rmsnorm=_add_rmsnorm, rope=_rope, silu_mul=_silu_mul)
