"""Temporal consistency of the image pipeline (issue 16): latent feedback and the StreamV2V
feature bank, on the tiny model: exactness when off, less flicker when on, one bank per stream
(also through the cross-stream batching executor), Stream Batch, RCFG, settings, web API, CLI."""

from __future__ import annotations

import copy
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import capture_latents, run_in_lockstep

from streamstudio.errors import StreamStudioError
from streamstudio.models.image import feature_bank
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

SIZE = 32


@pytest.fixture(scope="module")
def sharp_comps(comps):
    """The tiny model with sharp self-attention. Its random weights give nearly uniform
    attention (every token's output is about the mean value), which carries almost none of
    a frame's noise, so no bank can smooth it; a trained model's attention is sharp. Scaling
    the queries makes it so. (On these random weights: x10 leaves the bank a 2.9% gain, x15 3.6%,
    x30 13% but bank and feedback together then flicker more than neither; x15 is used.)"""
    unet = copy.deepcopy(comps.unet)
    for _, layer in feature_bank.self_attention_layers(unet):
        layer.to_q.weight.data *= 15.0
    return replace(comps, unet=unet)


def make(comps, prompt="a red fox", **kw):
    kw.setdefault("width", SIZE)
    kw.setdefault("height", SIZE)
    return StreamDiffusion(comps, StreamDiffusionConfig(**kw), prompt=prompt, negative_prompt="blurry")


def random_frames(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for _ in range(n)]


def still_noisy(n, seed=0, noise=8.0):
    """A still textured image with sensor noise."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (SIZE, SIZE, 3)).astype(np.float32)
    return [np.clip(base + rng.normal(0, noise, base.shape), 0, 255).astype(np.uint8) for _ in range(n)]


def run_latents(pipe, inputs, fbs=1):
    """The x0 latents the pipeline decodes, in output order, frame-aligned, flushed."""
    seen = capture_latents(pipe)
    outs = []
    for i in range(0, len(inputs), fbs):
        outs += pipe.push(inputs[i:i + fbs] if fbs > 1 else inputs[i])
    outs += pipe.flush()
    return torch.stack(seen), outs


def flicker(latents, skip=4):
    """Mean absolute difference of consecutive outputs after the first `skip`."""
    lat = latents[skip:]
    return (lat[1:] - lat[:-1]).abs().mean().item()


# ---------------------------------------------------------------------- off is exactly plain
@pytest.mark.parametrize("settings", [dict(temporal="bank", bank_size=0),
                                      dict(temporal="feedback", feedback_weight=0.0),
                                      dict(temporal="both", bank_size=0, feedback_weight=0.0),
                                      dict(temporal="off", bank_size=4, feedback_weight=0.5)])
@pytest.mark.parametrize("steps,cfg", [(1, "self"), (2, "full"), (3, "initialize")])
def test_bank_size_0_and_feedback_0_equal_plain_img2img_exactly(comps, settings, steps, cfg):
    inputs = random_frames(5)
    plain, plain_out = run_latents(make(comps, steps=steps, cfg_type=cfg, guidance_scale=1.4), inputs)
    got, got_out = run_latents(make(comps, steps=steps, cfg_type=cfg, guidance_scale=1.4, **settings), inputs)
    assert torch.equal(plain, got)
    assert all(np.array_equal(a, b) for a, b in zip(plain_out, got_out))


def test_the_bank_leaves_the_unet_as_it_was(comps):
    """The bank processors are on the UNet only during a bank call: afterwards its processors
    are the originals and a plain stream gives exactly its frames."""
    before = dict(comps.unet.attn_processors)
    inputs = random_frames(4)
    plain, _ = run_latents(make(comps, steps=2), inputs)
    run_latents(make(comps, steps=2, temporal="bank"), inputs)
    assert dict(comps.unet.attn_processors) == before
    again, _ = run_latents(make(comps, steps=2), inputs)
    assert torch.equal(plain, again)


def test_extended_attention_over_identical_frames_is_plain_attention(comps):
    """A bank holding exactly this frame's keys and values changes no attention output
    (softmax over duplicated keys), and fusing a token with itself changes nothing: identical
    frames give the plain outputs."""
    frame = random_frames(1)[0]
    plain, _ = run_latents(make(comps, steps=2), [frame] * 5)
    got, _ = run_latents(make(comps, steps=2, temporal="bank", bank_size=3), [frame] * 5)
    torch.testing.assert_close(got, plain, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------- less flicker
def test_the_bank_makes_consecutive_outputs_of_a_still_noisy_input_closer(sharp_comps):
    inputs = still_noisy(14)
    plain = flicker(run_latents(make(sharp_comps), inputs)[0])
    bank = flicker(run_latents(make(sharp_comps, temporal="bank"), inputs)[0])
    bank_only_attention = flicker(run_latents(make(sharp_comps, temporal="bank", bank_fusion=0.0), inputs)[0])
    assert bank < 0.97 * plain
    assert bank_only_attention < plain


@pytest.mark.parametrize("model", ["tiny", "sharp"])
def test_latent_feedback_makes_consecutive_outputs_closer(comps, sharp_comps, model):
    c = comps if model == "tiny" else sharp_comps
    inputs = still_noisy(14)
    plain = flicker(run_latents(make(c), inputs)[0])
    feedback = flicker(run_latents(make(c, temporal="feedback", feedback_weight=0.3), inputs)[0])
    both = flicker(run_latents(make(c, temporal="both", feedback_weight=0.3), inputs)[0])
    assert feedback < 0.8 * plain
    assert both < plain


def test_feedback_blends_the_last_output_latent_into_the_input(comps):
    pipe = make(comps, temporal="feedback", feedback_weight=0.25)
    a, b = random_frames(2)
    pipe(a)
    last = pipe._last_out_latent.clone()
    latents, _ = pipe._input_latents(b)
    torch.testing.assert_close(latents, 0.75 * pipe._last_x0_in + 0.25 * last)


# ---------------------------------------------------------------------- Stream Batch, RCFG
@pytest.mark.parametrize("steps,cfg,fbs,interval", [(2, "none", 1, 1), (3, "self", 1, 1), (2, "full", 1, 2),
                                                    (3, "initialize", 1, 1), (2, "self", 2, 1), (3, "none", 1, 3)])
def test_stream_batch_with_the_bank_equals_sequential_with_the_bank(comps, steps, cfg, fbs, interval):
    """Each slot uses the bank of its own frame's time: the slot at step j reads the features
    of earlier frames at step j only, exactly what sequential denoising reads. (Extended
    attention; feature fusion's nearest-neighbour pick is discontinuous, so float-level
    differences between a batched and a sequential call may pick another of near-equal
    neighbours, and are not compared here.)"""
    inputs = random_frames(8)
    kw = dict(steps=steps, cfg_type=cfg, guidance_scale=1.4, frame_buffer_size=fbs, temporal="bank",
              bank_interval=interval, bank_fusion=0.0)
    batched, outs = run_latents(make(comps, **kw), inputs, fbs)
    sequential, _ = run_latents(make(comps, use_denoising_batch=False, **kw), inputs, fbs)
    plain, _ = run_latents(make(comps, steps=steps, cfg_type=cfg, guidance_scale=1.4, frame_buffer_size=fbs),
                           inputs, fbs)
    assert len(outs) == len(inputs)
    torch.testing.assert_close(batched, sequential, atol=1e-4, rtol=0)
    assert (batched - plain).abs().max() > 1e-3  # the bank did something


@pytest.mark.parametrize("steps,cfg", [(2, "self"), (3, "full"), (3, "initialize")])
def test_stream_batch_with_fusion_and_rcfg_keeps_a_bank_per_step_and_branch(comps, steps, cfg):
    pipe = make(comps, steps=steps, cfg_type=cfg, guidance_scale=1.4, temporal="bank", bank_size=2,
                bank_threshold=0.5)
    outs = [pipe(f) for f in random_frames(6)]
    assert len(outs) == 6 and outs[-1].shape == (SIZE, SIZE, 3)
    keys = {key for _, key in pipe.sampler.bank._store}
    want = {("c", j, 0) for j in range(steps)}
    want |= {("u", j, 0) for j in range(steps)} if cfg == "full" else {("u", 0, 0)} if cfg == "initialize" else set()
    assert keys == want
    assert pipe.sampler.bank.entries == 2  # FIFO at bank_size


def test_the_update_rule_writes_every_nth_frame(comps):
    pipe = make(comps, temporal="bank", bank_size=8, bank_interval=3)
    for f in random_frames(7):
        pipe(f)
    assert pipe.sampler.bank.entries == 3  # frames 0, 3 and 6


# ---------------------------------------------------------------------- one bank per stream
def test_each_stream_has_its_own_bank(comps):
    """Two streams over one UNet, interleaved, give the frames each gives alone."""
    a_in, b_in = still_noisy(6, seed=1), random_frames(6, seed=2)
    kw = dict(steps=2, temporal="bank", bank_threshold=0.5)
    pa = make(comps, "a red fox", seed=3, **kw)
    alone_a = [pa(f) for f in a_in]
    pb = make(comps, "a blue lake", seed=7, cfg_type="full", guidance_scale=1.5, **kw)
    alone_b = [pb(f) for f in b_in]
    pa = make(comps, "a red fox", seed=3, **kw)
    pb = make(comps, "a blue lake", seed=7, cfg_type="full", guidance_scale=1.5, **kw)
    together_a, together_b = [], []
    for fa, fb in zip(a_in, b_in):
        together_a.append(pa(fa))
        together_b.append(pb(fb))
    assert all(np.array_equal(x, y) for x, y in zip(alone_a, together_a))
    assert all(np.array_equal(x, y) for x, y in zip(alone_b, together_b))
    assert pa.sampler.bank is not pb.sampler.bank


def test_streams_with_banks_batched_across_streams_give_their_frames_alone(tiny_components_factory):
    """Through the cross-stream batching executor: bank calls of two streams (different CFG, so
    different row counts) run as one UNet call, each row on its own stream's bank; a stream
    without a bank runs beside them."""
    from streamstudio.models.image.batching import BatchExecutor, BatchingConfig, batched_components

    comps = tiny_components_factory()
    specs = [("a red fox", 3, dict(cfg_type="self", temporal="bank")),
             ("a blue lake", 7, dict(cfg_type="initialize", guidance_scale=1.4, temporal="both")),
             ("a green hill", 5, dict(cfg_type="self"))]
    inputs = [random_frames(5, seed=s) for s in (1, 2, 3)]

    def stream(c, prompt, seed, kw):
        return StreamDiffusion(c, StreamDiffusionConfig(width=64, height=64, steps=2, seed=seed, bank_threshold=0.5,
                                                        **kw), prompt=prompt)

    alone = []
    for (prompt, seed, kw), frames in zip(specs, inputs):
        s = stream(comps, prompt, seed, kw)
        alone.append([s(f) for f in frames])
    executor = BatchExecutor(BatchingConfig(max_wait_ms=500))
    try:
        shared = batched_components(comps, executor)
        streams = [stream(shared, *spec) for spec in specs]
        got = run_in_lockstep(executor, streams, inputs)
        assert executor.stats.batched_calls > 0
        for want, have in zip(alone, got):
            assert len(have) == len(want)
            for a, b in zip(want, have):
                assert np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 2
        assert streams[0].sampler.bank is not streams[1].sampler.bank and streams[2].sampler.bank is None
    finally:
        executor.close()


def test_batched_bank_calls_join_each_other_with_row_segments(tiny_components_factory):
    """The executor hands the joined bank call each stream's rows (first row, BankRows)."""
    from streamstudio.models.image.batching import BatchExecutor, BatchingConfig

    executor = BatchExecutor(BatchingConfig(max_wait_ms=500))
    seen = []

    def fn(x, metas):
        seen.append([(start, meta) for start, meta in metas])
        return x * 2

    try:
        results = [None, None]
        barrier = threading.Barrier(2)

        def worker(i):
            with executor.client():
                barrier.wait()
                results[i] = executor.run("bank", fn, torch.full((i + 1, 2), float(i)), meta=f"stream{i}")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results[0].shape == (1, 2) and results[1].shape == (2, 2)
        assert torch.equal(results[1], torch.full((2, 2), 2.0))
        assert sorted(seen[-1], key=lambda s: s[1]) in ([(0, "stream0"), (1, "stream1")],
                                                        [(2, "stream0"), (0, "stream1")])
    finally:
        executor.close()


# ---------------------------------------------------------------------- settings
def test_settings_are_validated(comps):
    for bad in (dict(temporal="smooth"), dict(feedback_weight=1.0), dict(feedback_weight=-0.1), dict(bank_size=17),
                dict(bank_size=1.5), dict(bank_interval=0), dict(bank_threshold=1.5), dict(bank_fusion=2.0),
                dict(bank_size="2")):
        with pytest.raises(StreamStudioError):
            StreamDiffusionConfig(**bad).validate()
    pipe = make(comps)
    with pytest.raises(StreamStudioError, match="temporal"):
        pipe.update(temporal="flow")
    assert pipe.config.temporal == "off"


def test_settings_change_live(comps):
    pipe = make(comps, steps=2)
    inputs = random_frames(8)
    for f in inputs[:2]:
        pipe(f)
    assert pipe.sampler.bank is None
    pipe.update(temporal="bank", bank_size=3, bank_threshold=0.9, bank_fusion=0.5)
    for f in inputs[2:6]:
        pipe(f)
    assert pipe.sampler.bank is not None and pipe.sampler.bank.entries == 3 and pipe.sampler.bank.fusion == 0.5
    bank = pipe.sampler.bank
    pipe.update(bank_size=1, bank_interval=2)
    assert pipe.sampler.bank is bank and bank.entries == 1 and bank.interval == 2
    pipe.update(temporal="feedback", feedback_weight=0.4)
    assert pipe.sampler.bank is None and pipe.config.uses_feedback
    pipe(inputs[6])
    pipe.update(temporal="off")
    assert not pipe.config.uses_feedback
    pipe(inputs[7])


def test_the_bank_needs_a_torch_unet(comps):
    from streamstudio.models.image.export_specs import EngineImageNet
    from streamstudio.models.image.image_net import ImageCond

    def engine(sample, timestep, text):  # like a TensorRT UNet engine: no attention layers to extend
        return {"latent": comps.net.eps(sample, timestep, ImageCond(text=text))}

    engine_comps = replace(comps, network=EngineImageNet(comps.net, unet=engine))
    with pytest.raises(StreamStudioError, match="feedback"):
        make(engine_comps, temporal="bank")
    pipe = make(engine_comps, temporal="feedback")
    with pytest.raises(StreamStudioError, match="torch UNet"):
        pipe.update(temporal="bank")
    assert pipe.config.temporal == "feedback"
    pipe(random_frames(1)[0])


def test_the_web_api_takes_the_temporal_settings():
    from streamstudio.app.web.sessions import parse_settings

    got = parse_settings({"temporal": "bank", "bank_size": 3, "bank_interval": 2, "bank_threshold": 0.95,
                          "bank_fusion": 0.7, "feedback_weight": 0.2})
    assert got == {"temporal": "bank", "bank_size": 3, "bank_interval": 2, "bank_threshold": 0.95,
                   "bank_fusion": 0.7, "feedback_weight": 0.2}
    assert isinstance(got["bank_size"], int)
    for bad in ({"temporal": "blur"}, {"bank_size": 2.5}, {"bank_size": 99}, {"feedback_weight": 1.5},
                {"bank_threshold": "high"}):
        with pytest.raises(StreamStudioError):
            parse_settings(bad)


def test_a_web_session_applies_the_temporal_setting(tiny_components_factory):
    import time

    from streamstudio.app.web.sessions import ServerModel, SessionManager
    from streamstudio.app.settings import live_keys, settings_from_ui

    keys = live_keys()
    assert keys[9] == "temporal"
    model = ServerModel(tiny_components_factory(), StreamDiffusionConfig(width=64, height=64, steps=2))
    manager = SessionManager(model, max_streams=2, owns_model=True)
    try:
        session = manager.open("t")
        manager.settings("t", settings_from_ui(keys, ("a cat", "", 0.5, 1.2, 1.0, "self", 2, False, 0.98,
                                                      "bank")))
        deadline = time.monotonic() + 60
        frames = random_frames(40, seed=4)
        while session.processed < 3 and time.monotonic() < deadline and frames:
            session.submit(frames.pop())
            time.sleep(0.05)
        assert session.error is None and session.notice is None
        assert session.stats()["settings"]["temporal"] == "bank"
        assert session.processor.pipe.sampler.bank is not None
    finally:
        manager.shutdown()


# ---------------------------------------------------------------------- CLI
@pytest.mark.parametrize("mode", ["bank", "feedback"])
def test_render_temporal_from_the_cli(tmp_path, capsys, monkeypatch, mode):
    from clips import make_clip, probe

    from streamstudio.app import cli

    monkeypatch.setattr(cli, "COMMANDS", {"render": "render"})
    clip = make_clip(tmp_path / "in.mp4", n=6, fps=6)
    out = tmp_path / "out.mp4"
    rc = cli.main(["render", "--input", str(clip), "--output", str(out), "--steps", "2", "--temporal", mode,
                   "--bank-size", "2", "--feedback-weight", "0.3", "--model", "tiny", "--device", "cpu"])
    assert rc == 0
    assert probe(out).frames == 6


def test_bad_temporal_flags_are_user_errors(capsys, monkeypatch):
    from streamstudio.app import cli

    monkeypatch.setattr(cli, "COMMANDS", {"render": "render"})
    assert cli.main(["render", "--input", "x.mp4", "--output", "y.mp4", "--temporal", "smooth"]) == 2  # usage error
    rc = cli.main(["render", "--input", "pattern", "--output", "y.mp4", "--temporal", "bank", "--bank-size", "99",
                   "--model", "tiny", "--device", "cpu"])
    assert rc == 2  # checked while parsing, before the model loads
    assert "bank_size must be in [0, 16]" in capsys.readouterr().err
