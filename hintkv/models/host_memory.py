"""Freed host memory stays in the process, so a CPU model step reuses warm pages.

A float32 CPU step allocates its activations fresh (GEMM outputs of 12-25 MB at 2048 tokens on
dummy:tiny, a 400 MB logits block when every row is scored). glibc serves large blocks with mmap
and unmaps them on free, or trims the heap top back to the kernel, so a later step can page-fault
them in again: measured with `getrusage` minor faults, 0.3K-24K per dummy:tiny forward (512-2048
tokens) with the defaults, depending on the history of glibc's dynamic thresholds, ~100K for a
OneSequence step scoring 2048 rows. `keep_freed_memory()` raises the mmap threshold to 256 MB
(larger blocks, e.g. a KV cache, are still mapped) and the trim threshold to 1 GiB, so freed
activations stay in malloc's free lists: none then. The forward's CPU time moved within noise
(dummy:tiny, one thread, 512 tokens 296-311 vs 310-311 ms; docs/benchmarks/history/engine.md, eighth
session); it removes a variable, not a measured cost. No-op off glibc.

It also keeps one malloc arena (M_ARENA_MAX 1, as MALLOC_ARENA_MAX=1): a server's steps run on the
engine thread, whose own arena grows in 64 MB heaps that glibc unmaps whole once their top is free
(`heap_trim` deletes an empty heap whatever the trim threshold), so every 2048-token prefill mapped its
activations afresh: 29K minor faults and 60-70 ms of system time (both OpenMP threads fault the pages
they first write) per request in `hintkv serve`, 12-28K on alternate requests through `AsyncLLM` in a fresh process; 2-5 with one
arena (sixteenth session, docs/benchmarks/history/engine.md). vLLM's CPU worker runs its model on its
process's main thread, whose arena is the main one. Set before any thread exists (`hintkv serve` calls it
first thing; the model runner again, a no-op then, for engines built in process): glibc keeps in use an
arena a thread took before the cap, or one an exited thread left for reuse. HINTKV_MALLOC_ARENA_MAX=0
leaves the arenas as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters
MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 1 << 30
# "0" leaves glibc's arenas as they are (an opt-out for embedders, and the tests' control run); default 1
ARENA_ENV = "HINTKV_MALLOC_ARENA_MAX"


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; whether every one is set (False off Linux / glibc).
    Each setting is tried, and one that glibc refuses is logged by name."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        settings = {"M_MMAP_THRESHOLD": (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                    "M_TRIM_THRESHOLD": (_M_TRIM_THRESHOLD, TRIM_THRESHOLD)}
        arenas = int(os.environ.get(ARENA_ENV, "1"))
        if arenas > 0:
            settings["M_ARENA_MAX"] = (_M_ARENA_MAX, arenas)
        failed = [name for name, (param, value) in settings.items() if libc.mallopt(param, value) == 0]
    except (OSError, AttributeError, ValueError):  # not glibc (musl has no mallopt), or a bad ARENA_ENV
        log.warning("host_memory: malloc left at its defaults (no glibc mallopt, or %s not an int)", ARENA_ENV)
        return False
    if failed:
        log.warning("host_memory: glibc refused %s; freed memory may be unmapped and faulted in again",
                    ", ".join(failed))
    return not failed
