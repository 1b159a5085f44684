"""Imported before any test module: hintkv first, so that its OpenMP wait policy
(`hintkv/openmp_env.py`) is set before a test's `import torch` loads libgomp.

The CPU keepers (engine/cpu_keeper.py, `auto` by default) are one set a process on the CPUs of the first engine
that starts them: the test session runs with HINTKV_CPU_KEEPER=0, so an engine a test builds with its own thread
count or binding does not take the set for the keeper tests (tests/engine/test_cpu_keeper.py names its mode)."""

import os

os.environ.setdefault("HINTKV_CPU_KEEPER", "0")

import hintkv  # noqa: E402, F401
