"""Build every C++ CPU extension before the tests (`.ci/run`), one build per CPU at a time.

Each extension is one g++ run over one translation unit (load_inline's main.cpp), mostly torch's headers:
one core each. Built one after another, a fresh clone's seven builds used one of the two cores for minutes
while the other idled; here each worker process imports its builder's module and calls it, the longest
first. A failed build is not fatal here: tests/test_ci_prebuild.py fails with the compiler's output.
tests/test_ci_prebuild.py also checks that BUILDERS names every function that calls `cpu_ext.load`.

    python .ci/prebuild.py [--jobs N]    (default: this process's CPUs, at most one per builder)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from importlib import import_module

# (module, its function that calls cpu_ext.load); decode_layers first: its source holds cpu_kernels' and gemv's too
BUILDERS = [
    ("hintkv.models.decode_layers", "ops"),
    ("hintkv.models.int8_cpu", "ops"),
    ("hintkv.models.cpu_kernels", "ops"),
    ("hintkv.models.greedy_head", "ops"),
    ("hintkv.models.gemv_cpu", "ops"),
    ("hintkv.models.packed_gemm", "ops"),
    ("hintkv.engine.cpu_keeper", "_ops"),
    ("hintkv.engine.cpu_threads", "_ops"),
]


def build(builder: tuple[str, str]) -> tuple[str, bool, float]:
    """Build one extension (or load its cached build): (its call, whether it built, seconds)."""
    module, fn = builder
    t0 = time.monotonic()
    ok = getattr(import_module(module), fn)() is not None
    return f"{module}.{fn}()", ok, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=min(len(os.sched_getaffinity(0)), len(BUILDERS)))
    args = p.parse_args(argv)
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for call, ok, seconds in pool.map(build, BUILDERS):
            print(f"{call}: {'built' if ok else 'FAILED (eager ops)'} in {seconds:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
