"""A short running prefill behind an aged long one gets its chunk in the step (srpt; real
Scheduler + KV manager, no model, no tiers).

`short-first` / `srpt` order the running prefills by deadline (first seen + 4 x todo / budget,
srpt), and an aged long prefill's comes first. While a waiting candidate waits, the long one takes
half the budget (`cap`) and the rest goes back to it after the admissions. A short running prefill
behind it (one that got part of its prompt when it was admitted) yielded to that candidate; the
candidate found no room, the budget went back to the long prefill, and the short one waited for
its every chunk: at 100 users / 8 instances a 317-token remainder waited 117 s behind a 155K-token
prefill (issue #9). Now a prefill that ends within half a step does not yield
(`ShortFirstAdmission.yields`), and with nothing waiting the long one shares the step with a short
prefill behind it as it does with a waiting candidate (`batching._short_after`; half of the step's
whole budget, also when decodes took part of it), and `cap` halves no prefill that ends within half a step (the budget left behind a capped long one is half the
step, so the short one's rest was halved again and again).
"""

from __future__ import annotations

import pytest

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams
from tests.engine.scheduler_helpers import BS, ROOT

BUDGET = 32
A_TOKENS = 4000  # the long prefill: 1,001 blocks to its end; its deadline 500 - 4 a step
W_TOKENS = 40  # the waiting candidate: 11 blocks, 10 free beside A: no room until A ends
W_AT = 100  # its key 105: A's deadline (100) is ahead of it, so A does not yield: A is capped
S_TOKENS = 28  # the short one: 16 tokens beside A's capped chunk when admitted, 12 left (< half)
S_AT = 104  # its deadline once running, 105.5: behind A's and W's (it would yield to W)
NUM_BLOCKS = 1011
DECODE_BLOCKS = 200  # a decode's 601 tokens: 151 blocks to its end


def _seq(rid: str, n: int, base: int) -> Sequence:
    return Sequence(rid, list(range(base, base + n)), n, SamplingParams(temperature=0, max_tokens=2), ROOT)


def _run(with_waiting: bool, num_decodes: int = 0, s_tokens: int = S_TOKENS) -> tuple[int, int]:
    """The step at which S and A get their first token; `num_decodes` one-token prompts that
    decode toward 600 tokens arrive 6 steps before S (they take part of every step's budget)."""
    kv = KVCacheManager(NUM_BLOCKS + DECODE_BLOCKS * num_decodes, BS, make_policy("lru"))
    sch = Scheduler(kv, 8 + num_decodes, BUDGET, admission="srpt")
    a, s = _seq("a", A_TOKENS, 10_000), _seq("s", s_tokens, 20_000)
    sch.add_request(a)
    first: dict[str, int] = {}
    for step in range(400):
        if step == W_AT and with_waiting:
            sch.add_request(_seq("w", W_TOKENS, 30_000))
        if step == S_AT - 6:
            for k in range(num_decodes):
                sch.add_request(Sequence(f"d{k}", [50_000 + 10 * k], 1,
                                         SamplingParams(temperature=0, max_tokens=600), ROOT))
        if step == S_AT:
            sch.add_request(s)
        out = sch.schedule()
        sch.update_from_output(out, ModelRunnerOutput.from_tokens([7 if x.samples else None for x in out.scheduled]))
        for x in (a, s):
            if x.request_id not in first and x.num_output_tokens:
                first[x.request_id] = step
        if len(first) == 2:
            break
        if step == S_AT + (num_decodes > 0):
            assert 1 < s.num_tokens - s.num_computed_tokens <= BUDGET // 2  # S runs, its prefill unfinished
    kv.check_integrity()
    return first["s"], first["a"]


@pytest.mark.parametrize("with_waiting", [True, False], ids=["a-candidate-waits-without-room", "nothing-waits"])
def test_a_short_running_prefill_finishes_while_the_aged_long_one_runs(with_waiting):
    s_first, a_first = _run(with_waiting)
    assert s_first <= S_AT + 1  # S's last 12 tokens in the next step (`cap` halved them: 6, 3, ...)
    assert a_first > S_AT + 10  # while A still has many steps to go


def test_a_short_running_prefill_beside_decodes_is_short_by_the_whole_step():
    """Ten decodes take 10 of the 32-token budget: S (36 tokens) has 14-15 left when A's turn
    comes, within half the step (16) but not within half of what the decodes left (11). Judged
    by the budget left (`_short_after` before), A was not capped for it and S got its first token
    with A's, 33 steps late."""
    s_first, a_first = _run(False, num_decodes=10, s_tokens=36)
    assert s_first <= S_AT + 2
    assert a_first > S_AT + 10


@pytest.mark.parametrize("rest, short", [(1, False), (2, True), (BUDGET // 2, True), (BUDGET // 2 + 1, False)])
def test_short_rest_is_a_prefill_that_ends_within_half_the_step(rest, short):
    """The one rule behind `yields`, `cap` and `batching._short_after` (`ShortFirstAdmission.short_rest`):
    a prefill with 2 .. budget / 2 tokens left (16 of a 32-token step included) is short; a decode
    (1 left) and 17 left are not."""
    sch = Scheduler(KVCacheManager(64, BS, make_policy("lru")), 8, BUDGET, admission="srpt")
    seq = _seq("r", 40, 40_000)
    seq.num_computed_tokens = seq.num_tokens - rest
    sch.admission.order_running([], BUDGET)  # the step's budget
    assert sch.admission.short_rest(seq) is short
