"""Greedy decoding's LM head: each row's argmax of x W^T without reading the float weight whole.

A greedy step needs one token per row, not the logits. On a CPU the LM head is the largest GEMM of a
decode step and it is bound by the bytes it reads (dummy:tiny: 49152 x 512 float32 = 100 MB, ~37% of a
one-row step's CPU time); vLLM reads all of it. Here an int8 copy (per-row scale, a quarter of the
bytes) and x quantised per row give approximate logits through integer dot products (AVX-512 VNNI, or
AVX2's vpmaddubsw where a CPU has no VNNI, e.g. AMD Zen 1 and 3; both read the copy in 16-row blocks)
with a proved error bound, and only the rows whose bound reaches the best lower bound are recomputed
in float32 (`csrc/greedy_head.cpp` says how):

    |x . w_r - a_r| <= |x|_1 err_r + |x - x~|_1 127 scale_r,   err_r = max_i |w_ri - scale_r q_ri| + float's margin

(the AVX2 screen, whose x has 7 bits so that vpmaddubsw takes it unsigned without a sign trick, bounds by the
smaller of that and |x|_2 |w_r - w~_r|_2 + |x - x~|_2 |w~_r|_2, the tighter one on a model's rows: dummy:tiny's b8 steps
recompute ~100 rows instead of ~385, and with the copy fetched 4 KiB ahead the screen runs 1.31-1.50x faster per
round than the 8-bit one (one thread, CPU time); history/engine.md, twenty-ninth
session), so the true argmax is always among the recomputed rows, and the answer is the argmax of the screen's own
float32 dot products (first index on ties among them). Those sum in another order than the logits' GEMM
(MKL / gemv), so where two logits are equal within float rounding the token may differ from
torch.argmax of the logits (rare; both are the real argmax up to float rounding).

    GreedyHead(weight, head).serves(rows, quantized) -> bool    THE decision: does a greedy step of `rows` rows
                                        take the screen (CPU float32 weight first, env, kernels, row counts, w8a8 build)
    max_rows() -> int    MAX_ROWS_BLOCKED (64) in the VNNI build, else MAX_ROWS (12: the AVX2 build)
    GreedyHead(weight, head)(hidden, quantized) -> list[int] | None    None: not served (the caller computes logits)
    GreedyHead(weight, head).prepare(quantized) -> bool    build the int8 copy now if `serves` lets any step in
    GreedyHead(weight, head).ready() -> bool    the int8 copy of the current weight is built
    screens_w8a8() -> bool    the build's part of `serves` under w8a8: the VNNI build, the one measured

Under w8a8 the int8 copy is the head kernel's own (`head`, an unsmoothed `linear.W8A8HeadKernel`: `int8.quantize_weight`
+ `int8.block_weight` of the same weight, byte for byte), not a third one; only err_r and the row sums are derived.
The screen reads the float head with the w8a8 layers' hidden rows, so its token is their float argmax. The int8 head
(`W8A8HeadKernel`: int8 logits, its top 16 recomputed in float, then the argmax over all of them) gives that token only
when the float argmax is in its int8 top 16 AND its exact logit is at least every int8 logit outside the top 16; a row
outside keeps its int8 logit and can win. Not guaranteed, but almost always (SmolLM2 w8a8, 2,301 eval rows in 8-row
steps: 0 differed). So a w8a8 greedy token depends on the step's rows (rare): 1 row, 13+ rows or a verify with drafts
take the int8 head; 2-12 rows the float argmax (the VNNI and the AVX2 builds; a build without a screen keeps the head).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import torch

from hintkv.models import cpu_ext, cpu_kernels, int8
from hintkv.models.linear import LinearKernel, W8A8HeadKernel

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
MAX_ROWS = 12  # the AVX2 build (its blocked screen NOT re-measured past 12 rows); also the most rows a w8a8 step gives
# the screen (measured range)
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
# 4: 8.20 vs 7.30; 8: 11.75 vs 10.53. From 2 rows the screen is cheaper; at one row the int8 head stays. AVX2 (Zen 3,
# twenty-sixth session, the blocked AVX2 screen, dummy:tiny, two w8a8 engines in one process, one thread, CPU ms,
# median of 7 rounds, load 4.9): the head's part of a step (the int8 head + its argmax vs the screen) b8 6.14 vs 5.66
# (per round 0.94-1.38x), b4 3.56 vs 3.40; whole steps b8 19.07 vs 19.24, b4 11.13 vs 10.98. Both are an int8 pass of
# the same multiply work there; a gain of ~2.5% of a step, inside the steps' noise. On the server's TWO threads
# (twenty-eighth session, the lead: dummy:tiny, three engines in one process, float32 / w8a8 head / w8a8 screen,
# whole decode steps, wall ms, median of 7 interleaved rounds of 32 steps, load 1.0-1.9): b8 7.11 (head) vs 6.81
# (screen), b4 4.10 vs 3.75 (the screen faster in every b4 round), b1 2.85 vs 2.82; one thread b8 12.00 vs 11.33,
# b4 6.58 vs 6.38: the AVX2 build takes the screen too (its top-16 rescore and topk run on one thread in the head).
W8A8_MIN_ROWS = 2


def ops() -> ModuleType | None:
    return cpu_ext.load("hintkv_greedy_head", _SOURCE, ["screened_argmax", "has_screen", "blocked", "isa",
                                                              "last_recomputed"], _CFLAGS)


def max_rows() -> int:
    """The most rows this build's screen answers; above it the caller computes the logits."""
    return MAX_ROWS_BLOCKED if ops() is not None and ops().isa() == "vnni" else MAX_ROWS


def screens_w8a8() -> bool:
    """Whether w8a8 greedy steps of W8A8_MIN_ROWS..MAX_ROWS (12) rows take the screen on this build: the VNNI and the
    AVX2 builds, both measured cheaper than the int8 head on the server's two threads (W8A8_MIN_ROWS' note); a build
    without a screen ("") never. Only `GreedyHead.serves` asks it, after the weight's device and the kernels (a CUDA
    model never builds this extension)."""
    return ops().isa() in ("vnni", "avx2")


def quantise_rows(w: torch.Tensor, blocked: bool = False,
                  int8_weight: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int8 copy, per-row scale, per-row error bounds [3, V] (err_r; |w_r - w~_r|_2 plus the margin times sqrt(H);
    |w~_r|_2), int32 row sums) of a float32 weight [V, H]: the screen's arguments after x. The int8 weight is `int8.quantize_weight`'s (one rule for every int8 copy); the copy
    is its rows [V, H], or with `blocked` (`ops().blocked()`: both screens read it) `int8.block_weight`'s 16-row blocks
    [ceil(V/16), ceil(H/64) * 16, 16, 4]. `int8_weight`: (int8 [H, V], scale [V], copy in that layout) already made
    of this `w` by those two functions (a w8a8 head kernel's), taken as they are: no new int8 copy."""
    w = w.detach().float()
    if int8_weight is None:
        q_t, scale = int8.quantize_weight(w)
        copy = int8.block_weight(q_t)[0] if blocked else q_t.t().contiguous()
    else:
        q_t, scale, copy = int8_weight
    q = q_t.t()
    resid = (w - q.float() * scale[:, None]).abs().amax(dim=1)
    # both dot products (int8 approximate, float exact) round: each is within H * 2^-24 * |x|_1 * amax
    # of the real value (Higham's gamma_H); 2^-22 doubles that margin once more
    margin = w.abs().amax(dim=1) * (w.shape[1] * 2.0 ** -22)
    err = resid + margin
    # the Euclidean bound's row terms, in double, rounded up: |w - w~|_2 plus the margin as |x|_1 <= sqrt(H) |x|_2
    # takes it, and |w~|_2 (w~ = scale q)
    approx = q.double() * scale.double()[:, None]
    err2 = torch.linalg.vector_norm(w.double() - approx, dim=1) + margin.double() * w.shape[1] ** 0.5
    norm2 = torch.linalg.vector_norm(approx, dim=1)
    bounds = torch.stack((err, err2.float() * (1 + 1e-6), norm2.float() * (1 + 1e-6))).contiguous()
    wsum = q.sum(dim=1, dtype=torch.int32)
    return copy, scale.contiguous(), bounds, wsum


class GreedyHead:
    """The screened argmax of one LM-head weight; re-prepared when the weight changes (like linear.py's kernels).

    The change is seen by (data_ptr, _version); a `.data.copy_` (llama.py's loader) bumps neither, so whoever
    copies weights in that way builds a new GreedyHead (`LlamaForCausalLM.prepare`). `head`: the model's LM-head
    kernel; an unsmoothed `W8A8HeadKernel` of the same weight lends the screen its int8 copy."""

    def __init__(self, weight: torch.Tensor, head: LinearKernel | None = None) -> None:
        self.weight = weight
        self.head = head
        self._key: tuple[int, int] | None = None  # the weight's (data_ptr, _version) the three below are of
        self._applies = False  # `applies()`, read once per key
        self._built = False  # the int8 copy was tried (a non-finite weight leaves `_prepared` None)
        self._prepared: tuple[torch.Tensor, ...] | None = None

    def applies(self) -> bool:
        """CPU float32 and the C++ kernels on (HINTKV_CPU_KERNELS), built with VNNI or AVX2; HINTKV_GREEDY_HEAD=0
        turns it off. The device and dtype come first: a CUDA weight never builds the extension."""
        w = self.weight
        return (w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2 and w.is_contiguous()
                and os.environ.get("HINTKV_GREEDY_HEAD", "1") != "0" and cpu_kernels.enabled()
                and ops() is not None and ops().has_screen())

    def serves(self, rows: int, quantized: bool) -> bool:
        """Whether a greedy step of `rows` rows takes the screen (the only place that decides it): `applies()` (read
        once per weight version: HINTKV_GREEDY_HEAD as it was when the model was prepared holds for its life, as
        `bench spec_decode` relies on), then at most `max_rows()` rows; under w8a8 (`quantized`) only W8A8_MIN_ROWS
        to MAX_ROWS rows (the range measured against the int8 head) and where `screens_w8a8()`."""
        if (quantized and not W8A8_MIN_ROWS <= rows <= MAX_ROWS) or not self._applies_now() or rows > max_rows():
            return False
        return not quantized or screens_w8a8()

    def prepare(self, quantized: bool) -> bool:
        """Build the int8 copy now (model load) where the screen serves some step (those of MAX_ROWS rows do)."""
        return self.serves(MAX_ROWS, quantized) and self.refresh()

    def ready(self) -> bool:
        """The int8 copy of the weight as it is now is built (no build here)."""
        return self._prepared is not None and self._key == (self.weight.data_ptr(), self.weight._version)

    def _head_int8(self, blocked: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The head kernel's (int8 [H, V], scale, copy in the screen's layout) where they are what `quantise_rows`
        would make: a w8a8 head of this very weight, not smoothed (its scale per row is then the same rule's)."""
        head = self.head
        if not (isinstance(head, W8A8HeadKernel) and head.weight is self.weight and head.act_absmax is None):
            return None
        head.refresh()
        if head.blocked is None or head.inv_smooth is not None:
            return None
        return head.w_int8_t, head.w_scale, head.blocked[0] if blocked else head.w_int8_t.t()

    def _applies_now(self) -> bool:
        """`applies()` for the weight as it is now (asked again only when the weight changed)."""
        key = (self.weight.data_ptr(), self.weight._version)
        if key != self._key:
            self._key, self._applies, self._built, self._prepared = key, self.applies(), False, None
        return self._applies

    def refresh(self) -> bool:
        """Prepare the int8 copy if the weight changed; False when the screen cannot serve it."""
        if self._applies_now() and not self._built:
            self._built = True
            if bool(torch.isfinite(self.weight).all()):
                blocked = bool(ops().blocked())
                self._prepared = quantise_rows(self.weight, blocked, self._head_int8(blocked))
        return self._prepared is not None

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, quantized: bool = False) -> list[int] | None:
        """Each row's token, or None where the screen does not serve this step (`serves`) or a row is not finite."""
        if (hidden.dtype != torch.float32 or hidden.dim() != 2 or not self.serves(hidden.shape[0], quantized)
                or not self.refresh()):
            return None
        out = ops().screened_argmax(hidden.contiguous(), *self._prepared, self.weight)
        return out if len(out) == hidden.shape[0] else None  # empty: a non-finite row
