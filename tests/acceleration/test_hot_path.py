"""The image pipeline's hot path has one host-device sync per frame: the download of its output.

A sync stalls the CPU until the GPU's queue drains, so each extra one per frame costs the
whole pipeline's overlap. On a GPU `torch.cuda.set_sync_debug_mode("error")` would catch
them; here every call that can sync (`.item()`, `.cpu()`, `.tolist()`, `bool()`/`float()`/`int()`
of a tensor, `torch.cuda.synchronize`, a stream's or an event's `synchronize`) is counted
over one steady-state frame, on the CPU and on a faked GPU (the GPU branches: pinned staging
buffers, non-blocking copies, noise drawn on the device, channels_last)."""

from __future__ import annotations

import collections
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import CountSyncs
from gpu_fakes import CUDA, CudaOnCpu, OnCuda

from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

SIZE = 64


def frames(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for _ in range(n)]


def steady_frame_syncs(pipe, mode: str = "img2img") -> collections.Counter:
    inputs = frames(5) if mode == "img2img" else [None] * 5
    for frame in inputs[:4]:  # primed and past the first outputs
        pipe(frame)
    with CountSyncs() as counter:
        pipe(inputs[4])
    return counter.counts


@pytest.mark.parametrize("cfg", ["none", "self", "initialize", "full"])
@pytest.mark.parametrize("mode", ["img2img", "txt2img"])
def test_one_sync_per_frame_on_the_cpu(comps, cfg, mode):
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2, cfg_type=cfg,
                                                        guidance_scale=1.5, mode=mode), prompt="a cat")
    assert steady_frame_syncs(pipe, mode) == {"numpy": 1}  # the output's download, nothing else


def test_the_similarity_filter_reads_one_number(comps):
    """With the filter on, a frame also waits for its similarity (the decision to skip the
    network needs it on the host); nothing more."""
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2, similarity_filter=True,
                                                        similarity_threshold=0.5), prompt="a cat")
    counts = steady_frame_syncs(pipe)
    assert counts["float"] == 1 and counts["numpy"] <= 1 and sum(counts.values()) <= 2, counts


# ------------------------------------------------------------------ the GPU branches
class PinnedOnCpu(CudaOnCpu):
    """CudaOnCpu (pinned host memory made as plain memory), counting the pinned requests."""

    def __init__(self):
        super().__init__()
        self.pinned = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs and kwargs.get("pin_memory", False):
            self.pinned += 1
        return super().__torch_function__(func, types, args, kwargs)


@pytest.fixture
def fake_streams(fake_gpu, monkeypatch):  # noqa: F811 (the imported fixture)
    """torch.cuda streams and device generators as on a GPU; counts stream synchronizations."""
    waits = SimpleNamespace(stream=0, devices=[])

    class FakeStream:
        def synchronize(self):
            waits.stream += 1

    def current_stream(device=None):
        waits.devices.append(device)
        return FakeStream()

    real_generator = torch.Generator

    def generator(device="cpu"):
        assert torch.device(device).type in ("cpu", "cuda")
        return real_generator("cpu")

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch, "Generator", generator)
    return waits


def gpu_components(comps):
    """The tiny model's components as if on the GPU (their parameters report cuda)."""
    return dataclasses.replace(comps, unet=OnCuda(comps.unet, torch.float32), vae=OnCuda(comps.vae, torch.float32))


@pytest.mark.parametrize("mode", ["img2img", "txt2img"])
def test_one_sync_per_frame_on_a_gpu(comps, fake_gpu, fake_streams, mode):  # noqa: F811
    gcomps = gpu_components(comps)
    with PinnedOnCpu() as place:
        pipe = StreamDiffusion(gcomps, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2, mode=mode,
                                                             cfg_type="self", guidance_scale=1.5), prompt="a cat")
        assert pipe.device == CUDA
        inputs = frames(5) if mode == "img2img" else [None] * 5
        for frame in inputs[:4]:
            pipe(frame)
        before, pinned_before = fake_streams.stream, place.pinned
        with CountSyncs() as counter:
            out = pipe(inputs[4])
    assert out.shape == (SIZE, SIZE, 3) and out.dtype == np.uint8
    assert fake_streams.stream - before == 1  # the output's download: the frame's one wait
    assert fake_gpu.sync == 0  # never a device-wide torch.cuda.synchronize
    assert counter.counts == {"numpy": 1}, counter.counts  # .numpy() of the pinned host copy: no wait
    assert pinned_before == (2 if mode == "img2img" else 1)  # staging up (img2img) and down, pinned
    assert place.pinned == pinned_before  # made once, then reused
    assert fake_streams.devices[-1] == CUDA


def test_gpu_components_are_channels_last_with_cudnn_benchmark(monkeypatch):
    from streamstudio.models.image.components import tune_for_device
    from streamstudio.models.image.loading import load_components

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    comps = load_components("tiny", device="cpu", dtype=torch.float32)
    tune_for_device(comps, torch.device("cpu"))
    assert torch.backends.cudnn.benchmark is False
    tune_for_device(comps, CUDA)
    assert torch.backends.cudnn.benchmark is True
    convs = [m for module in (comps.unet, comps.vae) for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs
                         if c.weight.shape[-1] > 1 or c.weight.shape[-2] > 1)
    x = torch.randn(1, comps.unet.config.in_channels, 8, 8)  # still runs, NCHW in
    text = torch.randn(1, 77, comps.unet.config.cross_attention_dim)
    assert comps.unet(x, torch.tensor([10]), encoder_hidden_states=text).sample.shape == x.shape
