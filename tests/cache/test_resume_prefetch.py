"""SAM's resume-prefetch policies (`cache.resume_prefetch`): what follows a predicted prefetch.

A real pool, registry, SAM and tier connector over a real host tier. A session with a learned
gap waits with its blocks written down to host (lazy: its device copies stay). Its predicted
resume comes due while all of it is still on the device, so the first look loads nothing. Then
other work evicts its blocks and finishes (the room comes free again) before its call arrives:
`watch` looks again and brings them back ahead of the call, `once` leaves them below.
"""

from __future__ import annotations

import math

import pytest
import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.resume_prefetch import make_resume_prefetch, resume_prefetch_names
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.cache.types import SessionRef
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack

BS, NUM_BLOCKS, PER = 4, 16, 6
ROOT = namespace_root("test", "float32", BS, None)
REF = SessionRef("t", "s0", "s0")


class World:
    def __init__(self, resume: str, policy: str = "sam") -> None:
        self.now = 100.0
        self.sessions = SessionRegistry()
        self.kv = kv = KVCacheManager(NUM_BLOCKS, BS, make_policy(policy, sessions=self.sessions))
        self.io = DeviceBlockIO([torch.randn(2, NUM_BLOCKS, BS, 1, 2) for _ in range(2)])
        self.stack = TierStack([HostTier(self.io.layout, 64 * self.io.layout.nbytes)])
        kv.tiers = TierConnector(kv.pool, BS, self.stack, self.io, kv.ranking, hints=True, offload_mode="lazy")
        self.sam = SessionAwareManager(kv, self.sessions, clock=lambda: self.now)
        self.sam.resume = make_resume_prefetch(resume)
        self.hashes = hash_blocks(ROOT, list(range(PER * BS)), BS)
        self.expect: dict[bytes, torch.Tensor] = {}

    def call(self, first: bool = False) -> None:
        """One call of the session, 0.1 s long, that holds `hashes` when it ends."""
        key = self.sam.on_arrival(REF)
        if first:
            blocks = self.kv.pool.allocate(PER)
            for b, h in zip(blocks, self.hashes):
                self.kv.pool.register(b, h)
                out = torch.empty((1, *self.io.layout.shape))
                self.io.read([b.block_id], out)
                self.expect[h] = out[0].clone()
        self.now += 0.1
        self.sam.on_done(key, self.hashes)
        if first:
            self.kv.pool.release(blocks)
        self.now -= 0.1

    def step(self) -> None:
        self.sam.on_step(self.now)
        self.stack.flush()
        self.kv.tiers.poll()
        self.kv.check_integrity()
        self.sessions.check_integrity()

    def on_device(self) -> int:
        return sum(b is not None for b in self.kv.pool.lookup_many(self.hashes))


def _offloaded_with_a_learned_gap(resume: str, policy: str = "sam") -> World:
    """The session's blocks, written down to the host (their device copies stay), after three calls
    that taught SAM its gap (back 2 s after each call ended)."""
    w = World(resume, policy=policy)
    w.call(first=True)
    for _ in range(2):
        w.now += 2.0
        w.call()
    w.kv.tiers.offload(w.hashes)  # lazy: written down, the device copies stay
    w.stack.flush()
    w.step()
    return w


def _lost_then_room(resume: str) -> World:
    w = _offloaded_with_a_learned_gap(resume)
    assert w.on_device() == PER
    w.now += 1.5  # the predicted resume is within its lead time: the first look finds it all on device
    before = w.sam.num_predicted_prefetches
    w.step()
    assert w.sam.num_predicted_prefetches == before, "nothing was below: nothing to prefetch"
    # other work takes every device block (the waiting session's are evicted), then finishes
    taken = w.kv.pool.allocate(NUM_BLOCKS)
    assert w.on_device() == 0
    w.kv.tiers.flush_write_downs()
    w.kv.pool.release(taken)
    w.now += 0.05  # its call has not arrived yet
    w.step()
    w.step()
    return w


@pytest.mark.parametrize("policy", ["lru", "sam"])
def test_a_predicted_prefetch_takes_room_from_unranked_cached_blocks(policy):
    """The session lost every device block to other work's cached (unheld) blocks before its
    predicted resume: the prefetch takes them (under `lru` every class is UNHELD, so a cap at the
    session's own class must not leave only the empty blocks: a full device then loaded nothing)."""
    w = _offloaded_with_a_learned_gap("once", policy=policy)
    other = hash_blocks(ROOT, list(range(20_000, 20_000 + NUM_BLOCKS * BS)), BS)
    blocks = w.kv.pool.allocate(NUM_BLOCKS)  # other work fills the device with cached blocks
    for b, h in zip(blocks, other):
        w.kv.pool.register(b, h)
    w.kv.tiers.flush_write_downs()
    w.kv.pool.release(blocks)
    assert w.on_device() == 0 and w.kv.pool.num_free == w.kv.pool.num_cached_free == NUM_BLOCKS
    w.now += 1.5  # the predicted resume is within its lead time
    w.step()
    w.step()
    assert w.sam.num_predicted_prefetches == 1 and w.on_device() == PER
    w.stack.close()


def test_watch_brings_back_what_was_evicted_after_the_first_look():
    w = _lost_then_room("watch")
    assert w.on_device() == PER, "the watch did not bring the evicted blocks back before the call"
    assert w.sam.num_predicted_prefetches == 1
    for h, want in w.expect.items():
        got = torch.empty((1, *w.io.layout.shape))
        w.io.read([w.kv.pool.lookup(h).block_id], got)
        assert torch.equal(got[0], want), "a prefetched block came back with other bytes"
    # the call arrives: the session leaves the watch
    w.sam.on_arrival(REF)
    w.step()
    assert len(w.sam.resume) == 0
    w.stack.close()


def test_once_leaves_them_below():
    w = _lost_then_room("once")
    assert w.on_device() == 0 and w.sam.num_predicted_prefetches == 0
    w.stack.close()


def _lost_all_below_a_higher_ranked_waiting_session(resume: str, empty: int = 0
                                                    ) -> tuple[World, list[bytes]]:
    """Session A (s0) is watched (under `watch`) and has lost all its device blocks; session B
    waits too, due sooner (ranked above A, below the protected class), and holds every device
    block (cached) but `empty` empty ones. Returns the world and B's hashes."""
    w = _lost_then_room(resume)
    taken = w.kv.pool.allocate(NUM_BLOCKS)  # other work evicts whatever came back, then finishes
    w.kv.tiers.flush_write_downs()
    w.kv.pool.release(taken)
    assert w.on_device() == 0
    other = SessionRef("t", "b", "b")
    busy = hash_blocks(ROOT, list(range(10_000, 10_000 + (NUM_BLOCKS - empty) * BS)), BS)
    for i in range(3):  # B's learned gap: 0.05 s, its call just ended
        key = w.sam.on_arrival(other)
        if i == 0:
            blocks = w.kv.pool.allocate(len(busy))
            for b, h in zip(blocks, busy):
                w.kv.pool.register(b, h)
        w.sam.on_done(key, busy)
        if i == 0:
            w.kv.tiers.flush_write_downs()
            w.kv.pool.release(blocks)
        if i < 2:
            w.now += 0.05
    w.now += 0.04
    w.step()
    a, b = (w.kv.ranking.session_class(k) for k in ("t\x1fs0", key))
    assert a < b < w.kv.tiers.protected_class, "the premise: B waits, ranked above A"
    return w, busy


def test_the_watch_never_takes_a_higher_ranked_block():
    """A session that lost all its blocks loads only into room ranked below its own class (here
    the 2 empty blocks): a waiting session ranked above it (B, due sooner) keeps every block
    (review of bd44099, finding 1: the cap fell back to the protected class and A evicted B's)."""
    w, busy = _lost_all_below_a_higher_ranked_waiting_session("watch", empty=2)
    for _ in range(4):  # the helper's last step was A's first look since it lost all
        assert w.on_device() == 2, "the watch did not load into the empty room, or took more"
        assert all(w.kv.pool.lookup(h) is not None for h in busy), \
            "the watch evicted a higher-ranked waiting session's blocks"
        w.step()
        w.now += 0.001
    w.stack.close()


@pytest.mark.parametrize("resume", ["watch", "once"])
def test_two_watched_sessions_do_not_reload_over_each_other(resume):
    """With both sessions waiting, no step loads anything: before the fix A's watch evicted B's
    blocks, B's watch loaded them back over A's, one host load every step."""
    w, _ = _lost_all_below_a_higher_ranked_waiting_session(resume)
    before = w.sam.num_predicted_prefetches
    for _ in range(6):
        w.step()
        w.now += 0.001
        assert w.kv.num_prefetching_blocks == 0
    assert w.sam.num_predicted_prefetches == before, "a watched session loaded over another"
    w.stack.close()


@pytest.mark.parametrize("resume", ["watch", "once"])
def test_next_due_looks_at_the_watch(resume):
    """`SessionAwareManager.next_due` includes the resume policy's next look (the sim's decode
    stretch folds no step before it): a watched session its last look left incomplete is looked
    at on the next step; `once` never looks again (next_due as before: the next recheck)."""
    w = _lost_then_room(resume)
    taken = w.kv.pool.allocate(NUM_BLOCKS)  # in use: its blocks are evicted and no room is left
    w.kv.tiers.flush_write_downs()
    w.step()
    recheck = w.kv.ranking.next_recheck()
    assert w.now < recheck < math.inf
    if resume == "watch":
        assert w.sam.next_due() == -math.inf, "the watched session's next look is not due"
    else:
        assert w.sam.next_due() == recheck
    w.kv.pool.release(taken)  # room again: the next step's look brings it all back
    w.step()
    assert w.on_device() == (PER if resume == "watch" else 0)
    assert w.sam.next_due() == recheck  # complete again: only a block leaving wakes the watch
    w.stack.close()


def test_unknown_name_is_a_clear_error():
    assert {"once", "watch"} <= set(resume_prefetch_names())
    with pytest.raises(ValueError, match="unknown resume prefetch"):
        make_resume_prefetch("sometimes")
