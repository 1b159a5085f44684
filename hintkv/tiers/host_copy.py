"""Whole-slot copies between host buffers (the host tier's batched reads and writes).

`copy_rows(dst, dst_rows, src, src_rows)` is `dst[dst_rows] = src[src_rows]` as slice copies of the
maximal runs where both row lists advance by one: a session's blocks are written to consecutive
slots, so a resume is usually one slice. Advanced indexing (`dst[rows] = buf[slots]`, `index_copy_`)
iterates element by element on a CPU: on the lent H200's host it moved an 8K-token llama3-8b resume
(1 GiB) at ~1 GB/s, the whole 1.07 s of a host-tier resume that recomputing does in 0.23-0.31 s.

With `threads` > 1 a copy of at least `PARALLEL_BYTES` is cut into that many pieces, copied by a
shared thread pool (a tensor copy releases the GIL): the mover's own threads run one OpenMP thread
each (`openmp_env.serial_openmp_thread`), and one thread's memcpy moved 5.4 GB/s there against 37 GB/s
for 16 (twenty-ninth session's probe, docs/benchmarks/history/engine.md). The host tier asks for
threads only with a pinned buffer, i.e. when its copies feed a CUDA device, whose engine leaves the
CPUs idle; a CPU engine's host tier copies on the mover thread alone, beside the model's threads.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import torch

PARALLEL_BYTES = 64 << 20
MAX_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def copy_threads(pinned: bool) -> int:
    """Threads for a host tier's large copies: up to MAX_THREADS of the CPUs when its buffer is pinned."""
    return min(MAX_THREADS, os.cpu_count() or 1) if pinned else 1


def runs(dst_rows: list[int], src_rows: list[int]) -> list[tuple[int, int, int]]:
    """(dst start, src start, length) of each maximal run where both lists advance by one."""
    out, j, n = [], 0, len(dst_rows)
    while j < n:
        k = j + 1
        while k < n and dst_rows[k] == dst_rows[k - 1] + 1 and src_rows[k] == src_rows[k - 1] + 1:
            k += 1
        out.append((dst_rows[j], src_rows[j], k - j))
        j = k
    return out


def copy_rows(dst: torch.Tensor, dst_rows: list[int], src: torch.Tensor, src_rows: list[int],
              threads: int = 1) -> None:
    """dst[dst_rows[j]] = src[src_rows[j]] for every j, the same bytes as the indexed assignment (distinct
    `dst_rows`)."""
    pieces = runs(dst_rows, src_rows)
    row_bytes = src[0].numel() * src.element_size() if len(src) else 0
    if threads > 1 and pieces and len(dst_rows) * row_bytes >= PARALLEL_BYTES:
        pieces = _split(pieces, threads)
        futures = [_executor().submit(_copy, dst, src, p) for p in pieces[1:]]
        _copy(dst, src, pieces[0])
        for f in wait(futures).done:
            f.result()
        return
    for p in pieces:
        _copy(dst, src, p)


def _copy(dst: torch.Tensor, src: torch.Tensor, piece: tuple[int, int, int]) -> None:
    d, s, n = piece
    dst[d:d + n].copy_(src[s:s + n])


def _split(pieces: list[tuple[int, int, int]], threads: int) -> list[tuple[int, int, int]]:
    """The runs cut into pieces of about total / threads rows each (a piece never spans two runs)."""
    size = max(1, -(-sum(n for _, _, n in pieces) // threads))
    out = []
    for d, s, n in pieces:
        for off in range(0, n, size):
            out.append((d + off, s + off, min(size, n - off)))
    return out


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_THREADS - 1, thread_name_prefix="hintkv-host-copy")
        return _pool
