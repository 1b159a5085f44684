"""The disk tier against someone else who can write to its directory: forged payloads (even
with a valid checksum), files from another deployment, planted symlinks, guessable temp names."""

from __future__ import annotations

import os
import stat
import zlib

import torch

from hintkv.tiers.disk import DiskTier, _temp_name
from hintkv.tiers.disk_format import HEADER_SIZE, SECRET_FILE, block_mac, decode_header, encode_header


def _capacity(layout, n):
    return n * (HEADER_SIZE + layout.nbytes)


def test_forged_payload_with_a_fresh_checksum_is_refused(layout, key, payload, empty, tmp_path):
    """A crc32 can be recomputed by anyone; the keyed MAC cannot without the secret."""
    disk = DiskTier(layout, tmp_path, _capacity(layout, 4))
    disk.put([(key(0), payload(0))])[0].result()
    path = tmp_path / f"{key(0).hex()}.kv"
    data = path.read_bytes()
    forged = payload(7).reshape(-1).view(torch.uint8).numpy().tobytes()
    guess = block_mac(b"\0" * 32, key(0), layout.fingerprint(), forged)  # not our secret
    header = encode_header(key(0), layout.fingerprint(), layout.nbytes, guess)
    assert zlib.crc32(header[:-4]) == int.from_bytes(header[-4:], "little")  # a valid header
    path.write_bytes(header + forged)
    assert data != path.read_bytes()
    assert disk.get(key(0), empty()).result() is False
    assert disk.stats().num_corrupt == 1
    disk.check_integrity()
    disk.close()


def test_reuse_adopts_only_blocks_this_deployment_wrote(layout, key, payload, empty, tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    a = DiskTier(layout, ours, _capacity(layout, 4))
    a.put([(key(0), payload(0))])[0].result()
    a.close()
    b = DiskTier(layout, theirs, _capacity(layout, 4))
    b.put([(key(1), payload(1))])[0].result()
    b.close()
    os.replace(theirs / f"{key(1).hex()}.kv", ours / f"{key(1).hex()}.kv")  # planted
    again = DiskTier(layout, ours, _capacity(layout, 4), reuse=True)
    assert again.keys() == [key(0)]
    dst = empty()
    assert again.get(key(0), dst).result() is True and torch.equal(dst, payload(0))
    again.check_integrity()
    again.close()
    mode = stat.S_IMODE(os.stat(ours / SECRET_FILE).st_mode)
    assert mode == 0o600


def test_reuse_without_our_secret_adopts_nothing(layout, key, payload, tmp_path):
    a = DiskTier(layout, tmp_path, _capacity(layout, 4))
    a.put([(key(0), payload(0))])[0].result()
    a.close()
    (tmp_path / SECRET_FILE).unlink()
    again = DiskTier(layout, tmp_path, _capacity(layout, 4), reuse=True)
    assert again.keys() == []
    again.check_integrity()
    again.close()


def test_planted_symlink_is_never_written_through_or_read(layout, key, payload, empty, tmp_path):
    cache, outside = tmp_path / "kv", tmp_path / "outside.txt"
    outside.write_text("precious")
    disk = DiskTier(layout, cache, _capacity(layout, 4))
    block = cache / f"{key(0).hex()}.kv"
    block.symlink_to(outside)
    assert disk.put([(key(0), payload(0))])[0].result() is True  # replaces the link itself
    assert outside.read_text() == "precious" and not block.is_symlink()
    disk.remove(key(0))
    disk.flush()
    # A block file swapped for a symlink after it was written is refused on read.
    disk.put([(key(1), payload(1))])[0].result()
    other = cache / f"{key(1).hex()}.kv"
    os.replace(other, tmp_path / "moved.kv")
    other.symlink_to(tmp_path / "moved.kv")
    assert disk.get(key(1), empty()).result() is False
    assert outside.read_text() == "precious"
    disk.close()


def test_temp_names_are_random_and_headers_carry_the_mac(layout, key, payload, tmp_path):
    assert len({_temp_name(key(0).hex()) for _ in range(50)}) == 50
    disk = DiskTier(layout, tmp_path, _capacity(layout, 4))
    disk.put([(key(0), payload(0))])[0].result()
    raw = (tmp_path / f"{key(0).hex()}.kv").read_bytes()
    stored_key, mac = decode_header(raw[:HEADER_SIZE], layout.fingerprint(), layout.nbytes)
    assert stored_key == key(0) and len(mac) == 16
    disk.close()
