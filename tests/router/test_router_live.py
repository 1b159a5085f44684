"""The router in front of two real hintkv instances (dummy:tiny) sharing an embedded pool:
affinity by session, sub-agents next to their parent, evict reaching every instance the session
was placed on (after a failover moved it), failover
away from a killed instance where the session loads its prefix from the pool (greedy output
identical to a cold engine's, cached tokens > 0), and 4xx/503 in the OpenAI error shape."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.router import build_router_app
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer
from tests.engine.tier_engine_helpers import generate, tiny_engine

BLOCK = 16
MODEL = "set by the cluster fixture"


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pool_dir = str(tmp_path_factory.mktemp("pool"))
    engines, servers = [], []
    for _ in range(2):
        e = AsyncLLM.from_config(EngineConfig(
            model="dummy:tiny", dtype="float32", device="cpu", block_size=BLOCK,
            kv_cache_tokens=64 * BLOCK, max_model_len=1024, max_num_seqs=8,
            pool="embedded", pool_dir=pool_dir, pool_size="8MiB", pool_write_through=True))
        engines.append(e)
        servers.append(BackgroundServer(build_app(e, [])).start())
    router = BackgroundServer(build_router_app([s.base_url for s in servers],
                                               health_interval_s=0.2,
                                               connect_timeout_s=1.0)).start()
    global MODEL
    MODEL = httpx.get(f"{router.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    yield router, servers, engines
    router.stop()
    for s in servers:
        s.stop()
    for e in engines:
        asyncio.run(e.shutdown())


def complete(router, prompt, sid=None, parent=None, max_tokens=4, **extra):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, **extra}
    if sid is not None:
        body["agent_hint"] = {"session_id": sid, "parent_session_id": parent or sid}
    r = httpx.post(f"{router.base_url}/v1/completions", json=body, timeout=60)
    return r


def test_sessions_stick_and_sub_agents_join_their_parent(cluster):
    router = cluster[0]
    leader = tokens(1, 4 * BLOCK)
    r1 = complete(router, leader, "lead")
    assert r1.status_code == 200
    home = r1.headers["x-hintkv-backend"]
    assert complete(router, leader + tokens(2, 8), "lead").headers["x-hintkv-backend"] == home
    sub = complete(router, leader + tokens(3, BLOCK), "lead/sub1", parent="lead")
    assert sub.headers["x-hintkv-backend"] == home
    assert sub.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 4 * BLOCK
    other = complete(router, tokens(4, 2 * BLOCK), "other")
    assert other.headers["x-hintkv-backend"] != home  # least loaded: fewer sessions
    state = httpx.get(f"{router.base_url}/router/state").json()
    assert state["placement"]["parent"] >= 1 and state["placement"]["affinity"] >= 1
    router.app.state.router.placement.check_integrity()
    text = httpx.get(f"{router.base_url}/metrics").text
    assert f'hintkv_router_backend_up{{backend="{home}"}} 1' in text


def test_evict_reaches_every_instance(cluster):
    router, servers, _ = cluster
    prompt = tokens(10, 3 * BLOCK)
    r = complete(router, prompt, "ev")
    home = r.headers["x-hintkv-backend"]
    # a failover: the router's placement moves the session off its instance (the retry path
    # excludes the one that failed), and the retried request runs there: the session now has
    # KV on two instances, and the router's trail knows both
    placement = router.app.state.router.placement
    key = next(k for k in placement._where if json.loads(k)[2] == "ev")
    moved = placement.choose(key, key, exclude={home})
    other = next(s for s in servers if s.base_url == moved.url)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0,
            "agent_hint": {"session_id": "ev", "parent_session_id": "ev"}}
    assert httpx.post(f"{other.base_url}/v1/completions", json=body, timeout=60).status_code == 200
    before = httpx.get(f"{router.base_url}/router/state").json()["fanout"]
    evict = {"model": MODEL, "prompt": "", "agent_hint": {
        "session_id": "ev", "parent_session_id": "ev",
        "context_management": {"manage_request": True,
                               "edits": [{"type": "evict", "target": "session"}]}}}
    r = httpx.post(f"{router.base_url}/v1/completions", json=evict, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["agent_hint_result"]["edits"][0]["action"] == "evicted"
    assert httpx.get(f"{router.base_url}/router/state").json()["fanout"] == before + 1
    for s in servers:
        described = httpx.get(f"{s.base_url}/v1/sessions/ev", timeout=10).json()
        assert described["state"] == "ended", (s.base_url, described)


def _evict(router, sid):
    """A management request that evicts session `sid`, through `router`."""
    return httpx.post(f"{router.base_url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "", "agent_hint": {
            "session_id": sid, "parent_session_id": sid,
            "context_management": {"manage_request": True, "edits": [{"type": "evict", "target": "session"}]}}})


def test_evict_through_a_restarted_router_reaches_the_sessions_instance(cluster):
    """A router that restarted knows no session: an evict must reach every instance, not only the one
    its placement picks for the unknown session (review rev25 A4)."""
    router, servers, _ = cluster
    r = complete(router, tokens(77, 3 * BLOCK), "after-restart")
    assert r.status_code == 200, r.text
    home = r.headers["x-hintkv-backend"]
    others = [s.base_url for s in servers if s.base_url != home]
    # the home instance listed last: a least-loaded tie picks another one first
    fresh = BackgroundServer(build_router_app(others + [home], health_interval_s=0.2,
                                              connect_timeout_s=1.0)).start()
    try:
        e = _evict(fresh, "after-restart")
        assert e.status_code == 200, e.text
        assert e.headers["x-hintkv-backend"] != home  # the case: the evict landed elsewhere first
        described = httpx.get(f"{home}/v1/sessions/after-restart", timeout=10).json()
        assert described["state"] == "ended", described
    finally:
        fresh.stop()


def test_an_evict_missed_by_an_instance_marked_down_is_sent_when_it_is_up_again(cluster):
    """An instance marked down (3 slow health checks: busy, not dead) misses an evict's fan-out; the
    router owes it the evict and sends it when a health check finds it up (review rev25 A4)."""
    router, servers, _ = cluster
    urls = [s.base_url for s in servers]
    fresh = BackgroundServer(build_router_app(urls, health_interval_s=0.2, connect_timeout_s=1.0)).start()
    try:
        r = httpx.post(f"{fresh.base_url}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": tokens(78, 3 * BLOCK), "max_tokens": 2, "agent_hint": {
                "session_id": "owed", "parent_session_id": "owed"}})
        assert r.status_code == 200, r.text
        home = r.headers["x-hintkv-backend"]
        state = fresh.app.state.router
        state.backends[home].up = False  # as after slow health checks; the next good one brings it back
        state.backends[home].num_failed_checks = 3
        e = _evict(fresh, "owed")
        # (served elsewhere and owed to home, or, if a health check brought home back first, served there)
        assert e.status_code == 200, e.text
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = httpx.get(f"{home}/v1/sessions/owed", timeout=10).json()
            if described["state"] == "ended":
                break
            time.sleep(0.1)
        assert described["state"] == "ended", described
        assert httpx.get(f"{fresh.base_url}/router/state", timeout=10).json()["backends"][home]["owed_evicts"] == 0
    finally:
        fresh.stop()


def test_the_router_describes_a_salted_session_and_an_id_with_a_slash(cluster):
    """GET /v1/sessions/{id} through the router finds the session in its namespace (?cache_salt=, as
    the instance takes it) and takes ids holding a "/" (review rev25 A9)."""
    router, _, _ = cluster
    for sid, salt in (("salted", "ns1"), ("team/worker-1", None)):
        extra = {"cache_salt": salt} if salt else {}
        assert complete(router, tokens(91, 2 * BLOCK), sid, **extra).status_code == 200
        r = httpx.get(f"{router.base_url}/v1/sessions/{sid}", params=extra, timeout=10)
        assert r.status_code == 200 and r.json()["session_id"] == sid, r.text


def test_bad_bodies_are_4xx_in_the_openai_shape(cluster):
    router, _, _ = cluster
    r = httpx.post(f"{router.base_url}/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{router.base_url}/v1/completions", json=[1, 2])
    assert r.status_code == 400
    r = complete(router, tokens(1, 8), "bad", temperature=-3)  # the instance's own 400
    assert r.status_code == 400 and r.json()["error"]["param"]


def test_failover_moves_the_session_and_it_loads_from_the_pool(cluster):
    router, servers, _ = cluster
    prefix = tokens(20, 6 * BLOCK)
    r = complete(router, prefix, "mover", max_tokens=4)
    home = r.headers["x-hintkv-backend"]
    out = r.json()["choices"][0]
    resumed = prefix + tokens(21, BLOCK)
    dead = next(s for s in servers if s.base_url == home)
    dead.stop()  # the instance goes away (its port closes)
    r2 = complete(router, resumed, "mover", max_tokens=6)
    assert r2.status_code == 200, r2.text
    assert r2.headers["x-hintkv-backend"] != home
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 6 * BLOCK
    cold = tiny_engine(kv_tokens=64 * BLOCK)
    try:
        expected, _ = generate(cold, resumed, max_tokens=6)
    finally:
        cold.close()
    got = httpx.post(f"{router.base_url}/v1/completions", json={
        "model": MODEL, "prompt": resumed, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True}, timeout=60).json()
    assert got["choices"][0]["token_ids"] == expected
    assert out["text"] is not None
    state = httpx.get(f"{router.base_url}/router/state").json()
    assert state["backends"][home]["up"] is False and state["placement"]["moved"] >= 1
    # every later request of the session stays on the survivor
    assert complete(router, resumed, "mover").headers["x-hintkv-backend"] == r2.headers[
        "x-hintkv-backend"]
