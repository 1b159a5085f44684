"""Where vLLM's CPU build beats hintkv, in CPU time: the same figures offline, one thread each.

    python -m hintkv.bench.engine_cputime [--quick] [--no-vllm] [--lengths 128,512,2048] [--batches 1,8]

`hintkv bench engine` compares servers by wall clock, which on a shared 2-core machine swings with
every other job (a 2-thread step collapses when another process takes a core). This probe measures
the work instead: each side runs one OpenMP thread and every figure is the CPU time of the thread
that runs the model (`time.thread_time`, min over repeats), so other jobs cost cache, not the
figure. It shows per-thread efficiency, not parallel scaling nor the HTTP path (read those from
`bench engine`).

hintkv: `LLMEngine` in process (dummy:tiny, float32, eager). vLLM: its `LLM` in process, run by
`cputime_vllm_child.py` under vLLM's interpreter (dummy weights of the same shape, its compiled
graph, oneDNN GEMMs and CPU attention kernel). Figures: prefill of a fresh T-token prompt (one
step, then one sampled token; min over repeats) and one decode step of B sequences at a 128-token
context (the median of every decode step of the repeats, k per run). Then hintkv's own split of those steps by
region (GEMMs, attention, norms, RoPE, SiLU-mul, LM head, sampling, the rest), float32 and w8a8.
Goals (the issue's ratios, in CPU time): prefill and decode >= 1.2x vLLM, w8a8 decode b8 >= 1.5x
float32.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from hintkv.bench.common import emit_json, goal_at_least, log, print_table, ratio
from hintkv.bench.engine_servers import VLLM_MODEL_ROOT, peer_hf_config
from hintkv.bench.vllm_peer import vllm_python, write_model_dir
from hintkv.openmp_env import peer_environ

MODEL = "dummy:tiny"
DECODE_CONTEXT = 128
REGIONS = ("gemm", "attention", "norm", "rope", "silu_mul", "lm_head", "sample")


class Probe:
    """One hintkv engine with its step timed by region (CPU time of this thread)."""

    def __init__(self, quantization: str | None = None, seed: int = 0) -> None:
        from hintkv.config import EngineConfig
        from hintkv.engine.llm_engine import LLMEngine

        self.engine = LLMEngine(EngineConfig(model=MODEL, dtype="float32", kv_cache_tokens=32768, max_model_len=4096,
                                             max_num_batched_tokens=2048, quantization=quantization))
        self.rng = random.Random(seed)
        self.acc: dict[str, float] = defaultdict(float)
        self._n = 0
        model = self.engine.runner.model
        model._decode_layers = None  # the per-op layers: the fused decode call (decode_layers.py) has no regions to time
        regions = model.regions
        regions.add_rmsnorm = self._timed("norm", regions.add_rmsnorm)
        regions.rope = self._timed("rope", regions.rope)
        regions.silu_mul = self._timed("silu_mul", regions.silu_mul)
        model.compute_logits = self._timed("lm_head", model.compute_logits)
        model.greedy_tokens = self._timed("lm_head", model.greedy_tokens)  # greedy steps: argmax without logits
        from hintkv.models.linear import Linear

        for mod in model.modules():
            if isinstance(mod, Linear):
                mod.forward = self._timed("gemm", mod.forward)

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.acc[name] += time.thread_time() - t
        return wrapper

    @contextmanager
    def module_timers(self):
        """Time the functions the model and runner call by module-level name (attention, sampling)."""
        import hintkv.engine.model_runner as runner_mod
        import hintkv.models.llama as llama_mod

        saved = llama_mod.paged_attention, runner_mod.sample
        llama_mod.paged_attention = self._timed("attention", saved[0])
        runner_mod.sample = self._timed("sample", saved[1])
        try:
            yield
        finally:
            llama_mod.paged_attention, runner_mod.sample = saved

    def add(self, tokens: int, max_tokens: int, batch: int) -> None:
        from hintkv.engine.types import GenerateRequest, SamplingParams

        for _ in range(batch):
            self._n += 1
            prompt = [self.rng.randrange(100, 49000) for _ in range(tokens)]
            self.engine.add_request(GenerateRequest(f"p{self._n}", prompt, SamplingParams(
                temperature=0, max_tokens=max_tokens, ignore_eos=True)))

    def run(self, tokens: int, max_tokens: int, batch: int = 1) -> dict[str, float]:
        """CPU time of serving `batch` fresh prompts to `max_tokens` tokens; {region: s, "step": s}."""
        self.add(tokens, max_tokens, batch)
        self.acc.clear()
        t = time.thread_time()
        while self.engine.has_work():
            self.engine.step()
        out = dict(self.acc)
        out["step"] = time.thread_time() - t
        return out


    def decode(self, batch: int, k: int) -> list[dict[str, float]]:
        """Each decode step of `batch` fresh DECODE_CONTEXT-token prompts generating k + 1 tokens
        (the prefill step left out), timed by region."""
        self.add(DECODE_CONTEXT, k + 1, batch)
        self.engine.step()
        steps = []
        while self.engine.has_work():
            self.acc.clear()
            t = time.thread_time()
            self.engine.step()
            steps.append({**self.acc, "step": time.thread_time() - t})
        return steps


def best(runs: list[dict[str, float]]) -> dict[str, float]:
    return min(runs, key=lambda r: r["step"])


def hintkv_figures(lengths: list[int], batches: list[int], reps: int, k: int) -> dict[str, Any]:
    probes = {"float32": Probe(), "w8a8": Probe("w8a8")}
    out: dict[str, Any] = {"prefill_ms": {}, "decode_step_ms": {}, "regions": {}}
    with probes["float32"].module_timers():
        p = probes["float32"]
        for _ in range(2):
            p.run(512, 1)
            p.run(DECODE_CONTEXT, 4, 8)
        for n in lengths:
            r = best([p.run(n, 1) for _ in range(reps)])
            out["prefill_ms"][str(n)] = r["step"] * 1e3
            out["regions"][f"prefill {n}"] = {x: r.get(x, 0.0) * 1e3 for x in ("step", *REGIONS)}
    for name, p in probes.items():
        with p.module_timers():
            for b in batches if name == "float32" else [max(batches)]:
                p.decode(b, 4)
                steps = sorted((s for _ in range(reps) for s in p.decode(b, k)), key=lambda s: s["step"])
                mid = steps[len(steps) // 2]  # the median step, by its total
                key = str(b) if name == "float32" else f"{b} w8a8"
                out["decode_step_ms"][key] = mid["step"] * 1e3
                out["regions"][f"decode b{b} {name}"] = {x: mid.get(x, 0.0) * 1e3 for x in ("step", *REGIONS)}
    return out


def vllm_figures(lengths: list[int], batches: list[int], reps: int, k: int) -> dict[str, Any] | None:
    py = vllm_python()
    if py is None:
        log("no vLLM venv (scripts/setup_vllm_cpu.sh): hintkv only")
        return None
    model_dir = write_model_dir(peer_hf_config(MODEL), VLLM_MODEL_ROOT / MODEL.replace(":", "_"), min_positions=4096)
    spec = {"model_dir": str(model_dir), "lengths": lengths, "batches": batches, "repeats": reps, "decode_tokens": k}
    env = {**peer_environ(), "OMP_NUM_THREADS": "1"}  # the user's wait policy, not hintkv's
    child = Path(__file__).with_name("cputime_vllm_child.py")
    log("vLLM: starting in process (compiles its graph first, 1-3 min)")
    proc = subprocess.run([str(py), str(child), json.dumps(spec)], check=False, capture_output=True,
                          text=True, env=env,
                          timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        log(f"vLLM child failed (rc {proc.returncode}): {proc.stderr[-1500:]}")
        return None
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hintkv.bench.engine_cputime", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats, 16 decode tokens")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    reps, k = (3, 16) if args.quick else (5, 32)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ours = hintkv_figures(lengths, batches, reps, k)
    peer = None if args.no_vllm else vllm_figures(lengths, batches, reps, k)
    rows = []
    for kind, keys in (("prefill_ms", [str(n) for n in lengths]), ("decode_step_ms", [str(b) for b in batches])):
        for key in keys:
            h = ours[kind][key]
            v = peer[kind].get(key) if peer else None
            label = f"prefill {key}" if kind == "prefill_ms" else f"decode step b{key}"
            rows.append({"figure": label, "hintkv cpu ms": h, "vllm cpu ms": v,
                         "hintkv speed / vllm": ratio(v, h)})
    print_table(rows, ["figure", "hintkv cpu ms", "vllm cpu ms", "hintkv speed / vllm"])
    print("\nhintkv's CPU time by region (ms per step; one thread):")
    print_table([{"what": name, "total": r["step"], **{x: r[x] for x in REGIONS}} for name, r in ours["regions"].items()],
                ["what", "total", *REGIONS])
    pre = [r["hintkv speed / vllm"] for r in rows if r["figure"].startswith("prefill") and r["vllm cpu ms"]]
    dec = [r["hintkv speed / vllm"] for r in rows if r["figure"].startswith("decode") and r["vllm cpu ms"]]
    b = max(batches)
    w8 = ratio(ours["decode_step_ms"][str(b)], ours["decode_step_ms"][f"{b} w8a8"])
    emit_json({
        "bench": "engine_cputime", "model": MODEL, "threads": 1, "quick": args.quick,
        "elapsed_s": round(time.perf_counter() - t0, 1), "hintkv": ours, "vllm": peer,
        "goals": {
            "prefill_cpu_vs_vllm": goal_at_least(1.2, min(pre) if pre else None),
            "decode_cpu_vs_vllm": goal_at_least(1.2, min(dec) if dec else None),
            f"w8a8_decode_b{b}_cpu_vs_float32": goal_at_least(1.5, w8),
        },
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
