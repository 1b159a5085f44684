"""Logit shaping (logit_bias, min_tokens, repetition / frequency / presence penalties) and the
min-p / top-k filters, row by row against hand-computed rows and transformers' processors."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
)

from hintkv.engine.logits_shaping import TokenTally, shape_logits, shape_row
from hintkv.engine.sampler import probs, sample
from hintkv.engine.types import SamplingParams

V = 12
EOS = {11}


def _row(seed: int = 0) -> torch.Tensor:
    return torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 3


def test_logit_bias_adds_to_the_named_tokens_only():
    row = _row()
    want = row.clone()
    want[3] += 5.0
    want[7] -= 100.0
    shape_row(row, SamplingParams(logit_bias=((3, 5.0), (7, -100.0))), [1, 2], 2, EOS)
    torch.testing.assert_close(row, want, rtol=0, atol=0)


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    p = SamplingParams(min_tokens=2, stop_token_ids=(4,), max_tokens=8)
    row = _row()
    shape_row(row, p, [1, 2, 9], 2, EOS)  # one output so far
    assert row[11] == float("-inf") and row[4] == float("-inf")
    assert torch.isfinite(row[[i for i in range(V) if i not in (4, 11)]]).all()
    row = _row()
    before = row.clone()
    shape_row(row, p, [1, 2, 9, 9], 2, EOS)  # two outputs: free to stop
    torch.testing.assert_close(row, before, rtol=0, atol=0)


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_is_transformers_rule_over_prompt_and_output(penalty):
    row = _row(1)
    ids = [0, 3, 3, 5, 8]
    want = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([ids]), row.clone()[None])[0]
    shape_row(row, SamplingParams(repetition_penalty=penalty), ids, 3, EOS)
    torch.testing.assert_close(row, want)


def test_frequency_and_presence_count_the_output_only():
    row = _row(2)
    want = row.clone()
    ids = [2, 2, 6, 2, 2, 9, 2]  # prompt [2, 2, 6], outputs [2, 2, 9, 2]
    f, p = 0.7, 1.1
    want[2] -= 3 * f + p
    want[9] -= 1 * f + p
    shape_row(row, SamplingParams(frequency_penalty=f, presence_penalty=p), ids, 3, EOS)
    torch.testing.assert_close(row, want)


def test_a_tally_kept_across_steps_shapes_each_row_as_a_fresh_read_of_the_history():
    """The runner folds each step's new tokens into the sequence's TokenTally; every step's row is
    bit for bit what reading the whole history gives, and a history that does not extend the folded
    one (a new sequence's) is read afresh."""
    p = SamplingParams(repetition_penalty=1.7, frequency_penalty=0.6, presence_penalty=-0.4)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V + 3, (6,), generator=gen).tolist()  # ids past the vocabulary are skipped
    tally = TokenTally()
    for step in range(12):
        row, fresh = _row(step), _row(step)
        shape_row(row, p, ids, 6, EOS, tally)
        shape_row(fresh, p, ids, 6, EOS)
        torch.testing.assert_close(row, fresh, rtol=0, atol=0)
        ids = ids + torch.randint(0, V, (step % 3 + 1,), generator=gen).tolist()  # 1-3 tokens a step (drafts)
    assert tally.folded > 6
    short = ids[:4]
    row, fresh = _row(), _row()
    shape_row(row, p, short, 3, EOS, tally)
    shape_row(fresh, p, short, 3, EOS)
    torch.testing.assert_close(row, fresh, rtol=0, atol=0)


def test_rows_without_shaping_are_not_copied_and_shaped_rows_leave_the_input_alone():
    logits = torch.stack([_row(3), _row(4)])
    plain = [SamplingParams(), SamplingParams(temperature=0)]
    assert shape_logits(logits, plain, [([1], 1), ([1], 1)], EOS) is logits
    before = logits.clone()
    shaped = shape_logits(logits, [SamplingParams(), SamplingParams(logit_bias=((0, 50.0),))],
                          [([1], 1), ([1], 1)], EOS)
    torch.testing.assert_close(logits, before, rtol=0, atol=0)
    torch.testing.assert_close(shaped[0], before[0], rtol=0, atol=0)
    assert shaped[1][0] == before[1][0] + 50.0


def test_greedy_takes_the_argmax_of_the_shaped_row():
    logits = _row(5)[None]
    top = int(logits[0].argmax())
    p = SamplingParams(temperature=0, logit_bias=((top, -100.0),))
    shaped = shape_logits(logits, [p], [([1], 1)], EOS)
    assert sample(shaped, [p], [None]) == [int(shaped[0].argmax())] and int(shaped[0].argmax()) != top


FILTERS = [(dict(top_k=k), TopKLogitsWarper(k)) for k in (1, 3, 7)] + \
    [(dict(min_p=m), MinPLogitsWarper(m)) for m in (0.05, 0.2, 0.6)]


@pytest.mark.parametrize("params, warper", FILTERS, ids=[str(f[0]) for f in FILTERS])
def test_top_k_and_min_p_keep_what_transformers_keeps_renormalized(params, warper):
    row = _row(6)
    pr = probs(row, SamplingParams(**params))
    want = torch.softmax(warper(None, row.clone()[None])[0], dim=-1)
    torch.testing.assert_close(pr, want)
    if "top_k" in params:
        assert int((pr > 0).sum()) == params["top_k"]


def test_off_values_change_nothing():
    row = _row(8)
    assert not SamplingParams(top_k=-1, min_p=0.0, repetition_penalty=1.0).shapes_logits
    torch.testing.assert_close(probs(row, SamplingParams(top_k=-1)), probs(row, SamplingParams()), rtol=0, atol=0)
    torch.testing.assert_close(probs(row, SamplingParams(top_k=V)), probs(row, SamplingParams()), rtol=0, atol=0)


@pytest.mark.parametrize("bad", [dict(min_tokens=9, max_tokens=8), dict(repetition_penalty=0.0),
                                 dict(frequency_penalty=2.5), dict(presence_penalty=-3.0), dict(top_k=-2),
                                 dict(min_p=1.5), dict(logit_bias=((1, 101.0),)), dict(logit_bias=((-1, 1.0),))])
def test_out_of_range_params_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
