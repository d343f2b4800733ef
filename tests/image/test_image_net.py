"""The image seam (models/image/image_net.py): the condition's row-wise handling, the diffusers
adapter against diffusers' own calls, and every variant (compiled, TensorRT engine, batched
across streams) reaching the network through the same three calls."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
from helpers import SpecEngine

from streamstudio.models.image.batching import BatchedImageNet, BatchExecutor, BatchingConfig
from streamstudio.errors import StreamStudioError
from streamstudio.models.image import acceleration
from streamstudio.models.image.export_specs import EngineImageNet, eps_spec, vae_decoder_spec, vae_encoder_spec
from streamstudio.models.image.image_net import DiffusersImageNet, ImageCond, ImageNet


def _wide(rows: int, seed: int = 0) -> ImageCond:
    """A condition with a field of each kind: tensors, and a tuple of them (ControlNet images)."""
    gen = torch.Generator().manual_seed(seed)
    return ImageCond(text=torch.randn(rows, 5, 8, generator=gen), text_embeds=torch.randn(rows, 3, generator=gen),
                     control=(torch.rand(rows, 3, 8, 8, generator=gen), torch.rand(rows, 3, 8, 8, generator=gen)))


def test_condition_fields_are_joined_sliced_and_broadcast_row_by_row():
    a, b = _wide(2, seed=1), _wide(3, seed=2)
    layout, tensors = a.flatten()
    assert layout == (("text", -1), ("text_embeds", -1), ("control", 2)) and len(tensors) == 4
    joined = ImageCond.cat([a, b])
    assert joined.rows == 5
    back = joined[2:5]  # the second condition's rows, every field
    for got, want in zip(back.flatten()[1], b.flatten()[1]):
        assert torch.equal(got, want)
    one = _wide(1)
    wide = one.expand(4)
    assert wide.control[1].shape == (4, 3, 8, 8) and torch.equal(wide.text_embeds[3], one.text_embeds[0])
    assert ImageCond(text=torch.zeros(1, 5, 8)).flatten()[0] == (("text", -1),)  # unset fields are left out
    with pytest.raises(StreamStudioError, match="different fields"):
        ImageCond.cat([a, ImageCond(text=a.text)])
    with pytest.raises(StreamStudioError, match="cannot serve"):
        a.expand(3)


class FakeNet(ImageNet):
    """A network computed from its inputs by hand, recording (call, shapes) of each call."""

    def __init__(self):
        self.calls = []

    @property
    def eager(self):
        return self

    device, dtype, latent_channels, latent_scale = torch.device("cpu"), torch.float32, 4, 8

    def eps(self, x, t, cond, bank=None):  # (B, 4, h, w), (B,), B rows
        self.calls.append(("eps", tuple(x.shape), tuple(t.shape), cond.rows))
        return x * 0.5 + t.view(-1, 1, 1, 1) / 1000 + cond.text.mean((1, 2)).view(-1, 1, 1, 1)

    def encode(self, images):
        self.calls.append(("encode", tuple(images.shape)))
        return images[:, :1].repeat(1, 4, 1, 1)[:, :, ::8, ::8] * 2

    def decode(self, latents):
        self.calls.append(("decode", tuple(latents.shape)))
        return latents[:, :3].repeat_interleave(8, 2).repeat_interleave(8, 3) / 2


def _inputs(rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 4, 2, 2, generator=gen)
    t = torch.randint(0, 1000, (rows,), generator=gen)
    return x, t, ImageCond(text=torch.randn(rows, 5, 8, generator=gen))


def test_the_compiled_variant_calls_the_seam_with_contiguous_rows(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # the wrapper's plumbing, not dynamo
    inner = FakeNet()
    net = acceleration.CompiledImageNet(inner)
    x, t, cond = _inputs(3)
    text = cond.text[:1]
    got = net.eps(x, t[0], ImageCond(text=text.expand(3, -1, -1)))  # one timestep, an expanded view
    want = FakeNet().eps(x, t[0].expand(3), ImageCond(text=text.expand(3, -1, -1)))
    torch.testing.assert_close(got, want)
    assert inner.calls == [("eps", (3, 4, 2, 2), (3,), 3)]
    images = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(net.decode(net.encode(images)), FakeNet().decode(FakeNet().encode(images)))
    assert [c[0] for c in inner.calls[1:]] == ["encode", "decode"] and net.fixed_shapes


def test_the_batched_variant_joins_two_streams_into_one_seam_call():
    inner = FakeNet()
    executor = BatchExecutor(BatchingConfig(max_rows=8, max_wait_ms=500, pad_to_buckets=False))
    net = BatchedImageNet(inner, executor)
    inputs = [_inputs(2, seed=1), _inputs(3, seed=2)]
    results = [None, None]
    barrier = threading.Barrier(2)

    def stream(i):
        with executor.client():
            barrier.wait()
            results[i] = net.eps(*inputs[i])

    try:
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
    finally:
        executor.close()
    assert inner.calls == [("eps", (5, 4, 2, 2), (5,), 5)]  # one call over both streams' rows
    for (x, t, cond), got in zip(inputs, results):
        torch.testing.assert_close(got, FakeNet().eps(x, t, cond))


@pytest.fixture(scope="module")
def tiny():
    from streamstudio.models.image.loading import load_components

    return load_components("tiny", device="cpu", dtype=torch.float32, taesd=True)


def test_the_diffusers_adapter_is_diffusers_with_scaled_latents(tiny):
    net = DiffusersImageNet(tiny.unet, tiny.vae)
    scale = tiny.vae.config.scaling_factor
    gen = torch.Generator().manual_seed(3)
    images = torch.rand(2, 3, 64, 64, generator=gen) * 2 - 1
    x, text = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(1, 77, 32, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(net.encode(images), tiny.vae.encode(images).latents * scale)
        torch.testing.assert_close(net.decode(x), tiny.vae.decode(x / scale).sample)
        want = tiny.unet(x, torch.tensor([700, 700]), encoder_hidden_states=text.expand(2, -1, -1)).sample
        torch.testing.assert_close(net.eps(x, 700, ImageCond(text=text)), want)  # one timestep, one row: broadcast
    assert net.latent_scale == 8 and net.latent_channels == 4 and net.takes_bank


def test_the_engine_variant_feeds_its_engines_the_seams_inputs(tiny):
    eager = tiny.net
    unet, enc, dec = (SpecEngine(eps_spec(eager)), SpecEngine(vae_encoder_spec(eager)),
                      SpecEngine(vae_decoder_spec(eager)))
    net = EngineImageNet(eager, unet, enc, dec)
    gen = torch.Generator().manual_seed(4)
    x, text, images = (torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 77, 32, generator=gen),
                       torch.rand(1, 3, 64, 64))
    with torch.no_grad():
        torch.testing.assert_close(net.eps(x, 500, ImageCond(text=text)), eager.eps(x, 500, ImageCond(text=text)))
        torch.testing.assert_close(net.encode(images), eager.encode(images))
        torch.testing.assert_close(net.decode(x), eager.decode(x))
    assert [sorted(c) for c in unet.shapes] == [["sample", "text", "timestep"]] and unet.shapes[0]["timestep"] == (2,)
    assert [list(c) for c in enc.shapes] == [["images"]] and [list(c) for c in dec.shapes] == [["latents"]]
    assert not net.takes_bank and net.fixed_shapes
    with pytest.raises(StreamStudioError, match="feedback"):
        net.eps(x, 500, ImageCond(text=text), bank=[(0, object())])


def test_accelerated_components_keep_the_diffusers_modules_and_swap_the_seam(tiny, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    fast = acceleration.apply_acceleration(tiny, "compile")
    assert fast.unet is tiny.unet and fast.vae is tiny.vae
    assert isinstance(fast.net, acceleration.CompiledImageNet) and fast.net.eager.unet is tiny.unet
    assert isinstance(replace(fast, network=None).net, DiffusersImageNet)
