"""With API keys the router checks them as an instance does: every route but /health needs one, and its
own /metrics and /router/state (the instances' URLs, sessions and load) too unless --public-metrics
(review rev26 A17: they answered anyone). No instance needed: a request that passes the check meets the
router's unreachable instance (a 5xx), one that does not gets the 401 first."""

from __future__ import annotations

import httpx
import pytest

from hintkv.router import build_router_app
from hintkv.server.background import BackgroundServer

KEY = "router-key"
DOWN = "http://127.0.0.1:9"  # nothing listens there: the router sees no instance up


def _get(router, path: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.get(router.base_url + path, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def keyed():
    with BackgroundServer(build_router_app([DOWN], api_keys=(KEY,))) as router:
        yield router


@pytest.mark.parametrize("path", ["/router/state", "/metrics", "/v1/models", "/v1/sessions/s1"])
def test_the_routers_routes_need_a_key_when_it_has_keys(keyed, path):
    for key in (None, "wrong"):
        r = _get(keyed, path, key)
        assert r.status_code == 401, (path, key, r.text[:200])
        assert r.json()["error"]["type"] == "authentication_error"
    assert _get(keyed, path, KEY).status_code != 401  # past the check (the instance is down: 404, 502 or 503)


def test_a_completion_without_the_key_is_refused_before_the_router_reads_it(keyed):
    r = httpx.post(keyed.base_url + "/v1/completions", json={"prompt": "hi"}, timeout=30)
    assert r.status_code == 401
    assert httpx.post(keyed.base_url + "/v1/completions", json={"prompt": "hi"}, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}"}).status_code in (502, 503)  # no instance


def test_health_needs_no_key_and_a_non_ascii_key_is_a_401(keyed):
    assert _get(keyed, "/health", None).status_code in (200, 503)  # its own view, open to all
    raw = httpx.get(keyed.base_url + "/router/state", headers=[(b"authorization", b"Bearer caf\xe9")], timeout=30)
    assert raw.status_code == 401


def test_public_metrics_opens_the_routers_own_view_only():
    with BackgroundServer(build_router_app([DOWN], api_keys=(KEY,), public_metrics=True)) as router:
        assert _get(router, "/metrics", None).status_code == 200
        assert _get(router, "/router/state", None).status_code == 200
        assert _get(router, "/v1/models", None).status_code == 401


def test_a_router_without_keys_is_open():
    with BackgroundServer(build_router_app([DOWN])) as router:
        assert _get(router, "/router/state", None).status_code == 200
