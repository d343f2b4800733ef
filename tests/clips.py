"""Test clips written with PyAV (no binary fixtures), shared by the streaming and render tests,
and the probes that check what a sink wrote."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")

SAMPLE_RATE = 44100


def frame_image(i: int, w: int, h: int) -> np.ndarray:
    """A frame whose red channel encodes its index (i * 8), with a moving white bar."""
    img = np.zeros((h, w, 3), np.uint8)
    img[:, :, 0] = (i * 8) % 256
    x = (i * 2) % max(1, w - 4)
    img[h // 4: h // 2, x: x + 4] = 255
    return img


def make_clip(path, n=30, fps=15, w=64, h=48, audio=False, codec="libx264", pix_fmt="yuv420p",
              options=None, gray=False) -> Path:
    """n frames (and optionally a 440 Hz mono AAC track as long as the video)."""
    path = Path(path)
    container = av.open(str(path), "w", options=options or {})
    v = container.add_stream(codec, rate=fps)
    v.width, v.height, v.pix_fmt = w, h, pix_fmt
    a = None
    if audio:
        a = container.add_stream("aac", rate=SAMPLE_RATE)
        a.layout = "mono"
    for i in range(n):
        img = frame_image(i, w, h)
        if gray:
            frame = av.VideoFrame.from_ndarray(img[:, :, 0].copy(), format="gray")
        else:
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
        for p in v.encode(frame):
            container.mux(p)
    if a is not None:
        _write_tone(container, a, n / fps)
    for p in v.encode(None):
        container.mux(p)
    container.close()
    return path


def _write_tone(container, stream, seconds: float) -> None:
    total = int(SAMPLE_RATE * seconds)
    write_audio(container, stream, (0.3 * np.sin(2 * np.pi * 440 * np.arange(total) / SAMPLE_RATE)), SAMPLE_RATE)


def write_audio(container, stream, samples: np.ndarray, rate: int) -> None:
    """Mono `samples` (floats in [-1, 1]) encoded into `stream` of `container` in 1024-sample frames."""
    x = np.asarray(samples, np.float32)
    for s in range(0, len(x), 1024):
        frame = av.AudioFrame.from_ndarray(x[None, s: s + 1024], format="flt", layout="mono")
        frame.sample_rate, frame.pts = rate, s
        for p in stream.encode(frame):
            container.mux(p)
    for p in stream.encode(None):
        container.mux(p)


def make_vfr_clip(path, pts_ms: list[int], w=32, h=32) -> Path:
    """A clip with the given frame times in milliseconds (variable frame rate, mkv)."""
    from fractions import Fraction

    container = av.open(str(path), "w")
    v = container.add_stream("ffv1", rate=30)
    v.width, v.height, v.pix_fmt = w, h, "yuv444p"
    v.codec_context.time_base = Fraction(1, 1000)
    v.time_base = Fraction(1, 1000)
    for i, t in enumerate(pts_ms):
        frame = av.VideoFrame.from_ndarray(frame_image(i, w, h), format="rgb24")
        frame.pts, frame.time_base = t, Fraction(1, 1000)
        for p in v.encode(frame):
            container.mux(p)
    for p in v.encode(None):
        container.mux(p)
    container.close()
    return Path(path)


def make_no_frames_clip(path) -> Path:
    """A video stream with no frames (only audio packets are in the file)."""
    container = av.open(str(path), "w")
    v = container.add_stream("mpeg4", rate=10)
    v.width, v.height, v.pix_fmt = 32, 32, "yuv420p"
    a = container.add_stream("aac", rate=SAMPLE_RATE)
    a.layout = "mono"
    _write_tone(container, a, 0.5)
    container.close()
    return Path(path)


def rotate_mp4(src, dst, clockwise_90: bool = True) -> Path:
    """Copy an mp4, setting its video track's display matrix to a 90 degree turn (as phones do)."""
    data = bytearray(Path(src).read_bytes())
    i = data.find(b"tkhd")
    version = data[i + 4]
    off = i + 4 + 4 + (20 if version == 0 else 32) + 16
    b = 1 << 16 if clockwise_90 else -(1 << 16)
    struct.pack_into(">9i", data, off, 0, b, 0, -b, 0, 0, 0, 0, 1 << 30)
    Path(dst).write_bytes(bytes(data))
    return Path(dst)


@dataclass
class Probe:
    frames: int
    fps: float
    duration: float  # container duration, s
    width: int
    height: int
    video_pts: list[float]
    audio_codec: str | None = None
    audio_duration: float | None = None  # decoded samples / rate
    audio_start: float | None = None  # time of the first decoded audio frame
    first: np.ndarray | None = None


def probe(path) -> Probe:
    with av.open(str(path)) as c:
        v = c.streams.video[0]
        fps = float(v.average_rate or v.guessed_rate or 0)
        frames = list(c.decode(video=0))
        duration = c.duration / 1e6 if c.duration else 0.0
    result = Probe(frames=len(frames), fps=fps, duration=duration, width=frames[0].width if frames else 0,
                   height=frames[0].height if frames else 0, video_pts=[float(f.time) for f in frames],
                   first=frames[0].to_ndarray(format="rgb24") if frames else None)
    with av.open(str(path)) as c:
        if c.streams.audio:
            a = c.streams.audio[0]
            rate = a.codec_context.sample_rate
            frames = list(c.decode(audio=0))
            samples = sum(f.samples for f in frames)
            result.audio_codec, result.audio_duration = a.codec_context.name, samples / rate
            result.audio_start = float(frames[0].time) if frames and frames[0].time is not None else None
    return result


def decoded(path):
    """(frame times, RGB frames, audio samples) of a file."""
    with av.open(str(path)) as c:
        frames = [(round(float(f.time), 4), f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
    with av.open(str(path)) as c:
        samples = sum(f.samples for f in c.decode(audio=0)) if c.streams.audio else 0
    return [t for t, _ in frames], [f for _, f in frames], samples


def assert_same_frames(got, want, near: int = 0) -> None:
    """Two files hold the same frames at the same times, and as much audio: bitwise, or with `near`
    each frame within `near` levels and within a quarter level on average (a compressed file whose
    frames differed by a rounding before the encoder: the encoder spreads it over a few levels)."""
    (t1, f1, a1), (t2, f2, a2) = decoded(got), decoded(want)
    assert t1 == t2 and a1 == a2
    assert len(f1) == len(f2)
    diffs = [np.abs(x.astype(int) - y) for x, y in zip(f1, f2)]
    differ = {i: int(d.max()) for i, d in enumerate(diffs) if d.max() > near or d.mean() > (0.25 if near else 0)}
    assert differ == {}, f"frames that differ (largest difference): {differ}"
