"""The disk tier: one file per block (`<key hex>.kv`) in `--disk-cache-dir`, bounded by
`--disk-cache-size`.

Never serve wrong KV: every file carries a header naming its key and layout, and a MAC of the
payload keyed by this deployment's secret (see `disk_format.py`); a read checks all of it, and a
missing, truncated, corrupt or forged file is a miss (counted, logged, the entry dropped). Files
are written to a random temporary name created exclusively (`O_EXCL|O_NOFOLLOW`: a planted file
or symlink is never written through) and renamed, so a reader never sees half a block; files are
opened for reading with `O_NOFOLLOW` too. No fsync, because a block lost in a crash is only a
recompute and a torn one fails its MAC. Any OSError (ENOSPC, EROFS, EACCES, ...) turns into
a failed put or a miss, counted and logged, never raised. On start the directory is either wiped
(our files only) or, with `reuse=True`, scanned: files whose size or header is wrong are deleted,
the rest adopted (newest first, up to capacity) only if their MAC verifies under the secret kept
in the directory: blocks this deployment wrote. Without reuse, a new secret is made.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from concurrent.futures import Future
from pathlib import Path

import torch

from hintkv.tiers.base import OnEvict
from hintkv.tiers.disk_format import (
    HEADER_SIZE,
    MAX_KEY_LEN,
    SECRET_FILE,
    SECRET_LEN,
    BadBlockFile,
    block_mac,
    decode_header,
    encode_header,
)
from hintkv.tiers.hand_down import HandDown
from hintkv.tiers.index import Entry, IndexedTier
from hintkv.tiers.layout import BlockLayout
from hintkv.tiers.mover import Mover, resolved
from hintkv.tiers.ranks import RankBoard

log = logging.getLogger(__name__)

_BLOCK_FILE = re.compile(r"^((?:[0-9a-f]{2}){1,64})\.kv$")
_TEMP_FILE = re.compile(r"^(?:[0-9a-f]{2}){1,64}\.[0-9a-f]{16}\.tmp$")
_SECRET_TEMP = re.compile(r"^\.hintkv-secret\.[0-9a-f]{16}\.tmp$")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)


def create_exclusive(path: Path, data_parts: list, mode: int = 0o600) -> None:
    """Write a new file that must not exist yet, never following a symlink planted at `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in data_parts:
                f.write(part)
    except BaseException:
        _quiet_unlink(path)
        raise


def open_nofollow(path: Path):
    """Open a file for reading; a symlink in its place is an error (ELOOP), never followed."""
    return os.fdopen(os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY), "rb")


def _temp_name(prefix: str) -> str:
    return f"{prefix}.{secrets.token_hex(8)}.tmp"


def _quiet_unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.warning("disk tier: cannot delete %s: %s", path, e)


def _as_bytes(t: torch.Tensor):
    """A flat uint8 numpy view of a contiguous CPU tensor (any dtype, bf16 included)."""
    return t.reshape(-1).view(torch.uint8).numpy()


class DiskTier(HandDown, IndexedTier):
    name = "disk"

    def __init__(self, layout: BlockLayout, directory: str | os.PathLike, capacity_bytes: int,
                 reuse: bool = False, mover: Mover | None = None,
                 ranks: RankBoard | None = None, on_evict: OnEvict | None = None) -> None:
        self.file_nbytes = HEADER_SIZE + layout.nbytes
        super().__init__(layout, max(0, capacity_bytes) // self.file_nbytes, mover, ranks,
                         on_evict)
        self.block_nbytes = self.file_nbytes
        self.upper = "host"
        self.directory = Path(directory)
        self._fingerprint = layout.fingerprint()
        self._secret = secrets.token_bytes(SECRET_LEN)  # replaced by the directory's, below
        self._parent_dev: int | None = None  # the parent's filesystem: `_recreate` only on it
        self._dir_dev: int | None = None  # the directory's: when it changes, the mount was lost
        self._off = False  # the directory left its filesystem: no more writes (until a restart)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._parent_dev = self.directory.parent.stat().st_dev
            self._dir_dev = self.directory.stat().st_dev  # (a mount point's own filesystem)
            kept = self._read_secret() if reuse else None
            if kept is not None:
                self._secret = kept
                self._adopt_existing()
            else:
                self._wipe()
                self._write_secret()
        except OSError as e:  # an unusable directory: every put will fail, every get miss
            self._io_error("open the directory", e)

    def _check_put(self, key: bytes, src: torch.Tensor) -> None:
        super()._check_put(key, src)
        if not 0 < len(key) <= MAX_KEY_LEN:
            raise ValueError(f"key length must be 1..{MAX_KEY_LEN}, got {len(key)}")

    def check_integrity(self) -> None:
        """Waits for in-flight I/O, then checks the index against the directory's files (a
        directory that vanished is made again first: `_recreate`)."""
        self.flush()
        self._recreate()
        with self._lock:
            self._check_entries()
            assert all(e.ready for e in self._entries.values()), "disk: a write never finished"
            assert not self._leaving, "disk: a hand-down never finished"
            try:
                names = {p.name for p in self.directory.iterdir()} if self.directory.exists() \
                    else set()
            except OSError as e:
                raise AssertionError(f"disk: cannot list {self.directory}: {e}") from e
            files = {n for n in names if _BLOCK_FILE.match(n)}
            expected = {f"{k.hex()}.kv" for k in self._entries}
            assert files == expected, (f"disk: {len(files - expected)} orphan files, "
                                       f"{len(expected - files)} missing files")
            temps = [n for n in names if _TEMP_FILE.match(n)]
            assert not temps, f"disk: leftover temporary files {temps[:3]}"

    # -- storage hooks ----------------------------------------------------------------------

    def _write(self, key: bytes, src: torch.Tensor) -> tuple[bytes, int, Future[bool]]:
        raw = self.mover.run(f"{self.upper}->{self.name}", lambda: self._write_file(key, src),
                             1, self.layout.nbytes, after=self._after(key))
        return key, -1, raw

    def _read(self, key: bytes, entry: Entry, dst: torch.Tensor) -> tuple[bytes, Future[bool]]:
        raw = self.mover.run(f"{self.name}->{self.upper}",
                             lambda: self._read_file(key, entry, dst), 1, self.layout.nbytes,
                             after=self._after(key))
        return key, raw

    # -- file I/O (runs on the movement engine's workers) -----------------------------------

    def _path(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}.kv"

    def _mac(self, key: bytes, payload) -> bytes:
        return block_mac(self._secret, key, self._fingerprint, payload)

    def _write_file(self, key: bytes, src: torch.Tensor) -> bool:
        data = src.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        payload = _as_bytes(data.contiguous())
        header = encode_header(key, self._fingerprint, self.layout.nbytes, self._mac(key, payload))
        temp = self.directory / _temp_name(key.hex())
        self._recreate()  # a vanished directory is made again; one that left its filesystem: off
        if self._off:
            return False
        try:
            try:
                create_exclusive(temp, [header, payload])
            except FileNotFoundError:  # the directory vanished (a cleanup, a lost mount): again
                if not self._recreate():
                    raise
                create_exclusive(temp, [header, payload])
            os.replace(temp, self._path(key))
            return True
        except OSError as e:
            self._io_error(f"write {key.hex()}", e)
            _quiet_unlink(temp)  # ours if it exists: the name is random and was created O_EXCL
            return False

    def _read_checked(self, key: bytes, view) -> None:
        """Read the block's file into `view` (flat uint8), checking its size, header and MAC;
        raises BadBlockFile, or OSError (FileNotFoundError: no file)."""
        with open_nofollow(self._path(key)) as f:
            size = os.fstat(f.fileno()).st_size
            if size != self.file_nbytes:
                raise BadBlockFile(f"file is {size} bytes, expected {self.file_nbytes}")
            _, mac = decode_header(f.read(HEADER_SIZE), self._fingerprint,
                                   self.layout.nbytes, key)
            if f.readinto(view) != self.layout.nbytes:
                raise BadBlockFile("truncated payload")
        if self._mac(key, view) != mac:
            raise BadBlockFile("payload MAC mismatch (corrupt, or not written by us)")

    def _read_file(self, key: bytes, entry: Entry, dst: torch.Tensor) -> bool:
        direct = dst.device.type == "cpu" and dst.is_contiguous()
        buf = dst if direct else torch.empty(self.layout.shape, dtype=self.layout.dtype)
        try:
            self._read_checked(key, _as_bytes(buf))
        except FileNotFoundError:
            self._discard(key, entry, "file is missing")
            return False
        except BadBlockFile as e:
            self._discard(key, entry, str(e))
            return False
        except OSError as e:
            self._io_error(f"read {key.hex()}", e)
            return False
        if not direct:
            dst.copy_(buf)
        return True

    def _unlink(self, path: Path) -> bool:
        try:
            if path.exists():  # a failed put left no file (and a read-only fs says EROFS)
                path.unlink(missing_ok=True)
        except OSError as e:
            self._io_error(f"delete {path.name}", e)
        return True

    # -- bookkeeping ------------------------------------------------------------------------

    def _drop(self, key: bytes, evicted: bool) -> None:
        self._pop_entry(key)
        path = self._path(key)
        if evicted and self._queue_hand_down(key, path):  # read back for the tier below
            return
        if evicted:
            self._safe_on_evict(key, None)
        # after the file's last I/O; a new put of the key waits for this one (`_track`)
        self._track(key, self.mover.run(None, lambda: self._unlink(path), 0, 0,
                                        after=self._after(key)))

    def _read_back(self, key: bytes) -> torch.Tensor | None:
        """An evicted block's bytes, read from its file and checked as any read, for the tier
        below (`HandDown`); None if they failed the checks: never hand down a bad block."""
        payload = torch.empty(self.layout.shape, dtype=self.layout.dtype)
        try:
            self._read_checked(key, _as_bytes(payload))
        except (FileNotFoundError, BadBlockFile) as e:
            log.warning("disk tier: not handing down block %s: %s", key.hex(), e)
            with self._lock:
                self._stats.num_corrupt += 1
            return None
        except OSError as e:
            self._io_error(f"read back {key.hex()}", e)
            return None
        return payload

    def _discard(self, key: bytes, entry: Entry, reason: str) -> None:
        log.warning("disk tier: dropping block %s: %s", key.hex(), reason)
        with self._lock:
            self._stats.num_corrupt += 1
            if self._entries.get(key) is entry:
                self._drop(key, evicted=False)

    def _recreate(self) -> bool:
        """If the directory is gone (an operator's cleanup, a tmp reaper) or is no longer on its
        filesystem (a lost mount: the mount point, now a directory of whatever lies below): forget
        the blocks whose files went with it and, if its parent is still on the filesystem it was
        on at the start, make it again with this deployment's secret, so the tier goes on instead
        of failing every put until a restart. Whether it was made."""
        def moved() -> bool | None:  # None: gone
            try:
                return self._dir_dev is not None and self.directory.stat().st_dev != self._dir_dev
            except FileNotFoundError:
                return None
            except OSError:
                return False

        if self._off or moved() is False:  # the common case: one stat, no lock
            return False
        with self._lock:
            now = moved()
            if now is False or self._off:
                return False
            gone = [k for k, e in self._entries.items() if e.ready]
            for k in gone:
                self._drop(k, evicted=False)
            if now:  # never write the cache onto another filesystem: the tier stays off
                self._off = True
                self._io_error("use the directory", OSError(f"{self.directory} is no longer on its filesystem"))
                return False
            try:
                # only where it was: a parent that is gone, or now on another filesystem (its mount
                # was lost), would put the cache on whatever lies below (the root filesystem)
                if self._parent_dev is None or self.directory.parent.stat().st_dev != self._parent_dev:
                    raise OSError(f"{self.directory.parent} is not on the filesystem it was on at the start")
                self.directory.mkdir()
                self._write_secret()
                self._dir_dev = self.directory.stat().st_dev
            except OSError as e:
                self._io_error("make the vanished directory again", e)
                return False
            log.warning("disk tier: %s had vanished: made again, %d blocks forgotten", self.directory, len(gone))
            return True

    def _io_error(self, what: str, e: OSError) -> None:
        log.warning("disk tier: cannot %s in %s: %s", what, self.directory, e)
        with self._lock:
            self._stats.num_io_errors += 1

    def _wipe(self) -> None:
        for p in self.directory.iterdir():
            if _BLOCK_FILE.match(p.name) or _TEMP_FILE.match(p.name) or _SECRET_TEMP.match(p.name):
                _quiet_unlink(p)

    def _read_secret(self) -> bytes | None:
        """The secret this deployment's files were written under; None if absent or unusable."""
        try:
            with open_nofollow(self.directory / SECRET_FILE) as f:
                st = os.fstat(f.fileno())
                data = f.read(SECRET_LEN + 1)
        except OSError as e:
            log.warning("disk tier: no usable secret in %s (%s): not reusing its files",
                        self.directory, e)
            return None
        if len(data) != SECRET_LEN or st.st_uid != os.getuid() or st.st_mode & 0o077:
            log.warning("disk tier: the secret in %s is not ours alone: not reusing its files",
                        self.directory)
            return None
        return data

    def _write_secret(self) -> None:
        temp = self.directory / _temp_name(SECRET_FILE)
        try:
            create_exclusive(temp, [self._secret])
            os.replace(temp, self.directory / SECRET_FILE)
        except OSError:
            _quiet_unlink(temp)
            raise

    def _adopt_existing(self) -> None:
        found: list[tuple[int, bytes]] = []
        for p in self.directory.iterdir():
            m = _BLOCK_FILE.match(p.name)
            if _TEMP_FILE.match(p.name) or _SECRET_TEMP.match(p.name):
                _quiet_unlink(p)
            if m is None:
                continue
            key = bytes.fromhex(m.group(1))
            try:
                st = p.lstat()
                if st.st_size != self.file_nbytes:
                    raise BadBlockFile(f"file is {st.st_size} bytes, expected {self.file_nbytes}")
                with open_nofollow(p) as f:
                    _, mac = decode_header(f.read(HEADER_SIZE), self._fingerprint,
                                           self.layout.nbytes, key)
                    payload = f.read(self.layout.nbytes)
                if self._mac(key, payload) != mac:
                    raise BadBlockFile("MAC mismatch (corrupt, or not written by this deployment)")
                found.append((st.st_mtime_ns, key))
            except (OSError, BadBlockFile) as e:
                log.warning("disk tier: not reusing %s: %s", p.name, e)
                self._stats.num_corrupt += 1
                _quiet_unlink(p)
        found.sort()
        keep = found[len(found) - self.capacity_blocks:] if self.capacity_blocks else []
        for _, key in found[:len(found) - len(keep)]:
            _quiet_unlink(self._path(key))
        for _, key in keep:  # oldest first, so LRU order follows the files' age
            self._add_entry(key, Entry(-1, self._tick(), resolved(True), written=True))
