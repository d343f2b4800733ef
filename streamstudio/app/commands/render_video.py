"""Rendering with the streaming video model (StreamDiT-style): text-to-video and video-to-video.

`streamstudio render --pipeline video --prompt "a red circle moving left" --frames 48 --output out.mp4`
`streamstudio render --pipeline video --input in.mp4 --prompt "..." --output out.mp4`

`run_video_render(args)` is called by `streamstudio render`; `add_video_arguments(parser)` adds
the video-only options. Frames go to an mp4 written with PyAV as they are made.
"""

from __future__ import annotations

import argparse
import logging
import time
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.stream_dit import BUILTIN_CHECKPOINT, load_checkpoint
from streamstudio.pipelines.stream_video import (StreamBufferConfig, StreamDiTBackbone, StreamVideoConfig,
                                                 VideoStream)

log = logging.getLogger(__name__)

BUILTIN_NAMES = (None, "", "auto", "tiny", "builtin", "stream_dit_tiny")
DEFAULT_FRAMES = 48
DEFAULT_FPS = 16.0
DEFAULT_STRENGTH = 0.6


def add_video_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("video pipeline (--pipeline video)")
    g.add_argument("--frames", type=int, default=None, help=f"text-to-video: frames to make (default {DEFAULT_FRAMES})")
    g.add_argument("--video-strength", type=float, default=DEFAULT_STRENGTH,
                   help=f"video-to-video: how much of each input frame is re-generated, in (0, 1] (default {DEFAULT_STRENGTH})")
    g.add_argument("--num-chunks", type=int, default=None, help="buffer chunks N (default: the checkpoint's)")
    g.add_argument("--chunk-size", type=int, default=None, help="frames per chunk c (default: the checkpoint's)")
    g.add_argument("--micro-steps", type=int, default=None, help="micro-steps per chunk s (default: the checkpoint's)")
    g.add_argument("--prompt-change", action="append", default=None, metavar="FRAME:PROMPT",
                   help="switch to PROMPT from output frame FRAME on (repeatable)")


# ---------------------------------------------------------------------------- model and stream


def load_video_model(model: str | None, device: torch.device | str = "auto", dtype: str | torch.dtype = "auto"
                     ) -> tuple[torch.nn.Module, dict]:
    """The built-in tiny StreamDiT for None/auto/tiny, else a checkpoint folder; on `device`
    ("auto": the GPU when there is one) in `dtype` ("auto": float16 on a GPU, float32 on CPU)."""
    from streamstudio.device import pick_device, pick_dtype

    device = pick_device(device) if isinstance(device, str) else device
    dtype = pick_dtype(device, dtype) if isinstance(dtype, str) else dtype
    if model in BUILTIN_NAMES:
        return load_checkpoint(BUILTIN_CHECKPOINT, device, dtype)
    path = Path(model)
    if path.is_file():  # the model.safetensors inside a checkpoint folder
        path = path.parent
    return load_checkpoint(path, device, dtype)


def build_stream(model: torch.nn.Module, meta: dict, prompt: str, *, strength: float = 1.0, seed: int = 0,
                 width: int | None = None, height: int | None = None, num_chunks: int | None = None,
                 chunk_size: int | None = None, micro_steps: int | None = None,
                 acceleration: str = "none") -> VideoStream:
    """A VideoStream with the checkpoint's sampling defaults, overridden where given, on the
    model's device and dtype; `acceleration` compile or tensorrt wraps the network for this
    buffer layout (models.acceleration.apply_video_acceleration)."""
    sampling = meta.get("sampling", {})
    buffer = StreamBufferConfig(
        num_chunks=num_chunks or sampling.get("num_chunks", 4),
        chunk_size=chunk_size or sampling.get("chunk_size", 2),
        micro_steps=micro_steps or sampling.get("micro_steps", 2),
        ref_frames=sampling.get("ref_frames", 0),
        strength=strength, seed=seed)
    side_h, side_w = sampling.get("height", 32), sampling.get("width", 32)
    cfg = StreamVideoConfig(buffer, height=side_h, width=side_w, out_height=height or side_h * 8,
                            out_width=width or side_w * 8)
    param = next(model.parameters())
    channels = model.cfg.in_channels
    if acceleration != "none":
        from streamstudio.models.acceleration import apply_video_acceleration

        model = apply_video_acceleration(model, acceleration, frames=buffer.ref_frames + buffer.frames,
                                         height=side_h, width=side_w)
    return VideoStream(StreamDiTBackbone(model), cfg, prompt, latent_channels=channels, device=param.device,
                       dtype=param.dtype)


def parse_prompt_changes(items: Iterable[str] | None) -> dict[int, str]:
    changes = {}
    for item in items or []:
        frame, sep, prompt = item.partition(":")
        if not sep or not frame.strip().isdigit():
            raise StreamStudioError(f"--prompt-change {item!r}: write FRAME:PROMPT, e.g. 24:a blue square moving up")
        changes[int(frame)] = prompt.strip()
    return changes


def text_to_video(stream: VideoStream, frames: int, changes: dict[int, str] | None = None) -> Iterator[np.ndarray]:
    """Yield `frames` frames; a prompt change at frame i applies to the chunks made from then on."""
    changes = dict(changes or {})
    made = 0
    while made < frames:
        for at in [k for k in changes if k <= made]:
            stream.set_prompt(changes.pop(at))
        for frame in stream.push(None)[: frames - made]:
            made += 1
            yield frame


def video_to_video(stream: VideoStream, inputs: Iterable[np.ndarray], changes: dict[int, str] | None = None
                   ) -> Iterator[np.ndarray]:
    changes = dict(changes or {})
    for i, frame in enumerate(inputs):
        if i in changes:
            stream.set_prompt(changes.pop(i))
        yield from stream.push(frame)
    yield from stream.flush()


# ---------------------------------------------------------------------------- files


def read_frames(path: str | Path, max_frames: int | None = None, fps: float | None = None,
                with_count: bool = False):
    """(RGB uint8 frames of a video file, their frame rate[, how many there will be, or None when
    the file does not say]). With `fps`, a file at another rate is resampled to it by timestamps
    (frames dropped or repeated), so its duration is kept."""
    from streamstudio.streaming.sources import VideoFileSource, resample_file

    path = Path(path)
    if not path.is_file():
        raise StreamStudioError(f"input video {path} does not exist; give a video file for video-to-video "
                                "or leave --input out for text-to-video")
    source = resample_file(VideoFileSource(path), fps)  # a file that is not video: a clear error there

    def frames() -> Iterator[np.ndarray]:
        with source:
            for frame in source.frames():
                if max_frames is not None and frame.index >= max_frames:
                    break
                yield frame.image

    if not with_count:
        return frames(), source.info.fps
    info = source.info
    total = info.frame_count or (round(info.duration * info.fps) if info.duration else None)
    if total is not None and max_frames is not None:
        total = min(total, max_frames)
    return frames(), info.fps, total


def progress(frames: Iterable[np.ndarray], total: int | None) -> Iterator[np.ndarray]:
    """`frames`, with a progress bar on the terminal as they are made."""
    from tqdm import tqdm

    with tqdm(total=total, unit="frame", desc="video", dynamic_ncols=True) as bar:
        for frame in frames:
            bar.update(1)
            yield frame


def _codec() -> str:
    import av

    for name in ("libx264", "h264", "mpeg4"):
        try:
            av.codec.Codec(name, "w")
            return name
        except Exception:  # not built into this PyAV
            continue
    raise StreamStudioError("this PyAV has no H.264 or MPEG-4 encoder; install a full PyAV wheel (pip install av)")


def write_mp4(path: str | Path, frames: Iterable[np.ndarray], fps: float) -> int:
    """Write RGB uint8 frames to an mp4 as they come; returns the number written."""
    import av

    from streamstudio.streaming.sinks import make_output_folder, output_error

    path = Path(path)
    make_output_folder(path.parent)
    if path.is_dir():
        raise StreamStudioError(f"cannot write {path}: it is a folder; give a file name for the video")
    try:
        out = av.open(str(path), "w")
    except (av.error.FFmpegError, OSError) as exc:
        raise output_error(path, exc) from exc
    count = 0
    with out:
        stream = None
        for frame in frames:
            if stream is None:
                stream = out.add_stream(_codec(), rate=Fraction(fps).limit_denominator(1000))
                stream.height, stream.width = frame.shape[0] // 2 * 2, frame.shape[1] // 2 * 2
                stream.pix_fmt = "yuv420p"
            frame = np.ascontiguousarray(frame[: stream.height, : stream.width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
            count += 1
        if stream is not None:
            for packet in stream.encode():
                out.mux(packet)
    if count == 0:
        raise StreamStudioError("no frames were made; ask for at least one frame")
    return count


# ---------------------------------------------------------------------------- entry point


def run_video_render(args) -> int:
    output = getattr(args, "output", None)
    if not output:
        raise StreamStudioError("--output FILE.mp4 is required")
    if Path(output).suffix.lower() not in (".mp4", ".mov", ".mkv"):
        raise StreamStudioError(f"--output {output}: the video pipeline writes .mp4, .mov or .mkv files")
    source = getattr(args, "input", None)
    print(f"video pipeline: {'video-to-video of ' + str(source) if source else 'text-to-video'}, "
          f"loading the model...", flush=True)
    model, meta = load_video_model(getattr(args, "model", None), getattr(args, "device", None) or "auto",
                                   getattr(args, "dtype", None) or "auto")
    from streamstudio.device import use_threads

    use_threads(getattr(args, "threads", None), next(model.parameters()).device)
    strength = getattr(args, "video_strength", None)
    strength = DEFAULT_STRENGTH if strength is None else strength  # 0 is a value, not "unset"
    stream = build_stream(model, meta, getattr(args, "prompt", None) or "",
                          strength=1.0 if not source else strength, seed=getattr(args, "seed", None) or 0,
                          width=getattr(args, "width", None), height=getattr(args, "height", None),
                          num_chunks=getattr(args, "num_chunks", None), chunk_size=getattr(args, "chunk_size", None),
                          micro_steps=getattr(args, "micro_steps", None),
                          acceleration=getattr(args, "acceleration", None) or "none")
    changes = parse_prompt_changes(getattr(args, "prompt_change", None))
    start = time.perf_counter()
    if source:
        inputs, fps, total = read_frames(source, getattr(args, "max_frames", None), getattr(args, "fps", None),
                                         with_count=True)
        frames = video_to_video(stream, inputs, changes)
    else:
        n = getattr(args, "frames", None) or getattr(args, "max_frames", None) or DEFAULT_FRAMES
        if n < 1:
            raise StreamStudioError("--frames must be at least 1")
        frames, fps, total = text_to_video(stream, n, changes), DEFAULT_FPS, n
    b = stream.cfg.buffer
    device = next(model.parameters()).device
    name = "the built-in StreamDiT" if getattr(args, "model", None) in BUILTIN_NAMES else args.model
    print(f"model {name}, {stream.cfg.width}x{stream.cfg.height}, "
          f"buffer {b.num_chunks} chunks x {b.chunk_size} frames, {b.micro_steps} micro-step(s), on {device}",
          flush=True)
    with torch.inference_mode():
        count = write_mp4(output, progress(frames, total), getattr(args, "fps", None) or fps)
    seconds = time.perf_counter() - start
    print(f"wrote {count} frames to {output} ({count / seconds:.1f} fps generated)")
    return 0
