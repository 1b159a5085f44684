"""The servers `hintkv bench engine` compares: hintkv, its variants, and vLLM's CPU build.

hintkv runs as `python -m hintkv serve`; a variant is hintkv started again with extra flags
(`VARIANTS`); vLLM runs from its own venv on dummy weights of the same shape (`vllm_peer.py`), with
prefix caching on. All get the same dtype, max-model-len, chunked-prefill budget, about the same
KV capacity and the same number of OpenMP threads (`server_threads`: vLLM binds one per core of
`VLLM_CPU_OMP_THREADS_BIND` and sets OMP_NUM_THREADS itself, whatever the caller's environment says;
hintkv would inherit the caller's OMP_NUM_THREADS, e.g. 1 under this project's `OMP_NUM_THREADS=1`
convention, and run the comparison with half of vLLM's threads). `start_all` starts them one after
another (a start never overlaps a measurement) and keeps them up together, so `engine_measure` can
interleave their samples.
"""

from __future__ import annotations

import argparse
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hintkv.bench.common import ServerProcess, ServerSpec, hintkv_server, log
from hintkv.bench.engine_measure import Workload
from hintkv.bench.vllm_peer import kv_bytes_per_token, vllm_server, write_model_dir

VLLM_MODEL_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hintkv" / "vllm-dummy-models"
# Our model names -> hintkv.models.presets shape that vLLM gets as dummy weights.
PEER_PRESETS = {"SmolLM2-135M-Instruct": "smollm2-135m"}
# hintkv variants measured against plain hintkv: name -> extra serve flags
VARIANTS = {"w8a8": ["--quantization", "w8a8"], "compiled": ["--compile-step", "on"],
            "eager": ["--enforce-eager"], "no-graphs": ["--cuda-graphs", "off"],
            "no-compile": ["--compile-step", "off"],  # on CUDA: decode graphs of the eager regions
            "kv-int8": ["--kv-cache-dtype", "int8"],
            "kv-fp8": ["--kv-cache-dtype", "fp8"],
            "bound": ["--cpu-omp-threads-bind", "auto"],  # OpenMP threads pinned as vLLM pins its own
            "asyncio": ["--loop", "asyncio", "--http", "h11"],  # plain runs uvloop + httptools where installed
            "team": [], "team-auto": [], "regions": [], "keeper": [],
            "no-keeper": [], "linger": [],  # set by their environment (VARIANT_ENV)
            "w8a8-no-keeper": ["--quantization", "w8a8"]}  # and HINTKV_CPU_KEEPER=0 (VARIANT_ENV)
# variants that differ from plain hintkv by their environment: HINTKV_DECODE_TEAM (models/decode_layers.py: 1 one
# region a decode step, 0 a region per kernel, auto, the default: chosen step by step, models/team_choice.py;
# `team-auto` is the default made explicit), HINTKV_CPU_KEEPER (engine/cpu_keeper.py: idle-priority spinners keep the
# CPUs out of idle while a step runs: `keeper` 1 always, auto the default, `no-keeper` 0; `linger` keeps them spinning
# 1 s after the last step, as vLLM's worker polls 1 s after a request, on CPUs nothing else wants; `w8a8-no-keeper`
# is w8a8 with 0: its ratio over `no-keeper`'s is w8a8's batch ratio without keepers, which served at b8 read below
# the keepers' at load 4.4-5.4 (history/engine.md, "Twenty-eighth session, eng28")). In a run with such a
# variant every other hintkv server runs without the variables the run's variants set (removed: the defaults),
# whatever the caller exported; otherwise they keep the caller's setting.
VARIANT_ENV = {"team": {"HINTKV_DECODE_TEAM": "1"}, "team-auto": {"HINTKV_DECODE_TEAM": "auto"},
               "regions": {"HINTKV_DECODE_TEAM": "0"}, "keeper": {"HINTKV_CPU_KEEPER": "1"},
               "no-keeper": {"HINTKV_CPU_KEEPER": "0"}, "linger": {"HINTKV_CPU_KEEPER_LINGER_MS": "1000"},
               "w8a8-no-keeper": {"HINTKV_CPU_KEEPER": "0"}}
TEAM_VARIANTS = [v for v, env in VARIANT_ENV.items() if "HINTKV_DECODE_TEAM" in env]  # float32 / w8a8 on CPU only
KEEPER_VARIANTS = [v for v, env in VARIANT_ENV.items()  # CPU engines only
                   if any(name.startswith("HINTKV_CPU_KEEPER") for name in env)]

SWITCHES = sorted({name for env in VARIANT_ENV.values() for name in env})


def server_switches(spec: ServerSpec) -> dict[str, str | None]:
    """The variant switches (`SWITCHES`) a hintkv server gets, as it gets them (None: unset, the default), for its
    figures: a run where the caller exported HINTKV_DECODE_TEAM=1 without a team variant (every server then runs the
    team) must not read like a default run (review_engine20 finding 3, review_eng21 finding 5)."""
    env = spec.environ()
    return {name: env.get(name) for name in SWITCHES}


def peer_hf_config(model: str) -> dict[str, Any]:
    """The Hugging Face config of `model`'s shape, for vLLM's dummy weights."""
    from hintkv.models.presets import preset_hf_config

    preset = model.split(":", 1)[1] if model.startswith("dummy:") else PEER_PRESETS.get(model)
    if preset is None:
        raise ValueError(f"no dummy shape known for {model!r}; known: dummy:<preset>, {sorted(PEER_PRESETS)}")
    return preset_hf_config(preset)


def server_threads() -> int:
    """OpenMP threads of every server in the comparison: one per CPU, as vLLM's binding uses."""
    return os.cpu_count() or 1


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
                         env={"OMP_NUM_THREADS": str(server_threads()), **_variant_env(args, variant)},
                         startup_timeout_s=600.0 if variant == "compiled" else 180.0)


def _variant_env(args: argparse.Namespace, variant: str | None) -> dict[str, str | None]:
    asked = str(getattr(args, "variants", "") or "").split(",")
    env: dict[str, str | None] = {name: None for v in asked for name in VARIANT_ENV.get(v, {})}
    return {**env, **VARIANT_ENV.get(variant or "", {})}


def vllm_spec(model: str, args: argparse.Namespace, w: Workload) -> ServerSpec:
    config = peer_hf_config(model)
    # a fixed directory: vLLM keys its compile cache on the model path, and compiling takes minutes
    model_dir = write_model_dir(config, VLLM_MODEL_ROOT / model.replace(":", "_"), min_positions=w.max_model_len)
    kv_gib = w.kv_cache_tokens * kv_bytes_per_token(config, 4 if args.dtype == "float32" else 2) / 2**30
    return vllm_server(
        model_dir, model, dtype=args.dtype, max_model_len=w.max_model_len, kv_cache_gib=kv_gib,
        max_num_batched_tokens=w.max_num_batched_tokens,
    )


def start_all(stack: ExitStack, specs: dict[str, ServerSpec]) -> tuple[dict[str, ServerProcess], dict[str, str]]:
    """Start each server in turn and keep it up (stopped when `stack` closes); ({name: process},
    {name: error}) for the ones that failed to start."""
    up: dict[str, ServerProcess] = {}
    errors: dict[str, str] = {}
    for name, spec in specs.items():
        try:
            up[name] = stack.enter_context(ServerProcess(spec))
        except Exception as exc:  # noqa: BLE001 - a benchmark reports a broken server and goes on
            log(f"{name} failed: {exc}")
            errors[name] = f"{type(exc).__name__}: {str(exc)[:2000]}"
    return up, errors
