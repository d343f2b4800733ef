"""StreamDiT training: mixed partitioning, loss falls, resume continues, distillation, data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from streamstudio.errors import StreamStudioError
from streamstudio.models.video.video_data import (COLOURS, SHAPES, VideoFolder, random_spec, render_shape_batch,
                                                  render_shape_clip, synthetic_batch)
from streamstudio.app.training.video import (VideoTrainConfig, VideoTrainer, context_fade, distill_levels,
                                             draw_flow, partition_levels, teacher_target)
from streamstudio.models.video.stream_dit import StreamDiT, StreamDiTConfig
from streamstudio.models.video.video_net import StreamDiTBackbone
from streamstudio.pipelines.video.stream_video import StreamBufferConfig, StreamSampler


def small_cfg(tmp_path, **kw) -> VideoTrainConfig:
    base = dict(output=str(tmp_path / "run"), steps=30, batch_size=2, buffer_frames=4, size=16, lr=3e-3,
                warmup=3, save_every=1000, cpu=True, progress=False)
    base.update(kw)
    return VideoTrainConfig(**base)


def test_partition_levels_lie_in_their_segments():
    t, chunk = partition_levels(torch.Generator().manual_seed(0), 64, 8)
    assert set(chunk.tolist()) == {1, 2, 4, 8}
    for row, c in zip(t, chunk.tolist()):
        n = 8 // c
        seg = torch.arange(8) // c
        lo, hi = (n - 1 - seg) / n, (n - seg) / n
        assert bool(((row >= lo) & (row < hi)).all())
        assert bool((row.view(n, c) == row.view(n, c)[:, :1]).all())  # one level per chunk


def test_synthetic_clips_show_the_captioned_colour():
    clips, caps = synthetic_batch(3, 4, 6, 32)
    assert clips.shape == (4, 6, 3, 32, 32) and clips.min() >= -1 and clips.max() <= 1
    for clip, cap in zip(clips, caps):
        colour = cap.split()[1]
        bright = clip.permute(0, 2, 3, 1).reshape(-1, 3)
        bright = bright[bright.max(1).values > 0]  # shape pixels (background is dark)
        ref = torch.tensor(COLOURS[colour]) / 127.5 - 1
        assert (bright.mean(0) - ref).abs().max() < 0.3, cap
    spec = random_spec(__import__("random").Random(0), 32)
    a, b = render_shape_clip(spec, 4, 32), render_shape_clip(spec, 4, 32, start=1)
    torch.testing.assert_close(a[1:], b[:3])  # the clip moves on consistently


def test_a_batch_renders_each_clip_as_alone_with_the_shapes_areas():
    """render_shape_batch: each row is its spec's clip rendered alone (nothing mixes across the
    batch), over every shape and direction, and each shape covers its geometric area (circle of
    radius r: pi r^2; square of half-side 0.8 r: (1.6 r)^2; triangle of height 1.6 r on a base of
    2 x 0.55 x 1.6 r: 1.408 r^2), measured from the pixels."""
    import math

    rng = __import__("random").Random(7)
    specs = [random_spec(rng, 32) for _ in range(40)]
    assert {s.shape for s in specs} == set(SHAPES) and len({s.direction for s in specs}) == 4
    batch = render_shape_batch(specs, 5, 32)  # (B, F, 3, H, W)
    for spec, clip in zip(specs, batch):
        torch.testing.assert_close(clip, render_shape_clip(spec, 5, 32), rtol=0, atol=0)
        colour = torch.tensor(COLOURS[spec.colour]) / 255.0
        c = int((colour - spec.background).abs().argmax())  # the channel that tells shape from ground
        coverage = ((clip[:, c] + 1) / 2 - spec.background) / (float(colour[c]) - spec.background)  # (F, H, W)
        want = {"circle": math.pi, "square": 1.6**2, "triangle": 0.5 * 1.76 * 1.6}[spec.shape] * spec.radius**2
        area = coverage.sum((1, 2))  # (F,)
        assert torch.allclose(area, torch.full_like(area, want), rtol=0.03), (spec, area, want)


def test_loss_falls(tmp_path):
    losses = VideoTrainer(small_cfg(tmp_path, steps=40, batch_size=4)).train()
    assert len(losses) == 40
    assert np.mean(losses[-8:]) < 0.75 * np.mean(losses[:4])


def test_resume_continues_exactly(tmp_path):
    straight = VideoTrainer(small_cfg(tmp_path / "a", steps=6)).train()
    first = VideoTrainer(small_cfg(tmp_path / "b", steps=3)).train()
    rest = VideoTrainer(small_cfg(tmp_path / "b", steps=6, resume=True)).train()
    assert len(rest) == 3
    np.testing.assert_allclose(first + rest, straight, rtol=1e-4)
    wa = load_file(str(tmp_path / "a" / "run" / "model.safetensors"))
    wb = load_file(str(tmp_path / "b" / "run" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-6)
    assert json.loads((tmp_path / "b" / "run" / "trainer_state.json").read_text())["step"] == 6
    with pytest.raises(StreamStudioError, match="resume"):
        VideoTrainer(small_cfg(tmp_path / "c", resume=True))


def test_workers_draw_the_same_batches_as_the_loop(tmp_path):
    """--workers: processes draw the batches ahead (what a GPU waits for); the run is the same,
    step for step, as the loop drawing them itself, and a resumed run with workers starts its
    loader at the step it resumes from."""
    straight = VideoTrainer(small_cfg(tmp_path / "a", steps=5, cond_drop=0.3)).train()
    ahead = VideoTrainer(small_cfg(tmp_path / "b", steps=5, cond_drop=0.3, workers=2)).train()
    np.testing.assert_allclose(ahead, straight, rtol=1e-5)
    VideoTrainer(small_cfg(tmp_path / "c", steps=2, cond_drop=0.3, workers=1)).train()
    rest = VideoTrainer(small_cfg(tmp_path / "c", steps=5, cond_drop=0.3, workers=2, resume=True)).train()
    np.testing.assert_allclose(rest, straight[2:], rtol=1e-4)


def test_distillation_runs_from_a_teacher(tmp_path):
    VideoTrainer(small_cfg(tmp_path / "t", steps=4)).train()
    cfg = small_cfg(tmp_path / "s", steps=4, mode="distill", teacher=str(tmp_path / "t" / "run"), teacher_steps=2,
                    sampling={"num_chunks": 2, "chunk_size": 2, "micro_steps": 1})
    losses = VideoTrainer(cfg).train()
    assert len(losses) == 4 and all(np.isfinite(losses))
    with pytest.raises(StreamStudioError, match="teacher"):
        VideoTrainer(small_cfg(tmp_path / "x", mode="distill", sampling={"num_chunks": 2, "chunk_size": 2}))


def random_teacher(seed: int = 0) -> StreamDiT:
    torch.manual_seed(seed)
    model = StreamDiT(StreamDiTConfig(hidden_size=32, depth=2, num_heads=2, window=(4, 8, 8))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


class Recorder:
    """A backbone that records the per-frame times it is called with."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def encode_text(self, prompt):
        return self.inner.encode_text(prompt)

    def velocity(self, x, t, text):
        self.calls.append(t[0].clone())
        return self.inner.velocity(x, t, text)


@pytest.mark.parametrize("n, c", [(4, 2), (8, 1), (2, 4)])
def test_distill_levels_are_exactly_the_student_samplers_calls(n, c):
    """Record the levels an s = 1 sampler of layout (N, c) calls its network with (start-up and
    streaming); the distillation draws those buffers and no other."""
    rec = Recorder(StreamDiTBackbone(random_teacher()))
    sampler = StreamSampler(rec, StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=1), (3, 16, 16), "red")
    sampler.start()
    for _ in range(3 * n):
        sampler.step()
    seen = {tuple(torch.round(t * n).long().tolist()) for t in rec.calls}
    drawn = distill_levels(torch.Generator().manual_seed(0), 400, n, c, startup_share=0.25)  # (400, N*c)
    assert {tuple(row.tolist()) for row in drawn} == seen
    startup = (drawn == drawn[:, :1]).all(1).float().mean() if n > 1 else torch.tensor(0.25)
    assert 0.15 < float(startup) < 0.35


def test_teacher_target_is_what_the_teachers_sampler_does_over_one_segment():
    """The target times dt, added to the state, equals the buffer the teacher's own sampler (s
    micro-steps per chunk) makes from the same state: over s streaming calls and over the
    start-up's uniform generation from noise."""
    n, c, s = 4, 2, 2
    teacher = random_teacher(1)
    backbone = StreamDiTBackbone(teacher)
    torch.manual_seed(2)
    noise = torch.randn(n * c, 3, 16, 16)  # (N*c, C, H, W): frame i's noise
    clean = torch.randn(n * c, 3, 16, 16).clamp(-1, 1)
    text = teacher.encode_text(["a red circle"])
    dt = torch.full((1, n * c), 1 / n)
    # streaming: chunk j at segment start (N - 1 - j) / N on the straight path
    k = distill_levels(torch.Generator().manual_seed(0), 1, n, c, startup_share=0.0)  # (1, N*c)
    t_a = k / n
    x_a = ((1 - t_a)[0, :, None, None, None] * noise + t_a[0, :, None, None, None] * clean)[None]
    with torch.no_grad():
        target = teacher_target(teacher, x_a, t_a, dt, s, text)
    sampler = StreamSampler(backbone, StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=s), (3, 16, 16),
                            "a red circle")
    sampler.start()
    assert sampler.levels.tolist() == (k[0] * s).tolist()
    sampler.x = x_a[0].clone()
    done = None
    for _ in range(s):
        done = sampler.step()
    after = torch.cat([done, sampler.x[:-c]])  # (N*c, C, H, W): the same frames, one segment later
    torch.testing.assert_close(x_a[0] + dt[0, :, None, None, None] * target[0], after, rtol=1e-4, atol=1e-5)
    # start-up: every frame at level 0 (noise); the sampler's chunk 2 takes the uniform state at level s
    zero = torch.zeros(1, n * c)
    with torch.no_grad():
        target = teacher_target(teacher, noise[None], zero, dt, s, text)
    sampler = StreamSampler(backbone, StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=s), (3, 16, 16),
                            "a red circle", noise_fn=lambda i: noise[i])
    sampler.start()
    j = n - 2  # chunk j is filled from level (N - 1 - j) * s = s
    torch.testing.assert_close((noise + dt[0, :, None, None, None] * target[0])[j * c:(j + 1) * c],
                               sampler.x[j * c:(j + 1) * c], rtol=1e-4, atol=1e-5)


def test_distillation_refuses_a_layout_other_than_the_buffer(tmp_path):
    VideoTrainer(small_cfg(tmp_path / "t", steps=1)).train()
    with pytest.raises(StreamStudioError, match="layout"):
        VideoTrainer(small_cfg(tmp_path / "s", mode="distill", teacher=str(tmp_path / "t" / "run"),
                               sampling={"num_chunks": 4, "chunk_size": 2, "micro_steps": 1}))


def test_init_starts_from_a_checkpoints_weights_with_the_window_mask(tmp_path):
    from streamstudio.models.video.stream_dit import BUILTIN_CHECKPOINT, load_builtin

    trainer = VideoTrainer(small_cfg(tmp_path, steps=0, init=str(BUILTIN_CHECKPOINT), buffer_frames=8, size=32))
    old, _ = load_builtin()
    assert old.cfg.shift_mask is False and trainer.model.cfg.shift_mask is True
    for a, b in zip(old.state_dict().values(), trainer.model.state_dict().values()):
        assert torch.equal(a, b)


def test_video_folder_data(tmp_path):
    av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")

    path = tmp_path / "clips" / "a_red_ball.mp4"
    path.parent.mkdir()
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
        for i in range(6):
            frame = np.zeros((32, 48, 3), np.uint8)
            frame[..., 0] = 200
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    data = VideoFolder(tmp_path / "clips", 16)
    clips, caps = data.batch(0, 2, 8)
    assert clips.shape == (2, 8, 3, 16, 16) and caps == ["a red ball"] * 2
    assert clips[:, :, 0].mean() > 0.3 and clips[:, :, 1].mean() < -0.7
    with pytest.raises(StreamStudioError, match="synthetic"):
        VideoFolder(tmp_path / "nothing", 16)


def test_init_can_keep_the_checkpoints_window_shift(tmp_path):
    from streamstudio.models.video.stream_dit import BUILTIN_CHECKPOINT

    trainer = VideoTrainer(small_cfg(tmp_path, steps=0, init=str(BUILTIN_CHECKPOINT), init_shift_mask=False,
                                     buffer_frames=8, size=32))
    assert trainer.model.cfg.shift_mask is False


def test_cond_drop_trains_the_empty_prompt_at_its_share(tmp_path):
    seen = {}
    for drop in (0.0, 0.3):
        trainer = VideoTrainer(small_cfg(tmp_path / str(drop), steps=40, batch_size=8, cond_drop=drop))
        prompts = []
        trainer.model.text.register_forward_pre_hook(lambda module, args: prompts.extend(args[0]))
        trainer.train()
        seen[drop] = sum(p == "" for p in prompts) / len(prompts)
    assert seen[0.0] == 0.0
    assert 0.2 < seen[0.3] < 0.4  # 320 captions, binomial sd 0.026
    with pytest.raises(StreamStudioError, match="cond-drop"):
        VideoTrainer(small_cfg(tmp_path / "bad", cond_drop=1.0))


def test_guided_velocity_is_classifier_free_guidance_against_the_empty_prompt():
    """Ho & Salimans: guidance 0 is the unconditional model (the empty prompt), 1 the conditional
    one, and the result is linear in the scale (2 extrapolates: 2 v_text - v_empty)."""
    from streamstudio.models.video.stream_dit import guided_velocity

    model = random_teacher(3)
    x, t = torch.randn(1, 4, 3, 16, 16), torch.rand(1, 4)
    text, empty = model.encode_text(["a red circle moving left"]), model.encode_text([""])
    with torch.no_grad():
        v_text, v_empty = model(x, t, text), model(x, t, empty)
        torch.testing.assert_close(guided_velocity(model, x, t, text, empty, 0.0), v_empty)
        torch.testing.assert_close(guided_velocity(model, x, t, text, empty, 1.0), v_text)
        torch.testing.assert_close(guided_velocity(model, x, t, text, empty, 2.0), 2 * v_text - v_empty)
        # the sampler's backbone guides against the empty prompt too
        backbone = StreamDiTBackbone(model, guidance=0.0)
        torch.testing.assert_close(backbone.velocity(x, t, backbone.encode_text("a red circle moving left")), v_empty)


def test_distillation_learns_the_guided_teacher(tmp_path):
    """With --teacher-guidance 0 the student's target is the teacher's unconditional sampler:
    teacher_target run on the empty prompt (and it differs from the unguided target)."""
    VideoTrainer(small_cfg(tmp_path / "t", steps=3)).train()
    targets = {}
    for g in (1.0, 0.0):
        trainer = VideoTrainer(small_cfg(tmp_path / f"s{g}", steps=1, mode="distill", teacher_guidance=g,
                                         teacher=str(tmp_path / "t" / "run"), teacher_steps=2,
                                         sampling={"num_chunks": 2, "chunk_size": 2, "micro_steps": 1}))
        captured = {}
        real = teacher_target

        def spy(teacher, x_a, t_a, dt, steps, text):
            captured["args"] = (x_a, t_a, dt, steps)
            captured["out"] = real(teacher, x_a, t_a, dt, steps, text)
            return captured["out"]

        import streamstudio.app.training.video as vt
        vt.teacher_target, saved = spy, vt.teacher_target
        try:
            x1, caps, gen = trainer._batch(0)
            trainer.distill_loss(x1, caps, gen)
        finally:
            vt.teacher_target = saved
        targets[g] = captured
    x_a, t_a, dt, steps = targets[0.0]["args"]
    teacher = VideoTrainer(small_cfg(tmp_path / "u", steps=0, mode="distill", teacher=str(tmp_path / "t" / "run"),
                                     sampling={"num_chunks": 2, "chunk_size": 2, "micro_steps": 1})).teacher
    with torch.no_grad():
        unconditional = real(teacher, x_a, t_a, dt, steps, teacher.encode_text([""] * x_a.shape[0]))
    torch.testing.assert_close(targets[0.0]["out"], unconditional)
    assert not torch.allclose(targets[1.0]["out"], unconditional, atol=1e-5)


def test_context_fade_fades_a_prefix_of_whole_chunks_at_its_share():
    gen = torch.Generator().manual_seed(0)
    chunk = torch.tensor([1, 2, 4, 8] * 100)
    fade = context_fade(gen, chunk, 8, 0.5)
    faded_rows = 0
    for row, c in zip(fade, chunk.tolist()):
        if c == 8:
            assert bool((row == 1).all())  # one chunk: nothing older to fade
            continue
        m = int((row < 1).sum())
        if m:
            faded_rows += 1
            assert m % c == 0 and m < 8  # whole chunks, and the newest chunk always kept
            assert bool((row[:m] == row[0]).all()) and bool((row[m:] == 1).all())  # the oldest, one factor
    assert 0.4 < faded_rows / 300 < 0.6  # binomial sd 0.029
    assert bool((context_fade(gen, chunk, 8, 0.0) == 1).all())


def test_context_fade_shows_faded_frames_and_leaves_them_out_of_the_loss(tmp_path):
    """A frame faded by 0 is its background colour alone (the shape is gone), one faded by a keeps
    a of its shape's contrast; the loss is the plain flow loss over the frames shown as they are."""
    trainer = VideoTrainer(small_cfg(tmp_path, batch_size=2, context_fade=1.0))
    draw = draw_flow(trainer.cfg, None, 0, 0)
    draw.fade = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0]])
    seen = {}

    def spy(module, args):
        seen["x"] = args[0].detach().clone()
    trainer.model.register_forward_pre_hook(spy)
    loss = trainer.flow_loss(draw)
    t = draw.levels[:, :, None, None, None]
    shown = (seen["x"] - (1 - t) * draw.noise) / t  # the clean frames the input was made of
    clip = draw.clips
    for f in (0, 1):  # faded by 0: one flat colour, the background (the value most pixels have)
        flat = clip[0, f].flatten(1).mode(dim=1).values[:, None, None].expand_as(clip[0, f])
        torch.testing.assert_close(shown[0, f], flat, atol=1e-4, rtol=0)
    bg = clip[1, 0].flatten(1).mode(dim=1).values[:, None, None]
    torch.testing.assert_close(shown[1, 0] - bg, 0.5 * (clip[1, 0] - bg), atol=1e-4, rtol=0)
    torch.testing.assert_close(shown[:, 2:], clip[:, 2:], atol=1e-4, rtol=0)
    with torch.no_grad():
        v = trainer.model(seen["x"], draw.levels, trainer.model.encode_text(draw.captions))
    err = (v - (clip - draw.noise)).pow(2).mean(dim=(2, 3, 4))  # (B, F)
    kept = torch.cat([err[0, 2:], err[1, 1:]])
    torch.testing.assert_close(loss.detach(), kept.mean(), rtol=1e-5, atol=1e-7)
    with pytest.raises(StreamStudioError, match="context-fade"):
        VideoTrainer(small_cfg(tmp_path / "bad", mode="distill", context_fade=0.3))


def test_context_fade_off_draws_what_runs_without_it_drew(tmp_path):
    a = draw_flow(small_cfg(tmp_path), None, 3, 0)
    b = draw_flow(small_cfg(tmp_path, context_fade=0.5), None, 3, 0)
    assert a.fade is None and b.fade is not None
    torch.testing.assert_close(a.noise, b.noise)
    torch.testing.assert_close(a.levels, b.levels)
