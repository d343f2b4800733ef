"""The video quality protocol (benchmarks/video_quality.py) and the built-in model against it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import video_quality as vq  # noqa: E402


def square_clip(positions: list[tuple[float, float]], size: int = 32, side: int = 8) -> list[np.ndarray]:
    """Frames with a white side x side square whose top-left corner is at each (x, y) (integers,
    wrapping around the edges) on a dark background."""
    frames = []
    for x, y in positions:
        f = np.full((size, size, 3), 20, np.uint8)
        rows = (np.arange(side) + int(y)) % size
        cols = (np.arange(side) + int(x)) % size
        f[np.ix_(rows, cols)] = 240
        frames.append(f)
    return frames


def test_protocol_is_44_renders_of_the_training_vocabulary():
    pairs = vq.protocol()
    assert len(pairs) == 44 and len(set(pairs)) == 44
    assert {p.split()[4] for p, _ in pairs} == {"left", "right", "up", "down"}
    assert len({p.split()[1] for p, _ in pairs}) == 7 and len({p.split()[2] for p, _ in pairs}) == 3
    assert vq.protocol(3) == [(p, 0) for p in vq.PROMPTS[:3]]
    held_out = vq.protocol(seeds=(7, 2024))  # the held-out seeds: every prompt with each
    assert len(held_out) == 44 and {s for _, s in held_out} == {7, 2024}


def test_held_out_prompts_are_others_of_the_same_vocabulary():
    """22 prompts none of the protocol's, every colour, shape and direction among them."""
    held = vq.HELD_OUT_PROMPTS
    assert len(held) == 22 and len(set(held)) == 22 and not set(held) & set(vq.PROMPTS)
    assert {p.split()[4] for p in held} == {"left", "right", "up", "down"}
    assert len({p.split()[1] for p in held}) == 7 and len({p.split()[2] for p in held}) == 3
    assert vq.protocol(seeds=(11, 12), prompts=held) == [(p, s) for p in held for s in (11, 12)]


def test_vanished_frames_are_counted_where_they_are_and_per_seed():
    """Blank frames 0, 1 and 5 of a clip: the summary says how many vanished at each frame index
    (the start-up diagnosis) and gives each seed's figures (the spread over seeds)."""
    clip = square_clip([(6 + i, 10) for i in range(8)])
    for i in (0, 1, 5):
        clip[i] = np.zeros_like(clip[i])
    a = vq.measure_video(clip, "a white square moving right", 7, chunk_size=2)
    b = vq.measure_video(square_clip([(6 + i, 10) for i in range(8)]), "a white square moving right", 11, 2)
    assert a.vanished_at == [0, 1, 5] and b.vanished_at == []
    summary = vq.summarize([a, b], chunk_size=2)
    assert summary["vanished_at_frame"] == {"0": 1, "1": 1, "5": 1}
    assert summary["by_seed"]["7"]["vanished_frames"] == 3 and summary["by_seed"]["11"]["vanished_frames"] == 0


def test_the_training_data_meets_every_target():
    """The data's own clips are the reference: every direction right, nothing vanishes, areas steady."""
    videos = [vq.measure_video(vq.data_clip(p, s), p, s, chunk_size=2) for p, s in vq.protocol()]
    summary = vq.summarize(videos, chunk_size=2)
    assert summary["direction"] == 44
    assert summary["vanished_frames"] == 0
    assert summary["area_cv"] < 0.05
    assert summary["backwards_steps"] == 0
    assert 0.8 < summary["seam_ratio"] < 1.2  # constant speed: no seam at any chunk size


def test_direction_speed_and_wrap_around_by_hand():
    # 2 px/frame to the left across the left edge (wraps to the right side)
    left = square_clip([(6 - 2 * i, 10) for i in range(12)])
    m = vq.measure_video(left, "a white square moving left", 0, chunk_size=1)
    assert m.direction_ok and m.along == pytest.approx(2.0) and m.across == pytest.approx(0.0, abs=1e-9)
    assert m.vanished == 0 and m.area_cv == pytest.approx(0.0) and m.backwards == 0
    # the same clip prompted "right" or "up" is wrong
    assert not vq.measure_video(left, "a white square moving right", 0, 1).direction_ok
    assert not vq.measure_video(left, "a white square moving up", 0, 1).direction_ok
    # too slow to count (0.125 px/frame on average)
    slow = square_clip([(10 + (i // 8), 10) for i in range(16)])
    assert not vq.measure_video(slow, "a white square moving right", 0, 1).direction_ok
    # mostly sideways: 1 px/frame down, 2 px/frame right, prompted down
    diag = square_clip([(2 * i, i) for i in range(12)])
    assert not vq.measure_video(diag, "a white square moving down", 0, 1).direction_ok


def test_seam_ratio_and_vanished_frames_by_hand():
    # chunks of 2 frames: 1 px inside a chunk, 3 px across chunk boundaries (motion in pairs)
    xs = [0]
    for i in range(15):
        xs.append(xs[-1] + (3 if (i + 1) % 2 == 0 else 1))
    clip = square_clip([(x, 12) for x in xs])
    m = vq.measure_video(clip, "a white square moving right", 0, chunk_size=2)
    assert m.boundary_jumps == pytest.approx([3.0] * 7) and m.inner_jumps == pytest.approx([1.0] * 8)
    assert vq.summarize([m], chunk_size=2)["seam_ratio"] == pytest.approx(3.0)
    assert vq.summarize([m], chunk_size=1)["seam_ratio"] is None  # c = 1: no in-chunk steps
    # two blank frames: vanished, and the area varies (CV of [64] * 10 + [0, 0])
    clip = square_clip([(i, 4) for i in range(12)])
    clip[5][:] = 20
    clip[6][:] = 20
    m = vq.measure_video(clip, "a white square moving right", 0, chunk_size=1)
    area = np.array([64.0] * 10 + [0.0] * 2)
    assert m.vanished == 2 and m.area_cv == pytest.approx(area.std() / area.mean())
    assert m.direction_ok  # the steps around the gap are left out, the rest move right by 1


@pytest.mark.slow  # 15 distillation steps and 12 renders: about a minute on one CPU thread
def test_distilled_student_is_closer_to_the_teacher_than_the_teacher_at_one_step(tmp_path):
    """Issue 18 item 1 at the video level: distil the built-in model (s0 micro-steps) into a
    student of its own layout (N, c) at s = 1; the student's videos must be closer to the
    teacher's at s0 than the teacher's own videos at s = 1 are (same prompts, seeds and noise)."""
    from streamstudio.app.training.video import VideoTrainConfig, VideoTrainer
    from streamstudio.models.video.stream_dit import BUILTIN_CHECKPOINT, read_checkpoint_config

    smp = read_checkpoint_config(BUILTIN_CHECKPOINT)["sampling"]
    n, c, s0 = smp["num_chunks"], smp["chunk_size"], 2  # the teacher at two micro-steps per chunk
    cfg = VideoTrainConfig(output=str(tmp_path / "student"), mode="distill", teacher=str(BUILTIN_CHECKPOINT),
                           teacher_steps=s0, steps=15, batch_size=4, buffer_frames=n * c, lr=2e-5, warmup=5,
                           min_lr_ratio=1.0, save_every=1000, seed=3, cpu=True, progress=False,
                           sampling={"num_chunks": n, "chunk_size": c, "micro_steps": 1})
    VideoTrainer(cfg).train()
    f = vq.distillation_figures(str(BUILTIN_CHECKPOINT), cfg.output, s0, vq.protocol(3), frames=16)
    assert f["student_s1_vs_teacher"] < f["teacher_s1_vs_teacher"], f


def test_builtin_model_moves_up_and_left_and_keeps_its_object():
    """Two protocol renders (the directions the old model missed most) of the built-in model at its
    own layout and guidance: each moves the prompted way and never loses its object."""
    from streamstudio.models.video.stream_dit import load_builtin

    model, meta = load_builtin()
    smp = meta["sampling"]
    layout = (smp["num_chunks"], smp["chunk_size"], smp["micro_steps"])
    for prompt in ("a blue triangle moving up", "a red circle moving left"):
        v = vq.measure_video(vq.render_model(model, meta, prompt, 0, layout, frames=24), prompt, 0, layout[1])
        assert v.direction_ok and v.vanished == 0, v


@pytest.mark.slow  # 8 renders of 32 frames: about half a minute on one CPU thread
def test_builtin_model_moves_as_prompted_without_paired_motion():
    """A few protocol renders of the built-in model at its own layout: they move the prompted way
    (44/44 on the whole protocol) and keep their object, and motion does not arrive in pairs of
    frames (the seam of c = 2: jumps alternate big, small); with c = 1 the jumps at even and odd
    steps are alike (within the seam target of 1.3x)."""
    import math

    from streamstudio.models.video.stream_dit import load_builtin

    model, meta = load_builtin()
    smp = meta["sampling"]
    layout = (smp["num_chunks"], smp["chunk_size"], smp["micro_steps"])
    videos, phase = [], [[], []]
    for prompt, seed in vq.protocol(8):
        frames = vq.render_model(model, meta, prompt, seed, layout)
        videos.append(vq.measure_video(frames, prompt, seed, layout[1]))
        cents = [vq.torus_centroid(f.max(-1) > vq.BRIGHT) if (f.max(-1) > vq.BRIGHT).sum() >= 10 else None
                 for f in frames]
        for i in range(len(frames) - 1):
            if cents[i] is not None and cents[i + 1] is not None:
                dx = vq.wrap(cents[i + 1][0] - cents[i][0], 32)
                dy = vq.wrap(cents[i + 1][1] - cents[i][1], 32)
                phase[i % 2].append(math.hypot(dx, dy))
    summary = vq.summarize(videos, layout[1])
    assert summary["direction"] >= 7 and summary["vanished_frames"] == 0, summary
    pairing = np.mean(phase[0]) / np.mean(phase[1])
    assert 1 / 1.3 <= pairing <= 1.3, pairing
    if summary["seam_ratio"] is not None:
        assert summary["seam_ratio"] <= 1.3, summary


# Renders whose first frames lost the object with the paper's start (issue 30: frames 0-1, 2-3 and
# 5-6 of these were empty); seeds 6, 7 and 9 are held-out seeds, not used to choose the warm-up.
STARTUP_CASES = (("a blue square moving left", 7), ("a magenta square moving down", 6),
                 ("a green triangle moving left", 9))


def test_builtin_model_shows_its_object_from_the_first_frame():
    """The built-in model as `render --pipeline video` builds it (32x32 output): each of the first 8
    frames shows its object, counted directly on the pixels: at least 1% of the frame brighter
    than 100 in some channel (the synthetic backgrounds are dark, the smallest object covers about
    4%). Without the warm-up at least one of these frames is empty (so the check can fail)."""
    from streamstudio.app.streams.video import build_stream
    from streamstudio.models.video.stream_dit import load_builtin

    model, meta = load_builtin()

    def empty_frames(prompt: str, seed: int, warmup: bool | None) -> list[int]:
        stream = build_stream(model, meta, prompt, seed=seed, width=32, height=32, warmup=warmup)
        frames = list(stream.frames(8))
        assert len(frames) == 8 and frames[0].shape == (32, 32, 3)
        return [i for i, f in enumerate(frames) if (f.max(-1) > 100).sum() < 0.01 * 32 * 32]

    for prompt, seed in STARTUP_CASES:
        assert empty_frames(prompt, seed, None) == [], (prompt, seed)  # the default: warm-up on
    assert any(empty_frames(p, s, False) for p, s in STARTUP_CASES)


# The weak case before the faded-context fine-tune (issue 30): the white triangle moving left lost
# its object for many frames on these noise seeds (49 a tuning seed, 84 a held-out one).
WEAK_CASES = (("a white triangle moving left", 49), ("a white triangle moving left", 84))


def weak_case_losses(model, meta) -> dict[int, list[int]]:
    """{seed: the frames without the object} of each weak case at the model's own sampler."""
    smp = meta["sampling"]
    layout = (smp["num_chunks"], smp["chunk_size"], smp["micro_steps"])
    out = {}
    for prompt, seed in WEAK_CASES:
        out[seed] = vq.measure_video(vq.render_model(model, meta, prompt, seed, layout), prompt, seed,
                                     layout[1]).vanished_at
    return out


def test_builtin_model_keeps_the_white_triangle_on_the_seeds_that_lost_it():
    """The built-in model keeps its object in all 32 frames of each weak case (the weights before
    `--context-fade`, commit 8f7a13c's, lost it in 15 of the 32 frames on each seed)."""
    from streamstudio.models.video.stream_dit import load_builtin

    assert weak_case_losses(*load_builtin()) == {49: [], 84: []}


def test_quality_run_in_workers_with_another_solver_equals_one_process(tmp_path):
    """`--workers 2` renders the same videos as one process, and `--solver` reaches the sampler
    (its label and layout say so; ab2 renders other frames than the checkpoint's euler)."""
    import json

    out = tmp_path / "q.json"
    vq.main(["--subset", "2", "--solver", "ab2", "--workers", "2", "--label", "w2", "--output", str(out)])
    vq.main(["--subset", "2", "--solver", "ab2", "--output", str(out)])
    vq.main(["--subset", "2", "--label", "euler", "--output", str(out)])
    vq.main(["--subset", "2", "--label", "clip", "--clip-sample", "on", "--output", str(out)])
    runs = {k.split(" (subset")[0]: v for k, v in json.loads(out.read_text())["runs"].items()}
    assert "clip_sample" in runs.pop("clip")["layout"]
    one = next(k for k in runs if k not in ("w2", "euler"))
    assert "ab2" in one and "solver ab2" in runs[one]["layout"] and "solver" not in runs["euler"]["layout"]
    assert runs["w2"]["videos"] == runs[one]["videos"]
    assert [v["area_cv"] for v in runs["euler"]["videos"]] != [v["area_cv"] for v in runs[one]["videos"]]
