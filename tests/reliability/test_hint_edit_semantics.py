"""What each Agent Hint edit does to a session's KV, through a live server with a host tier (eager
offload): a range offload moves only the stale range and does not suspend the session (review rev25
A1), `compact` drops the root's own claim and keeps its suspended sub-agent's offloaded KV (A2), the
edits of one request apply in the order sent (A3), a forked sub-agent's evict keeps its parent's
shared prefix, offload -> prefetch -> resume hits the whole prefix with the same greedy output."""

from __future__ import annotations

import pytest
from faults import HEADERS, body, greedy, prompts, serving, wait_until

PROMPTS = prompts(4, length=64, seed=5)


@pytest.fixture(scope="module")
def served():
    with serving(kv_cache_tokens=1024, max_model_len=512, host_cache_memory="8MiB",
                 offload_mode="eager") as both:
        yield both


def _manage(client, session, edits, parent=None):
    return client.post("/v1/completions", headers=HEADERS, json={"prompt": "", "agent_hint": {
        "session_id": session, "parent_session_id": parent or session,
        "context_management": {"manage_request": True, "edits": edits}}})


def _session(client, session):
    return client.get(f"/v1/sessions/{session}", headers=HEADERS).json()


def test_range_offload_moves_exactly_the_stale_blocks(served):
    """agent-hint.md section 2: a range edit applies its action to "that part of the session's KV":
    an offload of tokens [32, 70) of a 64-token session moves blocks 2-3 and leaves blocks 0-1 on the
    device, and the session is not suspended (review rev25 A1; this form B5)."""
    engine, client = served
    greedy(client, PROMPTS[0], session="r1")
    r = _manage(client, "r1", [{"type": "offload", "target": "tokens", "start": 32, "end": 70}])
    assert r.status_code == 200, r.text
    edit = r.json()["agent_hint_result"]["edits"][0]
    assert edit["token_start"] == 32
    assert edit["tiers"]["device"]["tokens"] == -32 and edit["tiers"]["host"]["tokens"] == 32, edit
    greedy(client, PROMPTS[1], session="step-r1")  # eager: the tail's device copies drop once written
    assert wait_until(lambda: _session(client, "r1")["tokens_per_tier"] == {"device": 32, "host": 32}), \
        _session(client, "r1")
    assert _session(client, "r1")["state"] == "waiting"


def test_a_roots_evict_keeps_a_suspended_sub_agents_offloaded_kv(served):
    """agent-hint.md: evict drops THIS session's claim; a suspended (offloaded) resumable sub-agent
    keeps its KV for later. An evict of the parent session (also what session_control `compact`
    maps to) must not throw away the child's offloaded blocks."""
    engine, client = served
    greedy(client, PROMPTS[1], session="root-a")
    r = client.post("/v1/completions", headers=HEADERS, json={
        **body(PROMPTS[2]), "agent_hint": {"session_id": "root-a_sub_1", "parent_session_id": "root-a"}})
    assert r.status_code == 200, r.text
    assert _manage(client, "root-a_sub_1", [{"type": "offload", "target": "session"}],
                   parent="root-a").status_code == 200
    greedy(client, PROMPTS[0], session="stepper4")  # a step: the eager offload lands on the host
    assert wait_until(lambda: _session(client, "root-a_sub_1")["tokens_per_tier"].get("host", 0) >= 64), \
        _session(client, "root-a_sub_1")
    assert _session(client, "root-a_sub_1")["state"] == "suspended"
    removed = engine.engine.tier_stats()["tiers"]["host"]["removed"]
    r = client.post("/v1/completions", headers=HEADERS, json={"prompt": "", "agent_hint": {
        "session_id": "root-a", "parent_session_id": "root-a", "session_control": {"type": "compact"}}})
    assert r.status_code == 200, r.text
    after = _session(client, "root-a_sub_1")
    gone = engine.engine.tier_stats()["tiers"]["host"]["removed"] - removed
    assert after["state"] == "suspended" and gone == 0, (after, f"{gone} host blocks removed")


def test_edits_of_one_request_apply_in_order(served):
    """docs/protocol.md: the edits are applied in the order sent. A stale-range evict followed by a
    session prefetch prefetches only what the evict left (review rev25 A3: session edits used to
    run before every range edit, so the prefetch loaded the stale blocks back first)."""
    engine, client = served
    greedy(client, PROMPTS[3], session="ordered")
    assert _manage(client, "ordered", [{"type": "offload", "target": "session"}]).status_code == 200
    greedy(client, PROMPTS[0], session="stepper")  # eager offload drops device copies at a step
    assert wait_until(lambda: _session(client, "ordered")["tokens_per_tier"].get("device", 0) == 0)
    r = _manage(client, "ordered", [{"type": "evict", "target": "tokens", "start": 0, "end": 64},
                                    {"type": "prefetch", "target": "session"}])
    assert r.status_code == 200, r.text
    evict, prefetch = r.json()["agent_hint_result"]["edits"]
    assert evict["action"] == "evicted"
    assert prefetch["tiers"].get("device", {}).get("blocks", 0) == 0, prefetch  # nothing left to load


def test_a_forked_sub_agents_evict_keeps_its_parents_shared_prefix(served):
    engine, client = served
    parent = prompts(1, length=64, seed=40)[0]
    greedy(client, parent, session="fork-p")
    r = client.post("/v1/completions", headers=HEADERS, json={
        **body(parent + prompts(1, length=32, seed=41)[0]),
        "agent_hint": {"session_id": "fork-p_sub_1", "parent_session_id": "fork-p"}})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48, r.text
    assert _manage(client, "fork-p", [{"type": "offload", "target": "session"}]).status_code == 200
    e = _manage(client, "fork-p_sub_1", [{"type": "evict", "target": "session"}], parent="fork-p")
    assert e.status_code == 200, e.text
    greedy(client, PROMPTS[0], session="stepper2")
    p = _session(client, "fork-p")
    assert p["state"] == "suspended" and sum(p["tokens_per_tier"].values()) == p["held_tokens"], p


def test_the_resumed_turn_equals_a_cold_run(served):
    """offload -> prefetch -> resume: the next turn hits the whole prefix and its output equals the
    same prompt's run before the offload (review rev25 B5)."""
    engine, client = served
    p = prompts(1, length=80, seed=61)[0]
    out = greedy(client, p, session="resume2")
    cold = greedy(client, p + out + [7, 8, 9], session=None)  # the reference, before the offload
    assert _manage(client, "resume2", [{"type": "offload", "target": "session"}]).status_code == 200
    greedy(client, PROMPTS[2], session="step-resume2")
    assert wait_until(lambda: _session(client, "resume2")["tokens_per_tier"].get("device", 0) == 0)
    pre = _manage(client, "resume2", [{"type": "prefetch", "target": "session"}])
    assert pre.status_code == 200 and pre.json()["agent_hint_result"]["edits"][0]["action"] == "prefetched"
    r = client.post("/v1/completions", headers=HEADERS, json={
        **body(p + out + [7, 8, 9]), "agent_hint": {"session_id": "resume2", "parent_session_id": "resume2"}})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 80, r.text
    assert r.json()["choices"][0]["token_ids"] == cold


def test_an_explicit_offload_beats_a_ttl(served):
    """cache_control is "a soft protection, never a hard lock" (agent-hint.md section 4): a session
    whose requests carry a TTL and that the agent then offloads leaves the device, as the reply says
    (review rev25 B1)."""
    engine, client = served
    r = client.post("/v1/completions", headers=HEADERS, json={**body(PROMPTS[3]), "agent_hint": {
        "session_id": "ttl", "parent_session_id": "ttl", "cache_control": {"type": "ephemeral", "ttl": 300}}})
    assert r.status_code == 200, r.text
    o = _manage(client, "ttl", [{"type": "offload", "target": "session"}]).json()["agent_hint_result"]["edits"][0]
    assert o["tiers"]["device"]["tokens"] == -64, o
    greedy(client, PROMPTS[0], session="step-ttl")
    assert wait_until(lambda: _session(client, "ttl")["tokens_per_tier"].get("device", 0) == 0), \
        _session(client, "ttl")
