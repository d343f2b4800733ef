"""A GPU faked on the CPU, for the tests of the CUDA-only branches (tests/acceleration/test_gpu_branches.py
says how): a fake `torch.cuda` (the `fake_gpu` fixture in this folder's conftest), `CudaOnCpu`
(tensors asked for on "cuda" made on the CPU; the `cuda_on_cpu` fixture) and modules that report
CUDA parameters (`OnCuda`)."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

GPU_NAME = "NVIDIA H100 80GB HBM3"
CUDA = torch.device("cuda")


# ------------------------------------------------------------------ fakes
class FakeEvent:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        assert self.t is not None, "synchronize() on an event never recorded"

    def elapsed_time(self, end: "FakeEvent") -> float:
        return 1e3 * (end.t - self.t)  # milliseconds, as torch.cuda.Event


def _cpu(d):
    if isinstance(d, torch.device) and d.type == "cuda":
        return torch.device("cpu")
    if isinstance(d, str) and d.split(":")[0] == "cuda":
        return "cpu"
    return d


class CudaOnCpu(TorchFunctionMode):
    """Tensors and modules asked for on "cuda" are made (or moved) on the CPU; pinned host
    memory (which needs the CUDA driver) is made as plain memory."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.device:  # device objects stay "cuda": the code's branches read them
            return func(*args, **(kwargs or {}))
        kwargs = {k: _cpu(v) if k == "device" else v for k, v in (kwargs or {}).items() if k != "pin_memory"}
        return func(*(_cpu(a) for a in args), **kwargs)


class FakeParam:
    def __init__(self, dtype=torch.float16, device=CUDA):
        self.device, self.dtype, self.is_cuda, self.requires_grad = device, dtype, True, False


class OnCuda(nn.Module):
    """A module that reports its parameters on CUDA (what the code reads the device from)."""

    def __init__(self, inner: nn.Module, dtype=torch.float16):
        super().__init__()
        self.inner, self._dtype = inner, dtype
        self.config = getattr(inner, "config", None)
        self.cfg = getattr(inner, "cfg", None)

    def parameters(self, recurse: bool = True):
        yield FakeParam(self._dtype)

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def encode(self, *args, **kwargs):
        return self.inner.encode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.inner.decode(*args, **kwargs)
