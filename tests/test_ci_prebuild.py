"""The fresh-clone CI (`.ci/run`) builds every C++ CPU extension before pytest starts: a test
(or a server a test starts, under its start-up timeout) that is first to call an extension
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
    builders = _builders()
    assert len(builders) >= 6, builders  # the search itself still finds them
    ci = (ROOT / ".ci" / "run").read_text()
    prebuild = ci[ci.index("python -c 'from hintkv.models import cpu_kernels"):ci.index("python -m pytest")]
    loop = re.search(r"for m in \(([^)]*)\):\n\s+m\.ops\(\)", prebuild)  # the modules whose ops() it calls
    looped = set(re.findall(r"\w+", loop.group(1))) if loop else set()
    for module, fn in builders.items():
        name = module.rsplit(".", 1)[1]
        called = name in looped if fn == "ops" else f"{name}.{fn}()" in prebuild
        assert re.search(rf"\b{name}\b", prebuild) and called, \
            f".ci/run does not build {module}.{fn}() before the tests"
