"""rev26 A15: the per-tenant load limits are keyed by the tenant string, which includes `cache_salt`
(`auth.tenant_of`: identity + "/salt-<digest>"), so one API key escapes --tenant-rate-limit and
--tenant-max-concurrency by sending each request with a fresh `cache_salt` (a namespace it chooses freely)."""

from __future__ import annotations

import httpx
from server_testing import API_KEY

from hintkv.server import build_app
from hintkv.server.background import BackgroundServer
from hintkv.server.options import ServerOptions


def test_a_fresh_cache_salt_per_request_does_not_escape_the_tenant_rate_limit(live_server):
    options = ServerOptions(api_keys=(API_KEY,), tenant_rate_limit=0.01)  # a burst of 1, then one per 100 s
    with BackgroundServer(build_app(live_server.engine, options=options)) as srv:
        codes = []
        for i in range(3):
            r = httpx.post(srv.base_url + "/v1/completions",
                           json={"prompt": "hi", "max_tokens": 1, "cache_salt": f"salt-{i}"},
                           headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
            codes.append(r.status_code)
        assert codes.count(429) == 2, codes  # one key, one burst
