"""rev26 A13: the router read any request body whole and parses it on its event loop before anything else
(`Router.forward`: `await request.body()`, `json.loads`), with no size cap and no authentication of its own;
the instances refuse a body over 8 MiB (413) before reading it. Measured: a 63 MiB body grew the router's
RSS by 193 MiB and stalled its loop 1.1 s (probes/probe_router_body.py)."""

from __future__ import annotations

import json

import httpx

from hintkv.router import build_router_app
from hintkv.server.background import BackgroundServer
from hintkv.server.limits import MAX_BODY_BYTES


def test_the_router_refuses_a_body_over_the_instances_cap():
    with BackgroundServer(build_router_app(["http://127.0.0.1:9"])) as router:  # no instance needed
        big = json.dumps({"prompt": "x", "pad": "y" * (MAX_BODY_BYTES + 1024)}).encode()
        r = httpx.post(router.base_url + "/v1/completions", content=big,
                       headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 413, (r.status_code, r.text[:200])
