"""Helpers for the tiered-engine tests: a tiny real engine and a loop that runs one request."""

from __future__ import annotations

import random

from hintkv.cache.types import SessionRef
from hintkv.config import EngineConfig
from hintkv.engine.llm_engine import LLMEngine
from hintkv.engine.types import GenerateRequest, SamplingParams

BLOCK = 16


def tiny_engine(kv_tokens: int = 8 * BLOCK, **tiers) -> LLMEngine:
    cfg = EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=BLOCK,
                       kv_cache_tokens=kv_tokens, max_num_batched_tokens=256, **tiers)
    return LLMEngine(cfg)


def prompt(seed: int, n: int = 4 * BLOCK) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


def session(sid: str) -> SessionRef:
    return SessionRef(tenant="t", session_id=sid, parent_session_id=sid)


_counter = iter(range(10**9))


def generate(engine: LLMEngine, tokens: list[int], sid: str | None = None,
             max_tokens: int = 4, check: bool = True) -> tuple[list[int], int]:
    """Run one greedy request to completion; (output token ids, cached tokens). `check`: the engine's
    integrity check after every step (off only where a test is about what happens without one)."""
    rid = f"r{next(_counter)}"
    req = GenerateRequest(rid, list(tokens), SamplingParams(temperature=0, max_tokens=max_tokens,
                                                            ignore_eos=True),
                          session=session(sid) if sid else None)
    engine.add_request(req)
    out: list[int] = []
    for _ in range(10_000):
        for o in engine.step():
            if o.request_id == rid:
                out += o.new_token_ids
                if o.finished:
                    if check:
                        engine.check_integrity()
                    return out, o.num_cached_tokens
        if check:
            engine.check_integrity()
    raise AssertionError("the request never finished")


def settle(engine: LLMEngine) -> None:
    """Let every tier move finish and be acknowledged (offload drops, prefetch landings)."""
    for _ in range(1000):
        engine.tiers.stack.flush()
        engine.step()
        if engine.tiers.idle():
            return
    raise AssertionError("tier moves never settled")


def run_arrivals(engine: LLMEngine, arrivals: list[tuple[str, list[int], int, int]], hints: bool = True
                 ) -> tuple[dict[str, list[int]], dict[str, int], dict[str, int]]:
    """Step `engine` until every request of `arrivals` (request id, prompt, max_tokens, the step it
    arrives at) has finished, checking the engine and its admission policy after each step;
    (outputs, step of the first token, step of the end) per request."""
    out: dict[str, list[int]] = {rid: [] for rid, *_ in arrivals}
    first: dict[str, int] = {}
    end: dict[str, int] = {}
    for i in range(10_000):
        for rid, tokens, n, at in arrivals:
            if i == at:
                engine.add_request(GenerateRequest(rid, list(tokens), SamplingParams(
                    temperature=0, max_tokens=n, ignore_eos=True), session=session(rid) if hints else None))
        for o in engine.step():
            if o.new_token_ids and o.request_id not in first:
                first[o.request_id] = i
            out[o.request_id] += o.new_token_ids
            if o.finished:
                end[o.request_id] = i
        engine.check_integrity()
        engine.scheduler.admission.check_integrity()
        if len(end) == len(arrivals):
            return out, first, end
    raise AssertionError("the requests never finished")
