"""Quantised KV rows (kv_quant.py): the round trip stays within the format's step, attention over
an int8 / fp8 cache stays close to exact attention on every path (cold, cached prefix, batched
short queries), and the real SmolLM2 over a quantised cache keeps its stated accuracy."""

from __future__ import annotations

import pytest
import torch
from paged_case import PagedCase

from hintkv.bench.accuracy import compare, fixed_token_lists, greedy
from hintkv.models.kv_quant import cache_row, dequantise, is_quantised, quantise
from hintkv.models.loader import load_model

DTYPES = {"int8": torch.int8, "fp8": torch.uint8}


@pytest.mark.parametrize("name", DTYPES)
def test_round_trip_error_is_within_one_step_of_the_row_scale(name):
    x = torch.randn(50, 3, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 50)[:, None, None]
    packed = quantise(x, DTYPES[name])
    assert packed.shape == (50, 3, 68) and packed.dtype == DTYPES[name] and is_quantised(packed)
    back = dequantise(packed, torch.float32)
    amax = x.abs().amax(-1, keepdim=True)
    # int8: half a step of amax/127; fp8 e4m3: 3 mantissa bits, relative 2^-4 of the value (plus subnormals)
    bound = amax / 254 if name == "int8" else x.abs() / 16 + amax / 448 * 2 ** -9
    assert bool(((back - x).abs() <= bound * 1.001 + 1e-12).all())
    assert bool((dequantise(quantise(torch.zeros(2, 1, 8), DTYPES[name]), torch.float32) == 0).all())


def test_cache_row_names_the_storage():
    assert cache_row(64, torch.bfloat16, "auto") == (64, torch.bfloat16)
    assert cache_row(64, torch.float32, "int8") == (68, torch.int8)
    assert cache_row(64, torch.float32, "fp8") == (68, torch.uint8)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        cache_row(64, torch.float32, "int4")


@pytest.mark.parametrize("name,atol", [("int8", 0.03), ("fp8", 0.12)])
@pytest.mark.parametrize("steps", [[(12, 12), (5, 5)], [(7, 19), (1, 4)], [(1, 30), (1, 3)], [(5, 23), (2, 6), (1, 11)]])
def test_attention_over_a_quantised_cache_is_close_to_exact(name, atol, steps):
    case = PagedCase.build(steps, seed=1, d=16)
    float_cache = torch.zeros(2, case.nblocks, 4, 2, 16)
    q_cache = torch.zeros(2, case.nblocks, 4, 2, 16 + 4, dtype=DTYPES[name])
    for cache in (float_cache, q_cache):  # the cached part goes in through the same write path as a step's
        case.fill(cache)
    torch.testing.assert_close(case.attend(q_cache), case.attend(float_cache), atol=atol, rtol=0)


@pytest.fixture(scope="module")
def smollm2():
    return load_model(None, torch.float32, "cpu")


@pytest.mark.parametrize("name,top1,ppl_ratio,kl", [("int8", 0.97, 1.02, 0.002), ("fp8", 0.93, 1.06, 0.008),
                                                   ("auto", 1.0, 1.0, 0.0)])
def test_smollm2_over_a_quantised_cache_keeps_its_accuracy(smollm2, name, top1, ppl_ratio, kl):
    """Stated tolerances (measured tenth session, KL per token to float KV: int8 0.0007, fp8 0.0036);
    the float cache against itself: the same logits, KL exactly 0."""
    r = compare(smollm2.model, smollm2.model, fixed_token_lists(smollm2.tokenizer), name)
    assert r["top1_agreement"] >= top1, r
    assert r["ppl_candidate"] <= r["ppl_reference"] * ppl_ratio, r
    assert r["kl_per_token"] <= kl, r
    if name != "auto":
        assert r["kl_per_token"] > 0, r


def test_smollm2_greedy_over_an_int8_cache_starts_like_float(smollm2):
    ids = smollm2.tokenizer.encode("The capital of France is Paris. The capital of Germany is")
    assert greedy(smollm2.model, ids, 6, "int8")[:3] == greedy(smollm2.model, ids, 6)[:3]
