"""build_tier_stack: flags to tiers."""

from __future__ import annotations

import pytest
import torch

from hintkv.tiers.build import build_tier_stack


def test_builds_the_tiers_the_flags_ask_for(layout, key, payload, empty, tmp_path):
    assert build_tier_stack(layout) is None
    stack = build_tier_stack(layout, host_cache_memory=2 * layout.nbytes,
                             disk_cache_dir=str(tmp_path), disk_cache_size="1MiB")
    assert [t.name for t in stack.tiers] == ["host", "disk"]
    assert stack.usage()["host"].capacity_blocks == 2
    for i in range(4):
        stack.store([(key(i), payload(i))])[0].result()
    dst = empty()
    assert stack.load(key(0), dst).result() is True and torch.equal(dst, payload(0))
    stack.check_integrity()
    stack.close()
    disk_only = build_tier_stack(layout, disk_cache_dir=str(tmp_path), disk_cache_size="1MiB",
                                 reuse_disk=True)
    assert [t.name for t in disk_only.tiers] == ["disk"]
    assert disk_only.lookup([key(0)]) == ["disk"]  # reused across the restart
    disk_only.close()


def test_rejects_unusable_flags(layout, tmp_path):
    with pytest.raises(ValueError):
        build_tier_stack(layout, disk_cache_dir=str(tmp_path))
    with pytest.raises(ValueError):
        build_tier_stack(layout, disk_cache_size="1GiB")
    marker = tmp_path / f"{'ab' * 16}.kv"
    marker.write_bytes(b"x")
    with pytest.raises(ValueError):
        build_tier_stack(layout, host_cache_memory="100B", disk_cache_dir=str(tmp_path),
                         disk_cache_size="1MiB")
    assert marker.exists()  # refused before the disk tier touched the directory
