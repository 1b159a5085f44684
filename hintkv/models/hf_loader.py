"""Load a Hugging Face checkpoint directory: config.json, *.safetensors (sharded or not), tokenizer.

Chat template from `chat_template.jinja` or `tokenizer_config.json` ("chat_template", a string or
a list of named templates: "default" wins); EOS ids from config.json, generation_config.json and
the tokenizer's eos_token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import tokenizers

from hintkv.models.config import ModelConfig
from hintkv.models.tokenizer import Tokenizer


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_text(tok: Any) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


def safetensors_files(ckpt: Path) -> list[Path]:
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        return [ckpt / f for f in sorted(set(_read_json(index)["weight_map"].values()))]
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {ckpt}")
    return files


def hf_state_dict(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in safetensors_files(ckpt):
        sd.update(load_file(str(f)))
    return sd


def hf_tokenizer(ckpt: Path, cfg: ModelConfig) -> Tokenizer:
    backend = tokenizers.Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok_cfg = _read_json(ckpt / "tokenizer_config.json")
    template = None
    if (ckpt / "chat_template.jinja").is_file():
        template = (ckpt / "chat_template.jinja").read_text()
    else:
        template = tok_cfg.get("chat_template")
        if isinstance(template, list):
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default") or next(iter(named.values()), None)
    bos, eos = _token_text(tok_cfg.get("bos_token")), _token_text(tok_cfg.get("eos_token"))
    eos_ids = list(cfg.eos_token_ids)
    gen_eos = _read_json(ckpt / "generation_config.json").get("eos_token_id")
    for i in [gen_eos] if isinstance(gen_eos, int) else (gen_eos or []):
        if i not in eos_ids:
            eos_ids.append(i)
    if eos is not None and (i := backend.token_to_id(eos)) is not None and i not in eos_ids:
        eos_ids.append(i)
    return Tokenizer(backend, template, eos_ids, bos_token=bos, eos_token=eos)


def read_hf_checkpoint(ckpt: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    ckpt = Path(ckpt)
    cfg = ModelConfig.from_hf_dict(_read_json(ckpt / "config.json"), name=ckpt.name)
    tok = hf_tokenizer(ckpt, cfg)
    cfg.eos_token_ids = list(tok.eos_token_ids)
    return cfg, hf_state_dict(ckpt), tok
