"""fp16 (or fp32) TensorRT engines from ONNX files through TensorRT's Python API, with one
optimization profile covering a range of batch sizes and resolutions, through the cache.

Precision: TensorRT 10 builds "weakly typed" networks, where the FP16 builder flag lets it pick
half-precision kernels for an fp32 graph. TensorRT 11 removed that flag: every network is
strongly typed and runs in the types of its ONNX graph. So an fp16 engine needs an fp16 graph,
which is what the export gives when the model is in float16 (the default on a GPU); the
builder checks the graph's type and says what to do when it does not match.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from streamstudio.kernels.tensorrt import require_tensorrt, tensorrt_version
from streamstudio.kernels.tensorrt.cache import EngineCache, EngineKey, Profile, gpu_identity, model_identity
from streamstudio.kernels.tensorrt.export import DEFAULT_OPSET, ExportSpec, export_onnx

log = logging.getLogger(__name__)

PRECISIONS = ("fp16", "fp32")


@dataclass(frozen=True)
class ShapeRange:
    """(min, opt, max) of batch, height and width (pixels for UNet/VAE; latent size for video)."""

    batch: tuple[int, int, int] = (1, 1, 4)
    height: tuple[int, int, int] = (256, 512, 1024)
    width: tuple[int, int, int] = (256, 512, 1024)

    def __post_init__(self):
        for name in ("batch", "height", "width"):
            lo, opt, hi = getattr(self, name)
            if not 1 <= lo <= opt <= hi:
                raise ValueError(f"{name} range must satisfy 1 <= min <= opt <= max, got {(lo, opt, hi)}")

    @staticmethod
    def fixed(batch: int, height: int, width: int) -> "ShapeRange":
        return ShapeRange((batch,) * 3, (height,) * 3, (width,) * 3)


def profile_for(spec: ExportSpec, shapes: ShapeRange) -> Profile:
    """Each input's (min, opt, max) shape over the range."""
    picks = [spec.input_shapes(shapes.batch[i], shapes.height[i], shapes.width[i]) for i in range(3)]
    return {name: (picks[0][name], picks[1][name], picks[2][name]) for name in spec.input_names}


def engine_key(spec: ExportSpec, shapes: ShapeRange, precision: str = "fp16", model_id: str | None = None) -> EngineKey:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return EngineKey.make(spec.name, model_id or model_identity(spec.source), profile_for(spec, shapes), precision,
                          tensorrt_version(), gpu_identity(spec.param().device if spec.param().is_cuda else None),
                          opset=DEFAULT_OPSET, export=type(spec.module).__qualname__)  # what the graph computes


def onnx_float_type(onnx_path: str | Path) -> str | None:
    """"fp16" or "fp32": the type of the graph's floating-point inputs (None if it has none)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    names = {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.BFLOAT16: "bf16"}
    found = {names[t] for t in (i.type.tensor_type.elem_type for i in model.graph.input) if t in names}
    if len(found) > 1:
        return "mixed"
    return found.pop() if found else None


def weakly_typed(trt: ModuleType) -> bool:
    """True for TensorRT <= 10 (precision flags); False for 11+ (strongly typed networks only)."""
    return hasattr(trt.BuilderFlag, "FP16")


def build_engine(onnx_path: str | Path, profile: Profile, *, fp16: bool = True,
                 workspace_gb: float | None = None) -> bytes:
    """Parse the ONNX file and build a serialized engine with one optimization profile."""
    trt = require_tensorrt()
    precision = "fp16" if fp16 else "fp32"
    if not weakly_typed(trt):
        graph = onnx_float_type(onnx_path)
        if graph is not None and graph != precision:
            raise RuntimeError(
                f"TensorRT {tensorrt_version()} builds strongly typed engines, which run in the ONNX graph's own "
                f"types: {onnx_path} is {graph}, but a {precision} engine was asked for. Load the model in "
                f"{'float16 (--dtype float16)' if fp16 else 'float32 (--dtype float32)'} so the export matches, "
                f"or ask for {graph}.")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):  # implicit since TensorRT 10
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # resolves external weight files beside it
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    if fp16 and weakly_typed(trt):
        config.set_flag(trt.BuilderFlag.FP16)  # TensorRT 10: may pick fp16 kernels for an fp32 graph
    if workspace_gb:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
    opt_profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in profile.items():
        opt_profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(opt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build an engine from {onnx_path} (see its log above)")
    return bytes(serialized)


def ensure_engine(spec: ExportSpec, cache: EngineCache, shapes: ShapeRange = ShapeRange(), *,
                  precision: str = "fp16", workspace_gb: float | None = None) -> Path:
    """The cached engine for this model, profile, precision, TensorRT and GPU; built (and the
    ONNX exported) when there is none."""
    require_tensorrt()
    key = engine_key(spec, shapes, precision)
    found = cache.lookup(key)
    if found is not None:
        log.info("engine %s: cached %s", spec.name, found.name)
        return found
    onnx_path = cache.onnx_path(spec.name, key.model_id)
    if not onnx_path.is_file():
        export_onnx(spec, onnx_path, batch=shapes.batch[1], height=shapes.height[1], width=shapes.width[1])
    log.info("engine %s: building %s (%s); this takes minutes once", spec.name, key.filename(), precision)
    data = build_engine(onnx_path, key.profile_dict(), fp16=precision == "fp16", workspace_gb=workspace_gb)
    return cache.store(key, data)
