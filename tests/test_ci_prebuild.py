"""The fresh-clone CI (`.ci/run`, through `.ci/prebuild.py`) builds every C++ CPU extension before pytest starts:
a test (or a server a test starts, under its start-up timeout) that is first to call an extension
would otherwise wait minutes for g++ on a loaded machine (last session's run: the first
`cpu_threads` test took 435 s, its build included, at load 18)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _builders() -> dict[str, str]:
    """module (dotted) -> the function that calls `cpu_ext.load` in it."""
    out = {}
    for path in sorted((ROOT / "hintkv").rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r"^def (\w+)\(\)[^\n]*:\n(?:(?:    [^\n]*)?\n)*?    return cpu_ext\.load\(",
                             text, re.M):
            out[".".join(path.relative_to(ROOT).with_suffix("").parts)] = m.group(1)
    return out


def test_ci_prebuilds_every_cpu_extension():
    import importlib.util

    builders = _builders()
    assert len(builders) >= 6, builders  # the search itself still finds them
    spec = importlib.util.spec_from_file_location("prebuild", ROOT / ".ci" / "prebuild.py")
    prebuild = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prebuild)
    assert sorted(prebuild.BUILDERS) == sorted(builders.items()), ".ci/prebuild.py's BUILDERS miss or add a builder"
    assert "python .ci/prebuild.py" in (ROOT / ".ci" / "run").read_text().split("python -m pytest")[0]


def test_every_cpu_extension_builds_where_a_build_is_required():
    """Where a build is expected to work (CI: .ci/run installs g++ and ninja; or a compiler and ninja here), a failed
    build fails here with the compiler's output, instead of every kernel test skipping (their `ops() is None`
    skips) while the eager fallback passes the gate; without a compiler it is a skip that says why."""
    import importlib

    import pytest

    from hintkv.models import cpu_ext

    built = {f"{module}.{fn}()": getattr(importlib.import_module(module), fn)() for module, fn in _builders().items()}
    missing = sorted(call for call, ops in built.items() if ops is None)
    why = "\n\n".join(f"{name}:\n{error}" for name, error in cpu_ext.failures().items())
    if missing and not cpu_ext.build_required():
        pytest.skip(f"no C++ compiler or ninja here: {', '.join(missing)} run eager ops ({cpu_ext.diagnostics(why)})")
    assert not missing, f"C++ extensions failed to build: {', '.join(missing)}\n{why}"


def test_a_failed_build_keeps_the_compilers_error_and_ci_requires_a_build(tmp_path, monkeypatch):
    import pytest
    import torch

    from hintkv.models import cpu_ext

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    with pytest.warns(RuntimeWarning, match=r"unavailable \(RuntimeError: [^(]*error: [^(]*hintkv-no-such-option"):
        assert cpu_ext.load(f"hintkv_broken_{torch.randint(1 << 30, ()).item()}", "int f() { return 0; }", ["f"],
                            ["-fhintkv-no-such-option"]) is None
    error = list(cpu_ext.failures().values())[-1]
    assert "hintkv-no-such-option" in error and "error" in error.lower()
    monkeypatch.delenv("CXX", raising=False)
    for value, required in (("true", True), ("1", True), ("false", None), ("", None)):
        monkeypatch.setenv("CI", value)
        monkeypatch.setenv("PATH", "" if required is None else str(tmp_path))  # no compiler on it
        assert cpu_ext.build_required() is (required or False)


def _executable(path: Path, script: str = "exit 0") -> None:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def test_a_compiler_and_ninja_here_require_a_build_outside_ci(tmp_path, monkeypatch):
    """The local gate (CI unset): torch's C++ compiler ($CXX whole, or c++) and a ninja that answers --version (torch's
    is_ninja_available runs it) on PATH require a build; without ninja, or without the compiler, a failure is a skip."""
    from hintkv.models import cpu_ext

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    _executable(tmp_path / "c++")
    _executable(tmp_path / "ninja", "echo 1.11.1")
    assert cpu_ext.build_required() is True
    monkeypatch.setenv("CXX", "ccache g++ -O2")  # torch quotes $CXX into the ninja file as one word: no such program
    _executable(tmp_path / "ccache")
    assert cpu_ext.build_required() is False
    _executable(tmp_path / "g++-12")
    monkeypatch.setenv("CXX", "g++-12")  # $CXX is the compiler torch runs (torch puts ccache before it by itself)
    assert cpu_ext.build_required() is True
    monkeypatch.setenv("CXX", str(tmp_path / "g++-12"))  # a path works too
    assert cpu_ext.build_required() is True
    (tmp_path / "ninja").unlink()
    assert cpu_ext.build_required() is False
    _executable(tmp_path / "ninja", "echo 1.11.1")
    monkeypatch.setenv("CXX", "")  # set but empty: torch's get_cxx_compiler() gives '', which no build can run
    assert cpu_ext.build_required() is False
    monkeypatch.delenv("CXX")
    assert cpu_ext.build_required() is True
    (tmp_path / "c++").unlink()
    assert cpu_ext.build_required() is False


def test_no_extension_source_includes_torchs_whole_api():
    """Every extension is built on cpu_ext.HEADERS (the Tensor, two factories, parallel_for, pybind11 and torch's
    caster): <torch/extension.h> (torch/all.h: every ATen op, autograd, the C++ frontend) took about half of each
    build's compile, eight times over in a fresh clone's setup. An include of it anywhere brings that back."""
    from hintkv.models import cpu_ext

    heavy = re.compile(r"#\s*include\s*<(torch/(extension|all|torch|types)\.h|ATen/ATen\.h)>")
    files = [*(ROOT / "hintkv").rglob("*.py"), *(ROOT / "hintkv").rglob("*.cpp"), *(ROOT / "hintkv").rglob("*.h")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for m in heavy.finditer(p.read_text())]
    assert not found, found
    assert not heavy.search(cpu_ext.HEADERS) and "#include <torch/csrc/utils/pybind.h>" in cpu_ext.HEADERS
