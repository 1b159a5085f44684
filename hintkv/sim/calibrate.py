"""`hintkv sim calibrate`: measure the `local` profile with the real engine on this machine.

    hintkv sim calibrate [--model dummy:tiny] [--quick] [--cpu-time] [--out ~/.cache/hintkv/sim/local.json]
    hintkv sim calibrate --server http://127.0.0.1:8000 --model dummy:tiny   # sim.calibrate_server

The engine (`LLMEngine`, the same one `hintkv serve` runs) is driven through its public calls
(`add_request`, `step`) with random token-id prompts; each figure is the wall time of the
`step()` that does the work, so scheduling, sampling and Python overhead are inside it, as they
are in a served request:

- prefill (new x cached): a request with the cached prefix runs first; then one whose prompt is
  that prefix plus `new` fresh tokens, measured in one step (the budget is set above `new`);
- decode (batch x context): `batch` requests of `context` tokens are prefilled, then the median of
  a few steps where all of them decode;
- links: device<->host is a torch copy of 64 MiB (the CPU "device" is host memory), host<->disk a
  write + fsync and a read of a 64 MiB file in a temporary directory.

The median of `repeats` runs per point (`--quick`: fewer points, 2 runs; about a minute on 2
cores with dummy:tiny). The result is a `Profile` written as JSON.

`--cpu-time` times each step in this process's CPU time with one torch thread instead of wall
time: on a machine other jobs load, wall figures are not monotone in the work (a 16-token prefill
measured 572 ms vs 262 ms for 128 tokens at load 6) while CPU time is what the engine itself spends.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hintkv.sim.profile import LOCAL_PATH, Link, Profile

FULL = {"new": (16, 128, 512, 2048), "cached": (0, 512, 2048), "batch": (1, 4, 8),
        "context": (256, 2048), "repeats": 3}
QUICK = {"new": (16, 256, 1024), "cached": (0, 1024), "batch": (1, 6), "context": (256, 1536),
         "repeats": 2}
MIB64 = 64 * 2**20


class _Rig:
    """One engine and a source of fresh prompts."""

    def __init__(self, model: str, kv_tokens: int, budget: int, seed: int, cpu_time: bool = False) -> None:
        from contextlib import nullcontext

        from hintkv.config import EngineConfig
        from hintkv.engine.cpu_keeper import keepers_off
        from hintkv.engine.llm_engine import LLMEngine

        with keepers_off() if cpu_time else nullcontext():  # the keepers' spin is process CPU time too
            self.engine = LLMEngine(EngineConfig(model=model, device="cpu", dtype="float32",
                                                 kv_cache_tokens=kv_tokens, max_num_batched_tokens=budget,
                                                 max_num_seqs=64, seed=seed))
        self.rng = random.Random(seed)
        self.vocab = min(self.engine.model_config.vocab_size, 49152)
        self.n = 0
        self.clock = time.process_time if cpu_time else time.perf_counter

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(16, self.vocab) for _ in range(n)]

    def add(self, prompt: list[int], max_tokens: int = 1) -> str:
        from hintkv.engine.types import GenerateRequest, SamplingParams

        self.n += 1
        rid = f"cal-{self.n}"
        self.engine.add_request(GenerateRequest(rid, prompt, SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True)))
        return rid

    def drain(self) -> None:
        while self.engine.has_work():
            self.engine.step()

    def timed_step(self) -> float:
        t0 = self.clock()
        self.engine.step()
        return (self.clock() - t0) * 1e3


def _prefill_ms(rig: _Rig, new: int, cached: int) -> float:
    prefix = rig.prompt(cached)
    if cached:
        rig.add(prefix + rig.prompt(1))
        rig.drain()
    rig.add(prefix + rig.prompt(new))
    ms = rig.timed_step()
    rig.drain()
    return ms


def _decode_ms(rig: _Rig, batch: int, context: int) -> float:
    steps = 4
    for _ in range(batch):
        rig.add(rig.prompt(context), max_tokens=steps + 2)
    eng = rig.engine
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.scheduler.running) \
            or eng.scheduler.waiting:
        eng.step()
    eng.step()  # the first decode step also samples the last prefill's token
    ms = statistics.median(rig.timed_step() for _ in range(steps))
    rig.drain()
    return ms


def _copy_gbps() -> float:
    import torch

    src = torch.empty(MIB64, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        t.append(time.perf_counter() - t0)
    return MIB64 / statistics.median(t) / 1e9


def _disk_gbps() -> tuple[float, float]:
    data = os.urandom(MIB64)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "probe"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        w = time.perf_counter() - t0
        t0 = time.perf_counter()
        path.read_bytes()
        r = time.perf_counter() - t0
    return MIB64 / w / 1e9, MIB64 / r / 1e9


def local_links() -> dict[str, Link]:
    """This machine's links: a torch copy (the CPU "device" is host memory), disk, Mooncake TCP."""
    copy = _copy_gbps()
    write, read = _disk_gbps()
    return {"device->host": Link(copy, 0.0), "host->device": Link(copy, 0.0),
            "host->disk": Link(write, 0.05), "disk->host": Link(read, 0.05),
            "host->pool": Link(0.35, 0.2), "pool->host": Link(0.45, 0.2)}  # NOTES.md: Mooncake TCP


def calibrate(model: str = "dummy:tiny", quick: bool = False, seed: int = 0,
              progress=None, grid: dict | None = None, cpu_time: bool = False) -> Profile:
    """`grid`: the points to measure (keys of `FULL`); default `FULL` or `QUICK`. `cpu_time`: steps
    timed in process CPU time on one torch thread (the previous thread count comes back after)."""
    import torch

    threads = torch.get_num_threads()
    if cpu_time:
        torch.set_num_threads(1)
    try:
        return _calibrate(model, quick, seed, progress, grid or (QUICK if quick else FULL), cpu_time)
    finally:
        torch.set_num_threads(threads)


def _calibrate(model: str, quick: bool, seed: int, progress, grid: dict, cpu_time: bool) -> Profile:
    max_new = max(grid["new"])
    kv_tokens = 4 * (max(grid["cached"]) + max_new + max(grid["batch"]) * (max(grid["context"]) + 16))
    rig = _Rig(model, kv_tokens, max(max_new, max(grid["batch"]) * max(grid["context"])), seed, cpu_time)
    _prefill_ms(rig, 64, 0)  # warm-up: first calls pay for allocation and kernel selection
    _decode_ms(rig, 1, 64)
    points = []
    for cached in grid["cached"]:
        for new in grid["new"]:
            ms = statistics.median(_prefill_ms(rig, new, cached) for _ in range(grid["repeats"]))
            points.append((new, cached, round(ms, 4)))
            if progress:
                progress(f"prefill new={new} cached={cached}: {ms:.2f} ms")
    decode = []
    for batch in grid["batch"]:
        for context in grid["context"]:
            ms = statistics.median(_decode_ms(rig, batch, context) for _ in range(grid["repeats"]))
            decode.append((batch, context, round(ms, 4)))
            if progress:
                progress(f"decode batch={batch} context={context}: {ms:.2f} ms")
    from hintkv.engine.model_runner import kv_bytes_per_block

    eng = rig.engine
    kv_per_token = kv_bytes_per_block(eng.model_config, 1, eng.dtype)
    links = local_links()
    timing = "process CPU time, 1 torch thread" if cpu_time else f"wall time, {os.cpu_count()} cpus"
    return Profile("local", f"measured by `hintkv sim calibrate` ({model}, cpu, float32, "
                   f"{timing}, {'quick' if quick else 'full'} grid)", kv_per_token,
                   points, decode, links, copy_overlap=0.0, step_overhead_ms=0.0,
                   device_kv_tokens=2**30 // kv_per_token,  # the engine's CPU default: 1 GiB of KV
                   extra={"model": model, "timing": "cpu" if cpu_time else "wall",
                          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hintkv sim calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="dummy:tiny")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cpu-time", action="store_true", help="time steps in process CPU time on one torch "
                   "thread (a loaded machine's wall clock is not the engine's cost)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=LOCAL_PATH)
    p.add_argument("--server", default=None, help="measure through this running server's HTTP API "
                   "(sim.calibrate_server) instead of an in-process engine")
    args = p.parse_args(argv)
    say = lambda m: print(f"[calibrate] {m}", file=sys.stderr, flush=True)
    if args.server and args.cpu_time:
        print("hintkv sim calibrate: --cpu-time measures an in-process engine, not a --server",
              file=sys.stderr)
        return 2
    if args.server:
        from hintkv.engine.model_runner import kv_bytes_per_block
        from hintkv.models.presets import PRESETS
        from hintkv.sim.calibrate_server import calibrate_server

        preset = args.model.removeprefix("dummy:")  # the server's name for it: dummy:<preset>
        if preset not in PRESETS:
            print(f"hintkv sim calibrate: --server needs a preset --model (dummy:<one of {sorted(PRESETS)}>)",
                  file=sys.stderr)
            return 2
        import torch

        kv = kv_bytes_per_block(PRESETS[preset], 1, torch.float32)
        prof = calibrate_server(args.server, args.model, kv, QUICK if args.quick else FULL, args.seed, progress=say)
    else:
        prof = calibrate(args.model, args.quick, args.seed, progress=say, cpu_time=args.cpu_time)
    prof.save(args.out)
    print(f"wrote profile 'local' to {args.out}")
    return 0
