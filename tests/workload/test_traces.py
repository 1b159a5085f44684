"""Trace loaders on the real files in shared/traces: counts, sub-agent structure, deterministic blocks."""

from __future__ import annotations

import gzip
import itertools
import shutil
from pathlib import Path

import pytest

from hintkv.workload.traces import Scale, load_claude_code, load_swe_agent, team_task
from hintkv.workload.users import build_workload

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
if not TRACES.exists():
    TRACES = Path("/work/shared/traces")
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared/traces not present")


@pytest.fixture(scope="module")
def claude():
    return load_claude_code(TRACES / "claude-code")


@pytest.fixture(scope="module")
def swe():
    return load_swe_agent(TRACES / "swe-agent")


def _ids(call):
    return call.prompt_ids()


def test_claude_code_counts_and_subagents(claude):
    assert len(claude) == 100
    with_subs = [s for s in claude if s.num_subagents()]
    assert len(with_subs) == 12
    s = with_subs[0]
    task = s.task("t0", Scale(0.0625, max_calls=None))
    agents = task.agents()
    assert agents[0].session_id == "t0"
    subs = [a for a in agents[1:]]
    assert len(subs) == s.num_subagents()
    assert all(a.session_id.startswith("t0_sub_agent_") for a in subs)
    # sub-agents hang off the parent's calls and share the parent's id space
    spawning = [c for c in task.root.calls if c.spawns]
    assert sum(len(c.spawns) for c in spawning) == len(subs)
    parent_calls = [r for r in s.requests if r.get("type") != "subagent"]
    assert len(task.root.calls) == len(parent_calls)


def test_claude_code_blocks_are_deterministic_and_scaled(claude):
    s = claude[0]
    scale = Scale(0.25)
    a, b = s.task("x", scale), s.task("y", scale)
    reqs = [r for r in s.requests if r.get("type") != "subagent"]
    for ca, cb, r in zip(a.root.calls, b.root.calls, reqs):
        assert _ids(ca) == _ids(cb)  # same file, same salt: same tokens whatever the task id
        assert ca.num_prompt_tokens == round(r["in"] * 0.25)
        assert ca.max_tokens == max(1, round(r["out"] * 0.25))
    other = s.task("x", scale, salt="r1")
    assert _ids(other.root.calls[0]) != _ids(a.root.calls[0])
    # equal hash ids at equal positions give equal tokens: the recorded prefix reuse is exact
    r0, r1 = reqs[0]["hash_ids"], reqs[1]["hash_ids"]
    common = next(i for i, (x, y) in enumerate(zip(r0 + [None], r1)) if x != y)
    t0, t1 = _ids(a.root.calls[0]), _ids(a.root.calls[1])
    assert t0[:common * 16] == t1[:common * 16]
    if common < len(r1):
        assert t0[common * 16:(common + 1) * 16] != t1[common * 16:(common + 1) * 16]
    # think_time of the next request is the tool wait after a call
    assert a.root.calls[0].wait_s == pytest.approx(reqs[1]["think_time"] or 0.0)
    assert a.root.calls[-1].wait_s == 0.0


def test_claude_code_block_tokens_are_the_digest_per_token(claude):
    """The batched draw (`_Blocks.many`, numpy) gives each hash id the tokens of the per-token
    formula it replaced: SHAKE-128 of (seed, id) read as native uint16, TOKEN_LOW + v % span.
    Every token id of every recorded workload depends on it."""
    import hashlib
    from array import array

    from hintkv.workload.traces.claude_code import TOKEN_HIGH, TOKEN_LOW, _Blocks

    def reference(seed: bytes, n: int) -> tuple[int, ...]:
        raw = array("H", hashlib.shake_128(seed).digest(2 * n))
        return tuple(TOKEN_LOW + v % (TOKEN_HIGH - TOKEN_LOW) for v in raw)

    blocks = _Blocks("trace_0002:0:1", 16)
    hids = [7, 3, 7, 123456, 0, 3]  # repeats and ids drawn before
    assert blocks[3] == reference(b"trace_0002:0:1:3", 16)
    got = blocks.many(hids)
    assert got == [reference(b"trace_0002:0:1:" + str(h).encode(), 16) for h in hids]
    assert got[0] is got[2]  # one tuple per id: prompts share their chunks
    assert blocks.tail("main:4", 37) == reference(b"trace_0002:0:1:tail:main:4", 37)
    # and through a task: the first call's first block is the first hash id's draw
    s = claude[0]
    first = next(r for r in s.requests if r.get("type") != "subagent")
    call = s.task("t", Scale(1.0), salt="r").root.calls[0]
    assert call.prompt[0] == reference(f"{s.name}:r:{first['hash_ids'][0]}".encode(), 64)


def test_claude_code_tokens_share_one_int_object_per_id(claude):
    """Every drawn token id is one shared int object (8 bytes a token in a block, not 36): the
    1000-user workload's ~250M distinct block tokens fit only that way."""
    task = claude[0].task("t", Scale(1.0), salt="r")
    tokens = [t for a in task.agents() for c in a.calls for chunk in c.prompt for t in chunk]
    assert len(tokens) > 10_000
    assert len({id(t) for t in tokens}) == len(set(tokens))


def test_gzip_or_not(tmp_path, claude):
    src = TRACES / "claude-code" / "trace_0002.json.gz"
    with gzip.open(src, "rb") as f, open(tmp_path / "trace_0002.json", "wb") as g:
        shutil.copyfileobj(f, g)
    plain = load_claude_code(tmp_path)
    assert len(plain) == 1 and plain[0].name == "trace_0002"
    gz = next(s for s in claude if s.name == "trace_0002")
    assert _ids(plain[0].task("a").root.calls[3]) == _ids(gz.task("a").root.calls[3])


def test_swe_agent_calls_text_and_tool_times(swe):
    assert len(swe) == 50
    run = swe[0]
    task = run.task("s0", Scale(0.25, max_calls=8))
    calls = task.root.calls
    assert len(calls) == 8
    for a, b in itertools.pairwise(calls):
        ia, ib = _ids(a), _ids(b)
        assert len(ib) > len(ia) and ib[:len(ia) - 3] == ia[:-3]  # the window grows; the header differs
    assistants = [t for t in run.turns if t.role == "assistant"]
    tools = [t for t in run.turns if t.role == "tool"]
    assert calls[0].wait_s == pytest.approx(tools[0].timestamp - assistants[0].timestamp)
    assert calls[0].max_tokens == max(1, round(assistants[0].completion_tokens * 0.25))
    full = run.task("s0", Scale(1.0))
    assert len(full.root.calls) == run.num_calls


def test_swe_team_shape(swe):
    task = team_task("team", swe[0], swe[1:4], Scale(0.25, max_calls=5))
    root = task.root
    spawning = [c for c in root.calls if c.spawns]
    assert len(spawning) == 1 and len(spawning[0].spawns) == 3
    lead = _ids(root.calls[0])
    head = len(lead) - 3  # system + task, without the assistant header
    for sp in spawning[0].spawns:
        assert _ids(sp.agent.calls[0])[:head] == lead[:head]  # teammates share the leader's prefix
        assert sp.agent.session_id.startswith("team_sub_")
    assert len(root.calls) == 3  # two planning calls and the merge


def test_build_workload_is_seeded(swe):
    a = build_workload("swe-agent", TRACES / "swe-agent", 3, tasks_per_user=2, scale=Scale(0.25, 3), seed=1)
    b = build_workload("swe-agent", TRACES / "swe-agent", 3, tasks_per_user=2, scale=Scale(0.25, 3), seed=1)
    c = build_workload("swe-agent", TRACES / "swe-agent", 3, tasks_per_user=2, scale=Scale(0.25, 3), seed=2)
    assert [t.source for t in a.tasks()] == [t.source for t in b.tasks()]
    assert [u.start_s for u in a.users] == [u.start_s for u in b.users]
    assert [t.source for t in a.tasks()] != [t.source for t in c.tasks()]
    assert len({t.source for t in a.tasks()}) == 6  # dealt without repeats while traces last
    assert a.users[0].start_s == 0.0


def test_swe_agent_texts_are_encoded_once_for_every_salt(swe):
    """A run dealt again under another salt differs only in its system message: with a shared
    `encoded`, only that message is encoded again, and every call's token ids are the ones a
    task built on its own gets (the real tokenizer)."""
    from hintkv.workload.traces.swe_agent import default_encode

    real = default_encode()
    seen: list[str] = []

    def encode(texts):
        seen.extend(texts)
        return real(texts)

    scale = Scale(0.25, max_calls=4)
    run = swe[0]
    shared: dict[str, list[int]] = {}
    a = run.task("a", scale, encode=encode, salt="0:0", encoded=shared)
    first = len(seen)
    b = run.task("b", scale, encode=encode, salt="0:1", encoded=shared)
    again = [t for t in seen[first:] if not t.startswith("<|im_")]  # (the ChatML frames: tiny)
    assert again == [f"0:1{run.turns[0].text}"]  # only the salted system message
    for task, salt in ((a, "0:0"), (b, "0:1")):
        alone = run.task("x", scale, encode=real, salt=salt)
        assert [_ids(c) for c in task.root.calls] == [_ids(c) for c in alone.root.calls]
    assert _ids(a.root.calls[0]) != _ids(b.root.calls[0])  # the salt still makes them distinct
