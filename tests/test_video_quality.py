"""The video quality protocol (benchmarks/video_quality.py) and the built-in model against it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
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
