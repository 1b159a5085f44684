"""Where a prompt is made into token ids: text through the tokenizer in a worker thread, token ids
checked on the event loop."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from server_testing import API_KEY

from hintkv.server import build_app
from hintkv.server.background import BackgroundServer


def _model(live_server) -> str:
    return httpx.get(live_server.base_url + "/v1/models", headers=live_server.headers).json()["data"][0]["id"]


class _CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1)
        self.num_submitted = 0

    def submit(self, *args, **kwargs):
        self.num_submitted += 1
        return super().submit(*args, **kwargs)


def test_only_a_text_prompt_takes_the_tokenizers_worker_thread(live_server):
    """Token ids are range-checked on the event loop (a worker thread's hop cost more than the check
    under a busy engine thread); text still goes through the tokenizer in the worker thread."""
    app = build_app(live_server.engine, [API_KEY])
    pool = app.state.hintkv.cpu_pool = _CountingPool()
    with BackgroundServer(app) as srv:
        url, model = srv.base_url + "/v1/completions", _model(live_server)
        body = {"model": model, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
        assert httpx.post(url, json={**body, "prompt": [5, 6, 7]}, headers=live_server.headers,
                          timeout=60).status_code == 200
        assert pool.num_submitted == 0
        bad = httpx.post(url, json={**body, "prompt": [5, 10**9]}, headers=live_server.headers, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
        assert httpx.post(url, json={**body, "prompt": "five six"}, headers=live_server.headers,
                          timeout=60).status_code == 200
        assert pool.num_submitted == 1
    pool.shutdown()


def test_no_route_dependency_leaves_the_event_loop():
    """FastAPI runs a plain `def` dependency in a worker thread: the API-key check of every request was a hop out
    of the event loop and back (two thread wake-ups before the handler started). Every route's dependencies, the
    checks of /v1 and /metrics included, are coroutines, run on the loop."""
    import inspect

    from fastapi.routing import APIRoute

    from hintkv.server import routes_chat, routes_completions, routes_info, routes_sessions

    calls = [dep.call for module in (routes_chat, routes_completions, routes_info, routes_sessions)
             for route in module.router.routes if isinstance(route, APIRoute)
             for dep in route.dependant.dependencies]
    assert {"require_api_key", "require_metrics_access"} <= {call.__name__ for call in calls}
    assert all(inspect.iscoroutinefunction(call) for call in calls), [c.__name__ for c in calls
                                                                      if not inspect.iscoroutinefunction(c)]
