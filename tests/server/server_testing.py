"""Helpers of the server tests: the live server's settings and handle, and a polling wait."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hintkv.engine.async_llm import AsyncLLM

API_KEY = "test-key"
OTHER_API_KEY = "other-tenant-key"  # a second tenant of the same server
KV_CACHE_TOKENS = 512
MAX_MODEL_LEN = 1024
BLOCK_SIZE = 16


@dataclass(slots=True)
class LiveServer:
    base_url: str  # http://127.0.0.1:<port>
    engine: AsyncLLM
    port: int

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}


def wait_until(condition, timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Poll `condition` until it holds; False if it never did (a deadline, not a timing check)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()
