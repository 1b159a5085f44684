"""vLLM's CPU build as the peer server that `hintkv bench engine` measures against.

vLLM runs from its own virtual environment (`scripts/setup_vllm_cpu.sh` builds `.venv-vllm`
next to the repository; `HINTKV_VLLM_PYTHON` points elsewhere), with dummy (random) weights of
the same shape as the hintkv model: `write_model_dir` writes a Hugging Face `config.json` and
vLLM starts with `--load-format dummy --skip-tokenizer-init`, so no hub access is needed and the
prompts are token ids. Prefix caching is on; on CPU its block size is 128 tokens.

    spec = vllm_server(write_model_dir(hf_config, tmpdir), "smollm2", dtype="bfloat16")
    with ServerProcess(spec) as srv: ...
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hintkv.bench.common import ServerSpec
from hintkv.openmp_env import peer_environ

VLLM_PREFIX_BLOCK_TOKENS = 128  # vLLM CPU's prefix-cache block size
DEFAULT_STARTUP_TIMEOUT_S = 900.0  # ~30 s with a warm compile cache; a first start compiles for minutes


def vllm_python() -> Path | None:
    """The interpreter of the vLLM CPU virtual environment, or None when it is not built."""
    env = os.environ.get("HINTKV_VLLM_PYTHON")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


def kv_bytes_per_token(hf_config: Mapping[str, Any], dtype_bytes: int = 2) -> int:
    """K and V of every layer for one token."""
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    kv_heads = hf_config.get("num_key_value_heads") or heads
    return 2 * hf_config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


def write_model_dir(hf_config: Mapping[str, Any], directory: str | os.PathLike[str], min_positions: int = 0) -> Path:
    """Write `config.json` (llama family) for a dummy-weight vLLM model; returns the directory.

    `max_position_embeddings` is raised to `min_positions` when smaller, so vLLM accepts a
    max-model-len of prompt + output tokens; plain RoPE is unchanged by that number.
    """
    config = dict(hf_config)
    config["max_position_embeddings"] = max(int(config.get("max_position_embeddings", 0)), min_positions)
    config.setdefault("architectures", ["LlamaForCausalLM"])
    config.setdefault("model_type", "llama")
    config.setdefault("hidden_act", "silu")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def vllm_server(
    model_dir: str | os.PathLike[str],
    served_name: str,
    *,
    dtype: str = "bfloat16",
    max_model_len: int = 8192 + 256,
    kv_cache_gib: float = 2.0,
    max_num_batched_tokens: int | None = None,
    omp_threads_bind: str | None = None,
    python: str | os.PathLike[str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> ServerSpec:
    """How to start vLLM's OpenAI server on dummy weights of `model_dir`'s config."""
    py = python or vllm_python()
    if py is None:
        raise FileNotFoundError("vLLM CPU venv not found: run scripts/setup_vllm_cpu.sh (or set HINTKV_VLLM_PYTHON)")
    argv = [
        str(py), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--load-format", "dummy",
        "--skip-tokenizer-init",
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--enable-prefix-caching",
        "--generation-config", "vllm",  # no generation_config.json lookups
        "--host", "127.0.0.1",
        "--port", "{port}",
    ]
    if max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    argv += list(extra_args)
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": omp_threads_bind or f"0-{max(0, (os.cpu_count() or 1) - 1)}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        # vLLM takes whole GiB here
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(kv_cache_gib))),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        # hintkv's own OpenMP wait policy is not passed on, the user's is (openmp_env.peer_environ)
        "GOMP_SPINCOUNT": peer_environ().get("GOMP_SPINCOUNT"),
    }
    return ServerSpec(name=f"vllm-{served_name}", argv=argv, env=env, startup_timeout_s=DEFAULT_STARTUP_TIMEOUT_S)
