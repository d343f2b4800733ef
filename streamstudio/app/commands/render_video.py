"""Rendering with the streaming video model (StreamDiT-style): text-to-video and video-to-video.

`streamstudio render --pipeline video --prompt "a red circle moving left" --frames 48 --output out.mp4`
`streamstudio render --pipeline video --input in.mp4 --prompt "..." --output out.mp4`

`run_video_render(args)` is called by `streamstudio render`; `add_video_arguments(parser)` adds
the video-only options. Frames take the one road every front end takes (streaming.Runner from
`open_source` to `open_sink`): text-to-video from a clock of empty frames, video-to-video from
any input render reads, into any output render writes, with the input's audio kept. An input of
another aspect ratio than the output is cropped or padded to it (--fit), never stretched; without
--width/--height the output takes the input's aspect ratio, and the network's latent grid follows
the output's aspect to within one patch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.frames import fit_aspect

if TYPE_CHECKING:  # torch and the models load when a render runs, not when the CLI parses
    import numpy as np
    import torch

    from streamstudio.models import wan
    from streamstudio.pipelines.stream_video import VideoStream

log = logging.getLogger(__name__)

BUILTIN_NAMES = (None, "", "auto", "tiny", "builtin", "stream_dit_tiny")
DEFAULT_FRAMES = 48
DEFAULT_FPS = 16.0
DEFAULT_STRENGTH = 0.6
LATENT_SCALE = 8  # output pixels per latent pixel by default (the checkpoint's 32x32 grid -> 256x256)


def add_video_arguments(parser: argparse.ArgumentParser) -> None:
    from streamstudio.app.settings import number

    g = parser.add_argument_group("video pipeline (--pipeline video)")
    g.add_argument("--frames", type=number(int, 1, 10**7), default=None, help=f"text-to-video: frames to make (default {DEFAULT_FRAMES})")
    g.add_argument("--video-strength", type=number(float, 0, 1, low_open=True), default=DEFAULT_STRENGTH,
                   help=f"video-to-video: how much of each input frame is re-generated, in (0, 1] (default {DEFAULT_STRENGTH})")
    g.add_argument("--num-chunks", type=number(int, 1, 64), default=None, help="buffer chunks N (default: the checkpoint's)")
    g.add_argument("--chunk-size", type=number(int, 1, 64), default=None, help="frames per chunk c (default: the checkpoint's)")
    g.add_argument("--micro-steps", type=number(int, 1, 64), default=None, help="micro-steps per chunk s (default: the checkpoint's)")
    g.add_argument("--video-guidance", type=number(float, 0, 30), default=None,
                   help="classifier-free guidance of the video model against the empty prompt (default: the "
                        "checkpoint's; 1 = none, one network call per step, 2x the calls otherwise)")
    g.add_argument("--prompt-change", action="append", default=None, metavar="FRAME:PROMPT",
                   help="switch to PROMPT from output frame FRAME on (repeatable)")


# ---------------------------------------------------------------------------- model and stream


def load_video_model(model: str | None, device: torch.device | str = "auto", dtype: str | torch.dtype = "auto"
                     ) -> tuple[torch.nn.Module, dict]:
    """The built-in tiny StreamDiT for None/auto/tiny, else a checkpoint folder, or a Wan 2.1 checkpoint
    (`load_wan_model`); on `device` ("auto": the GPU when there is one) in `dtype` ("auto": float16 on
    a GPU, float32 on CPU)."""
    from streamstudio.device import pick_device, pick_dtype
    from streamstudio.models import wan
    from streamstudio.models.stream_dit import BUILTIN_CHECKPOINT, load_checkpoint

    device = pick_device(device) if isinstance(device, str) else device
    if model not in BUILTIN_NAMES and wan.is_wan_model(model):  # a diffusers Wan 2.1 folder or hub id
        return load_wan_model(model, device, dtype)
    dtype = pick_dtype(device, dtype) if isinstance(dtype, str) else dtype
    if model in BUILTIN_NAMES:
        return load_checkpoint(BUILTIN_CHECKPOINT, device, dtype)
    path = Path(model)
    if path.is_file():  # the model.safetensors inside a checkpoint folder
        path = path.parent
    try:
        return load_checkpoint(path, device, dtype)
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"{exc}; or give {wan.WAN_HINT}") from exc


def latent_size(side: tuple[int, int], patch: int, window: tuple[int, int, int], aspect: float) -> tuple[int, int]:
    """The latent (height, width) for frames of `aspect` (width / height): the checkpoint's longer
    side kept, the other the nearest token count the attention windows tile (at most a window,
    or a multiple of one), so the network sees the picture unstretched to within a patch."""
    long_tokens = max(side) // patch

    def tokens(target: float, win: int) -> int:
        options = [t for t in range(1, long_tokens + 1) if t <= win or t % win == 0]
        return min(options, key=lambda t: (abs(t - target), -t))

    if aspect >= 1:
        return tokens(long_tokens / aspect, window[1]) * patch, long_tokens * patch
    return long_tokens * patch, tokens(long_tokens * aspect, window[2]) * patch


def build_stream(model: torch.nn.Module, meta: dict, prompt: str, *, strength: float = 1.0, seed: int = 0,
                 width: int | None = None, height: int | None = None, aspect: float | None = None,
                 num_chunks: int | None = None, chunk_size: int | None = None, micro_steps: int | None = None,
                 guidance: float | None = None, acceleration: str = "none") -> VideoStream:
    """A VideoStream with the checkpoint's sampling defaults, overridden where given, on the
    model's device and dtype. Its output is `width` x `height`; a side not given follows `aspect`
    (the input's width / height; None: the checkpoint's grid) with the checkpoint's side times
    LATENT_SCALE as the longer one, as the image render sizes its output. The latent grid follows
    the output's aspect (`latent_size`). `acceleration` compile or tensorrt wraps the network for
    this buffer layout (models.acceleration.apply_video_acceleration). `guidance` (None: the
    checkpoint's `sampling.guidance`, else 1) is classifier-free guidance against the empty prompt."""
    from streamstudio.app.commands.generate import output_size
    from streamstudio.pipelines.stream_video import (StreamBufferConfig, StreamDiTBackbone, StreamVideoConfig,
                                                     VideoStream)

    if getattr(model, "is_wan", False):
        return build_wan_stream(model, prompt, strength=strength, seed=seed, width=width, height=height,
                                aspect=aspect, num_chunks=num_chunks, chunk_size=chunk_size,
                                micro_steps=micro_steps, guidance=guidance, acceleration=acceleration)
    sampling = meta.get("sampling", {})
    buffer = StreamBufferConfig(
        num_chunks=num_chunks or sampling.get("num_chunks", 4),
        chunk_size=chunk_size or sampling.get("chunk_size", 2),
        micro_steps=micro_steps or sampling.get("micro_steps", 2),
        ref_frames=sampling.get("ref_frames", 0),
        strength=strength, seed=seed)
    side = (sampling.get("height", 32), sampling.get("width", 32))
    out_w, out_h = output_size(width, height, max(side) * LATENT_SCALE, aspect or side[1] / side[0])
    lat_h, lat_w = latent_size(side, model.cfg.patch_size, tuple(model.cfg.window), out_w / out_h)
    cfg = StreamVideoConfig(buffer, height=lat_h, width=lat_w, out_height=out_h, out_width=out_w)
    param = next(model.parameters())
    channels = model.cfg.in_channels
    if acceleration != "none":
        from streamstudio.models.acceleration import apply_video_acceleration

        model = apply_video_acceleration(model, acceleration, frames=buffer.ref_frames + buffer.frames,
                                         height=lat_h, width=lat_w)
    guidance = sampling.get("guidance", 1.0) if guidance is None else guidance
    if guidance < 0:
        raise StreamStudioError(f"video guidance must be >= 0 (1 = none), got {guidance}")
    return VideoStream(StreamDiTBackbone(model, guidance), cfg, prompt, latent_channels=channels, device=param.device,
                       dtype=param.dtype)


# ---------------------------------------------------------------------------- Wan 2.1 checkpoints


def load_wan_model(model: str, device: torch.device, dtype: str | torch.dtype = "auto") -> tuple[wan.WanModel, dict]:
    """A diffusers Wan 2.1 text-to-video checkpoint (models/wan.py) on `device`, in bfloat16 on a
    GPU and float32 on the CPU for "auto" (Wan's weights are bfloat16); meta: its sampling defaults."""
    from streamstudio.device import pick_dtype
    from streamstudio.models import wan

    if isinstance(dtype, str):
        dtype = wan.default_dtype(device) if dtype == "auto" else pick_dtype(device, dtype)
    model = wan.load_wan(model, device, dtype)
    return model, {"sampling": model.sampling, "wan": True}


def build_wan_stream(model: wan.WanModel, prompt: str, *, strength: float = 1.0, seed: int = 0,
                     width: int | None = None, height: int | None = None, aspect: float | None = None,
                     num_chunks: int | None = None, chunk_size: int | None = None, micro_steps: int | None = None,
                     guidance: float | None = None, acceleration: str = "none") -> VideoStream:
    """Text-to-video over a Wan checkpoint: its transformer as the backbone (per-frame timesteps),
    its VAE decoding the chunks as one continuing video (`WanCodec.stream`: the first chunk of c
    latent frames gives 1 + 4 (c - 1) frames, every later chunk 4c), the Wan sampling defaults
    (480x832, flow shift 3, guidance 5, N=4 c=2 s=2) where not overridden. The latent grid is the
    output's size / 8 to the nearest patch; decoded frames are resized to the output size."""
    from streamstudio.app.commands.generate import output_size
    from streamstudio.pipelines.stream_video import StreamBufferConfig, StreamVideoConfig, VideoStream

    if strength < 1 or aspect is not None:
        raise StreamStudioError("a Wan checkpoint runs text-to-video only here (its VAE packs 4 frames into one "
                                "latent frame, and video-to-video feeds the buffer frame by frame): leave --input out")
    if acceleration not in ("none", "compile"):
        raise StreamStudioError(f"--acceleration {acceleration} is not available for a Wan checkpoint; "
                                "use none or compile")
    s = model.sampling
    buffer = StreamBufferConfig(num_chunks=num_chunks or s["num_chunks"], chunk_size=chunk_size or s["chunk_size"],
                                micro_steps=micro_steps or s["micro_steps"], shift=s["shift"], seed=seed)
    out_w, out_h = output_size(width, height, max(s["height"], s["width"]), s["width"] / s["height"])
    lat_h, lat_w = model.latent_size(out_h, out_w)
    cfg = StreamVideoConfig(buffer, height=lat_h, width=lat_w, out_height=out_h, out_width=out_w, decode_overlap=0)
    guidance = s["guidance"] if guidance is None else guidance
    if guidance < 0:
        raise StreamStudioError(f"video guidance must be >= 0 (1 = none), got {guidance}")
    return VideoStream(model.backbone(guidance, compile=acceleration == "compile"), cfg, prompt,
                       codec=model.codec.stream(), device=model.device, dtype=model.dtype,
                       latent_channels=model.latent_channels)


def parse_prompt_changes(items: Iterable[str] | None) -> dict[int, str]:
    changes = {}
    for item in items or []:
        frame, sep, prompt = item.partition(":")
        if not sep or not frame.strip().isdigit():
            raise StreamStudioError(f"--prompt-change {item!r}: write FRAME:PROMPT, e.g. 24:a blue square moving up")
        changes[int(frame)] = prompt.strip()
    return changes


class VideoFrames:
    """A VideoStream as the runner's frame processor, frame-aligned (output i is input i).

    Text-to-video: `push(None)` hands out the next generated frame (a chunk is made when none is
    left). Video-to-video: `push(frame)` crops or pads the frame to the output's aspect (`fit`)
    and hands out the frames that finished; `flush()` the rest. A prompt change at frame i
    applies to what the model makes from frame i on. Runs in inference mode (in the runner's
    processing thread)."""

    def __init__(self, stream: VideoStream, changes: dict[int, str] | None = None, fit: str = "crop"):
        self.stream, self.fit = stream, fit
        self.changes = dict(changes or {})
        self.index = 0  # the next frame's number
        self._made: deque[np.ndarray] = deque()  # text-to-video: generated frames not handed out yet

    def _apply_changes(self) -> None:
        for at in sorted(k for k in self.changes if k <= self.index):
            self.stream.set_prompt(self.changes.pop(at))

    def push(self, frame: np.ndarray | None) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            if frame is None:
                while not self._made:
                    self._apply_changes()
                    self._made.extend(self.stream.push(None))
                out = [self._made.popleft()]
            else:
                self._apply_changes()
                height, width = self.stream.out_size
                out = self.stream.push(fit_aspect(frame, width, height, self.fit))
        self.index += 1
        return out

    def flush(self) -> list[np.ndarray]:
        if self.stream.mode != "video-to-video":
            return []  # text-to-video handed out one frame per input already
        import torch

        with torch.inference_mode():
            return self.stream.flush()


# ---------------------------------------------------------------------------- entry point


def open_input(spec: str, fps: float | None):
    """The video-to-video input (anything `render --input` takes), at `fps` when given."""
    from streamstudio.streaming.sources import open_source, resample_file

    try:
        source = open_source(spec, fps=fps, realtime=False)
    except StreamStudioError as exc:
        raise StreamStudioError(f"{exc} (video-to-video); or leave --input out for text-to-video") from exc
    try:
        return resample_file(source, fps)
    except BaseException:
        source.close()
        raise


def run_video_render(args) -> int:
    from streamstudio.app.commands.render import expected_frames, rtmp_config, watch
    from streamstudio.device import use_threads
    from streamstudio.streaming.runner import Runner, RunnerConfig
    from streamstudio.streaming.sinks import open_sink
    from streamstudio.streaming.sources import NoInputSource

    output = getattr(args, "output", None)
    if not output:
        raise StreamStudioError("--output is required: a video file, a folder, rtmp://... or hls:DIR")
    spec, fps, max_frames = getattr(args, "input", None), getattr(args, "fps", None), getattr(args, "max_frames", None)
    frames = getattr(args, "frames", None) or max_frames or DEFAULT_FRAMES
    if not spec and frames < 1:
        raise StreamStudioError("--frames must be at least 1")
    print(f"video pipeline: {'video-to-video of ' + str(spec) if spec else 'text-to-video'}, "
          f"loading the model...", flush=True)
    source = open_input(spec, fps) if spec else None
    try:
        model, meta = load_video_model(getattr(args, "model", None), getattr(args, "device", None) or "auto",
                                       getattr(args, "dtype", None) or "auto")
        use_threads(getattr(args, "threads", None), next(model.parameters()).device)
        strength = getattr(args, "video_strength", None)
        strength = DEFAULT_STRENGTH if strength is None else strength  # 0 is a value, not "unset"
        aspect = source.info.width / source.info.height if source is not None else None
        stream = build_stream(model, meta, getattr(args, "prompt", None) or "",
                              strength=1.0 if source is None else strength, seed=getattr(args, "seed", None) or 0,
                              width=getattr(args, "width", None), height=getattr(args, "height", None),
                              aspect=aspect, num_chunks=getattr(args, "num_chunks", None),
                              chunk_size=getattr(args, "chunk_size", None),
                              micro_steps=getattr(args, "micro_steps", None),
                              guidance=getattr(args, "video_guidance", None),
                              acceleration=getattr(args, "acceleration", None) or "none")
        height, width = stream.out_size
        if source is None:
            source = NoInputSource(frames, fps or DEFAULT_FPS, width, height, description="text-to-video")
        audio = None if getattr(args, "no_audio", False) or source.info.live else source.info.audio
        sink = open_sink(output, width, height, fps or source.info.fps, audio_from=audio, rtmp=rtmp_config(args))
    except BaseException:
        if source is not None:
            source.close()
        raise
    fit = getattr(args, "fit", None) or "crop"
    processor = VideoFrames(stream, parse_prompt_changes(getattr(args, "prompt_change", None)), fit)
    b = stream.cfg.buffer
    name = "the built-in StreamDiT" if getattr(args, "model", None) in BUILTIN_NAMES else args.model
    fitted = f" ({fit})" if aspect is not None and abs(aspect - width / height) >= 0.01 else ""
    print(f"model {name}, {width}x{height}{fitted}, buffer {b.num_chunks} chunks x {b.chunk_size} frames, "
          f"{b.micro_steps} micro-step(s), on {next(model.parameters()).device}", flush=True)
    info = source.info
    total = info.frame_count or (round(info.duration * info.fps) if info.duration else None)
    runner = Runner(source, processor, sink, RunnerConfig(live=False, max_frames=max_frames))
    metrics = watch(runner, expected_frames(total, max_frames), desc="video")
    for warning in metrics.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {metrics.frames_out} frames to {output} "
          f"({metrics.frames_out / max(metrics.elapsed, 1e-9):.1f} fps generated)")
    return 0
