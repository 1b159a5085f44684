"""Fixtures for the pool tests: a real `mooncake_master` on loopback (free ports, killed after),
and a factory of pool backends by name (`embedded`, `embedded-dir`, `mooncake`)."""

from __future__ import annotations

import itertools
import uuid

import pytest

from hintkv.pool.backend import make_backend

_ids = itertools.count()


def mooncake_available() -> bool:
    try:
        import mooncake.store  # noqa: F401

        from hintkv.pool.master import master_binary
        master_binary()
        return True
    except (ImportError, OSError):
        return False


needs_mooncake = pytest.mark.skipif(not mooncake_available(),
                                    reason="mooncake-transfer-engine-non-cuda / libibverbs1 "
                                           "not installed (.ci/run installs them)")


@pytest.fixture(scope="session")
def mooncake_master(tmp_path_factory):
    if not mooncake_available():
        pytest.skip("mooncake is not installed")
    from hintkv.pool.master import MooncakeMaster
    m = MooncakeMaster(log_path=tmp_path_factory.mktemp("master") / "master.log").start()
    yield m
    m.stop()


@pytest.fixture
def fresh_master(tmp_path):
    """A master of this test's own (for tests that kill it)."""
    if not mooncake_available():
        pytest.skip("mooncake is not installed")
    from hintkv.pool.master import MooncakeMaster
    m = MooncakeMaster(log_path=tmp_path / "master.log").start()
    yield m
    m.stop()


@pytest.fixture(params=["embedded", "embedded-dir", "mooncake"])
def backend_name(request):
    if request.param == "mooncake" and not mooncake_available():
        pytest.skip("mooncake is not installed")
    return request.param


@pytest.fixture
def make_pool_backend(backend_name, request, tmp_path):
    """backend(blob_nbytes) -> a fresh backend of the parametrized kind; closed after the test.
    Mooncake backends share the session's master; embedded-dir ones share `tmp_path/pool`."""
    made = []

    def make(blob_nbytes: int, segment_bytes: int = 64 << 20):
        if backend_name == "embedded":
            b = make_backend("embedded", blob_nbytes)
        elif backend_name == "embedded-dir":
            b = make_backend("embedded", blob_nbytes, directory=tmp_path / "pool")
        else:
            m = request.getfixturevalue("mooncake_master")
            b = make_backend("mooncake", blob_nbytes, master=m.rpc_address,
                             metadata=m.metadata_url, segment_bytes=segment_bytes)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture
def prefix():
    """A key prefix of this test's own, so tests sharing a master never see each other's keys."""
    return f"t{next(_ids)}-{uuid.uuid4().hex[:8]}"
