"""The `hintkv` command (also `python -m hintkv`): sub-commands `serve` and `bench`.

    hintkv serve --model dummy:tiny --kv-cache-tokens 8192 --port 8000
    hintkv bench engine --quick

Heavy modules (torch, the engine, uvicorn) are imported only by the sub-command that needs them,
so `hintkv --help` and `hintkv bench ...` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from hintkv.config import EngineConfig


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--model",
        default="SmolLM2-135M-Instruct",
        help="SmolLM2-135M-Instruct (default), a .gguf file, a Hugging Face checkpoint "
        "directory, or dummy:<preset> (tiny, smollm2-135m, llama3-8b)",
    )
    p.add_argument("--served-model-name", default=None, help="model id clients must send")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--kv-cache-tokens", type=int, default=None, help="device KV pool, in tokens")
    p.add_argument("--kv-cache-memory", default=None, help="device KV pool, in bytes (e.g. 2GiB)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--eviction-policy", default="sam", help="device pool eviction policy")
    p.add_argument("--host-cache-memory", default=None, help="host KV tier size (e.g. 4GiB)")
    p.add_argument("--disk-cache-dir", default=None, help="disk KV tier directory")
    p.add_argument("--disk-cache-size", default=None, help="disk KV tier size (e.g. 20GiB)")
    p.add_argument("--disk-cache-reuse", action="store_true",
                   help="adopt valid KV block files already in --disk-cache-dir (default: wipe them)")
    p.add_argument(
        "--ignore-hints",
        "--no-hints",
        dest="hints",
        action="store_false",
        help="ignore Agent Hints: still validate them (400 if malformed), but never pass "
        "sessions or edits to the engine (the lru baseline of the benchmarks)",
    )
    p.add_argument(
        "--protect-budget",
        type=float,
        default=0.5,
        help="fraction of the device pool that TTL protection may cover",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="accept this Bearer key (repeat for several); none given: no authentication",
    )
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    p.set_defaults(run=_run_serve)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="run a benchmark: hintkv bench <name> [args...] (hintkv.bench.<name>)",
        add_help=False,
    )
    p.add_argument("name", help="benchmark module in hintkv.bench, e.g. engine")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    p.set_defaults(run=_run_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hintkv", description="LLM inference server for agent swarms."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_bench(sub)
    return parser


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The `EngineConfig` a `serve` command line asks for (validated by EngineConfig itself)."""
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        kv_cache_tokens=args.kv_cache_tokens,
        kv_cache_memory=args.kv_cache_memory,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        eviction_policy=args.eviction_policy,
        seed=args.seed,
        served_model_name=args.served_model_name,
        host_cache_memory=args.host_cache_memory,
        disk_cache_dir=args.disk_cache_dir,
        disk_cache_size=args.disk_cache_size,
        disk_cache_reuse=args.disk_cache_reuse,
        hints=args.hints,
        protect_budget=args.protect_budget,
    )


def _run_serve(args: argparse.Namespace) -> int:
    from hintkv.server import serve

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg = engine_config_from_args(args)
    except ValueError as exc:
        print(f"hintkv serve: {exc}", file=sys.stderr)
        return 2
    serve(cfg, args.host, args.port, args.api_key, args.log_level)
    return 0


def _run_bench(args: argparse.Namespace) -> int:
    if not args.name.isidentifier():
        print(f"hintkv bench: invalid benchmark name {args.name!r}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(f"hintkv.bench.{args.name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"hintkv.bench.{args.name}":
            raise  # the benchmark exists but one of its own imports is missing
        print(f"hintkv bench: no benchmark named {args.name!r}", file=sys.stderr)
        return 2
    return int(module.main(list(args.args)) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
