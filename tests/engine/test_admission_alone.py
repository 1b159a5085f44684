"""`short-alone` / `judged-alone` (engine/admission_alone.py) in the real scheduler with a step
clock (1 ms per batched token): a step that gives a prefill its first token carries no chunk of a
long prefill that does not finish, the long one loses nothing by it, and a due long prefill is
never held (no starvation, also as a property over random arrivals)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hintkv.engine.outputs import ModelRunnerOutput
from tests.engine.test_scheduler import make_seq
from tests.engine.test_scheduling_policies import first_tokens, make_sched, step

ALONE = ("short-alone", "judged-alone")


def step_tokens(policy: str) -> list[tuple[int, set[str]]]:
    """`first_tokens`' scenario, step by step: (batched tokens, request ids in the step)."""
    sched, clock = make_sched(policy)
    sched.add_request(make_seq("long", list(range(640)), 2))
    steps = []
    out = sched.schedule()
    steps.append((out.num_batched_tokens, {s.seq.request_id for s in out.scheduled}))
    clock.t += 0.001 * out.num_batched_tokens
    sched.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
    sched.add_request(make_seq("short", list(range(1000, 1006)), 1))
    out = sched.schedule()
    steps.append((out.num_batched_tokens, {s.seq.request_id for s in out.scheduled}))
    return steps


@pytest.mark.parametrize("policy", ALONE)
def test_the_short_prompts_first_token_step_carries_no_long_chunk(policy):
    assert step_tokens(policy)[1] == (6, {"short"})
    assert step_tokens("short-first")[1] == (64, {"short", "long"})  # the long chunk fills the step


@pytest.mark.parametrize("policy", ALONE)
def test_short_gets_its_token_sooner_and_long_loses_nothing(policy):
    alone, shared = first_tokens(policy), first_tokens("short-first")
    assert alone["short"] == pytest.approx(0.032 + 0.006)  # its own 6 tokens after the long one's capped first chunk
    assert shared["short"] == pytest.approx(0.128)  # the whole shared step
    assert alone["long"] <= shared["long"] + 1e-9  # the same work comes before its first token


def long_first_token_step(policy: str, arrivals: list[int], long_tokens: int = 1280) -> int | None:
    """A long prompt, then short ones (sizes from `arrivals`, one per step, forever repeated):
    the step that gave the long one its first token, or None within 400 steps."""
    sched, clock = make_sched(policy, blocks=2048, budget=64, seqs=64)
    sched.add_request(make_seq("long", list(range(long_tokens)), 1))
    for i in range(400):
        size = arrivals[i % len(arrivals)]
        if size:
            sched.add_request(make_seq(f"s{i}", [5000 + i * 64 + j for j in range(size)], 1))
        if "long" in step(sched, clock, 64):
            return i
    return None


def step_sizes(policy: str) -> list[int]:
    """A 200-token prompt alone (budget 64): the batched tokens of each step."""
    sched, clock = make_sched(policy)
    sched.add_request(make_seq("long", list(range(200)), 1))
    sizes = []
    while sched.has_work():
        out = sched.schedule()
        sizes.append(out.num_batched_tokens)
        clock.t += 0.001 * out.num_batched_tokens
        sched.update_from_output(out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
    return sizes


@pytest.mark.parametrize("policy", ALONE)
def test_a_chunk_that_cannot_finish_takes_half_the_budget(policy):
    """A prefill that cannot finish in a step computes at most half the budget in it (so the step
    a short arrival waits for is short); the chunk that can finish it is not capped."""
    assert step_sizes(policy) == [32, 32, 32, 32, 32, 40]
    assert step_sizes("short-first") == [64, 64, 64, 8]


# the long one's deadline (20 steps of budget) plus its own steps at the capped chunk (40), or twice its 20
BOUND = {"short-first": 2 * 20 + 4, "short-alone": 20 + 40 + 4, "judged-alone": 20 + 40 + 4}


@pytest.mark.parametrize("policy", ["short-first", *ALONE])
def test_a_long_prefill_is_not_starved_by_a_stream_of_short_ones(policy):
    at = long_first_token_step(policy, [8])
    assert at is not None and at <= BOUND[policy], at


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=st.lists(st.integers(0, 40), min_size=1, max_size=12), policy=st.sampled_from(ALONE))
def test_no_starvation_property(arrivals, policy):
    """Whatever the stream of short arrivals (0-40 tokens each step), the long prefill gets its
    first token within its own prefill plus the work that arrived before its deadline: at most
    about twice its own steps, plus the steps a finishing prefill's short step adds."""
    at = long_first_token_step(policy, arrivals)
    assert at is not None, "the long prefill starved"
    assert at <= BOUND[policy] + 2 * 20, at


def resume_beside_a_short_prompt(policy: str) -> dict[str, int]:
    """A 320-token context computed and left resident; then, in one step, a 20-token fresh prompt
    and a resume of the context with 40 new tokens (budget 64): the tokens each got in that step."""
    sched, clock = make_sched(policy, blocks=512, budget=64, seqs=8)
    warm = list(range(320))
    sched.add_request(make_seq("warm", warm, 1))
    while sched.has_work():
        step(sched, clock, 64)
    sched.add_request(make_seq("short", list(range(5000, 5020)), 1))
    sched.add_request(make_seq("resume", warm + list(range(9000, 9040)), 1))
    out = sched.schedule()
    return {s.seq.request_id: s.num_new_tokens for s in out.scheduled}


@pytest.mark.parametrize("policy", ALONE)
def test_a_resume_on_a_resident_prefix_is_not_held_beside_a_finishing_prompt(policy):
    """The resume's uncached 40 tokens finish it in this step: it is a finisher, not a long
    prefill (its computed count is its resident prefix, not the 0 a waiting sequence has)."""
    assert resume_beside_a_short_prompt(policy) == {"short": 20, "resume": 40}


def finishing_step(policy: str):
    """A scheduler and a step that holds a 6-token prompt finishing."""
    sched, _ = make_sched(policy, blocks=512, budget=64)
    sched.add_request(make_seq("short", list(range(5000, 5006)), 1))
    out = sched.schedule()
    assert [s.num_new_tokens for s in out.scheduled] == [6]
    return sched, out


@pytest.mark.parametrize("policy", ALONE)
def test_holds_a_long_chunk_beside_a_finisher_unless_it_is_due(policy):
    sched, out = finishing_step(policy)
    long = make_seq("long", list(range(640)), 1)
    policy_ = sched.admission
    policy_._deadline(long, 640, 64)  # first seen now: due 10 steps on
    assert policy_.holds(long, 32, out, 0)
    assert not policy_.holds(long, 32, out, 630)  # 10 left: its chunk would finish it
    policy_.step += 11
    assert not policy_.holds(long, 32, out, 0)  # due: never held (no starvation)


@pytest.mark.parametrize("policy", ALONE)
def test_a_recompute_finishing_is_a_finisher_and_a_decode_is_not(policy):
    from hintkv.engine.admission_alone import finishes
    seq = make_seq("r", list(range(100)), 4)
    assert finishes(seq, 100, 0) and not finishes(seq, 99, 0)
    seq.first_token_time = 1.0  # preempted after its first token: recomputing prompt and outputs
    assert finishes(seq, 100, 0)
    assert not finishes(seq, 1, 99)  # a decode


@pytest.mark.parametrize("policy", ALONE)
def test_a_running_long_prefill_yields_to_a_waiting_candidate_that_finishes_within_the_budget(policy):
    """`yields`' own rule, asked as step 7's running pass asks it: short-first's deadline order
    alone would not let the long prefill (first seen at step 1, 448 tokens left: deadline 8) yield
    to a 64-token newcomer (seen at step 7: deadline 8 too), but that one finishes in one step and
    the long one does not, so it goes after it."""
    from hintkv.engine.admission import ShortFirstAdmission
    sched, clock = make_sched(policy, blocks=512, budget=64)
    sched.add_request(make_seq("long", list(range(640)), 1))
    for _ in range(6):
        step(sched, clock, 64)
    long = sched.running[0]
    assert long.num_computed_tokens == 6 * 32
    sched.add_request(make_seq("new", list(range(5000, 5064)), 1))
    p = sched.admission
    p.order_running(sched.running, 64)  # step 7 begins (as `Scheduler.schedule` begins it)
    assert not ShortFirstAdmission.yields(p, long, sched.waiting, sched.kv, 64)
    assert p.yields(long, sched.waiting, sched.kv, 64)


@pytest.mark.parametrize("policy", ALONE)
def test_the_head_make_room_swapped_for_is_not_held_in_that_step(policy):
    """`make_room` preempted decodes for this head: holding it would waste the swap."""
    sched, out = finishing_step(policy)
    long = make_seq("long", list(range(640)), 1)
    p = sched.admission
    assert p.holds(long, 32, out, 0)
    p.made_room(long)
    assert not p.holds(long, 32, out, 0)
    p.step += 1  # the next step: the rule again
    assert p.holds(long, 32, out, 0)
