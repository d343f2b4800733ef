"""Acceleration of a model's networks: `apply_acceleration(comps, mode)` with mode

- "none":     the components as they are;
- "compile":  torch.compile of the UNet and of the VAE's encode/decode (CUDA graphs through
              mode="reduce-overhead" on a GPU; plain inductor on CPU);
- "tensorrt": fp16 TensorRT engines of the UNet and the VAE encoder / decoder (TAESD too), built
              once into the engine cache and wrapped as drop-in modules. Without TensorRT (or a
              GPU) it says so once and keeps the torch path.

Also the two halves of `streamstudio build-engines`: `export_onnx_models` (ONNX files checked
against onnxruntime; no GPU needed) and `build_engines` (TensorRT).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from streamstudio.errors import StreamStudioError
from streamstudio.kernels import tensorrt as trt_kernels
from streamstudio.kernels.tensorrt.build import PRECISIONS, ShapeRange, ensure_engine
from streamstudio.kernels.tensorrt.cache import EngineCache
from streamstudio.kernels.tensorrt.export import (ExportSpec, OnnxCheck, check_onnx, export_onnx, unet_spec,
                                                  vae_decoder_spec, vae_encoder_spec, video_spec)
from streamstudio.models.loading import SDComponents

log = logging.getLogger(__name__)

MODES = ("none", "compile", "tensorrt")
IMAGE_PARTS = ("unet", "vae_encoder", "vae_decoder")
_said: set[str] = set()


def say_once(message: str) -> None:
    """Warn (and log) a message once per process."""
    if message in _said:
        return
    _said.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    log.warning(message)


def apply_acceleration(comps: SDComponents, mode: str, *, engine_dir: str | Path | None = None,
                       shapes: ShapeRange | None = None, precision: str = "fp16", cuda_graphs: bool = True,
                       parts: tuple[str, ...] = IMAGE_PARTS, compile_options: dict | None = None) -> SDComponents:
    """New SDComponents whose UNet and VAE are accelerated by `mode` (the inputs are not changed).

    shapes: the batch / resolution range TensorRT engines cover (default batch 1..4, 256..1024
      pixels, optimized for 1 x 512 x 512); the UNet's batch is the stream's N * frame_buffer_size
      (twice that for full CFG), so give a range that holds it.
    parts: which networks the TensorRT mode replaces.
    compile_options: extra torch.compile arguments (e.g. {"backend": "aot_eager"}).
    """
    if mode not in MODES:
        raise StreamStudioError(f"acceleration must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none":
        return comps
    if mode == "compile":
        return _compiled(comps, cuda_graphs, compile_options or {})
    return _tensorrt(comps, engine_dir, shapes or ShapeRange(), precision, cuda_graphs, parts)


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------

class CompiledVAE(nn.Module):
    """A VAE whose encode / decode run through torch.compile; config and other attributes
    are the wrapped VAE's.

    encode never uses CUDA graphs: the stream keeps the input latents across calls (flush
    feeds the last input again), and a graph replay would overwrite them; decode's images are
    converted to frames at once, so it may."""

    def __init__(self, vae: nn.Module, **compile_kwargs):
        super().__init__()
        self.vae = vae
        encode_kwargs = {k: v for k, v in compile_kwargs.items() if not (k == "mode" and v == "reduce-overhead")}
        self._encode = torch.compile(vae.encode, **encode_kwargs)
        self._decode = torch.compile(vae.decode, **compile_kwargs)

    @property
    def config(self):
        return self.vae.config

    def encode(self, images: torch.Tensor, *args, **kwargs):
        return self._encode(images, *args, **kwargs)

    def decode(self, latents: torch.Tensor, *args, **kwargs):
        return self._decode(latents, *args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.vae(*args, **kwargs)


def compile_kwargs(device: torch.device, cuda_graphs: bool) -> dict:
    """reduce-overhead (CUDA graphs) on a GPU when asked; inductor's default elsewhere."""
    if device.type == "cuda" and cuda_graphs:
        return {"mode": "reduce-overhead"}
    return {}


def _compiled(comps: SDComponents, cuda_graphs: bool, options: dict) -> SDComponents:
    device = next(comps.unet.parameters()).device
    kw = {**compile_kwargs(device, cuda_graphs), **options}
    unet = torch.compile(comps.unet, **kw)
    vae = CompiledVAE(comps.vae, **kw)
    note = f"acceleration: torch.compile ({', '.join(f'{k}={v}' for k, v in kw.items()) or 'default'})"
    return replace(comps, unet=unet, vae=vae, notes=[*comps.notes, note])


# ---------------------------------------------------------------------------------------------
# TensorRT
# ---------------------------------------------------------------------------------------------

def image_specs(comps: SDComponents, parts: tuple[str, ...] = IMAGE_PARTS) -> list[ExportSpec]:
    """Export specs of the image model's networks (UNet, VAE encoder, VAE decoder)."""
    text_len = int(getattr(comps.tokenizer, "model_max_length", 77))
    makers = {"unet": lambda: unet_spec(comps.unet, text_len=text_len, latent_scale=comps.vae_scale_factor),
              "vae_encoder": lambda: vae_encoder_spec(comps.vae), "vae_decoder": lambda: vae_decoder_spec(comps.vae)}
    unknown = [p for p in parts if p not in makers]
    if unknown:
        raise StreamStudioError(f"unknown network(s) {unknown}; choose from {', '.join(makers)}")
    return [makers[p]() for p in parts]


def _tensorrt(comps: SDComponents, engine_dir, shapes: ShapeRange, precision: str, cuda_graphs: bool,
              parts: tuple[str, ...]) -> SDComponents:
    if not trt_kernels.tensorrt_available():
        say_once(f"{trt_kernels.INSTALL_HINT}; acceleration 'tensorrt' falls back to the torch path")
        return replace(comps, notes=[*comps.notes, "acceleration: tensorrt unavailable, torch path"])
    device = next(comps.unet.parameters()).device
    if device.type != "cuda":
        say_once("TensorRT engines need the model on a CUDA GPU; acceleration 'tensorrt' falls back to the torch path")
        return replace(comps, notes=[*comps.notes, "acceleration: tensorrt needs a GPU, torch path"])
    from streamstudio.kernels.tensorrt.runtime import TRTEngine, UNetEngine, VAEEngine

    cache = EngineCache(engine_dir)
    engines: dict[str, TRTEngine] = {}
    for spec in image_specs(comps, parts):
        try:
            path = ensure_engine(spec, cache, shapes, precision=precision)
            engines[spec.name] = TRTEngine(path, device, cuda_graphs=cuda_graphs)
        except Exception as exc:  # a parser / builder failure keeps that network on torch
            say_once(f"TensorRT engine for {spec.name} failed ({exc}); that network stays on the torch path")
    unet = UNetEngine(engines["unet"], comps.unet) if "unet" in engines else comps.unet
    vae = comps.vae
    if "vae_encoder" in engines or "vae_decoder" in engines:
        vae = VAEEngine(comps.vae, engines.get("vae_encoder"), engines.get("vae_decoder"))
    note = f"acceleration: tensorrt {precision} ({', '.join(engines) or 'no engines'}) from {cache.root}"
    return replace(comps, unet=unet, vae=vae, notes=[*comps.notes, note])


@dataclass
class ExportResult:
    name: str
    path: Path
    check: OnnxCheck | None


def export_onnx_models(specs: list[ExportSpec], out_dir: str | Path, *, batch: int = 1, height: int = 512,
                       width: int = 512, check: bool = True, check_size: tuple[int, int, int] | None = None,
                       dynamo: bool = False) -> list[ExportResult]:
    """Export each spec to <out_dir>/<name>/model.onnx and (check=True) compare onnxruntime
    with torch on fresh inputs of `check_size` (batch, height, width; default: the export's)."""
    results = []
    for spec in specs:
        path = export_onnx(spec, Path(out_dir) / spec.name / "model.onnx", batch=batch, height=height,
                           width=width, dynamo=dynamo)
        result = None
        if check:
            b, h, w = check_size or (batch, height, width)
            result = check_onnx(spec, path, batch=b, height=h, width=w)
        results.append(ExportResult(spec.name, path, result))
    return results


def build_engines(specs: list[ExportSpec], engine_dir: str | Path | None = None, *,
                  shapes: ShapeRange = ShapeRange(), precision: str = "fp16") -> list[Path]:
    """TensorRT engines of every spec into the cache (TensorRT and a GPU needed)."""
    if precision not in PRECISIONS:
        raise StreamStudioError(f"precision must be one of {', '.join(PRECISIONS)}")
    trt_kernels.require_tensorrt()
    cache = EngineCache(engine_dir)
    return [ensure_engine(spec, cache, shapes, precision=precision) for spec in specs]


def video_export_spec(model: nn.Module, frames: int, height: int, width: int) -> tuple[ExportSpec, tuple[int, int]]:
    """The StreamDiT video network's spec (fixed buffer length and frame size, dynamic batch)
    and the (height, width) to export it at."""
    from streamstudio.models.stream_dit import TextCondition

    cfg = model.cfg
    spec = video_spec(model, TextCondition, frames=frames, channels=cfg.in_channels,
                      text_len=cfg.text.max_tokens + 1, text_dim=cfg.hidden_size)
    return spec, (height, width)


def apply_video_acceleration(model: nn.Module, mode: str, *, frames: int, height: int, width: int,
                             max_batch: int = 1, engine_dir: str | Path | None = None, precision: str = "fp16",
                             cuda_graphs: bool = True, compile_options: dict | None = None) -> nn.Module:
    """The StreamDiT network accelerated by `mode` for a buffer of `frames` latent frames of
    height x width (TensorRT engines are built for exactly that layout, batch 1..max_batch).
    Falls back to `model` (with one message) where TensorRT or a GPU is missing."""
    if mode not in MODES:
        raise StreamStudioError(f"acceleration must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none":
        return model
    device = next(model.parameters()).device
    if mode == "compile":
        return torch.compile(model, **{**compile_kwargs(device, cuda_graphs), **(compile_options or {})})
    if not trt_kernels.tensorrt_available():
        say_once(f"{trt_kernels.INSTALL_HINT}; acceleration 'tensorrt' falls back to the torch path")
        return model
    if device.type != "cuda":
        say_once("TensorRT engines need the model on a CUDA GPU; acceleration 'tensorrt' falls back to the torch path")
        return model
    from streamstudio.kernels.tensorrt.runtime import TRTEngine, VideoEngine

    spec, _ = video_export_spec(model, frames, height, width)
    shapes = ShapeRange((1, 1, max_batch), (height,) * 3, (width,) * 3)
    try:
        path = ensure_engine(spec, EngineCache(engine_dir), shapes, precision=precision)
    except Exception as exc:
        say_once(f"TensorRT engine for the video model failed ({exc}); it stays on the torch path")
        return model
    return VideoEngine(TRTEngine(path, device, cuda_graphs=cuda_graphs), model, model.cfg.text.max_tokens + 1)
