"""Shared test set-up: offline hub, small thread count, `gpu` tests skipped without CUDA."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest
import torch

# The tests' tensors are tiny: one thread avoids OpenMP spin-waiting on a shared 2-core machine.
torch.set_num_threads(int(os.environ.get("STREAMSTUDIO_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_components_factory():
    """Fresh tiny-model components (identical weights each call)."""
    from streamstudio.models.image.loading import load_components

    def make(**kwargs):
        return load_components("tiny", device="cpu", dtype=torch.float32, **kwargs)

    return make


@pytest.fixture(scope="module")
def comps(tiny_components_factory):
    """The tiny model's components on the CPU in float32, one set per test module (a module's
    tests may change them: fuse a LoRA, wrap the networks). A file whose tests need their own set
    each takes `tiny_components_factory()` instead."""
    return tiny_components_factory()


@pytest.fixture
def nginx(tmp_path):
    """A real nginx-rtmp on 127.0.0.1 at a free port (tests/rtmp_server.py); skipped without it."""
    from rtmp_server import Nginx, find_module

    server = Nginx(tmp_path / "nginx", find_module())
    server.start()
    yield server
    server.stop()
