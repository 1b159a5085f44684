"""W8A8's CPU ops: the per-token quantize, the rescale, and a few-row int8 GEMM (a C++ extension built on first use).

Eager PyTorch spends ~20 operator calls per int8 GEMM around `torch._int_mm` (the smoothing
multiply, two levels of norm / clamp / div / round / residual, the int8 cast, then the int32 ->
float rescale per level): on dummy:tiny's decode step at load 5-7 that was 41 ms of 72 against
31 ms of GEMMs (torch.profiler), more than the int8 GEMMs saved. These functions do the same
arithmetic in one call each, in the same order (x * (1 / smooth), row max / 127, x * (1 / s) rounded
half to even, residual x - q s), so they give the eager path's int8 values:

    quantize_rows(x [M, K] f32, inv_smooth [K] f32 or empty, levels) -> q int8 [levels*M, K], s f32 [levels*M, 1]
    rescale(acc [levels*M, N] i32, s [levels*M, 1] f32, w_scale [N] f32, levels) -> y f32 [M, N]
    gemv(x [M, K] f32, inv_smooth, wb, w_scale [N], w_comp, levels, amx) -> y f32 [M, N]
        (a depth-2 `wb`, [Nb, Kp, 16, 2], levels 1: `csrc/int16_gemv.cpp`, x quantized once to 14 bits a row)
    pair_dots(q [M, K] int16, wb depth 2, N) -> int64 [M, N]: that kernel's exact integer sums (tests)
    has_fast_gemv() -> bool: gemv runs on AVX512-VNNI or AVX2 (else a plain loop: int8.py then keeps _int_mm)
    gemv_isa() -> str: gemv's loop without AMX in this build: "vnni", "avx2" (vpmaddubsw) or "plain"
    has_amx() -> bool: gemv's `amx=True` runs on AMX tiles (built with AMX-INT8 and Linux granted the tiles)
    gemv_calls() -> [amx, vnni]: how many gemv calls each path has run in this process
    topk_indices(logits [M, V] f32, k) -> int64 [M, k]: each row's k largest, in no order (the head's rescoring)
    gemv_address() -> int: gemv's function address (`decode_layers.py`'s fused step calls this build of it)

The quantize and the rescale are vectorised (AVX2) and split over rows (at::parallel_for): a
2048 x 512 two-level quantize went from 7 ms (a scalar loop, a division per value) to 0.8 ms on
one thread. `gemv` serves decode and verify steps (a few rows): the weight in 16-channel blocks
(`int8.block_weight`) is read once for all levels x rows, dpbusd fills 16 channels per instruction
with no horizontal sums, the rescale is folded in; `_int_mm` at one row reads the weight once per
level (two calls) and its kernel ran the SmolLM2-sized LM head (49152 x 512) at 1/3 of memory speed.
Where the CPU has AMX (Sapphire Rapids on), `gemv` multiplies tiles instead: one `tdpbssd` is a
16-row x 16-channel x 64-deep int8 product, the whole of a 2-level batch of 8 in one instruction
per 64 k and 16 channels (dpbusd: one row, 4 deep); the VNNI loop stays for CPUs without it.
The C++ source is `csrc/int8_cpu.cpp` (quantize, rescale, top-k), `csrc/int16_gemv.cpp` (the int16 kernel for AVX2
without VNNI, `int8.gemv_kernel()`), then `csrc/int8_gemv.cpp` (the few-row GEMM and
`team_address()`: the entry points `csrc/decode_team.cpp` calls for W8A8's linears), built as one extension.

`ops()` builds them through `cpu_ext.load` (cached; None, after one warning, when it cannot be
built: `int8.py` then runs the eager ops).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from hintkv.models import cpu_ext

_SOURCE = "".join((Path(__file__).parent / "csrc" / name).read_text()
                  for name in ("int8_cpu.cpp", "int8_team.h", "int16_gemv.cpp", "int8_gemv.cpp"))  # the header:
# decode_team's table; int16_gemv.cpp: the depth-2 kernel gemv and the team entries dispatch to

# -march=native: the extension is built on the machine that runs it (cached per machine); the
# vector paths are guarded by the compiler's __AVX2__ / __AVX512VNNI__, a plain loop otherwise.
# No FMA contraction, so the residual is rounded as the eager ops round it.
# GEMV_ROWS (int8.py's, written here): the most int8 rows a decode / verify step's gemv takes; csrc/int8_gemv.cpp's
# stack scratch is sized by it (-DHK_GEMV_ROWS: one source, review_auto21 finding 8), more rows take the heap.
GEMV_ROWS = 16
_CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", f"-DHK_GEMV_ROWS={GEMV_ROWS}"]


def ops() -> ModuleType | None:
    """The built extension (quantize_rows, ..., topk_indices, gemv_address, team_address), or None when it cannot be built (warned once)."""
    return cpu_ext.load("hintkv_int8_cpu", _SOURCE, ["quantize_rows", "rescale", "gemv", "has_fast_gemv", "gemv_isa",
                                                    "has_amx", "gemv_calls", "topk_indices", "gemv_address",
                                                    "team_address", "pair_dots"], _CFLAGS)
