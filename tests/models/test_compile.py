"""The compiled step (compile.py) gives the same greedy tokens as eager float32, and falls back to
eager with a warning when inductor cannot build its C++ (a compiler that does not exist)."""

from __future__ import annotations

import shutil

import pytest
import torch

from hintkv.bench.accuracy import OneSequence, greedy
from hintkv.models.loader import load_model

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                               reason="inductor's CPU backend needs a C++ compiler")


@needs_cxx
def test_compiled_tiny_model_decodes_like_eager():
    eager = load_model("dummy:tiny", torch.float32, "cpu", seed=3)
    compiled = load_model("dummy:tiny", torch.float32, "cpu", seed=3)
    regions = compiled.model.compile()
    assert regions.compiled and regions.warmup_s > 0
    prompt = list(range(100, 137))
    assert greedy(compiled.model, prompt, 12) == greedy(eager.model, prompt, 12)
    # prefill, chunked prefill on a cached prefix, then decode rows: logits stay float32-close
    a, b = OneSequence(eager.model, 64), OneSequence(compiled.model, 64)
    for chunk in (prompt[:20], prompt[20:], [5], [6]):
        torch.testing.assert_close(b.step(chunk), a.step(chunk), atol=1e-4, rtol=1e-4)


def test_compile_falls_back_to_eager_without_a_compiler(monkeypatch):
    import torch._dynamo
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()  # nothing cached from an earlier compile may hide the failure
    monkeypatch.setattr(inductor_config.cpp, "cxx", ("/nonexistent/c++",))
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    lm = load_model("dummy:tiny", torch.float32, "cpu", seed=1)
    with pytest.warns(RuntimeWarning, match="running eager"):
        regions = lm.model.compile()
    torch._dynamo.reset()
    assert not regions.compiled
    assert len(greedy(lm.model, [100, 101, 102], 4)) == 4  # and it still runs


def test_regions_for_rows_runs_eager_inside_the_band():
    from hintkv.models.compile import CUDA_EAGER_ROWS, EAGER, Regions

    band = Regions(compiled=True, eager_rows=CUDA_EAGER_ROWS)
    lo, hi = CUDA_EAGER_ROWS
    assert band.for_rows(1) is band and band.for_rows(lo - 1) is band and band.for_rows(hi) is band
    assert band.for_rows(lo) is EAGER and band.for_rows(hi - 1) is EAGER and not EAGER.compiled
    plain = Regions(compiled=True)  # a CPU compile: no band
    assert all(plain.for_rows(n) is plain for n in (1, lo, hi - 1, hi))


def test_the_forward_takes_the_regions_of_its_row_count():
    """A step inside the band runs the eager functions, one outside runs the model's own (counted), with the
    same hidden states as a model on plain eager regions."""
    from hintkv.models import compile as c

    calls = []

    def counted(fn):
        def run(*a, **k):
            calls.append(fn.__name__)
            return fn(*a, **k)
        return run

    banded = load_model("dummy:tiny", torch.float32, "cpu", seed=5).model
    plain = load_model("dummy:tiny", torch.float32, "cpu", seed=5).model
    banded.regions = c.Regions(counted(c.add_rmsnorm), counted(c.rope), counted(c.silu_mul), compiled=True,
                               eager_rows=(2, 100))
    plain.regions = c.Regions()  # the per-op layers' eager functions (not the CPU's C++ regions)
    a, b = OneSequence(plain, 64), OneSequence(banded, 64)
    torch.testing.assert_close(b.hidden(list(range(100, 110))), a.hidden(list(range(100, 110))))
    assert calls == []  # 10 rows: inside the band
    torch.testing.assert_close(b.hidden([7]), a.hidden([7]), atol=1e-5, rtol=1e-5)
    assert {"add_rmsnorm", "rope", "silu_mul"} <= set(calls)  # 1 row: the model's own regions
