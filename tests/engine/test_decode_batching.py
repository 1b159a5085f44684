"""The scheduler's decode fast path (a run of decodes in one `append_many`) is the per-sequence
path's outcome: same batch, same preemptions, same blocks, same peak counts.

The reference is the same scheduler with a proposer that never drafts: with a proposer set, the
scheduler takes the per-sequence path for every running sequence. Small pools make decodes
cross block boundaries, run out of blocks and preempt; a budget below the sequence slots cuts
a run of decodes.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.cache.hashing import namespace_root
from hintkv.cache.manager import KVCacheManager
from hintkv.cache.policies import make_policy
from hintkv.engine.outputs import ModelRunnerOutput
from hintkv.engine.scheduler import Scheduler
from hintkv.engine.sequence import Sequence
from hintkv.engine.types import SamplingParams

ROOT = namespace_root("test", "float32", 4, None)


class NoDrafts:
    """A proposer that proposes nothing: forces the scheduler's per-sequence path."""

    num_speculative_tokens = 2

    def propose(self, seq: Sequence, k: int) -> list[int]:
        return []

    def on_finish(self, seq: Sequence) -> None:
        pass


def build(policy: str, admission: str, budget: int, per_sequence: bool) -> Scheduler:
    kv = KVCacheManager(14, 4, make_policy(policy))
    sched = Scheduler(kv, max_num_seqs=6, max_num_batched_tokens=budget, admission=admission)
    if per_sequence:
        sched.proposer = NoDrafts()
    return sched


def step(sched: Scheduler) -> tuple:
    out = sched.schedule()
    picture = ([(s.seq.request_id, s.num_new_tokens) for s in out.scheduled],
               [s.request_id for s in out.preempted], [s.request_id for s in out.out_of_room],
               {s.request_id: ([b.block_id for b in s.block_table], s.peak_kv_blocks)
                for s in sched.running})
    outs = sched.update_from_output(
        out, ModelRunnerOutput.from_tokens([7 if s.samples else None for s in out.scheduled]))
    sched.check_integrity()
    return picture, [(o.request_id, o.new_token_ids, o.finished) for o in outs]


@pytest.mark.parametrize("admission", ["fcfs", "short-first"])
@settings(max_examples=25, deadline=None)
@given(budget=st.sampled_from([3, 12]), reqs=st.lists(st.tuples(st.integers(1, 14), st.integers(1, 12), st.integers(0, 3)),
                     min_size=2, max_size=10))
def test_decode_run_matches_per_sequence_path(admission: str, budget: int, reqs: list) -> None:
    fast, slow = build("lru", admission, budget, False), build("lru", admission, budget, True)
    steps = 0
    for k, (plen, max_tokens, arrive_at) in enumerate(reqs):
        for s in (fast, slow):
            s.add_request(Sequence(f"r{k}", [k % 3] * plen, plen,
                                   SamplingParams(temperature=0, max_tokens=max_tokens), ROOT))
        for _ in range(arrive_at):
            if fast.has_work():
                assert step(fast) == step(slow)
                steps += 1
    while fast.has_work() or slow.has_work():
        assert step(fast) == step(slow)
        steps += 1
        assert steps < 2000

