"""The KV cache manager: prefix matching, block allocation and release for sequences.

The scheduler sees it through ask-then-act pairs (`can_admit`/`admit`, `can_append`/`append`)
and a small `PrefixMatch` result; it never touches the block pool's internals.

A sequence's block table, for one step:

    | matched (cached) | computed earlier | new this step | (unallocated) |
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hintkv.cache.block import Block
from hintkv.cache.block_pool import BlockPool
from hintkv.cache.hashing import BlockHash, hash_blocks
from hintkv.cache.policies import EvictionPolicy


@dataclass(slots=True)
class PrefixMatch:
    blocks: list[Block] = field(default_factory=list)  # device blocks holding the prefix
    num_tokens: int = 0  # tokens of KV they hold


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, policy: EvictionPolicy) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, policy)
        self.prefix_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hit_tokens = 0  # of which found

    # ---- hashing -------------------------------------------------------------------------
    def update_hashes(self, seq, upto: int) -> list[BlockHash]:
        """Extend `seq.block_hashes` over the full blocks of its first `upto` tokens."""
        n_full = upto // self.block_size
        have = len(seq.block_hashes)
        if n_full > have:
            parent = seq.block_hashes[-1] if have else None
            seq.block_hashes.extend(hash_blocks(seq.root_hash, seq.token_ids[:n_full * self.block_size],
                                                self.block_size, start=have, parent=parent))
        return seq.block_hashes

    # ---- admission -----------------------------------------------------------------------
    def match_prefix(self, seq) -> PrefixMatch:
        """Longest run of cached device blocks at the start of the prompt. Pure.

        At most num_tokens - 1 tokens can hit: the last prompt token must run to give logits.
        """
        hashes = self.update_hashes(seq, seq.num_tokens - 1)
        blocks: list[Block] = []
        for h in hashes:
            b = self.pool.lookup(h)
            if b is None:
                break
            blocks.append(b)
        return PrefixMatch(blocks, len(blocks) * self.block_size)

    def _blocks_needed(self, seq, num_tokens_after: int, have: int) -> int:
        return max(0, -(-num_tokens_after // self.block_size) - have)

    def can_admit(self, seq, match: PrefixMatch, num_new_tokens: int) -> bool:
        need = self._blocks_needed(seq, match.num_tokens + num_new_tokens, len(match.blocks))
        reclaimable_matched = sum(1 for b in match.blocks if b.ref_cnt == 0)
        return need <= self.pool.num_free - reclaimable_matched

    def admit(self, seq, match: PrefixMatch, num_new_tokens: int) -> None:
        need = self._blocks_needed(seq, match.num_tokens + num_new_tokens, len(match.blocks))
        self.pool.touch(match.blocks)
        seq.block_table = list(match.blocks) + self.pool.allocate(need)
        seq.num_computed_tokens = match.num_tokens
        seq.num_registered_blocks = len(match.blocks)
        if not seq.admitted_once:
            seq.admitted_once = True
            seq.num_cached_tokens = match.num_tokens
            self.prefix_query_tokens += seq.num_prompt_tokens
            self.prefix_hit_tokens += match.num_tokens

    # ---- running -------------------------------------------------------------------------
    def can_append(self, seq, num_new_tokens: int) -> bool:
        need = self._blocks_needed(seq, seq.num_computed_tokens + num_new_tokens, len(seq.block_table))
        return need <= self.pool.num_free

    def append(self, seq, num_new_tokens: int) -> None:
        need = self._blocks_needed(seq, seq.num_computed_tokens + num_new_tokens, len(seq.block_table))
        if need:
            seq.block_table.extend(self.pool.allocate(need))

    def commit(self, seq) -> None:
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

    def free(self, seq) -> None:
        self.pool.release(seq.block_table)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def check_integrity(self) -> None:
        self.pool.check_integrity()
