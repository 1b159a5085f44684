"""`host_copy.copy_rows`: the host tier's batched copies, as slice copies of runs (on one thread or cut across
several), give the indexed assignment's bytes."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hintkv.tiers import host_copy
from hintkv.tiers.host_copy import _split, copy_rows, runs


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_copy_rows_equals_indexed_assignment(data):
    n_src, n_dst = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))
    k = data.draw(st.integers(0, n_dst))
    dst_rows = data.draw(st.permutations(range(n_dst)))[:k]  # distinct destination rows, any order
    src_rows = data.draw(st.lists(st.integers(0, n_src - 1), min_size=k, max_size=k))  # repeats allowed
    threads = data.draw(st.sampled_from([1, 2, 3, 5]))
    src = torch.randn(n_src, 3, 2, dtype=torch.bfloat16)
    want, got = torch.zeros(n_dst, 3, 2, dtype=torch.bfloat16), torch.zeros(n_dst, 3, 2, dtype=torch.bfloat16)
    if k:
        want[torch.tensor(dst_rows)] = src[torch.tensor(src_rows)]
    saved, host_copy.PARALLEL_BYTES = host_copy.PARALLEL_BYTES, 0  # every copy large enough to be cut
    try:
        copy_rows(got, dst_rows, src, src_rows, threads)
    finally:
        host_copy.PARALLEL_BYTES = saved
    assert torch.equal(got, want)


def test_runs_and_their_pieces():
    assert runs([3, 4, 5, 0, 1], [10, 11, 12, 2, 3]) == [(3, 10, 3), (0, 2, 2)]
    assert runs([1, 2], [5, 7]) == [(1, 5, 1), (2, 7, 1)]  # the source jumps: two runs
    assert runs([], []) == []
    pieces = _split([(0, 100, 10)], 4)  # 10 rows over 4 threads: pieces of 3, never past the run
    assert pieces == [(0, 100, 3), (3, 103, 3), (6, 106, 3), (9, 109, 1)]


def test_threads_only_for_a_pinned_buffer():
    assert host_copy.copy_threads(False) == 1
    assert 1 <= host_copy.copy_threads(True) <= host_copy.MAX_THREADS
