"""rev26 B3 (4206f2a): `DecodeLayers.build` constructs the object (whose __init__ now asks every linear
kernel that is not a float one in `_KIND` for `gemv_depth()` / `levels`) BEFORE it checks that every kernel is its
case (`_kind(...) is None`). A linear on the plain `LinearKernel` ("dense": what `float_kernel_name` picks when
torch has no MKL) is not in `_KIND`, so it counts as int8 and `_rows_a_token` raises AttributeError: model
preparation fails where it used to fall back to the per-op layers (build() returned None)."""

from __future__ import annotations

import dataclasses

import torch

from hintkv.models.decode_layers import DecodeLayers
from hintkv.models.llama import LlamaForCausalLM
from hintkv.models.presets import init_random_, preset_config


def test_a_model_on_dense_kernels_is_not_the_fused_calls_case_and_does_not_raise():
    cfg = dataclasses.replace(preset_config("tiny"), num_hidden_layers=2, vocab_size=2048)
    model = LlamaForCausalLM(cfg)
    init_random_(model, seed=3)
    model.prepare(None, None)
    for layer in model.layers:  # torch without MKL: float_kernel_name() gives "dense"
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            lin.set_kernel("dense")
    assert DecodeLayers.build(model) is None
