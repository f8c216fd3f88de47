"""What the CPU is, for the files that record where a number was measured (the warm start's recipe, the
benchmarks' results): a CPU run's float kernels, and with them its timings and even its warm start's step count,
depend on the model and on the bfloat16 (avx512_bf16) and AMX instructions."""

from __future__ import annotations

import os
from pathlib import Path


def cpu() -> dict:
    """``{"model": name, "cores": os.cpu_count(), "avx512_bf16": bool, "amx": bool}`` from /proc/cpuinfo
    (``"unknown"`` and no flags where it cannot be read)."""
    name, flags = _cpuinfo()
    return {
        "model": name,
        "cores": os.cpu_count(),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": any(f.startswith("amx") for f in flags),
    }


def cpu_flags() -> set[str]:
    """Every flag /proc/cpuinfo lists (empty where it cannot be read)."""
    return _cpuinfo()[1]


def _cpuinfo() -> tuple[str, set[str]]:
    """The first processor's model name and the union of the processors' flags, in one read of /proc/cpuinfo."""
    flags: set[str] = set()
    name = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name == "unknown":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags |= set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return name, flags


def cpu_name() -> str:
    """The CPU's model name (``"unknown CPU"`` where /proc/cpuinfo cannot be read)."""
    name = cpu()["model"]
    return "unknown CPU" if name == "unknown" else name
