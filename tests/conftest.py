"""Imported before any test module: hintkv first, so that its OpenMP wait policy
(`hintkv/openmp_env.py`) is set before a test's `import torch` loads libgomp."""

import hintkv  # noqa: F401
