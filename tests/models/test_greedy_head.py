"""greedy_head.py: the LM head's screened argmax is the float argmax, ties and NaNs included, and the
engine's greedy tokens are the same with it and without it (the full logits)."""

from __future__ import annotations

import pytest
import torch

from hintkv.models import greedy_head
from hintkv.models.greedy_head import GreedyHead

pytestmark = pytest.mark.skipif(not GreedyHead(torch.zeros(2, 64)).applies(),
                                reason="no C++ kernels or no AVX-512 VNNI: greedy rows use the logits")


@pytest.mark.parametrize("h", [512, 80])  # 80: a row tail shorter than one 64-byte vector
def test_screened_argmax_is_the_float_argmax(h):
    gen = torch.Generator().manual_seed(h)
    w = torch.randn(3000, h, generator=gen) * 0.02
    w[17] *= 4  # rows of other scales
    w[2000:2100] *= 0.01
    head = GreedyHead(w)
    for scale in (0.1, 1.0, 30.0):
        x = torch.randn(9, h, generator=gen) * scale
        x[3, 5] = 200 * scale  # an outlier channel: x's own quantisation error grows, the bound with it
        assert head(x) == (x.double() @ w.double().T).argmax(-1).tolist()


def test_near_ties_below_the_int8_error_are_decided_in_float():
    """The runner-up is 1e-4 below the top, far inside the int8 logits' error (~1e-2): an argmax of the
    approximate logits (no float recompute, or a bound too tight) picks the wrong one about half the time."""
    gen = torch.Generator().manual_seed(0)
    h, wrong = 256, 0
    for trial in range(40):
        w = torch.randn(500, h, generator=gen) * 0.05
        x = torch.randn(1, h, generator=gen)
        top = int((x @ w.T).argmax())
        other = (top + 1 + trial) % 500
        w[other] = w[top] + x[0].sign() * (torch.rand(h, generator=gen) - 0.5) * 1e-2
        w[other] -= x[0].sign() * (1e-4 + float((x[0] * (w[other] - w[top])).sum())) / x.abs().sum()
        want = (x.double() @ w.double().T).argmax(-1).tolist()
        got = GreedyHead(w)(x)
        wrong += got != want
    assert wrong == 0


def test_equal_rows_give_the_first_and_non_finite_rows_give_none():
    w = torch.randn(300, 64) * 0.02
    w[250] = w[40]
    x = w[40:41] * 10  # rows 40 and 250 share the maximum: torch.argmax's first index
    head = GreedyHead(w)
    assert head(x) == [40] == (x @ w.T).argmax(-1).tolist()
    assert head(torch.tensor([[float("nan")] * 64])) is None
    assert head(x.double()) is None
    bad = w.clone()
    bad[3, 3] = float("inf")
    assert GreedyHead(bad)(x) is None


def test_a_changed_weight_is_requantised():
    w = torch.randn(400, 64) * 0.02
    head = GreedyHead(w)
    x = w[10:11].clone() * 10
    assert head(x) == [10]
    w[10].mul_(-1)
    w[321] = x[0] / 10
    assert head(x) == [321]


def test_engine_greedy_tokens_are_the_same_with_the_screen_and_with_the_logits(monkeypatch):
    """dummy:tiny through LLMEngine: 3 prompts decoded together (a b3 step), 20 tokens each."""
    from hintkv.config import EngineConfig
    from hintkv.engine.llm_engine import LLMEngine
    from hintkv.engine.types import GenerateRequest, SamplingParams

    calls = []
    screened = greedy_head.GreedyHead.__call__

    def counted(self, h):
        out = screened(self, h)
        calls.append(h.shape[0] if out is not None else 0)  # rows the screen answered
        return out

    monkeypatch.setattr(greedy_head.GreedyHead, "__call__", counted)

    def run() -> dict[str, list[int]]:
        engine = LLMEngine(EngineConfig(model="dummy:tiny", dtype="float32", kv_cache_tokens=1024, seed=3))
        for i in range(3):
            engine.add_request(GenerateRequest(f"r{i}", list(range(100 + 40 * i, 140 + 50 * i)),
                                               SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)))
        out: dict[str, list[int]] = {}
        while engine.has_work():
            for o in engine.step():
                out.setdefault(o.request_id, []).extend(o.new_token_ids)
        return out

    on = run()
    assert calls and max(calls) == 3
    monkeypatch.setenv("HINTKV_GREEDY_HEAD", "0")
    calls.clear()
    off = run()
    assert not any(calls)  # the screen never applied: every token came from the logits
    assert on == off and all(len(t) == 20 for t in on.values())
