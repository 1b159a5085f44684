"""The C++ extensions' build name: one per source, flags and torch installation (`models/cpu_ext.py`)."""

from __future__ import annotations

from hintkv.models.cpu_ext import build_tag


def test_each_torch_installation_builds_its_own_extension():
    tag = build_tag("src", ["-O3"], "/venv-a/torch")
    assert tag == build_tag("src", ["-O3"], "/venv-a/torch")  # the same venv reuses its build
    assert tag != build_tag("src", ["-O3"], "/venv-b/torch")  # another venv never rewrites it
    assert tag != build_tag("src2", ["-O3"], "/venv-a/torch") != build_tag("src", ["-O2"], "/venv-a/torch")
    assert build_tag("ab", ["c"], "d") != build_tag("a", ["bc"], "d")  # fields are delimited
