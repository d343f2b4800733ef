"""StreamDiT training: mixed partitioning, loss falls, resume continues, distillation, data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from streamstudio.errors import StreamStudioError
from streamstudio.models.video_data import COLOURS, VideoFolder, random_spec, render_shape_clip, synthetic_batch
from streamstudio.app.video_training import VideoTrainConfig, VideoTrainer, partition_levels


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


def test_distillation_runs_from_a_teacher(tmp_path):
    VideoTrainer(small_cfg(tmp_path / "t", steps=4)).train()
    cfg = small_cfg(tmp_path / "s", steps=4, mode="distill", teacher=str(tmp_path / "t" / "run"), teacher_steps=2)
    losses = VideoTrainer(cfg).train()
    assert len(losses) == 4 and all(np.isfinite(losses))
    with pytest.raises(StreamStudioError, match="teacher"):
        VideoTrainer(small_cfg(tmp_path / "x", mode="distill"))


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
