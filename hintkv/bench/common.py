"""Helpers every `hintkv bench ...` benchmark shares.

- `ServerProcess`: start a server subprocess on a free loopback port, wait for `/health`, stop it.
  `hintkv_server(...)` builds the `python -m hintkv serve ...` command for it.
- the streaming client (`stream_completion` / `stream_batch`, recording when each streamed chunk arrived) is
  `stream_client.py`'s: import it from there.
- `percentile`, `median`, `summarize`: plain-Python statistics (linear interpolation, numpy's
  default), so benchmark numbers do not depend on numpy being importable.
- `print_table(rows, columns)`, `goal(...)`, `emit_json(obj)`: the output convention. A benchmark
  prints a readable table, then its very last stdout line is one compact JSON object carrying a
  `goals` object whose entries are built by `goal()` from measured values, never typed in;
  `unless_errored` voids a goal over live runs that errored on more than a small share of calls.
- `add_common_args(parser)` / `repeats(args, full, quick)`: the `--quick` convention. `--quick`
  is a reduced run (under about 2 minutes) with fewer sizes and fewer repeats; both modes use the
  same code path.

Example (`stream_completion` from `hintkv.bench.stream_client`):
    with ServerProcess(hintkv_server("dummy:tiny")) as srv:
        t = asyncio.run(stream_completion(srv.base_url, "dummy:tiny", [1, 2, 3], max_tokens=8))
        print(t.ttft_s, t.decode_tok_per_s)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import httpx

# ---------------------------------------------------------------- statistics


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) with linear interpolation between closest ranks."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    return percentile(values, 50)


def summarize(values: Iterable[float]) -> dict[str, float]:
    """Count, mean, p50, p90, p99 and max of a non-empty sample."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("summarize of an empty sequence")
    return {
        "n": len(xs),
        "mean": sum(xs) / len(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "max": max(xs),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


# ---------------------------------------------------------------- output convention


def goal(target: float, measured: float | None, met: bool) -> dict[str, Any]:
    """One entry of a benchmark's `goals` object."""
    return {"target": target, "measured": measured, "met": bool(met)}


NO_REACH = object()  # a goal with no ceiling: no `reachable` verdict


def goal_at_least(target: float, measured: float | None, reach: Any = NO_REACH) -> dict[str, Any]:
    """A goal met when measured >= target; a missing measurement is never met. `reach`: the
    most a goal's benchmark shows any policy could measure (a ceiling computed from the runs,
    None when not known): adds `reachable`, the target within it (None: not known)."""
    g = goal(target, measured, measured is not None and measured >= target)
    return g if reach is NO_REACH else {**g, "reachable": None if reach is None else reach >= target}


def goal_at_most(target: float, measured: float | None, reach: Any = NO_REACH) -> dict[str, Any]:
    """A goal met when measured <= target; a missing measurement is never met. `reach`: the
    least any policy could measure, as for `goal_at_least`."""
    g = goal(target, measured, measured is not None and measured <= target)
    return g if reach is NO_REACH else {**g, "reachable": None if reach is None else reach <= target}


MAX_ERROR_SHARE = 0.01  # a live run with more of its calls errored than this meets no goal


def unless_errored(g: dict[str, Any], runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`g`, a goal read from live runs' rows (`calls`, `errors`), with `met: false` and a `reason`
    when one of `runs` (name -> row) errored on more than MAX_ERROR_SHARE of its calls. An errored
    call is a miss and has no TTFT, so a run's hit rate and TTFT read over the calls that answered
    would flatter it: a run whose slow calls time out would be scored on its fast ones."""
    bad = [f"{name}: {row['errors']} of {row['calls']} calls errored" for name, row in runs.items()
           if row.get("calls") and row.get("errors", 0) > MAX_ERROR_SHARE * row["calls"]]
    if not bad:
        return g
    return {**g, "met": False, "reason": "; ".join(bad) + f" (more than {MAX_ERROR_SHARE:.0%})"}


def format_cell(value: Any) -> str:
    """How a table cell reads: None as '-', floats with 3 significant digits (at least)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows (dicts) as an aligned text table; a column missing from a row shows '-'."""
    cells = [[format_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(items: Sequence[str]) -> str:
        return "  ".join(s.rjust(w) if i else s.ljust(w) for i, (s, w) in enumerate(zip(items, widths)))

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    print(format_table(rows, columns), flush=True)


def emit_json(obj: Mapping[str, Any]) -> None:
    """Print `obj` as one compact JSON line (the benchmark's last line of stdout): strict JSON, a non-finite
    float (NaN, +-Infinity, which json.dumps would write as bare tokens no strict parser reads) is null."""
    print(json.dumps(_finite(obj), separators=(",", ":"), sort_keys=False, default=str, allow_nan=False), flush=True)


def _finite(value: Any) -> Any:
    """`value` with every non-finite float made None and dataclasses made dicts, all the way down."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        return {k: _finite(getattr(value, k)) for k in value.__dataclass_fields__}
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:
        return _finite(value.item())  # a numpy / torch scalar
    return value


def log(message: str) -> None:
    """Progress goes to stderr so stdout holds only the table and the JSON line."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class CallProgress:
    """A one-line progress bar on stderr, advanced once per finished call (a replay's `on_call`)."""

    def __init__(self, name: str, total: int) -> None:
        self.name, self.total, self.done, self.t0 = name, total, 0, time.perf_counter()

    def __call__(self, _call: object) -> None:
        self.done += 1
        if self.done % max(1, self.total // 20) == 0 or self.done == self.total:
            bar = "#" * (20 * self.done // self.total)
            log(f"{self.name}: [{bar:<20}] {self.done}/{self.total} calls, {time.perf_counter() - self.t0:.0f}s")


# ---------------------------------------------------------------- --quick convention


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """Flags every benchmark takes: `--quick` (reduced run, < ~2 min) and `--seed`."""
    parser.add_argument("--quick", action="store_true", help="reduced run: fewer sizes and repeats")
    parser.add_argument("--seed", type=int, default=0, help="seed for random prompts")


def repeats(args: argparse.Namespace, full: int = 3, quick: int = 1) -> int:
    """How many times each measurement is repeated (its median is reported)."""
    return quick if getattr(args, "quick", False) else full


# ---------------------------------------------------------------- prompts


class PromptFactory:
    """Random token-id prompts that never share a prefix with an earlier one (so nothing is
    cached unless a benchmark asks for it): each starts with a token not used before."""

    def __init__(self, vocab_size: int, seed: int = 0, low: int = 16) -> None:
        if vocab_size <= low + 1:
            raise ValueError("vocab too small")
        self._rng = random.Random(seed)
        self._low = low  # skip the lowest ids, where special tokens usually live
        self._high = vocab_size - 1
        firsts = list(range(low, vocab_size))
        self._rng.shuffle(firsts)
        self._firsts = firsts

    def make(self, num_tokens: int) -> list[int]:
        if num_tokens < 1:
            raise ValueError("num_tokens must be >= 1")
        if not self._firsts:
            raise RuntimeError("ran out of distinct first tokens")
        first = self._firsts.pop()
        return [first] + [self._rng.randint(self._low, self._high) for _ in range(num_tokens - 1)]


# ---------------------------------------------------------------- server processes


PORTS_ENV = "HINTKV_BENCH_PORTS"  # "LO-HI": servers take ports from this range only (a shared machine)
_next_port: list[int] = []  # where the range's next search starts: after the last port handed out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: any (the OS's choice), or, with
    HINTKV_BENCH_PORTS=LO-HI, a free one of that range, searched from after the last one handed
    out (servers launched together do not get the same port before any of them listens)."""
    spec = os.environ.get(PORTS_ENV)
    if not spec:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    lo_s, _, hi_s = spec.partition("-")
    lo, hi = int(lo_s), int(hi_s or lo_s)
    start = _next_port[0] if _next_port and lo <= _next_port[0] <= hi else lo
    for i in range(hi - lo + 1):
        port = lo + (start - lo + i) % (hi - lo + 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _next_port[:] = [port + 1]
        return port
    raise RuntimeError(f"{PORTS_ENV}={spec}: no free port left in the range")


@dataclass(slots=True)
class ServerSpec:
    """How to start one OpenAI-compatible server; `{port}` in argv is replaced by the port."""

    name: str  # label in logs and tables
    argv: list[str]
    env: dict[str, str | None] = field(default_factory=dict)  # added to os.environ; None: removed from it
    health_path: str = "/health"
    startup_timeout_s: float = 180.0
    cwd: str | None = None

    def environ(self) -> dict[str, str]:
        """The server's environment: this process's, with `env` applied."""
        return {k: v for k, v in {**os.environ, **self.env}.items() if v is not None}


class ServerProcess:
    """A server subprocess on a free loopback port; a context manager that waits for health.

    Output goes to a log file (its tail is shown if the server dies or never gets healthy).
    """

    def __init__(self, spec: ServerSpec, port: int | None = None) -> None:
        self.spec = spec
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(tempfile.gettempdir(), f"hintkv-bench-{spec.name}-{self.port}.log")
        self.startup_s: float | None = None
        self._t0 = 0.0

    def launch(self) -> Self:
        """Start the process without waiting for it (`start` then waits for health)."""
        argv = [a.replace("{port}", str(self.port)) for a in self.spec.argv]
        env = self.spec.environ()
        log(f"starting {self.spec.name}: {' '.join(argv)}  (log: {self.log_path})")
        self._t0 = time.perf_counter()
        with open(self.log_path, "wb") as logf:
            # own process group, so stop() reaches the server's workers too
            self.proc = subprocess.Popen(
                argv, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=self.spec.cwd, start_new_session=True
            )
        return self

    def start(self) -> Self:
        if self.proc is None:
            self.launch()
        self._wait_healthy()
        self.startup_s = time.perf_counter() - self._t0
        log(f"{self.spec.name} healthy after {self.startup_s:.1f}s on port {self.port}")
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        url = self.base_url + self.spec.health_path
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.spec.name} not healthy after {self.spec.startup_timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, num_chars: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-num_chars:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        import signal

        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def hintkv_server(
    model: str,
    *,
    name: str = "hintkv",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout_s: float = 180.0,
) -> ServerSpec:
    """`python -m hintkv serve --model MODEL --host 127.0.0.1 --port {port} ...` in this interpreter."""
    argv = [sys.executable, "-m", "hintkv", "serve", "--model", model, "--host", "127.0.0.1", "--port", "{port}"]
    return ServerSpec(name=name, argv=argv + list(extra_args), env=dict(env or {}), startup_timeout_s=startup_timeout_s)
