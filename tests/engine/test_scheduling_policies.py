"""Scheduling policies' invariants in the real scheduler (made-up runner output, a step clock) and
through the real engine on SmolLM2: the step budget is never exceeded, everyone finishes, nothing
starves under `short-first`, `fcfs` keeps vLLM's order (a long prefill holds the budget), a short
prompt overtakes a long prefill under `short-first`, the TTFT parts sum to the TTFT, and greedy
outputs are identical under every policy."""

from __future__ import annotations

import random

import pytest
import torch

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.config import EngineConfig
from hintkv.engine.admission import live_admission_names
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.types import GenerateRequest, SamplingParams
from hintkv.models.loader import LoadedModel, load_model
from hintkv.models.presets import smollm2_tokenizer
from tests.engine.test_scheduler import make_seq

POLICIES = live_admission_names()  # cache-aware-serial: offline only (the live engine refuses it)


class StepClock:
    """Time advances only when a step runs: 1 ms per batched token (a prefill-bound engine)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def step(sched: Scheduler, clock: StepClock, budget: int) -> dict:
    """One step; returns {request id: first-token time} for the requests that got it."""
    out = sched.schedule()
    assert out.num_batched_tokens <= budget
    clock.t += 0.001 * out.num_batched_tokens
    outs = sched.update_from_output(
        out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
    sched.check_integrity()
    sched.admission.check_integrity()
    firsts = {}
    for o in outs:
        if o.metrics is not None and o.metrics.ttft_parts is not None:
            parts = o.metrics.ttft_parts.as_dict()
            assert all(v >= -1e-12 for v in parts.values())
            assert sum(parts.values()) == pytest.approx(o.metrics.ttft_s, abs=1e-9)
    for s in out.scheduled:
        if s.seq.first_token_time is not None and s.seq.num_output_tokens == 1:
            firsts[s.seq.request_id] = s.seq.first_token_time
    return firsts


def make_sched(policy: str, blocks: int = 256, budget: int = 64, seqs: int = 8) -> tuple[Scheduler, StepClock]:
    clock = StepClock()
    kv = KVCacheManager(blocks, 4, make_policy("lru"))
    return Scheduler(kv, max_num_seqs=seqs, max_num_batched_tokens=budget, admission=policy, clock=clock), clock


@pytest.mark.parametrize("policy", POLICIES)
def test_budget_respected_everyone_finishes_parts_sum(policy):
    rng = random.Random(3)
    sched, clock = make_sched(policy, blocks=96, budget=48, seqs=6)
    n = 0
    for _ in range(4000):
        if n < 40 and rng.random() < 0.3:
            size = rng.choice([3, 9, 30, 120])
            sched.add_request(make_seq(f"r{n}", [rng.randrange(50) for _ in range(size)], rng.randint(1, 6)))
            n += 1
        step(sched, clock, 48)
        if n == 40 and not sched.has_work():
            break
    assert n == 40 and not sched.has_work(), f"{policy}: {len(sched.requests)} requests left"
    assert sched.kv.pool.num_in_use == 0


def first_tokens(policy: str) -> dict[str, float]:
    """A 640-token prompt starts; a 6-token one arrives while it prefills (budget 64)."""
    sched, clock = make_sched(policy)
    sched.add_request(make_seq("long", list(range(640)), 2))
    firsts = step(sched, clock, 64)
    sched.add_request(make_seq("short", list(range(1000, 1006)), 1))
    while sched.has_work():
        firsts |= step(sched, clock, 64)
    return firsts


def test_fcfs_lets_a_long_prefill_hold_the_budget():
    f = first_tokens("fcfs")  # vLLM: running first, FCFS, the chunk takes the whole budget
    assert f["short"] > f["long"]


def test_short_first_lets_a_short_prompt_overtake_a_long_prefill():
    f = first_tokens("short-first")
    assert f["short"] < 0.001 * 64 * 3  # within the step after it arrived
    assert f["short"] < f["long"]
    assert f["long"] <= first_tokens("fcfs")["long"] + 0.001 * 6 + 1e-9  # the long one lost its 6 tokens only


def test_short_first_does_not_starve_a_long_prefill():
    """A short prompt arrives every step forever; the long one still gets its first token within
    about twice its own prefill (its deadline ages past every newcomer's)."""
    sched, clock = make_sched("short-first", blocks=1024, budget=64, seqs=64)
    sched.add_request(make_seq("long", list(range(1280)), 1))  # 20 steps of budget alone
    for i in range(200):
        sched.add_request(make_seq(f"s{i}", [2000 + i * 8 + j for j in range(8)], 1))
        if "long" in step(sched, clock, 64):
            assert i <= 2 * 20 + 4
            return
    raise AssertionError("the long prefill starved")


@pytest.mark.parametrize("policy", POLICIES)
def test_queue_and_compute_parts_point_at_the_wait(policy):
    sched, clock = make_sched(policy, budget=64, seqs=1)  # one at a time: the second one queues
    sched.add_request(make_seq("a", list(range(128)), 1))
    sched.add_request(make_seq("b", list(range(500, 628)), 1))
    metrics = {}
    while sched.has_work():
        out = sched.schedule()
        clock.t += 0.001 * out.num_batched_tokens
        for o in sched.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled])):
            if o.finished:
                metrics[o.request_id] = o.metrics.ttft_parts
    a, b = metrics["a"], metrics["b"]
    assert a.queue_s == 0 and a.compute_s == pytest.approx(0.128)
    assert b.queue_s == pytest.approx(0.128) and b.compute_s == pytest.approx(0.128)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tok = smollm2_tokenizer()
    chat = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    texts = ["Say hi.", "List five colours, one per line.",
             "Explain in two sentences why the sky is blue. " * 6, "Count from 1 to 10."]
    return [tok.encode(chat.format(t)) for t in texts]


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    """SmolLM2 loaded once: every policy's engine runs the same weights (a load per engine was
    ~7 s of the test's ~58 s per policy, quiet)."""
    return load_model(None, torch.float32, "cpu")


def greedy(policy: str, prompts: list[list[int]], model: LoadedModel) -> dict[str, list[int]]:
    e = LLMEngine(EngineConfig(block_size=16, kv_cache_tokens=2048, max_num_batched_tokens=48,
                               scheduling_policy=policy, enforce_eager=True), loaded=model)
    out: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        e.add_request(GenerateRequest(f"r{i}", p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)))
        for o in e.step():  # arrivals interleave with steps: chunks and admissions reorder
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    while e.has_work():
        for o in e.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        e.check_integrity()
    return out


def test_greedy_outputs_identical_under_every_policy(prompts, smollm2):
    ref = greedy("fcfs", prompts, smollm2)
    assert all(len(v) == 12 for v in ref.values()) and len(ref) == len(prompts)
    for policy in POLICIES:
        assert greedy(policy, prompts, smollm2) == ref, policy
