"""Measure a profile through a running OpenAI-compatible server (`hintkv sim calibrate --server URL`).

    prof = calibrate_server("http://127.0.0.1:8000", "dummy:tiny", kv_bytes_per_token=16384)

The figures are what a client of that server sees, on the path live requests take (HTTP, the
engine's own thread, its torch threads, whatever else loads the machine at that moment):

- prefill (new x cached): the time to the first streamed token of a `max_tokens=1` request whose
  prompt is a cached prefix (sent just before, so its full blocks are in the device cache) plus
  `new` fresh random token ids; the request's HTTP round trip is inside the figure, as it is
  inside a live TTFT;
- beside a decoding stream (`keep_warm`, the default): the prefills are measured while one other
  stream decodes, as a busy swarm's short prefills run (batched with decode rows on an awake
  engine); half that stream's step (the mean wait for the step in flight, which the simulator's
  clock models itself) is taken off each, and `idle_wakeup_ms` is what a lone request on the idle
  server takes beyond it (the simulator charges it to steps that start an idle engine). Lone
  requests only overstated a busy swarm's short prefills: 151 ms live vs 555 ms simulated;
- decode (batch x context): `batch` streaming requests of `context` fresh tokens sent at once; the
  median gap between consecutive streamed tokens once every stream has its first token.

Why not only `calibrate` (the engine in-process)? On a loaded 2-core machine the in-process
figures were 3-7x the live server's (two OpenMP threads spinning against a dozen other processes
on the caller's thread vs the server's engine thread), so a simulator validated against the live
server must be calibrated where the live server runs. Links come from the local copy/disk probes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from typing import Self

import httpx

from hintkv.sim.calibrate import QUICK, local_links
from hintkv.sim.profile import Profile


class _Client:
    def __init__(self, http: httpx.AsyncClient, model: str, seed: int, vocab: int) -> None:
        self.http, self.model = http, model
        self.rng = random.Random(seed)
        self.vocab = vocab

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(16, self.vocab) for _ in range(n)]

    async def stream(self, prompt: list[int], max_tokens: int) -> list[float]:
        """Arrival times (perf_counter) of each streamed token chunk, after the send time."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0.0, "stream": True}
        times = [time.perf_counter()]
        async with self.http.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"calibration request failed: HTTP {resp.status_code}: "
                                   f"{(await resp.aread())[:300]!r}")
            async for line in resp.aiter_lines():
                if (line.startswith("data:") and line.strip() != "data: [DONE]"
                        and json.loads(line[5:]).get("choices")):
                    times.append(time.perf_counter())
        return times


async def _prefill_ms(c: _Client, new: int, cached: int) -> float:
    prefix = c.prompt(cached)
    if cached:
        await c.stream(prefix + c.prompt(1), 1)
    t = await c.stream(prefix + c.prompt(new), 1)
    return (t[1] - t[0]) * 1e3


async def _decode_ms(c: _Client, batch: int, context: int, steps: int = 6) -> float:
    runs = await asyncio.gather(*(c.stream(c.prompt(context), steps + 2) for _ in range(batch)))
    start = max(r[1] for r in runs)  # every stream is decoding from here on
    gaps = [b - a for r in runs for a, b in itertools.pairwise(r[1:]) if a >= start]
    return statistics.median(gaps) * 1e3 if gaps else float("nan")


class _KeepWarm:
    """One stream decoding beside the prefill measurements (restarted when it ends), so that
    every measured prefill runs the way a busy swarm's do: batched with a decode row on an
    engine that is awake. Its token gaps are the decode steps the prefills arrived during."""

    def __init__(self, c: _Client, context: int = 64, max_tokens: int = 1024) -> None:
        self.c, self.context, self.max_tokens = c, context, max_tokens
        self.gaps: list[float] = []
        self._task: asyncio.Task | None = None
        self._started = asyncio.Event()

    async def _run(self) -> None:
        while True:
            t = await self.c.stream(self.c.prompt(self.context), self.max_tokens)
            self._started.set()
            self.gaps += [b - a for a, b in itertools.pairwise(t[1:])]

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run())
        first = await self.c.stream(self.c.prompt(self.context), 4)  # the server streams at all
        self.gaps += [b - a for a, b in itertools.pairwise(first[1:])]
        await asyncio.sleep(0.2)  # the keep-warm stream is past its own prefill
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, httpx.HTTPError):
            pass

    @property
    def step_ms(self) -> float:
        return statistics.median(self.gaps) * 1e3 if self.gaps else 0.0


async def _prefill_points(c: _Client, grid: dict, progress) -> list:
    points = []
    for cached in grid["cached"]:
        for new in grid["new"]:
            ms = statistics.median([await _prefill_ms(c, new, cached) for _ in range(grid["repeats"])])
            points.append((new, cached, ms))
            if progress:
                progress(f"prefill new={new} cached={cached}: {ms:.2f} ms")
    return points


async def _measure(base_url: str, model: str, grid: dict, seed: int, vocab: int, progress,
                   keep_warm: bool = True) -> tuple[list, list, float, dict]:
    """Prefill points, decode points, the idle wake-up (ms) and notes. With `keep_warm` the
    prefills run beside a decoding stream; each figure then loses half the stream's step (the
    mean wait for the step in flight, which the simulator's clock models itself), and the
    wake-up is what a lone request on the idle server takes beyond the warm figure."""
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=600.0) as http:
        c = _Client(http, model, seed, vocab)
        await _prefill_ms(c, 64, 0)  # warm-up
        await _decode_ms(c, 1, 64, steps=2)
        notes: dict = {"keep_warm": keep_warm}
        wakeup = 0.0
        if keep_warm:
            async with _KeepWarm(c) as warm:
                raw = await _prefill_points(c, grid, progress)
            half = warm.step_ms / 2
            points = [(n, k, round(max(0.0, ms - half), 4)) for n, k, ms in raw]
            n0 = min(grid["new"])
            idle = statistics.median([await _prefill_ms(c, n0, 0) for _ in range(max(3, grid["repeats"]))])
            warm_n0 = next(ms for n, k, ms in raw if n == n0 and k == 0)
            wakeup = max(0.0, idle - warm_n0)
            notes.update({"keep_warm_step_ms": round(warm.step_ms, 4), "idle_prefill_ms": round(idle, 4),
                          "warm_prefill_ms": round(warm_n0, 4), "raw_prefill_points": raw})
            if progress:
                progress(f"idle lone {n0}-token prefill {idle:.2f} ms vs {warm_n0:.2f} ms beside a decode "
                         f"stream (step {warm.step_ms:.2f} ms): wake-up {wakeup:.2f} ms")
        else:
            points = [(n, k, round(ms, 4)) for n, k, ms in await _prefill_points(c, grid, progress)]
        decode = []
        for batch in grid["batch"]:
            for context in grid["context"]:
                ms = statistics.median([await _decode_ms(c, batch, context) for _ in range(grid["repeats"])])
                decode.append((batch, context, round(ms, 4)))
                if progress:
                    progress(f"decode batch={batch} context={context}: {ms:.2f} ms")
        return points, decode, wakeup, notes


def calibrate_server(base_url: str, model: str, kv_bytes_per_token: int, grid: dict | None = None,
                     seed: int = 0, vocab: int = 49152, progress=None, name: str = "local",
                     keep_warm: bool = True) -> Profile:
    """`grid`: as `sim.calibrate` (new, cached, batch, context, repeats); default its QUICK grid.
    The server's device cache must hold the largest cached prefix plus a decode batch (and, with
    `keep_warm`, the keep-warm stream's 1,088 tokens)."""
    grid = grid or QUICK
    points, decode, wakeup, notes = asyncio.run(_measure(base_url, model, grid, seed, vocab, progress,
                                                         keep_warm))
    return Profile(name, f"measured through the server at {base_url} ({model}): time to first token "
                   f"{'beside a decoding stream' if keep_warm else 'of lone requests'} and streamed "
                   "token gaps", kv_bytes_per_token, points, decode, local_links(),
                   copy_overlap=0.0, step_overhead_ms=0.0, device_kv_tokens=2**30 // kv_bytes_per_token,
                   idle_wakeup_ms=round(wakeup, 4),
                   extra={"model": model, "server": base_url, **notes,
                          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
