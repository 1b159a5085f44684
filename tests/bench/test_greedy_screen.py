"""The greedy screen probe (`python -m hintkv.bench.greedy_screen`): each case timed, tokens checked, rows counted."""

from __future__ import annotations

import pytest
import torch

from hintkv.bench import greedy_screen
from hintkv.models import greedy_head


@pytest.mark.skipif(not greedy_head.GreedyHead(torch.zeros(2, 64)).applies(), reason="no greedy screen here")
@pytest.mark.parametrize("logits", [None, "mkl"])  # None: the runner's own float kernel on this CPU
def test_probe_times_each_screen_and_counts_recomputed_rows(logits):
    rows = greedy_screen.rows_table(3001, 80, [1, 5], reps=1, logits_kernel=logits)
    assert [r["rows"] for r in rows] == [1, 5]
    for r in rows:
        assert r["blocked ms"] >= 0 and r["logits ms"] >= 0 and r["logits/blocked"] > 0
        assert 1 <= r["recomputed"] < 3001 * r["rows"]
        if greedy_head.ops().isa() == "vnni":  # the AVX2 column is the -mno-avx512f build
            assert r["avx2 ms"] >= 0 and r["avx2/blocked"] > 0
        else:
            assert "avx2 ms" not in r
