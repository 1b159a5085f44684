"""The CPU float32 GEMM kernels side by side on a model's prefill-shaped GEMMs, in process.

    python -m hintkv.bench.gemm_kernels [--rows 128,512,2048] [--threads 2,1] [--repeats 7] [--smollm2]

Each prefill GEMM of dummy:tiny (fused q/k/v, o, fused gate/up, down; `--smollm2` adds SmolLM2-135M's at 512
rows) at each row count, run by every kernel: `mkl` (F.linear: MKL's sgemm, the current choice past 16 rows
on a CPU without AVX-512), `onednn` (the weight prepacked for oneDNN, `torch.ops.mkldnn._linear_pointwise`),
`packed` (ours, `packed_gemm.py`) and `blis` (the PyPI `blis` package, cython-blis: BLIS's haswell 6 x 16
kernel, single-threaded, GIL released: at 2 threads the rows are split over two Python threads) when it is
importable. Kernels are interleaved within each repeat, so a box loaded by other jobs loads them alike.
1 thread: the calling thread's CPU time (`time.thread_time`, min over repeats); 2 threads: wall time, min.
Figures: GF/s (2 M N K / s) and each kernel over mkl. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from hintkv.bench.common import emit_json, log, print_table
from hintkv.models import packed_gemm
from hintkv.models.presets import preset_config


def layer_shapes(preset: str) -> list[tuple[str, int, int]]:
    """(name, N, K) of one layer's GEMMs with the fused projections."""
    c = preset_config(preset)
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    h, i = c.hidden_size, c.intermediate_size
    return [("qkv", qkv, h), ("o", h, c.num_attention_heads * c.head_dim), ("gate_up", 2 * i, h), ("down", h, i)]


def kernels(w: torch.Tensor, pool: ThreadPoolExecutor, threads: int) -> dict[str, Callable[[torch.Tensor], object]]:
    out: dict[str, Callable[[torch.Tensor], object]] = {"mkl": lambda x: F.linear(x, w)}
    if torch.backends.mkldnn.is_available():
        wd = torch.ops.mkldnn._reorder_linear_weight(w, 32)
        out["onednn"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, wd, None, "none", [], "")
    if packed_gemm.ops() is not None:
        wp = packed_gemm.pack(w)
        out["packed"] = lambda x: packed_gemm.gemm(x, wp, w.shape[0], None)
    try:
        from blis.py import gemm as blis_gemm
    except ImportError:
        return out
    wn = w.numpy()

    def blis(x: torch.Tensor) -> object:
        xn = x.numpy()
        y = torch.empty(x.shape[0], w.shape[0]).numpy()
        if threads == 1:  # on this thread: its CPU time is the figure
            return blis_gemm(xn, wn, out=y, trans2=True, beta=0.0)
        step = -(-x.shape[0] // threads)
        parts = [(xn[i:i + step], y[i:i + step]) for i in range(0, x.shape[0], step)]
        list(pool.map(lambda p: blis_gemm(p[0], wn, out=p[1], trans2=True, beta=0.0), parts))
        return y

    out["blis"] = blis
    return out


def measure(threads: int, rows: list[int], shapes: list[tuple[str, str, int, int]], repeats: int) -> list[dict]:
    torch.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    table = []
    with ThreadPoolExecutor(threads) as pool:
        for model, name, n, k in shapes:
            w = torch.randn(n, k) / k ** 0.5
            ks = kernels(w, pool, threads)
            for m in rows:
                x = torch.randn(m, k)
                best = {kn: float("inf") for kn in ks}
                for _ in range(repeats + 1):  # the first round warms
                    for kn, f in ks.items():
                        t0 = clock()
                        f(x)
                        best[kn] = min(best[kn], clock() - t0)
                row = {"threads": threads, "model": model, "gemm": name, "M": m, "N": n, "K": k}
                for kn, s in best.items():
                    row[f"{kn} GF/s"] = round(2 * m * n * k / s / 1e9, 1)
                for kn in ks:
                    if kn != "mkl":
                        row[f"{kn}/mkl"] = round(best["mkl"] / best[kn], 3)
                table.append(row)
                log(f"{threads}T {model} {name} M={m}: " + ", ".join(f"{kn} {row[kn + ' GF/s']}" for kn in ks))
    return table


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="128,512,2048")
    p.add_argument("--threads", default="2,1")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M's GEMMs at 512 rows")
    args = p.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    tiny = [("tiny", *s) for s in layer_shapes("tiny")]
    table = []
    for t in (int(t) for t in args.threads.split(",")):
        table += measure(t, rows, tiny, args.repeats)
        if args.smollm2:
            table += measure(t, [512], [("smollm2", *s) for s in layer_shapes("smollm2-135m")], args.repeats)
    cols = list(dict.fromkeys(c for r in table for c in r))
    print_table(table, cols)
    isa = packed_gemm.ops().gemm_isa() if packed_gemm.ops() is not None else None
    emit_json({"bench": "gemm_kernels", "packed_isa": isa, "rows": table})


if __name__ == "__main__":
    main()
