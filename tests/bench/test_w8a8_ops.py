"""The w8a8 per-op probe (`python -m hintkv.bench.w8a8_ops`): every kernel's column, AMX flag restored."""

from __future__ import annotations

import pytest

from hintkv.bench import w8a8_ops
from hintkv.models import int8


def test_probe_times_each_kernel_and_restores_the_amx_flag():
    before = int8.AMX
    (row,) = w8a8_ops.op_rows("down", [2], reps=1)
    assert row["op"] == "down" and row["rows"] == 2
    cols = ("float MKL us", "w8a8 VNNI us", "w8a8 AMX us", "w8a8-fine VNNI us", "w8a8-fine AMX us")
    assert all(row[c] >= 0 for c in cols) and row["float/w8a8 AMX"] > 0
    assert int8.AMX == before


def test_probe_rejects_an_unknown_op():
    with pytest.raises(SystemExit) as e:
        w8a8_ops.main(["--ops", "qkv,nope"])
    assert e.value.code == 2
