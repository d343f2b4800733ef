"""Opening a video stream: the built-in StreamDiT, a trained checkpoint folder or a Wan 2.1
checkpoint becomes a `VideoStream` with the checkpoint's sampling defaults (render --pipeline
video and the Video tab); a causal model (the built-in causal one, a causal checkpoint folder, a
released CausVid / Self-Forcing / StreamDiffusionV2 generator) a `CausalVideoStream` with the
same frame API; `VideoFrames` makes either a frame processor the runner drives."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.frames import fit_aspect
from streamstudio.pipelines.live_settings import VIDEO_SETTINGS

if TYPE_CHECKING:  # torch and the models load when a stream opens, not when the CLI parses
    import numpy as np
    import torch

    from streamstudio.models.video import wan
    from streamstudio.models.video.causal_checkpoint import CausalModel
    from streamstudio.app.streams.requests import VideoRequest
    from streamstudio.models.video.stream_dit import StreamDiT, VideoNetwork
    from streamstudio.pipelines.video.causal_video import CausalVideoStream
    from streamstudio.pipelines.video.stream_video import VideoStream
    from streamstudio.streaming.runner import Runner
    from streamstudio.streaming.sources import Source

    AnyVideoStream = VideoStream | CausalVideoStream


BUILTIN_NAMES = (None, "", "auto", "tiny", "builtin", "stream_dit_tiny")


DEFAULT_FRAMES = 48


DEFAULT_FPS = 16.0


DEFAULT_STRENGTH = VIDEO_SETTINGS["strength"].default  # video-to-video (the table's; 0.6)


LATENT_SCALE = 8  # output pixels per latent pixel by default (the checkpoint's 32x32 grid -> 256x256)


def is_causal_model(model: str | None) -> bool:
    """A causal video model's name: the built-in causal one, a causal checkpoint folder, a released
    generator's .pt file or hub id (models/video/causal_checkpoint.py)."""
    from streamstudio.models.video import causal_checkpoint as cc

    if not model:
        return False
    if model in cc.BUILTIN_CAUSAL_NAMES or model.endswith((".pt", ".pth")):
        return True
    return cc.is_causal_folder(model) or model.partition(":")[0] in cc.HUB_FILES


def load_causal_model(model: str, device: torch.device, dtype: str | torch.dtype = "auto",
                      base: str | None = None, taehv: str | None = None) -> tuple[CausalModel, dict]:
    """A causal model on `device`: a project checkpoint (the built-in one for its names) in float32 on
    CPU and float16 on a GPU for "auto"; a released Wan generator in bfloat16 on a GPU (Wan's weights),
    with `base`'s text encoder and VAE (a diffusers Wan 2.1 folder or hub id), or TAEHV (`taehv`, a
    taew2_1 weight file) for the VAE."""
    from streamstudio.device import pick_dtype
    from streamstudio.models.video import causal_checkpoint as cc
    from streamstudio.models.video import wan

    if model in cc.BUILTIN_CAUSAL_NAMES or cc.is_causal_folder(model):
        if taehv:
            raise StreamStudioError(f"{model!r} is a pixel-space causal model; TAEHV (--video-decoder taehv) decodes "
                                    "Wan 2.1 latents: give a released Self-Forcing, CausVid or StreamDiffusionV2 "
                                    "generator with --model")
        folder = cc.BUILTIN_CAUSAL if model in cc.BUILTIN_CAUSAL_NAMES else model
        loaded = cc.load_causal_checkpoint(folder, device, pick_dtype(device, dtype) if isinstance(dtype, str)
                                           else dtype)
    else:
        if isinstance(dtype, str):
            dtype = wan.default_dtype(device) if dtype == "auto" else pick_dtype(device, dtype)
        loaded = cc.load_released(model, base, device, dtype, taehv=taehv)
    return loaded, {"sampling": loaded.sampling, "causal": True, "family": loaded.family}


def load_video_model(model: str | None, device: torch.device | str = "auto", dtype: str | torch.dtype = "auto",
                     base: str | None = None, taehv: str | None = None
                     ) -> tuple[StreamDiT | wan.WanModel | CausalModel, dict]:
    """The built-in tiny StreamDiT for None/auto/tiny, else a checkpoint folder, a Wan 2.1 checkpoint
    (`load_wan_model`) or a causal model (`load_causal_model`, `base`: a released generator's Wan
    base model, `taehv`: a taew2_1 file to decode its latents with instead of the Wan VAE); on
    `device` ("auto": the GPU when there is one) in `dtype` ("auto": float16 on a
    GPU, float32 on CPU)."""
    from streamstudio.device import pick_device, pick_dtype
    from streamstudio.models.video import wan
    from streamstudio.models.video.stream_dit import BUILTIN_CHECKPOINT, load_checkpoint

    device = pick_device(device) if isinstance(device, str) else device
    if is_causal_model(model):
        assert model is not None  # (is_causal_model says False for None)
        return load_causal_model(model, device, dtype, base, taehv)
    if taehv:
        raise StreamStudioError("TAEHV (--video-decoder taehv) decodes a causal Wan 2.1 generator's latents: give a "
                                "released Self-Forcing, CausVid or StreamDiffusionV2 generator with --model")
    if model is not None and model not in BUILTIN_NAMES and wan.is_wan_model(model):  # a Wan 2.1 folder or hub id
        return load_wan_model(model, device, dtype)
    dtype = pick_dtype(device, dtype) if isinstance(dtype, str) else dtype
    if model is None or model in BUILTIN_NAMES:
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


def video_output_size(model: StreamDiT | wan.WanModel | CausalModel, meta: dict, width: int | None,
                      height: int | None, aspect: float | None = None) -> tuple[int, int]:
    """The (width, height) of the frames `build_stream` gives for these arguments, without building
    a stream (a causal stream allocates its KV cache): as asked, a side not given from `aspect`
    (None: the checkpoint's grid), the longer side the checkpoint's (a StreamDiT's latent side times
    LATENT_SCALE, a Wan checkpoint's own pixels, a causal model's as `causal_output_size`)."""
    from streamstudio.app.streams.image import output_size
    from streamstudio.models.video.causal_checkpoint import CausalModel
    from streamstudio.models.video.wan import WanModel

    if isinstance(model, CausalModel):
        from streamstudio.app.streams.causal import causal_output_size

        return causal_output_size(model, width, height, aspect)
    if isinstance(model, WanModel):
        s = model.sampling
        return output_size(width, height, max(s["height"], s["width"]), s["width"] / s["height"])
    sampling = meta.get("sampling", {})
    side = (sampling.get("height", 32), sampling.get("width", 32))
    return output_size(width, height, max(side) * LATENT_SCALE, aspect or side[1] / side[0])


def build_stream(model: StreamDiT | wan.WanModel | CausalModel, meta: dict, prompt: str, *, strength: float = 1.0,
                 seed: int = 0, width: int | None = None, height: int | None = None, aspect: float | None = None,
                 num_chunks: int | None = None, chunk_size: int | None = None, micro_steps: int | None = None,
                 guidance: float | None = None, acceleration: str = "none",
                 warmup: bool | None = None, solver: str | None = None) -> AnyVideoStream:
    """A VideoStream with the checkpoint's sampling defaults, overridden where given, on the
    model's device and dtype. Its output is `width` x `height`; a side not given follows `aspect`
    (the input's width / height; None: the checkpoint's grid) with the checkpoint's side times
    LATENT_SCALE as the longer one, as the image render sizes its output. The latent grid follows
    the output's aspect (`latent_size`). `acceleration` compile or tensorrt wraps the network for
    this buffer layout (models.video.video_engine.apply_video_acceleration). `guidance` (None: the
    checkpoint's `sampling.guidance`, else 1) is classifier-free guidance against the empty prompt.
    `warmup` (None: the checkpoint's `sampling.warmup`, else on) drops the text-to-video frames the
    start-up's uniform generation touched (`StreamBufferConfig.warmup`, issue 30). `solver` (None:
    the checkpoint's `sampling.solver`, else euler) is how a frame moves one level
    (`StreamBufferConfig.solver`); the checkpoint's `sampling.clip_sample` (a pixel-space model's)
    clips each predicted clean frame to [-1, 1]."""
    from streamstudio.models.video.video_net import StreamDiTBackbone
    from streamstudio.models.video.wan import WanModel
    from streamstudio.pipelines.video.stream_video import StreamBufferConfig, StreamVideoConfig, VideoStream

    from streamstudio.models.video.causal_checkpoint import CausalModel

    if isinstance(model, CausalModel):
        if num_chunks is not None or micro_steps is not None:
            raise StreamStudioError("--num-chunks and --micro-steps are the StreamDiT buffer's; a causal model makes "
                                    "chunks of --chunk-size latent frames in its own steps")
        from streamstudio.app.streams.causal import build_causal_stream

        return build_causal_stream(model, prompt, strength=strength, seed=seed, width=width,
                                   height=height, aspect=aspect, chunk_frames=chunk_size, acceleration=acceleration,
                                   guidance=guidance)
    if isinstance(model, WanModel):
        return build_wan_stream(model, prompt, strength=strength, seed=seed, width=width, height=height,
                                aspect=aspect, num_chunks=num_chunks, chunk_size=chunk_size,
                                micro_steps=micro_steps, guidance=guidance, acceleration=acceleration,
                                solver=solver)
    sampling = meta.get("sampling", {})
    buffer = StreamBufferConfig(
        num_chunks=num_chunks or sampling.get("num_chunks", 4),
        chunk_size=chunk_size or sampling.get("chunk_size", 2),
        micro_steps=micro_steps or sampling.get("micro_steps", 2),
        ref_frames=sampling.get("ref_frames", 0),
        strength=strength, seed=seed,
        warmup=bool(sampling.get("warmup", True) if warmup is None else warmup),
        solver=solver or sampling.get("solver", "euler"),
        clip_sample=bool(sampling.get("clip_sample", False)))
    side = (sampling.get("height", 32), sampling.get("width", 32))
    out_w, out_h = video_output_size(model, meta, width, height, aspect)
    fw, hw, ww = model.cfg.window
    lat_h, lat_w = latent_size(side, model.cfg.patch_size, (fw, hw, ww), out_w / out_h)
    cfg = StreamVideoConfig(buffer, height=lat_h, width=lat_w, out_height=out_h, out_width=out_w)
    param = next(model.parameters())
    channels = model.cfg.in_channels
    network: VideoNetwork = model
    if acceleration != "none":
        from streamstudio.models.video.video_engine import apply_video_acceleration

        network = apply_video_acceleration(model, acceleration, frames=buffer.ref_frames + buffer.frames,
                                           height=lat_h, width=lat_w)
    guidance = sampling.get("guidance", 1.0) if guidance is None else guidance
    if guidance < 0:
        raise StreamStudioError(f"video guidance must be >= 0 (1 = none), got {guidance}")
    return VideoStream(StreamDiTBackbone(network, guidance), cfg, prompt, latent_channels=channels,
                       device=param.device, dtype=param.dtype)


def open_video_stream(model: StreamDiT | wan.WanModel | CausalModel, meta: dict, request: VideoRequest,
                      aspect: float | None) -> AnyVideoStream:
    """`build_stream` with the request's prompt, seed, size and settings: video-to-video of an input of
    `aspect` (its width / height) at the request's strength (DEFAULT_STRENGTH when not given), or
    text-to-video (`aspect` None) from pure noise. A new stream starts from its seed, so a stream
    opened per file renders each file as a render of that file alone does."""
    settings = {"strength": DEFAULT_STRENGTH, **request.settings}
    if aspect is None:
        settings["strength"] = 1.0  # text-to-video starts from pure noise
    return build_stream(model, meta, request.prompt, **settings, seed=request.seed, width=request.width,
                        height=request.height, aspect=aspect, guidance=request.guidance,
                        acceleration=request.acceleration)


def video_runner(stream: AnyVideoStream, source: Source, output: str, request: VideoRequest, *,
                 fps: float | None = None, max_frames: int | None = None, no_audio: bool = False,
                 rtmp_timeout: float | None = None, on_output=None) -> Runner:
    """One render through a video stream: `source` (an input file, or text-to-video's clock of empty
    frames) through `stream` (its prompt changes and --fit from `request`) into `output` (anything
    render writes) at `fps` (None: the source's), with the source's audio unless `no_audio` or
    live, frame-aligned. `render --pipeline video` watches it with a progress bar; a video batch's
    worker runs one per file. The sink opens here; the caller starts the runner."""
    from streamstudio.app.streams.run import rtmp_config
    from streamstudio.streaming.runner import Runner, RunnerConfig
    from streamstudio.streaming.sinks import open_sink

    size = stream.out_size
    assert size is not None  # (build_stream gives every stream its output size)
    height, width = size
    audio = None if no_audio or source.info.live else source.info.audio
    sink = open_sink(output, width, height, fps or source.info.fps, audio_from=audio, rtmp=rtmp_config(rtmp_timeout))
    processor = VideoFrames(stream, request.prompt_changes, request.fit)
    return Runner(source, processor, sink, RunnerConfig(live=False, max_frames=max_frames), on_output=on_output)


def load_wan_model(model: str, device: torch.device, dtype: str | torch.dtype = "auto") -> tuple[wan.WanModel, dict]:
    """A diffusers Wan 2.1 text-to-video checkpoint (models/video/wan.py) on `device`, in bfloat16 on a
    GPU and float32 on the CPU for "auto" (Wan's weights are bfloat16); meta: its sampling defaults."""
    from streamstudio.device import pick_dtype
    from streamstudio.models.video import wan

    if isinstance(dtype, str):
        dtype = wan.default_dtype(device) if dtype == "auto" else pick_dtype(device, dtype)
    loaded = wan.load_wan(model, device, dtype)
    return loaded, {"sampling": loaded.sampling, "wan": True}


def build_wan_stream(model: wan.WanModel, prompt: str, *, strength: float = 1.0, seed: int = 0,
                     width: int | None = None, height: int | None = None, aspect: float | None = None,
                     num_chunks: int | None = None, chunk_size: int | None = None, micro_steps: int | None = None,
                     guidance: float | None = None, acceleration: str = "none",
                     solver: str | None = None) -> VideoStream:
    """Text-to-video over a Wan checkpoint: its transformer as the backbone (per-frame timesteps),
    its VAE decoding the chunks as one continuing video (`WanCodec.stream`: the first chunk of c
    latent frames gives 1 + 4 (c - 1) frames, every later chunk 4c), the Wan sampling defaults
    (480x832, flow shift 3, guidance 5, N=4 c=2 s=2) where not overridden. The latent grid is the
    output's size / 8 to the nearest patch; decoded frames are resized to the output size."""
    from streamstudio.pipelines.video.stream_video import StreamBufferConfig, StreamVideoConfig, VideoStream

    if strength < 1 or aspect is not None:
        raise StreamStudioError("a Wan checkpoint runs text-to-video only here (its VAE packs 4 frames into one "
                                "latent frame, and video-to-video feeds the buffer frame by frame): leave --input out")
    if acceleration not in ("none", "compile"):
        raise StreamStudioError(f"--acceleration {acceleration} is not available for a Wan checkpoint; "
                                "use none or compile")
    s = model.sampling
    buffer = StreamBufferConfig(num_chunks=num_chunks or s["num_chunks"], chunk_size=chunk_size or s["chunk_size"],
                                micro_steps=micro_steps or s["micro_steps"], shift=s["shift"], seed=seed,
                                solver=solver or s.get("solver", "euler"))
    out_w, out_h = video_output_size(model, {}, width, height, None)
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

    def __init__(self, stream: AnyVideoStream, changes: dict[int, str] | None = None, fit: str = "crop"):
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
                size = self.stream.out_size
                assert size is not None  # (build_stream gives every stream its output size)
                height, width = size
                out = self.stream.push(fit_aspect(frame, width, height, self.fit))
        self.index += 1
        return out

    def flush(self) -> list[np.ndarray]:
        if self.stream.mode != "video-to-video":
            return []  # text-to-video handed out one frame per input already
        import torch

        with torch.inference_mode():
            return self.stream.flush()
