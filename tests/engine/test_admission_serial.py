"""`cache-aware-serial` (`hintkv.engine.admission_serial`): a candidate whose room would come out
of a returner's resident context waits for the returner when the expected recompute it saves
exceeds the wait. Real KV manager, session registry and `sam`; times are explicit, nothing is
mocked."""

from __future__ import annotations

import pytest

from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.cache.sam import SessionAwareManager
from hintkv.cache.sessions import SessionRegistry
from hintkv.cache.types import SessionRef
from hintkv.engine.admission import StepPlan, make_admission
from hintkv.engine.admission_serial import SerialAdmission, best_hold
from tests.engine.test_scheduler import make_seq

BS = 4


class World:
    """An 8-block device under `sam` and a returner `r` holding 4 of the blocks."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reg = SessionRegistry()
        self.kv = KVCacheManager(8, BS, make_policy("sam", sessions=self.reg))
        self.sam = SessionAwareManager(self.kv, self.reg, clock=lambda: self.now)
        self.n = 0
        for t in (0.0, 1.5, 3.0):  # r's calls take 1 s, its tools 0.5 s: back 0.5 s after each end
            self.call("r", list(range(16)), t, t + 1.0)  # the last ends at 4.0

    def seq(self, sid: str, prompt: list[int], max_tokens: int = 1):
        self.n += 1
        s = make_seq(f"{sid}{self.n}", prompt, max_tokens)
        s.session = SessionRef("t", sid, sid)
        return s

    def call(self, sid: str, prompt: list[int], t0: float, t1: float) -> None:
        self.now = t0
        key = self.sam.on_arrival(SessionRef("t", sid, sid))
        seq = self.seq(sid, prompt, 1)
        match = self.kv.match_prefix(seq)
        self.kv.admit(seq, match, len(prompt) - match.num_tokens)
        seq.num_computed_tokens = len(prompt)
        self.kv.commit(seq)
        self.now = t1
        hashes = list(seq.block_hashes[:len(prompt) // BS])
        self.kv.free(seq)
        self.sam.on_done(key, hashes)

    def room(self, seq, policy="cache-aware-serial", s_per_token=1.0):
        adm = make_admission(policy)
        if policy == "cache-aware-serial":
            adm.prefill_s_per_token = s_per_token
        adm.order([seq], self.kv)
        return adm.room(seq, self.kv.match_prefix(seq), self.kv, StepPlan()), adm


def test_a_request_that_needs_the_returners_blocks_waits_for_it():
    w = World()
    w.now = 4.2  # r's tools took 0.5 s twice: back at 4.5
    big = w.seq("c", list(range(100, 116)), 4)  # 5 blocks to the end: 4 free only without r's
    fits, adm = w.room(big)
    assert not fits and adm.num_held == 1 and adm.held_until == pytest.approx(4.5)
    assert w.room(big, "cache-aware")[0]  # plain cache-aware takes r's context for it
    small = w.seq("d", list(range(200, 212)), 1)  # 4 blocks: fits beside r's context
    assert w.room(small)[0]


def test_no_hold_for_an_overdue_suspended_or_own_session_or_an_unknown_cost():
    w = World()
    big = w.seq("c", list(range(100, 116)), 4)
    w.now = 4.7  # away longer than every gap r ever took: no history says it is coming back soon
    assert w.room(big)[0]
    w.now = 4.2
    assert w.room(big, s_per_token=None)[0]  # no prefill cost (the live engine): cache-aware
    w.reg.suspend(w.reg.get("t", "r").key)  # offloaded: away long
    assert w.room(big)[0]
    w2 = World()
    w2.now = 4.2
    own = w2.seq("r", [*range(16), *range(300, 304)], 4)  # r's own next call reads its context
    assert w2.room(own)[0]


def test_a_hold_is_taken_only_when_the_recompute_it_saves_exceeds_the_wait():
    # the candidate takes 1 of r's 4 blocks (lost_r = 1) and r, back, takes 1 of the candidate's
    # 5 (lost_c = 4 + 5 - 8 = 1): 2 blocks = 8 tokens saved against a 0.3 s wait
    for s_per_token, held in ((1.0, True), (0.05, True), (0.01, False)):  # saves 8 s, 0.4 s, 0.08 s
        w = World()
        w.now = 4.2
        big = w.seq("c", list(range(100, 116)), 4)
        fits, adm = w.room(big, s_per_token=s_per_token)
        assert fits is not held and (adm.held_until is not None) is held and adm.num_held == int(held)


def test_the_returners_eviction_of_the_candidates_context_counts(monkeypatch):
    # 0.05 s/token: lost_r alone saves 4 tokens = 0.2 s < the 0.3 s wait; with lost_c, 0.4 s > 0.3 s
    monkeypatch.setattr(SerialAdmission, "MUTUAL", False)
    w = World()
    w.now = 4.2
    assert w.room(w.seq("c", list(range(100, 116)), 4), s_per_token=0.05)[0]


def test_the_candidates_context_counts_only_when_no_one_else_waits():
    # as above at 0.05 s/token, but a second candidate waits: its admission would evict the first
    # one's context anyway, so only lost_r counts (0.2 s < 0.3 s): no hold
    w = World()
    w.now = 4.2
    big, other = w.seq("c", list(range(100, 116)), 4), w.seq("d", list(range(200, 204)), 1)
    adm = make_admission("cache-aware-serial")
    adm.prefill_s_per_token = 0.05
    assert adm.order([big, other], w.kv)[0] is big
    assert adm.room(big, w.kv.match_prefix(big), w.kv, StepPlan()) and adm.num_held == 0


def test_best_hold_maximizes_the_expected_saving_net_of_the_wait():
    rest = [0.1, 0.2, 5.0]  # back within 0.1 s 1 time in 3, within 0.2 s 2 in 3, else 5 s
    assert best_hold([(rest, 1.0)]) == 0.2  # 2/3 - 0.2 beats 1/3 - 0.1 and 1 - 5
    assert best_hold([(rest, 0.2)]) is None  # no hold gains: 1/3 * 0.2 < 0.1
    assert best_hold([(rest, 100.0)]) == 5.0  # a large saving is worth the long wait
    assert best_hold([]) is None


def test_each_returner_weighs_only_its_own_saving():
    # sum over returners of P_i(h) * saved_i - h: a returner surely back in 0.1 s that saves 0.05 s
    # does not pay for one due in 10 s that saves 1 s (max P x both savings would hold 0.1 s)
    assert best_hold([([0.1], 0.05), ([10.0], 1.0)]) is None
    assert best_hold([([0.5], 1.0), ([0.1, 9.0], 1.0)]) == 0.5  # 1 + 1/2 - 0.5 beats 1/2 - 0.1
    assert best_hold([([0.3], 0.2), ([0.3], 0.2)]) == 0.3  # both back by 0.3 s: 0.4 - 0.3 (each alone: none)
    assert best_hold([([0.3], 0.2)]) is None


def test_the_live_engine_refuses_it_naming_why(capsys):
    """Live it would take no hold (no prefill time model): serve's config, `hintkv sim` and `bench
    swarm_sched` refuse the name as a usage error instead of running plain cache-aware."""
    from hintkv.bench import swarm_sched
    from hintkv.cli import main
    from hintkv.config import EngineConfig
    from hintkv.engine.admission import admission_names, live_admission_names
    from hintkv.sim import run as sim_run

    why = "cache-aware-serial is an offline-replay study policy"
    assert "cache-aware-serial" in admission_names() and "cache-aware-serial" not in live_admission_names()
    with pytest.raises(ValueError, match=why):
        EngineConfig(scheduling_policy="cache-aware-serial")
    assert main(["serve", "--scheduling-policy", "cache-aware-serial"]) == 2 and why in capsys.readouterr().err
    for run, args in ((sim_run.main, ["--scheduling-policy", "cache-aware-serial"]),
                      (swarm_sched.main, ["--admission", "cache-aware-serial"])):
        with pytest.raises(SystemExit) as exit_:
            run(args)
        assert exit_.value.code == 2 and why in capsys.readouterr().err
    assert sim_run.main(["--configs", "lru/cache-aware-serial"]) == 2 and why in capsys.readouterr().err


def test_the_config_help_names_every_admission_it_accepts():
    from hintkv.config import EngineConfig
    from hintkv.engine.admission import live_admission_names

    help_text = EngineConfig.__dataclass_fields__["scheduling_policy"].metadata["help"]
    for name in live_admission_names():
        EngineConfig(scheduling_policy=name)
        assert f"{name} (" in help_text
