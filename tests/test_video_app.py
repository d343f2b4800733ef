"""The video pipeline at the app level: the built-in model, `render --pipeline video`, the Video tab."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from streamstudio.app import video_tab
from streamstudio.app.commands.render_video import (add_video_arguments, build_stream, load_video_model,
                                                    parse_prompt_changes, read_frames, run_video_render,
                                                    text_to_video, write_mp4)
from streamstudio.errors import StreamStudioError
from streamstudio.models.video_data import COLOURS, dominant_colour


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
            frames = list(text_to_video(build_stream(model, meta, prompt, seed=i, width=32, height=32), 4))
        hits.append(dominant_colour(frames) == colour)
    assert np.mean(hits) >= 0.8, hits


def test_builtin_prompt_change_mid_stream(builtin):
    model, meta = builtin
    stream = build_stream(model, meta, "a red square moving up", width=32, height=32)
    with torch.inference_mode():
        frames = list(text_to_video(stream, 24, {8: "a blue square moving up"}))
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


def test_render_text_to_video_then_video_to_video(tmp_path, capsys):
    assert run_video_render(make_args(tmp_path)) == 0
    frames, fps = read_frames(tmp_path / "out.mp4")
    frames = list(frames)
    assert len(frames) == 6 and frames[0].shape == (64, 64, 3) and fps == pytest.approx(8.0)
    captured = capsys.readouterr()
    assert "wrote 6 frames" in captured.out
    # a newcomer sees at once what runs, then a progress bar (it printed nothing for up to 47 s)
    assert captured.out.index("video pipeline: text-to-video") < captured.out.index("model the built-in StreamDiT")
    assert "buffer" in captured.out and "6/6" in captured.err
    args = make_args(tmp_path, input=str(tmp_path / "out.mp4"), output=str(tmp_path / "v2v.mp4"),
                     prompt="a blue circle moving right", width=32, height=32, num_chunks=2, chunk_size=2)
    assert run_video_render(args) == 0
    out, _ = read_frames(tmp_path / "v2v.mp4")
    assert len(list(out)) == 6


def test_render_takes_device_dtype_and_acceleration(tmp_path, monkeypatch, capsys):
    """The video render loads the model on --device in --dtype and wraps it with --acceleration:
    tensorrt without TensorRT says so once and renders on the torch path; compile wraps the network."""
    from streamstudio.app.commands import render_video
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.models import acceleration

    monkeypatch.setattr(acceleration, "_said", set())  # said once per process: say it again here
    seen = {}
    real_load = render_video.load_video_model

    def spy(model, device="auto", dtype="auto"):
        seen.update(device=device, dtype=dtype)
        return real_load(model, device, dtype)

    monkeypatch.setattr(render_video, "load_video_model", spy)
    args = make_args(tmp_path, frames=2, width=32, height=32, device="cpu", dtype="float32", acceleration="tensorrt")
    if trt_kernels.tensorrt_available():
        pytest.skip("TensorRT is installed: the fallback is not what runs")
    with pytest.warns(RuntimeWarning, match="TensorRT is not installed"):
        assert run_video_render(args) == 0
    assert seen == {"device": "cpu", "dtype": "float32"}
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
    with pytest.raises(StreamStudioError):
        write_mp4(tmp_path / "empty.mp4", [], 8)


def test_video_tab_callbacks():
    session = video_tab.VideoSession()
    gen = video_tab.generate(session, "a white circle moving left", seed=1, max_frames=12)
    first, status = next(gen)
    assert first.shape == (video_tab.DISPLAY_SIDE, video_tab.DISPLAY_SIDE, 3) and first.dtype == np.uint8
    assert "frame 1" in status
    assert "yellow" in video_tab.change_prompt(session, "a yellow circle moving left")
    rest = [f for f, s in gen]
    assert len(rest) == 11 and session.prompt == "a yellow circle moving left"
    assert "stopped" in video_tab.stop(session)
    with pytest.raises(StreamStudioError):
        next(video_tab.generate(session, "  "))
    outs = [video_tab.webcam_frame(session, np.full((48, 64, 3), 200, np.uint8), "a red circle", 0.5)
            for _ in range(12)]
    assert outs[0] is None  # the buffer fills first (N*c frames)
    assert outs[-1] is not None and outs[-1].shape == (video_tab.DISPLAY_SIDE, video_tab.DISPLAY_SIDE, 3)


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
    write_mp4(clip, [np.full((32, 32, 3), 40 * i, np.uint8) for i in range(5)], 8)
    out = tmp_path / "out.mp4"
    assert main(["render", "--pipeline", "video", "--input", str(clip), "--model", str(ck), "--prompt", "red",
                 "--output", str(out), "--width", "32", "--height", "32"]) == 0
    frames, _ = read_frames(out)
    assert len(list(frames)) == 5
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
            frames = list(text_to_video(stream, 4))
        assert frames[0].dtype == np.uint8 and frames[0].shape == (32, 32, 3)
        hits.append(dominant_colour(frames) == colour)
    assert np.mean(hits) >= 0.8, hits
