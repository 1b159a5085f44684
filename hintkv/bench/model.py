"""`hintkv bench model`: the model alone: cold prefill and one-sequence decode tokens/s, per dtype.

    hintkv bench model [--quick] [--model SPEC] [--prefill 512] [--decode 64]
                       [--dtypes float32,bfloat16] [--threads N] [--repeats 3]

Runs the model through the engine's own runner (`ModelRunner.run`: input building, paged
attention, sampling) on blocks from a plain LRU pool: no scheduler, no prefix cache, no server.
Prints a table, then one JSON line; no issue sets a goal for it, so `goals` is empty (the engine
goals live in `hintkv bench engine`). `--quick`: dummy:tiny, 256-token prefill, 16 decodes, best of 1.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from hintkv.bench.common import add_common_args, emit_json, log, print_table
from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.engine.model_runner import ModelRunner
from hintkv.engine.outputs import ScheduledSeq
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from hintkv.models.loader import LoadedModel, load_model

BLOCK = 16


class _OneSequence:
    """One greedy sequence on its own runner and pool: `step(n)` computes its next n tokens."""

    def __init__(self, lm: LoadedModel, dtype: torch.dtype, prompt: list[int], decode: int) -> None:
        num_blocks = (len(prompt) + decode) // BLOCK + 2
        self.runner = ModelRunner(lm.model, lm.config, num_blocks, BLOCK, dtype, torch.device("cpu"))
        self.kv = KVCacheManager(num_blocks, BLOCK, make_policy("lru"))
        root = namespace_root(lm.name, str(dtype), BLOCK, None)
        self.seq = Sequence("bench", list(prompt), len(prompt),
                            SamplingParams(temperature=0, max_tokens=decode + 1), root)

    def step(self) -> None:
        seq = self.seq
        n = seq.num_tokens - seq.num_computed_tokens
        self.kv.append(seq, n)
        (tokens,) = self.runner.run([ScheduledSeq(seq, n)]).sampled_token_ids
        seq.num_computed_tokens += n
        seq.token_ids += tokens


def measure(spec: str | None, dtype: torch.dtype, prefill: int, decode: int, repeats: int) -> dict[str, Any]:
    lm = load_model(spec, dtype, "cpu")
    ids = torch.randint(100, min(40000, lm.config.vocab_size), (prefill,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    _OneSequence(lm, dtype, ids[:64], 1).step()  # warm-up
    prefill_s, decode_s = [], []
    for _ in range(repeats):
        one = _OneSequence(lm, dtype, ids, decode)
        t0 = time.perf_counter()
        one.step()
        prefill_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(decode):
            one.step()
        decode_s.append(time.perf_counter() - t0)
    return {"dtype": str(dtype).removeprefix("torch."), "prefill_tokens": prefill,
            "prefill_tok_s": prefill / min(prefill_s), "decode_tok_s": decode / min(decode_s),
            "decode_ms_per_token": 1e3 * min(decode_s) / decode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hintkv bench model", description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--model", default=None, help="load_model spec (default: SmolLM2-135M-Instruct GGUF; "
                    "--quick: dummy:tiny)")
    ap.add_argument("--prefill", type=int, default=None, help="prompt tokens (default 512; --quick 256)")
    ap.add_argument("--decode", type=int, default=None, help="decode steps (default 64; --quick 16)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 wins on an oversubscribed host)")
    ap.add_argument("--repeats", type=int, default=None, help="best of this many runs (default 3; --quick 1)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or ("dummy:tiny" if args.quick else None)
    prefill = args.prefill or (256 if args.quick else 512)
    decode = args.decode or (16 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 3)
    rows = []
    for d in args.dtypes.split(","):
        log(f"{model or 'SmolLM2-135M-Instruct'} {d}: prefill {prefill}, decode {decode}")
        rows.append(measure(model, getattr(torch, d), prefill, decode, repeats))
    name = model or "SmolLM2-135M-Instruct"
    print(f"model={name} threads={torch.get_num_threads()}")
    print_table(rows, ["dtype", "prefill_tokens", "prefill_tok_s", "decode_tok_s", "decode_ms_per_token"])
    emit_json({"bench": "model", "model": name, "threads": torch.get_num_threads(), "quick": args.quick,
               "results": rows, "goals": {}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
