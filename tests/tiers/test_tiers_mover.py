"""The movement engine: counting per direction, ordering with `after`, failures as False."""

from __future__ import annotations

import gc
import threading
import weakref
from concurrent.futures import Future

import torch

from hintkv.tiers.mover import SKIPPED, Mover, MoverStats, gather, resolved


def test_copy_counts_bytes_and_blocks_per_direction():
    m = Mover(num_workers=2)
    src = torch.arange(64, dtype=torch.float32)
    dst = torch.empty(64)
    assert m.copy("device->host", dst, src, num_blocks=2).result() is True
    assert torch.equal(dst, src)
    m.copy("host->device", torch.empty(64), src).result()
    s = m.stats()
    assert s.bytes_moved == {"device->host": 256, "host->device": 256}
    assert s.blocks_moved == {"device->host": 2, "host->device": 1}
    m.close()


def test_after_orders_operations_on_one_unit():
    m = Mover(num_workers=2)
    gate = threading.Event()
    order: list[int] = []
    first = m.run("a->b", lambda: gate.wait(10) and not order.append(1), 1, 1)
    second = m.run("a->b", lambda: not order.append(2), 1, 1, after=first)
    third = m.run("a->b", lambda: not order.append(3), 1, 1, after=second)
    assert not third.done()
    gate.set()
    assert [f.result() for f in (first, second, third)] == [True, True, True]
    assert order == [1, 2, 3]
    m.close()


def test_failures_resolve_false_and_are_not_counted_as_moved():
    m = Mover(num_workers=1)

    def boom() -> bool:
        raise RuntimeError("copy failed")

    assert m.run("host->disk", boom, 1, 100).result() is False
    assert m.run("host->disk", lambda: False, 1, 100).result() is False
    assert m.run(None, lambda: True, 0, 0).result() is True  # housekeeping: not counted
    s = m.stats()
    assert s.num_failed == 2 and s.bytes_moved == {}
    m.close()
    assert m.run("host->disk", lambda: True, 1, 100).result() is False  # closed: no crash


def test_a_skipped_job_resolves_false_and_is_counted_neither_moved_nor_failed():
    m = Mover(num_workers=1)  # a cancelled hand-down: nothing to read, nothing failed
    assert m.run("disk->pool", lambda: SKIPPED, 1, 100).result() is False
    s = m.stats()
    assert s.num_failed == 0 and s.bytes_moved == {} and s.blocks_moved == {}
    m.close()


def test_wait_loads_counts_waits_and_merge_adds_up():
    m = Mover(num_workers=1)
    assert m.wait_loads([resolved(True), resolved(False)]) == [True, False]
    s = m.stats()
    assert s.num_load_waits == 1 and s.load_wait_s >= 0
    total = MoverStats({"x": 1}, {"x": 1}).merged(MoverStats({"x": 2, "y": 3}, {"y": 1}, 1))
    assert total.bytes_moved == {"x": 3, "y": 3} and total.blocks_moved == {"x": 1, "y": 1}
    assert total.num_failed == 1
    m.close()


def test_gather_of_a_shared_batch_waits_once_and_keeps_every_position():
    batch: Future[bool] = Future()  # one future shared by many blocks (a host batch)
    other: Future[bool] = Future()
    out = gather([batch, resolved(False), batch, other, batch])
    assert len(batch._done_callbacks) == 1  # one callback for the shared batch, not one per block
    batch.set_result(True)
    assert not out.done()  # `other` is still pending
    other.set_result(True)
    assert out.result(timeout=0) == [True, False, True, True, True]
    assert gather([]).result(timeout=0) == []


def test_a_finished_gather_holds_none_of_its_futures() -> None:
    """Each future keeps gather's callback; once the gather is done the callback lets go of
    the futures, so they are freed by reference counting, not left in a cycle."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        a: Future[bool] = Future()
        b: Future[bool] = Future()
        out = gather([a, b, a])
        refs = [weakref.ref(a), weakref.ref(b)]
        a.set_result(True)
        b.set_result(False)
        assert out.result(timeout=0) == [True, False, True]
        del a, b
        assert [r() for r in refs] == [None, None]
    finally:
        if was_enabled:
            gc.enable()


def test_the_movers_threads_run_without_openmp():
    """A copy above ATen's grain on a mover thread ran an OpenMP region, whose pool stayed beside the engine thread's
    (libgomp then throttles every spin): the mover's threads see an OpenMP count of 1, the caller keeps its own."""
    import pytest

    if torch.get_num_threads() < 2:
        pytest.skip("one OpenMP thread: nothing to tell apart")
    m = Mover(num_workers=2)
    seen = []
    futures = [m.run(None, lambda: seen.append(torch.get_num_threads()) or True, 0, 0) for _ in range(8)]
    assert all(f.result() for f in futures)
    m.close()
    assert seen == [1] * 8 and torch.get_num_threads() > 1
