"""Lock order of a whole engine with host, disk and pool tiers: the engine thread steps requests
(write-downs, loads, promotions, pool write-through) while other threads do what the server's do
under the engine's state lock (`manage` edits, `describe_session`, `sweep_sessions`, the /metrics
scrape's `tier_stats`). Every lock on those paths is wrapped by the recorder
(`tests/tiers/lock_order.py`); the graph of "held -> taken" must have no cycle (docs/structure.md,
"Lock order": the state lock first, then the connector's, then the tiers top-down, then leaves).
"""

from __future__ import annotations

import threading
import time

from tier_engine_helpers import BLOCK, generate, prompt, session, tiny_engine

from hintkv.cache.types import CacheEdit
from tests.tiers.lock_order import LockOrder, guarded

JOIN_S = 240  # threads still running after this are stuck: reported, never waited on forever


def test_no_lock_order_cycle_between_steps_edits_and_scrapes(tmp_path):
    nbytes = 131072  # one dummy:tiny block (checked below)
    engine = tiny_engine(host_cache_memory=str(4 * nbytes), disk_cache_dir=str(tmp_path / "disk"),
                         disk_cache_size=str(6 * (nbytes + 4096)), pool="embedded",
                         pool_size="4MiB")
    tiers = engine.tiers
    assert tiers.layout.nbytes == nbytes
    order = LockOrder()
    order.track(engine, "lock", "engine.state")
    order.track(tiers.write_downs, "_lock", "write_downs")
    order.track(tiers.write_downs, "_flush_lock", "write_downs.flush")
    order.track(tiers, "_landed_lock", "connector.landed")
    order.track(tiers.board, "_lock", "board")
    order.track(tiers.stack, "_lock", "stack")
    order.track(tiers.stack.mover, "_lock", "mover")
    for t in tiers.stack.tiers:  # the pool's worker already waits on its queue: its lock only
        order.track(t, "_lock", t.name)
    names = [f"s{i}" for i in range(5)]
    prompts = {s: prompt(i, 3 * BLOCK) for i, s in enumerate(names)}
    done = threading.Event()
    errors: list[BaseException] = []

    def driver():  # the engine thread: sessions come back after others pushed them down
        for r in range(2):
            for s in names:
                generate(engine, prompts[s] + [7] * r, s, max_tokens=2)

    def editor():  # manage threads: edits and reads under the state lock, mid-step
        n = 0
        while not done.is_set() or n < 20:
            s = names[n % len(names)]
            engine.manage(session(s), [CacheEdit(("offload", "prefetch", "offload")[n % 3])])
            engine.describe_session("t", s)
            if n % 7 == 0:
                engine.sweep_sessions()
            n += 1

    def scraper():  # /metrics
        n = 0
        while not done.is_set() or n < 20:
            engine.tier_stats()
            engine.stats()
            n += 1

    threads = [threading.Thread(target=guarded(driver, errors, done), name="driver", daemon=True)]
    threads += [threading.Thread(target=guarded(fn, errors, done), name=fn.__name__, daemon=True)
                for fn in (editor, scraper)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads {stuck} never finished (deadlock?)\n{order.explain()}"
    assert not errors, errors
    assert order.cycle() is None, order.explain()
    # the paths the order is about were taken (else the test proves nothing)
    for edge in [("engine.state", "host"), ("engine.state", "write_downs"), ("host", "disk"),
                 ("host", "stack"), ("engine.state", "write_downs.flush"), ("write_downs.flush", "host")]:
        assert edge in order.edges, order.explain()
    s = engine.tier_stats()
    # blocks came up (a request's own load or a hint's prefetch: the same `_land` and `load_many`; since a look
    # below waits for the engine's flush the hints' prefetches often bring them up first, num_loaded 0)
    assert s["num_cascaded"] > 0 and s["num_loaded"] + s["num_prefetched"] > 0, s
    engine.close()
