"""How much KV a swarm needs: its nominal timeline, working set and best possible hit rate.

Definition (the one `hintkv bench sessions` sizes the KV cache by):
- A session is live from its first call until it ends (its evict), on the *nominal* timeline:
  calls take no time, tool waits take their full length, a leader resumes when the last
  sub-agent of its wave ends.
- A session's max context is its last prompt plus that call's completion (`max_tokens`).
- The working set is the peak, over the moments a session starts, of the distinct KV tokens of
  the sessions live then: each session's max context cut into `block_size` blocks, where two
  blocks are the same when they hold the same tokens after the same prefix (how a prefix cache
  shares them), so the shared system prompt and tools count once and a sub-agent's fork of its
  leader's window counts once. A partial last block is counted for each session.

`ideal_hit_rate` is the prefix-cache hit rate with unbounded KV: each prompt's full blocks that
an earlier prompt (in nominal order) already had, over all prompt tokens. Completions are not
counted as reusable: the replay puts its own fixed text in the next window, not what the model
said, so only prompt blocks can hit.

`encode(messages, tools) -> token ids` renders a chat window the way the server does;
`chat_encoder(tokenizer)` builds one from a `hintkv.models.tokenizer.Tokenizer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hintkv.workload.swarm import Agent, Swarm, Task

Encoder = Callable[[list[dict], list[dict]], list[int]]


@dataclass(frozen=True, slots=True)
class Span:
    """When a session is live on the nominal timeline (seconds after the swarm starts)."""

    session_id: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class WorkingSet:
    tokens: int  # peak distinct KV tokens of the live sessions, shared prefixes once
    at_s: float  # when the peak is reached on the nominal timeline
    num_live: int  # sessions live at the peak
    unshared_tokens: int  # the same sessions' max contexts summed without any sharing
    num_sessions: int
    num_calls: int
    prompt_tokens: int  # all prompts of all calls
    ideal_hit_tokens: int  # prompt tokens an unbounded prefix cache would hold (see the docstring)
    ideal_hit_rate: float  # ideal_hit_tokens / prompt_tokens
    max_request_tokens: int  # the longest prompt + completion of one call
    nominal_duration_s: float  # the whole swarm on the nominal timeline


def chat_encoder(tokenizer) -> Encoder:
    """Token ids of a chat window rendered with the model's template (as the server renders it)."""

    def encode(messages: list[dict], tools: list[dict]) -> list[int]:
        return tokenizer.encode(tokenizer.apply_chat_template(messages, tools=tools or None,
                                                              add_generation_prompt=True))

    return encode


@dataclass(frozen=True, slots=True)
class Timeline:
    """The nominal timeline: when each session lives and when each call is sent."""

    spans: dict[str, Span]
    calls: list[tuple[float, str, int]]  # (sent at, session id, call index), in time order


def nominal_timeline(swarm: Swarm) -> Timeline:
    spans: dict[str, Span] = {}
    calls: list[tuple[float, str, int]] = []
    for task in swarm.tasks:
        _task_timeline(task, spans, calls)
    calls.sort()
    return Timeline(spans, calls)


def _task_timeline(task: Task, spans: dict[str, Span], calls: list[tuple[float, str, int]]) -> None:
    leader = task.leader
    t = leader.start_delay_s
    for k, call in enumerate(leader.calls):
        calls.append((t, leader.session_id, k))
        if call.spawns:
            t = max(_agent_timeline(task.agent(sid), t, spans, calls) for sid in call.spawns)
        t += call.tool_wait_s
    spans[leader.session_id] = Span(leader.session_id, leader.start_delay_s, t)


def _agent_timeline(agent: Agent, spawned_at: float, spans: dict[str, Span],
                    calls: list[tuple[float, str, int]]) -> float:
    start = t = spawned_at + agent.start_delay_s
    for k, call in enumerate(agent.calls):
        calls.append((t, agent.session_id, k))
        t += call.tool_wait_s
    spans[agent.session_id] = Span(agent.session_id, start, t)
    return t


def block_keys(tokens: Sequence[int], block_size: int) -> list[int]:
    """One key per full block, chained: equal keys mean equal tokens after an equal prefix."""
    keys, prev = [], 0
    for i in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, tuple(tokens[i:i + block_size])))
        keys.append(prev)
    return keys


def working_set(swarm: Swarm, encode: Encoder, block_size: int = 16) -> WorkingSet:
    tools = list(swarm.tools)
    timeline = nominal_timeline(swarm)
    agents = {a.session_id: a for a in swarm.agents()}
    seen: set[int] = set()
    num_hit = num_prompt = max_request = 0
    contexts: dict[str, tuple[int, int]] = {}  # session -> (full-block keys, tokens past them)
    keys_of: dict[str, list[int]] = {}
    for _, sid, k in timeline.calls:
        call = agents[sid].calls[k]
        ids = encode(list(call.messages), tools)
        keys = block_keys(ids, block_size)
        num_hit += block_size * sum(1 for key in keys if key in seen)
        seen.update(keys)
        num_prompt += len(ids)
        max_request = max(max_request, len(ids) + call.max_tokens)
        if k == len(agents[sid].calls) - 1:
            # the completion's ids are placeholders no prompt has; chaining keeps its blocks this session's
            full = ids + [-1] * call.max_tokens
            keys_of[sid] = block_keys(full, block_size)
            contexts[sid] = (len(keys_of[sid]), len(full) % block_size)
    best = (0, 0.0, 0, 0)
    for t in sorted({s.start_s for s in timeline.spans.values()}):
        live = [sid for sid, s in timeline.spans.items() if s.start_s <= t < s.end_s or s.start_s == t]
        distinct = {key for sid in live for key in keys_of[sid]}
        tokens = len(distinct) * block_size + sum(contexts[sid][1] for sid in live)
        if tokens > best[0]:
            unshared = sum(contexts[sid][0] * block_size + contexts[sid][1] for sid in live)
            best = (tokens, t, len(live), unshared)
    return WorkingSet(
        tokens=best[0], at_s=best[1], num_live=best[2], unshared_tokens=best[3], num_sessions=len(timeline.spans),
        num_calls=len(timeline.calls), prompt_tokens=num_prompt, ideal_hit_tokens=num_hit,
        ideal_hit_rate=num_hit / num_prompt if num_prompt else 0.0, max_request_tokens=max_request,
        nominal_duration_s=max(s.end_s for s in timeline.spans.values()),
    )
