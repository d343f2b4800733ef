"""Running TensorRT engines from torch: `TRTEngine` (named CUDA tensors in and out, on torch's
current stream, optionally replayed from a CUDA graph per input shape). The networks that run
on engines wrap it in `models/image/export_specs.py` and `models/video/video_engine.py`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from streamstudio.kernels.tensorrt import require_tensorrt

log = logging.getLogger(__name__)


def _torch_dtype(trt: ModuleType, dtype: Any) -> torch.dtype:  # dtype: a trt.DataType
    table = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16, trt.DataType.INT32: torch.int32,
             trt.DataType.BOOL: torch.bool, trt.DataType.INT8: torch.int8}
    for name, value in (("INT64", torch.int64), ("BF16", torch.bfloat16), ("UINT8", torch.uint8)):
        if hasattr(trt.DataType, name):
            table[getattr(trt.DataType, name)] = value
    return table[dtype]


class EngineShapeError(ValueError):
    """An input shape outside the engine's optimization profile (TensorRT's set_input_shape
    returned False)."""


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    context: object  # the execution context captured in this graph (one per shape, never rebound)
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]


Shapes = dict[str, tuple[int, ...]]  # input name -> shape


class TRTEngine:
    """A deserialized engine on one GPU.

    `engine(**inputs)` casts each input to the engine's dtype, runs on torch's current CUDA
    stream and returns fresh output tensors. Every input shape is checked against the engine's
    optimization profile (`EngineShapeError` names the input, its shape and the profile's range).

    With cuda_graphs=True each set of input shapes gets its own execution context and a CUDA
    graph of it, captured with capture_error_mode="thread_local" (work of other threads, such as
    another session's host copies, cannot invalidate the capture). `capture_all(shape_sets)`
    captures every shape that will be sent at start-up; after it, a shape not captured runs
    without a graph (on the plain context) instead of being captured while streams run.
    """

    def __init__(self, path: str | Path, device: torch.device | str = "cuda", cuda_graphs: bool = False):
        trt = require_tensorrt()
        self._trt = trt
        self.path = Path(path)
        self.device = torch.device(device)
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        with torch.cuda.device(self.device):
            self.engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
            if self.engine is None:
                raise RuntimeError(f"TensorRT could not load {self.path} (built by another TensorRT or GPU?)")
            self.context = self.engine.create_execution_context()  # calls without a graph
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = [n for n in names if is_input[n]]
        self.output_names = [n for n in names if not is_input[n]]
        self.dtypes = {n: _torch_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        self.cuda_graphs = cuda_graphs
        self._graphs: dict[tuple, _Graph] = {}
        self.captured_at_startup = False  # capture_all ran: no capture while streams run
        self._told: set[tuple] = set()

    # ------------------------------------------------------------------ shapes
    def profile_range(self, name: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
        """(min, opt, max) shape of an input in the engine's profile 0: from the engine, or
        from the cache's key file beside it; None when neither says."""
        getter = getattr(self.engine, "get_tensor_profile_shape", None)
        if getter is not None:
            try:
                lo, opt, hi = getter(name, 0)
                return tuple(lo), tuple(opt), tuple(hi)
            except Exception:  # noqa: BLE001 - an older API; try the key file
                pass
        try:
            import json

            for entry in json.loads(self.path.with_suffix(".json").read_text())["profile"]:
                if entry[0] == name:
                    return tuple(entry[1]), tuple(entry[2]), tuple(entry[3])
        except Exception:  # noqa: BLE001 - no key file
            pass
        return None

    def _shape_error(self, name: str, shape: tuple[int, ...]) -> EngineShapeError:
        rng = self.profile_range(name)
        where = (f"its profile covers {name} from {rng[0]} to {rng[2]} (optimized for {rng[1]})" if rng
                 else "its profile range is unknown")
        return EngineShapeError(
            f"TensorRT engine {self.path.name} refused input {name!r} of shape {shape}: {where}. Build the "
            f"engine for the batch sizes that are sent (streamstudio build-engines with the app's --cfg, --steps "
            f"and --max-batch-rows, or --batch MIN OPT MAX), or send batches inside the range.")

    def _set_shapes(self, context: Any, feeds: dict[str, torch.Tensor]) -> None:
        for name in self.input_names:
            shape = tuple(feeds[name].shape)
            if not context.set_input_shape(name, shape):  # False: outside the profile
                raise self._shape_error(name, shape)

    def _bind(self, context: Any, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Set shapes and addresses on `context`; returns freshly allocated outputs."""
        self._set_shapes(context, inputs)
        for name in self.input_names:
            context.set_tensor_address(name, inputs[name].data_ptr())
        outputs = {}
        for name in self.output_names:
            shape = tuple(context.get_tensor_shape(name))
            outputs[name] = torch.empty(shape, device=self.device, dtype=self.dtypes[name])
            context.set_tensor_address(name, outputs[name].data_ptr())
        return outputs

    def _execute(self, context: Any) -> None:  # a trt.IExecutionContext
        if not context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError(f"TensorRT execution of {self.path.name} failed")

    def _prepare(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise KeyError(f"{self.path.name}: missing inputs {missing}")
        return {n: inputs[n].to(self.device, self.dtypes[n]).contiguous() for n in self.input_names}

    @staticmethod
    def _key(feeds: dict[str, torch.Tensor]) -> tuple:
        return tuple((n, tuple(t.shape)) for n, t in feeds.items())

    # ------------------------------------------------------------------ calls
    def __call__(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        feeds = self._prepare(inputs)
        if self.cuda_graphs:
            key = self._key(feeds)
            entry = self._graphs.get(key)
            if entry is None and not self.captured_at_startup:
                entry = self._capture(key, feeds)
            if entry is not None:
                for name, t in feeds.items():
                    entry.inputs[name].copy_(t)
                entry.graph.replay()
                return {n: t.clone() for n, t in entry.outputs.items()}
            if key not in self._told:  # a shape nobody planned for: run it, but say so once
                self._told.add(key)
                log.warning("%s: shapes %s were not captured at start-up; they run without a CUDA graph",
                            self.path.name, key)
        outputs = self._bind(self.context, feeds)
        self._execute(self.context)
        return outputs

    def capture_all(self, shape_sets: list[Shapes]) -> None:
        """Capture a CUDA graph (each with its own execution context) of every set of input
        shapes now, before any stream runs; later calls capture nothing more."""
        if not self.cuda_graphs:
            return
        for shapes in shape_sets:
            feeds = {n: torch.zeros(tuple(shapes[n]), device=self.device, dtype=self.dtypes[n])
                     for n in self.input_names}
            key = self._key(feeds)
            if key not in self._graphs:
                self._capture(key, feeds)
        self.captured_at_startup = True

    def _capture(self, key: tuple, feeds: dict[str, torch.Tensor]) -> _Graph:
        with torch.cuda.device(self.device):
            context = self.engine.create_execution_context()  # this shape's own, never rebound
        static_in = {n: t.clone() for n, t in feeds.items()}
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            outputs = self._bind(context, static_in)
            self._execute(context)  # TensorRT's lazy set-up runs outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                self._execute(context)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        entry = _Graph(graph, context, static_in, outputs)
        self._graphs[key] = entry
        log.debug("captured a CUDA graph of %s for %s", self.path.name, key)
        return entry
