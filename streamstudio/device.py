"""Explicit device and dtype choice: CUDA + float16 when a GPU is present, CPU + float32 otherwise."""

from __future__ import annotations

import torch

from streamstudio.errors import StreamStudioError


def pick_device(name: str = "auto") -> torch.device:
    """`auto` gives cuda when available, else cpu; `cuda` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
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
