"""`cpu_choice`'s auto decisions on fixed /proc/cpuinfo snippets of other CPUs (not only this machine's), and the
HINTKV_* switch parser they share."""

from __future__ import annotations

import pytest

from hintkv.models.cpu_choice import cpu_flags, env_choice, float_gemm_for, int8_rows_for

# trimmed /proc/cpuinfo heads: vendor and flags are what the decisions read
SAPPHIRE_RAPIDS = ("vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse2 avx "
                   "avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n")
ZEN4 = ("vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\nflags\t\t: fpu sse2 avx avx2 fma "
        "avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni\n")
ZEN1 = ("vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7551 32-Core Processor\nflags\t\t: fpu sse2 avx avx2 fma "
        "bmi2\n")
ZEN3 = ("vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\nflags\t\t: fpu sse2 avx avx2 fma "
        "bmi2 vaes vpclmulqdq\n")
ZEN3_NO_FMA = ZEN3.replace(" fma ", " ")
ALDER_LAKE = ("vendor_id\t: GenuineIntel\nmodel name\t: 12th Gen Intel(R) Core(TM) i7-12700\nflags\t\t: fpu sse2 "
              "avx avx2 fma avx_vnni\n")
GRAVITON3 = "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes sha1 sve i8mm bf16\n"


@pytest.mark.parametrize(("cpuinfo", "capability", "gemm", "int8_rows"), [
    (SAPPHIRE_RAPIDS, "AVX512", "mkl", True),  # Intel: MKL's sgemm is its own AVX-512 (13th session's AMX runs)
    (ZEN4, "AVX512", "onednn", True),          # AMD AVX-512: MKL takes its AVX2 code, oneDNN its AVX-512
    (ZEN4, "DEFAULT", "mkl", True),            # torch told to run no vector code (ATEN_CPU_CAPABILITY=default)
    (ZEN3, "AVX2", "packed", False),           # AMD AVX2 without AVX-512: our packed GEMM (24th session)
    (ZEN1, "AVX2", "packed", False),           # no AVX-512; no VNNI: int8 prefill was 17-20x slower
    (ZEN3_NO_FMA, "AVX2", "mkl", False),       # the micro-kernel needs FMA
    (ALDER_LAKE, "AVX2", "mkl", False),        # AVX-VNNI without AVX-512: not measured, float rows
    (GRAVITON3, "DEFAULT", "mkl", False),
    ("", "AVX512", "mkl", False),              # no /proc/cpuinfo
])
def test_auto_choices_follow_the_cpu(cpuinfo, capability, gemm, int8_rows):
    assert float_gemm_for(cpuinfo, capability) == gemm
    assert int8_rows_for(cpu_flags(cpuinfo)) is int8_rows


def test_flags_are_whole_words_of_the_flags_line():
    assert "avx512f" not in cpu_flags("vendor_id\t: AuthenticAMD\nflags\t\t: avx2 avx512fx\n")
    assert cpu_flags(GRAVITON3) >= {"asimd", "i8mm"}


def test_env_choice_reads_the_switch_or_refuses_it(monkeypatch):
    monkeypatch.delenv("HINTKV_TEST_CHOICE", raising=False)
    assert env_choice("HINTKV_TEST_CHOICE", ("a", "b")) == "auto"
    for raw, want in ((" B ", "b"), ("", "auto"), ("AUTO", "auto")):
        monkeypatch.setenv("HINTKV_TEST_CHOICE", raw)
        assert env_choice("HINTKV_TEST_CHOICE", ("a", "b")) == want
    monkeypatch.setenv("HINTKV_TEST_CHOICE", "c")
    with pytest.raises(ValueError, match="HINTKV_TEST_CHOICE must be one of a, b or auto"):
        env_choice("HINTKV_TEST_CHOICE", ("a", "b"))
