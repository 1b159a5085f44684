"""The two per-process CPU kernel choices, each an HINTKV_* switch or `auto` decided from /proc/cpuinfo:

    HINTKV_CPU_GEMM=mkl|onednn|packed|auto  float32 rows past the few-row kernel (`linear.cpu_gemm`)
    HINTKV_W8A8_PREFILL=int8|float|auto     w8a8 rows past gemv's (`int8.int8_gemm_rows_run_int8`)

The `auto` decisions are pure functions of the cpuinfo text (and torch's vector capability), so tests run
them on fixed snippets of other CPUs; the readers below feed them this machine's. `env_choice` is also the one
parser of HINTKV_DECODE_TEAM=0|1|auto (unset: auto, decided step by step in `team_choice.py`).
"""

from __future__ import annotations

import functools
import logging
import os

import torch

log = logging.getLogger(__name__)


def env_choice(name: str, choices: tuple[str, ...], default: str = "auto") -> str:
    """The value of switch `name`: one of `choices` or "auto" (unset or empty: `default`); anything else raises."""
    want = os.environ.get(name, "").strip().lower() or default
    if want not in (*choices, "auto"):
        raise ValueError(f"{name} must be one of {', '.join(choices)} or auto, not {want!r}")
    return want


def cpu_flags(cpuinfo: str) -> set[str]:
    """The first CPU's feature flags ("flags" on x86, "Features" on aarch64)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def float_gemm_for(cpuinfo: str, capability: str) -> str:
    """auto's float32 GEMM library: onednn on a non-Intel CPU with AVX-512 (MKL's sgemm runs its AVX2 code
    there), packed (`packed_gemm.py`, ours) on a non-Intel CPU with AVX2 + FMA and no AVX-512 (Zen 3, 24th
    session, one thread, in the engine: a cold 128-token prefill's GEMMs 0.74-0.81x MKL's time, 512 tokens
    0.91-0.95x), else mkl (an Intel AMX machine, 13th session: MKL-packed 26.5 ms per dummy:tiny layer at 512
    rows, F.linear 28.3, oneDNN 29.6; Intel AVX2 was not measured). `capability`:
    torch.backends.cpu.get_cpu_capability()."""
    flags = cpu_flags(cpuinfo)
    if "GenuineIntel" in cpuinfo or capability == "DEFAULT":
        return "mkl"
    if "avx512f" in flags:
        return "onednn"
    return "packed" if {"avx2", "fma"} <= flags else "mkl"


def int8_rows_for(flags: set[str]) -> bool:
    """auto's w8a8 prefill: int8 (`torch._int_mm`) where the CPU has AVX512-VNNI or AMX int8 tiles, else the
    float weight. AVX2 alone (Zen 1, 14th session): int8 prefill 17-20x slower than float32. AVX-VNNI
    without AVX-512 (Alder Lake and later client CPUs) was not measured, so it takes the float weight."""
    return bool(flags & {"avx512_vnni", "amx_int8"})


@functools.cache
def read_cpuinfo() -> str:
    """This machine's /proc/cpuinfo ("" where there is none: auto then picks mkl and float rows, with a warning)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read(65536)
    except OSError:
        log.warning("no /proc/cpuinfo: HINTKV_CPU_GEMM and HINTKV_W8A8_PREFILL auto pick mkl and float rows")
        return ""


def this_cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()
