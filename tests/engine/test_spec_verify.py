"""Verification of drafts (`engine/spec/verify.py`): greedy is exact; rejection sampling keeps the
target distribution (a chi-square test on a 5-token vocabulary, seeded so it is reproducible)."""

import pytest
import torch

from hintkv.engine.spec.verify import verify
from hintkv.engine.types import SamplingParams

GREEDY = SamplingParams(temperature=0)


def test_greedy_accepts_matching_prefix_then_the_argmax():
    logits = torch.full((4, 6), -5.0)
    for row, tok in enumerate([3, 1, 4, 5]):
        logits[row, tok] = 5.0
    assert verify(logits, [3, 1, 4], GREEDY) == [3, 1, 4, 5]  # all accepted + bonus
    assert verify(logits, [3, 2, 4], GREEDY) == [3, 1]  # first mismatch: the model's token
    assert verify(logits, [0, 1, 4], GREEDY) == [3]
    with pytest.raises(ValueError):
        verify(logits, [3, 1], GREEDY)


def _chi2_pvalue(counts: torch.Tensor, p: torch.Tensor) -> float:
    n = counts.sum()
    keep = p > 0
    expected = p[keep] * n
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    cdf = torch.special.gammainc(torch.tensor(df / 2, dtype=torch.float64),
                                 torch.tensor(stat / 2, dtype=torch.float64))
    return float(1 - cdf)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_rejection_sampling_keeps_the_distribution(top_p):
    torch.manual_seed(0)
    v, trials = 5, 20000
    logits = torch.randn(3, v) * 1.5
    params = SamplingParams(temperature=0.9, top_p=top_p)
    from hintkv.engine.sampler import probs
    p = [probs(logits[j], params) for j in range(3)]
    drafts = [int(p[0].argsort()[-2]), int(p[1].argmax())]  # a plausible and a likely draft
    gen = torch.Generator().manual_seed(1234)
    first = torch.zeros(v)
    second = torch.zeros(v)  # the second token when the first draft was accepted
    third = torch.zeros(v)  # the bonus token after both drafts
    for _ in range(trials):
        out = verify(logits, drafts, params, gen)
        assert 1 <= len(out) <= 3
        first[out[0]] += 1
        if out[0] == drafts[0] and len(out) > 1:
            second[out[1]] += 1
            if out[1] == drafts[1] and len(out) > 2:
                third[out[2]] += 1
    for counts, target in ((first, p[0]), (second, p[1]), (third, p[2])):
        assert counts.sum() > 500
        assert counts[target == 0].sum() == 0  # never a token outside top-p
        assert _chi2_pvalue(counts, target) > 1e-4


def test_the_chi2_check_can_fail():
    """The statistic rejects a sampler that always accepts the draft (the bug it guards)."""
    p = torch.tensor([0.5, 0.3, 0.2])
    counts = torch.tensor([0.0, 5000.0, 0.0]) + torch.tensor([2500.0, 1500.0, 1000.0])
    assert _chi2_pvalue(counts, p) < 1e-4
