"""The `hintkv` command (also `python -m hintkv`): `serve`, `bench`, `pool`, `router`, `sim`.

    hintkv serve --model dummy:tiny --kv-cache-tokens 8192 --port 8000
    hintkv bench engine --quick
    hintkv pool start                     # a local Mooncake master for --pool mooncake
    hintkv router --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002

Heavy modules (torch, the engine, uvicorn) are imported only by the sub-command that needs them,
so `hintkv --help` and `hintkv bench ...` start fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys
from collections.abc import Iterable, Sequence

from hintkv.config import EngineConfig


def _flag_type(annotation: str) -> type:
    """The argparse type of a config field from its annotation ('int | None' -> int)."""
    base = annotation.replace(" | None", "").strip()
    return {"int": int, "float": float, "str": str}[base]


def add_config_flags(p: argparse.ArgumentParser, cls: type, skip: Iterable[str] = ()) -> None:
    """One flag per field of the dataclass `cls`: its default, its help (`metadata['help']`).

    A bool field defaulting to False is a switch that turns it on; one defaulting to True is a
    switch (its `flags` metadata names it) that turns it off; a tuple field is a repeatable flag.
    """
    group = p.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        help_text = f.metadata.get("help")
        if help_text is not None:
            help_text = help_text.replace("%", "%%")  # argparse %-formats help ("+15%" would raise)
        flags = f.metadata.get("flags", ("--" + f.name.replace("_", "-"),))
        if f.type == "bool":
            action = "store_false" if f.default else "store_true"
            group.add_argument(*flags, dest=f.name, action=action, help=help_text)
        elif f.type.startswith("tuple"):
            group.add_argument(*f.metadata.get("flags", flags), dest=f.name, action="append",
                               default=[], help=help_text)
        else:
            shown = "" if f.default is None else f" (default: {f.default})"
            group.add_argument(*flags, dest=f.name, type=_flag_type(f.type), default=f.default,
                               help=(help_text or "") + shown)


def config_from_args(cls: type, args: argparse.Namespace):
    """The dataclass `cls` from parsed flags (validated by its own __post_init__)."""
    values = {}
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if f.type.startswith("tuple") else value
    return cls(**values)


def _port(text: str) -> int:
    """A TCP port (0: any free one); 99999 was taken and the server said it ran on it."""
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, not {port}")
    return port


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from hintkv.server.options import ServerOptions  # light: no engine, no torch

    p = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    add_config_flags(p, EngineConfig)
    add_config_flags(p, ServerOptions)
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


def _add_pool(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pool", help="the shared KV pool: `hintkv pool start` runs a Mooncake master")
    p.add_argument("action", choices=["start"])
    p.add_argument("--rpc-port", type=int, default=50051)
    p.add_argument("--http-port", type=int, default=8080, help="HTTP metadata server port")
    p.add_argument("--metrics-port", type=int, default=9003)
    p.add_argument("--lease-ttl-ms", type=int, default=5000,
                   help="how long a read or keep-alive protects a key from removal")
    p.set_defaults(run=_run_pool)


def _run_pool(args: argparse.Namespace) -> int:
    import time

    from hintkv.pool.master import MooncakeMaster

    m = MooncakeMaster(args.rpc_port, args.http_port, args.metrics_port, args.lease_ttl_ms)
    try:
        m.start()
    except (OSError, RuntimeError, TimeoutError) as exc:
        print(f"hintkv pool: {exc}", file=sys.stderr)
        return 1
    print(f"mooncake master up: serve with --pool mooncake --pool-master {m.rpc_address} "
          f"--pool-metadata {m.metadata_url} (metrics on port {m.metrics_port}); Ctrl-C stops it",
          flush=True)
    try:
        while m.alive():
            time.sleep(0.5)
        print("hintkv pool: the master exited", file=sys.stderr)
        return 1
    finally:
        m.stop()


def _add_router(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("router", help="an OpenAI-compatible front over several hintkv instances")
    p.add_argument("--backend", action="append", required=True, metavar="URL",
                   help="a hintkv instance (repeat: --backend http://127.0.0.1:8001 ...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--max-inflight", type=int, default=8,
                   help="a parent's instance has room for a sub-agent below this many requests")
    p.add_argument("--health-interval", type=float, default=1.0, help="seconds between checks")
    p.add_argument("--connect-timeout", type=float, default=2.0,
                   help="seconds to reach an instance before failing over")
    p.add_argument("--api-key", action="append", default=[], dest="api_keys", metavar="KEY",
                   help="accept this Bearer key (repeat for several; the instances' keys); none given: "
                        "no authentication at the router (the instances still check theirs)")
    p.add_argument("--public-metrics", action="store_true",
                   help="serve /metrics and /router/state without an API key (default: they need one when "
                        "keys are set)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(run=_run_router)


def _run_router(args: argparse.Namespace) -> int:
    import uvicorn

    from hintkv.router import build_router_app
    from hintkv.server import event_loop

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = build_router_app(args.backend, max_inflight=args.max_inflight,
                               health_interval_s=args.health_interval,
                               connect_timeout_s=args.connect_timeout,
                               api_keys=tuple(args.api_keys), public_metrics=args.public_metrics)
    except ValueError as exc:
        print(f"hintkv router: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                http=event_loop.http_parser("auto"))  # the instances' parser, its header cap too
    return 0


def _add_sim(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="the calibrated simulator: hintkv sim [calibrate|profiles|run] ...",
                       add_help=False)
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for hintkv.sim.main")
    p.set_defaults(run=_run_sim)


def _run_sim(args: argparse.Namespace) -> int:
    from hintkv.sim.main import main as sim_main

    return sim_main(list(args.args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hintkv", description="LLM inference server for agent swarms."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_bench(sub)
    _add_pool(sub)
    _add_router(sub)
    _add_sim(sub)
    return parser


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The `EngineConfig` a `serve` command line asks for (validated by EngineConfig itself)."""
    return config_from_args(EngineConfig, args)


def _run_serve(args: argparse.Namespace) -> int:
    from hintkv.models.host_memory import keep_freed_memory  # light: ctypes only

    keep_freed_memory()  # before torch starts any thread: glibc keeps an arena a thread took before the cap
    from hintkv.models.loader import model_source  # torch: serve loads it next anyway
    from hintkv.server import serve
    from hintkv.server.options import ServerOptions

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg = engine_config_from_args(args)
        options = config_from_args(ServerOptions, args)
        model_source(cfg.model)
    except ValueError as exc:
        print(f"hintkv serve: {exc}", file=sys.stderr)
        return 2
    serve(cfg, args.host, args.port, options=options, log_level=args.log_level)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:  # its own parser (argparse's REMAINDER drops leading options)
        return _run_sim(argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
