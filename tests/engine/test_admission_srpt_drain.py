"""`srpt-drain` (engine/admission_srpt.py) in the real scheduler with a step clock (1 ms per batched
token, 4-token blocks, a 128-token budget): while a candidate the room rule refused waits, a longer
prefill is held from the steps that carry decodes, so the decode that holds the room ends in
decode-only steps and the candidate gets in; a step that gives a prefill its first token carries no
chunk of one that does not finish; a due prefill is never held."""

from __future__ import annotations

from tests.engine.test_scheduler import make_seq
from tests.engine.test_scheduling_policies import make_sched, step

# 400 blocks. A 300-token prompt decoding 76 tokens reserves 94 blocks to its end, a 1200-token cold
# prefill 301: 5 are left. The short call, 40 tokens with 1100 to generate (its key: seen + 64 x 40 /
# 128, before the long prefill's deadline), needs 285: more than the 5 free and the 269 the long
# prefill lends after its first chunk, less once the decode's 94 are free too.


def scene(policy: str, due: bool = False, decode_prompt: int = 300, short_max: int = 1100,
          head_start: int = 0, long_left: int = 0, long_tokens: int = 1200) -> tuple[dict[str, float], list[dict[str, int]]]:
    """The decode, the long prefill's first chunk, then the short call; returns the first-token
    times and each later step's {request id: new tokens}. `due`: the long prefill's deadline has
    passed by the time the short call arrives (and the short call's key is earlier still);
    `head_start`: steps the long prefill was first seen earlier; `long_left`: it runs until at most
    that many tokens are left before the short call arrives."""
    sched, clock = make_sched(policy, blocks=400, budget=128, seqs=8)
    steps = []
    schedule = sched.schedule

    def recorded(unlocked=None):
        out = schedule(unlocked)
        steps.append({s.seq.request_id: s.num_new_tokens for s in out.scheduled})
        return out
    sched.schedule = recorded
    sched.add_request(make_seq("decode", list(range(decode_prompt)), 76))
    firsts = {}
    while "decode" not in firsts:
        firsts |= step(sched, clock, 128)
    sched.add_request(make_seq("long", list(range(1000, 1000 + long_tokens)), 1))
    firsts |= step(sched, clock, 128)
    long = sched.requests["long"]
    while long.num_tokens - long.num_computed_tokens > long_left > 0:
        firsts |= step(sched, clock, 128)
    sched.admission.seen["long"] -= head_start
    if due:  # both first seen long ago: the long prefill's deadline has passed, the short's key is earlier
        sched.admission.seen["long"] -= 10**6
        sched.admission.seen["short"] = sched.admission.seen["long"] - 100
    sched.add_request(make_seq("short", list(range(3000, 3040)), short_max))
    first = len(steps)
    for _ in range(3000):
        if not sched.has_work():
            break
        firsts |= step(sched, clock, 128)
    assert not sched.has_work() and sched.kv.pool.num_in_use == 0
    return firsts, steps[first:]


def test_a_longer_prefill_waits_while_the_decode_that_holds_the_room_ends():
    room, room_steps = scene("srpt-room")
    drain, drain_steps = scene("srpt-drain")
    assert room["short"] > room["long"]  # no room until the long prefill ends (lending is not enough)
    assert all("long" in s for s in room_steps[:9])  # beside the decode, one token a step
    # srpt-drain: decode-only steps until the decode ends (74 tokens left), then the short call
    assert drain_steps[:74] == [{"decode": 1}] * 74
    assert drain_steps[74] == {"short": 40}  # its first token in a step of its own (the alone rule)
    assert drain["short"] < room["long"] < drain["long"]  # 1.0 s sooner; the long prefill 0.11 s later
    assert drain["short"] + drain["long"] < room["short"] + room["long"] - 0.8


def test_a_due_prefill_is_not_held():
    """Its deadline passed: it keeps its chunks beside the decode although the refused call's key
    is earlier (no starvation)."""
    got, steps = scene("srpt-drain", due=True)
    assert "long" in steps[0] and "decode" in steps[0]  # due: it keeps its chunks beside the decode
    assert got["long"] < got["short"]


def test_no_hold_while_the_decodes_cannot_make_the_room():
    """A 20-token decode (its end frees 24 blocks) and a short call that needs 372: more than the
    free, lendable and decode blocks together (368), so it fits only once the long prefill ends.
    Holding the long prefill for the decode's whole life would make both later (1.335 / 1.295 s
    against srpt-room's 1.271 / 1.230): srpt-drain runs srpt-room's schedule."""
    room, room_steps = scene("srpt-room", decode_prompt=20, short_max=1448)
    drain, drain_steps = scene("srpt-drain", decode_prompt=20, short_max=1448)
    assert drain_steps == room_steps and drain == room
    assert room["short"] > room["long"]


def test_a_prefill_placed_before_the_refused_call_is_not_held():
    """The long prefill first seen 530 steps earlier: its deadline (not passed) is before the short
    call's key, so it is not held for it (nor does it lend it room) and keeps its chunks beside the
    decode; only the prefills after the refused call in srpt's order wait. The short call generates
    300 tokens (85 blocks to its end, 80 beyond the free ones): the decode's end (94 blocks) would
    cover that, so the key alone keeps the long prefill running (holding every non-due prefill
    holds it here)."""
    got, steps = scene("srpt-drain", head_start=530, short_max=300)
    assert steps[0] == {"decode": 1, "long": 127}
    assert got["long"] < got["short"]


def test_the_decodes_free_their_reserved_growth_too():
    """A 20-token decode reserves 24 blocks to its end but holds 6 now; the short call, 1396 tokens
    to generate, lacks 15: only the decode's end (its reservation
    included) covers it, so the long prefill is held and the short call gets in before srpt-room
    would let it (counting the blocks the decode holds now gives srpt-room's schedule)."""
    room, _ = scene("srpt-room", decode_prompt=20, short_max=1396)
    drain, _ = scene("srpt-drain", decode_prompt=20, short_max=1396)
    assert drain["short"] < room["short"] - 0.5


def test_a_prefill_whose_chunk_finishes_it_is_not_held():
    """A 1250-token long prefill has 107 tokens left (more than half a step) when the short call
    (60 blocks to its end: more than the 3 free and the long one's 27 to lend, less with the
    decode's 84) is refused: its chunk finishes it, so it runs at once beside the decode, not after
    the decode's end."""
    got, steps = scene("srpt-drain", decode_prompt=260, short_max=200, long_left=128, long_tokens=1250)
    assert 64 < steps[0]["long"] <= 127 and "decode" in steps[0]
    assert got["long"] < got["short"]


def test_a_first_token_step_carries_no_chunk_of_a_prefill_that_does_not_finish():
    """With room for everyone (4000 blocks) the short call runs at once: under srpt-room the long
    prefill fills the rest of its step (the short call's first token waits for that chunk); under
    srpt-drain that step is the short call's only (the scene has no decode here)."""
    for policy, alone in (("srpt-room", False), ("srpt-drain", True)):
        sched, clock = make_sched(policy, blocks=4000, budget=128, seqs=8)
        sched.add_request(make_seq("long", list(range(1000, 2200)), 1))
        step(sched, clock, 128)
        sched.add_request(make_seq("short", list(range(3000, 3040)), 1))
        out = sched.schedule()
        got = {s.seq.request_id: s.num_new_tokens for s in out.scheduled}
        assert got == ({"short": 40} if alone else {"short": 40, "long": 88}), policy


def test_the_hold_follows_the_best_refused_key_of_the_step():
    """A second refused call, 1150 tokens (its key past the long prefill's deadline), arrives with
    the short one and is refused after it in srpt's order: the hold still follows the short call's
    earlier key, so the long prefill sits out the decode's steps (a later refusal that overwrote
    the key ran it beside the decode)."""
    sched, clock = make_sched("srpt-drain", blocks=400, budget=128, seqs=8)
    sched.add_request(make_seq("decode", list(range(300)), 76))
    while not sched.requests["decode"].num_output_tokens:
        step(sched, clock, 128)
    sched.add_request(make_seq("long", list(range(1000, 2200)), 1))
    step(sched, clock, 128)
    sched.add_request(make_seq("short", list(range(3000, 3040)), 1100))
    sched.add_request(make_seq("big", list(range(5000, 6150)), 10))
    out = sched.schedule()
    assert {s.seq.request_id: s.num_new_tokens for s in out.scheduled} == {"decode": 1}
    adm = sched.admission
    assert adm._deadline(sched.requests["long"], 1072, 128) < adm._waiting_key(sched.requests["big"], sched.kv, 128)
