"""Our decoder vs transformers on the same random weights: full prefill, chunked prefill, decode, batches."""

from __future__ import annotations

import pytest
import torch
from model_steps import ModelSteps
from tiny_hf_checkpoints import VARIANTS

from hintkv.models.loader import load_model

ATOL = 1e-4


def _reference_logits(hf_model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def loaded(hf_checkpoints):
    return {v: (load_model(str(d), torch.float32, "cpu"), hf) for v, (d, hf) in hf_checkpoints.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("length", [1, 5, 37])
def test_cold_prefill_matches(loaded, variant, length):
    lm, hf = loaded[variant]
    ids = _prompt(length, length)
    (ours,) = ModelSteps(lm, 32, block_size=4).logits([("s", ids)])
    torch.testing.assert_close(ours, _reference_logits(hf, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", ["llama", "qwen2", "llama3-rope"])
@pytest.mark.parametrize("chunks", [(3, 30), (16, 5, 9), (1, 1, 21)])
def test_chunked_prefill_matches(loaded, variant, chunks):
    """Each chunk attends to the cached prefix through the block table (block size 4 crosses blocks)."""
    lm, hf = loaded[variant]
    ids = _prompt(sum(chunks), 7)
    cache = ModelSteps(lm, 32, block_size=4)
    rows, start = [], 0
    for c in chunks:
        rows.extend(cache.logits([("s", ids[start:start + c])]))
        start += c
    torch.testing.assert_close(torch.cat(rows), _reference_logits(hf, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", ["llama", "qwen2"])
def test_decode_steps_match_full_sequence(loaded, variant):
    lm, hf = loaded[variant]
    ids = _prompt(20, 3)
    cache = ModelSteps(lm, 32, block_size=4)
    rows = cache.logits([("s", ids[:12])])
    for tok in ids[12:]:
        rows.extend(cache.logits([("s", [tok])]))
    torch.testing.assert_close(torch.cat(rows), _reference_logits(hf, ids), atol=ATOL, rtol=0)


def test_mixed_and_decode_batches_match(loaded):
    """A batch mixing a cold prefill with a cached-prefix chunk, then padded decode batches of unequal lengths."""
    lm, hf = loaded["qwen2"]
    seqs = {"a": _prompt(23, 1), "b": _prompt(9, 2), "c": _prompt(14, 3)}
    cache = ModelSteps(lm, 64, block_size=4)
    got: dict[str, list[torch.Tensor]] = {k: [] for k in seqs}
    for k, r in zip("ab", cache.logits([("a", seqs["a"][:10]), ("b", seqs["b"][:4])])):
        got[k].append(r)
    batch = [("a", seqs["a"][10:20]), ("c", seqs["c"][:11]), ("b", seqs["b"][4:6])]
    for (k, _), r in zip(batch, cache.logits(batch)):
        got[k].append(r)
    pos = {"a": 20, "b": 6, "c": 11}
    while any(pos[k] < len(seqs[k]) for k in seqs):
        batch = [(k, [seqs[k][pos[k]]]) for k in seqs if pos[k] < len(seqs[k])]
        for (k, _), r in zip(batch, cache.logits(batch)):
            got[k].append(r)
            pos[k] += 1
        assert cache.last_meta.is_decode_only
    for k, ids in seqs.items():
        torch.testing.assert_close(torch.cat(got[k]), _reference_logits(hf, ids), atol=ATOL, rtol=0)


def test_bfloat16_stays_close_to_float32(hf_checkpoints):
    d, hf = hf_checkpoints["llama"]
    lm = load_model(str(d), torch.bfloat16, "cpu")
    assert lm.model.embed_tokens.dtype == torch.bfloat16
    ids = _prompt(30, 9)
    cache = ModelSteps(lm, 32, block_size=4, dtype=torch.bfloat16)
    rows = cache.logits([("s", ids[:25])])
    for tok in ids[25:]:
        rows.extend(cache.logits([("s", [tok])]))
    ours, ref = torch.cat(rows), _reference_logits(hf, ids)
    assert ours.dtype == torch.float32
    assert (ours - ref).abs().max() < 0.05 * ref.abs().max()
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
