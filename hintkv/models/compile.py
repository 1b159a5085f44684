"""The model step's fusable regions, eager or compiled with torch.compile (inductor).

A decoder layer is GEMMs (run by `linear.py`'s kernels, packed or int8), paged attention (Python
over per-sequence metadata) and the element-wise work between them. Only that element-wise work
is compiled, as three functions of plain tensors shared by every layer:

    add_rmsnorm(x, residual, w, eps) -> (norm(x + residual), x + residual)
    rope(qkv, cos, sin, ...)         -> q, k, v  (rotated q and k out of the fused qkv rows)
    silu_mul(gate_up)                -> silu(gate) * up

Shapes: the row count T is dynamic (`dynamic=True`), so each function compiles at most two
graphs (T == 1, which dynamo specialises, and T >= 2), and add_rmsnorm two more (no residual, at
the first layer): eight graphs per process whatever the batch mix, all compiled by
`compile_regions` at start-up (its seconds are returned and logged). GEMMs
stay outside the graphs so packed / int8 kernels keep working. When inductor cannot build (no C++
compiler, an unsupported platform), `compile_regions` warns and keeps the eager functions. On CUDA
a step of 33-2047 rows runs the eager functions anyway (`CUDA_EAGER_ROWS`: launch-bound there, where
compiled calls measured slower).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hintkv.models.rope import RotaryEmbedding

log = logging.getLogger("hintkv.compile")


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, w: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual); with no residual, (norm(x), x)."""
    if residual is not None:
        x = x + residual
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps), x
    return w * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype), x


def rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
         head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split fused qkv rows [T, (Hq + 2 Hkv) D] into q [T, Hq, D], k, v [T, Hkv, D]; rotate q and k."""
    t = qkv.shape[0]
    x = qkv.view(t, num_heads + 2 * num_kv_heads, head_dim)
    qk, v = x[:, : num_heads + num_kv_heads], x[:, num_heads + num_kv_heads:]
    x1, x2 = qk.chunk(2, dim=-1)
    qk = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return qk[:, :num_heads], qk[:, num_heads:], v


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# Eager variants work in place: the residual stream is the step's own buffer, q and k are views
# into the fused qkv rows. (Compiled graphs take the functional forms; inductor fuses them.)

def add_rmsnorm_(x: torch.Tensor, residual: torch.Tensor | None, w: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = residual.add_(x)
    return add_rmsnorm(x, None, w, eps)


def rope_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
          head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = qkv.shape[0]
    x = qkv.view(t, num_heads + 2 * num_kv_heads, head_dim)
    qk = RotaryEmbedding.apply_(x[:, : num_heads + num_kv_heads], cos, sin)
    return qk[:, :num_heads], qk[:, num_heads:], x[:, num_heads + num_kv_heads:]


# Row counts [lo, hi) whose steps run the eager regions even when compiled, on CUDA. Measured on the lent H200
# (dummy:llama3-8b, bf16, `hintkv bench engine --device cuda --quick --variants no-compile`, the twenty-ninth
# session; docs/benchmarks/history/engine.md), compiled over eager regions: decode (CUDA graphs) b1 1.03x, b8
# 1.10x; prefill 2048 1.06x, 8192 1.06x faster; but prefill 512 1.38x and a cold 128-token prompt 1.43x SLOWER
# (41 vs 29 ms). Between a graph-captured decode and a GPU-bound prefill a step is bound by its launches on the
# CPU, where each compiled call's guards and Triton launch cost more than the eager kernels they fuse. The
# largest decode batch bucket (cuda_graphs.BATCH_BUCKETS) stays compiled; 2048 is the smallest prefill
# measured to gain (1024 was not measured).
CUDA_EAGER_ROWS = (33, 2048)


@dataclass(slots=True)
class Regions:
    """The functions a decoder layer calls between its GEMMs; eager unless compiled."""

    add_rmsnorm: Callable = add_rmsnorm_
    rope: Callable = rope_
    silu_mul: Callable = silu_mul
    compiled: bool = False
    warmup_s: float = 0.0
    eager_rows: tuple[int, int] | None = None  # [lo, hi): steps of that many rows run `EAGER` (CUDA_EAGER_ROWS)

    def for_rows(self, rows: int) -> Regions:
        """The regions a step of `rows` new tokens runs: these, or the eager ones inside `eager_rows`."""
        if self.eager_rows is not None and self.eager_rows[0] <= rows < self.eager_rows[1]:
            return EAGER
        return self


EAGER = Regions()


def compile_regions(hidden: int, intermediate: int, num_heads: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype, device: torch.device | str) -> Regions:
    """Compile the three regions and run each at T = 1 and T = 2 (both graphs); eager on failure."""
    t0 = time.perf_counter()
    try:
        fns = {name: torch.compile(fn, dynamic=True, fullgraph=True)
               for name, fn in (("add_rmsnorm", add_rmsnorm), ("rope", rope), ("silu_mul", silu_mul))}
        opts = {"dtype": dtype, "device": device}
        # the same kinds of arguments as the layers pass (a Parameter weight, distinct cos and sin
        # tensors), or dynamo guards would recompile at the first real step
        norm_w = torch.nn.Parameter(torch.ones(hidden, **opts), requires_grad=False)
        with torch.inference_mode():
            for t in (1, 2, 3):  # 3: a second T >= 2 shape must hit the dynamic graph, not recompile
                x = torch.randn(t, hidden, **opts)
                fns["add_rmsnorm"](x, x.clone(), norm_w, 1e-5)
                fns["add_rmsnorm"](x, None, norm_w, 1e-5)
                cos, sin = torch.randn(t, 1, head_dim // 2, **opts), torch.randn(t, 1, head_dim // 2, **opts)
                fns["rope"](torch.randn(t, (num_heads + 2 * num_kv_heads) * head_dim, **opts), cos, sin,
                            num_heads, num_kv_heads, head_dim)
                fns["silu_mul"](torch.randn(t, 2 * intermediate, **opts))
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run eager
        warnings.warn(f"torch.compile unavailable ({type(e).__name__}: {str(e)[:200]}); running eager",
                      RuntimeWarning, stacklevel=2)
        return Regions()
    regions = Regions(**fns, compiled=True, warmup_s=time.perf_counter() - t0,
                      eager_rows=CUDA_EAGER_ROWS if torch.device(device).type == "cuda" else None)
    log.info("compiled the model step's regions in %.1f s", regions.warmup_s)
    return regions
