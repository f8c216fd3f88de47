"""``auto`` precision: bfloat16 exactly where the machine multiplies it natively (oprl.models.precision)."""

import pytest
import torch

from oprl.models.precision import auto_dtype, autocast_dtype, cpu_flags, precision_line, resolve_dtype

AMX = "fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
AVX512_BF16 = "fpu sse2 avx2 avx512f avx512_bf16"  # AMD Zen 4 (this project's EPYC machine), Intel Cooper Lake
AVX2 = "fpu sse2 avx avx2 fma"  # AMD Zen 2/3: oneDNN emulates bfloat16 through float32


@pytest.mark.parametrize(
    ("flags", "expected"), [(AMX, "bfloat16"), (AVX512_BF16, "bfloat16"), (AVX2, "float32"), ("", "float32")]
)
def test_auto_on_cpu_follows_the_native_bfloat16_flags(flags, expected):
    assert auto_dtype("cpu", flags.split()) == expected


def test_auto_on_cuda_is_bfloat16_where_supported_whatever_the_host_cpu():
    assert auto_dtype("cuda", AVX2.split(), cuda_bf16=True) == "bfloat16"
    assert auto_dtype("cuda", AMX.split(), cuda_bf16=False) == "float32"


def test_cpu_flags_reads_the_first_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {AVX512_BF16}\n\nprocessor\t: 1\nflags\t\t: {AVX2}\n")
    assert cpu_flags(info) == frozenset(AVX512_BF16.split())
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_explicit_settings_pass_through_and_auto_matches_this_machine():
    assert resolve_dtype("float32", "cpu") == "float32" and resolve_dtype(None, "cpu") is None
    assert autocast_dtype("none", "cpu") is None and autocast_dtype("bfloat16", "cpu") is torch.bfloat16
    native = auto_dtype("cpu", cpu_flags())
    assert resolve_dtype("auto", "cpu") == native
    assert autocast_dtype("auto", "cpu") == (torch.bfloat16 if native == "bfloat16" else None)


def test_precision_line_is_one_line_and_only_for_auto():
    assert precision_line("none", "bfloat16", "cpu") is None
    line = precision_line("auto", "auto", "cpu")
    assert line is not None and "\n" not in line
    assert line.startswith("precision: trainer.autocast=auto -> ") and "rollout.dtype=auto -> " in line
