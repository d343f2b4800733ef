"""Rendering with the streaming video model (StreamDiT-style): text-to-video and video-to-video.

`streamstudio render --pipeline video --prompt "a red circle moving left" --frames 48 --output out.mp4`
`streamstudio render --pipeline video --input in.mp4 --prompt "..." --output out.mp4`

`run_video_render(args)` is the runner of `render --pipeline video` (render_run.py hands it
over; its options are render.py's `add_video_arguments`); the stream itself opens in
`app/streams/video.py` (`open_video_stream`, `video_runner`: a video batch's worker renders each
of its files with the same two, app/batch/video.py). Frames take the one road
every front end takes (streaming.Runner from `open_source` to `open_sink`): text-to-video from a
clock of empty frames, video-to-video from any input render reads, into any output render writes,
with the input's audio kept. An input of
another aspect ratio than the output is cropped or padded to it (--fit), never stretched; without
--width/--height the output takes the input's aspect ratio, and the network's latent grid follows
the output's aspect to within one patch.
"""

from __future__ import annotations

import logging
import sys

from streamstudio.app.cli.requests import video_request
from streamstudio.app.streams import expected_frames, watch
from streamstudio.app.streams.video import (BUILTIN_NAMES, DEFAULT_FPS, DEFAULT_FRAMES, load_video_model,
                                            open_video_stream, video_runner)
from streamstudio.device import use_threads
from streamstudio.errors import StreamStudioError
from streamstudio.streaming.generated import NoInputSource
from streamstudio.streaming.resample import resample_file
from streamstudio.streaming.sources import open_source

log = logging.getLogger(__name__)


def open_input(spec: str, fps: float | None):
    """The video-to-video input (anything `render --input` takes), at `fps` when given."""
    try:
        source = open_source(spec, fps=fps, realtime=False)
    except StreamStudioError as exc:
        raise StreamStudioError(f"{exc} (video-to-video); or leave --input out for text-to-video") from exc
    try:
        return resample_file(source, fps)
    except BaseException:
        source.close()
        raise


def taehv_file(args) -> str | None:
    """--taehv's file when --video-decoder is taehv (None for wan); each needs the other."""
    decoder, path = getattr(args, "video_decoder", None) or "wan", getattr(args, "taehv", None)
    if decoder == "taehv" and not path:
        raise StreamStudioError("--video-decoder taehv needs --taehv FILE: TAEHV's Wan 2.1 weights, taew2_1.pth (or "
                                "safetensors/taew2_1.safetensors) from https://github.com/madebyollin/taehv, a "
                                "file in that GitHub repository (not on the Hugging Face hub)")
    if decoder != "taehv" and path:
        raise StreamStudioError("--taehv is the weights of --video-decoder taehv; add --video-decoder taehv")
    return path if decoder == "taehv" else None


def run_video_render(args) -> int:
    output = getattr(args, "output", None)
    if not output:
        raise StreamStudioError("--output is required: a video file, a folder, rtmp://... or hls:DIR")
    spec, fps, max_frames = getattr(args, "input", None), getattr(args, "fps", None), getattr(args, "max_frames", None)
    frames = getattr(args, "frames", None) or max_frames or DEFAULT_FRAMES
    if not spec and frames < 1:
        raise StreamStudioError("--frames must be at least 1")
    request = video_request(args)
    print(f"video pipeline: {'video-to-video of ' + str(spec) if spec else 'text-to-video'}, "
          f"loading the model...", flush=True)
    source = open_input(spec, fps) if spec else None
    try:
        model, meta = load_video_model(request.model, request.device, request.dtype, base=request.wan_base,
                                       taehv=taehv_file(args))
        use_threads(request.threads, next(model.parameters()).device)
        aspect = source.info.width / source.info.height if source is not None else None
        stream = open_video_stream(model, meta, request, aspect)
        size = stream.out_size
        assert size is not None  # (build_stream gives every stream its output size)
        height, width = size
        if source is None:
            source = NoInputSource(frames, fps or DEFAULT_FPS, width, height, description="text-to-video")
        runner = video_runner(stream, source, output, request, fps=fps, max_frames=max_frames,
                              no_audio=bool(getattr(args, "no_audio", False)),
                              rtmp_timeout=getattr(args, "rtmp_timeout", None))
    except BaseException:
        if source is not None:
            source.close()
        raise
    name = "the built-in StreamDiT" if request.model in BUILTIN_NAMES else request.model
    fitted = f" ({request.fit})" if aspect is not None and abs(aspect - width / height) >= 0.01 else ""
    print(f"model {name}, {width}x{height}{fitted}, {stream.summary}, on {next(model.parameters()).device}",
          flush=True)
    info = source.info
    total = info.frame_count or (round(info.duration * info.fps) if info.duration else None)
    metrics = watch(runner, expected_frames(total, max_frames), desc="video")
    for warning in metrics.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {metrics.frames_out} frames to {output} "
          f"({metrics.frames_out / max(metrics.elapsed, 1e-9):.1f} fps generated)")
    return 0
