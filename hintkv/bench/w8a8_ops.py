"""Per-op probe of the w8a8 kernels: float32 (MKL-packed) vs w8a8 on its VNNI and AMX paths.

    python -m hintkv.bench.w8a8_ops [--rows 1,8] [--reps 40] [--ops qkv,o_proj,gate_up,down,head]

SmolLM2-135M's linear shapes on random weights, each through `linear.KERNELS` (the kernels serving
uses: `mkl`, `w8a8`, `w8a8-head` for the LM head, `w8a8-fine` for down_proj), one thread, process
CPU time per call (robust to other jobs on the machine), the median of `--reps` calls interleaved
across kernels. The AMX column flips `int8.AMX` (the path `int8.gemv_path()` names); where the CPU
has no AMX both w8a8 columns run the VNNI loop. docs/benchmarks/history/engine.md's eleventh-session per-op table
comes from this probe.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from hintkv.bench.common import print_table
from hintkv.models import int8
from hintkv.models.linear import KERNELS

# SmolLM2-135M's linear layers: (out, in)
SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "head": (49152, 576)}


def _cpu_us(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, amx: bool) -> float:
    int8.AMX = amx
    t = time.process_time()
    fn(x)
    return (time.process_time() - t) * 1e6


def op_rows(op: str, rows: list[int], reps: int) -> list[dict[str, object]]:
    """One op's row per row count: each kernel's median CPU us per call and float / w8a8-AMX."""
    n, k = SHAPES[op]
    g = torch.Generator().manual_seed(0)
    w, absmax = torch.randn(n, k, generator=g) * 0.05, torch.rand(k, generator=g) * 3 + 0.1
    kernels = {"float MKL": KERNELS["mkl"](w, None),
               "w8a8": KERNELS["w8a8-head" if op == "head" else "w8a8"](w, None, absmax)}
    if op == "down":
        kernels["w8a8-fine"] = KERNELS["w8a8-fine"](w, None, absmax)
    cases = [("float MKL", kernels["float MKL"], False)]
    for name in [kn for kn in kernels if kn != "float MKL"]:
        cases += [(f"{name} VNNI", kernels[name], False), (f"{name} AMX", kernels[name], True)]
    out = []
    before = int8.AMX
    try:
        for m in rows:
            x = torch.randn(m, k, generator=g)
            for _, fn, amx in cases:  # warm-up: packing, first-call allocations
                _cpu_us(fn, x, amx)
            times: dict[str, list[float]] = {c[0]: [] for c in cases}
            for _ in range(reps):
                for name, fn, amx in cases:
                    times[name].append(_cpu_us(fn, x, amx))
            med = {name: statistics.median(v) for name, v in times.items()}
            out.append({"op": op, "rows": m, **{f"{c} us": round(v) for c, v in med.items()},
                        "float/w8a8 AMX": round(med["float MKL"] / max(med["w8a8 AMX"], 1e-9), 2)})
    finally:
        int8.AMX = before
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hintkv.bench.w8a8_ops", description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8", help="activation rows per call (decode batch sizes)")
    p.add_argument("--reps", type=int, default=40, help="interleaved calls per kernel (the head: a fifth)")
    p.add_argument("--ops", default=",".join(SHAPES), help=f"of {','.join(SHAPES)}")
    args = p.parse_args(argv)
    ops = args.ops.split(",")
    if bad := [o for o in ops if o not in SHAPES]:
        p.error(f"unknown op(s) {bad}; choose from {list(SHAPES)}")
    rows = [int(r) for r in args.rows.split(",")]
    torch.set_num_threads(1)
    int8.AMX = True
    print(f"w8a8 few-row GEMM path here: {int8.gemv_path()}; one thread, CPU time per call, median of {args.reps}")
    for op in ops:
        table = op_rows(op, rows, max(1, args.reps // 5) if op == "head" else args.reps)
        print_table(table, list(table[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
