"""The StreamDiffusion pipeline on the tiny model: Stream Batch, RCFG, priming, settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import RecordingNet, capture_latents

from streamstudio import kernels
from streamstudio.errors import StreamStudioError
from streamstudio.frames import to_frames
from streamstudio.pipelines.image.prompt_encoder import slerp
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

SIZE = 32


def frames(n, seed=0, size=SIZE):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def make(comps, **kw):
    kw.setdefault("width", SIZE)
    kw.setdefault("height", SIZE)
    prompt = kw.pop("prompt", "a red fox")
    return StreamDiffusion(comps, StreamDiffusionConfig(**kw), prompt=prompt, negative_prompt="blurry")


def run_aligned(pipe, inputs, fbs=1):
    outs = []
    for i in range(0, len(inputs), fbs):
        group = inputs[i:i + fbs]
        outs += pipe.push(group if fbs > 1 else group[0])
    outs += pipe.flush()
    return outs


# ------------------------------------------------------------------ Stream Batch vs sequential
@pytest.mark.parametrize("steps,fbs,cfg", [(n, k, "none") for n in (1, 2, 3, 4) for k in (1, 2)]
                         + [(3, 2, "self"), (4, 1, "initialize"), (2, 2, "full")])
def test_stream_batch_equals_sequential(comps, steps, fbs, cfg):
    inputs = frames(6 if fbs == 2 else 5)
    kw = dict(steps=steps, strength=0.7, frame_buffer_size=fbs, cfg_type=cfg, guidance_scale=1.5)
    batch, seq = make(comps, **kw), make(comps, use_denoising_batch=False, **kw)
    lat_b, lat_s = capture_latents(batch), capture_latents(seq)
    out_b, out_s = run_aligned(batch, inputs, fbs), run_aligned(seq, inputs, fbs)
    assert len(out_b) == len(out_s) == len(inputs)
    assert len(lat_b) == len(lat_s) == len(inputs)
    for a, b in zip(lat_b, lat_s):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # different inputs give different outputs: the alignment check above is not vacuous
    assert not torch.allclose(lat_b[0], lat_b[-1])


def test_stream_batch_one_unet_call_per_frame(comps):
    from dataclasses import replace

    net = RecordingNet(comps.net)
    pipe = make(replace(comps, network=net), steps=3, cfg_type="none")
    pipe.push(frames(1)[0])  # primes (2 sequential calls) + 1 batch call
    assert [c[:2] for c in net.calls] == [("encode", 1), ("eps", 1), ("eps", 1), ("eps", 3)]
    net.calls.clear()
    for f in frames(4, seed=1):
        pipe.push(f)
    # one call per frame denoising all three slots; frames 0, 1, 2 leave (decoded) at pushes 3, 4, 5
    assert [c[0] for c in net.calls if c[0] == "eps"] == ["eps"] * 4
    assert all(c[1:4] == (3, 3, 3) for c in net.calls if c[0] == "eps")
    assert [c[:2] for c in net.calls if c[0] == "decode"] == [("decode", 1)] * 3


def test_first_outputs_are_primed_not_empty(comps):
    pipe = make(comps, steps=4, strength=0.8, cfg_type="none")
    seq = make(comps, steps=4, strength=0.8, cfg_type="none", use_denoising_batch=False)
    f0 = frames(1)[0]
    live = [pipe(f0) for _ in range(3)]  # the first N-1 calls would be empty-buffer frames
    expected = seq(f0)
    for out in live:
        assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1
    assert pipe.latency_frames == 3


def test_aligned_output_order_with_latency(comps):
    pipe = make(comps, steps=3, cfg_type="none")
    inputs = frames(5)
    got = []
    for i, f in enumerate(inputs):
        out = pipe.push(f)
        got.append(len(out))
    assert got == [0, 0, 1, 1, 1]
    assert len(pipe.flush()) == 2


# ------------------------------------------------------------------ RCFG, against formulas written out here
def lcm_coefs(t_index, step_type="lcm"):
    from diffusers import LCMScheduler

    from streamstudio.models.image.tiny import SCHEDULER_CONFIG

    sched = LCMScheduler.from_config(SCHEDULER_CONFIG)
    sched.set_timesteps(50)
    out = []
    for i in t_index:
        t = int(sched.timesteps[i])
        abar = float(sched.alphas_cumprod[t])
        s = 10.0 * t
        c_skip, c_out = (0.25 / (s * s + 0.25), s / (s * s + 0.25) ** 0.5) if step_type == "lcm" else (0.0, 1.0)
        out.append(dict(t=t, a=abar ** 0.5, b=(1 - abar) ** 0.5, c_skip=c_skip, c_out=c_out))
    return out


def manual_frame(pipe, frame, cfg, g, step_type="lcm"):
    """The whole trajectory of one frame, written out from the paper's formulas (none / full:
    no stock; the stock update of self / initialize is checked against StreamDiffusion's own
    unet_step in test_rcfg_reference.py)."""
    unet, text, neg = pipe.comps.unet, pipe.prompts.text.text, pipe.prompts.negative.text
    co = lcm_coefs(pipe.config.resolved_t_index_list(), step_type)
    n = len(co)
    noise = pipe.sampler._noise  # (N, 4, h, w), one per slot
    with torch.no_grad():
        z = pipe.io.encode(kernels.preprocess(torch.from_numpy(frame), SIZE, SIZE))
        x = co[0]["a"] * z + co[0]["b"] * noise[0:1]
        def eps_fn(x, t, e):
            return unet(x, torch.tensor([t]), encoder_hidden_states=e).sample
        for j in range(n):
            c = co[j]
            eps_c = eps_fn(x, c["t"], text)
            if cfg == "none":
                eps = eps_c
            else:
                eps_u = eps_fn(x, c["t"], neg)
                eps = eps_u + g * (eps_c - eps_u)
            x0 = c["c_out"] * (x - c["b"] * eps) / c["a"] + c["c_skip"] * x
            if j + 1 < n:
                nx = co[j + 1]
                x = nx["a"] * x0 + nx["b"] * noise[j + 1:j + 2]
    return x0[0]


@pytest.mark.parametrize("cfg", ["none", "full"])
@pytest.mark.parametrize("batch", [True, False])
def test_rcfg_matches_formulas(comps, cfg, batch):
    g, d = 2.5, 0.8
    pipe = make(comps, steps=2, strength=0.8, cfg_type=cfg, guidance_scale=g, delta=d, use_denoising_batch=batch)
    lat = capture_latents(pipe)
    inputs = frames(3, seed=3)
    run_aligned(pipe, inputs)
    for frame, got in zip(inputs, lat):
        torch.testing.assert_close(got, manual_frame(pipe, frame, cfg, g), atol=1e-4, rtol=1e-4)


def test_turbo_step_is_x0_equals_f(comps):
    pipe = make(comps, steps=2, strength=0.8, cfg_type="none", step_type="turbo")
    lat = capture_latents(pipe)
    inputs = frames(2, seed=4)
    run_aligned(pipe, inputs)
    for frame, got in zip(inputs, lat):
        torch.testing.assert_close(got, manual_frame(pipe, frame, "none", 1.0, "turbo"), atol=1e-4, rtol=1e-4)


def test_none_equals_guidance_one(comps):
    none = make(comps, steps=2, cfg_type="none", guidance_scale=7.0)
    full = make(comps, steps=2, cfg_type="full", guidance_scale=1.0)
    lat_n, lat_f = capture_latents(none), capture_latents(full)
    inputs = frames(2, seed=5)
    run_aligned(none, inputs)
    run_aligned(full, inputs)
    for a, b in zip(lat_n, lat_f):
        torch.testing.assert_close(a, b)
    # and both equal textbook CFG at guidance 1, computed with both UNet passes
    torch.testing.assert_close(lat_n[0], manual_frame(none, inputs[0], "full", 1.0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cfg,per_frame", [("none", 1), ("self", 1), ("initialize", None), ("full", 2)])
@pytest.mark.parametrize("batch", [True, False])
def test_unet_passes_per_frame(comps, cfg, per_frame, batch):
    n = 3
    pipe = make(comps, steps=n, cfg_type=cfg, guidance_scale=2.0, use_denoising_batch=batch)
    inputs = frames(5)
    pipe.push(inputs[0])  # priming happens here
    pipe.stats.unet_samples = 0
    for f in inputs[1:]:
        pipe.push(f)
    expected = n + 1 if cfg == "initialize" else per_frame * n
    assert pipe.stats.unet_samples == expected * 4


# ------------------------------------------------------------------ similarity filter in the pipeline
def test_filter_skips_static_input_without_network(comps):
    pipe = make(comps, steps=2, similarity_filter=True, similarity_threshold=0.9, max_skip_frame=4)
    f = frames(1)[0]
    outs = [pipe(f) for _ in range(11)]
    # frame 0 processed; then 4 skips, 1 forced, 4 skips, 1 forced
    assert pipe.stats.skipped == 8
    assert pipe.stats.calls == 3
    assert all(np.array_equal(outs[1], o) for o in outs[1:5])


def test_filter_keeps_alignment(comps):
    pipe = make(comps, steps=3, similarity_filter=True, similarity_threshold=0.5, max_skip_frame=2)
    f = frames(1)[0]
    outs = run_aligned(pipe, [f] * 7)
    assert len(outs) == 7
    assert pipe.stats.skipped > 0


# ------------------------------------------------------------------ run-time changes
def test_prompt_change_only_reruns_text_encoder(comps):
    pipe = make(comps, steps=2)
    net_id, encodes = id(pipe.net), pipe.stats.text_encodes
    before = pipe.prompts.text.text.clone()
    pipe.set_prompt("a blue whale")
    assert pipe.stats.text_encodes == encodes + 1
    assert id(pipe.net) == net_id
    assert not torch.allclose(before, pipe.prompts.text.text)
    pipe.set_prompt("a red fox")  # seen before: cached, no new encoder run
    assert pipe.stats.text_encodes == encodes + 1
    torch.testing.assert_close(pipe.prompts.text.text, before)


def test_prompt_blend_linear_and_slerp(comps):
    pipe = make(comps, steps=1)
    a, b = pipe.prompts.encoder.encode("a cat").text, pipe.prompts.encoder.encode("a dog").text
    pipe.set_prompt([("a cat", 3.0), ("a dog", 1.0)])
    torch.testing.assert_close(pipe.prompts.text.text, 0.75 * a + 0.25 * b)
    pipe.set_prompt([("a cat", 1.0), ("a dog", 1.0)], blend="slerp")
    mid = pipe.prompts.text.text
    torch.testing.assert_close(mid, slerp(a, b, 0.5))
    # slerp of unit vectors keeps the angle halfway: cos(mid, a) == cos(mid, b) token by token
    # (tokens of unequal norms lean to the longer one, as a + b does)
    def cos(u, v):
        return torch.nn.functional.cosine_similarity(u, v, dim=-1)
    ua, ub = a / a.norm(dim=-1, keepdim=True), b / b.norm(dim=-1, keepdim=True)
    unit_mid = slerp(ua, ub, 0.5)
    torch.testing.assert_close(cos(unit_mid, ua), cos(unit_mid, ub), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(unit_mid.norm(dim=-1), torch.ones_like(unit_mid[..., 0]), atol=1e-5, rtol=1e-5)
    with pytest.raises(StreamStudioError):
        pipe.set_prompt([])


def test_update_strength_seed_guidance(comps):
    pipe = make(comps, steps=2, strength=0.5)
    first = pipe.config.resolved_t_index_list()
    pipe.update(strength=0.9)
    now = pipe.config.resolved_t_index_list()
    assert now != first and now[0] < first[0]
    noise = pipe.sampler._noise.clone()
    pipe.update(seed=123)
    assert not torch.allclose(noise, pipe.sampler._noise)
    pipe.update(guidance_scale=3.0, delta=0.5, cfg_type="full")
    assert pipe.config.effective_cfg == kernels.CFG_CODES["full"]
    pipe(frames(1)[0])
    with pytest.raises(StreamStudioError):
        pipe.update(width=64)
    with pytest.raises(StreamStudioError):
        pipe.update(cfg_type="bogus")
    with pytest.raises(StreamStudioError):
        pipe.update(no_such_setting=1)


def test_seed_gives_reproducible_output(comps):
    f = frames(1)[0]
    a = make(comps, steps=2, seed=7)(f)
    b = make(comps, steps=2, seed=7)(f)
    c = make(comps, steps=2, seed=8)(f)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_txt2img_generate(comps):
    pipe = make(comps, mode="txt2img", steps=2)
    images = pipe.generate(3)
    assert len(images) == 3 and all(im.shape == (SIZE, SIZE, 3) and im.dtype == np.uint8 for im in images)
    assert not np.array_equal(images[0], images[1])  # fresh noise per image
    with pytest.raises(StreamStudioError):
        pipe(frames(1)[0])


# ------------------------------------------------------------------ bad input
def test_input_conversions(comps):
    pipe = make(comps, steps=1, width=48, height=40)
    rng = np.random.default_rng(0)
    gray = rng.integers(0, 256, (37, 53), dtype=np.uint8)
    rgba = rng.integers(0, 256, (31, 17, 4), dtype=np.uint8)
    floats = rng.random((20, 20, 3))
    one = rng.integers(0, 256, (20, 20, 1), dtype=np.uint8)
    for image in (gray, rgba, floats, one, torch.from_numpy(gray)):
        out = pipe(image)
        assert out.shape == (40, 48, 3) and out.dtype == np.uint8


def test_rgba_input_is_its_composite_on_black(comps):
    """An RGBA frame gives what the same picture flattened on black gives (alpha 255: the colour,
    alpha 0: black, in between: c * a / 255), without a numpy pass over the frame."""
    rng = np.random.default_rng(3)
    rgba = rng.integers(0, 256, (48, 48, 4), dtype=np.uint8)
    rgba[:16, :, 3], rgba[16:32, :, 3] = 255, 0
    flat = rgba[:, :, :3].copy()
    flat[16:32] = 0
    mid = rgba[32:].astype(np.float64)
    flat[32:] = np.round(mid[:, :, :3] * mid[:, :, 3:4] / 255.0).astype(np.uint8)
    a, b = make(comps, steps=1, width=48, height=48), make(comps, steps=1, width=48, height=48)
    out_rgba, out_flat = a(rgba).astype(int), b(flat).astype(int)
    assert np.abs(out_rgba - out_flat).max() <= 2  # flat rounds c * a / 255 to whole levels; rgba does not
    both = to_frames([rgba, flat], 2)  # RGB beside RGBA: the RGB frame gets opaque alpha
    assert both.shape == (2, 48, 48, 4) and (both[1, :, :, 3] == 255).all()


@pytest.mark.parametrize("bad,match", [
    (np.zeros((8, 8, 3), np.int32), "uint8"),
    (np.full((8, 8, 3), 2.0), r"\[0, 1\]"),
    (np.zeros((8, 8, 2), np.uint8), "shape"),
    (np.zeros((0, 8, 3), np.uint8), "empty"),
    ("not an image", "expected an image"),
    (None, "img2img"),
])
def test_bad_input_clear_error(comps, bad, match):
    pipe = make(comps, steps=1)
    with pytest.raises(StreamStudioError, match=match):
        pipe(bad)


@pytest.mark.parametrize("kw,match", [
    (dict(width=30), "multiple of 8"),
    (dict(height=0), "multiple of 8"),
    (dict(cfg_type="half"), "cfg_type"),
    (dict(t_index_list=[30, 20]), "increasing"),
    (dict(strength=0.0), "strength"),
])
def test_bad_config_clear_error(comps, kw, match):
    with pytest.raises(StreamStudioError, match=match):
        make(comps, **kw)


def test_empty_and_overlong_prompts(comps):
    pipe = make(comps, steps=1, prompt="")
    assert pipe(frames(1)[0]).shape == (SIZE, SIZE, 3)
    with pytest.warns(UserWarning, match="truncated"):
        pipe.set_prompt("a very long prompt " * 40)
    assert pipe.prompts.text.text.shape == (1, 77, 32)
    with pytest.raises(StreamStudioError):
        pipe.set_prompt(42)
