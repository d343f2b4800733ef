"""Acceleration shared by the products' networks, at models/' root because both the image
networks (`models/image/acceleration.py`) and the video network (`models/video/video_engine.py`)
build on it, and `streamstudio build-engines` builds engines of both: the modes (none / compile /
tensorrt), torch.compile's arguments, whether TensorRT engines can run here (said once, with the
torch path kept), the profile an engine is built for, and the two halves of `streamstudio
build-engines` over any export spec: `export_onnx_models` (ONNX files checked against
onnxruntime; no GPU needed) and `build_engines` (TensorRT).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from streamstudio.errors import StreamStudioError
from streamstudio.kernels import tensorrt as trt_kernels
from streamstudio.kernels.tensorrt.build import PRECISIONS, ShapeRange, ensure_engine
from streamstudio.kernels.tensorrt.cache import EngineCache
from streamstudio.kernels.tensorrt.export import ExportSpec, OnnxCheck, check_onnx, export_onnx

log = logging.getLogger(__name__)

MODES = ("none", "compile", "tensorrt")
_said: set[str] = set()


def say_once(message: str) -> None:
    """Warn (and log) a message once per process."""
    if message in _said:
        return
    _said.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    log.warning(message)


def compile_kwargs(device: torch.device, cuda_graphs: bool) -> dict:
    """reduce-overhead (CUDA graphs) on a GPU when asked; inductor's default elsewhere."""
    if device.type == "cuda" and cuda_graphs:
        return {"mode": "reduce-overhead"}
    return {}


def tensorrt_missing(device: torch.device) -> str | None:
    """Why TensorRT engines cannot run here (said once), or None when they can."""
    if not trt_kernels.tensorrt_available():
        say_once(f"{trt_kernels.INSTALL_HINT}; acceleration 'tensorrt' falls back to the torch path")
        return "acceleration: tensorrt unavailable, torch path"
    if device.type != "cuda":
        say_once("TensorRT engines need the model on a CUDA GPU; acceleration 'tensorrt' falls back to the torch path")
        return "acceleration: tensorrt needs a GPU, torch path"
    return None


def engine_shapes(part: str, plan=None, shapes: ShapeRange | None = None) -> ShapeRange:
    """The profile an engine of `part` is built for: the plan's batch range (and `shapes`'
    resolution range when given, else the plan's size), or `shapes` (default ShapeRange())
    without a plan. plan: the image networks' `models/image/acceleration.BatchPlan` (anything
    with its `shapes(part, resolution)`), or None."""
    if plan is None:
        return shapes or ShapeRange()
    return plan.shapes(part, shapes)


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
                  shapes: ShapeRange | None = None, precision: str = "fp16", plan=None) -> list[Path]:
    """TensorRT engines of every spec into the cache (TensorRT and a GPU needed), each for
    `engine_shapes(spec.name, plan, shapes)`: the same profile, hence the same cache key, as
    the image networks' `apply_acceleration(..., plan=plan)` asks for."""
    if precision not in PRECISIONS:
        raise StreamStudioError(f"precision must be one of {', '.join(PRECISIONS)}")
    trt_kernels.require_tensorrt()
    cache = EngineCache(engine_dir)
    return [ensure_engine(spec, cache, engine_shapes(spec.name, plan, shapes), precision=precision) for spec in specs]
