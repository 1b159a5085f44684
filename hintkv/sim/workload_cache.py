"""A built workload kept on disk, keyed by everything it is built from (`hintkv sim --workload-cache DIR`).

    wl, hit = cached_workload(Path("~/.cache/hintkv/sim").expanduser(), folders, users=10, seed=0,
                              token_scale=1.0, max_calls=None, max_tasks=None)

Building the whole trace set at full scale costs ~12 s of CPU (claude-code blocks drawn from
SHAKE-128, swe-agent text tokenized, gzip JSON parsed), 100-200 s of wall on this shared 2-core
machine; reading it back is one unpickle and a rebuild of its chunks (2 users, 4 tasks, full scale, with
a Python persistent_load: 0.14 s of CPU, 4.3 MB; a plain pickle 0.04 s, 5.7 MB, 25x the int objects).
The key is a SHA-256 over:

- each trace file's name and bytes (`sim.workload.source_files`: the loaders' own suffixes);
- the knobs (`build_workload`'s arguments);
- the source of every module that turns a trace into token ids, as this process LOADED it: read
  once, when this module is imported (right after it imports them), never again for the key, so a
  loader edited on disk while a long run holds the old code cannot store the old code's workload
  under the new source's key. Before a write the files are read again; if one changed since import
  the write is skipped (the built workload may be the old code's or the new code's: unknown);
- where a swe-agent folder is read, the tokenizer: the source of its conversion code
  (`TOKENIZER_MODULES`, GGUF -> `tokenizers`), the SHA-256 of the tokenizer it encodes with (its
  whole serialized content, as `models.presets.smollm2_tokenizer` loads it) and the `tokenizers`
  version.

A file is `MAGIC`, the key, a SHA-256 over key + payload, then the payload: the pickled `Workload`
with each prompt chunk (a tuple of token ids) stored once as a run in one array of ids, rebuilt on
load from the shared int objects of `hintkv.workload.token_ids` (a plain pickle gives every token of
a read-back workload its own int: 36 bytes a token where a built one takes 8). One with
another header, another key (a foreign file), a wrong digest (a damaged one) or a payload that does
not load as a `Workload` is built again, with a `WorkloadCacheWarning`, never an error and never
served. A file is written under a temporary name and renamed, so a reader never sees half of one;
the temporary file is removed on any failure, and a write that fails is only a warning. After a
write the directory keeps its `KEEP` newest workload files and drops a dead writer's temporary
files. Opt-in: a pickle runs code when it is loaded and the digest is a checksum, not a MAC, so
point it only at a directory you own.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import pickle
import time
import warnings
from bisect import bisect_right
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from hintkv.sim.workload import build_workload, source_files, trace_kind
from hintkv.workload import token_ids
from hintkv.workload.program import Workload

FORMAT = 3  # bumped when the file layout changes
MAGIC = b"hintkv-workload-cache\x00v%d\n" % FORMAT
KEEP = 8  # workload files a directory keeps (newest by mtime); each was ~185 MB as a plain pickle (10 users)
REBUILD_BATCH = 1 << 20  # token ids turned into shared ints per numpy pass on load
STALE_TMP_S = 3600.0  # a temporary file this old is a dead writer's (a write takes seconds)
LOADER_MODULES = ("hintkv.sim.workload", "hintkv.workload.program", "hintkv.workload.traces.files",
                  "hintkv.workload.traces.claude_code", "hintkv.workload.traces.swe_agent",
                  "hintkv.workload.token_ids")
TOKENIZER_MODULES = ("hintkv.models.presets", "hintkv.models.gguf_loader", "hintkv.models.tokenizer")


class WorkloadCacheWarning(UserWarning):
    """A cache file was not used or not written; the run goes on with a fresh build."""


def source_digests(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Each module's SHA-256 over its source, through its own loader (imported first if not yet)."""
    out = {}
    for name in names:
        mod = importlib.import_module(name)
        out[name] = hashlib.sha256(mod.__spec__.loader.get_data(mod.__file__)).hexdigest()
    return out


# The code this process builds workloads with: read once, here, right after the imports above.
LOADED = source_digests(LOADER_MODULES + TOKENIZER_MODULES)


def tokenizer_digest() -> str:
    """SHA-256 of the tokenizer swe-agent texts are encoded with (its whole content) + library version."""
    from hintkv.models.presets import smollm2_tokenizer

    try:
        tv = version("tokenizers")
    except PackageNotFoundError:
        tv = "?"
    content = smollm2_tokenizer().backend.to_str()
    return hashlib.sha256(f"tokenizers={tv}\n{content}".encode()).hexdigest()


def workload_key(folders: list[str] | tuple[str, ...], knobs: dict) -> str:
    h = hashlib.sha256(json.dumps({"format": FORMAT, "knobs": knobs}, sort_keys=True).encode())
    h.update(json.dumps({m: LOADED[m] for m in LOADER_MODULES}, sort_keys=True).encode())
    swe = False
    for f in folders:
        for p in source_files(f):
            h.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
        swe = swe or trace_kind(Path(f)) == "swe-agent"
    if swe:
        h.update(json.dumps({m: LOADED[m] for m in TOKENIZER_MODULES}, sort_keys=True).encode())
        h.update(tokenizer_digest().encode())
    return h.hexdigest()


class _ChunkPickler(pickle.Pickler):
    """Pickles a workload with each chunk of token ids as its index in `runs` (once per chunk object)."""

    def __init__(self, f: io.BytesIO) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.index: dict[int, int] = {}  # id(chunk) -> its run (the workload keeps every chunk alive)
        self.runs: list[np.ndarray] = []

    def persistent_id(self, obj: object) -> int | None:
        if type(obj) is not tuple or not obj or type(obj[0]) is not int:
            return None  # not a chunk: pickled as usual (a prompt, the calls, spawns, ...)
        i = self.index.get(id(obj))
        if i is None:
            if set(map(type, obj)) != {int}:
                return None
            try:
                run = np.array(obj, dtype=np.int64)
            except OverflowError:
                return None
            if run.min() < 0 or run.max() >= 1 << 32:
                return None
            i = self.index[id(obj)] = len(self.runs)
            self.runs.append(run)
        return i


def _chunks(ids: np.ndarray, offsets: list[int]) -> list[tuple[int, ...]]:
    """Each run of `ids` as a tuple of the shared int objects, ~REBUILD_BATCH ids per numpy pass (one
    pass per chunk took 10x the plain pickle's load; one pass over all would hold 8 bytes an id more)."""
    table = token_ids.table(int(ids.max()) + 1 if len(ids) else 0)
    out: list[tuple[int, ...]] = []
    i, n = 0, len(offsets) - 1
    while i < n:
        j = max(i + 1, bisect_right(offsets, offsets[i] + REBUILD_BATCH, i + 1) - 1)
        base = offsets[i]
        objs = table[ids[base:offsets[j]]].tolist()
        out += [tuple(objs[a - base:b - base]) for a, b in zip(offsets[i:j], offsets[i + 1:j + 1])]
        i = j
    return out


def dump_workload(wl: Workload) -> bytes:
    """The payload: (the pickled tree, every chunk's ids in one array, the runs' offsets)."""
    f = io.BytesIO()
    p = _ChunkPickler(f)
    p.dump(wl)
    runs = p.runs
    ids = np.concatenate(runs) if runs else np.zeros(0, np.int64)
    ids = ids.astype(np.uint16 if not len(ids) or ids.max() < 1 << 16 else np.uint32)
    offsets = np.cumsum([0] + [len(r) for r in runs], dtype=np.int64)
    return pickle.dumps((f.getvalue(), ids, offsets), protocol=pickle.HIGHEST_PROTOCOL)


def load_workload(payload: bytes) -> object:
    """What `dump_workload` stored (a Workload unless the file was written otherwise)."""
    outer = pickle.loads(payload)
    if not (type(outer) is tuple and len(outer) == 3 and type(outer[0]) is bytes
            and all(isinstance(a, np.ndarray) and a.ndim == 1 for a in outer[1:])):
        raise ValueError("not a (tree, ids, offsets) payload")
    tree, ids, offsets = outer
    if ids.dtype.kind != "u" or offsets.dtype != np.int64:
        raise ValueError("ids or offsets of the wrong type")
    offsets = offsets.tolist()
    if not offsets or offsets[0] != 0 or offsets[-1] != len(ids) or any(map(int.__gt__, offsets, offsets[1:])):
        raise ValueError("offsets that do not split the ids")
    u = pickle.Unpickler(io.BytesIO(tree))
    # each chunk index -> its chunk, in C (a Python persistent_load was 3/4 of the load's time); an
    # index out of range fails the load; only our writer, behind the digest, writes indexes
    u.persistent_load = _chunks(ids, offsets).__getitem__
    return u.load()


def _warn(path: Path, why: str) -> None:
    warnings.warn(f"--workload-cache {path}: {why}", WorkloadCacheWarning, stacklevel=3)


def read_cached(path: Path, key: str) -> Workload | None:
    """The workload stored in `path` under `key`; None (with a warning unless absent) otherwise."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn(path, f"unreadable ({e}); building it again")
        return None
    head = len(MAGIC)
    if not data.startswith(MAGIC) or len(data) < head + 64:
        _warn(path, "not a workload cache file of this format; building it again")
        return None
    if data[head:head + 32] != bytes.fromhex(key):
        _warn(path, "stored under another key (a foreign file); building it again")
        return None
    if hashlib.sha256(data[head:head + 32] + data[head + 64:]).digest() != data[head + 32:head + 64]:
        _warn(path, "damaged (its digest does not match); building it again")
        return None
    try:
        wl = load_workload(data[head + 64:])
    except Exception as e:  # the digest matched, so only a writer's bug gets here: still never fatal
        _warn(path, f"does not load ({type(e).__name__}: {e}); building it again")
        return None
    if not isinstance(wl, Workload):
        _warn(path, f"holds a {type(wl).__name__}, not a Workload; building it again")
        return None
    return wl


def write_cached(path: Path, key: str, wl: Workload) -> bool:
    """Store `wl` in `path` atomically (temporary file + rename); False (with a warning) if not written."""
    if source_digests(list(LOADED)) != LOADED:
        _warn(path, "the workload code changed on disk since this process loaded it; not written")
        return False
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        payload = dump_workload(wl)
        kb = bytes.fromhex(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(MAGIC + kb + hashlib.sha256(kb + payload).digest())
            f.write(payload)
        tmp.replace(path)
    except Exception as e:  # a cache we cannot write is only slower, never wrong
        _warn(path, f"not written ({type(e).__name__}: {e})")
        return False
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # not ours to remove (a directory under that name): the warning above says enough
    _prune(path.parent)
    return True


def _prune(d: Path) -> None:
    """Keeps the `KEEP` newest workload files; drops temporary files older than `STALE_TMP_S` (a writer
    killed mid-write; a live writer's file is younger)."""
    files = []
    now = time.time()
    for p in d.glob("workload-*"):
        try:
            mtime = p.stat().st_mtime_ns
            if p.name.endswith(".pickle"):
                files.append((mtime, p))
            elif p.name.endswith(".tmp") and now - mtime / 1e9 > STALE_TMP_S:
                p.unlink(missing_ok=True)
        except OSError:
            pass  # removed meanwhile by another process
    for _, p in sorted(files, reverse=True)[KEEP:]:
        p.unlink(missing_ok=True)


def cached_workload(cache_dir: Path, folders: list[str] | tuple[str, ...], users: int, seed: int = 0,
                    token_scale: float = 1.0, max_calls: int | None = None,
                    max_tasks: int | None = None) -> tuple[Workload, bool]:
    """`build_workload`'s workload, from `cache_dir` when built before; True: it was read back."""
    knobs = {"folders": [str(f) for f in folders], "users": users, "seed": seed,
             "token_scale": token_scale, "max_calls": max_calls, "max_tasks": max_tasks}
    key = workload_key(folders, knobs)
    path = Path(cache_dir) / f"workload-{key}.pickle"
    wl = read_cached(path, key)
    if wl is not None:
        return wl, True
    wl = build_workload(folders, users, seed, token_scale, max_calls, max_tasks)
    write_cached(path, key, wl)
    return wl, False
