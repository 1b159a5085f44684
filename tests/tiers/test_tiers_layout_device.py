"""BlockLayout sizes and DeviceBlockIO gather/scatter against a per-block reference."""

from __future__ import annotations

import pytest
import torch

from hintkv.tiers.device import DeviceBlockIO
from hintkv.tiers.layout import BlockLayout


def test_layout_shape_and_bytes():
    lay = BlockLayout(30, 16, 3, 64, torch.bfloat16)
    assert lay.shape == (30, 2, 16, 3, 64)
    assert lay.nbytes == 30 * 2 * 16 * 3 * 64 * 2
    assert lay.fingerprint() != BlockLayout(30, 16, 3, 64, torch.float16).fingerprint()
    with pytest.raises(ValueError):
        BlockLayout(0, 16, 3, 64, torch.bfloat16)
    with pytest.raises(ValueError):
        lay.check_payload(torch.zeros(lay.shape, dtype=torch.float32))


def _caches(num_layers=3, num_blocks=7, bs=4, heads=2, dim=8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, num_blocks, bs, heads, dim, generator=g) for _ in range(num_layers)]


def test_read_gathers_all_layers_of_each_block():
    caches = _caches()
    io = DeviceBlockIO(caches)
    ids = [5, 0, 3]
    out = torch.empty(len(ids), *io.layout.shape)
    io.read(ids, out)
    for n, b in enumerate(ids):
        for layer, kv in enumerate(caches):
            assert torch.equal(out[n, layer, 0], kv[0, b])  # K
            assert torch.equal(out[n, layer, 1], kv[1, b])  # V


def test_write_scatters_and_round_trips():
    caches = _caches()
    io = DeviceBlockIO(caches)
    out = torch.empty(2, *io.layout.shape)
    io.read([1, 2], out)
    before = [kv.clone() for kv in caches]
    io.write([6, 4], out)
    for kv, old in zip(caches, before):
        assert torch.equal(kv[:, 6], old[:, 1]) and torch.equal(kv[:, 4], old[:, 2])
        untouched = [b for b in range(7) if b not in (4, 6)]
        assert torch.equal(kv[:, untouched], old[:, untouched])


def test_rejects_bad_shapes_and_ids():
    io = DeviceBlockIO(_caches())
    with pytest.raises(ValueError):
        io.read([0], torch.empty(2, *io.layout.shape))
    with pytest.raises(ValueError):
        io.read([9], torch.empty(1, *io.layout.shape))
    with pytest.raises(ValueError):
        io.write([1, 1], torch.empty(2, *io.layout.shape))
    with pytest.raises(ValueError):
        DeviceBlockIO([torch.zeros(2, 3, 4, 2, 8), torch.zeros(2, 4, 4, 2, 8)])
