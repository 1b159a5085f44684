"""The KV namespace covers what the K/V values depend on: an engine never loads blocks that another
engine's weights or kernels computed, from a reused disk dir (the same holds for a shared pool:
both look blocks up by the hash chain rooted in `namespace_root`). review rev25 A5."""

from __future__ import annotations

import pytest

from hintkv.engine.types import CacheEdit
from tests.engine.tier_engine_helpers import BLOCK, generate, prompt, session, settle, tiny_engine


def _offload_to_disk(disk: str, tokens: list[int], **cfg) -> None:
    a = tiny_engine(kv_tokens=16 * BLOCK, disk_cache_dir=disk, disk_cache_size="8MiB",
                    disk_cache_reuse=True, offload_mode="lazy", **cfg)
    try:
        generate(a, tokens, sid="s")
        a.manage(session("s"), [CacheEdit("offload")])
        settle(a)
    finally:
        a.close()


def _cached_on(disk: str, tokens: list[int], **cfg) -> int:
    b = tiny_engine(kv_tokens=16 * BLOCK, disk_cache_dir=disk, disk_cache_size="8MiB",
                    disk_cache_reuse=True, **cfg)
    try:
        return generate(b, tokens + prompt(4, 4), sid="s")[1]
    finally:
        b.close()


@pytest.mark.parametrize("other", [{"quantization": "w8a8"}, {"seed": 1}], ids=["w8a8", "other-weights"])
def test_an_engine_never_loads_blocks_other_numerics_computed(tmp_path, other):
    tokens = prompt(3, 6 * BLOCK)
    disk = str(tmp_path / "kv")
    _offload_to_disk(disk, tokens)
    assert _cached_on(disk, tokens, **other) == 0
    # the control: the same engine again finds the blocks, so the 0 above is the namespace's doing
    assert _cached_on(disk, tokens) == 6 * BLOCK
