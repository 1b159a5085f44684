"""The KV cache manager: prefix matching, block allocation and release for sequences.

The scheduler sees it through ask-then-act pairs (`can_admit`/`admit`, `can_append`/`append`)
and a small `PrefixMatch` result; it never touches the block pool's internals.

A sequence's block table, for one step:

    | matched (cached) | computed earlier | new this step | (unallocated) |

With lower tiers (`tiers`, a `TierConnector`), a prefix continues below the device: admission also
allocates blocks for the run found in host/disk and starts loading it (after the blocks a
prefetch is already bringing up, which it takes over: `in_flight`);

    | matched (device) | in flight (adopted) | loading (host/disk) | (rest: computed once the load lands) |

the scheduler keeps the sequence aside until `load_ready`, then `finish_load` advances it over
the blocks that arrived (a failed block truncates the run there: the rest is recomputed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import takewhile
from operator import attrgetter, countOf
from typing import TYPE_CHECKING

from hintkv.cache.block import Block
from hintkv.cache.block_pool import BlockPool
from hintkv.cache.hashing import BlockHash, hash_block, hash_blocks
from hintkv.cache.policies import EvictionPolicy
from hintkv.cache.types import KVSequence

if TYPE_CHECKING:
    from hintkv.cache.tier_connector import TierConnector

_ref_cnt = attrgetter("ref_cnt")


@dataclass(slots=True)
class PrefixMatch:
    blocks: list[Block] = field(default_factory=list)  # device blocks holding the prefix
    num_tokens: int = 0  # tokens of KV they hold
    lower: list[BlockHash] = field(default_factory=list)  # the next blocks, held below: load them
    lower_tiers: list[str] = field(default_factory=list)  # where each of `lower` was found
    # (`BlockPool.ref_epoch`, how many of `blocks` are unreferenced) when `free_room` last counted:
    # a cache, not part of the match (no equality, no repr)
    unreferenced: tuple[int, int] = field(default=(-1, 0), compare=False, repr=False)
    # blocks after `blocks` that prefetches are bringing up: the request takes them over as the
    # first of `lower` (`TierLoads.adopt`); they hold device blocks already, so need no room
    in_flight: int = 0

    @property
    def num_held(self) -> int:
        """Blocks of the prefix the request needs no new room for: matched, or in flight to it."""
        return len(self.blocks) + self.in_flight

    @property
    def num_adopted(self) -> int:
        """The in-flight blocks `admit` takes over: `lower` leads with them (none once the
        scheduler dropped `lower` to compute the prefix instead)."""
        return min(self.in_flight, len(self.lower))


@dataclass(slots=True)
class _DeviceRun:
    """A waiting request's device prefix run, as of the pool's unindex log at (epoch, seen)."""

    epoch: int
    seen: int
    blocks: list[Block]
    prefix: set[BlockHash] | None = None  # the hashes of `blocks` (built when asked again)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, policy: EvictionPolicy) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, policy)
        self.ranking = self.pool.ranking  # session classes -> block classes (cache.ranking)
        self.prefix_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hit_tokens = 0  # of which found (device hits + blocks loaded from below)
        self.hit_tokens_by_tier: dict[str, int] = {"device": 0}  # first admissions only
        self.tiers: TierConnector | None = None  # lower tiers (host, disk), when configured
        self._runs: dict[str, _DeviceRun] = {}  # waiting request id -> its device prefix run

    # ---- hashing -------------------------------------------------------------------------
    def update_hashes(self, seq: KVSequence, upto: int) -> list[BlockHash]:
        """Extend `seq.block_hashes` over the full blocks of its first `upto` tokens."""
        bs = self.block_size
        n_full = upto // bs
        hashes = seq.block_hashes
        have = len(hashes)
        if n_full == have + 1:  # a decode step filled one block
            hashes.append(hash_block(hashes[-1] if have else seq.root_hash,
                                     seq.token_ids[have * bs:n_full * bs]))
        elif n_full > have:
            parent = hashes[-1] if have else None
            hashes.extend(hash_blocks(seq.root_hash, seq.token_ids, bs, start=have, parent=parent,
                                      end=n_full))
        return hashes

    # ---- admission -----------------------------------------------------------------------
    def match_prefix(self, seq: KVSequence, keep: bool = False, lower: bool = True) -> PrefixMatch:
        """Longest run of cached device blocks at the start of the prompt, then (`lower`) the
        run after it that lower tiers hold and that is worth loading (`match_lower`). Pure.

        At most num_tokens - 1 tokens can hit: the last prompt token must run to give logits.
        `keep` (the scheduler's waiting queue): the device run is kept for the next call
        (`device_run`) until the sequence is admitted or freed.
        """
        hashes = self.update_hashes(seq, seq.num_tokens - 1)
        blocks = self.device_run(seq.request_id, hashes) if keep else self.pool.leading_run(hashes)
        match = PrefixMatch(blocks, len(blocks) * self.block_size)
        if self.tiers is not None and len(blocks) < len(hashes):
            match.in_flight = self.tiers.in_flight_run(hashes[len(blocks):])
        if lower:
            self.match_lower(seq, match)
        return match

    def match_lower(self, seq: KVSequence, match: PrefixMatch, loadable: bool = False) -> None:
        """Fill `match.lower` / `lower_tiers`: the tiers' plan for the blocks after the device
        run. The scheduler asks only for a candidate that has room (a waiting request that does
        not fit is not re-planned every step: that was 69% of a stalled 100-user simulation).
        `loadable` (the scheduler, which drops a run it cannot load): a run longer than the
        device's free blocks can hold is left empty, and planning stops one block past that
        room (a stalled queue's head was re-planned over its whole host run every step). The
        blocks a prefetch is bringing up right after the device run (`in_flight`) lead
        `lower`: the request takes that transfer over (no second copy, no wait in the queue);
        its own plan after them stops at the first block another prefetch is bringing up or
        whose prefetch failed or timed out lately (`TierLoads.held_up`: computed, not waited
        for a second time on a hung tier)."""
        hashes = self.update_hashes(seq, seq.num_tokens - 1)
        n = len(match.blocks)
        if self.tiers is None or n >= len(hashes):
            return
        if not loadable:
            match.lower_tiers = self.tiers.plan(hashes[n:])
        else:  # a plan of at most room + 1 blocks is the full plan when that fits, else too long
            k = match.in_flight = self.tiers.in_flight_run(hashes[n:])
            room = self.free_room(match)
            held_up = self.tiers.held_up
            ahead = hashes[n + k:n + k + room + 1] if room > 0 else []
            todo = list(takewhile(lambda h: not held_up(h), ahead))
            tiers = self.tiers.plan(todo) if todo else []
            own = tiers if len(tiers) <= room else []
            match.lower_tiers = self.tiers.in_flight_tiers(hashes[n:n + k]) + own
        match.lower = hashes[n:n + len(match.lower_tiers)]

    def device_run(self, key: str, hashes: list[BlockHash]) -> list[Block]:
        """`BlockPool.leading_run(hashes)` for a waiting request `key`, kept between calls: a
        request waiting for room is matched again every step, and a 100K-token prompt's run is
        thousands of lookups (80-91% of a stalled 100-user simulation, py-spy). The kept run
        stays valid until one of its hashes leaves the index (the pool's unindex log, read
        since the last call: O(blocks unindexed since)); it grows only at its end (one lookup
        when nothing was registered there). Dropped on `admit` and `free`."""
        pool = self.pool
        run = self._runs.get(key)
        if run is not None:
            gone = pool.unindexed_since(run.epoch, run.seen)
            if gone:
                if run.prefix is None:  # asked a second time: it is waiting (a set pays now)
                    run.prefix = set(hashes[:len(run.blocks)])
                if not run.prefix.isdisjoint(gone):
                    run = None  # part of it left the index: look again from the start
            elif gone is None:
                run = None
        if run is None:
            blocks = pool.leading_run(hashes)
            self._runs[key] = _DeviceRun(*pool.unindex_mark, blocks)
            return list(blocks)
        run.epoch, run.seen = pool.unindex_mark
        n = len(run.blocks)
        if n < len(hashes) and pool.lookup(hashes[n]) is not None:
            more = pool.leading_run(hashes[n:])
            run.blocks.extend(more)
            if run.prefix is not None:
                run.prefix.update(hashes[n:n + len(more)])
        return list(run.blocks)

    def _blocks_needed(self, seq: KVSequence, num_tokens_after: int, have: int) -> int:
        return max(0, -(-num_tokens_after // self.block_size) - have)

    def can_admit(self, seq: KVSequence, match: PrefixMatch, num_new_tokens: int) -> bool:
        """Room for the matched prefix, its lower-tier run, and `num_new_tokens` after them."""
        upto = match.num_tokens + len(match.lower) * self.block_size + num_new_tokens
        need = self._blocks_needed(seq, upto, len(match.blocks) + match.num_adopted)
        return need <= self.free_room(match)

    def free_room(self, match: PrefixMatch) -> int:
        """Free device blocks for `match`'s request: the free ones less its matched blocks that sit
        among them (cached, unreferenced: admitting it takes them out of the free set)."""
        pool = self.pool
        epoch, n = match.unreferenced
        if epoch != pool.ref_epoch:  # a step asks 2-3 times per candidate (room, plan, can_admit):
            # count once while no reference changed (11.2% of a 64-instance simulation counting each);
            # the epoch read before the count: a write during it leaves the count stale, not kept
            epoch = pool.ref_epoch
            n = countOf(map(_ref_cnt, match.blocks), 0)
            match.unreferenced = (epoch, n)
        return pool.num_free - n

    def admit(self, seq: KVSequence, match: PrefixMatch, num_new_tokens: int) -> bool:
        """Take the blocks; start loading the lower-tier run if any. True: the sequence must
        wait for `load_ready` (it computes nothing until `finish_load`)."""
        upto = match.num_tokens + len(match.lower) * self.block_size + num_new_tokens
        k = match.num_adopted
        need = self._blocks_needed(seq, upto, len(match.blocks) + k)
        self._runs.pop(seq.request_id, None)
        self.pool.touch(match.blocks)
        adopted = self.tiers.adopt(seq.request_id, match.lower[:k]) if k else []
        seq.block_table = list(match.blocks) + adopted + self.pool.allocate(need)
        seq.num_computed_tokens = match.num_tokens
        seq.num_registered_blocks = len(match.blocks)
        first = not seq.admitted_once
        if first:
            seq.admitted_once = True
            seq.num_cached_tokens = match.num_tokens
            self.prefix_query_tokens += seq.num_prompt_tokens
            self.prefix_hit_tokens += match.num_tokens
            self.hit_tokens_by_tier["device"] += match.num_tokens
        if not match.lower:
            return False
        assert self.tiers is not None
        n = len(match.blocks) + k
        seq.loading_counts_as_hit = first
        self.tiers.start_load(seq.request_id, match.lower[k:], seq.block_table[n:n + len(match.lower) - k],
                              match.lower_tiers[k:])
        return True

    @property
    def num_prefetching_blocks(self) -> int:
        """Device blocks held by prefetches in flight (no sequence owns them; freed on landing)."""
        return 0 if self.tiers is None else len(self.tiers.prefetching_blocks())

    def load_ready(self, seq: KVSequence) -> bool:
        return self.tiers is None or self.tiers.load_ready(seq.request_id)

    def finish_load(self, seq: KVSequence) -> int:
        """Land a ready load: register the blocks that arrived (in order, up to the first that
        did not) and advance the sequence over them. Returns the tokens loaded."""
        assert self.tiers is not None
        num_loaded, tiers = self.tiers.finish_load(seq.request_id)
        start = seq.num_registered_blocks
        for i in range(start, start + num_loaded):
            self.pool.register(seq.block_table[i], seq.block_hashes[i])  # a duplicate stays private
        seq.num_registered_blocks = start + num_loaded
        tokens = num_loaded * self.block_size
        seq.num_computed_tokens += tokens
        if seq.loading_counts_as_hit:
            seq.num_cached_tokens += tokens
            self.prefix_hit_tokens += tokens
            for t in tiers:
                self.hit_tokens_by_tier[t] = self.hit_tokens_by_tier.get(t, 0) + self.block_size
        return tokens

    # ---- running -------------------------------------------------------------------------
    def can_append(self, seq: KVSequence, num_new_tokens: int) -> bool:
        # inline arithmetic: a decode step inside the last block costs one integer test
        need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size) - len(seq.block_table)
        return need <= 0 or need <= self.pool.num_free

    def append(self, seq: KVSequence, num_new_tokens: int) -> None:
        need = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size) - len(seq.block_table)
        if need > 0:
            seq.block_table.extend(self.pool.allocate(need))

    def append_many(self, seqs: list[KVSequence], num_new_tokens: int = 1) -> int:
        """`can_append` then `append` for each of `seqs` in order, as ONE pass: a sequence that
        stays inside its last block costs an integer test; the ones crossing a block boundary
        take their blocks in one allocation (the same blocks, victims and write-down queue as
        one call each). Stops before the first sequence that does not fit and returns how many
        were served: the caller preempts and calls again with the rest."""
        bs = self.block_size
        room = self.pool.num_free
        total = 0
        served = len(seqs)
        # the sequences crossing a block boundary, in one comprehension (a decode batch's
        # per-sequence test was a third of this call as a for loop with a branch)
        crossing = [s for s in seqs if s.num_computed_tokens + num_new_tokens > len(s.block_table) * bs]
        needs: list[int] = []
        for seq in crossing:
            need = -(-(seq.num_computed_tokens + num_new_tokens) // bs) - len(seq.block_table)
            if total + need > room:
                served = next(i for i, x in enumerate(seqs) if x is seq)
                break
            total += need
            needs.append(need)
        if total:
            blocks = self.pool.allocate(total)
            i = 0
            for seq, need in zip(crossing, needs):
                seq.block_table.extend(blocks[i:i + need])
                i += need
        return served

    def truncate(self, seq: KVSequence, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` tokens (speculative drafts that were
        rejected). Such blocks were never committed, so no hash ever names their KV."""
        keep = -(-num_tokens // self.block_size)
        if len(seq.block_table) > keep:
            extra = seq.block_table[keep:]
            assert all(b.hash is None for b in extra), "a committed block past the sequence"
            del seq.block_table[keep:]
            self.pool.release(extra)

    def commit(self, seq: KVSequence) -> None:
        """After a step computed KV: index the sequence's newly full blocks by content hash."""
        n_full = seq.num_computed_tokens // self.block_size
        if n_full <= seq.num_registered_blocks:
            return
        hashes = self.update_hashes(seq, seq.num_computed_tokens)
        for i in range(seq.num_registered_blocks, n_full):
            b = seq.block_table[i]
            if b.hash is None:
                self.pool.register(b, hashes[i])  # a duplicate stays private to this sequence
        seq.num_registered_blocks = n_full

    def commit_many(self, seqs: list[KVSequence]) -> None:
        """`commit` for each of `seqs` in one pass: only sequences with a newly full block (one
        in `block_size` decode steps) do block work; the others cost an integer test."""
        bs = self.block_size
        for seq in seqs:
            if seq.num_computed_tokens // bs > seq.num_registered_blocks:
                self.commit(seq)

    def flush_write_downs(self) -> int:
        """Write down the blocks evicted since the last flush (a no-op without tiers). The engine
        calls it after scheduling and before the forward pass reuses those blocks; allocation
        itself never copies."""
        return 0 if self.tiers is None else self.tiers.flush_write_downs()

    def reset_prefix_cache(self) -> int:
        """Forget every cached device block no request uses (vLLM's `reset_prefix_cache`): the next
        request computes what they held, or loads it from a lower tier, which keeps its copies.
        Blocks of running requests stay. Returns the number of blocks dropped."""
        self.flush_write_downs()  # a victim queued for a write-down is gathered before its block can go
        return sum(self.pool.drop(b) for b in self.pool.cached_free_blocks())

    def free(self, seq: KVSequence) -> None:
        self._runs.pop(seq.request_id, None)
        if self.tiers is not None:
            self.tiers.cancel_load(seq.request_id)
        self.pool.release(seq.block_table)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        if self.tiers is not None:
            self.tiers.check_integrity()
