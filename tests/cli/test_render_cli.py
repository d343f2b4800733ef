"""`streamstudio render` end to end with the tiny model: frame-aligned files with audio, live
pattern input, --config, --prompt-schedule, --pipeline video dispatch, and user errors printed
without a traceback."""

from __future__ import annotations

import sys
import time
import types

import pytest
from helpers import recorded_runners
from clips import make_clip, make_no_frames_clip, probe

from streamstudio.app import cli

TINY = ["--model", "tiny", "--device", "cpu"]


@pytest.fixture(autouse=True)
def only_render_command(monkeypatch):
    """The real CLI entry point (error printing, exit codes) without importing every other command."""
    monkeypatch.setattr(cli, "COMMANDS", {"render": "render"})


def render(*argv: str) -> int:
    return cli.main(["render", *argv])


def test_file_render_is_frame_aligned_with_audio(tmp_path, capsys):
    clip = make_clip(tmp_path / "in.mp4", n=12, fps=12, audio=True)
    out = tmp_path / "out.mp4"
    rc = render("--input", str(clip), "--output", str(out), "--prompt", "a cat", "--steps", "2", *TINY)
    assert rc == 0
    err = capsys.readouterr().err
    assert "frame latency 1" in err and "12 in, 12 out" in err
    got, ref = probe(out), probe(clip)
    assert (got.frames, got.width, got.height) == (12, 64, 48)  # the clip's 4:3, the tiny model's 64 long side
    assert got.video_pts == pytest.approx(ref.video_pts, abs=1e-3)
    assert got.duration == pytest.approx(1.0, abs=0.03)
    assert got.audio_codec == "aac" and got.audio_duration == pytest.approx(ref.audio_duration, abs=0.03)


@pytest.mark.parametrize("fps", [6, 24])
def test_fps_resamples_a_file_keeping_its_duration_and_audio(tmp_path, capsys, fps):
    clip = make_clip(tmp_path / "in.mp4", n=12, fps=12, audio=True)  # 1 s
    out = tmp_path / "out.mp4"
    rc = render("--input", str(clip), "--output", str(out), "--fps", str(fps), "--steps", "1", *TINY)
    assert rc == 0
    assert f"resampled to {fps} fps" in capsys.readouterr().err
    got = probe(out)
    assert got.frames == fps and got.fps == pytest.approx(fps, rel=0.01)  # half or twice the 12 frames
    assert got.video_pts == pytest.approx([k / fps for k in range(fps)], abs=1e-3)
    video_end = got.video_pts[-1] + 1 / fps
    assert video_end == pytest.approx(1.0, abs=1e-3)
    assert got.audio_codec == "aac" and got.audio_duration == pytest.approx(video_end, abs=0.05)


def test_live_mode_on_a_file_keeps_its_audio(tmp_path, capsys):
    """--mode live plays a file at its own pace, dropping frames it cannot keep up with; the
    kept frames carry their input's timestamps, so the copied audio stays in step."""
    clip = make_clip(tmp_path / "in.mp4", n=12, fps=12, audio=True)  # 1 s
    out = tmp_path / "out.mp4"
    rc = render("--input", str(clip), "--output", str(out), "--mode", "live", "--steps", "1", *TINY)
    assert rc == 0
    assert "(live," in capsys.readouterr().err
    got, ref = probe(out), probe(clip)
    assert 1 <= got.frames <= 12
    assert set(round(t, 3) for t in got.video_pts) <= set(round(t, 3) for t in ref.video_pts)  # input times
    assert got.audio_codec == "aac" and got.audio_duration == pytest.approx(ref.audio_duration, abs=0.1)


def test_fps_resamples_the_video_pipelines_input(tmp_path, capsys):
    clip = make_clip(tmp_path / "in.mp4", n=8, fps=8)
    out = tmp_path / "out.mp4"
    rc = render("--pipeline", "video", "--input", str(clip), "--output", str(out), "--fps", "16",
                "--prompt", "a blue circle moving right", "--width", "32", "--height", "32",
                "--num-chunks", "2", "--chunk-size", "2", "--model", "tiny")
    assert rc == 0
    got = probe(out)
    assert got.frames == 16 and got.fps == pytest.approx(16, rel=0.01)


def test_live_pattern_with_config_and_prompt_schedule(tmp_path, capsys, monkeypatch):
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion

    prompts = []
    original = StreamDiffusion.set_prompt
    monkeypatch.setattr(StreamDiffusion, "set_prompt",
                        lambda self, spec, blend=None: (prompts.append(spec), original(self, spec, blend))[1])
    config = tmp_path / "render.yaml"
    config.write_text("model: tiny\ndevice: cpu\nmax-frames: 12\nfps: 20\nstrength: 0.6\n")
    schedule = tmp_path / "prompts.txt"
    schedule.write_text("0 a red circle\n0.2 a blue square\ntransition 0.2\n")
    out = tmp_path / "live.mkv"
    rc = render("--input", "pattern:64x48", "--output", str(out), "--config", str(config),
                "--prompt-schedule", str(schedule), "--max-frames", "10")  # the command line wins over the file
    assert rc == 0
    err = capsys.readouterr().err
    assert "(live," in err and "@ 20 fps" in err and "latency p50" in err
    m = probe(out)
    assert 1 <= m.frames <= 10 and (m.width, m.height) == (64, 48)  # the pattern's 4:3
    assert prompts[0] == "a red circle"
    assert any(isinstance(p, list) for p in prompts) or prompts[-1] == "a blue square"


def test_offline_folder_to_image_sequence(tmp_path, monkeypatch):
    import numpy as np
    from PIL import Image

    runners = recorded_runners(monkeypatch)
    (tmp_path / "in").mkdir()
    for i in range(3):
        Image.fromarray(np.full((40, 56, 3), 60 * i, np.uint8)).save(tmp_path / "in" / f"{i}.png")
    rc = render("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), *TINY)
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"frame_{i:06d}.png" for i in range(3)]
    metrics = runners[-1].metrics()  # the frames went through the one frame loop
    assert (metrics.frames_in, metrics.frames_processed, metrics.frames_out, metrics.live) == (3, 3, 3, False)


def test_truncated_input_renders_what_it_can(tmp_path, capsys):
    clip = make_clip(tmp_path / "full.mp4", n=40, fps=10, w=96, h=64, options={"movflags": "faststart"})
    data = clip.read_bytes()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) * 7 // 10])
    rc = render("--input", str(tmp_path / "cut.mp4"), "--output", str(tmp_path / "out.mp4"), *TINY)
    assert rc == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "truncated" in err
    assert 3 <= probe(tmp_path / "out.mp4").frames < 40


@pytest.mark.parametrize("kind", ["gray_odd", "huge"])
def test_unusual_inputs_render(tmp_path, kind):
    if kind == "gray_odd":
        clip = make_clip(tmp_path / "in.mkv", n=5, w=63, h=47, codec="ffv1", pix_fmt="gray", gray=True)
    else:
        clip = make_clip(tmp_path / "in.mp4", n=3, w=2560, h=1440)
    rc = render("--input", str(clip), "--output", str(tmp_path / "out.mp4"), "--height", "40", *TINY)
    assert rc == 0
    out = probe(tmp_path / "out.mp4")
    # --height 40 only: the width from the input's aspect, a multiple of 8 (63x47 -> 56x40, 16:9 -> 72x40)
    assert (out.frames, out.width, out.height) == ((5, 56, 40) if kind == "gray_odd" else (3, 72, 40))


@pytest.mark.parametrize("make_input, output, message", [
    (lambda d: str(d / "missing.mp4"), "out.mp4", "does not exist"),
    (lambda d: (d / "notes.mp4").write_text("hello") and str(d / "notes.mp4"), "out.mp4", "not a readable video"),
    (lambda d: str(make_clip(d / "ok.mp4", n=2)), "out.xyz", "unknown output"),
    (lambda d: "webcam:97", "out.mp4", "no webcam at index 97"),
    (lambda d: str(make_no_frames_clip(d / "empty.mkv")), "out.mp4", "no frames"),
])
def test_user_errors_are_clear_without_traceback(tmp_path, capsys, make_input, output, message):
    rc = render("--input", make_input(tmp_path), "--output", str(tmp_path / output), *TINY)
    err = capsys.readouterr().err
    assert rc == 1 and "error:" in err and message in err
    assert "Traceback" not in err


def test_unreachable_rtmp_output_fails_fast(tmp_path, capsys):
    from rtmp_server import free_port

    t0 = time.monotonic()
    rc = render("--input", "pattern:32x32", "--output", f"rtmp://127.0.0.1:{free_port()}/live/x", *TINY)
    assert rc == 1 and time.monotonic() - t0 < 10 + 8  # + the model build
    err = capsys.readouterr().err
    assert "unreachable" in err and "Traceback" not in err


def test_rtmp_timeout_bounds_a_silent_server(capsys):
    """--rtmp-timeout sets how long a server may keep quiet: one that accepts the connection but
    never answers (a loopback listener) fails within that time, not the default 5 s."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        url = f"rtmp://127.0.0.1:{listener.getsockname()[1]}/live/x"
        rc = render("--input", "pattern:32x32", "--output", url, "--rtmp-timeout", "0.5", *TINY)
        assert rc == 1
        assert "did not answer within 0.5 s" in capsys.readouterr().err
        assert render("--input", "pattern:32x32", "--output", url, "--rtmp-timeout", "0", *TINY) == 2  # usage
        assert "argument --rtmp-timeout: must be in (0, 3600], got 0" in capsys.readouterr().err
    finally:
        listener.close()


def test_bad_config_key_and_missing_options(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("modle: tiny\n")
    assert render("--input", "pattern", "--output", "x.mp4", "--config", str(config)) == 1
    assert "unknown setting(s)" in capsys.readouterr().err
    assert render("--output", "x.mp4") == 1
    assert "--input is required" in capsys.readouterr().err


def test_video_pipeline_gets_the_render_arguments(tmp_path, monkeypatch):
    seen = {}
    fake = types.ModuleType("streamstudio.app.cli.render_video")
    fake.run_video_render = lambda args: seen.update(vars(args)) or 0
    monkeypatch.setitem(sys.modules, "streamstudio.app.cli.render_video", fake)
    rc = render("--pipeline", "video", "--prompt", "waves", "--output", str(tmp_path / "v.mp4"),
                "--max-frames", "5", "--fps", "8", "--seed", "3")
    assert rc == 0
    for key in ("prompt", "input", "output", "frames", "seed", "width", "height", "fps", "model", "max_frames"):
        assert key in seen
    assert (seen["prompt"], seen["max_frames"], seen["fps"], seen["seed"]) == ("waves", 5, 8.0, 3)


def test_video_pipeline_missing_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "streamstudio.app.cli.render_video", None)  # import fails
    rc = render("--pipeline", "video", "--prompt", "x", "--output", str(tmp_path / "v.mp4"))
    assert rc == 1 and "--pipeline video is not available" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_closes_the_output_file(tmp_path):
    import signal
    import subprocess

    out = tmp_path / "live.mp4"
    proc = subprocess.Popen([sys.executable, "-m", "streamstudio", "render", "--input", "pattern:64x64@15",
                             "--output", str(out), *TINY], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if out.exists() and out.stat().st_size > 0:
            time.sleep(2)
            break
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130 and "interrupted:" in err and "Traceback" not in err
    assert probe(out).frames >= 1


def test_similarity_filter_skips_keep_the_frame_count(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    (tmp_path / "still").mkdir()
    for i in range(6):
        Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(tmp_path / "still" / f"{i}.png")
    rc = render("--input", str(tmp_path / "still"), "--output", str(tmp_path / "out.mkv"), "--steps", "2",
                "--filter-threshold", "0.5", *TINY)
    assert rc == 0
    err = capsys.readouterr().err
    skipped = int(err.split("filter-skipped ")[1].split(",")[0])
    assert skipped >= 1
    assert probe(tmp_path / "out.mkv").frames == 6


def test_output_size_follows_the_inputs_aspect_ratio():
    from streamstudio.app.streams.image import output_size

    assert output_size(None, None, 512, 640 / 360) == (512, 288)  # the 640x360 clip, a 512 model
    assert output_size(None, None, 512, 360 / 640) == (288, 512)  # portrait
    assert output_size(None, 256, 512, 16 / 9) == (456, 256)  # one side given: the other from the aspect
    assert output_size(512, None, 512, 4 / 3) == (512, 384)
    assert output_size(96, 64, 512, 16 / 9) == (96, 64)  # both given: as given
    assert output_size(None, None, 512, None) == (512, 512)  # no aspect known: the model's default


@pytest.mark.parametrize("fit", ["crop", "pad"])
def test_fit_crops_or_pads_before_the_pipeline_resizes(tmp_path, capsys, fit):
    """A wide folder into a square stream: --fit crop hands the pipeline the centre square,
    --fit pad the whole picture with black bars; never a stretched frame."""
    import numpy as np
    from PIL import Image

    from streamstudio.app import streams as render_cmd  # FittedFrames: the one fit adapter

    (tmp_path / "in").mkdir()
    img = np.zeros((40, 80, 3), np.uint8)
    img[:, :20] = (255, 0, 0)  # a red quarter on the left
    Image.fromarray(img).save(tmp_path / "in" / "0.png")
    seen = []
    real = render_cmd.FittedFrames.fit_frame

    def spy(self, frame):
        out = real(self, frame)
        seen.append(out.copy())
        return out

    render_cmd.FittedFrames.fit_frame = spy
    try:
        rc = render("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--width", "64",
                    "--height", "64", "--fit", fit, *TINY)
    finally:
        render_cmd.FittedFrames.fit_frame = real
    assert rc == 0 and f"64x64 ({fit})" in capsys.readouterr().err
    frame = seen[0]
    if fit == "crop":  # the centre 40x40: the red quarter cut off
        assert frame.shape == (40, 40, 3) and not frame[..., 0].any()
    else:  # 80x80: 20 black rows above and below, all the picture between
        assert frame.shape == (80, 80, 3) and np.array_equal(frame[20:60], img) and not frame[:20].any()
    assert Image.open(tmp_path / "out" / "frame_000000.png").size == (64, 64)


def test_render_without_a_size_keeps_the_inputs_aspect(tmp_path):
    import numpy as np
    from PIL import Image

    (tmp_path / "in").mkdir()
    Image.fromarray(np.full((36, 64, 3), 90, np.uint8)).save(tmp_path / "in" / "0.png")  # 16:9
    assert render("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), *TINY) == 0
    assert Image.open(tmp_path / "out" / "frame_000000.png").size == (64, 40)  # 64 x 36 -> a multiple of 8


def test_frames_is_refused_for_the_image_pipeline(tmp_path, capsys):
    """`render --frames N` is the video pipeline's flag; the image pipeline ignored it and ran a
    live input until stopped. It is now an error that names --max-frames, before a model loads."""
    from streamstudio.app.cli import main

    assert main(["render", "--model", "tiny", "--input", "pattern:64x48@30", "--frames", "10",
                 "--output", str(tmp_path / "out.mp4")]) == 1
    err = capsys.readouterr().err
    assert "--frames is the video pipeline's" in err and "--max-frames" in err
    assert not (tmp_path / "out.mp4").exists()
