"""DiskTier: exact round trips, corruption and missing files as misses, restart (reuse or
wipe), full and read-only directories degrading to failed puts, no leaked files."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from hintkv.tiers.disk import DiskTier
from hintkv.tiers.disk_format import HEADER_SIZE, SECRET_FILE
from hintkv.tiers.layout import BlockLayout


def _file(tier: DiskTier, k: bytes):
    return tier.directory / f"{k.hex()}.kv"


def _capacity(layout, n):
    return n * (HEADER_SIZE + layout.nbytes)


def test_put_then_get_round_trips_exact_bytes(layout, key, payload, empty, tmp_path):
    disk = DiskTier(layout, tmp_path / "kv", _capacity(layout, 4))
    assert disk.capacity_blocks == 4
    assert [f.result() for f in disk.put([(key(i), payload(i)) for i in range(3)])] == [True] * 3
    for i in range(3):
        dst = empty()
        assert disk.get(key(i), dst).result() is True
        assert torch.equal(dst.view(torch.int16), payload(i).view(torch.int16))
    assert disk.get(key(9), empty()).result() is False
    dst = torch.empty(layout.shape, dtype=layout.dtype).transpose(0, 1).contiguous() \
        .transpose(0, 1)  # a non-contiguous destination goes through a bounce buffer
    assert disk.get(key(1), dst).result() is True and torch.equal(dst, payload(1))
    assert disk.usage().bytes_used == 3 * disk.file_nbytes
    disk.check_integrity()
    disk.close()


def test_eviction_deletes_files_and_capacity_holds(layout, key, payload, tmp_path):
    evicted: list[bytes] = []
    disk = DiskTier(layout, tmp_path, _capacity(layout, 2),
                    on_evict=lambda k, p: evicted.append(k) if p is None else None)
    for i in range(5):
        disk.put([(key(i), payload(i))])[0].result()
    disk.check_integrity()
    assert evicted == [key(0), key(1), key(2)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".kv") == sorted(
        f"{key(i).hex()}.kv" for i in (3, 4))
    disk.close()


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate", "delete"])
def test_damaged_block_is_a_counted_miss_and_dropped(layout, key, payload, empty, tmp_path,
                                                     damage):
    disk = DiskTier(layout, tmp_path, _capacity(layout, 4))
    disk.put([(key(0), payload(0)), (key(1), payload(1))])
    disk.flush()
    path = _file(disk, key(0))
    data = bytearray(path.read_bytes())
    if damage == "flip_payload":
        data[HEADER_SIZE + 5] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "flip_header":
        data[30] ^= 0x40
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-7]))
    else:
        path.unlink()
    assert disk.get(key(0), empty()).result() is False
    assert disk.stats().num_corrupt == 1 and disk.stats().num_misses == 1
    assert not disk.contains(key(0))
    dst = empty()
    assert disk.get(key(1), dst).result() is True and torch.equal(dst, payload(1))
    disk.check_integrity()  # the damaged file is gone, nothing else
    disk.close()


def test_restart_with_reuse_validates_and_adopts(layout, key, payload, empty, tmp_path):
    disk = DiskTier(layout, tmp_path, _capacity(layout, 4))
    disk.put([(key(i), payload(i)) for i in range(3)])
    disk.close()
    bad = _file(disk, key(2))
    bad.write_bytes(bad.read_bytes()[:100])  # torn
    (tmp_path / f"{key(7).hex()}.3.tmp").write_bytes(b"half written")
    (tmp_path / "notes.txt").write_text("not ours")
    again = DiskTier(layout, tmp_path, _capacity(layout, 4), reuse=True)
    assert sorted(again.keys()) == sorted([key(0), key(1)])
    assert again.stats().num_corrupt == 1
    dst = empty()
    assert again.get(key(1), dst).result() is True and torch.equal(dst, payload(1))
    assert (tmp_path / "notes.txt").exists()
    again.check_integrity()
    again.close()
    other = BlockLayout(2, 4, 2, 8, torch.float16)  # same size, other meaning: never adopted
    foreign = DiskTier(other, tmp_path, _capacity(other, 4), reuse=True)
    assert foreign.keys() == [] and foreign.stats().num_corrupt == 2
    foreign.check_integrity()
    foreign.close()


def test_restart_without_reuse_wipes_only_our_files(layout, key, payload, tmp_path):
    disk = DiskTier(layout, tmp_path, _capacity(layout, 4))
    disk.put([(key(0), payload(0))])
    disk.close()
    (tmp_path / "keep.me").write_text("user file")
    fresh = DiskTier(layout, tmp_path, _capacity(layout, 4), reuse=False)
    assert fresh.keys() == []
    assert [p.name for p in tmp_path.iterdir() if p.name != SECRET_FILE] == ["keep.me"]
    fresh.close()


def test_reuse_keeps_the_newest_files_within_capacity(layout, key, payload, tmp_path):
    disk = DiskTier(layout, tmp_path, _capacity(layout, 4))
    for i in range(4):
        disk.put([(key(i), payload(i))])[0].result()
        os.utime(_file(disk, key(i)), ns=(10**9 * (i + 1),) * 2)
    disk.close()
    small = DiskTier(layout, tmp_path, _capacity(layout, 2), reuse=True)
    assert sorted(small.keys()) == sorted([key(2), key(3)])
    small.check_integrity()
    small.close()


def test_remove_leaves_no_files(layout, key, payload, tmp_path):
    disk = DiskTier(layout, tmp_path, _capacity(layout, 8))
    disk.put([(key(i), payload(i)) for i in range(5)])
    disk.flush()
    for i in range(5):
        assert disk.remove(key(i)) is True
    disk.flush()
    assert [p for p in tmp_path.iterdir() if p.name != SECRET_FILE] == []
    disk.check_integrity()
    disk.close()


def test_unusable_directory_degrades_to_failed_puts(layout, key, payload, empty, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    disk = DiskTier(layout, blocker / "kv", _capacity(layout, 4))  # parent is a file
    assert disk.put([(key(0), payload(0))])[0].result() is False
    assert disk.get(key(0), empty()).result() is False
    assert disk.stats().num_io_errors >= 2 and disk.usage().num_blocks == 0
    disk.close()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 64 KiB file system (root with mount rights only): fills up for real."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_fails_puts_without_crashing(key, payload, small_tmpfs):
    big = BlockLayout(4, 16, 4, 32, torch.bfloat16)  # 32 KiB blocks: two fill 64 KiB
    disk = DiskTier(big, small_tmpfs, _capacity(big, 8))
    blocks = [(key(i), torch.ones(big.shape, dtype=big.dtype)) for i in range(4)]
    assert disk.put(blocks[:1])[0].result() is True
    results = [f.result() for f in disk.put(blocks[1:])]
    assert False in results  # the file system is full: failed puts, not an exception
    assert disk.stats().num_io_errors >= 1
    assert disk.stats().num_put_failed == results.count(False)
    dst = torch.empty(big.shape, dtype=big.dtype)
    assert disk.get(key(0), dst).result() is True and torch.equal(dst, blocks[0][1])
    disk.check_integrity()  # failed writes left neither entries nor temporary files
    disk.close()


def test_read_only_directory_fails_puts_without_crashing(layout, key, payload, tmp_path,
                                                         small_tmpfs):
    disk = DiskTier(layout, small_tmpfs, _capacity(layout, 4))
    disk.put([(key(0), payload(0))])[0].result()
    disk.close()
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    ro = DiskTier(layout, small_tmpfs, _capacity(layout, 4), reuse=True)
    assert ro.put([(key(1), payload(1))])[0].result() is False
    assert ro.stats().num_io_errors == 1
    assert ro.contains(key(0))  # the old block is still readable
    ro.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_directory_fails_puts_without_crashing(layout, key, payload, tmp_path):
    disk = DiskTier(layout, tmp_path, _capacity(layout, 4))
    tmp_path.chmod(0o500)
    try:
        assert disk.put([(key(0), payload(0))])[0].result() is False
        assert disk.stats().num_io_errors == 1 and not disk.contains(key(0))
    finally:
        tmp_path.chmod(0o700)
    disk.check_integrity()
    disk.close()


@pytest.mark.parametrize("first", ["put", "check"])
def test_a_vanished_directory_is_made_again_and_the_tier_goes_on(layout, key, payload, empty, tmp_path, first):
    """The directory is removed under a running tier (an operator's cleanup, a lost mount): the
    blocks in it are forgotten (misses, never wrong bytes), the next put or integrity check makes it
    again with the same secret, and the tier stores and serves blocks again (review rev25 A11)."""
    import shutil

    d = tmp_path / "kv"
    disk = DiskTier(layout, d, _capacity(layout, 4), reuse=True)
    assert all(f.result() for f in disk.put([(key(0), payload(0)), (key(1), payload(1))]))
    shutil.rmtree(d)
    if first == "put":
        assert disk.put([(key(2), payload(2))])[0].result() is True
    disk.check_integrity()  # no vanished files left in the index, nothing asserted
    assert disk.put([(key(3), payload(3))])[0].result() is True
    dst = empty()
    assert disk.get(key(3), dst).result() is True and torch.equal(dst, payload(3))
    assert disk.get(key(0), empty()).result() is False
    assert (d / SECRET_FILE).exists()
    disk.check_integrity()
    disk.close()
    again = DiskTier(layout, d, _capacity(layout, 4), reuse=True)  # the same secret: adopted on restart
    dst = empty()
    assert again.get(key(3), dst).result() is True and torch.equal(dst, payload(3))
    again.close()


def test_a_vanished_directory_whose_parent_moved_filesystems_is_not_made_again(layout, key, payload, tmp_path):
    """A lost mount leaves the parent on another filesystem: the tier forgets its blocks and stays off
    rather than fill whatever lies below (review rev25 B3). The parent's device is faked by the
    recorded one: the same check a real unmount trips."""
    import shutil

    d = tmp_path / "kv"
    disk = DiskTier(layout, d, _capacity(layout, 4))
    assert disk.put([(key(0), payload(0))])[0].result() is True
    disk._parent_dev = -1  # as if tmp_path had been another filesystem's mount point at the start
    shutil.rmtree(d)
    assert disk.put([(key(1), payload(1))])[0].result() is False
    assert not d.exists() and disk.stats().num_io_errors >= 1
    disk.check_integrity()  # the vanished blocks are forgotten: nothing left to assert about
    disk.close()


def test_a_directory_that_left_its_filesystem_turns_the_tier_off(layout, key, payload, empty, tmp_path):
    """The cache directory is a mount point and the mount is lost: the directory is still there,
    now on the filesystem below. The tier forgets its blocks and writes nothing more there
    (review rev25 B8). The lost mount is faked by the recorded device: the check a real one trips."""
    disk = DiskTier(layout, tmp_path / "kv", _capacity(layout, 4))
    assert disk.put([(key(0), payload(0))])[0].result() is True
    disk._dir_dev = -1  # as if the directory had been another filesystem's mount point at the start
    assert disk.put([(key(1), payload(1))])[0].result() is False
    assert disk.get(key(0), empty()).result() is False
    assert not list((tmp_path / "kv").glob(f"{key(1).hex()}*"))
    disk.check_integrity()
    disk.close()
