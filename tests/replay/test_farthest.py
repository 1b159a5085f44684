"""`replay.belady` (numpy over int ids, `replay.farthest`) gives the same hits, access by access,
as the per-reference version it replaced (kept here as `reference_belady`), on hand-checked and
random access sequences: agent-like chains (sessions growing their prompts, a shared system
prefix, forks, completions written beyond the prompt) and unstructured ones (repeats, any order)."""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from hashlib import blake2b

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.replay import belady
from hintkv.replay.farthest import AccessIndex
from hintkv.replay.oracle import OracleResult

NEVER = float("inf")


@dataclass
class A:
    prompt: list
    written: list = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt) * 10 + 3


def reference_belady(accesses: Sequence, capacity_blocks: int | None, block_size: int) -> OracleResult:
    """The per-reference Belady `replay.oracle.belady` was until the fourteenth session (a dict, a
    deque per hash, a heap entry per reference), kept as the reference for the numpy one."""
    reads: dict[bytes, deque[int]] = defaultdict(deque)
    for i, a in enumerate(accesses):
        for h in a.prompt:
            reads[h].append(i)
    resident: dict[bytes, float] = {}  # hash -> its next read (the heap's key for it)
    depth: dict[bytes, int] = {}
    heap: list[tuple[float, int, bytes]] = []  # (-next read, -depth, hash), lazily invalidated
    hit_tokens = prompt_tokens = 0
    per: list[int] = []

    for i, a in enumerate(accesses):
        prompt_tokens += a.prompt_tokens
        per.append(_resident_run(a.prompt, resident) * block_size)
        hit_tokens += per[-1]
        for d, h in enumerate(_unique(a.prompt, a.written)):
            nxt = _next_read(reads, h, i)
            resident[h] = nxt
            depth[h] = d
            if capacity_blocks is not None:  # unbounded: nothing is ever evicted
                heapq.heappush(heap, (-nxt, -d, h))
        if capacity_blocks is not None:
            while len(resident) > capacity_blocks:
                neg, negd, h = heapq.heappop(heap)
                if resident.get(h) == -neg and depth.get(h) == -negd:
                    del resident[h]
    return OracleResult(prompt_tokens, hit_tokens, tuple(per))


# the reference's helpers are copies of replay.oracle's on purpose: a frozen reference must not move
# with the code under test (do not fold them into hintkv.replay.oracle's)
def _next_read(reads: dict[bytes, deque[int]], h: bytes, after: int) -> float:
    q = reads.get(h)
    while q and q[0] <= after:
        q.popleft()
    return q[0] if q else NEVER


def _resident_run(prompt: list[bytes], resident: dict[bytes, float]) -> int:
    run = 0
    for h in prompt:
        if h not in resident:
            break
        run += 1
    return run


def _unique(*lists: list[bytes]) -> list[bytes]:
    seen: set[bytes] = set()
    out = []
    for lst in lists:
        for h in lst:
            if h not in seen:
                seen.add(h)
                out.append(h)
    return out


def _same(accesses: list[A], capacity: int | None) -> None:
    want = reference_belady(accesses, capacity, 10)
    got = belady(accesses, capacity, 10)
    assert got.access_hit_tokens == want.access_hit_tokens, capacity
    assert (got.hit_tokens, got.prompt_tokens) == (want.hit_tokens, want.prompt_tokens)


def _h(*parts) -> bytes:
    return blake2b(repr(parts).encode(), digest_size=16).digest()


def test_hand_checked_sequences_give_the_same_hits():
    seqs = [
        [A([b"a"], [b"a"]), A([b"b"], [b"b"]), A([b"a"], [b"a"]), A([b"c"], [b"c"]), A([b"a"], [b"a"]),
         A([b"b"], [b"b"])],
        [A([b"x1", b"x2", b"x3"], [b"x1", b"x2", b"x3"]), A([b"y"], [b"y"]), A([b"x1", b"x2", b"x3"], [])],
        # ties on (next read, depth): p at depth 0 of access 0 and q at depth 0 of access 1 are
        # both read next at 3; the smaller hash goes
        [A([b"p"]), A([b"q"]), A([b"z"]), A([b"q", b"p"])],
        [A([b"q"]), A([b"p"]), A([b"z"]), A([b"p", b"q"])],
        # a prompt that repeats a block, a written list that starts elsewhere
        [A([b"a", b"a", b"b"], [b"c", b"a"]), A([b"c", b"a"], [b"c"]), A([b"a", b"b", b"c"], [])],
        [],
        [A([]), A([b"a"], [b"a"]), A([], [b"b"]), A([b"a", b"b"])],
        # a write is not a read: x, written at 1 and 2 and never read, goes before y (read at 3)
        [A([b"y"]), A([], [b"x"]), A([], [b"x"]), A([b"y"])],
    ]
    for seq in seqs:
        for cap in (None, 0, 1, 2, 3, 5):
            _same(seq, cap)


def test_the_tie_break_shows_in_the_hits():
    """Belady's choice among blocks with the same next read and depth decides hits, so the id
    order must be the hash order: p and q are both read next at access 2 (depth 0 each); capacity
    1 evicts the smaller hash, p, so access 2 (q, p) hits q and (p, q) hits nothing, whichever
    came first."""
    assert belady([A([b"p"]), A([b"q"]), A([b"q", b"p"])], 1, 10).access_hit_tokens == (0, 0, 10)
    assert belady([A([b"p"]), A([b"q"]), A([b"p", b"q"])], 1, 10).access_hit_tokens == (0, 0, 0)
    assert belady([A([b"q"]), A([b"p"]), A([b"p", b"q"])], 1, 10).access_hit_tokens == (0, 0, 0)


_session_ops = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5), st.integers(0, 3), st.booleans()),
                        min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=_session_ops, system=st.integers(0, 4), salt=st.integers(0, 10**6),
       caps=st.lists(st.integers(0, 40), min_size=1, max_size=3))
def test_agent_like_chains_give_the_same_hits(ops, system, salt, caps):
    """Sessions grow a chain (after a shared system prefix), some fork from another session's
    chain, each call writes its prompt and a few completion blocks; 16-byte hashes."""
    chains: dict[int, list[bytes]] = {}
    accesses = []
    for n, (sid, grow, completion, fork) in enumerate(ops):
        if sid not in chains:
            src = chains.get((sid + 1) % 5) if fork else None
            chains[sid] = list(src) if src else [_h(salt, "sys", j) for j in range(system)]
        chain = chains[sid]
        chain += [_h(salt, sid, n, j) for j in range(grow)]
        written = chain + [_h(salt, sid, n, "out", j) for j in range(completion)]
        accesses.append(A(list(chain), written))
        chain += written[len(chain):]  # the next call reads this one's completion
    for cap in [*caps, None]:
        _same(accesses, cap)


@settings(max_examples=150, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 9), max_size=6), max_size=25),
       extra=st.lists(st.lists(st.integers(0, 12), max_size=3), max_size=25),
       cap=st.integers(0, 12))
def test_unstructured_sequences_give_the_same_hits(prompts, extra, cap):
    """Any blocks in any order, repeats inside a prompt, short hashes (the sorted() id path)."""
    names = [bytes([65 + k]) * (1 + k % 3) for k in range(13)]
    accesses = [A([names[k] for k in p], [names[k] for k in (p + (extra[i] if i < len(extra) else []))])
                for i, p in enumerate(prompts)]
    _same(accesses, cap)
    _same(accesses, None)


def test_a_capacity_is_a_whole_number_of_blocks():
    idx = AccessIndex([A([b"a"]), A([b"a"])])
    assert tuple(idx.belady(1.0).tolist()) == (0, 1)
    with pytest.raises(ValueError):
        idx.belady(-1)


def test_one_index_serves_every_capacity():
    accesses = [A([_h(s, j) for j in range(1 + (n % 7))], []) for n in range(60) for s in (n % 4,)]
    idx = AccessIndex(accesses)
    for cap in (0, 3, 7, 20, None):
        assert tuple((idx.belady(cap) * 10).tolist()) == reference_belady(accesses, cap, 10).access_hit_tokens


@pytest.mark.parametrize("cap", [1, 4])
def test_a_bucket_evicted_a_few_at_a_time_gives_the_same_hits(cap):
    """Blocks read next at the same far access are evicted a few at a time across accesses, each
    time the deepest (then smallest hash) of what the bucket still holds."""
    far = [_h("far", j) for j in range(6)]
    accesses = [A(list(far), list(far))] + [A([_h("one", n)], [_h("one", n)]) for n in range(8)]
    accesses.append(A(list(far), []))
    _same(accesses, cap + 6)
    _same(accesses, cap)
