"""Explicit device, dtype and CPU-thread choice: CUDA + float16 when a GPU is present, CPU +
float32 otherwise."""

from __future__ import annotations

import os

import torch

from streamstudio.errors import StreamStudioError


def pick_device(name: str = "auto") -> torch.device:
    """`auto` gives cuda when available, else cpu; `cuda` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:  # torch's message lists twenty device types
        raise StreamStudioError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise StreamStudioError("device 'cuda' was asked for but no CUDA GPU is available; use --device cpu")
    return device


def pick_dtype(device: torch.device, name: str = "auto") -> torch.dtype:
    """`auto` gives float16 on CUDA and float32 on CPU."""
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    table = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}
    if name not in table:
        raise StreamStudioError(f"unknown dtype {name!r}; use one of auto, float16, bfloat16, float32")
    return table[name]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pick_threads(requested: int | None, device: torch.device) -> int | None:
    """Torch's CPU threads for the pipelines: `requested` when given (at least 1), else, on the
    CPU, one fewer than the usable CPUs (at most 8), so that decoding, encoding and the server
    keep a core: on 2 cores torch's default of 2 threads oversubscribes them and a render took
    3-5x longer under load. On a GPU (None) torch's default is left alone."""
    if requested is not None:
        if requested < 1:
            raise StreamStudioError(f"--threads must be at least 1, got {requested}")
        return requested
    if device.type != "cpu":
        return None
    return max(1, min(usable_cpus() - 1, 8))


def use_threads(requested: int | None, device: torch.device) -> int:
    """Set torch's CPU threads by `pick_threads`; returns the number in use."""
    n = pick_threads(requested, device)
    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()
