"""The video pipeline at the app level: the built-in model, `render --pipeline video`, the Video tab."""

from __future__ import annotations

import argparse
import time

import numpy as np
import pytest
import torch

from helpers import recorded_runners

from streamstudio.app.web import video_tab
from streamstudio.app.cli.render import add_video_arguments
from streamstudio.app.cli.render_video import run_video_render
from streamstudio.app.streams.video import (VideoFrames, build_stream, latent_size, load_video_model,
                                            parse_prompt_changes)
from streamstudio.errors import StreamStudioError
from streamstudio.models.video.video_data import COLOURS, dominant_colour


def make_clip(*args, **kwargs):
    """tests/clips.make_clip, imported when a test runs: that module skips without
    PyAV, and this one's gpu tests must still be collected on the GPU image, which has none."""
    return pytest.importorskip("clips").make_clip(*args, **kwargs)


def probe(path):
    return pytest.importorskip("clips").probe(path)


@pytest.fixture(scope="module")
def builtin():
    torch.set_num_threads(1)
    return load_video_model(None)


def test_builtin_model_follows_colour_prompts(builtin):
    model, meta = builtin
    hits = []
    for i, colour in enumerate(COLOURS):
        prompt = f"a {colour} {['circle', 'square', 'triangle'][i % 3]} moving {['left', 'right', 'up', 'down'][i % 4]}"
        with torch.inference_mode():
            frames = list(build_stream(model, meta, prompt, seed=i, width=32, height=32).frames(4))
        hits.append(dominant_colour(frames) == colour)
    assert np.mean(hits) >= 0.8, hits


def test_builtin_prompt_change_mid_stream(builtin):
    model, meta = builtin
    processor = VideoFrames(build_stream(model, meta, "a red square moving up", width=32, height=32),
                            {8: "a blue square moving up"})
    frames = [frame for _ in range(24) for frame in processor.push(None)]  # text-to-video: one frame a push
    assert len(frames) == 24 and processor.flush() == []
    assert dominant_colour(frames[:6]) == "red"
    assert dominant_colour(frames[-4:]) == "blue"


def make_args(tmp_path, **kw):
    parser = argparse.ArgumentParser()
    add_video_arguments(parser)
    args = parser.parse_args([])
    base = dict(prompt="a green circle moving right", input=None, output=str(tmp_path / "out.mp4"), frames=6,
                seed=0, width=64, height=64, fps=8.0, model=None, max_frames=None)
    base.update(kw)
    for k, v in base.items():
        setattr(args, k, v)
    return args


def test_render_text_to_video_then_video_to_video(tmp_path, capsys, monkeypatch):
    runners = recorded_runners(monkeypatch)
    assert run_video_render(make_args(tmp_path)) == 0
    got = probe(tmp_path / "out.mp4")
    assert (got.frames, got.width, got.height) == (6, 64, 64) and got.fps == pytest.approx(8.0)
    metrics = runners[-1].metrics()  # every frame went through the one frame loop
    assert (metrics.frames_in, metrics.frames_processed, metrics.frames_out) == (6, 6, 6)
    captured = capsys.readouterr()
    assert "wrote 6 frames" in captured.out
    # a newcomer sees at once what runs, then a progress bar (it printed nothing for up to 47 s)
    assert captured.out.index("video pipeline: text-to-video") < captured.out.index("model the built-in StreamDiT")
    assert "buffer" in captured.out and "6/6" in captured.err
    args = make_args(tmp_path, input=str(tmp_path / "out.mp4"), output=str(tmp_path / "v2v.mp4"),
                     prompt="a blue circle moving right", width=32, height=32, num_chunks=2, chunk_size=2)
    assert run_video_render(args) == 0
    assert probe(tmp_path / "v2v.mp4").frames == 6
    assert (runners[-1].metrics().frames_in, runners[-1].metrics().frames_out) == (6, 6)


def test_render_takes_device_dtype_and_acceleration(tmp_path, monkeypatch, capsys):
    """The video render loads the model on --device in --dtype and wraps it with --acceleration:
    tensorrt without TensorRT says so once and renders on the torch path; compile wraps the network."""
    from streamstudio.app.cli import render_video
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.models import acceleration

    monkeypatch.setattr(acceleration, "_said", set())  # said once per process: say it again here
    seen = {}
    real_load = render_video.load_video_model

    def spy(model, device="auto", dtype="auto", **kwargs):
        seen.update(device=device, dtype=dtype, base=kwargs.get("base"))
        return real_load(model, device, dtype, **kwargs)

    monkeypatch.setattr(render_video, "load_video_model", spy)
    args = make_args(tmp_path, frames=2, width=32, height=32, device="cpu", dtype="float32", acceleration="tensorrt")
    if trt_kernels.tensorrt_available():
        pytest.skip("TensorRT is installed: the fallback is not what runs")
    with pytest.warns(RuntimeWarning, match="TensorRT is not installed"):
        assert run_video_render(args) == 0
    assert seen == {"device": "cpu", "dtype": "float32", "base": None}
    model, meta = real_load(None, "cpu", "float32")
    stream = build_stream(model, meta, "a red circle moving left", width=32, height=32, acceleration="compile")
    assert stream.sampler.backbone.model is not model and hasattr(stream.sampler.backbone.model, "_orig_mod")


def test_render_errors_say_what_to_do(tmp_path):
    with pytest.raises(StreamStudioError, match="video-to-video"):
        run_video_render(make_args(tmp_path, input=str(tmp_path / "missing.mp4")))
    with pytest.raises(StreamStudioError, match="train-video"):
        run_video_render(make_args(tmp_path, model=str(tmp_path / "nowhere")))
    with pytest.raises(StreamStudioError, match="FRAME:PROMPT"):
        parse_prompt_changes(["blue"])
    with pytest.raises(StreamStudioError, match="--frames must be at least 1"):
        run_video_render(make_args(tmp_path, frames=-1))


def test_video_to_video_keeps_the_inputs_aspect_and_audio(tmp_path, monkeypatch):
    """Issue 18: a 318x178 clip came out 256x256, squashed, without its sound. Now the output
    takes the input's aspect (the checkpoint's 256 as its long side, as the image render does),
    every frame keeps its input's timestamp and the audio is copied."""
    from streamstudio.app.cli import main

    runners = recorded_runners(monkeypatch)
    clip = make_clip(tmp_path / "in.mp4", n=8, fps=8, w=318, h=178, audio=True)
    out = tmp_path / "out.mp4"
    assert main(["render", "--pipeline", "video", "--input", str(clip), "--prompt", "a red circle moving left",
                 "--output", str(out), "--num-chunks", "2", "--chunk-size", "2"]) == 0
    got, ref = probe(out), probe(clip)
    assert (got.frames, got.width, got.height) == (8, 256, 144)
    assert got.video_pts == pytest.approx(ref.video_pts, abs=1e-3)
    assert got.audio_codec == "aac" and got.audio_duration == pytest.approx(ref.audio_duration, abs=0.05)
    assert (runners[-1].metrics().frames_in, runners[-1].metrics().frames_out) == (8, 8)


@pytest.mark.parametrize("fit", ["crop", "pad"])
def test_video_frames_crop_or_pad_to_the_outputs_aspect(builtin, fit):
    """A wide frame into a square stream: crop hands the model the centre square, pad the whole
    picture with black bars; never a stretched frame."""
    model, meta = builtin
    stream = build_stream(model, meta, "a red circle moving left", strength=0.6, width=32, height=32)
    seen, push = [], stream.push
    stream.push = lambda frame: (seen.append(frame.copy()), push(frame))[1]
    img = np.zeros((40, 80, 3), np.uint8)
    img[:, :20] = (255, 0, 0)  # a red quarter on the left
    processor = VideoFrames(stream, fit=fit)
    outs = [out for _ in range(4) for out in processor.push(img)] + processor.flush()
    assert len(outs) == 4 and outs[0].shape == (32, 32, 3)
    if fit == "crop":  # the centre 40x40: the red quarter cut off
        assert seen[0].shape == (40, 40, 3) and not seen[0][..., 0].any()
    else:  # 80x80: 20 black rows above and below, all the picture between
        assert seen[0].shape == (80, 80, 3) and np.array_equal(seen[0][20:60], img) and not seen[0][:20].any()


def test_latent_grid_follows_the_outputs_aspect():
    assert latent_size((32, 32), 4, (4, 8, 8), 1.0) == (32, 32)
    assert latent_size((32, 32), 4, (4, 8, 8), 318 / 178) == (16, 32)  # 8 / 1.79 = 4.48 tokens: 4
    assert latent_size((32, 32), 4, (4, 8, 8), 256 / 144) == (20, 32)  # 4.5 tokens: the larger, 5
    assert latent_size((32, 32), 4, (4, 8, 8), 144 / 256) == (32, 20)  # portrait
    # 64 px / patch 2 = 32 tokens; 21 tokens would not tile 16-token windows: 16
    assert latent_size((64, 64), 2, (4, 16, 16), 1.5) == (32, 64)


def test_video_tab_callbacks():
    session = video_tab.VideoSession()
    gen = video_tab.generate(session, "a white circle moving left", seed=1, max_frames=12)
    first, status = next(gen)
    assert first.shape == (video_tab.DISPLAY_SIDE, video_tab.DISPLAY_SIDE, 3) and first.dtype == np.uint8
    assert "frame 1" in status
    assert "yellow" in video_tab.change_prompt(session, "a yellow circle moving left")
    rest = [f for f, s in gen]
    assert len(rest) == 11 and session.prompt == "a yellow circle moving left"
    assert session.t2v.applied == "a yellow circle moving left"  # changed mid-stream
    assert session.t2v.runner.metrics().frames_out == 12  # the frames went through a streaming.Runner
    assert "stopped" in video_tab.stop(session)
    with pytest.raises(StreamStudioError):
        next(video_tab.generate(session, "  "))
    outs = []
    for i in range(12):  # each webcam frame once the one before went through (a newer one replaces a waiting one)
        outs.append(video_tab.webcam_frame(session, np.full((48, 64, 3), 200, np.uint8), "a red circle",
                                               {"strength": 0.5}))
        runner = session.v2v.runner
        deadline = time.monotonic() + 30
        while runner.counts["out"] < i + 1 and runner.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert outs[0] is None  # the buffer fills first (N*c frames)
    assert outs[-1] is not None and outs[-1].shape == (video_tab.DISPLAY_SIDE, video_tab.DISPLAY_SIDE, 3)
    assert session.prompt == "a red circle" and session.v2v.applied == "a red circle"
    m = session.v2v.runner.metrics()  # the webcam's frames went through a streaming.Runner
    assert m.live and (m.frames_in, m.frames_out) == (12, 12)
    video_tab.stop(session)
    session.v2v.close()


def test_video_tab_step_reaches_both_streams():
    """The tab's Step (its solver) builds the text-to-video stream and the webcam's; a change of it
    restarts the webcam's stream; none is the checkpoint's (the built-in model's: euler)."""
    session = video_tab.VideoSession()
    (_, status), = video_tab.generate(session, "a red circle moving left", max_frames=1, solver="heun")
    assert session.t2v.frames.stream.cfg.buffer.solver == "heun" and status.endswith("· heun step")
    list(video_tab.generate(session, "a red circle moving left", max_frames=1))
    assert session.t2v.frames.stream.cfg.buffer.solver == video_tab.builtin_solver() == "euler"
    frame = np.full((48, 64, 3), 200, np.uint8)
    video_tab.webcam_frame(session, frame, "a red circle", {"strength": 0.5, "solver": "ab2"})
    first = session.v2v
    assert first.frames.stream.cfg.buffer.solver == "ab2"
    video_tab.webcam_frame(session, frame, "a red circle", {"strength": 0.5, "solver": "ab2"})
    assert session.v2v is first  # unchanged settings: the same stream
    video_tab.webcam_frame(session, frame, "a red circle", {"strength": 0.5, "solver": "heun"})
    assert session.v2v is not first and not first.running
    assert session.v2v.frames.stream.cfg.buffer.solver == "heun"
    session.close()


def test_video_tab_stop_and_a_failure(monkeypatch):
    """Stop ends a text-to-video stream (its runner stops; the generator ends within a frame or
    two); a failure in a stream's runner reaches the page as a StreamStudioError."""
    session = video_tab.VideoSession()
    gen = video_tab.generate(session, "a blue square moving up", max_frames=500)
    next(gen)
    assert "stopped after 1 frames" in video_tab.stop(session)
    assert len(list(gen)) <= 2 and not session.t2v.running

    def boom(self, frame):
        raise RuntimeError("kaput")

    monkeypatch.setattr(video_tab.GuardedFrames, "push", boom)
    with pytest.raises(StreamStudioError, match="kaput"):
        list(video_tab.generate(session, "a blue square moving up", max_frames=3))
    assert not session.t2v.running


@pytest.mark.slow  # importing gradio takes a while here
def test_video_tab_builds():
    gr = pytest.importorskip("gradio")
    with gr.Blocks() as demo:
        with gr.Tab("Video"):
            video_tab.build_video_tab()
    assert demo is not None


def test_cli_train_video_then_render_video(tmp_path, capsys):
    from streamstudio.app.cli import main

    ck = tmp_path / "ck"
    assert main(["train-video", "--output", str(ck), "--steps", "2", "--batch-size", "1", "--size", "16",
                 "--buffer-frames", "4", "--num-chunks", "2", "--cpu", "--no-progress"]) == 0
    assert (ck / "model.safetensors").is_file() and "trained 2 steps" in capsys.readouterr().out
    clip = tmp_path / "in.mp4"
    make_clip(clip, n=5, fps=8, w=32, h=32)
    out = tmp_path / "out.mp4"
    assert main(["render", "--pipeline", "video", "--input", str(clip), "--model", str(ck), "--prompt", "red",
                 "--output", str(out), "--width", "32", "--height", "32"]) == 0
    assert probe(out).frames == 5
    assert main(["render", "--pipeline", "video", "--input", str(clip), "--model", str(tmp_path / "none"),
                 "--output", str(out)]) == 1  # a clear error, no traceback


@pytest.mark.gpu
def test_builtin_model_on_the_gpu_in_float16():
    """The video pipeline's GPU path (the default there): same colour-following as on the CPU."""
    model, meta = load_video_model(None, "cuda", "auto")
    assert next(model.parameters()).dtype == torch.float16
    hits = []
    for i, colour in enumerate(COLOURS):
        with torch.inference_mode():
            stream = build_stream(model, meta, f"a {colour} square moving left", seed=i, width=32, height=32)
            frames = list(stream.frames(4))
        assert frames[0].dtype == np.uint8 and frames[0].shape == (32, 32, 3)
        hits.append(dominant_colour(frames) == colour)
    assert np.mean(hits) >= 0.8, hits


def test_video_solver_comes_from_the_checkpoint_or_the_flag():
    """`sampling.solver` of the checkpoint (euler when it names none) unless --video-solver says
    otherwise; heun makes two buffer calls a level, ab2 as many as euler."""
    from streamstudio.app.settings import config_values
    from streamstudio.pipelines.live_settings import VIDEO_SETTINGS

    model, meta = load_video_model(None, "cpu", "float32")
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    plain = {**meta, "sampling": {k: v for k, v in meta["sampling"].items() if k != "solver"}}
    counts = {}
    for solver, m, flag in (("euler", plain, None),
                            ("ab2", {**plain, "sampling": {**plain["sampling"], "solver": "ab2"}}, None),
                            ("heun", plain, "heun")):
        stream = build_stream(model, m, "a red circle moving left", width=32, height=32, solver=flag)
        assert stream.sampler.cfg.solver == solver
        calls.clear()
        with torch.inference_mode():
            list(stream.frames(2))
        counts[solver] = len(calls)
    assert counts["ab2"] == counts["euler"] and counts["heun"] == 2 * counts["euler"]
    parser = argparse.ArgumentParser()
    add_video_arguments(parser)
    assert config_values(vars(parser.parse_args(["--video-solver", "ab2"])), VIDEO_SETTINGS)["solver"] == "ab2"
    assert "solver" not in config_values(vars(parser.parse_args([])), VIDEO_SETTINGS)  # the checkpoint's


def test_video_guidance_comes_from_the_checkpoint_or_the_flag(tmp_path):
    """The stream guides with the checkpoint's `sampling.guidance` unless --video-guidance says
    otherwise; guidance 1 keeps one network call a step, 2 guides against the empty prompt."""
    model, meta = load_video_model(None, "cpu", "float32")
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(args[2].tokens.shape[1]))
    assert build_stream(model, meta, "a red circle", width=32, height=32).sampler.backbone.guidance == \
        meta["sampling"]["guidance"]  # the built-in model's own
    unguided = {**meta, "sampling": {k: v for k, v in meta["sampling"].items() if k != "guidance"}}
    plain = build_stream(model, unguided, "a red circle moving left", width=32, height=32)
    assert plain.sampler.backbone.guidance == 1.0  # a checkpoint that names none
    meta2 = {**meta, "sampling": {**meta["sampling"], "guidance": 2.5}}
    assert build_stream(model, meta2, "a red circle", width=32, height=32).sampler.backbone.guidance == 2.5
    guided = build_stream(model, meta2, "a red circle moving left", width=32, height=32, guidance=2.0)
    assert guided.sampler.backbone.guidance == 2.0
    calls.clear()
    list(plain.frames(1))
    plain_calls = len(calls)
    calls.clear()
    list(guided.frames(1))
    assert len(calls) == 2 * plain_calls and min(calls) == 1  # the empty prompt: its summary token alone
    with pytest.raises(StreamStudioError, match="guidance"):
        build_stream(model, meta, "a red circle", width=32, height=32, guidance=-1)
    parser = argparse.ArgumentParser()
    add_video_arguments(parser)
    assert parser.parse_args(["--video-guidance", "3"]).video_guidance == 3.0
