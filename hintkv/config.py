"""Typed engine configuration, validated at the edge (CLI flags and library callers alike)."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_MODEL = "SmolLM2-135M-Instruct"

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """'2GiB', '512MB', '1.5g' or a plain integer -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse a size from {text!r} (try '2GiB' or '512MB')")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None  # None: the real default model (SmolLM2-135M-Instruct GGUF)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    block_size: int = 16
    kv_cache_tokens: int | None = None  # device KV capacity in tokens...
    kv_cache_memory: str | None = None  # ...or in bytes ("2GiB"); default 1GiB on CPU
    max_model_len: int | None = None  # default: min(model's max positions, 32768)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # per-step token budget (chunked prefill)
    eviction_policy: str = "sam"
    seed: int = 0
    served_model_name: str | None = None
    host_cache_memory: str | None = None  # host tier size ("4GiB"); None: no host tier
    disk_cache_dir: str | None = None  # disk tier directory; None: no disk tier
    disk_cache_size: str | None = None  # disk tier size ("20GiB")
    disk_cache_reuse: bool = False  # adopt valid block files already in disk_cache_dir (else wipe)
    hints: bool = True  # False: ignore Agent Hints (session identity and edits) entirely
    protect_budget: float = 0.5  # fraction of the device pool that TTL protection may cover

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, not {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a positive power of two")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must hold at least one block")
        if self.kv_cache_memory is not None:
            parse_bytes(self.kv_cache_memory)
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if not 0 <= self.protect_budget <= 1:
            raise ValueError("protect_budget must be in [0, 1]")
        if (self.disk_cache_dir is None) != (self.disk_cache_size is None):
            raise ValueError("--disk-cache-dir and --disk-cache-size go together")
        for size in (self.host_cache_memory, self.disk_cache_size):
            if size is not None:
                parse_bytes(size)
