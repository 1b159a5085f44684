"""rev26 A14: /health answers 200 whatever the engine thread's state. If the thread stops (here: a SystemExit
raised by a job on it, which `AsyncLLM.call` re-raises by design; in the field: any BaseException, or an
exception inside `_fail_all` / `_check_integrity` other than AssertionError), every request hangs forever
(`generate` awaits a future nobody runs) while the router and load balancers keep seeing a healthy instance.
vLLM's /health answers 500 once its engine is dead."""

from __future__ import annotations


import httpx
import pytest

from hintkv.config import EngineConfig
from hintkv.engine.async_llm import AsyncLLM
from hintkv.server import build_app
from hintkv.server.background import BackgroundServer


def _stop(_engine):
    raise SystemExit("engine thread stopped")


def test_health_is_not_200_once_the_engine_thread_is_gone():
    engine = AsyncLLM.from_config(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=16,
                                               kv_cache_tokens=256, max_model_len=256, max_num_seqs=2))
    try:
        with BackgroundServer(build_app(engine, [])) as srv:
            with pytest.raises(SystemExit):
                engine.call(_stop).result(timeout=30)
            engine._thread.join(timeout=30)
            assert not engine._thread.is_alive()
            with pytest.raises(httpx.ReadTimeout):  # a request now hangs (bounded here by the client)
                httpx.post(srv.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
            assert httpx.get(srv.base_url + "/health", timeout=10).status_code != 200
    finally:
        engine._stopping = True
        engine.engine.close()
