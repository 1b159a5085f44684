"""Admission under load: the gate's arithmetic on a hand-driven clock, then the real app
answering 429/503 with Retry-After while management requests still pass."""

from __future__ import annotations

import httpx
import pytest
from server_testing import API_KEY, LiveServer, wait_until

from hintkv.server import build_app
from hintkv.server.background import BackgroundServer
from hintkv.server.errors import APIError
from hintkv.server.load import LoadGate
from hintkv.server.options import ServerOptions


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_server_cap_refuses_with_503_and_frees_on_release():
    gate = LoadGate(max_in_flight=2)
    a, b = gate.admit("t1"), gate.admit("t2")
    with pytest.raises(APIError) as err:
        gate.admit("t3")
    assert err.value.status_code == 503 and err.value.retry_after >= 1
    a.release()
    a.release()  # idempotent
    c = gate.admit("t3")
    gate.check_integrity()
    b.release(), c.release()
    assert gate.in_flight == 0
    gate.check_integrity()


def test_tenant_rate_is_a_token_bucket_with_retry_after():
    clock = Clock()
    gate = LoadGate(max_in_flight=100, tenant_rate=2.0, clock=clock)
    for _ in range(2):  # the burst
        gate.admit("t").release()
    with pytest.raises(APIError) as err:
        gate.admit("t")
    assert err.value.status_code == 429 and err.value.retry_after == 1
    gate.admit("other").release()  # another tenant is not limited by this one
    clock.now = 0.5  # one token back
    gate.admit("t").release()
    with pytest.raises(APIError):
        gate.admit("t")


def test_tenant_concurrency_limit():
    gate = LoadGate(max_in_flight=100, tenant_concurrency=1)
    held = gate.admit("t")
    with pytest.raises(APIError) as err:
        gate.admit("t")
    assert err.value.status_code == 429
    held.release()
    gate.admit("t").release()


def test_idle_tenants_are_forgotten():
    clock = Clock()
    gate = LoadGate(max_in_flight=10, tenant_rate=1.0, clock=clock)
    for i in range(5000):
        gate.admit(f"t{i}").release()
        clock.now += 1.0
    assert len(gate.tenants) <= 4096
    gate.check_integrity()


def test_full_server_answers_503_with_retry_after_and_management_still_passes(live_server):
    """The shared engine behind an app that admits no queue beyond the engine's 8 slots."""
    options = ServerOptions(api_keys=(API_KEY,), max_queued_requests=0)
    app = build_app(live_server.engine, options=options)
    with BackgroundServer(app) as srv:
        _fill_and_overflow(LiveServer(srv.base_url, live_server.engine, srv.port))
        gate = app.state.hintkv.gate
        assert wait_until(lambda: gate.in_flight == 0)  # every ticket came back
        gate.check_integrity()


def _fill_and_overflow(tight_server: LiveServer) -> None:
    body = {"prompt": "go", "max_tokens": 40, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(base_url=tight_server.v1, headers=tight_server.headers, timeout=60) as c:
        streams = []
        try:
            for _ in range(8):  # fill the engine's 8 slots with streams we do not read
                s = c.stream("POST", "/completions", json=body)
                r = s.__enter__()
                assert r.status_code == 200
                streams.append(s)
            r = c.post("/completions", json={"prompt": "one more", "max_tokens": 1})
            assert r.status_code == 503, r.text
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"] == "server_overloaded"
            manage = {"prompt": "", "agent_hint": {
                "session_id": "m", "parent_session_id": "m",
                "context_management": {"manage_request": True,
                                       "edits": [{"type": "evict", "target": "session"}]}}}
            assert c.post("/completions", json=manage).status_code == 200
        finally:
            for s in streams:
                s.__exit__(None, None, None)
