"""The greedy LM head's screen alone: this machine's screen (VNNI or AVX2) vs the AVX2 one vs logits + argmax.

    python -m hintkv.bench.greedy_screen [--rows 1,8,12,16] [--reps 9] [--vocab 49152] [--hidden 512]
                                         [--logits onednn|mkl]

A random head (dummy:tiny's 49152 x 512 by default, rows * 0.05) and x ~ N(0, 1), one thread, process CPU time
per call, the median of `--reps` calls interleaved across the three. "blocked" is this machine's build of
`csrc/greedy_head.cpp` (16-row blocks: dpbusd where the CPU has AVX-512 VNNI, else AVX2's vpmaddubsw); "avx2" is
the same source built with -mno-avx512f (the AVX2 screen a CPU without VNNI runs; on such a CPU "blocked" is that
screen already, and there is no "avx2" column); "logits" is
`linear.KERNELS[--logits]` + argmax, what the runner does above `greedy_head.max_rows()` rows: by default the
runner's own float kernel on this CPU (`linear.float_kernel_name`: `onednn` on a non-Intel AVX-512 CPU, else
`mkl`; HINTKV_CPU_GEMM picks another). Each row count's tokens are checked against a float64 argmax;
"recomputed" is the blocked screen's rows recomputed in float. docs/benchmarks/history/engine.md's
fifteenth-session mend section comes from this probe, and greedy_head.MAX_ROWS_BLOCKED's figures:
`--rows 13,16,24,32,48,64 --reps 9` (default --logits).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from hintkv.bench.common import print_table
from hintkv.models import cpu_ext, greedy_head
from hintkv.models.linear import KERNELS, float_kernel_name


def _cpu_ms(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return (time.process_time() - t) * 1e3


def rows_table(vocab: int, hidden: int, rows: list[int], reps: int, logits_kernel: str | None = None
               ) -> list[dict[str, object]]:
    native = greedy_head.ops()
    if native is None or not native.has_screen():
        raise SystemExit("no greedy screen on this machine (C++ kernels off, or neither VNNI nor AVX2)")
    # a CPU without VNNI (Zen 3) runs the AVX2 screen natively: the -mno-avx512f build is the same code again (a C++
    # build of minutes in every fresh CI run, for a column equal to "blocked")
    avx2 = cpu_ext.load("hintkv_greedy_head_novnni", greedy_head._SOURCE,
                        ["screened_argmax", "has_screen", "blocked", "isa", "last_recomputed"],
                        greedy_head._CFLAGS + ["-mno-avx512f"]) if native.isa() == "vnni" else None
    g = torch.Generator().manual_seed(0)
    w = torch.randn(vocab, hidden, generator=g) * 0.05
    prep = greedy_head.quantise_rows(w, blocked=True)
    logits = KERNELS[logits_kernel or float_kernel_name(w)](w, None)
    out = []
    for m in rows:
        x = torch.randn(m, hidden, generator=g)
        want = (x.double() @ w.double().T).argmax(-1).tolist()
        cases: dict[str, Callable[[], object]] = {"logits": lambda: logits(x).argmax(-1).tolist()}
        if avx2 is not None and avx2.isa() == "avx2":
            cases["avx2"] = lambda: avx2.screened_argmax(x, *prep, w)
        cases["blocked"] = lambda: native.screened_argmax(x, *prep, w)
        for name, fn in cases.items():  # warm-up; the screens must give the float64 argmax
            got = fn()
            if name != "logits" and got != want:
                raise AssertionError(f"{name} screen at {m} rows: {got} != float64 argmax {want}")
        recomputed = native.last_recomputed()
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(reps):
            for name, fn in cases.items():
                times[name].append(_cpu_ms(fn))
        med = {name: statistics.median(v) for name, v in times.items()}
        row: dict[str, object] = {"rows": m, **{f"{name} ms": round(v, 2) for name, v in med.items()},
                                  "recomputed": recomputed}
        if "avx2" in med:
            row["avx2/blocked"] = round(med["avx2"] / med["blocked"], 2)
        row["logits/blocked"] = round(med["logits"] / med["blocked"], 2)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hintkv.bench.greedy_screen", description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8,12,16", help="x rows per call (decode batch sizes)")
    p.add_argument("--reps", type=int, default=9, help="interleaved calls per case")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--logits", choices=("onednn", "mkl"), default=None,
                   help="the logits' float kernel (default: the runner's on this CPU, linear.float_kernel_name)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    table = rows_table(args.vocab, args.hidden, [int(r) for r in args.rows.split(",")], args.reps, args.logits)
    kernel = args.logits or float_kernel_name(torch.zeros(args.vocab, args.hidden))
    print(f"greedy head {args.vocab} x {args.hidden}: one thread, CPU time per call (ms), median of {args.reps}; "
          f"screen: {greedy_head.ops().isa()}; logits: {kernel} + argmax; "
          f"max_rows(): {greedy_head.max_rows()}")
    print_table(table, list(table[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
