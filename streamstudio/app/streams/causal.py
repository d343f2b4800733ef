"""Opening a causal video stream (issue 49): a loaded `CausalModel` (models/video/causal_checkpoint.py)
becomes a `CausalVideoStream` with its checkpoint's sampling defaults, at the output size asked for;
`app/streams/video.build_stream` hands causal models here, so render, the Video tab and the web
streams open them the same way as StreamDiT ones."""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any

import torch

from streamstudio.app.streams.image import output_size
from streamstudio.errors import StreamStudioError
from streamstudio.models.video.causal_backbone import CausalWanBackbone
from streamstudio.models.video.causal_checkpoint import CausalModel
from streamstudio.pipelines.live_settings import VIDEO_SETTINGS
from streamstudio.pipelines.video.causal_video import CausalConfig, CausalStreamConfig, CausalVideoStream

log = logging.getLogger(__name__)

DEFAULT_STRENGTH = VIDEO_SETTINGS["strength"].default
PIXEL_SCALE = 8  # a pixel-space model's output pixels per model pixel by default (32x32 -> 256x256)


def latent_grid(model: CausalModel, out_w: int, out_h: int) -> tuple[int, int]:
    """The latent (height, width) for an output of out_w x out_h: a pixel-space model keeps its
    trained longer side and follows the aspect with the other; a VAE model's grid is the output
    over the VAE's factor. Both to a multiple of the patch."""
    _, ph, pw = model.model.cfg.patch_size
    s = model.sampling
    spatial = model.codec.spatial
    if spatial == 1:
        long_side = max(int(s.get("height", 32)), int(s.get("width", 32)))
        if out_w >= out_h:
            return max(ph, round(long_side * out_h / out_w / ph) * ph), long_side
        return long_side, max(pw, round(long_side * out_w / out_h / pw) * pw)
    return max(ph, round(out_h / spatial / ph) * ph), max(pw, round(out_w / spatial / pw) * pw)


def causal_output_size(model: CausalModel, width: int | None, height: int | None,
                       aspect: float | None) -> tuple[int, int]:
    """The (width, height) a causal stream of `model` gives (`build_causal_stream`'s output): as
    asked, a side not given from `aspect` (None: the model's own grid), the longer side the model's
    size (a pixel-space model's times PIXEL_SCALE, a VAE model's times its factor) by default."""
    s = model.sampling
    side = max(int(s.get("height", 32)), int(s.get("width", 32)))
    default = side * (PIXEL_SCALE if model.codec.spatial == 1 else model.codec.spatial)
    return output_size(width, height, default, aspect or int(s.get("width", 32)) / int(s.get("height", 32)))


def build_causal_stream(model: CausalModel, prompt: str, *, strength: float = 1.0, seed: int = 0,
                        width: int | None = None, height: int | None = None, aspect: float | None = None,
                        chunk_frames: int | None = None, acceleration: str = "none",
                        guidance: float | None = None) -> CausalVideoStream:
    """A CausalVideoStream over `model` with its sampling defaults (chunk frames, steps, shift,
    window, sink; a StreamDiffusionV2 checkpoint's video-to-video noise level and motion-aware
    strength) overridden by `strength` (video-to-video: the input's noise level; 1 =
    text-to-video), `chunk_frames` and `guidance` (against the empty prompt; None: the checkpoint's).
    Its output is `width` x `height`, a side not given from
    `aspect` (the input's), the longer side the model's own size by default."""
    if acceleration not in ("none", "compile"):
        raise StreamStudioError(f"--acceleration {acceleration} is not available for a causal model; use none or "
                                "compile")
    s = model.sampling
    known = {f.name for f in fields(CausalConfig)}
    values: dict[str, Any] = {k: (tuple(v) if k == "steps" else v) for k, v in s.items() if k in known}
    if strength < 1:  # video-to-video: the strength asked for; the table's default (asked for by no one)
        #               gives way to a checkpoint's own (StreamDiffusionV2's 0.8)
        values["strength"] = s["strength"] if "strength" in s and strength == DEFAULT_STRENGTH else strength
    else:
        values["strength"], values["motion_aware"] = 1.0, False
    if chunk_frames is not None:
        values["chunk_frames"] = chunk_frames
    if guidance is not None:  # (None: the checkpoint's, its first chunk's too; the distilled ones have none)
        values["guidance"], values["first_guidance"] = guidance, None
    cfg = CausalConfig(**{**values, "seed": seed})
    out_w, out_h = causal_output_size(model, width, height, aspect)
    lat_h, lat_w = latent_grid(model, out_w, out_h)
    network = model.model
    if acceleration == "compile":  # (an OptimizedModule: the module to its callers)
        network = torch.compile(network)  # type: ignore[assignment]
    backbone = CausalWanBackbone(network, model.text_encoder)
    stream_cfg = CausalStreamConfig(cfg, height=lat_h, width=lat_w, out_height=out_h, out_width=out_w,
                                    temporal=model.temporal)
    stream = CausalVideoStream(backbone, stream_cfg, prompt, codec=model.codec)
    log.info("causal stream: %dx%d latents, chunks of %d, %d steps, window %d (sink %d), cache %.1f MB",
             lat_w, lat_h, cfg.chunk_frames, len(cfg.steps), cfg.window, cfg.sink,
             stream.sampler.cache_bytes / 1e6)
    return stream
