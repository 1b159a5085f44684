"""SAM's predicted-resume prefetches: bounded per engine step, the rest served on later steps.

A real pool, registry, SAM and tier connector over a real host tier; sessions with a learned
gap (two earlier calls) wait with their blocks written down to host and their device copies
dropped, all predicted back at once. Each step examines at most the budget of held blocks (at
least one session); the others stay due and are prefetched on the next steps, with the bytes
that were written down.
"""

from __future__ import annotations

import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.cache.types import SessionRef
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.host import HostTier
from hintkv.tiers.stack import TierStack

BS, NUM_BLOCKS, SESSIONS, PER = 4, 32, 6, 4
ROOT = namespace_root("test", "float32", BS, None)


def test_predicted_prefetches_respect_the_step_budget():
    sessions = SessionRegistry()
    kv = KVCacheManager(NUM_BLOCKS, BS, make_policy("sam", sessions=sessions))
    io = DeviceBlockIO([torch.randn(2, NUM_BLOCKS, BS, 1, 2) for _ in range(2)])
    stack = TierStack([HostTier(io.layout, 64 * io.layout.nbytes)])
    kv.tiers = TierConnector(kv.pool, BS, stack, io, kv.ranking, hints=True, offload_mode="eager")
    now = 100.0
    sam = SessionAwareManager(kv, sessions, clock=lambda: now)
    sam.predict_budget_blocks = 2 * PER  # two sessions a step
    expect: dict[bytes, torch.Tensor] = {}
    for i in range(SESSIONS):
        hashes = hash_blocks(ROOT, list(range(1000 * i, 1000 * i + PER * BS)), BS)
        blocks = kv.pool.allocate(PER)
        for b, h in zip(blocks, hashes):
            kv.pool.register(b, h)
            out = torch.empty((1, *io.layout.shape))
            io.read([b.block_id], out)
            expect[h] = out[0].clone()
        key = sam.on_arrival(_ref(i))
        now += 0.1
        sam.on_done(key, hashes)
        kv.pool.release(blocks)
        now -= 0.1
    now += 2.0  # every session comes back 2 s after its request ended
    for i in range(SESSIONS):
        key = sam.on_arrival(_ref(i))
        now += 0.1
        sam.on_done(key, sessions.sessions[key].held)
        now -= 0.1
    for s in sessions.live():  # written down to host, device copies dropped
        kv.tiers.offload(s.held)
    stack.flush()
    kv.tiers.poll()
    assert all(kv.pool.lookup(h) is None for h in expect), "device copies were not dropped"
    now += 1.9  # all predicted back within the lead time
    per_step = []
    for _ in range(SESSIONS):
        before = sam.num_predicted_prefetches
        sam.on_step(now)
        per_step.append(sam.num_predicted_prefetches - before)
        stack.flush()
        kv.tiers.poll()
        kv.check_integrity()
        sessions.check_integrity()
    assert per_step[:3] == [2, 2, 2] and sum(per_step) == SESSIONS, per_step
    for h, want in expect.items():
        b = kv.pool.lookup(h)
        assert b is not None, "a predicted prefetch never landed"
        got = torch.empty((1, *io.layout.shape))
        io.read([b.block_id], got)
        assert torch.equal(got[0], want), "a prefetched block came back with other bytes"
    stack.close()


def _ref(i: int) -> SessionRef:
    return SessionRef("t", f"s{i}", f"s{i}")
