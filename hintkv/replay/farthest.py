"""Belady's farthest-next-use eviction over int64 block ids, vectorized with numpy.

    idx = AccessIndex(accesses)                 # block hashes -> ids, next reads: once per order
    hits = idx.belady(capacity_blocks=52_000)   # per access: blocks of its prompt's leading run hit

The choice is the one `replay.oracle` documents (on a miss the resident block read farthest in
the future goes: never read again first; among equals the deepest of its access's blocks; then
the smallest hash), and it gives the same hits as the per-reference version it replaces (a
dictionary, a deque per hash and a heap entry per reference: ~8 minutes a pass over the whole
trace set at full scale). Here the per-reference work is numpy over arrays:

- ids: every distinct hash gets its rank in byte order, so "smallest hash" is "smallest id";
- next reads: all (block, access) touches sorted by block then access; a reverse running minimum
  over the reads, offset by each block's group so that it cannot cross into the next group,
  gives each touch the block's first read after it;
- eviction: resident blocks sit in buckets by next read (a heap of bucket keys finds the
  farthest); entries go stale when a block is touched again or evicted and are filtered when
  their bucket is reached. The never-read-again bucket is taken in any order (no later access
  reads those blocks, so which of them goes changes no hit); a finite bucket is ordered by
  (deepest, smallest id) each time it is reached.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence

import numpy as np


class _Ids(dict):
    """Block hash -> its id, ids given in first-seen order (`ids[h]` files an unseen `h`)."""

    def __missing__(self, h) -> int:
        j = self[h] = len(self)
        return j


class AccessIndex:
    """An access sequence as flat int arrays: for each access its prompt's ids (`prompt`,
    `p_off`), its distinct touched ids in depth order (prompt then written; `touch`, `t_off`)
    and, for each touch, the block's next read after it (`nxt`; `self.n` = never)."""

    def __init__(self, accesses: Sequence) -> None:
        ids = _Ids()
        prompt, touch = array("q"), array("q")  # 8 bytes an id (a list of ints: ~36)
        p_off, t_off, reads = [0], [0], []
        for a in accesses:
            p = list(map(ids.__getitem__, a.prompt))  # C-level; a new hash takes the next id
            prompt.extend(p)
            p_off.append(len(prompt))
            seen = set(p)
            touch.extend(p if len(seen) == len(p) else dict.fromkeys(p))
            reads.append(len(seen))
            w = a.written
            if w and w[:len(a.prompt)] == a.prompt:  # the usual case: the prompt's blocks, then more
                w = w[len(a.prompt):]
            for h in w:
                j = ids[h]
                if j not in seen:
                    seen.add(j)
                    touch.append(j)
            t_off.append(len(touch))
        self.n = len(accesses)
        self.num_ids = len(ids)
        rank = _byte_order_ranks(list(ids))
        self.prompt = rank[np.frombuffer(prompt, dtype=np.int64)] if prompt else np.zeros(0, np.int64)
        self.touch = rank[np.frombuffer(touch, dtype=np.int64)] if touch else np.zeros(0, np.int64)
        del prompt, touch
        self.p_off = np.asarray(p_off, dtype=np.int64)
        self.t_off = np.asarray(t_off, dtype=np.int64)
        self.prompt_tokens = np.asarray([a.prompt_tokens for a in accesses], dtype=np.int64)
        self.reads = np.asarray(reads, dtype=np.int64)  # each access's touches that are reads (first)
        self.nxt = self._next_reads()

    def _next_reads(self) -> np.ndarray:
        n, t = self.n, self.touch
        if not len(t):
            return np.zeros(0, np.int64)
        lens = np.diff(self.t_off)
        acc = np.repeat(np.arange(n, dtype=np.int64), lens)
        # a touch is a read when it lies in its access's prompt part (the first `reads` ids)
        is_read = np.arange(len(t), dtype=np.int64) - np.repeat(self.t_off[:-1], lens) < np.repeat(self.reads, lens)
        order = np.argsort(t, kind="stable")  # touches are in access order: (block, access) order
        blk = t[order]
        group = np.zeros(len(t), dtype=np.int64)
        np.cumsum(blk[1:] != blk[:-1], out=group[1:])
        del blk
        span = n + 1  # values of one group lie in [group * span, group * span + n]
        group *= span
        val = np.where(is_read[order], acc[order], n)
        del acc, is_read
        val += group
        # the first read strictly after each touch: the running minimum from the next touch on
        after = np.empty_like(val)
        after[:-1] = np.minimum.accumulate(val[::-1])[::-1][1:]
        after[-1] = np.iinfo(np.int64).max
        del val
        after -= group
        del group
        np.minimum(after, n, out=after)  # another group's value lands at >= n
        nxt = np.empty_like(after)
        nxt[order] = after
        return nxt

    def belady(self, capacity_blocks: int | None) -> np.ndarray:
        """Each access's prompt blocks hit (its leading resident run) under Belady at the
        capacity (None: unbounded, nothing is evicted)."""
        if capacity_blocks is not None:
            capacity_blocks = int(capacity_blocks)
            if capacity_blocks < 0:
                raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        n, never = self.n, self.n
        resident = np.zeros(self.num_ids, dtype=bool)
        key = np.full(self.num_ids, -1, dtype=np.int64)  # a resident block's next read
        depth = np.zeros(self.num_ids, dtype=np.int64)
        hits = np.zeros(n, dtype=np.int64)
        buckets: dict[int, list[np.ndarray]] = {}
        tops: list[int] = []  # -bucket key, one per non-empty bucket (a max-heap)
        count = 0
        for i in range(n):
            p = self.prompt[self.p_off[i]:self.p_off[i + 1]]
            if len(p):
                r = resident[p]
                hits[i] = len(p) if r.all() else int(np.argmin(r))
            blocks = self.touch[self.t_off[i]:self.t_off[i + 1]]
            if not len(blocks):
                continue
            keys = self.nxt[self.t_off[i]:self.t_off[i + 1]]
            count += len(blocks) - int(np.count_nonzero(resident[blocks]))
            resident[blocks] = True
            key[blocks] = keys
            depth[blocks] = np.arange(len(blocks))
            if capacity_blocks is None:
                continue
            buckets.pop(i, None)  # every block read at i was touched again just now
            for k, part in _by_key(keys, blocks):
                if k not in buckets:
                    buckets[k] = []
                    heapq.heappush(tops, -k)
                buckets[k].append(part)
            need = count - capacity_blocks
            while need > 0:
                k = -tops[0]
                if k not in buckets:  # read at an access already past
                    heapq.heappop(tops)
                    continue
                gone, rest = _take(buckets[k], need, k, k == never, resident, key, depth)
                count -= gone
                need -= gone
                if rest:
                    buckets[k] = rest
                else:
                    buckets.pop(k, None)
                    heapq.heappop(tops)
        return hits


def _by_key(keys: np.ndarray, blocks: np.ndarray):
    """(key, the blocks with that key) for each distinct key."""
    if keys[0] == keys[-1] and (keys == keys[0]).all():
        yield int(keys[0]), blocks
        return
    order = np.argsort(keys, kind="stable")
    ks, bs = keys[order], blocks[order]
    cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
    for lo, hi in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(ks)])), strict=True):
        yield int(ks[lo]), bs[lo:hi]


def _take(parts: list[np.ndarray], need: int, k: int, any_order: bool, resident: np.ndarray,
          key: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Evicts up to `need` blocks of bucket `k` (its still-valid entries: resident with key k);
    returns how many went and what the bucket keeps."""
    if any_order:  # nothing reads these again: take parts from the front as they are
        got = 0
        while parts and got < need:
            part = parts.pop(0)
            valid = np.unique(part[resident[part] & (key[part] == k)])
            use = valid[:need - got]
            resident[use] = False  # before the next part: a block can sit in two parts
            got += len(use)
            if len(use) < len(valid):
                parts.insert(0, valid[len(use):])
        return got, parts
    arr = np.concatenate(parts) if len(parts) > 1 else parts[0]
    valid = np.unique(arr[resident[arr] & (key[arr] == k)])  # ascending id: the hash tie-break
    valid = valid[np.argsort(-depth[valid], kind="stable")]  # deepest first, then smallest id
    resident[valid[:need]] = False
    return min(need, len(valid)), ([valid[need:]] if len(valid) > need else [])


def _byte_order_ranks(keys: list[bytes]) -> np.ndarray:
    """rank[i]: the place of keys[i] among all keys in byte order."""
    n = len(keys)
    rank = np.empty(n, dtype=np.int64)
    if n and all(len(k) == 16 for k in keys):  # block hashes: two big-endian words, sorted by numpy
        words = np.frombuffer(b"".join(keys), dtype=">u8").reshape(n, 2)
        order = np.lexsort((words[:, 1], words[:, 0]))
    else:
        order = np.asarray(sorted(range(n), key=keys.__getitem__), dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    return rank
