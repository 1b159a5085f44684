"""`srpt-room` (engine/admission_srpt.py) in the real scheduler with a step clock (1 ms per batched
token): a shorter prompt that has no room beside a decode and a long prefill's reservation takes
the room the long prefill still reserves and gets its first token first (under `srpt` it waits for
the whole long prefill); what one step lends is lent once; only a prefill with a later deadline
lends; everyone finishes."""

from __future__ import annotations

from tests.engine.test_scheduler import make_seq
from tests.engine.test_scheduling_policies import make_sched, step

# 132 blocks of 4 tokens, a 128-token budget. A 120-token prompt decoding 76 tokens reserves 49
# blocks to its end, a 328-token cold prefill 83: no block is left for anyone else. After the long
# prefill's first chunk (128 tokens, 32 blocks) it still reserves 51 it has not allocated, and has
# 200 tokens left (srpt-room's deadline: seen + 64 x 200 / 128 = seen + 100 steps).


def scene(policy: str, shorts: list[tuple[int, int]]) -> tuple[dict[str, float], list[list[str]]]:
    """The decode, then the long prefill, then after its first chunk the short prompts (prompt
    tokens, max_tokens); returns the first-token times and, per later step, who is waiting."""
    sched, clock = make_sched(policy, blocks=132, budget=128, seqs=8)
    sched.add_request(make_seq("decode", list(range(120)), 76))
    firsts = {}
    while "decode" not in firsts:
        firsts |= step(sched, clock, 128)
    sched.add_request(make_seq("long", list(range(1000, 1328)), 1))
    firsts |= step(sched, clock, 128)
    for i, (n, out) in enumerate(shorts):
        sched.add_request(make_seq(f"short{i}", list(range(2000 + 300 * i, 2000 + 300 * i + n)), out))
    waiting = []
    for _ in range(500):
        if not sched.has_work():
            break
        firsts |= step(sched, clock, 128)
        waiting.append([s.request_id for s in sched.waiting])
    assert not sched.has_work() and sched.kv.pool.num_in_use == 0
    return firsts, waiting


def test_a_shorter_prompt_takes_the_room_a_long_prefill_reserves():
    """40 tokens (11 blocks, key seen + 20): borrowed from the long prefill's 51."""
    srpt, _ = scene("srpt", [(40, 1)])
    room, _ = scene("srpt-room", [(40, 1)])
    assert srpt["short0"] > srpt["long"]  # no room beside the long prefill's reservation: it waits
    assert room["short0"] < room["long"]  # its 40 tokens go first
    assert room["short0"] + room["long"] < srpt["short0"] + srpt["long"]


def test_what_a_step_lends_is_lent_once():
    """Two 20-token prompts with 100 tokens to decode need 30 blocks each, 60 of the 51 lendable:
    one borrows in that step (the first one's reservation is in the step's plan)."""
    got, waiting = scene("srpt-room", [(20, 100), (20, 100)])
    assert waiting[0] == ["short1"], waiting[:3]
    assert got["short0"] < got["long"]


def test_only_a_prefill_with_a_later_deadline_lends():
    """After the long prefill's first chunk: a key before its deadline may borrow its 51 blocks,
    a key after it nothing (the long prefill does not yield to it)."""
    sched, clock = make_sched("srpt-room", blocks=132, budget=128, seqs=8)
    sched.add_request(make_seq("decode", list(range(120)), 76))
    while not step(sched, clock, 128):
        pass
    sched.add_request(make_seq("long", list(range(1000, 1328)), 1))
    step(sched, clock, 128)  # its first chunk: 200 tokens left, 32 of its 83 blocks allocated
    policy = sched.admission  # (its running list is the scheduler's; deadline: seen + 64 x 200 / 128)
    deadline = policy.seen["long"] + 100
    assert policy.lendable(deadline - 1, 4) == 51
    assert policy.lendable(deadline + 1, 4) == 0
