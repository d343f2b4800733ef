"""ONNX export of a network (opset >= 18) and the check against onnxruntime.

An `ExportSpec` is a tensors-in, tensor-out module with named inputs, dynamic axes (batch and
resolution) and a way to make inputs of any (batch, height, width), which the export, the
onnxruntime check and the TensorRT profiles all use. The specs of particular networks live
with the networks (`models/image/export_specs.py`, `models/video/video_engine.py`); nothing here
knows a model.
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
    name: str  # the network's part name, e.g. "unet", "vae_decoder"
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


def random_normal(shape, device, dtype, gen):
    """N(0, 1) example input (drawn on the CPU from `gen`; empty on the meta device)."""
    if device.type == "meta":
        return torch.empty(shape, device=device, dtype=dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device, dtype)


def random_uniform(shape, low, high, device, dtype, gen):
    """U(low, high) example input (drawn on the CPU from `gen`; empty on the meta device)."""
    if device.type == "meta":
        return torch.empty(shape, device=device, dtype=dtype)
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * (high - low) + low).to(device, dtype)


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
