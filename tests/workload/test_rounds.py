"""Round copies of a workload (`workload.rounds`): the same swarm, distinct to every prefix cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from hintkv.replay import OfflineConfig, replay_offline
from hintkv.workload.program import User, Workload
from hintkv.workload.rounds import workload_round
from hintkv.workload.traces import Scale
from hintkv.workload.users import build_workload

TRACES = Path("/work/shared/traces")
pytestmark = pytest.mark.skipif(not TRACES.exists(), reason="shared/traces not present")


@pytest.fixture(scope="module", params=["swe-agent", "claude-code"])
def wl(request):
    return build_workload(request.param, TRACES / request.param, 3, scale=Scale(1 / 32, max_calls=4), seed=1)


def test_a_round_copy_keeps_the_shape_and_renames_everything(wl):
    assert workload_round(wl, 0) is wl
    w1 = workload_round(wl, 1)
    assert [u.start_s for u in w1.users] == [u.start_s for u in wl.users]
    for t0, t1 in zip(wl.tasks(), w1.tasks(), strict=True):
        assert t1.task_id == t0.task_id + ".r1" == t1.root.session_id
        for a0, a1 in zip(t0.agents(), t1.agents(), strict=True):
            assert a1.session_id == a0.session_id + ".r1"
            for c0, c1 in zip(a0.calls, a1.calls, strict=True):
                assert (c1.num_prompt_tokens, c1.max_tokens, c1.wait_s, c1.stale_from, len(c1.spawns)) == \
                       (c0.num_prompt_tokens, c0.max_tokens, c0.wait_s, c0.stale_from, len(c0.spawns))
                assert all(0 <= t < 49152 for t in c1.prompt_ids())
                assert c1.prompt_ids() != c0.prompt_ids()
    assert w1.meta["round"] == 1


def test_rounds_replay_alike_and_share_no_block(wl):
    """Offline, through the real cache: a round copy hits exactly as the original, and a swarm of
    the original then the copy (each user again, after everything ended) hits exactly their sum
    with room for everything: nothing the first round cached is a hit for the second."""
    cfg = OfflineConfig(policy="sam", hints=True, device_blocks=100_000)
    w1 = workload_round(wl, 1)
    alone = [replay_offline(w, cfg) for w in (wl, w1)]
    assert alone[0].hit_tokens == alone[1].hit_tokens > 0
    later = alone[0].end_s + 1_000.0
    both = Workload(wl.name, (*wl.users, *(User(u.user_id + ".r1", later + u.start_s, u.tasks) for u in w1.users)))
    assert replay_offline(both, cfg).hit_tokens == alone[0].hit_tokens + alone[1].hit_tokens
    again = Workload(wl.name, (*wl.users, *(User(u.user_id + ".r0", later + u.start_s, u.tasks) for u in wl.users)))
    assert replay_offline(again, cfg).hit_tokens > 2 * alone[0].hit_tokens  # the same ids again do hit
