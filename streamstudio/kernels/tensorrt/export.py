"""ONNX export of the networks (opset >= 18) and the check against onnxruntime.

An `ExportSpec` turns a module into a tensors-in, tensor-out wrapper with named inputs,
dynamic axes (batch and resolution) and a way to make inputs of any (batch, height, width),
which the export, the onnxruntime check and the TensorRT profiles all use.
`height`/`width` are image pixels for the UNet and VAE specs (latents are 1/8 of them) and
latent frames' size for the video spec.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

log = logging.getLogger(__name__)

DEFAULT_OPSET = 18
InputMaker = Callable[[int, int, int, torch.device, torch.dtype, torch.Generator | None], dict[str, torch.Tensor]]


@dataclass
class ExportSpec:
    name: str  # "unet", "vae_encoder", "vae_decoder", "video"
    module: nn.Module  # tensors-in wrapper around `source`
    source: nn.Module  # the original module (its weights and config identify engines)
    input_names: list[str]
    output_names: list[str]
    dynamic_axes: dict[str, dict[int, str]]
    make_inputs: InputMaker  # (batch, height, width, device, dtype, generator) -> {name: tensor}

    def input_shapes(self, batch: int, height: int, width: int) -> dict[str, tuple[int, ...]]:
        meta = self.make_inputs(batch, height, width, torch.device("meta"), torch.float32, None)
        return {name: tuple(t.shape) for name, t in meta.items()}

    def param(self) -> torch.Tensor:
        return next(self.source.parameters())


def _randn(shape, device, dtype, gen):
    if device.type == "meta":
        return torch.empty(shape, device=device, dtype=dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device, dtype)


def _uniform(shape, low, high, device, dtype, gen):
    if device.type == "meta":
        return torch.empty(shape, device=device, dtype=dtype)
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * (high - low) + low).to(device, dtype)


# ---------------------------------------------------------------------------------------------
# Wrappers (tensors in, one tensor out)
# ---------------------------------------------------------------------------------------------

class UNetExport(nn.Module):
    """diffusers UNet2DConditionModel -> (sample, timestep, encoder_hidden_states) -> latent."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):  # (B, 4, h, w), (B,), (B, L, D)
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False)[0]


class VaeEncoderExport(nn.Module):
    """AutoencoderKL (the latent mean, as the pipeline uses) or AutoencoderTiny: images -> latents."""

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, images):  # (B, 3, H, W) in [-1, 1] -> (B, 4, H/8, W/8), unscaled
        out = self.vae.encode(images)
        return out.latents if hasattr(out, "latents") else out.latent_dist.mean


class VaeDecoderExport(nn.Module):
    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae

    def forward(self, latents):  # (B, 4, h, w), unscaled -> (B, 3, 8h, 8w)
        return self.vae.decode(latents).sample


class VideoExport(nn.Module):
    """A video velocity network model(x, t, condition) whose text condition is built from
    three tensors by `make_condition(tokens, mask, pooled)` (e.g. StreamDiT's TextCondition)."""

    def __init__(self, model: nn.Module, make_condition: Callable):
        super().__init__()
        self.model = model
        self.make_condition = make_condition

    def forward(self, x, t, text_tokens, text_mask, text_pooled):  # (B, F, C, H, W), (B, F), (B, L, D), (B, L), (B, D)
        return self.model(x, t, self.make_condition(text_tokens, text_mask, text_pooled))


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------

def _cfg(module: nn.Module, key: str, default=None):
    config = getattr(module, "config", None)
    return getattr(config, key, default) if config is not None else default


def vae_scale(vae: nn.Module) -> int:
    """Pixels per latent (8 for SD's VAE and TAESD)."""
    blocks = _cfg(vae, "block_out_channels") or _cfg(vae, "encoder_block_out_channels")
    return 2 ** (len(blocks) - 1) if blocks else 8


def unet_spec(unet: nn.Module, text_len: int = 77, latent_scale: int = 8) -> ExportSpec:
    channels = int(_cfg(unet, "in_channels", 4))
    text_dim = _cfg(unet, "cross_attention_dim", 768)
    text_dim = int(text_dim[0] if isinstance(text_dim, (list, tuple)) else text_dim)

    def make(b, h, w, device, dtype, gen):
        return {"sample": _randn((b, channels, h // latent_scale, w // latent_scale), device, dtype, gen),
                "timestep": _uniform((b,), 0.0, 999.0, device, torch.float32, gen),
                "encoder_hidden_states": _randn((b, text_len, text_dim), device, dtype, gen)}

    axes = {"sample": {0: "batch", 2: "latent_height", 3: "latent_width"}, "timestep": {0: "batch"},
            "encoder_hidden_states": {0: "batch"}, "latent": {0: "batch", 2: "latent_height", 3: "latent_width"}}
    return ExportSpec("unet", UNetExport(unet).eval(), unet, ["sample", "timestep", "encoder_hidden_states"],
                      ["latent"], axes, make)


def vae_encoder_spec(vae: nn.Module) -> ExportSpec:
    def make(b, h, w, device, dtype, gen):
        return {"images": _uniform((b, 3, h, w), -1.0, 1.0, device, dtype, gen)}

    axes = {"images": {0: "batch", 2: "height", 3: "width"},
            "latents": {0: "batch", 2: "latent_height", 3: "latent_width"}}
    return ExportSpec("vae_encoder", VaeEncoderExport(vae).eval(), vae, ["images"], ["latents"], axes, make)


def vae_decoder_spec(vae: nn.Module) -> ExportSpec:
    channels = int(_cfg(vae, "latent_channels", 4))
    scale = vae_scale(vae)

    def make(b, h, w, device, dtype, gen):
        return {"latents": _randn((b, channels, h // scale, w // scale), device, dtype, gen)}

    axes = {"latents": {0: "batch", 2: "latent_height", 3: "latent_width"},
            "images": {0: "batch", 2: "height", 3: "width"}}
    return ExportSpec("vae_decoder", VaeDecoderExport(vae).eval(), vae, ["latents"], ["images"], axes, make)


def video_spec(model: nn.Module, make_condition: Callable, *, frames: int, channels: int, text_len: int,
               text_dim: int) -> ExportSpec:
    """The video network at a fixed buffer length and frame size (window attention's layout
    depends on them), with a dynamic batch."""

    def make(b, h, w, device, dtype, gen):
        mask = torch.ones((b, text_len), dtype=torch.bool, device=device)  # (B, L)
        if device.type != "meta":
            mask[:, text_len // 2 + 1:] = False  # padded prompts, as the runtime wrapper feeds them
        return {"x": _randn((b, frames, channels, h, w), device, dtype, gen),
                "t": _uniform((b, frames), 0.0, 1.0, device, dtype, gen),
                "text_tokens": _randn((b, text_len, text_dim), device, dtype, gen),
                "text_mask": mask,
                "text_pooled": _randn((b, text_dim), device, dtype, gen)}

    names = ["x", "t", "text_tokens", "text_mask", "text_pooled"]
    axes = {n: {0: "batch"} for n in names + ["velocity"]}
    return ExportSpec("video", VideoExport(model, make_condition).eval(), model, names, ["velocity"], axes, make)


# ---------------------------------------------------------------------------------------------
# Export and check
# ---------------------------------------------------------------------------------------------

def export_onnx(spec: ExportSpec, path: str | Path, *, batch: int = 1, height: int = 512, width: int = 512,
                opset: int = DEFAULT_OPSET, dynamo: bool = False) -> Path:
    """Write `spec` to `path` (.onnx; weights over 2 GB go to external data beside it).

    The TorchScript exporter (dynamo=False) is the default: it handles diffusers' UNet at
    opset 18 and is several times faster; dynamo=True uses the torch.export/onnxscript one.
    """
    if opset < DEFAULT_OPSET:
        raise ValueError(f"opset {opset} is too old; TensorRT engines here need opset >= {DEFAULT_OPSET}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    param = spec.param()
    gen = torch.Generator().manual_seed(0)
    inputs = spec.make_inputs(batch, height, width, param.device, param.dtype, gen)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and deprecation chatter
        torch.onnx.export(spec.module, tuple(inputs.values()), str(path), input_names=spec.input_names,
                          output_names=spec.output_names, dynamic_axes=spec.dynamic_axes, opset_version=opset,
                          do_constant_folding=True, dynamo=dynamo)
    log.info("exported %s to %s", spec.name, path)
    return path


@dataclass
class OnnxCheck:
    name: str
    rel_error: float  # max |onnxruntime - torch| / max |torch|
    max_abs_error: float
    shapes: dict[str, tuple[int, ...]]

    def ok(self, tol: float = 1e-3) -> bool:
        return self.rel_error < tol


_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(bool)": np.bool_, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def check_onnx(spec: ExportSpec, path: str | Path, *, batch: int = 1, height: int = 512, width: int = 512,
               seed: int = 1) -> OnnxCheck:
    """Run the ONNX file on onnxruntime (CPU) and the torch module on the same fresh inputs
    (the shape may differ from the export's: that checks the dynamic axes)."""
    import onnxruntime as ort

    param = spec.param()
    gen = torch.Generator().manual_seed(seed)
    inputs = spec.make_inputs(batch, height, width, param.device, param.dtype, gen)
    with torch.no_grad():
        want = spec.module(*inputs.values()).float().cpu().numpy()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {}
    for meta in session.get_inputs():
        value = inputs[meta.name].cpu().numpy()
        feeds[meta.name] = value.astype(_ORT_TYPES.get(meta.type, value.dtype))
    got = session.run(None, feeds)[0].astype(np.float32)
    if got.shape != want.shape:
        raise ValueError(f"{spec.name}: onnxruntime gives shape {got.shape}, torch {want.shape}")
    err = float(np.abs(got - want).max()) if want.size else 0.0
    scale = float(np.abs(want).max()) if want.size else 1.0
    return OnnxCheck(spec.name, err / max(scale, 1e-12), err, {k: tuple(v.shape) for k, v in inputs.items()})
