"""Model-only speed: cold prefill and single-sequence decode tokens/s, per dtype.

    python -m hintkv.models.bench_speed [--model SPEC] [--prefill 512] [--decode 64] [--dtypes float32,bfloat16] [--threads N]

Runs the model through `simple_generate.SimpleKVCache` (no scheduler, no prefix cache), prints a
table, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hintkv.models.loader import load_model
from hintkv.models.simple_generate import SimpleKVCache, run_step


def measure(spec: str | None, dtype: torch.dtype, prefill: int, decode: int, repeats: int = 3) -> dict[str, float]:
    lm = load_model(spec, dtype, "cpu")
    block = 16
    blocks = (prefill + decode) // block + 2
    ids = torch.randint(100, 40000, (prefill,), generator=torch.Generator().manual_seed(0)).tolist()
    run_step(lm.model, SimpleKVCache(lm.config, blocks, block, dtype), [("warm", ids[:64])])  # warm-up
    prefill_s, decode_s = [], []
    for _ in range(repeats):
        cache = SimpleKVCache(lm.config, blocks, block, dtype)
        t0 = time.perf_counter()
        logits = run_step(lm.model, cache, [("s", ids)])
        prefill_s.append(time.perf_counter() - t0)
        tok = int(logits[0].argmax())
        t0 = time.perf_counter()
        for _ in range(decode):
            tok = int(run_step(lm.model, cache, [("s", [tok])])[0].argmax())
        decode_s.append(time.perf_counter() - t0)
    return {"dtype": str(dtype).removeprefix("torch."), "prefill_tokens": prefill,
            "prefill_tok_s": prefill / min(prefill_s), "decode_tok_s": decode / min(decode_s),
            "decode_ms_per_token": 1e3 * min(decode_s) / decode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="load_model spec (default: SmolLM2-135M-Instruct GGUF)")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 wins on an oversubscribed host)")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [measure(args.model, getattr(torch, d), args.prefill, args.decode, args.repeats) for d in args.dtypes.split(",")]
    print(f"model={args.model or 'SmolLM2-135M-Instruct'} threads={torch.get_num_threads()}")
    print(f"{'dtype':<10} {'prefill tok/s':>14} {'decode tok/s':>13} {'ms/token':>9}")
    for r in rows:
        print(f"{r['dtype']:<10} {r['prefill_tok_s']:>14.1f} {r['decode_tok_s']:>13.1f} {r['decode_ms_per_token']:>9.1f}")
    print(json.dumps({"model": args.model or "SmolLM2-135M-Instruct", "threads": torch.get_num_threads(), "results": rows}))


if __name__ == "__main__":
    main()
