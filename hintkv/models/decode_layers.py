"""Every decoder layer of a few-row CPU step in one C++ call (decode steps, short verifies).

A float32 decode step of dummy:tiny spent ~15% of its CPU time in Python between its C++ kernels
(py-spy, one thread: module calls, each kernel's argument checks, `cpu_kernels.enabled()`'s
environment reads), seven kernel calls per layer. `csrc/decode_layers.cpp` runs the same kernels in
the same order from C++ (add_rmsnorm, the q/k/v gemv, rope_, attention over the paged KV,
o_proj, add_rmsnorm, gate_up, silu_mul, down), for every layer, with the GIL released once: its
outputs are bit-identical to the per-op path (tests/models/test_decode_layers.py).

    DecodeLayers.build(model) -> DecodeLayers | None   None: not its case (see `_kind`), or HINTKV_FUSED_DECODE=0
    DecodeLayers(h, cos, sin, kv_caches, meta) -> (h, residual) | None   None: this step is not its case

Its case: a CPU float32 model with the C++ kernels on (decided once, when `LlamaForCausalLM.prepare`
picks the GEMM kernels), every projection on `linear.py`'s `mkl` or `onednn` kernel (`gemv_cpu` at <= 12
rows) or W8A8's int8 kernels with their few-row blocks (`int8_cpu.gemv`, <= GEMV_ROWS int8 rows), a
float32 KV cache, no CUDA-graph metadata; a short prefill of <= max_rows tokens is fused too (the same
kernels). Other steps (more rows, int8 / fp8 KV) run the per-op layers. The C++ kernels' switch
(HINTKV_CPU_KERNELS) is read when `prepare` builds this call: changing it later does not stop it. The source is the
per-op extensions' files, each in its own namespace (W8A8's int8 gemv is called in
int8_cpu's own build, by address), so a kernel fix lands in both paths.

A step whose sequences all take attention's direct path (decodes; a sequence's rows x GQA group <= 16), float32 or
W8A8 (its int8 linears through int8_cpu's build, `int8_cpu.team_address()`), can run as one OpenMP team
(`csrc/decode_team.cpp`: one fork per step, items off shared counters, a wait only at each phase's end) instead of a
region per kernel (32-40 regions per dummy:tiny step, each waking a sleeping worker). Same bits. Which one runs is
HINTKV_DECODE_TEAM (decided in `DecodeLayers.__init__` alone): unset or auto (the default since the twenty-first
session) the regions while the engine's `ContentionGate` (`model.contention_gate`) reads its thread as waiting for a CPU, else the team unless measured step times say otherwise
(`team_choice.py`); 1 the team, 0 the regions. Auto against the regions, served side by side (twenty-first session,
dummy:tiny, 2 threads): SCHED_FIFO b8 1.19x / 1.04x, b1 1.10x / 1.10x; SCHED_OTHER at load 5-8 b8 0.97x / 1.02x, b1
1.46x / 1.05x. The team alone: served, dummy:tiny, 2 threads, bench's clients, interleaved rounds (eighteenth
session), on free cores (SCHED_FIFO) it wins (b8 454 -> 544 tok/s, b1 100 -> 112), but under the shared machine's
ordinary load (8-12 runnable on 2 cores) it loses by half (b8 253 -> 126, b1 61 -> 28) though it uses less CPU per
token (3.47 vs 3.90 ms). The likely cause (not verified): every phase's end needs both threads on a CPU at once, and
under load a waiter that slept waits behind other processes for one. W8A8 in the team (nineteenth session, served,
SCHED_FIFO, two runs): b8 1.28-1.30x its regions (float32 1.09-1.16x), so w8a8 / float32 at b8 1.56-1.62x with the
team for both against 1.38-1.40x with the regions; at load ~5 the team did not lose (b8 1.18x / 1.10x). Measured on
Zen 4 only, which has no AMX: the team's int8 items run int8_cpu's VNNI / AVX2 block loop, never the AMX tiles the
regions' gemv uses where the CPU has them (same bits: int32 sums are exact), so on an AMX host measure first.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
import weakref
from pathlib import Path
from types import ModuleType

import torch

from hintkv.models import cpu_ext, cpu_kernels, gemv_cpu, int8, int8_cpu
from hintkv.models.cpu_choice import env_choice
from hintkv.models.int8 import GEMV_ROWS
from hintkv.models.linear import MklPackedKernel, OneDnnKernel, PackedKernel, W8A8FineKernel, W8A8Kernel
from hintkv.models.team_choice import TeamChooser

_CSRC = Path(__file__).parent / "csrc"
_HEADERS = """#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <vector>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
"""
# cpu_kernels' and gemv's own flags, so the same bits. int8_cpu.cpp is built with -ffp-contract=off (its residual
# rounds as the eager ops round it): the fused call runs that build's gemv through its address instead. (A copy
# in this file under `#pragma GCC optimize("fp-contract=off")` measured 0.83-0.88x the per-op w8a8 step: GCC
# inlines nothing across differing optimize options; the whole file without contraction changed float32's bits.)
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]
_EMPTY = torch.empty(0)
PER_LAYER = 26  # 2 norm weights + 4 linears x 6 tensors (csrc/decode_layers.cpp)
# onednn and packed: gemv at few rows, as mkl
_KIND = {MklPackedKernel: 0, OneDnnKernel: 0, PackedKernel: 0, W8A8Kernel: 1, W8A8FineKernel: 2}


@functools.cache
def source() -> str:
    """The extension's C++: the per-op files inside namespaces, then csrc/decode_layers.cpp."""
    def part(text: str, ns: str) -> str:
        return f"namespace {ns} {{\n{text}\n}}  // namespace {ns}\n"
    return (_HEADERS + part(cpu_kernels.SOURCE, "hk_kernels") + part((_CSRC / "gemv.cpp").read_text(), "hk_gemv")
            + (_CSRC / "int8_team.h").read_text()  # int8_cpu's table, declared once (int8_cpu.py prepends it too)
            + (_CSRC / "decode_layers.cpp").read_text() + (_CSRC / "decode_team.cpp").read_text())


def ops() -> ModuleType | None:
    # source() is read once per process (cached): py-spy found it re-reading the three files in every step (~5%)
    return cpu_ext.load("hintkv_decode_layers", source(),
                        ["decode_layers", "decode_team", "team_phases", "team_futex_counts", "team_table_abi",
                          "team_abi"], _CFLAGS)


def _kind(kernel) -> int | None:
    """The C++ code of a projection's kernel (0 float32 gemv, 1 w8a8, 2 w8a8-fine), None: not fusable."""
    kind = _KIND.get(type(kernel))
    if kind == 0:
        return 0 if kernel.weight.is_contiguous() else None
    if kind is not None and getattr(kernel, "blocked", None) is not None and int8_cpu.ops() is not None \
            and int8_cpu.ops().has_fast_gemv():
        return kind
    return None


def _linears(model) -> list[tuple]:
    """Each layer's four projections, in csrc/decode_layers.cpp's order."""
    return [(layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            for layer in model.layers]


def _rows_a_token(kernel) -> int:
    """The int8 activation rows a token takes in a W8A8 kernel's gemv: one on the int16 kernel's depth-2 weight
    (`int8.gemv_levels`), else its levels."""
    return 1 if kernel.gemv_depth() == 2 else kernel.levels


def _team_table(int8_ops: ModuleType) -> int:
    """int8_cpu's Int8Team table's address (csrc/int8_team.h), or 0 when that build has no team loop or its table's abi
    is not the one this build reads (a stale cached build): the team then stays off for int8 linears, with a warning,
    instead of failing every team step in decode_team's own check (review_engine20 finding 9)."""
    address = int8_ops.team_address()
    fused = ops()
    if address and fused is not None and fused.team_table_abi(address) != fused.team_abi():
        warnings.warn(f"int8_cpu's team table is abi {fused.team_table_abi(address)}, the decode step reads "
                      f"{fused.team_abi()} (csrc/int8_team.h): W8A8 decode steps run without the team", stacklevel=3)
        return 0
    return address


class DecodeLayers:
    """The fused call for one model; its flat tensor list is rebuilt whenever a projection's kernel changed."""

    def __init__(self, model) -> None:
        # held weakly: the model holds this call (`_decode_layers`), and a strong reference back made the model a
        # reference cycle, so a dropped engine's weights (~300 MB of dummy:tiny's) waited for a full collection
        self._model = weakref.ref(model)
        self.linears = _linears(model)
        self.int8 = any(_KIND.get(type(m.kernel)) != 0 for group in self.linears for m in group)
        # gemv takes GEMV_ROWS int8 rows: a token is one row on the int16 kernel's weight (`gemv_kernel()` "i16"), else
        # its levels (two), so a w8a8 step of up to 16 tokens (i16) or 8 (i8) is fused
        self.max_rows = (GEMV_ROWS // max(_rows_a_token(m.kernel) for group in self.linears for m in group
                                          if _KIND.get(type(m.kernel)) != 0) if self.int8 else gemv_cpu.ROWS)
        # int8_cpu's build may be missing (no compiler for it): int8.py then runs the eager ops, and build() returns
        # None on its kernels (_kind), so reading the addresses must not fail first
        int8_ops = int8_cpu.ops() if self.int8 else None
        self.int8_gemv = int8_ops.gemv_address() if int8_ops is not None else 0
        self.int8_team = _team_table(int8_ops) if int8_ops is not None else 0  # 0: no int8 team loop for this build
        self.fine_rows = int8.fine_int8_rows() if self.int8 else 0  # as W8A8FineKernel's own choice
        self._stamp: tuple | None = None
        self._ops = None
        # the one place that decides a decode step's threading: HINTKV_DECODE_TEAM=1 the team, 0 the regions, unset or
        # auto: chosen step by step (team_choice.py); int8 linears only where int8_cpu has the team loop
        mode = env_choice("HINTKV_DECODE_TEAM", ("0", "1"), default="auto")  # unset: auto; an unknown value raises
        can_team = not self.int8 or self.int8_team != 0
        self.team = can_team and mode == "1"
        # auto: the team unless the engine's contention gate (model.contention_gate) reads its thread as waiting for a
        # CPU (the regions then), and the timing probes between; a model stepped without an LLMEngine (bench model's
        # one-sequence runner) has no gate: the timing rule alone decides there
        self.chooser = TeamChooser(start_team=True) if can_team and mode == "auto" else None

    @property
    def model(self):
        """The model this call runs (which owns it)."""
        return self._model()

    @classmethod
    def build(cls, model) -> DecodeLayers | None:
        cfg = model.config
        if (os.environ.get("HINTKV_FUSED_DECODE", "1") == "0" or model.device.type != "cpu"
                or model.dtype != torch.float32 or cfg.head_dim % 16 or not cpu_kernels.enabled()
                or gemv_cpu.ops() is None):
            return None
        # every kernel must be a case first: __init__ asks the int8 ones for their depth (a "dense" float kernel, as
        # torch without MKL gets, is none of them: review rev26 B3)
        if any(_kind(m.kernel) is None for group in _linears(model) for m in group) or ops() is None:
            return None
        fused = cls(model)
        fused._ops = ops()
        return fused

    def _args(self) -> tuple[list[torch.Tensor], list[int]]:
        kernels = [m.kernel for group in self.linears for m in group]
        for k in kernels:
            k.refresh()  # as Linear.forward: a changed weight re-prepares its copy
        stamp = tuple((k, k._key) for k in kernels)  # the kernels themselves: an id could be reused
        if stamp != self._stamp:  # a kernel was re-prepared or replaced (a test's dense kernels: not fusable)
            self._stamp, self._flat = stamp, self._flatten()
        return self._flat

    def _flatten(self) -> tuple[list[torch.Tensor], list[int]]:
        """(tensors, codes) in csrc/decode_layers.cpp's layout, or ([], []) when a kernel is not fusable."""
        tensors, codes = [], []
        for layer, group in zip(self.model.layers, self.linears):
            tensors += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            kinds, levels = [_kind(m.kernel) for m in group], []
            if None in kinds:
                return [], []
            for m, kind in zip(group, kinds):
                k = m.kernel
                bias = _EMPTY if k.bias is None else k.bias
                if kind == 0:
                    tensors += [k.weight, bias, _EMPTY, _EMPTY, _EMPTY, _EMPTY]
                    levels.append(0)
                else:
                    inv = _EMPTY if k.inv_smooth is None else k.inv_smooth
                    tensors += [k.weight, bias.float(), inv, k.blocked[0], k.w_scale, k.blocked[1]]
                    levels.append(k.gemv_levels)  # 1 on the int16 kernel's depth-2 weight
            codes += kinds + levels
        return tensors, codes

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_caches: list[torch.Tensor],
                 meta) -> tuple[torch.Tensor, torch.Tensor] | None:
        if (h.shape[0] > self.max_rows or h.shape[0] == 0 or meta.static is not None
                or kv_caches[0].dtype != torch.float32):
            return None
        tensors, codes = self._args()
        if not tensors:
            return None
        cfg = self.model.config
        attn = self.model.layers[0].self_attn
        eps = self.model.layers[0].input_layernorm.eps
        rows, chooser = h.shape[0], self.chooser if meta.is_decode_only else None  # auto: decode steps only
        gate = self.model.contention_gate
        team = self.team if chooser is None else chooser.use_team(rows, gate is not None and gate.contended)
        t0 = time.perf_counter()
        if team:
            out = self._ops.decode_team(h, tensors, codes, cos, sin, kv_caches, meta.slot_mapping, meta.block_tables,
                                        meta.query_start_loc, meta.context_lens, attn.scale, eps,
                                        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, self.int8_team,
                                        self.fine_rows)
            if out:  # empty: not the team's case (a sequence with more rows than attention's direct path)
                if chooser is not None:
                    chooser.record(rows, True, time.perf_counter() - t0)
                return out[0], out[1]
        h, residual = self._ops.decode_layers(
            h, h.new_empty(0), tensors, codes, cos, sin, kv_caches, meta.slot_mapping, meta.block_tables,
            meta.query_start_loc, meta.context_lens, attn.scale, self.model.layers[0].input_layernorm.eps,
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, int8.AMX, self.int8_gemv, self.fine_rows)
        if chooser is not None and not team:
            chooser.record(rows, False, time.perf_counter() - t0)
        return h, residual

