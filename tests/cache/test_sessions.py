"""SAM bookkeeping without a model: the session state machine, ownership, and the `sam` order."""

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.policies.base import UNHELD
from hintkv.cache.policies.sam import RUNNING
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry, SessionState
from hintkv.cache.types import CacheEdit, SessionRef
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import SeqStatus, Sequence
from hintkv.engine.types import SamplingParams

BS = 4
ROOT = namespace_root("test", "float32", BS, None)


class Harness:
    """The engine's bookkeeping path (scheduler + KV manager + SAM) driven without a model: each
    step's runner output is made up (one token per sampling sequence), the scheduler does the rest."""

    def __init__(self, num_blocks: int, policy: str = "sam", clock=time.monotonic) -> None:
        self.sessions = SessionRegistry(protect_budget_blocks=num_blocks // 2)
        self.kv = KVCacheManager(num_blocks, BS, make_policy(policy, sessions=self.sessions, clock=clock))
        self.sam = SessionAwareManager(self.kv, self.sessions, clock=clock)
        self.sched = Scheduler(self.kv, max_num_seqs=8, max_num_batched_tokens=64, sam=self.sam, clock=clock)
        self.n = 0

    def run(self, ref: SessionRef | None, prompt: list[int], max_tokens: int = 2) -> Sequence:
        self.n += 1
        seq = Sequence(f"r{self.n}", list(prompt), len(prompt), SamplingParams(temperature=0, max_tokens=max_tokens),
                       ROOT, session=ref)
        self.sched.add_request(seq)
        while seq.status is not SeqStatus.FINISHED:
            out = self.sched.schedule()
            tokens = [1000 + self.n if s.samples else None for s in out.scheduled]
            self.sched.update_from_output(out, ModelRunnerOutput.from_tokens(tokens))
            self.sched.check_integrity()
        return seq

    def check(self) -> None:
        self.sched.check_integrity()


def ref(sid: str, parent: str | None = None, tenant: str = "t") -> SessionRef:
    return SessionRef(tenant, sid, parent or sid)


SYSTEM = list(range(1, 17))  # a shared 16-token (4-block) system prompt


def test_state_machine_and_tree():
    h = Harness(64)
    h.run(ref("lead"), SYSTEM + [50, 51, 52, 53])
    h.run(ref("lead_sub_1", "lead"), SYSTEM + [60, 61, 62, 63])
    reg = h.sessions
    lead, sub = reg.get("t", "lead"), reg.get("t", "lead_sub_1")
    assert lead.state is SessionState.WAITING and sub.parent == lead.key
    assert lead.key in reg.holders[lead.held[0]] and sub.key in reg.holders[lead.held[0]], \
        "the shared system prompt is held by both and stored once"
    assert h.sam.apply(ref("lead_sub_1", "lead"), CacheEdit("offload")).action == "offloaded"
    assert sub.state is SessionState.SUSPENDED
    h.sam.apply(ref("lead_sub_1", "lead"), CacheEdit("prefetch"))
    assert sub.state is SessionState.WAITING and h.kv.ranking.session_class(sub.key) == RUNNING
    h.sam.apply(ref("lead"), CacheEdit("evict"))  # a root's evict ends the whole tree
    assert lead.state is SessionState.ENDED and sub.state is SessionState.ENDED
    assert not reg.holders
    pool = h.kv.pool
    assert pool.num_cached_free == 6, "released, not dropped: still matchable"
    assert pool.num_cached_below(UNHELD + 1) == 6, "nobody holds them: the first to be reclaimed"
    h.check()


def test_a_management_requests_cache_control_protects_the_session():
    """cache_control on a management request (a prefetch before a resume) protects the session as
    an arrival's does (review rev25 A7); an evict or an offload takes none, and an offload ends the
    protection (B1)."""
    h = Harness(64)
    h.run(ref("a"), SYSTEM + [50, 51, 52, 53])
    a = h.sessions.get("t", "a")
    assert a.protect_until == 0.0
    h.sam.apply(SessionRef("t", "a", "a", ttl_s=600.0), CacheEdit("prefetch"))
    assert a.protect_until > time.monotonic() + 500
    h.run(ref("b"), SYSTEM + [60, 61, 62, 63])
    h.sam.apply(SessionRef("t", "b", "b", ttl_s=600.0), CacheEdit("evict"))
    assert h.sessions.get("t", "b").protect_until == 0.0
    h.sam.apply(SessionRef("t", "a", "a", ttl_s=600.0), CacheEdit("offload"))  # an offload beats the TTL
    assert a.protect_until == 0.0
    h.check()


def test_evict_is_idempotent_and_unknown_sessions_are_noops():
    h = Harness(32)
    assert h.sam.apply(ref("ghost"), CacheEdit("evict")).action == "none"
    h.run(ref("a"), SYSTEM + [9])
    first = h.sam.apply(ref("a"), CacheEdit("evict"))
    second = h.sam.apply(ref("a"), CacheEdit("evict"))
    assert first.tiers["device"][0] < 0 and second.tiers["device"] == (0, 0)
    h.check()


def test_range_evict_keeps_the_prefix_and_releases_the_stale_tail():
    h = Harness(32)
    h.run(ref("a"), SYSTEM + list(range(100, 120)), max_tokens=1)
    held = list(h.sessions.get("t", "a").held)
    out = h.sam.apply(ref("a"), CacheEdit("evict", token_start=18))  # stale from block 4 on
    assert h.sessions.get("t", "a").held == held[:4]
    assert out.tiers["device"][0] == -(len(held) - 4)
    pool = h.kv.pool
    assert all(pool.class_of(pool.lookup(x)) == UNHELD for x in held[4:])  # first to go, still cached
    assert all(pool.class_of(pool.lookup(x)) > UNHELD for x in held[:4])
    h.check()


def test_evicted_blocks_match_until_reclaimed_and_go_before_held_ones():
    """An evict releases a session's blocks: a later prompt sharing them still hits, and under
    pressure they are reclaimed before any block a live session holds."""
    h = Harness(16)
    h.run(ref("a"), SYSTEM + list(range(100, 116)), max_tokens=1)  # 8 full blocks
    h.run(ref("b"), list(range(200, 216)), max_tokens=1)  # 4 blocks, still held
    a_blocks = list(h.sessions.get("t", "a").held)
    b_blocks = list(h.sessions.get("t", "b").held)
    h.sam.apply(ref("a"), CacheEdit("evict"))
    again = h.run(ref("c"), SYSTEM + list(range(100, 116)), max_tokens=1)
    assert again.num_cached_tokens == 28, "the released blocks still match (7 full blocks before the last token)"
    h.sam.apply(ref("c"), CacheEdit("evict"))
    assert h.kv.pool.num_free - h.kv.pool.num_cached_free < 10
    h.run(None, list(range(300, 336)), max_tokens=1)  # needs 10 blocks: more than are empty
    pool = h.kv.pool
    assert all(pool.lookup(x) is not None for x in b_blocks), "held blocks stay"
    assert sum(pool.lookup(x) is None for x in a_blocks) > 0, "released ones went first"
    h.check()


def test_tenants_cannot_touch_each_other():
    h = Harness(32)
    h.run(ref("s", tenant="alice"), SYSTEM + [7])
    assert h.sam.apply(ref("s", tenant="mallory"), CacheEdit("evict")).action == "none"
    assert h.sessions.get("alice", "s").state is SessionState.WAITING
    assert h.sam.describe("mallory", "s") is None and h.sam.describe("alice", "s") is not None


def test_describe_shows_the_ttl_protection_left():
    """hard28: GET /v1/sessions/{id} did not say until when a cache_control.ttl keeps a session; `protect_left_s`
    is that, on SAM's clock (a virtual one here), None when nothing protects the session."""
    now = [1000.0]
    h = Harness(32, clock=lambda: now[0])
    h.run(ref("plain"), SYSTEM + [5])
    h.run(SessionRef("t", "kept", "kept", ttl_s=300.0), SYSTEM + [6])
    assert h.sam.describe("t", "plain").protect_left_s is None
    assert h.sam.describe("t", "kept").protect_left_s == 300.0
    now[0] += 120.25
    assert h.sam.describe("t", "kept").protect_left_s == 179.75
    h.sam.apply(SessionRef("t", "kept", "kept", ttl_s=60.0), CacheEdit("prefetch"))  # a ttl starts it again
    assert h.sam.describe("t", "kept").protect_left_s == 60.0
    now[0] += 60.0
    assert h.sam.describe("t", "kept").protect_left_s is None, "ran out"
    h.run(SessionRef("t", "kept", "kept", ttl_s=30.0), SYSTEM + [7])
    assert h.sam.describe("t", "kept").protect_left_s == 30.0
    h.sam.apply(ref("kept"), CacheEdit("offload"))  # a pause beats the ttl
    assert h.sam.describe("t", "kept").protect_left_s is None
    h.check()


def test_sam_orders_unheld_then_suspended_then_waiting_then_running():
    h = Harness(64)
    h.run(None, [200 + i for i in range(8)])  # nobody holds this
    h.run(ref("susp"), [300 + i for i in range(8)])
    h.run(ref("wait"), [400 + i for i in range(8)])
    h.sam.apply(ref("susp"), CacheEdit("offload"))
    now = time.monotonic()
    h.sessions.on_arrival("t", "run", "run", now)  # running right now
    h.sessions.on_done(h.sessions.get("t", "run").key, [], now)
    h.sessions.on_arrival("t", "run", "run", now)
    run_hashes = [b"run-" + bytes([i]) for i in range(2)]
    h.sessions._set_held(h.sessions.get("t", "run"), run_hashes)
    blocks = h.kv.pool.allocate(2)
    for b, x in zip(blocks, run_hashes):
        h.kv.pool.register(b, x)
    h.kv.pool.release(blocks)
    order = h.kv.pool.choose_victims(h.kv.pool.num_cached_free)
    owner = {}
    for name in ("susp", "wait", "run"):
        for x in h.sessions.get("t", name).held:
            owner[x] = name
    labels = [owner.get(b.hash, "nobody") for b in order]
    first = {lab: labels.index(lab) for lab in set(labels)}
    assert first["nobody"] < first["susp"] < first["wait"] < first["run"], labels
    h.check()


def test_soft_protection_never_deadlocks_when_everything_is_protected():
    h = Harness(12)
    for i in range(6):
        r = SessionRef("t", f"s{i}", f"s{i}", ttl_s=3600)
        h.run(r, [i * 50 + j for j in range(9)])
        h.sam.apply(r, CacheEdit("prefetch"))
    # every cached block is protected; new work must still get blocks
    seq = h.run(ref("late"), [999] * 30, max_tokens=3)
    assert seq.num_output_tokens == 3
    h.check()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["run", "run", "offload", "prefetch", "evict", "range"]),
                          st.integers(0, 4), st.integers(0, 20)), max_size=40))
def test_random_multi_session_workload_keeps_ownership_consistent(ops):
    h = Harness(24)
    for op, k, m in ops:
        r = ref(f"s{k}", "s0" if k else None)
        if op == "run":
            h.run(r, SYSTEM + [k * 100 + j for j in range(m)], max_tokens=1 + m % 3)
        elif op == "range":
            h.sam.apply(r, CacheEdit("evict", token_start=m))
        else:
            h.sam.apply(r, CacheEdit(op))
        h.check()
        for owners in h.sessions.holders.values():
            assert all(h.sessions.sessions[o].state is not SessionState.ENDED for o in owners)
    assert h.kv.pool.num_in_use == 0
