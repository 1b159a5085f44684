"""greedy_head's screen past 12 rows (the VNNI build's max_rows(): x screened in groups of at most 12, 13 = 12 + 1,
64 = 5 x 12 + 4): every group gives the float64 argmax, each group's bound is its own rows' (near ties that only
w's int8 error term covers, decided in a later group), and a batch recomputes exactly the rows its rows recompute
one at a time (any per-group offset error changes the count), and the engine's 16-row decode steps take the screen
and give the logits' tokens; under w8a8, model.greedy_tokens leaves 13+-row steps to the int8 head. Review of
5cac9c7."""

from __future__ import annotations

import pytest
import torch

from hintkv.models import greedy_head
from hintkv.models.greedy_head import GreedyHead
from model_steps import drain

pytestmark = pytest.mark.skipif(not GreedyHead(torch.zeros(2, 64)).applies() or greedy_head.max_rows() <= 12,
                                reason="no screen past 12 rows on this build (AVX2 or none): the logits answer")

GROUP_COUNTS = [13, 16, 17, 33, 63, 64]


def exact(x: torch.Tensor, w: torch.Tensor) -> list[int]:
    return (x.double() @ w.double().T).argmax(-1).tolist()


@pytest.mark.parametrize("n", GROUP_COUNTS)
def test_every_batch_past_one_group(n):
    """V = 3001: a partial last block and more than 64 blocks (several threads' lo merged); rows of other scales."""
    assert n <= greedy_head.max_rows()
    gen = torch.Generator().manual_seed(200 + n)
    w = torch.randn(3001, 200, generator=gen) * 0.05
    x = torch.randn(n, 200, generator=gen) * torch.logspace(-3, 3, n)[:, None]
    assert GreedyHead(w)(x) == exact(x, w)


def test_near_ties_in_a_later_group_use_that_groups_bound():
    """Rows 0-11 tiny (|x|_1 = 1e-3), rows 12-63 exactly int8 (x's quantisation error 0), each with its own
    runner-up 1e-3 below its top, inside w's int8 error: only each row's own |x|_1 err_r covers it. With rows 12+
    bounded by rows 0-11's |x|_1 (greedy_head.cpp's `part.l1 += n0` dropped) 20 of these 64 rows are wrong."""
    gen = torch.Generator().manual_seed(5)
    n, h, v = 64, 256, 600
    w = torch.randn(v, h, generator=gen) * 0.05
    x = torch.empty(n, h)
    x[:12] = torch.randn(12, h, generator=gen)
    x[:12] *= 1e-3 / x[:12].abs().sum(1, keepdim=True)
    x[12:] = torch.randint(-126, 127, (n - 12, h), generator=gen).float()
    x[12:, 0] = 127
    taken: set[int] = set()
    for r in range(12, n):
        xr = x[r].double()
        top = int((xr @ w.double().T).argmax())
        other = next(i for i in range(v - 1 - r, -1, -1) if i != top and i not in taken)
        taken |= {top, other}
        w[other] = w[top] + torch.randn(h, generator=gen) * 0.02
        gap = float((xr * (w[other].double() - w[top].double())).sum())
        w[other] -= x[r].sign() * (gap - 1e-3) / x[r].abs().sum()
    got, want = GreedyHead(w)(x), exact(x, w)
    near = [r for r in range(12, n) if sorted((x[r].double() @ w.double().T).tolist())[-2]
            > max((x[r].double() @ w.double().T).tolist()) - 2e-3]
    assert len(near) >= 40  # the construction holds for most rows (a later row's runner-up can take an earlier top)
    assert [r for r in range(n) if got[r] != want[r]] == []


@pytest.mark.parametrize("v, h, n", [(4099, 80, 64), (3001, 200, 13), (300, 64, 33), (17, 33, 17)])
def test_a_batch_recomputes_what_its_rows_recompute_alone(v, h, n):
    """Each row's bound and lo are its own, so the rows recomputed in float for N rows together are the sum over
    the rows run one at a time (with `part.l1 += n0` dropped: 216 vs 292 at 64 rows on 4099 x 80, each case fails)."""
    gen = torch.Generator().manual_seed(v + n)
    w = torch.randn(v, h, generator=gen) * 0.05
    x = torch.randn(n, h, generator=gen) * torch.logspace(-2, 2, n)[:, None]
    head = GreedyHead(w)
    assert head(x) == exact(x, w)
    together = greedy_head.ops().last_recomputed()
    alone = 0
    for r in range(n):
        assert head(x[r:r + 1]) == exact(x[r:r + 1], w)
        alone += greedy_head.ops().last_recomputed()
    assert together == alone


def test_engine_steps_past_12_rows_give_the_logits_tokens(monkeypatch):
    """dummy:tiny through LLMEngine: 16 prompts decoded together (16-row steps, past the row-major screen's 12),
    6 tokens each: the screen answers those steps and the tokens are those of HINTKV_GREEDY_HEAD=0 (the logits)."""
    from hintkv.config import EngineConfig
    from hintkv.engine.llm_engine import LLMEngine
    from hintkv.engine.types import GenerateRequest, SamplingParams

    calls: list[int] = []
    screened = greedy_head.GreedyHead.__call__

    def counted(self, h, *args, **kwargs):
        out = screened(self, h, *args, **kwargs)
        calls.append(h.shape[0] if out is not None else 0)  # rows the screen answered
        return out

    monkeypatch.setattr(greedy_head.GreedyHead, "__call__", counted)

    def run() -> dict[str, list[int]]:
        engine = LLMEngine(EngineConfig(model="dummy:tiny", dtype="float32", kv_cache_tokens=2048, seed=5,
                                        max_num_seqs=64))
        for i in range(16):
            engine.add_request(GenerateRequest(f"r{i}", list(range(50 + 97 * i, 70 + 101 * i)),
                                               SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)))
        out = drain(engine)
        engine.close()
        return out

    on = run()
    assert max(calls) == 16
    monkeypatch.setenv("HINTKV_GREEDY_HEAD", "0")
    calls.clear()
    off = run()
    assert not any(calls)  # every token from the logits
    assert on == off and sorted(on) == sorted(f"r{i}" for i in range(16)) and all(len(t) == 6 for t in on.values())


def test_w8a8_steps_past_max_rows_take_the_int8_head():
    """Under w8a8 the screen answers only the row counts measured against the int8 head (up to MAX_ROWS): a step of
    MAX_ROWS + 1 .. max_rows() rows, which the float screen would answer, takes the head's logits (None here). With
    llama.py's upper cap dropped (the pre-5cac9c7 routing) this model answered them."""
    import dataclasses

    from hintkv.models.llama import LlamaForCausalLM
    from hintkv.models.presets import init_random_, preset_config

    cfg = dataclasses.replace(preset_config("tiny"), vocab_size=3000, num_hidden_layers=1)
    model = LlamaForCausalLM(cfg)
    init_random_(model, 0)
    model.prepare("w8a8")
    hidden = torch.randn(greedy_head.max_rows(), cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    for n in (greedy_head.MAX_ROWS + 1, 16, greedy_head.max_rows()):
        assert model.greedy_tokens(hidden[:n]) is None, n
    float_argmax = (hidden.double() @ model.lm_head.double().T).argmax(-1).tolist()
    assert model.greedy_tokens(hidden[:greedy_head.MAX_ROWS]) == float_argmax[:greedy_head.MAX_ROWS]
