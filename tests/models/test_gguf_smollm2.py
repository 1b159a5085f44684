"""The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) loads, answers sensibly, and pages correctly."""

from __future__ import annotations

import pytest
import torch
from model_steps import ModelSteps, greedy

from hintkv.models.loader import load_model


@pytest.fixture(scope="module")
def smollm2():
    return load_model(None, torch.float32, "cpu")


def _prompt(lm, question: str) -> list[int]:
    return lm.tokenizer.encode(lm.tokenizer.apply_chat_template([{"role": "user", "content": question}]))


def test_config_from_gguf_metadata(smollm2):
    cfg = smollm2.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert cfg.rope_theta == 100000.0 and cfg.tie_word_embeddings and cfg.eos_token_ids == [2]
    assert smollm2.name == "SmolLM2-135M-Instruct"


def test_answers_capital_of_france(smollm2):
    """Greedy; fails if llama.cpp's Q/K row permutation were not undone (the model talks nonsense)."""
    out = greedy(None, _prompt(smollm2, "What is the capital of France?"), 12)
    assert "Paris" in smollm2.tokenizer.decode(out)


def test_chunked_prefill_and_batching_agree_with_one_shot(smollm2):
    ids = smollm2.tokenizer.encode("The three primary colors are red, yellow and blue; mixing them gives")
    one_shot = ModelSteps(smollm2, 16, 16).last_logits([("s", ids)])
    cache = ModelSteps(smollm2, 32, 16)
    for i in range(0, len(ids), 6):  # chunks on top of a cached prefix, batched with another sequence
        chunked = cache.last_logits([("s", ids[i:i + 6]), ("other", [5, 6, 7])])
    torch.testing.assert_close(chunked[0], one_shot[0], atol=1e-3, rtol=0)
