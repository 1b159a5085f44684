"""Imported before any test module: hintkv first, so that its OpenMP wait policy
(`hintkv/openmp_env.py`) is set before a test's `import torch` loads libgomp.

The CPU keepers (engine/cpu_keeper.py, `auto` by default) are one set a process on the CPUs of the first engine
that starts them: the test session runs with HINTKV_CPU_KEEPER=0, so an engine a test builds with its own thread
count or binding does not take the set for the keeper tests (tests/engine/test_cpu_keeper.py names its mode)."""

import os

os.environ.setdefault("HINTKV_CPU_KEEPER", "0")

import hintkv  # noqa: E402, F401


import pytest  # noqa: E402


@pytest.fixture()
def onednn_tiny(monkeypatch):
    """dummy:tiny loaded with oneDNN's packed linears (HINTKV_CPU_GEMM=onednn; skipped without oneDNN): the
    tests of which kernels a model packs (tests/models/test_last_layer_rows.py, tests/engine/test_engine_head_warm.py)."""
    import torch

    from hintkv.models import linear
    from hintkv.models.linear import OneDnnKernel
    from hintkv.models.loader import load_model

    if not OneDnnKernel.available(torch.zeros(1, 1)):
        pytest.skip("no oneDNN in this torch build")
    monkeypatch.setenv("HINTKV_CPU_GEMM", "onednn")
    linear.cpu_gemm.cache_clear()
    yield load_model("dummy:tiny", torch.float32, "cpu")
    monkeypatch.undo()
    linear.cpu_gemm.cache_clear()
