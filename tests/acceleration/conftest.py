"""The fake-GPU fixtures of this folder's tests (tests/acceleration/gpu_fakes.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from gpu_fakes import GPU_NAME, CudaOnCpu, FakeEvent


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda as on a one-GPU machine (the functions the package calls)."""
    calls = SimpleNamespace(sync=0, names=[], stream_sync=0)

    class FakeStream:
        def synchronize(self):
            calls.stream_sync += 1

    def get_device_name(device=None):
        calls.names.append(device)
        return GPU_NAME

    def synchronize(device=None):
        calls.sync += 1

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", get_device_name)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    return calls


@pytest.fixture
def cuda_on_cpu():
    with CudaOnCpu():
        yield
