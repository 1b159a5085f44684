"""decode_layers.py's check of int8_cpu's team table: a table of another abi than the decode step reads (a stale
cached int8_cpu build) turns the team off for W8A8's steps once, with a warning, and the regions run them."""

from __future__ import annotations

import ctypes
import functools

import pytest
import torch

from hintkv.models import cpu_kernels, gemv_cpu
from tests.models.test_decode_layers import _fused_vs_per_op, _model, _OpsSpy

pytestmark = pytest.mark.skipif(not cpu_kernels.enabled() or gemv_cpu.ops() is None,
                                reason="C++ kernels off or not built: no fused decode layers")


class _StaleInt8Build:
    """int8_cpu's real build, but for its team table: one of another abi (a stale cached build's), never called."""

    def __init__(self, ops) -> None:
        self.ops, self.table = ops, (ctypes.c_int64 * 3)(999, 0, 0)  # abi, prepare, blocks

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def team_address(self) -> int:
        return ctypes.addressof(self.table)


def test_an_int8_team_table_of_another_abi_turns_the_team_off_with_a_warning(monkeypatch):
    """DecodeLayers reads int8_cpu's table's abi once when it is built: on a mismatch W8A8's decode steps run in the
    regions, with a warning, instead of failing every team step in decode_team's check (review_engine20 finding 9)."""
    from hintkv.models import int8_cpu

    if int8_cpu.ops() is None or not int8_cpu.ops().team_address():
        pytest.skip("int8_cpu's build has no team loop on this CPU")
    monkeypatch.setattr(int8_cpu, "ops", functools.partial(_StaleInt8Build, int8_cpu.ops()))
    monkeypatch.setenv("HINTKV_DECODE_TEAM", "1")
    with pytest.warns(UserWarning, match="abi 999, the decode step reads"):
        model = _model("w8a8", bias=False)  # held here: the fused call holds its model weakly
    fused = model._decode_layers
    assert fused is not None and fused.int8_team == 0 and not fused.team
    fused._ops = spy = _OpsSpy(fused._ops)
    got, want, kv, kv_ref = _fused_vs_per_op(model, [1, 1], [37, 12], seed=2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert spy.calls == [("decode_layers", True)]  # the regions ran the step; the team was never called
