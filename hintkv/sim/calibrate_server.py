"""Measure a profile through a running OpenAI-compatible server (`hintkv sim calibrate --server URL`).

    prof = calibrate_server("http://127.0.0.1:8000", "dummy:tiny", kv_bytes_per_token=16384)

The figures are what a client of that server sees, on the path live requests take (HTTP, the
engine's own thread, its torch threads, whatever else loads the machine at that moment):

- prefill (new x cached): the time to the first streamed token of a `max_tokens=1` request whose
  prompt is a cached prefix (sent just before, so its full blocks are in the device cache) plus
  `new` fresh random token ids; the request's HTTP round trip is inside the figure, as it is
  inside a live TTFT;
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


async def _measure(base_url: str, model: str, grid: dict, seed: int, vocab: int, progress) -> tuple[list, list]:
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=600.0) as http:
        c = _Client(http, model, seed, vocab)
        await _prefill_ms(c, 64, 0)  # warm-up
        await _decode_ms(c, 1, 64, steps=2)
        points = []
        for cached in grid["cached"]:
            for new in grid["new"]:
                ms = statistics.median([await _prefill_ms(c, new, cached) for _ in range(grid["repeats"])])
                points.append((new, cached, round(ms, 4)))
                if progress:
                    progress(f"prefill new={new} cached={cached}: {ms:.2f} ms")
        decode = []
        for batch in grid["batch"]:
            for context in grid["context"]:
                ms = statistics.median([await _decode_ms(c, batch, context) for _ in range(grid["repeats"])])
                decode.append((batch, context, round(ms, 4)))
                if progress:
                    progress(f"decode batch={batch} context={context}: {ms:.2f} ms")
        return points, decode


def calibrate_server(base_url: str, model: str, kv_bytes_per_token: int, grid: dict | None = None,
                     seed: int = 0, vocab: int = 49152, progress=None, name: str = "local") -> Profile:
    """`grid`: as `sim.calibrate` (new, cached, batch, context, repeats); default its QUICK grid.
    The server's device cache must hold the largest cached prefix plus a decode batch."""
    grid = grid or QUICK
    points, decode = asyncio.run(_measure(base_url, model, grid, seed, vocab, progress))
    return Profile(name, f"measured through the server at {base_url} ({model}): time to first token and "
                   "streamed token gaps", kv_bytes_per_token, points, decode, local_links(),
                   copy_overlap=0.0, step_overhead_ms=0.0, device_kv_tokens=2**30 // kv_bytes_per_token,
                   extra={"model": model, "server": base_url,
                          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
