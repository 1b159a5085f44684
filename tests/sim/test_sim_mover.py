"""The virtual mover: the real host tier's transfers complete in simulated time at the profile's
bandwidth, one at a time per link, in order, with the payload really copied."""

from __future__ import annotations

import pytest
import torch

from hintkv.sim.clock import EventClock
from hintkv.sim.costs import CostModel
from hintkv.sim.mover import VirtualMover
from hintkv.tiers.host import HostTier
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import SKIPPED
from hintkv.tiers.stack import TierStack


def _drain(clock: EventClock) -> None:
    """Run every scheduled event (the transfers complete in virtual time)."""
    while clock.run_next():
        pass


def _link_s(costs: CostModel, src: str, dst: str, nbytes: int) -> float:
    """One transfer of `nbytes` over the profile's link: its latency + the bytes at its bandwidth."""
    link = costs.profile.link(src, dst)
    return link.latency_ms / 1e3 + nbytes / (link.gbps * 1e9)


def test_host_tier_puts_and_loads_take_profile_time(costs):
    clock = EventClock()
    real = costs.profile.kv_bytes_per_token * 16  # 2 MiB: one Llama-3-8B block
    mover = VirtualMover(clock, costs, real)
    layout = BlockLayout(1, 16, 1, 1, torch.uint8)
    host = HostTier(layout, 8 * layout.nbytes, mover=mover)
    stack = TierStack([host], mover=mover)
    src = [torch.full(layout.shape, i, dtype=torch.uint8) for i in range(4)]
    futs = host.put([(bytes([i]) * 16, src[i]) for i in range(4)])
    assert not any(f.done() for f in futs)  # nothing moves until the clock does
    _drain(clock)
    assert all(f.result() for f in futs)
    assert clock() == pytest.approx(_link_s(costs, "device", "host", 4 * real))
    t0 = clock()
    dst = torch.zeros(layout.shape, dtype=torch.uint8)
    got = stack.load(bytes([2]) * 16, dst)
    _drain(clock)
    assert got.result() and torch.equal(dst, src[2])
    assert clock() - t0 == pytest.approx(_link_s(costs, "host", "device", real))
    assert mover.stats().bytes_moved == {"device->host": 4 * real, "host->device": real}
    host.check_integrity()


def test_a_skipped_job_resolves_false_and_is_counted_neither_moved_nor_failed(costs):
    clock = EventClock()
    mover = VirtualMover(clock, costs, 1024)
    skipped = mover.run("device->host", lambda: SKIPPED, 1, 0)
    _drain(clock)
    assert skipped.result() is False
    s = mover.stats()
    assert s.num_failed == 0 and s.bytes_moved == {} and s.blocks_moved == {}


def test_pool_puts_and_gets_take_profile_time_and_return_checked_bytes(costs):
    """The shared pool's batched calls: one round trip (the link's latency) + the real bytes at its
    bandwidth; a second instance reads what the first stored (content keys), payload intact."""
    from hintkv.sim.pool import SimPool

    clock = EventClock()
    real = costs.profile.kv_bytes_per_token * 16
    layout = BlockLayout(1, 16, 1, 1, torch.uint8)
    pool = SimPool("spm", 16, real)
    movers = [VirtualMover(clock, costs, real) for _ in range(2)]
    a, b = (pool.tier(layout, clock, m) for m in movers)
    src = [torch.full(layout.shape, 7 + i, dtype=torch.uint8) for i in range(3)]
    futs = a.put([(bytes([i]) * 16, src[i]) for i in range(3)])
    assert not any(f.done() for f in futs)
    _drain(clock)
    assert all(f.result() for f in futs)
    assert clock() == pytest.approx(_link_s(costs, "host", "pool", 3 * real))
    t0 = clock()
    dst = torch.zeros(layout.shape, dtype=torch.uint8)
    assert b.contains(bytes([1]) * 16) and not b.contains(bytes([9]) * 16)
    got = b.get(bytes([1]) * 16, dst)
    _drain(clock)
    assert got.result() and torch.equal(dst, src[1])
    assert clock() - t0 == pytest.approx(_link_s(costs, "pool", "host", real))
    assert pool.meter.peak_bytes == 3 * real
    assert pool.stats()["remote_hits"] == 1
    a.check_integrity()
    b.check_integrity()


def test_wait_done_blocks_in_simulated_time(costs):
    """The step that waits for its load (`TierConnector.wait_load`, same-step timing): the clock
    runs on to the copy's landing, or to the timeout when the copy takes longer."""
    clock = EventClock()
    real = costs.profile.kv_bytes_per_token * 16
    mover = VirtualMover(clock, costs, real)
    layout = BlockLayout(1, 16, 1, 1, torch.uint8)
    host = HostTier(layout, 8 * layout.nbytes, mover=mover)
    stack = TierStack([host], mover=mover)
    src = torch.full(layout.shape, 5, dtype=torch.uint8)
    host.put([(b"k" * 16, src)])
    _drain(clock)
    one = _link_s(costs, "host", "device", real)
    dst = torch.zeros(layout.shape, dtype=torch.uint8)
    t0 = clock()
    got = stack.load(b"k" * 16, dst)
    assert not mover.wait_done(got, one / 2) and clock() == pytest.approx(t0 + one / 2)
    assert mover.wait_done(got, one) and clock() == pytest.approx(t0 + one)
    assert got.result() and torch.equal(dst, src)


def test_the_sim_tiers_price_a_block_at_the_profiles_bytes(costs):
    """SAM's prefetch lead, a kept prefix's lapse and the same-step wait read the connector's own
    estimate of a block's load: in the simulator that is the profile's block bytes, as the mover
    times it, not the payload's (2 x block_size bytes: 128 at block 64; ~65,000x cheaper until many loads were learned)."""
    from hintkv.cache.tier_costs import DEFAULT_BANDWIDTH
    from hintkv.config import EngineConfig
    from hintkv.sim.engine import SimEngine

    cfg = EngineConfig(model="sim", block_size=64, kv_cache_tokens=256 * 64, eviction_policy="sam", hints=True)
    est = SimEngine(cfg, costs, EventClock(), 256, host_blocks=1024).scheduler.kv.tiers.costs
    real = costs.profile.kv_bytes_per_token * 64
    moved_s = _link_s(costs, "host", "device", 8 * real)  # what the mover takes for 8 blocks
    assert est.load_s("host") == pytest.approx(real / (costs.profile.link("host", "device").gbps * 1e9))
    assert moved_s / 8 <= 1.5 * est.load_s("host")  # before any load: the link's bytes (+ latency)
    assert est.load_s("disk") == pytest.approx(real / DEFAULT_BANDWIDTH["disk"])  # never seen: the default
    est.observe_load("host", 8, moved_s)
    assert est.load_s("host") <= moved_s / 8  # one load learned: the same scale
