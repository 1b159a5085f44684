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
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

NEVER = float("inf")


@dataclass(frozen=True, slots=True)
class OracleResult:
    prompt_tokens: int
    hit_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def belady(accesses: Sequence, capacity_blocks: int | None, block_size: int) -> OracleResult:
    """Accesses: objects with `prompt` (block hashes read, in chain order), `prompt_tokens` and
    `written` (block hashes held after the request)."""
    reads: dict[bytes, deque[int]] = defaultdict(deque)
    for i, a in enumerate(accesses):
        for h in a.prompt:
            reads[h].append(i)
    resident: dict[bytes, float] = {}  # hash -> its next read (the heap's key for it)
    depth: dict[bytes, int] = {}
    heap: list[tuple[float, int, bytes]] = []  # (-next read, -depth, hash), lazily invalidated
    hit_tokens = prompt_tokens = 0

    def next_read(h: bytes, after: int) -> float:
        q = reads.get(h)
        while q and q[0] <= after:
            q.popleft()
        return q[0] if q else NEVER

    for i, a in enumerate(accesses):
        prompt_tokens += a.prompt_tokens
        run = 0
        for h in a.prompt:
            if h not in resident:
                break
            run += 1
        hit_tokens += run * block_size
        for d, h in enumerate(_unique(a.prompt, a.written)):
            nxt = next_read(h, i)
            resident[h] = nxt
            depth[h] = d
            heapq.heappush(heap, (-nxt, -d, h))
        if capacity_blocks is not None:
            while len(resident) > capacity_blocks:
                neg, negd, h = heapq.heappop(heap)
                if resident.get(h) == -neg and depth.get(h) == -negd:
                    del resident[h]
    return OracleResult(prompt_tokens, hit_tokens)


def _unique(*lists: list[bytes]) -> list[bytes]:
    seen: set[bytes] = set()
    out = []
    for lst in lists:
        for h in lst:
            if h not in seen:
                seen.add(h)
                out.append(h)
    return out
