"""Per-block metadata of the device KV pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hintkv.cache.hashing import BlockHash

if TYPE_CHECKING:
    from hintkv.cache.block_runs import _Run


@dataclass(slots=True, eq=False)
class Block:
    block_id: int  # index into every layer's KV tensor
    ref_cnt: int = 0  # running sequences whose block table contains this block (written only by
    #                   BlockPool's allocate/touch/release, which bump `ref_epoch`: free_room's key)
    hash: BlockHash | None = None  # set once the block is full and registered in the prefix index
    # while indexed: the ranking group of its hash (kept by the pool from the ranking's
    # `block_moved`: a release files its run without a lookup per block in the group map)
    group: int = 0
    # while cached (indexed, unreferenced): the run of the pool's victim order it was filed in
    # (`cache.block_runs`); None otherwise
    run: _Run | None = None

    @property
    def is_cached(self) -> bool:
        return self.hash is not None
