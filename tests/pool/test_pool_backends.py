"""The backend contract, run against every backend: embedded (in-process), embedded over a
shared directory, and Mooncake Store with a real master."""

from __future__ import annotations

import pytest
import torch

from hintkv.pool.backend import make_backend

N = 4096


def blob(seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (N,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


def test_put_get_round_trip_is_byte_exact(make_pool_backend, prefix):
    b = make_pool_backend(N)
    keys = [f"{prefix}-{i}" for i in range(5)]
    assert b.put(keys, [blob(i) for i in range(5)]) == [True] * 5
    dsts = [torch.zeros(N, dtype=torch.uint8) for _ in range(6)]
    assert b.get(keys + [f"{prefix}-missing"], dsts) == [True] * 5 + [False]
    for i in range(5):
        assert torch.equal(dsts[i], blob(i))
    assert b.exists(keys[:2] + [f"{prefix}-missing"]) == [True, True, False]


def test_put_on_an_existing_key_overwrites(make_pool_backend, prefix):
    b = make_pool_backend(N)
    k = f"{prefix}-k"
    assert b.put([k], [blob(1)]) == [True]
    assert b.put([k], [blob(2)]) == [True]
    dst = torch.zeros(N, dtype=torch.uint8)
    assert b.get([k], [dst]) == [True]
    assert torch.equal(dst, blob(2))


def test_remove_right_after_a_read_and_keep_alive(make_pool_backend, prefix):
    b = make_pool_backend(N)
    keys = [f"{prefix}-{i}" for i in range(3)]
    b.put(keys, [blob(i) for i in range(3)])
    dst = torch.zeros(N, dtype=torch.uint8)
    assert b.get(keys[:1], [dst]) == [True]  # Mooncake: the read leases the key
    assert b.keep_alive(keys + [f"{prefix}-missing"]) == [True, True, True, False]
    assert b.remove(keys[:2] + [f"{prefix}-missing"]) == [True, True, False]
    assert b.exists(keys) == [False, False, True]
    assert b.get(keys[:1], [dst]) == [False]


def test_batches_larger_than_the_staging_arena(make_pool_backend, prefix):
    b = make_pool_backend(1 << 20, segment_bytes=128 << 20)
    n = 40  # > 32 MiB of staging: cut into several calls
    keys = [f"{prefix}-{i}" for i in range(n)]
    blobs = [torch.full((1 << 20,), i, dtype=torch.uint8) for i in range(n)]
    assert b.put(keys, blobs) == [True] * n
    dsts = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(n)]
    assert b.get(keys, dsts) == [True] * n
    assert all(int(d[0]) == i and int(d[-1]) == i for i, d in enumerate(dsts))
    b.remove(keys)


def test_two_clients_share_one_pool(make_pool_backend, backend_name, prefix):
    if backend_name == "embedded":
        pytest.skip("the in-process pool is one instance's own")
    a, c = make_pool_backend(N), make_pool_backend(N)
    assert a.put([f"{prefix}-x"], [blob(7)]) == [True]
    dst = torch.zeros(N, dtype=torch.uint8)
    assert c.exists([f"{prefix}-x"]) == [True]
    assert c.get([f"{prefix}-x"], [dst]) == [True] and torch.equal(dst, blob(7))
    assert c.remove([f"{prefix}-x"]) == [True]
    assert a.exists([f"{prefix}-x"]) == [False]


def test_unknown_backend_and_bad_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown pool backend"):
        make_backend("redis", N)
    b = make_backend("embedded", N, directory=tmp_path)
    with pytest.raises(ValueError, match="pool keys"):
        b.put(["../escape"], [blob(0)])
