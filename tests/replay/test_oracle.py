"""Belady's oracle on hand-checked sequences, and never below what the real cache code hits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hintkv.replay import OfflineConfig, belady, belady_pinned, replay_offline
from hintkv.replay.oracle import peak_live_blocks
from hintkv.workload.traces import Scale
from hintkv.workload.users import build_workload

TRACES = Path("/work/shared/traces")
if not TRACES.exists():
    TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


@dataclass
class A:
    prompt: list
    written: list = field(default_factory=list)
    ended_before: int = -1
    footprint: int = 0

    @property
    def prompt_tokens(self) -> int:
        return max(1, len(self.prompt)) * 10


def _seq(*prompts: str) -> list[A]:
    """Single-block prompts named by letters; each writes its own block."""
    return [A([p.encode()], [p.encode()]) for p in prompts]


def test_belady_hand_checked():
    # capacity 2: a b a c a b
    #   a miss {a}; b miss {a,b}; a hit; c miss: c is never read again, so it is the one that
    #   goes (a is next read at 4, b at 5) {a,b}; a hit; b hit -> 3 hits.
    #   LRU: c pushes b out ({a,c}); a hit; b miss -> 2 hits.
    r = belady(_seq("a", "b", "a", "c", "a", "b"), 2, 10)
    assert r.hit_tokens == 30 and r.prompt_tokens == 60
    # capacity 1: a a b a a -> b is dropped at once (never read again): a hits 3 times
    assert belady(_seq("a", "a", "b", "a", "a"), 1, 10).hit_tokens == 30
    # capacity 1: a b a b -> at b, a (read next at 2) stays and b (at 3) goes: a hits once
    assert belady(_seq("a", "b", "a", "b"), 1, 10).hit_tokens == 10
    # unbounded: every read after the first of its block hits
    assert belady(_seq("a", "b", "a", "c", "a", "b"), None, 10).hit_tokens == 30


def test_peak_live_blocks_hand_checked():
    # a b a c b a: a is live 0..5, b 1..4, c never read again -> at most 2 live at once
    assert peak_live_blocks(_seq("a", "b", "a", "c", "b", "a")) == 2
    # a b c a b c: all three are computed and read again at index 2 -> 3
    assert peak_live_blocks(_seq("a", "b", "c", "a", "b", "c")) == 3
    # nothing read twice: nothing has to be kept anywhere
    assert peak_live_blocks(_seq("a", "b", "c")) == 0
    # it bounds the oracle: at a capacity of the peak, Belady reaches the ideal hit rate
    seq = _seq("a", "b", "c", "a", "d", "b", "c", "a")
    assert belady(seq, peak_live_blocks(seq), 10).hit_tokens == belady(seq, None, 10).hit_tokens


def test_belady_cuts_chains_from_the_tail():
    # a chain x1 <- x2 <- x3 read twice with capacity 2: keep x1, x2 (prefix) not x2, x3
    chain = [b"x1", b"x2", b"x3"]
    accesses = [A(chain, chain), A([b"y"], [b"y"]), A(chain, chain)]
    r = belady(accesses, 3, 10)
    # after y (capacity 3): y never read again is evicted first, x1..x3 stay -> 3 blocks hit
    assert r.hit_tokens == 30
    r = belady(accesses, 2, 10)
    assert r.hit_tokens == 20  # x1, x2: the leading run


def test_pinned_oracle_keeps_running_requests_blocks():
    # capacity 2: a (runs until c is admitted), b, a, c, b.
    #   plain: at b, a is read at 2, b at 4: both fit; at c: c never read again -> goes; b hits.
    #   3 reads of a/b after their first: a hit, b hit -> 20 tokens.
    #   pinned: a runs until c's admission (ended_before 3) and b until a's (2); at c (a's pin
    #   released first) c itself is pinned by its run (until the end), so a or b must go: b (read
    #   at 4) is kept over a (never read again) -> b hits; a at 2 hits too -> 20 tokens.
    seq = [A([b"a"], [b"a"], 3), A([b"b"], [b"b"], 2), A([b"a"], [b"a"], 3), A([b"c"], [b"c"], 5),
           A([b"b"], [b"b"], 5)]
    assert belady(seq, 2, 10).hit_tokens == 20
    assert belady_pinned(seq, 2, 10).hit_tokens == 20
    # capacity 1: a runs while b runs (overflow: both pinned) and b is still running at a's
    # second read; the plain oracle drops b at once (never read again) and hits a.
    seq = [A([b"a"], [b"a"], 3), A([b"b"], [b"b"], 3), A([b"a"], [b"a"], 3)]
    assert belady(seq, 1, 10).hit_tokens == 10
    assert belady_pinned(seq, 1, 10).hit_tokens == 10  # overflow is allowed: a stays
    # capacity 1, b pinned past a's re-read and admitted after a ended: a is the only unpinned
    # block when b arrives, so it goes, and its re-read misses (the plain oracle keeps a).
    seq = [A([b"a"], [b"a"], 1), A([b"b"], [b"b"], 3), A([b"a"], [b"a"], 3)]
    assert belady(seq, 1, 10).hit_tokens == 10
    assert belady_pinned(seq, 1, 10).hit_tokens == 0


def test_pinned_oracle_holds_the_device_blocks_the_engine_held():
    """A running request holds its partial last block too (`Access.footprint`): no hash names it
    and no prompt reads it, but it takes a device block until the request ends, as in the engine.
    Capacity 2: a runs alone and ends; b runs with a partial block (footprint 2), so beside b's
    block only its partial one fits: a (unpinned) must go and its re-read misses. Counting only
    named blocks, a and b fit and a hits."""
    seq = [A([b"a"], [b"a"], 1, footprint=2), A([b"b"], [b"b"], 3, footprint=2), A([b"a"], [b"a"], 3)]
    assert belady_pinned(seq, 2, 10).hit_tokens == 0
    named = [A(x.prompt, x.written, x.ended_before) for x in seq]
    assert belady_pinned(named, 2, 10).hit_tokens == 10
    # the partial block goes when its request ends: capacity 3, b (with a partial block) ends
    # before c runs, so a, b and c fit and both re-reads hit (held on, b would go at c: 10 tokens)
    seq = [A([b"a"], [b"a"], 1), A([b"b"], [b"b"], 2, footprint=2), A([b"c"], [b"c"], 5), A([b"a"], [b"a"], 5),
           A([b"b"], [b"b"], 5)]
    assert belady_pinned(seq, 3, 10).hit_tokens == 20
    seq = [A([b"a"], [b"a"], 1, footprint=2), A([b"b"], [b"b"], 2, footprint=1), A([b"a"], [b"a"], 4)]
    assert belady_pinned(seq, 2, 10).hit_tokens == 10  # b has no partial block: a and b fit


@pytest.fixture(scope="module")
def small():
    return build_workload("swe-agent", TRACES / "swe-agent", 3, scale=Scale(0.0625, max_calls=8), seed=3)


@pytest.mark.skipif(not TRACES.exists(), reason="shared/traces not present")
@pytest.mark.parametrize("frac", [0.2, 0.5, 1.0])
def test_oracle_never_below_lru_or_sam(small, frac):
    memo: dict = {}
    inf = replay_offline(small, OfflineConfig(policy="sam", hints=True, device_blocks=10**6), memo)
    ideal = belady(inf.accesses, None, 16)
    # unbounded: the cache code hits everything, less prefixes still being computed by a
    # concurrent request (the oracle counts a prompt's blocks as there from its admission)
    assert inf.hit_rate <= ideal.hit_rate <= inf.hit_rate + 0.01
    device = max(8, int(inf.peak_held_blocks * frac))
    for policy, hints in (("lru", False), ("sam", True), ("qlru", False)):
        for host in (0, 4 * device):
            cfg = OfflineConfig(policy=policy, hints=hints, device_blocks=device, host_blocks=host)
            run = replay_offline(small, cfg, memo, check_every=25)
            oracle = belady(run.accesses, device + host, 16)
            assert oracle.prompt_tokens == run.prompt_tokens
            assert all(a.ended_before >= i + 1 or not a.prompt for i, a in enumerate(run.accesses))
            pinned = belady_pinned(run.accesses, device + host, 16)
            assert pinned.prompt_tokens == run.prompt_tokens and pinned.hit_tokens <= ideal.hit_tokens
            # the headroom goal's reference is a bound: no run beats the pinned oracle on its own schedule
            assert run.hit_tokens <= pinned.hit_tokens, (policy, host)
            assert run.hit_tokens <= oracle.hit_tokens <= ideal.hit_tokens, (policy, host)
