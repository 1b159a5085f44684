"""The server sees the engine only through `EngineClient` (engine/client.py)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import hintkv
from hintkv.engine.client import EngineClient
from hintkv.engine.types import CacheEdit, SessionRef

# Reaching behind the protocol: the wrapped engine, its scheduler / cache, or a private field.
BEHIND = re.compile(r"\bengine\.(engine|scheduler|kv|sam|sessions|tiers|runner|_\w+)\b")


def test_the_live_engine_is_an_engine_client(live_server):
    assert isinstance(live_server.engine, EngineClient)


def test_no_module_outside_the_engine_reaches_behind_the_protocol():
    root = Path(hintkv.__file__).parent
    offenders = [f"{path.relative_to(root)}:{i}: {line.strip()}"
                 for folder in ("server", "client", "workload")
                 for path in sorted((root / folder).rglob("*.py"))
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if BEHIND.search(line)]
    assert offenders == []


def test_manage_and_describe_go_through_the_client(live_server):
    engine = live_server.engine
    ref = SessionRef("nobody", "ghost", "ghost")
    (outcome,) = asyncio.run(engine.manage(ref, [CacheEdit("evict")]))
    assert outcome.action == "none"
    assert asyncio.run(engine.describe_session("nobody", "ghost")) is None
