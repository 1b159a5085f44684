"""greedy_head.py: the LM head's screened argmax is the real (float64) argmax on near-ties that either half of
the bound alone must cover, first index on bit-equal rows, None on NaNs; a reloaded checkpoint is requantised;
more than max_rows() rows take the logits; the engine's greedy tokens on dummy:tiny are the same with it and
without it (the full logits). Exact float ties against the logits' own summation order may differ (rare)."""

from __future__ import annotations

import pytest
import torch

from hintkv.models import greedy_head
from hintkv.models.greedy_head import GreedyHead
from model_steps import drain

pytestmark = pytest.mark.skipif(not GreedyHead(torch.zeros(2, 64)).applies(),
                                reason="no C++ kernels or neither AVX-512 VNNI nor AVX2: greedy rows use the logits")


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


@pytest.mark.parametrize("levels", [127, 64])  # x's levels: the VNNI screen's 8 bits, the AVX2 screen's 7
def test_near_ties_inside_w_int8_error_with_x_exactly_int8(levels):
    """x exactly on the screen's levels (|x|_inf = levels: x's quantisation error is 0), so only w's term (resid_r
    and the float margin; in the AVX2 screen's Euclidean bound |w - w~|_2 and its margin) covers the runner-up
    placed 1e-3 below the top (float dots err ~1e-5 here): dropping that term gets 24 of these 40 wrong (s11 review)."""
    gen = torch.Generator().manual_seed(1)
    h, wrong = 256, []
    for trial in range(40):
        x = torch.randint(1 - levels, levels, (1, h), generator=gen).float()
        x[0, 0] = levels
        w = torch.randn(500, h, generator=gen) * 0.05
        top = int((x.double() @ w.double().T).argmax())
        other = (top + 1 + trial) % 500
        w[other] = w[top] + torch.randn(h, generator=gen) * 0.02
        gap = float((x[0].double() * (w[other].double() - w[top].double())).sum())
        w[other] -= x[0].sign() * (gap - 1e-3) / x.abs().sum()
        want = (x.double() @ w.double().T).argmax(-1).tolist()
        got = GreedyHead(w)(x)
        if got != want:
            wrong.append((trial, got, want))
    assert wrong == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_x_quantisation_error_with_w_exactly_int8(seed):
    """w exactly int8 (resid_r = 0) and x with an outlier channel (30: x's int8 step grows to 30/127), so only
    x's term |x - x~|_1 127 scale_r keeps the true top among the recomputed rows; rows also hold a near-tie
    below float resolution (one unit in x's smallest channel). The token's exact logit must be within the two
    float32 dots' rounding (H 2^-24 sum |x w| each, ~0.5 here) of the exact maximum: with x's term dropped,
    4-6 of each seed's 40 miss by 8-265; the committed screen misses by <= 7e-4 (a float tie)."""
    gen = torch.Generator().manual_seed(seed)
    h, wrong = 256, []
    for trial in range(40):
        w = torch.randint(-126, 127, (500, h), generator=gen).float()
        w[:, 0] = 127
        x = torch.randn(1, h, generator=gen)
        x[0, 1] = 30
        exact = (x.double() @ w.double().T)[0]
        top = int(exact.argmax())
        other = (top + 1 + trial) % 500
        w[other] = w[top].clone()
        j = int(x[0].abs().argmin())
        w[other, j] += 1 if x[0, j] > 0 else -1
        exact = (x.double() @ w.double().T)[0]
        best = int(exact.argmax())
        (got,) = GreedyHead(w)(x)
        rounding = h * 2.0 ** -24 * float((x[0].double().abs() * (w[best].abs() + w[got].abs()).double()).sum())
        if exact[best] - exact[got] > rounding:
            wrong.append((trial, got, best, float(exact[best] - exact[got])))
    assert wrong == []


def test_more_rows_than_the_cap_take_the_logits():
    w = torch.randn(300, 64) * 0.02
    head = GreedyHead(w)
    x = torch.randn(greedy_head.max_rows() + 1, 64)
    assert head(x) is None
    n = greedy_head.max_rows()
    assert head(x[:n]) == (x[:n].double() @ w.double().T).argmax(-1).tolist()


def test_a_reloaded_checkpoint_is_requantised():
    """load_state_dict_hf copies through `.data`, which leaves the head's (data_ptr, _version) as it was:
    prepare() must still give the screen the new weights (the old screen answered from the first ones)."""
    import dataclasses

    from hintkv.models.llama import LlamaForCausalLM, _expected_hf_names, _hf_to_own
    from hintkv.models.presets import init_random_, preset_config

    cfg = dataclasses.replace(preset_config("tiny"), vocab_size=2000, num_hidden_layers=1)
    model = LlamaForCausalLM(cfg)
    init_random_(model, 0)
    model.prepare(None)
    hidden = torch.randn(6, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    assert model.greedy_tokens(hidden) == model.compute_logits(hidden).argmax(-1).tolist()
    other = LlamaForCausalLM(cfg)
    init_random_(other, 1)
    own = dict(other.named_parameters(remove_duplicate=False))
    sd = {}
    for name in _expected_hf_names(cfg):
        own_name, rows = _hf_to_own(name, cfg)
        sd[name] = (own[own_name].detach() if rows is None else own[own_name].detach()[rows]).clone()
    model.load_state_dict_hf(sd)
    logits = model.compute_logits(hidden)
    assert model.greedy_tokens(hidden) == logits.argmax(-1).tolist()
    assert logits.argmax(-1).tolist() == other.compute_logits(hidden).argmax(-1).tolist()


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

    def counted(self, h, quantized=False):
        out = screened(self, h, quantized)
        calls.append(h.shape[0] if out is not None else 0)  # rows the screen answered
        return out

    monkeypatch.setattr(greedy_head.GreedyHead, "__call__", counted)

    def run() -> dict[str, list[int]]:
        engine = LLMEngine(EngineConfig(model="dummy:tiny", dtype="float32", kv_cache_tokens=1024, seed=3))
        for i in range(3):
            engine.add_request(GenerateRequest(f"r{i}", list(range(100 + 40 * i, 140 + 50 * i)),
                                               SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)))
        return drain(engine)

    on = run()
    assert calls and max(calls) == 3
    monkeypatch.setenv("HINTKV_GREEDY_HEAD", "0")
    calls.clear()
    off = run()
    assert not any(calls)  # the screen never applied: every token came from the logits
    assert on == off and all(len(t) == 20 for t in on.values())

    # above the row cap the runner computes the logits (3 rows > a cap of 2)
    from hintkv.models.llama import LlamaForCausalLM

    logit_rows, full = [], LlamaForCausalLM.compute_logits
    monkeypatch.setattr(LlamaForCausalLM, "compute_logits",
                        lambda self, h: logit_rows.append(h.shape[0]) or full(self, h))
    monkeypatch.delenv("HINTKV_GREEDY_HEAD")
    monkeypatch.setattr(greedy_head, "MAX_ROWS", 2)
    monkeypatch.setattr(greedy_head, "MAX_ROWS_BLOCKED", 2)
    calls.clear()
    capped = run()
    assert calls and not any(calls) and 3 in logit_rows
    assert capped == on
