"""Building hintkv's C++ CPU extensions: one loader, one fallback.

`load(name, source, functions, cflags)` compiles C++ source with torch.utils.cpp_extension's
`load_inline` (g++ and ninja; ~1 minute the first time on this machine, then cached under
~/.cache/torch_extensions) and returns the module, or None after one warning when it cannot be
built (no compiler, no ninja): callers then run their eager PyTorch ops. Every source is built on `HEADERS`
(the few torch headers the kernels use), not load_inline's implicit <torch/extension.h>: that header was about
half of each build. `failures()` keeps why each build
failed (torch's error, which carries the compiler's output whole); where a build is expected to work
(`build_required()`: CI, or a C++ compiler and ninja on this machine) tests/test_ci_prebuild.py fails with it
instead of letting the kernel tests skip. The module name carries
the hash of the source, the flags and the torch installation it builds against, so checkouts of
other versions share the build cache, a same-named build of other source is never loaded, and two
virtual environments (the lead's fresh-clone CI and /work/main/.venv) do not rebuild each other's
.so: torch writes its include paths into the build's ninja file, and a changed file rebuilt it on
every switch (session 10: a rebuild killed mid-way left a lock every later load waited on).
It also carries the CPU's feature flags (/proc/cpuinfo): the builds use -march=native, so a build
cache shared by machines of other CPUs (an AMX build on an Ice Lake) never loads an .so whose
instructions the CPU lacks (SIGILL); it rebuilds instead.

A build runs under an advisory lock (`flock`) on a file in its build folder: the kernel drops it when
its process dies. torch's own `lock` file stays behind when a build is killed (Ctrl-C during the
first `hintkv serve`), and every later load waited on it forever, silently; holding the flock, a
process knows no live hintkv process is building that name, so a `lock` file it finds is stale and
goes (with a warning).

Every function is bound with the GIL released while it runs (`bindings`): the server's event loop
thread then formats and streams the last step's tokens while the engine thread's kernels run. With
load_inline's default bindings a kernel kept the GIL for its whole run (a float32 decode step spends
~75% of its time in these kernels), so every per-token task of the event loop waited for a kernel's
end, and the engine thread then waited for the event loop at the next Python line. The kernels touch
no Python object (tensors and ints in, tensors / vectors out, converted after the GIL is taken back).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import warnings
from types import ModuleType

_built: dict[str, ModuleType | None] = {}
_failed: dict[str, str] = {}  # name -> why its build failed: the exception, with the compiler's output
log = logging.getLogger(__name__)


def build_tag(source: str, cflags: list[str], torch_dir: str, cpu: str) -> str:
    """The build's name suffix: one per (source, flags, torch installation, CPU features)."""
    return hashlib.sha1("\0".join([source, " ".join(cflags), torch_dir, cpu]).encode()).hexdigest()[:12]


def cpu_flags() -> str:
    """This CPU's feature flags (the first `flags` line of /proc/cpuinfo), "" where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def build_directory(full_name: str) -> str:
    """The folder torch builds `full_name` in (TORCH_EXTENSIONS_DIR or its default root + py*_cpu), made if absent."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(full_name, False)


def clear_stale_baton(build_dir: str, full_name: str) -> bool:
    """Remove torch's build `lock` in `build_dir` (call only holding that folder's flock): True if there was one."""
    path = os.path.join(build_dir, "lock")
    if not os.path.exists(path):
        return False
    warnings.warn(f"{full_name}: removing a stale build lock {path} (a build was killed mid-way)",
                  RuntimeWarning, stacklevel=2)
    os.remove(path)
    return True


def _build(full_name: str, source: str, cflags: list[str]) -> ModuleType:
    """Build (or load the cached build of) `source`, which carries its own `bindings`."""
    from torch.utils.cpp_extension import load_inline

    # the flock lives in the folder torch builds in (not beside a root two processes may name differently:
    # TORCH_EXTENSIONS_DIR=<root>/py311_cpu and unset build in the same folder)
    build_dir = build_directory(full_name)
    with open(os.path.join(build_dir, "hintkv-build.flock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released by the kernel if this process dies
        clear_stale_baton(build_dir, full_name)
        if not os.path.exists(os.path.join(build_dir, f"{full_name}.so")):
            log.warning("building the C++ extension %s (first use with this source; a minute or two)", full_name)
        return load_inline(name=full_name, cpp_sources=source, no_implicit_headers=True,
                           extra_cflags=cflags, extra_ldflags=["-fopenmp"], verbose=False)


# What every extension is built on, instead of load_inline's implicit <torch/extension.h> (torch/all.h: every ATen
# op's declaration, autograd and the C++ frontend, parsed once per extension): the Tensor, the two factories the
# kernels call, ATen's parallel_for, and pybind11 with torch's Tensor caster and `wrap_pybind_function_no_gil`.
# torch/types.h's `namespace torch { using namespace at; }` and its dtype names keep the sources' torch::Tensor /
# torch::kFloat32 / torch::empty spelling.
HEADERS = """#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
namespace torch {
using namespace at;
constexpr auto kInt8 = at::kChar, kInt16 = at::kShort, kInt32 = at::kInt, kInt64 = at::kLong, kFloat32 = at::kFloat;
}
"""


def bindings(functions: list[str]) -> str:
    """The pybind11 module of `functions`, each run with the GIL released and torch's error handling."""
    defs = "".join(f'    m.def("{f}", torch::wrap_pybind_function_no_gil({f}), "{f}");\n' for f in functions)
    return "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n" + defs + "}\n"


def load(name: str, source: str, functions: list[str], cflags: list[str]) -> ModuleType | None:
    """The built extension `name` (cached per process), or None when it cannot be built (warned once)."""
    if name not in _built:
        try:
            import torch

            source = HEADERS + source + "\n" + bindings(functions)
            tag = build_tag(source, cflags, os.path.dirname(torch.__file__), cpu_flags())
            _built[name] = _build(f"{name}_{tag}", source, cflags)
        except Exception as e:  # noqa: BLE001 - any build failure means: run the eager ops
            warnings.warn(f"{name}: C++ CPU ops unavailable ({type(e).__name__}: {diagnostics(str(e))}); "
                          "running eager ops", RuntimeWarning, stacklevel=3)
            _built[name] = None
            _failed[name] = f"{type(e).__name__}: {e}"
    return _built[name]


def diagnostics(error: str, limit: int = 600) -> str:
    """A build error's compiler diagnostics (its `error:` lines; torch's message opens with the command line)."""
    lines = [line.strip() for line in error.splitlines() if "error:" in line]
    return ("; ".join(lines) or error)[:limit]


def failures() -> dict[str, str]:
    """Each extension whose build failed in this process -> why (torch's error: the compiler's output, whole)."""
    return dict(_failed)


def build_required() -> bool:
    """Whether a failed build is a fault rather than the fallback: in CI (`CI` set and not false: .ci/run installs
    g++ and ninja) and wherever torch would find its C++ compiler and ninja. The compiler is torch's own choice
    (`get_cxx_compiler()`: $CXX, or c++ when unset), looked up whole: torch 2.13 shell-quotes it into the ninja file
    as one word, so "ccache g++" or an empty $CXX is a program no build can run (shutil.which("") is None). Older
    torch wrote $CXX unquoted: pyproject requires torch >= 2.13 for this reading."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return True
    from torch.utils.cpp_extension import get_cxx_compiler, is_ninja_available

    compiler = get_cxx_compiler()
    return shutil.which(compiler) is not None and is_ninja_available()
