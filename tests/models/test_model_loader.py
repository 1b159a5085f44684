"""load_model specs (dummy presets, HF dirs incl. sharded), config parsing and validation."""

from __future__ import annotations

import pytest
import torch
from model_steps import ModelSteps, greedy
from tiny_hf_checkpoints import write_hf_checkpoint

from hintkv.models.config import ModelConfig
from hintkv.models.llama import LlamaForCausalLM
from hintkv.models.loader import load_model
from hintkv.models.presets import (
    PRESETS,
    fill_tiled_normal_,
    init_random_,
    preset_config,
    preset_hf_config,
)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_hf_config_round_trips(name):
    cfg = ModelConfig.from_hf_dict(preset_hf_config(name), name=preset_config(name).name)
    assert cfg == preset_config(name)


def test_llama3_preset_shape():
    cfg = preset_config("llama3-8b")
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (128256, 4096, 32, 8)
    assert cfg.rope_type == "llama3" and cfg.rope_theta == 500000.0 and not cfg.tie_word_embeddings


def _small_config() -> ModelConfig:
    return ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True)


def test_init_random_is_seeded():
    models = [LlamaForCausalLM(_small_config()) for _ in range(3)]
    for m, seed in zip(models, (0, 0, 1)):
        init_random_(m, seed)
    a, b, c = (m.layers[1].mlp.down_proj.weight for m in models)
    assert torch.equal(a, b) and not torch.equal(a, c)
    w = models[0].embed_tokens
    assert 0.015 < float(w.std()) < 0.025
    assert float(models[0].norm.weight.min()) == 1.0
    assert float(models[0].layers[0].self_attn.qkv_proj.bias.abs().max()) == 0.0


def test_tiled_fill_is_seeded_normal_and_rows_differ():
    """The fast fill of 8B-sized matrices: same seed same values, N(0, std), no repeated rows."""
    shape, small_base = (512, 1024), 1 << 12  # a base far smaller than the matrix, as in an 8B preset
    a, b, c = torch.empty(shape), torch.empty(shape), torch.empty(shape, dtype=torch.bfloat16)
    for t, seed in ((a, 0), (b, 0), (c, 1)):
        fill_tiled_normal_(t, torch.Generator().manual_seed(seed), 0.02, small_base)
    assert torch.equal(a, b) and not torch.equal(a.bfloat16(), c)
    assert abs(float(a.mean())) < 2e-3 and 0.018 < float(a.std()) < 0.022
    assert len({tuple(r.tolist()) for r in a[:, :16]}) == shape[0]


def test_dummy_tiny_runs_in_both_dtypes():
    f32 = load_model("dummy:tiny", torch.float32, "cpu", seed=0)
    bf16 = load_model("dummy:tiny", torch.bfloat16, "cpu", seed=0)
    assert f32.config.num_hidden_layers == 8 and f32.tokenizer.encode("<|im_start|>") == [1]
    # weights are drawn in float32 on the CPU, so the bf16 model is the rounded float32 one
    torch.testing.assert_close(bf16.model.embed_tokens.float(), f32.model.embed_tokens, atol=1e-3, rtol=1e-2)
    for dtype in ("float32", "bfloat16"):
        out = greedy("dummy:tiny", [1, 2, 3, 4], 3, dtype=dtype)
        assert len(out) == 3 and all(0 <= t < f32.config.vocab_size for t in out)


def test_sharded_checkpoint_matches_single_file(tmp_path):
    write_hf_checkpoint(tmp_path / "one", "qwen2")
    write_hf_checkpoint(tmp_path / "many", "qwen2", shard=True)
    assert (tmp_path / "many" / "model.safetensors.index.json").is_file()
    one, many = load_model(str(tmp_path / "one")), load_model(str(tmp_path / "many"))
    assert one.config.attention_bias and one.tokenizer.eos_token_ids == [2]
    assert one.tokenizer.apply_chat_template([{"role": "user", "content": "w5"}]).endswith("<|im_start|>assistant\n")
    logits = [ModelSteps(lm, 8, 4).last_logits([("s", [3, 4, 5, 6, 7])]) for lm in (one, many)]
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
    with pytest.raises(ValueError, match="no preset 'nope'; known: .*tiny"):  # a bad value, as any other spec
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
