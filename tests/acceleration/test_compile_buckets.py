"""torch.compile with cross-stream batching: calls padded to buckets (1, 2, 4, 8, 16), contiguous
text embeddings, and every bucket warmed up at start-up, so that no compilation happens while
streams come and go. A counting backend (it returns the eager forward: no inductor build) with
dynamic=False stands in for inductor: each new input shape or stride would compile again."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput
from helpers import run_in_lockstep
from torch import nn

from streamstudio.models.image.batching import BatchExecutor, BatchingConfig, batched_components, warm_up
from streamstudio.models.image import acceleration


class CountingBackend:
    """A torch.compile backend that counts the graphs it is given and runs them eagerly."""

    def __init__(self):
        self.graphs = 0
        self.lock = threading.Lock()

    def __call__(self, gm, example_inputs):
        with self.lock:
            self.graphs += 1
        return gm.forward


class SmallUNet(nn.Module):
    """A stand-in UNet that dynamo traces in a blink (the tiny diffusers UNet takes ~2.5 s per
    shape): a convolution, the timestep and the mean text embedding, row by row."""

    def __init__(self, text_dim: int):
        super().__init__()
        torch.manual_seed(0)
        self.config = SimpleNamespace(in_channels=4, cross_attention_dim=text_dim)
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.text = nn.Linear(text_dim, 4)

    def forward(self, sample, timestep, encoder_hidden_states=None, return_dict: bool = True):
        b = sample.shape[0]  # (B, 4, h, w)
        cond = self.text(encoder_hidden_states.mean(1)) + timestep.reshape(b, 1).float() / 1000  # (B, 4)
        out = 0.1 * self.conv(sample) + 0.01 * cond[:, :, None, None]  # (B, 4, h, w)
        return UNet2DConditionOutput(sample=out) if return_dict else (out,)


def _frames(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(n)]


def _stream(comps, seed: int, cfg: str = "self"):
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    config = StreamDiffusionConfig(width=64, height=64, steps=2, strength=0.6, cfg_type=cfg, guidance_scale=1.3,
                                   seed=seed)
    return StreamDiffusion(comps, config, prompt=f"prompt {seed}")


def _run_streams(executor, streams, frames_each: int) -> list[list[np.ndarray]]:
    """Each stream on its own thread, frames in step (their calls meet in the executor)."""
    return run_in_lockstep(executor, streams, [_frames(100 + i, frames_each) for i in range(len(streams))],
                           timeout=300)


def _compiled_shared(tiny_components_factory, pad: bool | None, small_unet: bool = False, max_rows: int = 16):
    torch._dynamo.reset()
    backend = CountingBackend()
    comps = tiny_components_factory(taesd=True)
    if small_unet:
        comps = replace(comps, unet=SmallUNet(comps.unet.config.cross_attention_dim))
    fast = acceleration.apply_acceleration(comps, "compile", compile_options={"backend": backend, "dynamic": False})
    executor = BatchExecutor(BatchingConfig(max_rows=max_rows, max_wait_ms=300, pad_to_buckets=pad))
    return comps, backend, executor, batched_components(fast, executor)


@pytest.mark.parametrize("small_unet", [
    True,  # the default run: a stand-in UNet, the real TAESD (whose encode and decode share a decorator)
    pytest.param(False, marks=pytest.mark.slow),  # the tiny diffusers UNet: ~20 s of dynamo tracing
])
def test_no_compilation_while_the_number_of_streams_changes(tiny_components_factory, small_unet):
    comps, backend, executor, shared = _compiled_shared(tiny_components_factory, pad=None, small_unet=small_unet,
                                                        max_rows=16 if not small_unet else 8)
    try:
        assert shared.net.pad  # compiled networks: padded to buckets by default
        warm_up(shared, 64, 64)  # start-up: every bucket of the UNet, the VAE encoder and decoder
        assert executor.stats.warmup_calls == 3 * len(executor.config.buckets)
        compiled = backend.graphs
        assert compiled > 0
        streams = [_stream(shared, seed, cfg) for seed, cfg in
                   enumerate(["self", "initialize", "full", "self"])]  # 2, 3, 4 and 2 UNet rows a frame
        for count in (1, 3, 2, 4):
            _run_streams(executor, streams[:count], frames_each=2)
            assert backend.graphs == compiled, f"{backend.graphs - compiled} compilation(s) with {count} stream(s)"
        assert executor.stats.batched_calls > 0 and executor.stats.padded_rows > 0
        assert executor.stats.sizes <= set(executor.config.buckets)
    finally:
        executor.close()


@pytest.mark.slow
def test_padded_compiled_streams_give_their_eager_frames(tiny_components_factory):
    """Pad rows are dropped: two compiled streams batched and padded give the frames each gives
    alone on the eager networks (the default run checks the same on eager networks in
    test_webapp_batching)."""
    comps, backend, executor, shared = _compiled_shared(tiny_components_factory, pad=True)
    try:
        alone = [[_stream(comps, seed, cfg)(f) for f in _frames(100 + i, 2)]
                 for i, (seed, cfg) in enumerate([(0, "self"), (1, "initialize")])]
        batched = _run_streams(executor, [_stream(shared, 0, "self"), _stream(shared, 1, "initialize")], 2)
        assert executor.stats.padded_rows > 0
        for want, got in zip(alone, batched):
            for a, b in zip(want, got):
                assert np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 2
    finally:
        executor.close()


@pytest.mark.slow
def test_without_buckets_a_new_stream_count_compiles_again(tiny_components_factory):
    """The control: unpadded, the same run compiles new graphs when the stream count changes
    (what the buckets prevent)."""
    comps, backend, executor, shared = _compiled_shared(tiny_components_factory, pad=False)
    try:
        streams = [_stream(shared, seed) for seed in range(4)]
        _run_streams(executor, streams[:1], frames_each=2)
        compiled = backend.graphs
        _run_streams(executor, streams[:3], frames_each=2)
        assert backend.graphs > compiled
    finally:
        executor.close()


def test_compiled_net_sees_contiguous_text_and_timesteps(monkeypatch):
    from streamstudio.models.image.image_net import DiffusersImageNet, ImageCond

    seen = []

    def fake_compile(fn, **kwargs):
        def run(*args):
            seen.append(args)
            return fn(*args)
        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    vae = SimpleNamespace(config=SimpleNamespace(scaling_factor=1.0))
    net = acceleration.CompiledImageNet(DiffusersImageNet(SmallUNet(32), vae))
    text = torch.randn(1, 77, 32)
    out = net.eps(torch.randn(3, 4, 8, 8), torch.tensor(999), ImageCond(text=text.expand(3, -1, -1)))
    layout, _, t, text_in = seen[0]
    assert layout == (("text", -1),) and out.shape == (3, 4, 8, 8)
    assert t.shape == (3,) and t.is_contiguous() and text_in.shape[0] == 3 and text_in.is_contiguous()
