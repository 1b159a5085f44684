"""Tiny random Hugging Face checkpoints written to disk by transformers (model-test helpers).

The reference model is transformers' own LlamaForCausalLM / Qwen2ForCausalLM on the same weights,
so every logit comparison checks our code against an independent implementation.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

VARIANTS = {
    "llama": dict(model_type="llama"),
    "llama-tied": dict(model_type="llama", tie_word_embeddings=True),
    "llama3-rope": dict(model_type="llama", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "linear-rope": dict(model_type="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "qwen2": dict(model_type="qwen2"),
}


def _hf_model(variant: str, seed: int = 0) -> torch.nn.Module:
    import transformers

    opts = dict(VARIANTS[variant])
    model_type = opts.pop("model_type")
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6, attn_implementation="eager")
    rope_scaling = opts.pop("rope_scaling", None)
    if model_type == "qwen2":
        cfg = transformers.Qwen2Config(**common, rope_theta=1000.0, **opts)
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.LlamaConfig(**common, rope_theta=1000.0, **opts)
        cls = transformers.LlamaForCausalLM
    if rope_scaling is not None:
        cfg.rope_parameters = dict(rope_scaling, rope_theta=1000.0)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # make norms and biases non-trivial so a mix-up cannot hide
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return model


def write_hf_checkpoint(directory: Path, variant: str, shard: bool = False) -> torch.nn.Module:
    """Save a tiny random model (+ a word-level tokenizer and chat template); return the HF model."""
    model = _hf_model(variant)
    model.save_pretrained(directory, max_shard_size="40KB" if shard else "1GB")
    vocab = {f"w{i}": i for i in range(128)}
    vocab.update({"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2})
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}))
    return model
