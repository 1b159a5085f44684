"""Greedy decoding's LM head: each row's argmax of x W^T without reading the float weight whole.

A greedy step needs one token per row, not the logits. On a CPU the LM head is the largest GEMM of a
decode step and it is bound by the bytes it reads (dummy:tiny: 49152 x 512 float32 = 100 MB, ~37% of a
one-row step's CPU time); vLLM reads all of it. Here an int8 copy (per-row scale, a quarter of the
bytes) and x quantised per row give approximate logits through integer dot products (AVX-512 VNNI, or
AVX2's vpmaddubsw where a CPU has no VNNI, e.g. AMD Zen 1)
with a proved error bound, and only the rows whose bound reaches the best lower bound are recomputed
in float32 (`csrc/greedy_head.cpp` says how):

    |x . w_r - a_r| <= |x|_1 err_r + |x - x~|_1 127 scale_r,   err_r = max_i |w_ri - scale_r q_ri| + float's margin

so the true argmax is always among the recomputed rows, and the answer is the argmax of the screen's own
float32 dot products (first index on ties among them). Those sum in another order than the logits' GEMM
(MKL / gemv), so where two logits are equal within float rounding the token may differ from
torch.argmax of the logits (rare; both are the real argmax up to float rounding).

    GreedyHead(weight).refresh() -> bool    CPU float32, kernels built with VNNI or AVX2, finite weight (int8 copy made)
    GreedyHead(weight)(hidden) -> list[int] | None    None: not its case (the caller computes the logits),
                                                       more than max_rows() rows included
    max_rows() -> int    MAX_ROWS_BLOCKED (64) in the VNNI build, else MAX_ROWS (12)
    screens_w8a8(rows) -> bool    a w8a8 model's greedy step of `rows` rows uses the screen too (2-12, VNNI)

Under w8a8 the screen reads the float head with the w8a8 layers' hidden state: its token is that hidden state's
float argmax, which the int8 head's (top 16 recomputed in float) equals whenever the float argmax is in its int8
top 16; otherwise the screen's is the float32 head's answer, where the int8 head's was not.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import torch

from hintkv.models import cpu_ext, cpu_kernels, int8

_SOURCE = (Path(__file__).parent / "csrc" / "greedy_head.cpp").read_text()
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # built on the machine that runs it
# MAX_ROWS: measured when the screen was the VNNI row-major one (before the blocked screen and the AVX2 path), against
# logits + argmax on MklPackedKernel (49152 x 512 head, one thread, CPU time, logits/screen): s11 review (load
# 2.6-6): 1 row 5.4x, 8 rows 1.46-1.59x, 16 1.08x, 24 1.12x, 32 0.83x, 64 0.42x, 128 0.40x; speed2 (load 4.4, 3-4
# interleaved rounds, medians): 1 row 4.77x, 8 1.46-1.53x, 10 1.48x, 12 1.29x, 14 1.04x, 16 0.89-0.96x, 24 0.94x,
# 32 0.72x, 64 0.46x. 12: the last row count with a clear gain in both. The AVX2 build keeps it, NOT re-measured on
# an AVX2 CPU; this Zen 4's -mno-avx512vnni build (`bench.greedy_screen`'s row-major column, sixteenth session,
# load 6-7) beat onednn logits at 13-16 rows (10.47 vs 11.50, 12.19 vs 13.59 ms) and MKL's at 13-48, and lost to
# onednn from 24 (18.29 vs 16.52).
MAX_ROWS = 12  # the row-major screen (AVX2 build); also the most rows a w8a8 step gives the screen (measured range)
# The blocked screen (VNNI build) against the runner's logits + cpu_kernels.argmax on this CPU (`onednn` on Zen 4),
# 49152 x 512 head, random rows, one thread, CPU ms, median of 9 interleaved, logits/screen. Commit 5cac9c7 (load
# 11-12): 13 rows 10.43/5.90, 16 11.67/5.86, 24 15.26/8.28, 32 20.06/11.49, 48 26.91/16.90, 64 34.25/21.30: 1.6-2.0x
# (two threads 16-48 rows 1.5-1.9x). `python -m hintkv.bench.greedy_screen --rows 13,16,24,32,48,64` (sixteenth
# session mend, load 6-7, two runs): 13 rows 1.93/2.07x, 16 2.08/2.18, 24 2.24/2.18, 32 1.90/1.93, 48 1.85/2.01,
# 64 1.73/1.56x; against MKL (an Intel CPU's logits, `--logits mkl`) 2.9-4.2x. 64: the largest count measured.
# Its pass-1 scratch (`hbuf` in csrc/greedy_head.cpp) is rows x ceil(V/16)*16 floats, kept per calling thread and
# reused (never shrunk): bounded by this cap at 64 x 49152 x 4 B = 12.6 MB (dummy:tiny, SmolLM2), 32.8 MB at a
# 128k vocabulary; one engine thread calls it, so one such buffer per process.
MAX_ROWS_BLOCKED = 64
# Under w8a8 the head is an int8 GEMM whose top 16 logits of each row are recomputed in float (`linear.W8A8HeadKernel`);
# the screen gives the float argmax itself. w8a8 dummy:tiny decode step, one process, the two interleaved (5 rounds x
# 16 steps, one thread, CPU ms, median; sixteenth session, load 8-9): rows 1: head 4.93, screen 5.48; 2: 6.83 vs 5.54;
# 4: 8.20 vs 7.30; 8: 11.75 vs 10.53. From 2 rows the screen is cheaper; at one row the int8 head stays.
W8A8_MIN_ROWS = 2


def ops() -> ModuleType | None:
    return cpu_ext.load("hintkv_greedy_head", _SOURCE, ["screened_argmax", "has_screen", "blocked",
                                                              "last_recomputed"], _CFLAGS)


def max_rows() -> int:
    """The most rows this build's screen answers; above it the caller computes the logits."""
    return MAX_ROWS_BLOCKED if ops() is not None and ops().blocked() else MAX_ROWS


def screens_w8a8(rows: int) -> bool:
    """Whether a w8a8 model's greedy step of `rows` rows takes the screen instead of its int8 head's logits:
    W8A8_MIN_ROWS to MAX_ROWS rows in the VNNI build, what was measured (an AVX2-only CPU keeps the head)."""
    return (W8A8_MIN_ROWS <= rows <= MAX_ROWS and os.environ.get("HINTKV_GREEDY_HEAD", "1") != "0"
            and ops() is not None and ops().blocked())


def quantise_rows(w: torch.Tensor, blocked: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor]:
    """(int8 copy, per-row scale, per-row error bound err_r, int32 row sums) of a float32 weight [V, H]: the
    screen's arguments after x. The copy is rows [V, H], or with `blocked` (`ops().blocked()`: the VNNI build)
    `int8.block_weight`'s 16-row blocks [ceil(V/16), ceil(H/64) * 16, 16, 4]."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    scale = amax / 127
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    resid = (w - q.float() * scale[:, None]).abs().amax(dim=1)
    # both dot products (int8 approximate, float exact) round: each is within H * 2^-24 * |x|_1 * amax
    # of the real value (Higham's gamma_H); 2^-22 doubles that margin once more
    err = resid + amax * (w.shape[1] * 2.0 ** -22)
    wsum = q.sum(dim=1, dtype=torch.int32)
    return (int8.block_weight(q.t())[0] if blocked else q.contiguous()), scale.contiguous(), err.contiguous(), wsum


class GreedyHead:
    """The screened argmax of one LM-head weight; re-prepared when the weight changes (like linear.py's kernels).

    The change is seen by (data_ptr, _version); a `.data.copy_` (llama.py's loader) bumps neither, so whoever
    copies weights in that way builds a new GreedyHead (`LlamaForCausalLM.prepare`)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self._key: tuple[int, int] | None = None
        self._prepared: tuple[torch.Tensor, ...] | None = None

    def applies(self) -> bool:
        """CPU float32 and the C++ kernels on (HINTKV_CPU_KERNELS), built with VNNI or AVX2; HINTKV_GREEDY_HEAD=0 turns it off."""
        w = self.weight
        return (w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2 and w.is_contiguous()
                and os.environ.get("HINTKV_GREEDY_HEAD", "1") != "0" and cpu_kernels.enabled()
                and ops() is not None and ops().has_screen())

    def refresh(self) -> bool:
        """Prepare the int8 copy if the weight changed; False when the screen cannot serve it."""
        key = (self.weight.data_ptr(), self.weight._version)
        if key != self._key:
            self._key = key
            self._prepared = quantise_rows(self.weight, ops().blocked()) if self.applies() and bool(
                torch.isfinite(self.weight).all()) else None
        return self._prepared is not None

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> list[int] | None:
        if (hidden.dtype != torch.float32 or hidden.dim() != 2 or not self.refresh()
                or hidden.shape[0] > max_rows()):
            return None
        out = ops().screened_argmax(hidden.contiguous(), *self._prepared, self.weight)
        return out if len(out) == hidden.shape[0] else None  # empty: a non-finite row
