"""Sources and sinks: file round trips (count, fps, duration, audio), HLS, image sequences,
and bad or unusual inputs (missing, not video, truncated, no frames, grayscale, odd, huge)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image
from clips import (
    make_clip,
    make_no_frames_clip,
    make_vfr_clip,
    probe,
    rotate_mp4,
)

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.resample import ResampledSource, resample_file
from streamstudio.streaming.sinks import HlsSink, open_sink
from streamstudio.streaming.sources import (
    MAX_SIDE,
    ArraySource,
    ImageSequenceSource,
    PatternSource,
    VideoFileSource,
    open_source,
    to_rgb_frame,
)


def copy_through(src_spec, out, **sink_kw):
    """Source -> sink with no processing; returns the source (closed)."""
    with open_source(src_spec) as src:
        sink = open_sink(str(out), src.info.width, src.info.height, src.info.fps, **sink_kw)
        with sink:
            for f in src.frames():
                sink.write(f.image, f.pts)
    return src


@pytest.mark.parametrize("suffix", [".mp4", ".mkv", ".webm"])
def test_file_round_trip_keeps_count_fps_duration_and_audio(tmp_path, suffix):
    clip = make_clip(tmp_path / "in.mp4", n=30, fps=15, audio=True)
    src_probe = probe(clip)
    with open_source(str(clip)) as src:
        assert src.info.audio is not None and src.info.audio.codec == "aac"
        sink = open_sink(str(tmp_path / f"out{suffix}"), src.info.width, src.info.height, src.info.fps,
                         audio_from=src.info.audio)
        with sink:
            for f in src.frames():
                sink.write(f.image, f.pts)
    out = probe(tmp_path / f"out{suffix}")
    assert out.frames == 30
    assert out.fps == pytest.approx(15, rel=0.01)
    assert out.video_pts == pytest.approx(src_probe.video_pts, abs=1e-3)
    assert out.duration == pytest.approx(2.0, abs=0.05)
    assert out.audio_codec == ("opus" if suffix == ".webm" else "aac")  # webm cannot hold AAC: re-encoded
    assert out.audio_duration == pytest.approx(src_probe.audio_duration, abs=0.05)
    # in sync: audio starts with the video, as in the source
    assert out.audio_start - out.video_pts[0] == pytest.approx(src_probe.audio_start - src_probe.video_pts[0], abs=0.03)
    # the picture survives: the red channel carries the frame index
    assert abs(int(out.first[..., 0].mean()) - 0) < 12


def test_a_video_file_appears_whole_at_close_and_an_empty_one_not_at_all(tmp_path):
    """The video is written beside its name and moved into place at close: the file already at
    that name stays whole while the new one is written, and a sink closed with no frame leaves
    no file."""
    out = tmp_path / "clip.mp4"
    out.write_bytes(b"the previous render")
    sink = open_sink(str(out), 32, 32, 10.0)
    for i in range(3):
        sink.write(np.full((32, 32, 3), 40 * i, np.uint8))
    assert out.read_bytes() == b"the previous render"  # untouched until the new file is complete
    sink.close()
    assert not list(tmp_path.glob(".*partial*"))
    with open_source(str(out)) as src:
        assert src.info.frame_count == 3
    empty = open_sink(str(tmp_path / "empty.mp4"), 32, 32, 10.0)
    empty.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4"]


def test_audio_is_cut_at_the_video_end_when_stopped_early(tmp_path):
    clip = make_clip(tmp_path / "in.mp4", n=45, fps=15, audio=True)
    with open_source(str(clip)) as src:
        with open_sink(str(tmp_path / "out.mp4"), 64, 48, 15, audio_from=src.info.audio) as sink:
            for f in src.frames():
                if f.index == 15:
                    break
                sink.write(f.image, f.pts)
    out = probe(tmp_path / "out.mp4")
    assert out.frames == 15
    assert out.audio_duration == pytest.approx(1.0, abs=0.06)


def test_variable_frame_rate_timestamps_are_kept(tmp_path):
    times_ms = [0, 40, 50, 200, 230, 500]
    clip = make_vfr_clip(tmp_path / "vfr.mkv", times_ms)
    with open_source(str(clip)) as src:
        pts = [f.pts for f in src.frames()]
    assert pts == pytest.approx([t / 1000 for t in times_ms], abs=1e-3)
    copy_through(str(clip), tmp_path / "out.mkv")
    assert probe(tmp_path / "out.mkv").video_pts == pytest.approx([t / 1000 for t in times_ms], abs=2e-3)


def test_rotation_metadata_is_applied(tmp_path):
    clip = make_clip(tmp_path / "wide.mp4", n=3, w=32, h=16)
    rotated = rotate_mp4(clip, tmp_path / "portrait.mp4")
    with open_source(str(rotated)) as src:
        assert (src.info.width, src.info.height, src.info.rotation) == (16, 32, 90)
        image = next(src.frames()).image
    assert image.shape == (32, 16, 3)
    with open_source(str(clip)) as src:
        plain = next(src.frames()).image
    # turned clockwise: the plain frame's first row is the rotated frame's last column
    assert np.abs(image[:, -1].astype(int) - plain[0].astype(int)).mean() < 10


def test_grayscale_video_gives_rgb_frames(tmp_path):
    clip = make_clip(tmp_path / "gray.mkv", n=5, codec="ffv1", pix_fmt="gray", gray=True)
    with open_source(str(clip)) as src:
        frames = [f.image for f in src.frames()]
    assert len(frames) == 5 and frames[0].shape == (48, 64, 3) and frames[0].dtype == np.uint8
    assert np.array_equal(frames[2][..., 0], frames[2][..., 1])


def test_odd_size_video_is_padded_to_even_for_yuv420(tmp_path):
    clip = make_clip(tmp_path / "odd.mkv", n=6, w=63, h=47, codec="ffv1", pix_fmt="yuv444p")
    with open_source(str(clip)) as src:
        assert (src.info.width, src.info.height) == (63, 47)
    copy_through(str(clip), tmp_path / "out.mp4")
    out = probe(tmp_path / "out.mp4")
    assert (out.width, out.height, out.frames) == (64, 48, 6)


def test_very_large_frames_are_downscaled(tmp_path):
    big = np.zeros((3000, 5000, 3), np.uint8)
    big[:, 2500:] = 200
    Image.fromarray(big).save(tmp_path / "big.jpg", quality=70)
    with open_source(str(tmp_path / "big.jpg")) as src:
        image = next(src.frames()).image
    assert image.shape == (round(3000 * MAX_SIDE / 5000), MAX_SIDE, 3)
    clip = make_clip(tmp_path / "big.mp4", n=2, w=2560, h=1440, options={"preset": "ultrafast"})
    with open_source(str(clip)) as src:
        assert (src.info.width, src.info.height) == (2048, 1152)
        assert next(src.frames()).image.shape == (1152, 2048, 3)


def test_to_rgb_frame_handles_gray_alpha_and_float():
    assert to_rgb_frame(np.zeros((4, 6), np.uint8)).shape == (4, 6, 3)
    assert to_rgb_frame(np.zeros((4, 6, 4), np.uint8)).shape == (4, 6, 3)
    assert to_rgb_frame(np.ones((4, 6, 1), np.float32))[0, 0, 0] == 255
    with pytest.raises(StreamStudioError):
        to_rgb_frame(np.zeros((4, 6, 2), np.uint8))


def test_image_folder_and_glob(tmp_path):
    for i in range(4):
        Image.fromarray(np.full((20, 30), i * 50, np.uint8)).save(tmp_path / f"img_{i:02d}.png")  # grayscale
    (tmp_path / "notes.txt").write_text("not an image")
    with open_source(str(tmp_path), fps=10) as src:
        frames = list(src.frames())
    assert [f.pts for f in frames] == pytest.approx([0, 0.1, 0.2, 0.3])
    assert frames[3].image.shape == (20, 30, 3) and frames[3].image[0, 0, 0] == 150
    with open_source(str(tmp_path / "img_0[12].png")) as src:
        assert src.info.frame_count == 2


def test_pattern_spec_and_motion():
    src = open_source("pattern:48x32@12", realtime=False)
    assert (src.info.width, src.info.height, src.info.fps, src.info.live) == (48, 32, 12.0, False)
    it = src.frames()
    a, b = next(it), next(it)
    assert a.image.shape == (32, 48, 3) and b.pts == pytest.approx(1 / 12)
    assert not np.array_equal(a.image, b.image)
    assert open_source("pattern").info.live  # paced by default


@pytest.mark.parametrize("spec, message", [
    ("missing.mp4", "does not exist"),
    ("webcam:x", "webcam:N"),
    ("", "no input"),
    ("empty_dir", "no images"),
])
def test_bad_source_specs_raise_clear_errors(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(StreamStudioError, match=message):
        open_source(spec)


def test_missing_webcam_is_a_clear_error():
    with pytest.raises(StreamStudioError, match="no webcam at index 97"):
        open_source("webcam:97")


def test_not_a_video_file(tmp_path):
    bad = tmp_path / "notes.mp4"
    bad.write_text("this is not a video\n" * 50)
    with pytest.raises(StreamStudioError, match="not a readable video"):
        open_source(str(bad))


def test_video_with_no_frames(tmp_path):
    clip = make_no_frames_clip(tmp_path / "empty.mkv")
    with pytest.raises(StreamStudioError, match="no frames"):
        open_source(str(clip))


def test_truncated_mp4_gives_the_frames_before_the_damage(tmp_path):
    clip = make_clip(tmp_path / "full.mp4", n=60, fps=15, options={"movflags": "faststart"})
    data = clip.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 6 // 10])
    with open_source(str(cut)) as src:
        frames = list(src.frames())
    assert 3 <= len(frames) < 60
    assert any("truncated" in w for w in src.warnings)
    # and a truncated file whose index (moov) is missing is a clear error
    late = make_clip(tmp_path / "late.mp4", n=30)
    late_cut = tmp_path / "late_cut.mp4"
    late_cut.write_bytes(late.read_bytes()[: late.stat().st_size // 2])
    with pytest.raises(StreamStudioError):
        open_source(str(late_cut))


def test_image_sequence_sink_and_pattern(tmp_path):
    src = ArraySource([np.full((9, 11, 3), i, np.uint8) for i in range(3)], fps=5)
    with open_sink(str(tmp_path / "frames"), 11, 9, 5) as sink:
        for f in src.frames():
            sink.write(f.image, f.pts)
    files = sorted((tmp_path / "frames").iterdir())
    assert [p.name for p in files] == ["frame_000000.png", "frame_000001.png", "frame_000002.png"]
    assert np.asarray(Image.open(files[2]))[0, 0, 0] == 2
    with open_sink(str(tmp_path / "seq" / "%03d.jpg"), 11, 9, 5) as sink:
        sink.write(np.zeros((9, 11, 3), np.uint8))
    assert (tmp_path / "seq" / "000.jpg").exists()


def test_hls_playlist_is_valid(tmp_path):
    src = PatternSource(64, 48, fps=10, count=45, realtime=False)
    with open_sink(f"hls:{tmp_path / 'hls'}", 64, 48, 10) as sink:
        assert isinstance(sink, HlsSink)
        for f in src.frames():
            sink.write(f.image, f.pts)
    text = (tmp_path / "hls" / "index.m3u8").read_text()
    lines = text.splitlines()
    assert lines[0] == "#EXTM3U" and "#EXT-X-ENDLIST" in lines
    target = int(re.search(r"#EXT-X-TARGETDURATION:(\d+)", text).group(1))
    durations = [float(m) for m in re.findall(r"#EXTINF:([\d.]+),", text)]
    segments = [ln for ln in lines if ln and not ln.startswith("#")]
    assert len(segments) == len(durations) >= 2
    assert sum(durations) == pytest.approx(4.5, abs=0.15)
    assert all(d <= target + 0.5 for d in durations)
    total = 0
    for name in segments:
        assert (tmp_path / "hls" / name).stat().st_size > 0
        total += probe(tmp_path / "hls" / name).frames
    assert total == 45


def test_unknown_output_is_a_clear_error(tmp_path):
    with pytest.raises(StreamStudioError, match="unknown output"):
        open_sink(str(tmp_path / "out.xyz"), 64, 64, 30)
    with pytest.raises(StreamStudioError, match="bad RTMP url"):
        open_sink("rtmp://127.0.0.1", 64, 64, 30)


def test_optional_extras_fail_clearly_when_missing():
    try:
        import pyvirtualcam  # noqa: F401
    except ImportError:
        with pytest.raises(StreamStudioError, match="pip install"):
            open_sink("virtualcam", 64, 64, 30)
    try:
        import mss  # noqa: F401
    except ImportError:
        with pytest.raises(StreamStudioError, match="pip install"):
            open_source("screen")


def test_video_file_source_reports_audio_track(tmp_path):
    clip = make_clip(tmp_path / "a.mp4", n=15, fps=15, audio=True)
    src = VideoFileSource(clip)
    try:
        assert src.info.audio.sample_rate == 44100 and src.info.audio.channels == 1
        assert src.info.frame_count == 15 and src.info.duration == pytest.approx(1.0, abs=0.05)
    finally:
        src.close()


# ---------------------------------------------------------------------------- --fps on files: resampling
def red_index(image):
    """The clip frame number a test clip's frame carries in its red channel (see frame_image)."""
    return round(float(np.median(image[..., 0])) / 8)


def test_resampler_takes_the_latest_frame_at_each_tick():
    times = [0.0, 0.05, 0.12, 0.3, 0.31, 0.45]  # uneven: a burst, a gap, two frames 10 ms apart
    images = [np.full((4, 4, 3), i, np.uint8) for i in range(len(times))]

    def resampled(fps, timestamps=times):
        src = ResampledSource(ArraySource(images[: len(timestamps)], fps=10, timestamps=timestamps), fps)
        return src, list(src.frames())

    src, down = resampled(5)  # ticks 0, 0.2, 0.4; the last frame (0.45) lasts to 0.55
    assert (src.info.fps, src.info.frame_count) == (5.0, 3) and "resampled to 5 fps" in src.info.description
    assert [int(f.image[0, 0, 0]) for f in down] == [0, 2, 4]
    assert [f.pts for f in down] == pytest.approx([0.0, 0.2, 0.4]) and [f.index for f in down] == [0, 1, 2]
    _, up = resampled(20)  # ticks every 0.05 s up to 0.5
    assert [int(f.image[0, 0, 0]) for f in up] == [0, 1, 1, 2, 2, 2, 3, 4, 4, 5, 5]
    assert [f.pts for f in up] == pytest.approx([k / 20 for k in range(11)])
    assert not np.shares_memory(up[1].image, up[2].image)  # a repeat is a copy
    _, late = resampled(10, [0.1, 0.2])  # ticks before the first frame show the first frame
    assert [int(f.image[0, 0, 0]) for f in late] == [0, 0, 1]


@pytest.mark.parametrize("fps", [6, 24])
def test_file_resampled_to_another_rate_keeps_duration_and_audio(tmp_path, fps):
    clip = make_clip(tmp_path / "in.mp4", n=12, fps=12, audio=True)  # 1 s
    count = fps  # one second at the new rate
    seen = []
    with resample_file(open_source(str(clip)), fps) as src:
        assert isinstance(src, ResampledSource) and (src.info.fps, src.info.frame_count) == (fps, count)
        with open_sink(str(tmp_path / "out.mp4"), src.info.width, src.info.height, fps,
                       audio_from=src.info.audio) as sink:
            for f in src.frames():
                seen.append((f.pts, red_index(f.image)))
                sink.write(f.image, f.pts)
    assert [pts for pts, _ in seen] == pytest.approx([k / fps for k in range(count)])
    assert [i for _, i in seen] == [k * 12 // fps for k in range(count)]  # every 2nd frame, or each twice
    out = probe(tmp_path / "out.mp4")
    assert out.frames == count and out.fps == pytest.approx(fps, rel=0.01)
    video_end = out.video_pts[-1] + 1 / fps
    assert video_end == pytest.approx(1.0, abs=1e-3)
    assert out.audio_duration == pytest.approx(video_end, abs=0.05)


def test_only_video_files_at_another_rate_are_resampled(tmp_path):
    clip = make_clip(tmp_path / "in.mp4", n=3, fps=12)
    with open_source(str(clip)) as src:
        assert resample_file(src, 12) is src and resample_file(src, None) is src
    with VideoFileSource(clip, live=True) as live:  # how network streams are opened
        assert resample_file(live, 6) is live
        with pytest.raises(StreamStudioError, match="live"):
            ResampledSource(live, 6)
    pattern = open_source("pattern:32x32", fps=10)
    assert resample_file(pattern, 10) is pattern and pattern.info.fps == 10
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    folder = open_source(str(tmp_path / "*.png"), fps=5)
    assert isinstance(folder, ImageSequenceSource) and resample_file(folder, 5) is folder


def test_splat_path_source_renders_each_camera_at_its_time_in_order():
    from streamstudio.streaming.generated import SplatPathSource

    calls = []

    def render(camera, t):
        calls.append((camera, t))
        return np.full((6, 8, 3), camera, np.uint8)

    source = SplatPathSource(render, [10, 20, 30], [None, 0.5, 1.0], fps=4, width=8, height=6)
    frames = list(source.frames())
    assert calls == [(10, None), (20, 0.5), (30, 1.0)]
    assert [(f.index, f.pts, int(f.image[0, 0, 0])) for f in frames] == [(0, 0.0, 10), (1, 0.25, 20), (2, 0.5, 30)]
    assert (source.info.frame_count, source.info.duration, source.info.live) == (3, 0.75, False)
    wrong = SplatPathSource(lambda camera, t: np.zeros((6, 6, 3), np.uint8), [1], [None], fps=4, width=8, height=6)
    with pytest.raises(StreamStudioError, match="expected uint8"):
        list(wrong.frames())
    with pytest.raises(StreamStudioError, match="one time per camera"):
        SplatPathSource(render, [1, 2], [None], fps=4, width=8, height=6)
