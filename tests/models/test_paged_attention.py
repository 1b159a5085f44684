"""paged_attention against a dense reference, with scattered block ids and GQA, on every path: cold
prefill, prefill over a cached prefix, and the batched short queries (decodes; speculative verifies
of several tokens per sequence, padded to the longest)."""

from __future__ import annotations

import pytest
import torch
from paged_case import PagedCase, dense_reference

from hintkv.models.attention import AttentionMetadata, gather_context


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("steps", [[(12, 12), (5, 5)], [(7, 19), (1, 4)], [(1, 30), (1, 3), (1, 17)],
                                   [(5, 23), (2, 6), (1, 11)], [(5, 5), (3, 9)], [(40, 61), (3, 3)]])
def test_matches_dense_reference(dtype, atol, steps):
    """steps: per sequence (new tokens, total context); sequences own scattered, shuffled blocks."""
    case = PagedCase.build(steps, seed=0, d=8, dtype=dtype)
    kv_cache = torch.zeros(2, case.nblocks, 4, 2, 8, dtype=dtype)
    case.fill(kv_cache)  # the cached part is already in the cache; the new part arrives as k/v
    out = case.attend(kv_cache)
    qsl = case.qsl
    assert out.shape == (qsl[-1], 6, 8) and out.dtype == dtype
    for i, (new, ctx) in enumerate(steps):
        ref = dense_reference(case.qs[i], case.full_k[i], case.full_v[i], 8 ** -0.5)
        torch.testing.assert_close(out[qsl[i]:qsl[i + 1]].float(), ref, atol=atol, rtol=0)
        k_back, v_back = gather_context(kv_cache, case.tables[i], ctx)  # new K/V landed in their slots
        assert torch.equal(k_back, case.full_k[i]) and torch.equal(v_back, case.full_v[i])


def test_check_rejects_inconsistent_metadata():
    meta = AttentionMetadata(slot_mapping=torch.tensor([0, 1]), query_start_loc=[0, 2], context_lens=[1],
                             block_tables=[torch.tensor([0])], is_decode_only=False)
    with pytest.raises(ValueError):
        meta.check()
    meta = AttentionMetadata(slot_mapping=torch.tensor([0, 1]), query_start_loc=[0, 2], context_lens=[2],
                             block_tables=[torch.tensor([0])], is_decode_only=True)
    with pytest.raises(ValueError):
        meta.check()


def test_a_verify_step_gives_the_logits_of_one_token_decodes():
    """A 5-token step over a cached prefix (the batched short-query path a speculative verify takes)
    gives the logits of five one-token decodes, on the real model code (dummy:tiny)."""
    from hintkv.bench.accuracy import OneSequence
    from hintkv.models.loader import load_model

    lm = load_model("dummy:tiny", torch.float32, "cpu", seed=4)
    prompt, nxt = list(range(400, 440)), list(range(500, 505))
    one, five = OneSequence(lm.model, 64), OneSequence(lm.model, 64)
    one.step(prompt)
    five.step(prompt)
    singles = torch.cat([one.step([t]) for t in nxt])
    torch.testing.assert_close(five.step(nxt), singles, atol=1e-4, rtol=1e-4)
