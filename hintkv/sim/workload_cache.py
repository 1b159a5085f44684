"""A built workload kept on disk, keyed by everything it is built from (`hintkv sim --workload-cache DIR`).

    wl, hit = cached_workload(Path("~/.cache/hintkv/sim").expanduser(), folders, users=10, seed=0,
                              token_scale=1.0, max_calls=None, max_tasks=None)

Building the whole trace set at full scale costs ~12 s of CPU (claude-code blocks drawn from
SHAKE-128, swe-agent text tokenized, gzip JSON parsed), 100-200 s of wall on this shared 2-core
machine; reading it back is one unpickle (~2.3 s of CPU, 185 MB). The key is a SHA-256 over: each
trace file's name and bytes; the knobs (`build_workload`'s arguments); the source of every module
that turns a trace into token ids (`KEY_MODULES`: a code change there is a new key, never a stale
workload); and, where a swe-agent folder is read, the tokenizer's file identity (path, size, mtime,
as `models.gguf_loader.load_tokenizer`'s own cache) and the `tokenizers` version. A file is written
under a temporary name and renamed, so a reader never sees half of one; a file that cannot be read
or written is rebuilt or skipped, never an error. Opt-in: a pickle runs code when it is loaded, so
point it only at a directory you own.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pickle
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hintkv.sim.workload import _kind, build_workload
from hintkv.workload.program import Workload
from hintkv.workload.traces.files import trace_files

FORMAT = 1  # bumped when the file layout changes
KEY_MODULES = ("hintkv.sim.workload", "hintkv.workload.program", "hintkv.workload.traces.files",
               "hintkv.workload.traces.claude_code", "hintkv.workload.traces.swe_agent")


def workload_key(folders: list[str] | tuple[str, ...], knobs: dict) -> str:
    h = hashlib.sha256(json.dumps({"format": FORMAT, "knobs": knobs}, sort_keys=True).encode())
    for name in KEY_MODULES:
        h.update(Path(importlib.import_module(name).__file__).read_bytes())
    for f in folders:
        folder = Path(f)
        swe = _kind(folder) == "swe-agent"
        files = trace_files(folder, (".traj.json", ".json") if swe else (".json",))
        for p in files:
            h.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
        if swe:
            h.update(_tokenizer_identity().encode())
    return h.hexdigest()


def _tokenizer_identity() -> str:
    from hintkv.models.presets import smollm2_gguf_path

    p = smollm2_gguf_path()
    st = p.stat()
    try:
        tv = version("tokenizers")
    except PackageNotFoundError:
        tv = "?"
    return f"{p}:{st.st_size}:{int(st.st_mtime)}:tokenizers={tv}"


def cached_workload(cache_dir: Path, folders: list[str] | tuple[str, ...], users: int, seed: int = 0,
                    token_scale: float = 1.0, max_calls: int | None = None,
                    max_tasks: int | None = None) -> tuple[Workload, bool]:
    """`build_workload`'s workload, from `cache_dir` when built before; True: it was read back."""
    knobs = {"folders": list(folders), "users": users, "seed": seed,
             "token_scale": token_scale, "max_calls": max_calls, "max_tasks": max_tasks}
    path = Path(cache_dir) / f"workload-{workload_key(folders, knobs)}.pickle"
    try:
        with open(path, "rb") as f:
            wl = pickle.load(f)
        if isinstance(wl, Workload):
            return wl, True
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        pass  # none yet, or unreadable: built again below
    wl = build_workload(folders, users, seed, token_scale, max_calls, max_tasks)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(wl, f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
    except OSError:
        pass  # a cache we cannot write is only slower, never wrong
    return wl, False
