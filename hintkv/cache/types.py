"""Types the cache layer shares with the engine above it: session identity, resolved edits, and
what the cache reports back (edit outcomes, session descriptions) as numbers, never prose: the
server words them for clients (`server/edit_notes.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from hintkv.cache.block import Block
    from hintkv.cache.hashing import BlockHash


# What an offload hint does with the device copy once the blocks are written down. `lazy`: keep
# it as a cached block; evicting it later writes nothing (the stack holds it), so the room is as
# free as after a drop, and a resume before any pressure reloads nothing (measured in `hintkv sim`:
# eager moved 4x the bytes and lost hit rate to lru + host at full scale). `eager`: drop at once.
# `deferred` (the default: `DEFAULT_OFFLOAD_MODE`, which `EngineConfig.offload_mode`, `TierConnector` and
# the simulator's tiers take): write nothing at the hint; the session is only demoted (the policy ranks it
# low), and its blocks are written down if and when the device evicts them (`TierConnector.on_device_evict`):
# the simulator's hinted runs give lazy's TTFT at 95% of its peak host bytes at 10 users, 27.5% at 100, 47%
# at 1000 (docs/benchmarks/history/sim.md, twenty-first session, scale6; on the CPU and in the simulator,
# where a write-down's gather is synchronous: review_scale22 finding 2).
OFFLOAD_MODES = ("lazy", "eager", "deferred")
DEFAULT_OFFLOAD_MODE = "deferred"
# Where a block read back into the device stays: `inclusive`, in the tiers below too (a second
# eviction writes nothing); `exclusive`, only on the device (its lower copies are removed, so the
# host holds what the device does not: the peak host bytes drop, a block evicted again is written
# again). The shared pool tier (Mooncake) keeps its copy either way: other instances read it.
HOST_MODES = ("inclusive", "exclusive")


@dataclass(slots=True)
class SessionRef:
    """Who a request belongs to, as far as the cache is concerned (from the Agent Hint)."""

    tenant: str  # API key identity + cache_salt: sessions never cross tenants
    session_id: str
    parent_session_id: str
    ttl_s: float | None = None  # cache_control.ttl: soft protection for this long
    tool: str | None = None  # tool whose result this request carries (to learn tool gaps)


EditAction = Literal["evict", "offload", "prefetch"]


@dataclass(slots=True)
class CacheEdit:
    """An Agent Hint edit, resolved by the server to what the cache needs.

    `token_start` is None for a whole-session edit; for a messages/tools edit it is the first token
    position of the session's context that is stale (found by rendering the old window).
    """

    action: EditAction
    token_start: int | None = None


EditReason = Literal["unknown_session", "hints_ignored", "engine_error"]


@dataclass(slots=True)
class EditOutcome:
    """What one edit did: blocks and tokens moved per tier (negative: left that tier), and the
    counts behind it. Counts are of the session's blocks, as they stood when the edit applied."""

    action: str  # evicted | offloaded | prefetched | none | skipped
    tiers: dict[str, tuple[int, int]] = field(default_factory=dict)  # tier -> (blocks, tokens)
    reason: EditReason | None = None  # why nothing was done (action none / skipped)
    lower_tier: str | None = None  # the tier right below the device; None: no lower tier
    num_held: int = 0  # blocks the session holds
    num_on_device: int = 0  # of them, cached on the device
    num_below: int = 0  # of them, only in lower tiers
    num_scheduled: int = 0  # moves started: offload writes, prefetch loads
    num_not_freed: int = 0  # evict: released blocks still used by running requests (or gone)
    detail: str | None = None  # reason engine_error: the error
    offload_mode: str | None = None  # offloaded: eager | lazy | deferred (what happens to the device copies)
    range_edit: bool = False  # a range's edit (the session's state and rank left as they were)


@dataclass(slots=True)
class SessionDescription:
    """One session's cache state (GET /v1/sessions/{id})."""

    session_id: str
    parent_session_id: str  # itself for a root
    state: str  # active | waiting | suspended | ended
    num_requests: int
    num_inflight: int
    held_tokens: int  # tokens of KV the session holds (shared blocks count for each holder)
    tokens_per_tier: dict[str, int]  # of them, where they are (device first)
    children: list[str]  # sub-agent session ids
    predicted_gap_s: float | None  # waiting: when it is expected back (seconds after its last request)
    protect_left_s: float | None  # cache_control.ttl's protection still ahead (SAM's clock); None: not protected


class KVSequence(Protocol):
    """The slice of a request the KV manager reads and writes (`engine.sequence.Sequence` is one).

    Block-table invariant: `block_table[:num_registered_blocks]` are in the prefix index under
    `block_hashes[:num_registered_blocks]`, and `num_computed_tokens <= num_tokens`.
    """

    request_id: str
    token_ids: list[int]  # prompt + generated so far
    num_prompt_tokens: int
    root_hash: BlockHash  # namespace of the request's KV
    num_computed_tokens: int  # tokens whose KV is in the block table
    block_table: list[Block]
    block_hashes: list[BlockHash]  # of full blocks, in order
    num_registered_blocks: int  # leading blocks of block_table in the prefix index
    num_cached_tokens: int  # prefix hit at first admission
    admitted_once: bool
    loading_counts_as_hit: bool  # the pending lower-tier load is this request's first hit

    @property
    def num_tokens(self) -> int: ...
