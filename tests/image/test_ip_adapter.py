"""IP-Adapter (models/image/ip_adapter.py) with a tiny image encoder and projection written by the test in
h94/IP-Adapter's file layout, loaded through diffusers' loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from addon_models import EMBED_DIM, reference_image, write_tiny_ip_adapter

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.image.ip_adapter import IPAdapter, IPAdapterSpec, locate, parse_ip_adapter



def unet_out(unet, embeds=None, rows=2):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, 4, 8, 8, generator=g)
    text = torch.randn(rows, 7, 32, generator=g)
    added = None if embeds is None else {"image_embeds": [embeds.expand(rows, -1, -1)]}
    with torch.no_grad():
        return unet(x, torch.tensor([800, 200][:rows]), encoder_hidden_states=text, added_cond_kwargs=added).sample


@pytest.fixture
def comps(tiny_components_factory):
    return tiny_components_factory()


def test_parse_and_locate(tmp_path):
    assert parse_ip_adapter("h94/IP-Adapter:0.6") == IPAdapterSpec("h94/IP-Adapter", 0.6)
    assert locate("h94/IP-Adapter", False) == ("h94/IP-Adapter", "models", "ip-adapter_sd15.safetensors")
    assert locate("h94/IP-Adapter", True) == ("h94/IP-Adapter", "sdxl_models", "ip-adapter_sdxl.safetensors")
    assert locate("h94/IP-Adapter/models/ip-adapter-plus_sd15.safetensors", False) == \
        ("h94/IP-Adapter", "models", "ip-adapter-plus_sd15.safetensors")
    (tmp_path / "a.bin").write_bytes(b"0")
    with pytest.raises(StreamStudioError, match="not a .safetensors"):
        locate(str(tmp_path / "a.bin"), False)


def test_scale_zero_is_the_plain_unet_and_removal_restores_it(comps, tmp_path):
    path = write_tiny_ip_adapter(comps.unet, tmp_path / "ip")
    base = unet_out(comps.unet)
    ip = IPAdapter(comps, f"{path}:0")
    embeds = ip.set_reference(reference_image())
    assert embeds.shape == (1, 1, EMBED_DIM)
    torch.testing.assert_close(unet_out(comps.unet, embeds), base, rtol=0, atol=1e-6)
    ip.set_scale(1.0)
    assert (unet_out(comps.unet, embeds) - base).abs().max() > 1e-3
    assert (unet_out(comps.unet, embeds)
            - unet_out(comps.unet, ip.set_reference(reference_image(1)))).abs().max() > 1e-4
    ip.remove()
    assert torch.equal(unet_out(comps.unet), base)


def test_embedding_once_per_reference_and_equal_to_diffusers(comps, tmp_path):
    path = write_tiny_ip_adapter(comps.unet, tmp_path / "ip")
    ip = IPAdapter(comps, str(path))
    image = reference_image()
    first = ip.set_reference(image)
    assert ip.set_reference(image.clone()) is first and ip.encodes == 1  # same picture: no new encoding
    ip.set_reference(reference_image(1))
    assert ip.encodes == 2
    # diffusers' own preprocessing (CLIPImageProcessor) and encoder call on the same picture
    pil = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    ours = ip.set_reference(torch.from_numpy(pil).permute(2, 0, 1).float() / 255)
    theirs, _ = ip._pipe.encode_image(pil, torch.device("cpu"), 1)
    torch.testing.assert_close(ours[0], theirs, atol=1e-5, rtol=1e-4)


def clip_processor(size):
    """transformers' CLIPImageProcessor with CLIP's settings (openai/clip-vit-large-patch14's
    preprocessor_config.json, at `size`), offline. Its PIL backend: transformers 5's
    CLIPImageProcessorPil, what CLIPImageProcessor is without torchvision; transformers 4's
    CLIPImageProcessor itself."""
    import transformers
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    return cls(do_resize=True, size={"shortest_edge": size}, resample=3, do_center_crop=True,
               crop_size={"height": size, "width": size}, do_rescale=True, rescale_factor=1 / 255,
               do_normalize=True, image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD, do_convert_rgb=True)


def picture(h, w, seed=0):
    """uint8 RGB (h, w, 3): gradients, a bright bar, a dark line and noise (a resize shows on it)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    g = np.stack([xx * 255 / (w - 1), yy * 255 / (h - 1), (xx + yy) * 127 / (h + w)], -1)
    g[:, w // 3:w // 3 + 3] = 255
    g[h // 2] = 0
    return np.clip(np.round(g + rng.normal(0, 12, g.shape)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("h,w", [(180, 300), (300, 180), (230, 500), (61, 97), (224, 224), (224, 300)])
def test_clip_pixels_equal_clip_image_processor(h, w):
    """Our CLIP preprocessing equals transformers' CLIPImageProcessor on a picture (its PIL
    bicubic on uint8, the long side truncated, centre crop, CLIP's mean and std): shrinking,
    enlarging, both orientations, a long side where truncating and rounding differ (230x500 ->
    224x486), and pictures needing no resize. torch's bicubic on floats was up to 19/255 off
    (and a pixel's shift where it rounded the long side)."""
    from PIL import Image

    from streamstudio.models.image.ip_adapter import clip_pixels

    image = picture(h, w)
    want = clip_processor(224)(Image.fromarray(image), return_tensors="pt").pixel_values  # (1, 3, 224, 224)
    ours = clip_pixels(torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255, 224)
    assert ours.shape == want.shape == (1, 3, 224, 224)
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-6)
    two = clip_pixels(torch.from_numpy(np.stack([image, picture(h, w, 1)])).permute(0, 3, 1, 2).float() / 255, 224)
    torch.testing.assert_close(two[:1], want, rtol=0, atol=1e-6)  # a batch: each picture its own


def test_embedding_of_a_picture_needing_a_resize_equals_diffusers(comps, tmp_path):
    """IPAdapter.embed on a reference that CLIP's preprocessing resizes (70x45 for the tiny
    encoder's 32) equals diffusers' encode_image (its CLIPImageProcessor, then the encoder)."""
    path = write_tiny_ip_adapter(comps.unet, tmp_path / "ip")
    ip = IPAdapter(comps, str(path))
    if getattr(ip._pipe.feature_extractor, "backend", "pil") != "pil":  # transformers 5 with torchvision
        ip._pipe.feature_extractor = clip_processor(ip.image_encoder.config.image_size)
    image = picture(45, 70)
    ours = ip.set_reference(torch.from_numpy(image).permute(2, 0, 1).float() / 255)
    theirs, _ = ip._pipe.encode_image(image, torch.device("cpu"), 1)
    torch.testing.assert_close(ours[0], theirs, atol=1e-6, rtol=1e-5)


def test_missing_adapter_is_a_clear_error(comps, tmp_path):
    with pytest.raises(ModelNotFoundError, match="hf download h94/IP-Adapter"):
        IPAdapter(comps, "h94/IP-Adapter", local_files_only=True)


def test_ip_adapter_in_the_stream(comps, tmp_path):
    """Through the stream pipeline: scale 0 is the stream without the adapter, the reference is
    encoded once however many frames run, a reference changes the output at scale 1."""
    import dataclasses

    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    frames = [np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8) for i in range(4)]

    def run(pipe):
        outs = [o for f in frames for o in pipe.push(f)]
        return outs + pipe.flush()

    config = StreamDiffusionConfig(width=32, height=32, steps=2, strength=0.7, cfg_type="full", guidance_scale=1.5)
    plain = run(StreamDiffusion(comps, config, prompt="a fox"))
    path = write_tiny_ip_adapter(comps.unet, tmp_path / "ip")
    with_ip = dataclasses.replace(comps, ip_adapter=IPAdapter(comps, f"{path}:0"))
    pipe = StreamDiffusion(with_ip, config, prompt="a fox")
    pipe.addons.set_reference((reference_image().permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    zero = run(pipe)
    assert with_ip.ip_adapter.encodes == 1  # once per reference, not per frame
    assert all(np.abs(a.astype(int) - b.astype(int)).max() <= 1 for a, b in zip(plain, zero))
    pipe.addons.set_ip_adapter_scale(1.0)
    assert any(np.abs(a.astype(int) - b.astype(int)).max() > 1 for a, b in zip(plain, run(pipe)))
    with pytest.raises(StreamStudioError, match="no IP-Adapter"):
        StreamDiffusion(comps, config).addons.set_reference(frames[0])


def test_generate_with_ip_adapter_flags(comps, tmp_path, capsys):
    from PIL import Image

    from streamstudio.app.cli import main

    path = write_tiny_ip_adapter(comps.unet, tmp_path / "ip")
    Image.fromarray((reference_image().permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(tmp_path / "ref.png")
    common = ["generate", "--model", "tiny", "--prompt", "a fox", "--width", "32", "--height", "32",
              "--num-images", "1"]
    assert main([*common, "--output", str(tmp_path / "a"), "--ip-adapter", str(path), "--ip-image",
                 str(tmp_path / "ref.png")]) == 0
    assert "IP-Adapter: " in capsys.readouterr().out and len(list((tmp_path / "a").glob("*.png"))) == 1
    assert main([*common, "--output", str(tmp_path / "b"), "--ip-adapter", str(path)]) == 1
    assert "--ip-image" in capsys.readouterr().err


def test_ip_adapter_on_sdxl(tmp_path):
    """SDXL: the adapter installs in the SDXL UNet (its image embedding joins the pooled text and
    time ids in the added conditioning); scale 0 is the stream without it."""
    import dataclasses

    from streamstudio.models.image.loading import load_components
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    xl = load_components("tiny-sdxl")
    frames = [np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8) for i in range(3)]
    config = StreamDiffusionConfig(width=32, height=32, steps=2, strength=0.7)

    def run(pipe):
        return [o for f in frames for o in pipe.push(f)] + pipe.flush()

    plain = run(StreamDiffusion(xl, config, prompt="a fox"))
    ip = IPAdapter(xl, f"{write_tiny_ip_adapter(xl.unet, tmp_path / 'ip')}:0")
    pipe = StreamDiffusion(dataclasses.replace(xl, ip_adapter=ip), config, prompt="a fox")
    pipe.addons.set_reference(reference_image())
    assert all(np.abs(a.astype(int) - b.astype(int)).max() <= 1 for a, b in zip(plain, run(pipe)))
    pipe.update(ip_adapter_scale=1.0)
    assert any(np.abs(a.astype(int) - b.astype(int)).max() > 1 for a, b in zip(plain, run(pipe)))


# ---------------------------------------------------------------------------- per-row scales
def _unet_rows(unet, embeds, scales=None, rows=3):
    """The tiny UNet over `rows` rows of fixed inputs, each row with its own reference embedding;
    scales (rows, 1): the per-row path; None: diffusers' processors at their own uniform scale."""
    g = torch.Generator().manual_seed(5)
    x, text = torch.randn(rows, 4, 8, 8, generator=g), torch.randn(rows, 7, 32, generator=g)
    image_embeds = [embeds] + ([] if scales is None else [scales])
    with torch.no_grad():
        return unet(x, torch.tensor([900, 500, 100][:rows]), encoder_hidden_states=text,
                    added_cond_kwargs={"image_embeds": image_embeds}).sample


def test_per_row_scales_equal_diffusers_processor_at_each_rows_uniform_scale(comps, tmp_path):
    """Rows of different scales and references in one call: each row is what diffusers' own
    IPAdapterAttnProcessor2_0 gives it at that scale for the whole call (bit for bit), and a row
    at scale 0 is the plain UNet's."""
    from diffusers.models.attention_processor import IPAdapterAttnProcessor2_0

    from streamstudio.models.image.ip_adapter import row_scaled_processor_class

    ip = IPAdapter(comps, f"{write_tiny_ip_adapter(comps.unet, tmp_path / 'ip')}:1")
    processors = [p for p in comps.unet.attn_processors.values() if hasattr(p, "to_k_ip")]
    assert processors and all(isinstance(p, IPAdapterAttnProcessor2_0) and isinstance(p, row_scaled_processor_class())
                              for p in processors)
    embeds = torch.cat([ip.embed(reference_image(i)) for i in range(3)])  # (3, 1, D): three references
    scales = [0.6, 1.7, 0.0]
    mixed = _unet_rows(comps.unet, embeds, torch.tensor(scales)[:, None])
    for row, scale in enumerate(scales):
        ip.set_scale(scale)  # diffusers' processors at one scale for every row (their own code path)
        assert torch.equal(mixed[row], _unet_rows(comps.unet, embeds)[row]), f"row {row} at scale {scale}"
    # a row at scale 0 is the UNet without the adapter (diffusers skips the image attention there)
    torch.testing.assert_close(mixed[2], _plain_rows(comps)[2], rtol=0, atol=1e-6)
    assert (mixed[0] - mixed[2]).abs().max() > 1e-3 and (mixed[1] - mixed[2]).abs().max() > 1e-3


def _plain_rows(comps):
    """_unet_rows' inputs through the same UNet with the adapter taken out."""
    ip = comps.unet.attn_processors
    from diffusers.models.attention_processor import AttnProcessor2_0

    saved_procs, saved_proj = dict(ip), comps.unet.encoder_hid_proj
    saved_type = comps.unet.config.encoder_hid_dim_type
    try:
        comps.unet.set_attn_processor({k: AttnProcessor2_0() for k in saved_procs})
        comps.unet.encoder_hid_proj = None
        comps.unet.config.encoder_hid_dim_type = None
        g = torch.Generator().manual_seed(5)
        x, text = torch.randn(3, 4, 8, 8, generator=g), torch.randn(3, 7, 32, generator=g)
        with torch.no_grad():
            return comps.unet(x, torch.tensor([900, 500, 100]), encoder_hidden_states=text).sample
    finally:
        comps.unet.set_attn_processor(saved_procs)
        comps.unet.encoder_hid_proj = saved_proj
        comps.unet.config.encoder_hid_dim_type = saved_type


def test_streams_with_their_own_scales_and_references_batched_together_equal_alone(comps, tmp_path):
    """Two streams on one model with different IP-Adapter scales and references run their UNet
    calls together through the cross-stream executor; each gets the frames it gets alone; a
    stream's scale and reference leave the other's and the model's defaults as they were."""
    from helpers import run_in_lockstep

    from streamstudio.models.image.batching import BatchExecutor, BatchingConfig, ClientStats, batched_components
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    import dataclasses

    config = StreamDiffusionConfig(width=32, height=32, steps=2, strength=0.7, cfg_type="self", guidance_scale=1.4)
    frames = [[np.random.default_rng(10 * s + i).integers(0, 256, (32, 32, 3), dtype=np.uint8) for i in range(4)]
              for s in range(2)]
    plain_stream = StreamDiffusion(comps, config, prompt="a fox")  # before the adapter is in
    plain = [plain_stream(f) for f in frames[0]]
    ip = IPAdapter(comps, f"{write_tiny_ip_adapter(comps.unet, tmp_path / 'ip')}:0.5")
    model = dataclasses.replace(comps, ip_adapter=ip)
    specs = [(0.0, reference_image(0)), (1.5, reference_image(1))]

    def stream(comps_, scale, reference):
        pipe = StreamDiffusion(comps_, config, prompt="a fox")
        pipe.addons.set_ip_adapter_scale(scale)
        pipe.addons.set_reference(reference)
        return pipe

    solo = [stream(model, *spec) for spec in specs]
    alone = [[solo[i](f) for f in frames[i]] for i in range(2)]
    executor = BatchExecutor(BatchingConfig(max_wait_ms=500))
    try:
        shared = batched_components(model, executor)
        streams = [stream(shared, *spec) for spec in specs]
        # the model's default kept
        assert ip.scale == 0.5 and [s.addons.ip_adapter_scale for s in streams] == [0.0, 1.5]
        counts = [ClientStats(), ClientStats()]
        got = run_in_lockstep(executor, streams, frames, stats=counts)
        assert all(c.shared > 0 for c in counts), counts  # their UNet calls were joined
        for want, have in zip(alone, got):
            assert len(have) == len(want)
            for a, b in zip(want, have):
                assert np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 1
        # scale 0: the stream without the adapter; scale 1.5 with another reference: not
        assert all(np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 1 for a, b in zip(plain, got[0]))
        check = stream(model, 1.5, reference_image(0))  # stream 1's scale with stream 0's reference: not stream 1
        assert max(np.abs(check(f).astype(np.int16) - b.astype(np.int16)).max() for f, b in zip(frames[1], got[1])) > 2
    finally:
        executor.close()


@pytest.mark.slow
def test_compiled_unet_takes_per_row_scales_without_recompiling(comps, tmp_path):
    """--acceleration compile: the per-row scales and references are inputs of the compiled graph:
    other scales give the eager outputs and compile nothing new (~80 s on a CPU, cold cache)."""
    import time

    from streamstudio.models.image.acceleration import CompiledImageNet
    from streamstudio.models.image.image_net import ImageCond

    ip = IPAdapter(comps, f"{write_tiny_ip_adapter(comps.unet, tmp_path / 'ip')}:1")
    embeds = torch.cat([ip.embed(reference_image(0)), ip.embed(reference_image(1))])
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 77, 32, generator=g)
    t = torch.tensor([700.0, 300.0])
    compiled = CompiledImageNet(comps.net)
    with torch.inference_mode():
        for i, scales in enumerate(([[0.0], [1.5]], [[0.7], [0.2]])):
            cond = ImageCond(text=text, image_embeds=embeds, ip_scale=torch.tensor(scales))
            start = time.monotonic()
            got = compiled.eps(x, t, cond)
            if i:
                assert time.monotonic() - start < 5.0  # no new compilation for new scales
            torch.testing.assert_close(got, comps.net.eps(x, t, cond), rtol=1e-4, atol=1e-5)
