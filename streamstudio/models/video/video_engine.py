"""The video network on TensorRT engines, and its acceleration: the StreamDiT velocity network's
export spec at a fixed buffer length and latent frame size (window attention's layout depends on
them), with a dynamic batch (`height`/`width` are latent pixels); `VideoEngine`, the network on its
engine; and `apply_video_acceleration` (none / compile / tensorrt) over the modes and engine builds
every product's networks share (`models/acceleration.py`). The image networks' counterparts are
`models/image/export_specs.py` and `models/image/acceleration.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from streamstudio.errors import StreamStudioError
from streamstudio.kernels.tensorrt.build import ShapeRange, ensure_engine
from streamstudio.kernels.tensorrt.cache import EngineCache
from streamstudio.kernels.tensorrt.export import ExportSpec, random_normal, random_uniform
from streamstudio.kernels.tensorrt.runtime import TRTEngine
from streamstudio.models.acceleration import MODES, compile_kwargs, say_once, tensorrt_missing
from streamstudio.models.video.stream_dit import StreamDiT, TextCondition, VideoNetwork
from streamstudio.kernels.tensorrt import runtime


class VideoExport(nn.Module):
    """A video velocity network model(x, t, condition) whose text condition is built from
    three tensors by `make_condition(tokens, mask, pooled)` (e.g. StreamDiT's TextCondition)."""

    def __init__(self, model: nn.Module, make_condition: Callable):
        super().__init__()
        self.model = model
        self.make_condition = make_condition

    def forward(self, x, t, text_tokens, text_mask, text_pooled):  # (B, F, C, H, W), (B, F), (B, L, D), (B, L), (B, D)
        return self.model(x, t, self.make_condition(text_tokens, text_mask, text_pooled))


def video_spec(model: nn.Module, make_condition: Callable, *, frames: int, channels: int, text_len: int,
               text_dim: int) -> ExportSpec:
    """The video network at a fixed buffer length and frame size, with a dynamic batch."""

    def make(b, h, w, device, dtype, gen):
        mask = torch.ones((b, text_len), dtype=torch.bool, device=device)  # (B, L)
        if device.type != "meta":
            mask[:, text_len // 2 + 1:] = False  # padded prompts, as the runtime wrapper feeds them
        return {"x": random_normal((b, frames, channels, h, w), device, dtype, gen),
                "t": random_uniform((b, frames), 0.0, 1.0, device, dtype, gen),
                "text_tokens": random_normal((b, text_len, text_dim), device, dtype, gen),
                "text_mask": mask,
                "text_pooled": random_normal((b, text_dim), device, dtype, gen)}

    names = ["x", "t", "text_tokens", "text_mask", "text_pooled"]
    axes = {n: {0: "batch"} for n in names + ["velocity"]}
    return ExportSpec("video", VideoExport(model, make_condition).eval(), model, names, ["velocity"], axes, make)


def video_export_spec(model: StreamDiT, frames: int, height: int, width: int) -> tuple[ExportSpec, tuple[int, int]]:
    """The StreamDiT video network's spec (fixed buffer length and frame size, dynamic batch)
    and the (height, width) to export it at."""
    cfg = model.cfg
    spec = video_spec(model, TextCondition, frames=frames, channels=cfg.in_channels,
                      text_len=cfg.text.max_tokens + 1, text_dim=cfg.hidden_size)
    return spec, (height, width)


class VideoEngine(nn.Module):
    """model(x, t, text) -> velocity for a video network exported with `video_spec`.

    `text` is any object with tokens (B, L, D), mask (B, L) and pooled (B, D) (StreamDiT's
    TextCondition); tokens are padded with masked-out zeros to the engine's text length.
    Everything else (encode_text, cfg, config) is the wrapped torch model's; one empty
    parameter reports its device and dtype (callers use next(module.parameters())).
    """

    def __init__(self, engine: TRTEngine, model: nn.Module, text_len: int):
        super().__init__()
        param = next(model.parameters())
        self.anchor = nn.Parameter(torch.empty(0, device=param.device, dtype=param.dtype), requires_grad=False)
        self.engine, self.model, self.text_len = engine, model, text_len
        self.config = getattr(model, "config", None)
        self.cfg = getattr(model, "cfg", None)

    def encode_text(self, prompts):
        return self.model.encode_text(prompts)

    def forward(self, x: torch.Tensor, t: torch.Tensor, text) -> torch.Tensor:
        tokens, mask = text.tokens, text.mask  # (B, L, D), (B, L)
        pad = self.text_len - tokens.shape[1]
        if pad < 0:
            raise ValueError(f"the video engine takes at most {self.text_len} text tokens, got {tokens.shape[1]}")
        if pad:
            tokens = torch.nn.functional.pad(tokens, (0, 0, 0, pad))
            mask = torch.nn.functional.pad(mask, (0, pad), value=False)
        out = self.engine(x=x, t=t, text_tokens=tokens, text_mask=mask, text_pooled=text.pooled)["velocity"]
        return out.to(x.dtype)  # (B, F, C, H, W)


def apply_video_acceleration(model: StreamDiT, mode: str, *, frames: int, height: int, width: int,
                             max_batch: int = 1, engine_dir: str | Path | None = None, precision: str = "fp16",
                             cuda_graphs: bool = True, compile_options: dict | None = None) -> VideoNetwork:
    """The StreamDiT network accelerated by `mode` for a buffer of `frames` latent frames of
    height x width (TensorRT engines are built for exactly that layout, batch 1..max_batch).
    Falls back to `model` (with one message) where TensorRT or a GPU is missing."""
    if mode not in MODES:
        raise StreamStudioError(f"acceleration must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none":
        return model
    device = next(model.parameters()).device
    if mode == "compile":  # (torch.compile's stubs say a plain callable; a module comes back as an
        #                     OptimizedModule that forwards encode_text and the rest to the model)
        options = {**compile_kwargs(device, cuda_graphs), **(compile_options or {})}
        return torch.compile(model, **options)  # type: ignore[return-value]
    if tensorrt_missing(device):
        return model
    spec, _ = video_export_spec(model, frames, height, width)
    shapes = ShapeRange((1, 1, max_batch), (height,) * 3, (width,) * 3)
    try:
        path = ensure_engine(spec, EngineCache(engine_dir), shapes, precision=precision)
    except Exception as exc:
        say_once(f"TensorRT engine for the video model failed ({exc}); it stays on the torch path")
        return model
    return VideoEngine(runtime.TRTEngine(path, device, cuda_graphs=cuda_graphs), model, model.cfg.text.max_tokens + 1)
