"""TensorRT acceleration: ONNX export (checked against onnxruntime), fp16 engine build with
dynamic batch / resolution profiles, an engine cache keyed by everything that makes an engine
valid, and the engine runtime. Generic machinery only: the specs and engine wrappers of the
project's networks are in `models/image/export_specs.py` and `models/video/video_engine.py`.

TensorRT is optional (`pip install streamstudio[tensorrt]`): without it `tensorrt_available()`
is False, `require_tensorrt()` raises `TensorRTUnavailable`, and callers keep the torch path.
Nothing here imports the rest of the package; models arrive as `nn.Module` arguments.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

log = logging.getLogger(__name__)

INSTALL_HINT = ("TensorRT is not installed (it is the optional extra `pip install streamstudio[tensorrt]`, "
                "which needs a CUDA GPU and NVIDIA's tensorrt wheel)")

_trt: ModuleType | None = None
_checked = False


class TensorRTUnavailable(RuntimeError):
    """TensorRT (or a GPU for it) is missing; the caller should use the torch path."""


def _import() -> ModuleType | None:
    global _trt, _checked
    if not _checked:
        _checked = True
        try:
            _trt = importlib.import_module("tensorrt")
        except Exception as exc:  # ImportError, or a broken install raising OSError
            log.debug("tensorrt import failed: %s", exc)
            _trt = None
    return _trt


def tensorrt_available() -> bool:
    return _import() is not None


def tensorrt_version() -> str:
    """TensorRT's version, or "none"."""
    trt = _import()
    return str(getattr(trt, "__version__", "unknown")) if trt is not None else "none"


def require_tensorrt() -> ModuleType:
    """The tensorrt module, or TensorRTUnavailable with what to install."""
    trt = _import()
    if trt is None:
        raise TensorRTUnavailable(INSTALL_HINT)
    return trt


from streamstudio.kernels.tensorrt.cache import EngineCache, EngineKey, gpu_identity, model_identity  # noqa: E402
from streamstudio.kernels.tensorrt.export import ExportSpec, OnnxCheck, check_onnx, export_onnx  # noqa: E402

__all__ = [
    "TensorRTUnavailable", "tensorrt_available", "tensorrt_version", "require_tensorrt", "INSTALL_HINT",
    "EngineCache", "EngineKey", "gpu_identity", "model_identity", "ExportSpec", "OnnxCheck", "check_onnx",
    "export_onnx",
]
