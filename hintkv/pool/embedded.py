"""The embedded pool: no server at all.

    EmbeddedBackend(n)                    in this process only (one instance)
    EmbeddedBackend(n, directory="/p")    one file per key in a directory that several instances
                                          on one machine share (content keys: one file per block)

Directory mode writes to a private temporary name and renames (a reader never sees half a blob),
and a read checks the file's size; the tier above checks each blob's header and checksum, so a
torn or foreign file is a miss, never wrong KV. Keep-alive touches the files' mtime (what a
cleaner of the shared directory would go by).
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from pathlib import Path

import torch

from hintkv.pool.backend import BackendError, PoolBackend

LEASE_S = 5.0  # a shared-directory file touched this recently is in use (Mooncake's default lease)
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


def _check_key(key: str) -> str:
    if not _SAFE_KEY.match(key) or key.startswith("."):
        raise ValueError(f"pool keys are 1-200 characters of [A-Za-z0-9_.:-], got {key!r}")
    return key


class EmbeddedBackend(PoolBackend):
    name = "embedded"

    def __init__(self, blob_nbytes: int, directory: str | os.PathLike | None = None) -> None:
        self.blob_nbytes = blob_nbytes
        self.directory = Path(directory) if directory is not None else None
        self._lock = threading.Lock()
        self._blobs: dict[str, torch.Tensor] = {}
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise BackendError(f"cannot use pool directory {self.directory}: {e}") from e

    # -- the contract ---------------------------------------------------------------------
    def put(self, keys: list[str], blobs: list[torch.Tensor]) -> list[bool]:
        out = []
        for key, blob in zip(keys, blobs, strict=True):
            _check_key(key)
            if blob.numel() != self.blob_nbytes or blob.dtype != torch.uint8:
                raise ValueError(f"a pool blob is {self.blob_nbytes} uint8 bytes")
            if self.directory is None:
                with self._lock:
                    self._blobs[key] = blob.clone()
                out.append(True)
            else:
                out.append(self._write_file(key, blob))
        return out

    def get(self, keys: list[str], dsts: list[torch.Tensor]) -> list[bool]:
        out = []
        for key, dst in zip(keys, dsts, strict=True):
            _check_key(key)
            if self.directory is None:
                with self._lock:
                    blob = self._blobs.get(key)
                if blob is not None:
                    dst.copy_(blob)
                out.append(blob is not None)
            else:
                out.append(self._read_file(key, dst))
        return out

    def exists(self, keys: list[str]) -> list[bool]:
        if self.directory is None:
            with self._lock:
                return [_check_key(k) in self._blobs for k in keys]
        return [self._path(k).exists() for k in keys]

    def remove(self, keys: list[str]) -> list[bool]:
        out = []
        for key in keys:
            _check_key(key)
            if self.directory is None:
                with self._lock:
                    out.append(self._blobs.pop(key, None) is not None)
                continue
            try:
                self._path(key).unlink()
                out.append(True)
            except FileNotFoundError:
                out.append(False)
            except OSError as e:
                raise BackendError(f"cannot remove {key}: {e}") from e
        return out

    def release(self, keys: list[str]) -> list[bool | None]:
        """In-process: nobody else can hold a lease. Shared directory: a file written or kept
        alive within LEASE_S is leased (another instance may be using it)."""
        if self.directory is None:
            return list(self.remove(keys))
        out: list[bool | None] = []
        now = time.time()
        for key in keys:
            try:
                if now - self._path(key).stat().st_mtime < LEASE_S:
                    out.append(None)
                    continue
            except FileNotFoundError:
                out.append(False)
                continue
            except OSError as e:
                raise BackendError(f"cannot stat {key}: {e}") from e
            out.append(self.remove([key])[0])
        return out

    def keep_alive(self, keys: list[str]) -> list[bool]:
        if self.directory is None:
            with self._lock:
                return list(map(self._blobs.__contains__, keys))
        found = []
        for key in keys:
            try:
                os.utime(self._path(key))
                found.append(True)
            except FileNotFoundError:
                found.append(False)
            except OSError as e:
                raise BackendError(f"cannot touch {key}: {e}") from e
        return found

    def used_bytes(self) -> int | None:
        if self.directory is None:
            with self._lock:
                return len(self._blobs) * self.blob_nbytes
        try:
            return sum(1 for p in self.directory.iterdir() if p.suffix == ".blob") \
                * self.blob_nbytes
        except OSError:
            return None

    # -- files ----------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{_check_key(key)}.blob"

    def _write_file(self, key: str, blob: torch.Tensor) -> bool:
        path = self._path(key)
        temp = path.with_name(f".{uuid.uuid4().hex}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob.contiguous().numpy().tobytes())
            os.replace(temp, path)
            return True
        except OSError:
            temp.unlink(missing_ok=True)
            return False

    def _read_file(self, key: str, dst: torch.Tensor) -> bool:
        try:
            with open(self._path(key), "rb") as f:
                if os.fstat(f.fileno()).st_size != self.blob_nbytes:
                    return False
                return f.readinto(dst.numpy()) == self.blob_nbytes
        except FileNotFoundError:
            return False
        except OSError as e:
            raise BackendError(f"cannot read {key}: {e}") from e
