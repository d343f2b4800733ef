"""benchmarks/video_sampler_sweep.py: its variants are what docs/video.md says they are."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import video_sampler_sweep as sweep  # noqa: E402
from test_video_sampler import small_model  # noqa: E402

from streamstudio.models.video.video_net import StreamDiTBackbone  # noqa: E402


@pytest.fixture()
def inputs():
    model = small_model()
    torch.manual_seed(1)
    x = torch.randn(1, 4, 2, 8, 8, dtype=torch.float64)
    t = torch.tensor([[0.1, 0.3, 0.6, 0.9]], dtype=torch.float64)
    return model, x, t


def velocities(model, x, t, prompt="a red circle"):
    return model(x, t, model.encode_text([prompt])), model(x, t, model.encode_text([""]))


def test_plain_guidance_is_the_shipped_sampler(inputs):
    model, x, t = inputs
    variant = sweep.VariantBackbone(model, sweep.parse_spec("g:3"))
    shipped = StreamDiTBackbone(model, 3.0)
    with torch.no_grad():
        got = variant.velocity(x, t, variant.encode_text("a red circle"))
        want = shipped.velocity(x, t, shipped.encode_text("a red circle"))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_schedule_guides_noisy_frames_harder(inputs):
    """hi:5,lo:3,tau:0.4: frames at t = 0.1 and 0.3 get scale 5, the others 3 (CFG's formula)."""
    model, x, t = inputs
    variant = sweep.VariantBackbone(model, sweep.parse_spec("hi:5,lo:3,tau:0.4"))
    with torch.no_grad():
        got = variant.velocity(x, t, variant.encode_text("a red circle"))
        vc, vu = velocities(model, x, t)
    torch.testing.assert_close(got[:, :2], (vu + 5 * (vc - vu))[:, :2])
    torch.testing.assert_close(got[:, 2:], (vu + 3 * (vc - vu))[:, 2:])


def test_apg_drops_the_part_along_the_clean_frame(inputs):
    """Adaptive projected guidance: what it adds to v_text is orthogonal (per frame) to the
    predicted clean frame x + (1 - t) v_text, and it is CFG's term when that part is removed."""
    model, x, t = inputs
    variant = sweep.VariantBackbone(model, sweep.parse_spec("g:4,apg:1"))
    with torch.no_grad():
        got = variant.velocity(x, t, variant.encode_text("a red circle"))
        vc, vu = velocities(model, x, t)
    added = got - vc
    x0 = x + (1 - t)[..., None, None, None] * vc
    norm = torch.linalg.vector_norm
    cos = (added * x0).sum((2, 3, 4)) / (norm(added, dim=(2, 3, 4)) * norm(x0, dim=(2, 3, 4)))
    assert cos.abs().max() < 1e-9
    assert not torch.allclose(got, vu + 4 * (vc - vu))


def test_autoguidance_guides_against_the_weak_model(inputs):
    """The weak model reads the prompt through its own text encoder (a first draft gave it the
    strong model's text tokens)."""
    model, x, t = inputs
    weak = small_model(seed=5)
    with torch.no_grad():
        vc, vu = velocities(model, x, t)
        vw = weak(x, t, weak.encode_text(["a red circle"]))
        pure = sweep.VariantBackbone(model, sweep.parse_spec("agp:2"), weak)
        torch.testing.assert_close(pure.velocity(x, t, pure.encode_text("a red circle")), vw + 2 * (vc - vw))
        mixed = sweep.VariantBackbone(model, sweep.parse_spec("g:3,ag:0.5"), weak)
        torch.testing.assert_close(mixed.velocity(x, t, mixed.encode_text("a red circle")),
                                   vu + 3 * (vc - vu) + 0.5 * (vc - vw))


def test_a_misspelt_spec_is_refused():
    with pytest.raises(ValueError, match="unknown key"):
        sweep.parse_spec("gg:3")


def test_solver_keys_pick_the_buffers_solver_and_refuse_two(monkeypatch):
    """s, ab2 / heun and clip reach the buffer config the sweep renders with."""
    seen = {}
    import streamstudio.pipelines.video.stream_video as sv

    class Stop(Exception):
        pass

    def fake_stream(backbone, cfg, prompt):
        seen.update(solver=cfg.buffer.solver, s=cfg.buffer.micro_steps, clip=cfg.buffer.clip_sample)
        raise Stop

    monkeypatch.setattr(sv, "VideoStream", fake_stream)
    with pytest.raises(Stop):
        sweep.render(None, sweep.parse_spec("g:3,heun:1,clip:1,s:3"), "a red circle moving left", 0)
    assert seen == {"solver": "heun", "s": 3, "clip": True}
    with pytest.raises(Stop):
        sweep.render(None, sweep.parse_spec("g:3"), "a red circle moving left", 0)
    assert seen == {"solver": "euler", "s": 2, "clip": False}
    with pytest.raises(ValueError, match="one solver"):
        sweep.parse_spec("ab2:1,heun:1")
