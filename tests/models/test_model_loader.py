"""load_model specs (dummy presets, HF dirs incl. sharded), config parsing and validation."""

from __future__ import annotations

import pytest
import torch

from conftest import write_hf_checkpoint
from hintkv.models.config import ModelConfig
from hintkv.models.llama import LlamaForCausalLM
from hintkv.models.loader import load_model
from hintkv.models.presets import PRESETS, preset_config, preset_hf_config
from hintkv.models.simple_generate import SimpleKVCache, greedy_generate, run_step


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_hf_config_round_trips(name):
    cfg = ModelConfig.from_hf_dict(preset_hf_config(name), name=preset_config(name).name)
    assert cfg == preset_config(name)


def test_llama3_preset_shape():
    cfg = preset_config("llama3-8b")
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (128256, 4096, 32, 8)
    assert cfg.rope_type == "llama3" and cfg.rope_theta == 500000.0 and not cfg.tie_word_embeddings


def test_dummy_is_seeded_and_runs_in_both_dtypes():
    a, b, c = (load_model("dummy:tiny", torch.float32, "cpu", seed=s) for s in (0, 0, 1))
    assert torch.equal(a.model.layers[3].mlp.down_proj.weight, b.model.layers[3].mlp.down_proj.weight)
    assert not torch.equal(a.model.layers[3].mlp.down_proj.weight, c.model.layers[3].mlp.down_proj.weight)
    w = a.model.layers[0].self_attn.qkv_proj.weight
    assert 0.015 < float(w.std()) < 0.025 and float(a.model.norm.weight.min()) == 1.0
    assert a.tokenizer.encode("<|im_start|>") == [1]
    bf = load_model("dummy:tiny", torch.bfloat16, "cpu", seed=0)
    torch.testing.assert_close(bf.model.embed_tokens.float(), a.model.embed_tokens, atol=1e-3, rtol=1e-2)
    for lm, dtype in ((a, torch.float32), (bf, torch.bfloat16)):
        out = greedy_generate(lm.model, SimpleKVCache(lm.config, 8, 16, dtype=dtype), [1, 2, 3, 4], 5)
        assert len(out) == 5 and all(0 <= t < lm.config.vocab_size for t in out)


def test_sharded_checkpoint_matches_single_file(tmp_path):
    write_hf_checkpoint(tmp_path / "one", "qwen2")
    write_hf_checkpoint(tmp_path / "many", "qwen2", shard=True)
    assert (tmp_path / "many" / "model.safetensors.index.json").is_file()
    one, many = load_model(str(tmp_path / "one")), load_model(str(tmp_path / "many"))
    assert one.config.attention_bias and one.tokenizer.eos_token_ids == [2]
    assert one.tokenizer.apply_chat_template([{"role": "user", "content": "w5"}]).endswith("<|im_start|>assistant\n")
    logits = [run_step(lm.model, SimpleKVCache(lm.config, 8, 4), [("s", [3, 4, 5, 6, 7])]) for lm in (one, many)]
    assert torch.equal(logits[0], logits[1])


def test_missing_or_misshapen_weights_are_rejected():
    cfg = ModelConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    model = LlamaForCausalLM(cfg)
    with pytest.raises(KeyError, match="lacks"):
        model.load_state_dict_hf({"model.embed_tokens.weight": torch.zeros(16, 8)})
    with pytest.raises(ValueError, match="shape"):
        model.load_state_dict_hf({"model.embed_tokens.weight": torch.zeros(16, 9)})


def test_unknown_spec_is_rejected(tmp_path):
    with pytest.raises(ValueError):
        load_model(str(tmp_path / "nowhere"))
    with pytest.raises(KeyError):
        load_model("dummy:nope")


def test_config_parsing_and_validation():
    base = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    cfg = ModelConfig.from_hf_dict(dict(base, model_type="llama", rope_scaling={"type": "linear", "factor": 2.0},
                                        eos_token_id=[2, 7]))
    assert cfg.head_dim == 16 and cfg.rope_type == "linear" and cfg.eos_token_ids == [2, 7]
    qwen = ModelConfig.from_hf_dict(dict(base, model_type="qwen2", rope_parameters={"rope_theta": 1e6, "rope_type": "default"}))
    assert qwen.attention_bias and qwen.rope_theta == 1e6 and qwen.rope_scaling is None
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf_dict(dict(base, model_type="gpt2"))
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig.from_hf_dict(dict(base, num_key_value_heads=3))
    with pytest.raises(ValueError, match="llama3"):
        ModelConfig.from_hf_dict(dict(base, rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ValueError, match="unsupported rope"):
        ModelConfig.from_hf_dict(dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0}))
