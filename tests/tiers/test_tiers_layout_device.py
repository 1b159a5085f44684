"""BlockLayout sizes and DeviceBlockIO gather/scatter against a per-block reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_cpu_pieces_gather_and_scatter_like_indexed_copies(data):
    """The CPU's piecewise copies (`device._cpu_pieces`: slices of consecutive ids, indexed copies of scattered
    ones, pieces under CPU_COPY_ELEMS) give the indexed gather's bytes and write exactly the named blocks."""
    from hintkv.tiers import device as dev

    num_blocks = 12
    ids = data.draw(st.permutations(range(num_blocks)))[:data.draw(st.integers(1, num_blocks))]
    ids = sorted(ids) if data.draw(st.booleans()) else ids  # runs, or any order
    kv = [torch.randn(2, num_blocks, 2, 1, 3) for _ in range(3)]
    io = DeviceBlockIO(kv)
    saved, dev.CPU_COPY_ELEMS = dev.CPU_COPY_ELEMS, data.draw(st.sampled_from([2, 7, 13, 32768]))  # 1-3 blocks a piece
    try:
        got = torch.empty((len(ids), *io.layout.shape))
        io.read(ids, got)
        idx = torch.tensor(ids)
        want = torch.stack([k.index_select(1, idx).transpose(0, 1) for k in kv], dim=1)
        assert torch.equal(got, want)
        before = [k.clone() for k in kv]
        src = torch.randn_like(got)
        io.write(ids, src)
        for layer, (k, old) in enumerate(zip(kv, before)):
            expect = old.clone()
            expect.index_copy_(1, idx, src[:, layer].transpose(0, 1))
            assert torch.equal(k, expect)
    finally:
        dev.CPU_COPY_ELEMS = saved
