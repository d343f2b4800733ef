"""Export specs of the project's networks (models/image/export_specs.py, models/video/video_engine.py):
ONNX exports of the tiny image seam's calls and the video network checked against onnxruntime,
and the engine wrappers fed by stand-in engines that run the spec's own module."""

from __future__ import annotations

import pytest
import torch
from helpers import SpecEngine

from streamstudio.kernels.tensorrt.export import check_onnx, export_onnx
from streamstudio.models.image.export_specs import EngineImageNet, eps_spec, vae_decoder_spec, vae_encoder_spec
from streamstudio.models.image.image_net import DiffusersImageNet, ImageCond
from streamstudio.models.video.video_engine import VideoEngine, video_export_spec

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

# export at batch 2, 64x64 pixels; check at another batch and size (the dynamic axes)
EXPORT = dict(batch=2, height=64, width=64)
CHECK = dict(batch=1, height=96, width=128)


@pytest.fixture(scope="module")
def taesd():
    """The image seam over the tiny UNet and a tiny TAESD."""
    from streamstudio.models.image import tiny

    parts = tiny.tiny_components(taesd=True)
    return DiffusersImageNet(parts["unet"], parts["taesd"])


def _export_and_check(spec, tmp_path):
    path = export_onnx(spec, tmp_path / spec.name / "model.onnx", **EXPORT)
    import onnx

    model = onnx.load(str(path))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 18
    result = check_onnx(spec, path, **CHECK)
    assert result.rel_error < 1e-3, f"{spec.name}: onnxruntime differs from torch by {result.rel_error:.2e}"
    return result


def test_unet_onnx_matches_onnxruntime(comps, tmp_path):
    result = _export_and_check(eps_spec(comps.net), tmp_path)
    assert result.shapes["sample"] == (1, 4, 12, 16)


@pytest.mark.parametrize("part", ["vae_encoder", "vae_decoder"])
def test_vae_onnx_matches_onnxruntime(comps, part, tmp_path):
    make = vae_encoder_spec if part == "vae_encoder" else vae_decoder_spec
    _export_and_check(make(comps.net), tmp_path)


@pytest.mark.parametrize("part", ["vae_encoder", "vae_decoder"])
def test_taesd_onnx_matches_onnxruntime(taesd, part, tmp_path):
    make = vae_encoder_spec if part == "vae_encoder" else vae_decoder_spec
    _export_and_check(make(taesd), tmp_path)


def test_video_model_onnx_matches_onnxruntime(tmp_path):
    from streamstudio.models.video.stream_dit import StreamDiT, named_config

    torch.manual_seed(0)
    model = StreamDiT(named_config("tiny")).eval()
    for p in model.parameters():  # the zero-initialized output layers would make the check trivial
        p.data.add_(torch.randn_like(p) * 0.02)
    spec, (h, w) = video_export_spec(model, frames=4, height=32, width=32)
    path = export_onnx(spec, tmp_path / "video.onnx", batch=1, height=h, width=w)
    result = check_onnx(spec, path, batch=2, height=h, width=w)
    assert result.rel_error < 1e-3


# ------------------------------------------------------------------------------ engine wrappers (CPU)
def test_engine_net_drops_into_the_pipeline(tiny_components_factory):
    import dataclasses

    import numpy as np

    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    comps = tiny_components_factory(taesd=True)
    unet_engine = SpecEngine(eps_spec(comps.net))
    enc, dec = SpecEngine(vae_encoder_spec(comps.net)), SpecEngine(vae_decoder_spec(comps.net))
    wrapped = dataclasses.replace(comps, network=EngineImageNet(comps.net, unet_engine, enc, dec))
    config = StreamDiffusionConfig(width=64, height=64, steps=2, cfg_type="initialize", guidance_scale=1.3)
    frames = [np.random.default_rng(i).integers(0, 256, (64, 64, 3), dtype=np.uint8) for i in range(3)]

    def run(c):
        stream = StreamDiffusion(c, config, prompt="a red ball")
        return [f for frame in frames for f in stream.push(frame)] + stream.flush()

    want, got = run(comps), run(wrapped)
    assert unet_engine.calls > 0 and enc.calls == len(frames) and dec.calls == len(frames)
    assert len(got) == len(want) == len(frames)
    for a, b in zip(got, want):
        assert np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 1
    with torch.no_grad():  # one timestep and one condition row serve every row
        out = wrapped.net.eps(torch.zeros(2, 4, 8, 8), 999, ImageCond(text=torch.zeros(1, 77, 32)))
    assert out.shape == (2, 4, 8, 8) and unet_engine.shapes[-1]["timestep"] == (2,)
    torch_only = EngineImageNet(comps.net)  # missing engines fall back to the torch path
    z = torch.randn(1, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch_only.decode(z), comps.net.decode(z))


def test_video_engine_pads_text_tokens():
    from streamstudio.models.video.stream_dit import StreamDiT, named_config

    torch.manual_seed(0)
    model = StreamDiT(named_config("tiny")).eval()
    for p in model.parameters():
        p.data.add_(torch.randn_like(p) * 0.02)
    spec, _ = video_export_spec(model, frames=4, height=32, width=32)
    text_len = model.cfg.text.max_tokens + 1
    engine = VideoEngine(SpecEngine(spec), model, text_len)
    with torch.no_grad():
        text = engine.encode_text(["a red ball moving left"])
        assert text.tokens.shape[1] < text_len
        x, t = torch.randn(1, 4, 3, 32, 32), torch.rand(1, 4)
        torch.testing.assert_close(engine(x, t, text), model(x, t, text), rtol=1e-4, atol=1e-5)
