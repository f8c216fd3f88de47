"""Which precision the machine at hand computes fastest in: ``auto`` for ``trainer.autocast`` and ``rollout.dtype``.

``auto`` means bfloat16 where the hardware multiplies bfloat16 matrices natively, float32 elsewhere:

- CUDA: bfloat16 when the device supports it (``torch.cuda.is_bf16_supported``: Ampere and later);
- CPU: bfloat16 when ``/proc/cpuinfo`` lists ``amx_bf16`` (Intel AMX tiles, Sapphire Rapids and later) or
  ``avx512_bf16`` (AVX512-BF16 dot products: Cooper Lake, Zen 4 and later); float32 on an AVX2-only CPU, where
  oneDNN emulates bfloat16 by converting to float32 (measured in vLLM on such a machine: 0.3x float32).

The resolution is a pure function of (setting, device type, CPU flags), so it is tested for each machine kind
without one (``auto_dtype``); ``cpu_flags`` reads the flags. Not here: applying a precision (the trainer's
``PolicyForward`` runs under ``torch.autocast``; explorers load their weights in ``rollout.dtype``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags (as /proc/cpuinfo spells them) that mean native bfloat16 matrix multiplication."""


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The ``flags`` of the first processor in ``cpuinfo`` (empty where the file is absent: not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / ARM spelling
            return frozenset(value.split())
    return frozenset()


def auto_dtype(device_type: str, flags: Iterable[str] = (), cuda_bf16: bool = True) -> str:
    """``"bfloat16"`` or ``"float32"``: what ``auto`` means on a ``device_type`` (``cpu`` | ``cuda``) device whose
    CPU lists ``flags`` (``cuda_bf16``: whether the CUDA device supports bfloat16)."""
    if device_type == "cuda":
        return "bfloat16" if cuda_bf16 else "float32"
    return "bfloat16" if any(flag in BF16_CPU_FLAGS for flag in flags) else "float32"


def resolve_dtype(setting: str | None, device: torch.device | str) -> str | None:
    """``setting`` with ``auto`` replaced by this machine's choice for ``device`` (other values pass through)."""
    if setting != "auto":
        return setting
    kind = torch.device(device).type
    cuda_bf16 = kind == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return auto_dtype(kind, cpu_flags() if kind == "cpu" else (), cuda_bf16)


def autocast_dtype(setting: str, device: torch.device | str) -> torch.dtype | None:
    """``trainer.autocast`` as the dtype the trainer's forward computes in (None = no autocast, float32)."""
    resolved = resolve_dtype(setting, device)
    return torch.bfloat16 if resolved == "bfloat16" else None


def precision_line(autocast: str, rollout_dtype: str | None, device: torch.device | str) -> str | None:
    """One log line saying what ``auto`` chose, or None when neither setting is ``auto``."""
    if "auto" not in (autocast, rollout_dtype):
        return None
    kind = torch.device(device).type
    found = [flag for flag in BF16_CPU_FLAGS if flag in cpu_flags()] if kind == "cpu" else []
    why = f"CPU flags {', '.join(found)}" if found else ("CUDA" if kind == "cuda" else "no amx_bf16/avx512_bf16")
    chosen = []
    if autocast == "auto":
        chosen.append(f"trainer.autocast=auto -> {'bfloat16' if autocast_dtype(autocast, device) else 'none'}")
    if rollout_dtype == "auto":
        chosen.append(f"rollout.dtype=auto -> {resolve_dtype(rollout_dtype, device)}")
    return f"precision: {', '.join(chosen)} ({kind}: {why})"
