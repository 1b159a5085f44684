"""Tier and mover threads never read the session registry (nor the engine-side live ranking);
write-downs never copy in `allocate`.

A registry that records the thread of every attribute access drives real host + disk tiers
(small, so blocks cascade and promote on the mover's threads) through the tier connector.
Everything tier threads need (is this block held? which class?) comes from the published board.
"""

from __future__ import annotations

import threading

import pytest
import torch

from hintkv.cache.hashing import hash_blocks, namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.ranking import ClassRanking
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.tier_connector import TierConnector
from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE
from hintkv.tiers.host import HostTier
from hintkv.tiers.mover import Mover
from hintkv.tiers.stack import TierStack

BS = 4
NUM_BLOCKS = 8
ROOT = namespace_root("test", "float32", BS, None)


class RecordingRegistry(SessionRegistry):
    """A real registry that notes which threads read or write it."""

    def __getattribute__(self, name):
        threads = object.__getattribute__(self, "__dict__").get("threads")
        if threads is not None:
            threads.add(threading.current_thread().name)
        return object.__getattribute__(self, name)


class RecordingRanking(ClassRanking):
    """The real ranking (the engine-side live classes), noting which threads read it: tier
    threads must read the published board instead."""

    def __getattribute__(self, name):
        threads = object.__getattribute__(self, "__dict__").get("threads")
        if threads is not None:
            threads.add(threading.current_thread().name)
        return object.__getattribute__(self, name)


def _connector(tmp_path, policy: str):
    sessions = RecordingRegistry()
    sessions.threads = set()
    kv = KVCacheManager(NUM_BLOCKS, BS, make_policy(policy, sessions=sessions))
    kv.ranking.__class__ = RecordingRanking  # the same object, now recording its readers
    kv.ranking.threads = sessions.threads
    io = DeviceBlockIO([torch.randn(2, NUM_BLOCKS, BS, 1, 2) for _ in range(2)])
    mover = Mover(num_workers=2)
    host = HostTier(io.layout, 3 * io.layout.nbytes, mover=mover)
    disk = DiskTier(io.layout, tmp_path, 40 * (HEADER_SIZE + io.layout.nbytes), mover=mover)
    stack = TierStack([host, disk], mover=mover, owns_mover=True)
    kv.tiers = TierConnector(kv.pool, BS, stack, io, kv.ranking, hints=True)
    return sessions, kv, io, stack


def _cache_session(sessions, kv, name: str, start: int, n: int = 4) -> list[bytes]:
    """A session that ran `n` blocks and now waits holding them (cached on the device)."""
    hashes = hash_blocks(ROOT, list(range(start, start + n * BS)), BS)
    blocks = kv.pool.allocate(n)
    for b, h in zip(blocks, hashes):
        kv.pool.register(b, h)
    s = sessions.on_arrival("t", name, name, 0.0)
    sessions.on_done(s.key, hashes, 0.0)
    kv.pool.release(blocks)
    return hashes


def test_the_recording_registry_sees_other_threads(tmp_path):
    sessions = RecordingRegistry()
    sessions.threads = set()
    t = threading.Thread(target=lambda: sessions.is_held(b"x"), name="probe")
    t.start()
    t.join()
    assert "probe" in sessions.threads  # the check below can fail
    _, kv, _, stack = _connector(tmp_path, "sam")
    t = threading.Thread(target=lambda: kv.ranking.is_held(b"x"), name="probe-ranking")
    t.start()
    t.join()
    assert "probe-ranking" in kv.ranking.threads  # a tier thread reading live classes is seen
    stack.close()


def test_tier_threads_never_touch_the_session_registry(tmp_path):
    for policy in ("sam", "lru"):
        sessions, kv, io, stack = _connector(tmp_path / policy, policy)
        host = stack.tiers[0]
        contexts: list[list[bytes]] = []
        for round_ in range(3):
            for i in range(6):  # each session moves on to a new context: the older is written down
                kv.tiers.poll()  # the engine's per-step publication
                hashes = _cache_session(sessions, kv, f"s{i}", 10_000 * round_ + 1000 * i)
                kv.tiers.flush_write_downs()
                contexts.append(hashes)
                stack.flush()
                # a load from below: reads, promotions, evictions, cascades on the movers
                old = contexts[len(contexts) // 2]
                for key in host.keys()[:1]:
                    host.remove(key)  # room for a promotion
                staging = torch.empty((len(old), *io.layout.shape))
                for f in [stack.load(h, staging[j]) for j, h in enumerate(old)]:
                    f.result()
                stack.flush()
        # a put from another thread into the full host tier: its evictions ask keep / rank there
        kv.tiers.poll()
        last = contexts[-1]
        staging = torch.zeros((len(last), *io.layout.shape))
        keys = host.keys()
        for key in keys:
            host.remove(key)
        stack.flush()
        fill = hash_blocks(ROOT, list(range(90_000, 90_000 + 3 * BS)), BS)
        assert all(f.result() for f in stack.store([(h, staging[0]) for h in fill]))
        items = list(zip(last, staging.unbind(0)))
        t = threading.Thread(name="hintkv-mover-probe", target=lambda st=stack, it=items: [
            f.result() for f in st.store(it)])
        t.start()
        t.join()
        assert host.stats().num_evicted > 0
        assert kv.pool.num_evicted > 0
        assert stack.stats().num_cascaded > 0 and stack.stats().num_promoted > 0
        assert sessions.threads == {threading.current_thread().name}, sessions.threads
        kv.check_integrity()
        sessions.check_integrity()
        stack.close()


def test_allocate_only_queues_write_downs_and_flush_stores_exact_bytes(tmp_path):
    sessions, kv, io, stack = _connector(tmp_path, "sam")
    hashes = _cache_session(sessions, kv, "a", 0)
    expect = {}
    for h in hashes:
        out = torch.empty((1, *io.layout.shape))
        io.read([kv.pool.lookup(h).block_id], out)
        expect[h] = out[0].clone()
    blocks = kv.pool.allocate(NUM_BLOCKS)  # evicts a's 4 blocks
    assert kv.tiers.write_downs.num_written == 0 and kv.tiers.num_write_downs_queued == 4
    assert stack.lookup(hashes) == [None] * 4  # nothing copied yet
    assert kv.flush_write_downs() == 4
    for b in blocks:  # now the forward pass may overwrite the reused blocks
        for layer in io.kv_caches:
            layer[:, b.block_id].fill_(-1.0)
    stack.flush()
    for h in hashes:
        dst = torch.empty(io.layout.shape)
        assert stack.load(h, dst).result() and torch.equal(dst, expect[h])
    kv.pool.release(blocks)
    kv.check_integrity()
    stack.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback: with CUDA the mover has a copy stream")
def test_write_down_gather_without_cuda_is_synchronous(tmp_path):
    """The CPU fallback of the copy-stream write-down: `read_async` gathers at once."""
    _, _, io, stack = _connector(tmp_path, "sam")
    assert stack.mover.copy_stream is None
    out = torch.empty((2, *io.layout.shape))
    assert io.read_async([0, 3], out, stack.mover.copy_stream) is None
    want = torch.empty((2, *io.layout.shape))
    io.read([0, 3], want)
    assert torch.equal(out, want)
    stack.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_write_down_on_the_copy_stream_survives_the_next_forward(tmp_path):
    """On CUDA the gather runs on the copy stream without blocking the engine thread; work
    queued on the compute stream afterwards (the forward reusing the blocks) waits for it."""
    sessions = SessionRegistry()
    kv = KVCacheManager(NUM_BLOCKS, BS, make_policy("sam", sessions=sessions))
    io = DeviceBlockIO([torch.randn(2, NUM_BLOCKS, BS, 1, 2, device="cuda") for _ in range(2)])
    mover = Mover(num_workers=2, use_cuda_stream=True)
    assert mover.copy_stream is not None
    stack = TierStack([HostTier(io.layout, 16 * io.layout.nbytes, pin=True, mover=mover)],
                      mover=mover, owns_mover=True)
    kv.tiers = TierConnector(kv.pool, BS, stack, io, kv.ranking, hints=True)
    hashes = _cache_session(sessions, kv, "a", 0)
    expect = {}
    for h in hashes:
        out = torch.empty((1, *io.layout.shape), device="cuda")
        io.read([kv.pool.lookup(h).block_id], out)
        expect[h] = out[0].cpu()
    blocks = kv.pool.allocate(NUM_BLOCKS)
    assert kv.flush_write_downs() == 4
    for b in blocks:  # the "forward": queued on the compute stream right after the flush
        for layer in io.kv_caches:
            layer[:, b.block_id].fill_(-1.0)
    kv.tiers.wait_write_downs()
    for h in hashes:
        dst = torch.empty(io.layout.shape, pin_memory=True)
        assert stack.load(h, dst).result() and torch.equal(dst, expect[h])
    kv.tiers.close()
