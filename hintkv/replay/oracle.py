"""Belady's optimal eviction over a replay's block accesses: what any policy could have hit.

    oracle_hit_tokens(result.accesses, capacity_blocks=800, block_size=16)

The access sequence is the one a replay produced (`OfflineResult.accesses`, in admission order):
each request reads its prompt's full blocks (its hit is their leading resident run: prefix
caching) and then holds every block it computed or read, prompt and completion. On a miss the
oracle evicts the resident block whose next read is farthest in the future (never read again
first; among equals the deepest block of its chain, so a chain is cut from its tail).

Why this is the optimum for prefix hits: a block's hash chains its whole prefix, so every read
of a block is also a read of all its ancestors at the same moment; their next use is never later
than the block's, so farthest-next-use keeps resident sets prefix-closed and block hits are
prefix hits. It is a bound, not a schedule: it ignores that running requests pin their blocks
and that admission order depends on the policy. With a host tier the bound is the same oracle
at device + host capacity (a hit anywhere in the two levels; no two-level placement can hold
more distinct blocks), the "documented bound" of issue 8. `capacity=None` is the ideal
(unbounded) hit rate.

`belady_pinned` is the same choice under the engine's constraints the plain oracle ignores: a
running request's blocks stay resident from its admission to its end (`Access.ended_before`),
so only blocks no running request holds can be evicted; and a running request holds every device
block the offline replay gave it (`Access.footprint`; the replay reserves prompt + max_tokens at
admission, the live engine grows block by block), its partial last block included: no hash names
that one and no later prompt reads it, so the named blocks alone undercount the engine's use (by
one block a running request: 4-5% of the quick workload's 21-23-block device). When pins alone
exceed the capacity it
lets the set overflow (the engine would have made the request wait): optimistic there. It is a
reference for what a policy can win with the replay's own schedule, not a proven optimum (with
prefix hits and pins, farthest-next-use is a heuristic).
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from hintkv.replay.farthest import AccessIndex

NEVER = float("inf")


@dataclass(frozen=True, slots=True)
class OracleResult:
    prompt_tokens: int
    hit_tokens: int
    # each access's hit tokens, in access order (`belady` only; the sim's per-call TTFT bound)
    access_hit_tokens: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def belady(accesses: Sequence, capacity_blocks: int | None, block_size: int) -> OracleResult:
    """Accesses: objects with `prompt` (block hashes read, in chain order), `prompt_tokens` and
    `written` (block hashes held after the request). Over int ids with numpy (`replay.farthest`)."""
    return belady_at(AccessIndex(accesses), capacity_blocks, block_size)


def belady_at(index: AccessIndex, capacity_blocks: int | None, block_size: int) -> OracleResult:
    """`belady` on an access order already indexed (several capacities share one index)."""
    hits = index.belady(capacity_blocks) * block_size
    return OracleResult(int(index.prompt_tokens.sum()), int(hits.sum()), tuple(hits.tolist()))


def belady_pinned(accesses: Sequence, capacity_blocks: int, block_size: int) -> OracleResult:
    """Farthest-next-use eviction among blocks no running request pins (see the module doc)."""
    n = len(accesses)
    reads: dict[bytes, deque[int]] = defaultdict(deque)
    ends: dict[int, list[int]] = defaultdict(list)  # admission index -> requests that ended before it
    for i, a in enumerate(accesses):
        for h in a.prompt:
            reads[h].append(i)
        if 0 <= a.ended_before < n:
            ends[a.ended_before].append(i)
    resident: dict[bytes, float] = {}
    depth: dict[bytes, int] = {}
    pins: dict[bytes, int] = defaultdict(int)
    heap: list[tuple[float, int, bytes]] = []  # unpinned resident blocks, lazily invalidated
    pinned_by: dict[int, list[bytes]] = {}
    unnamed: dict[int, int] = {}  # running request -> device blocks it holds beyond its named ones
    num_unnamed = 0
    hit_tokens = prompt_tokens = 0

    for i, a in enumerate(accesses):
        for j in ends.pop(i, ()):
            num_unnamed -= unnamed.pop(j, 0)
            for h in pinned_by.pop(j, ()):
                pins[h] -= 1
                if not pins[h] and h in resident:
                    heapq.heappush(heap, (-resident[h], -depth[h], h))
        prompt_tokens += a.prompt_tokens
        hit_tokens += _resident_run(a.prompt, resident) * block_size
        blocks = _unique(a.prompt, a.written)
        for d, h in enumerate(blocks):
            resident[h] = _next_read(reads, h, i)
            depth[h] = d
            pins[h] += 1
        if a.ended_before >= 0:
            pinned_by[i] = blocks
            if getattr(a, "footprint", 0) > len(blocks):
                unnamed[i] = a.footprint - len(blocks)
                num_unnamed += unnamed[i]
        else:  # never ran: pins nothing
            for h in blocks:
                pins[h] -= 1
                if not pins[h]:
                    heapq.heappush(heap, (-resident[h], -depth[h], h))
        while len(resident) > capacity_blocks - num_unnamed and heap:
            neg, negd, h = heapq.heappop(heap)
            if resident.get(h) == -neg and depth.get(h) == -negd and not pins[h]:
                del resident[h]
    return OracleResult(prompt_tokens, hit_tokens)


def peak_live_blocks(accesses: Sequence) -> int:
    """The most blocks that are, at one moment, already computed and read again later: what any
    two-level placement must hold somewhere (device or host) to reach the ideal hit rate. So
    `max(0, peak_live_blocks - device_blocks)` bounds from below the peak host blocks of ANY
    policy at the ideal hit rate (the peak-host goal's reachable reduction)."""
    first: dict[bytes, int] = {}
    last: dict[bytes, int] = {}
    for i, a in enumerate(accesses):
        for h in a.prompt:
            if h in first:
                last[h] = i
        for h in _unique(a.prompt, a.written):
            first.setdefault(h, i)
    delta: dict[int, int] = defaultdict(int)  # live from its first appearance until its last read
    for h, j in last.items():
        if j > first[h]:
            delta[first[h]] += 1
            delta[j] -= 1
    live = peak = 0
    for i in sorted(delta):
        live += delta[i]
        peak = max(peak, live)
    return peak


def _next_read(reads: dict[bytes, deque[int]], h: bytes, after: int) -> float:
    """The first read of `h` after access `after` (consumes the earlier ones)."""
    q = reads.get(h)
    while q and q[0] <= after:
        q.popleft()
    return q[0] if q else NEVER


def _resident_run(prompt: list[bytes], resident: dict[bytes, float]) -> int:
    """How many of the prompt's chain blocks, from its head, are resident."""
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
