"""Working set, nominal timeline and KV sizing, with a word-level stand-in for the tokenizer
(one id per distinct word, so a window's rendering shares prefixes exactly like a real one)."""

from __future__ import annotations

import json

import pytest

from hintkv.bench.sessions import kv_cache_tokens
from hintkv.workload.swarm import SwarmShape, generate_swarm
from hintkv.workload.working_set import block_keys, nominal_timeline, working_set


class WordEncoder:
    """Renders each message as role + content + tool calls, one id per distinct word."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, messages: list[dict], tools: list[dict]) -> list[int]:
        text = " ".join(json.dumps(t) for t in tools)
        for m in messages:
            text += f" <{m['role']}> {m.get('content') or ''} {json.dumps(m.get('tool_calls', ''))}"
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()] + [0]  # + generation prompt


@pytest.fixture(scope="module")
def swarm():
    return generate_swarm(seed=11, shape=SwarmShape().quick())


def test_block_keys_chain_prefixes():
    a = list(range(40))
    b = a[:32] + [99] * 8
    ka, kb = block_keys(a, 8), block_keys(b, 8)
    assert len(ka) == 5 and ka[:4] == kb[:4] and ka[4] != kb[4]
    assert block_keys([5] * 8 + a[:8], 8)[1] != block_keys(a[:16], 8)[1]  # same block, other prefix
    assert block_keys(a[:7], 8) == []


def test_timeline_subagents_live_inside_their_leader(swarm):
    tl = nominal_timeline(swarm)
    assert len(tl.spans) == len(swarm.agents())
    assert len(tl.calls) == swarm.num_calls
    assert [t for t, _, _ in tl.calls] == sorted(t for t, _, _ in tl.calls)
    for task in swarm.tasks:
        lead = tl.spans[task.leader.session_id]
        for sub in task.subagents:
            span = tl.spans[sub.session_id]
            assert lead.start_s <= span.start_s < span.end_s <= lead.end_s


def test_working_set_counts_shared_prefixes_once(swarm):
    ws = working_set(swarm, WordEncoder(), block_size=16)
    assert 0 < ws.tokens < ws.unshared_tokens
    assert 1 < ws.num_live <= len(swarm.agents())
    assert ws.num_calls == swarm.num_calls
    assert 0.5 < ws.ideal_hit_rate < 1  # windows grow by appending, and everyone shares a prefix
    assert ws.max_request_tokens < ws.tokens


def test_kv_cache_tokens_is_a_fraction_in_whole_blocks(swarm):
    ws = working_set(swarm, WordEncoder(), block_size=16)
    kv = kv_cache_tokens(ws, 0.33, 16)
    assert ws.max_request_tokens + 16 < 0.33 * ws.tokens  # so the fraction decides here
    assert kv % 16 == 0 and 0.33 * ws.tokens <= kv < 0.33 * ws.tokens + 16
    assert kv_cache_tokens(ws, 0.01, 16) >= ws.max_request_tokens + 16  # never below one request


def test_bench_flags_make_the_swarm_shape():
    from hintkv.bench.sessions import build_parser, shape_from_args

    full = shape_from_args(build_parser().parse_args([]))
    assert full == SwarmShape()
    quick = shape_from_args(build_parser().parse_args(["--quick", "--time-scale", "5", "--token-scale", "32"]))
    assert quick == SwarmShape(time_scale=5.0, token_scale=32.0).quick()


def test_metrics_text_is_parsed_per_series_and_totalled():
    from hintkv.bench.sessions import metric_total, parse_metrics

    text = """# HELP hintkv_num_preemptions_total Requests preempted.
# TYPE hintkv_num_preemptions_total counter
hintkv_num_preemptions_total 3.0
hintkv_agent_hint_edits_total{type="evict",target="session",action="evicted"} 5.0
hintkv_agent_hint_edits_total{type="offload",target="session",action="offloaded"} 2.0
hintkv_agent_hint_edits_created{type="evict",target="session",action="evicted"} 1.7e+09
"""
    m = parse_metrics(text)
    assert metric_total(m, "hintkv_num_preemptions_total") == 3.0
    assert metric_total(m, "hintkv_agent_hint_edits_total") == 7.0
    assert metric_total(m, "hintkv_recomputed_tokens_total") is None
