"""TensorRT's GPU path without TensorRT or a GPU: what the engines are sized for and how the
runtime drives them, checked against a stand-in of TensorRT's runtime API that records calls.

- The batch sizes the pipeline sends (derived in models/image/acceleration.unet_call_rows) are the ones
  it really sends, for every CFG type, step count, frame buffer size and denoising mode.
- The profile of a plan (full CFG, N=2, k=1, batching up to 16 rows) covers every batch the
  batching executor sends four such streams.
- TRTEngine: a False from set_input_shape raises an error naming the input, the shape and the
  profile's range; each captured shape has its own execution context, captured with
  capture_error_mode="thread_local"; capture_all captures every shape at start-up and nothing
  is captured afterwards; apply_acceleration builds engines for the plan and captures all its
  sizes before it returns.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from streamstudio.kernels import tensorrt as trt_kernels
from streamstudio.kernels.tensorrt.runtime import EngineShapeError, TRTEngine
from streamstudio.models import acceleration as shared
from streamstudio.models.image import acceleration
from streamstudio.models.image.acceleration import BatchPlan, batched_rows, unet_call_rows


# ------------------------------------------------------------------ batch sizes the pipeline sends
class RecordingUNet(nn.Module):
    """The tiny UNet, recording every batch size it is called with."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet
        self.sizes: set[int] = set()
        self.lock = threading.Lock()

    @property
    def config(self):
        return self.unet.config

    def forward(self, sample, timestep, encoder_hidden_states=None, **kwargs):
        with self.lock:
            self.sizes.add(sample.shape[0])
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, **kwargs)


def _frames(n: int, seed: int = 0, k: int = 1):
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(n * k)]
    return [frames[i * k:(i + 1) * k] if k > 1 else frames[i] for i in range(n)]


@pytest.fixture(scope="module")
def tiny():
    from streamstudio.models.image.loading import load_components

    return load_components("tiny", device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("cfg", ["none", "self", "initialize", "full"])
@pytest.mark.parametrize("steps,k,stream_batch", [(1, 1, True), (2, 1, True), (3, 2, True), (3, 1, False)])
def test_unet_call_rows_are_what_the_pipeline_sends(tiny, cfg, steps, k, stream_batch):
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    unet = RecordingUNet(tiny.unet)
    config = StreamDiffusionConfig(width=64, height=64, steps=steps, strength=0.7, cfg_type=cfg,
                                   guidance_scale=1.5, frame_buffer_size=k, use_denoising_batch=stream_batch)
    stream = StreamDiffusion(replace(tiny, unet=unet), config, prompt="a cat")
    for frame in _frames(3, k=k):
        stream(frame)
    assert tuple(sorted(unet.sizes)) == unet_call_rows(cfg, steps, k, stream_batch)


def test_unet_call_rows_by_hand():
    assert unet_call_rows("full", 2, 1) == (2, 4)  # priming 2k, then 2*N*k
    assert unet_call_rows("initialize", 2, 1) == (2, 3)  # N*k + k
    assert unet_call_rows("self", 2, 1) == (1, 2)
    assert unet_call_rows("full", 4, 2) == (4, 16)
    assert unet_call_rows("initialize", 3, 2) == (2, 4, 8)
    assert unet_call_rows("full", 3, 1, stream_batch=False) == (2,)
    assert batched_rows([4], 16) == (4, 8, 12, 16)
    assert batched_rows([2, 3], 8) == (2, 3, 4, 5, 6, 7, 8)
    assert batched_rows([2, 3], 8, (1, 2, 4, 8)) == (2, 4, 8)
    assert batched_rows([6], 4, (1, 2, 4)) == (6,)  # bigger than max_rows: alone, unpadded
    assert batched_rows([1, 2], None) == (1, 2)


def test_plan_for_full_cfg_two_steps_sixteen_rows():
    plan = BatchPlan.for_streams(height=64, width=64, steps=2, frame_buffer_size=1, cfg_types=["full"], max_rows=16)
    assert plan.buckets == (1, 2, 4, 8, 16)
    assert plan.batch_range("unet") == (1, 4, 16)  # min k (guidance <= 1), opt 2*N*k, max 16
    assert plan.batch_range("vae_encoder") == plan.batch_range("vae_decoder") == (1, 1, 16)
    shapes = plan.shapes("unet")
    assert shapes.batch == (1, 4, 16) and shapes.height == (64, 64, 64)
    unpadded = BatchPlan.for_streams(steps=2, cfg_types=["full"], max_rows=16, pad=False)
    assert unpadded.sizes["unet"] == tuple(range(1, 17))
    alone = BatchPlan.for_streams(steps=4, frame_buffer_size=4, cfg_types=["full"], max_rows=16)
    assert alone.batch_range("unet")[2] == 32  # one stream's 2*N*k = 32 rows exceeds max_rows: runs alone
    no_batching = BatchPlan.for_streams(steps=2, cfg_types=["full"])
    assert no_batching.sizes["unet"] == (1, 2, 4) and no_batching.buckets is None


@pytest.mark.parametrize("pad", [True, False])
def test_the_plan_covers_what_four_full_cfg_streams_send_through_the_executor(tiny, pad):
    """Four full-CFG streams (N=2, k=1) through the batching executor (max_rows 16): every
    UNet and VAE batch actually sent lies in the plan's profile and is one of its sizes."""
    from streamstudio.app.streams.image import stream_plan
    from streamstudio.models.image.batching import BatchExecutor, BatchingConfig, batched_components
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    config = StreamDiffusionConfig(width=64, height=64, steps=2, cfg_type="full", guidance_scale=1.5)
    batching = BatchingConfig(max_rows=16, max_wait_ms=500, pad_to_buckets=pad, warm_up=False)
    plan = stream_plan(config, batching, cfg_types=["full"])
    unet = RecordingUNet(tiny.unet)
    executor = BatchExecutor(batching)
    try:
        shared = batched_components(replace(tiny, unet=unet), executor)
        streams = [StreamDiffusion(shared, replace(config, seed=i), prompt="a cat") for i in range(4)]
        barrier = threading.Barrier(4)

        def worker(i):
            with executor.client():
                for frame in _frames(3, seed=i):
                    barrier.wait()
                    streams[i](frame)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert executor.stats.batched_calls > 0
    finally:
        executor.close()
    lo, _, hi = plan.batch_range("unet")
    assert unet.sizes and all(lo <= b <= hi for b in unet.sizes), (unet.sizes, plan.batch_range("unet"))
    assert unet.sizes <= set(plan.sizes["unet"])
    assert 16 in unet.sizes  # four streams' 4-row calls met in one call
    assert executor.stats.sizes <= set(plan.sizes["unet"]) | set(plan.sizes["vae_encoder"])
    if pad:
        assert executor.stats.sizes <= set(plan.buckets)


# ------------------------------------------------------------------ a stand-in of TensorRT's runtime
class FakeRuntimeTRT:
    """The slice of TensorRT's runtime API that TRTEngine uses, for a UNet-like engine
    (sample, timestep, encoder_hidden_states -> latent) with a batch profile [lo, hi]."""

    def __init__(self, lo: int = 1, opt: int = 2, hi: int = 4):
        fake = self
        self.range = (lo, opt, hi)
        self.contexts: list = []
        self.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, severity: None})
        self.TensorIOMode = SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
        self.DataType = SimpleNamespace(FLOAT="FLOAT", HALF="HALF", INT32="INT32", BOOL="BOOL", INT8="INT8",
                                        INT64="INT64")
        io = {"sample": ("INPUT", "FLOAT", (4, 8, 8)), "timestep": ("INPUT", "INT64", ()),
              "encoder_hidden_states": ("INPUT", "FLOAT", (77, 32)), "latent": ("OUTPUT", "FLOAT", (4, 8, 8))}

        class Context:
            def __init__(self):
                self.shapes: dict = {}
                self.set_calls: list = []
                self.executions: list = []  # "capture" or "run"

            def set_input_shape(self, name, shape):
                self.set_calls.append((name, tuple(shape)))
                ok = fake.range[0] <= shape[0] <= fake.range[2] and tuple(shape[1:]) == io[name][2]
                if ok:
                    self.shapes[name] = tuple(shape)
                return ok  # as TensorRT: False for a shape outside the profile, nothing raised

            def set_tensor_address(self, name, ptr):
                assert ptr

            def get_tensor_shape(self, name):
                return self.shapes["sample"]  # latent is shaped as sample

            def execute_async_v3(self, stream_handle):
                self.executions.append("capture" if FakeGraphCapture.active else "run")
                return True

        class Engine:
            num_io_tensors = len(io)

            def get_tensor_name(self, i):
                return list(io)[i]

            def get_tensor_mode(self, name):
                return io[name][0]

            def get_tensor_dtype(self, name):
                return io[name][1]

            def get_tensor_profile_shape(self, name, profile):
                lo, opt, hi = fake.range
                return [(b, *io[name][2]) for b in (lo, opt, hi)]

            def create_execution_context(self):
                context = Context()
                fake.contexts.append(context)
                return context

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, data):
                return Engine()

        self.Runtime = Runtime


class FakeStream:
    cuda_stream = 1234

    def wait_stream(self, other):
        pass


class FakeCUDAGraph:
    def __init__(self):
        self.replays = 0
        self.captured = False

    def replay(self):
        assert self.captured
        self.replays += 1


class FakeGraphCapture:
    """torch.cuda.graph(graph, pool=None, stream=None, capture_error_mode="global"), recording
    the capture mode of every capture."""

    active = False
    modes: list = []

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.cuda_graph = cuda_graph
        FakeGraphCapture.modes.append(capture_error_mode)

    def __enter__(self):
        FakeGraphCapture.active = True
        return self

    def __exit__(self, *exc):
        FakeGraphCapture.active = False
        self.cuda_graph.captured = True
        return False


@pytest.fixture
def fake_runtime(monkeypatch, tmp_path):
    """TRTEngine over FakeRuntimeTRT, with the torch.cuda pieces it uses faked (tensors stay on
    the CPU). Returns make(lo, opt, hi, cuda_graphs) -> (engine, fake)."""
    FakeGraphCapture.modes = []
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", FakeGraphCapture)
    path = tmp_path / "unet-x.engine"
    path.write_bytes(b"engine")

    def make(lo=1, opt=2, hi=4, cuda_graphs=True):
        fake = FakeRuntimeTRT(lo, opt, hi)
        monkeypatch.setattr(trt_kernels, "_trt", fake)
        monkeypatch.setattr(trt_kernels, "_checked", True)
        return TRTEngine(path, "cpu", cuda_graphs=cuda_graphs), fake

    return make


def _inputs(b: int) -> dict[str, torch.Tensor]:
    return {"sample": torch.randn(b, 4, 8, 8), "timestep": torch.full((b,), 999),
            "encoder_hidden_states": torch.randn(b, 77, 32)}


def _shapes(b: int) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in _inputs(b).items()}


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_a_shape_outside_the_profile_raises_a_clear_error(fake_runtime, cuda_graphs):
    engine, fake = fake_runtime(1, 2, 4, cuda_graphs=cuda_graphs)
    assert engine(**_inputs(3))["latent"].shape == (3, 4, 8, 8)
    with pytest.raises(EngineShapeError) as err:
        engine(**_inputs(6))
    message = str(err.value)
    assert "'sample'" in message and "(6, 4, 8, 8)" in message
    assert "(1, 4, 8, 8) to (4, 4, 8, 8)" in message and "optimized for (2, 4, 8, 8)" in message
    assert "unet-x.engine" in message


def test_the_profile_range_comes_from_the_key_file_when_the_engine_does_not_say(fake_runtime, tmp_path):
    import json

    engine, _ = fake_runtime(1, 2, 4, cuda_graphs=False)
    engine.engine.get_tensor_profile_shape = None  # an API without it
    (tmp_path / "unet-x.json").write_text(
        json.dumps({"profile": [["sample", [1, 4, 8, 8], [2, 4, 8, 8], [4, 4, 8, 8]]]}))
    with pytest.raises(EngineShapeError, match=r"from \(1, 4, 8, 8\) to \(4, 4, 8, 8\)"):
        engine(**_inputs(5))


def test_each_captured_shape_has_its_own_context_captured_thread_local(fake_runtime):
    engine, fake = fake_runtime(1, 2, 8)
    plain = fake.contexts[0]
    engine.capture_all([_shapes(b) for b in (1, 2, 4, 8)])
    assert engine.captured_at_startup
    graph_contexts = fake.contexts[1:]
    assert len(graph_contexts) == 4  # one per shape, besides the plain one
    for b, context in zip((1, 2, 4, 8), graph_contexts):
        assert {shape[0] for _, shape in context.set_calls} == {b}  # bound once, to its own shape only
        assert context.executions == ["run", "capture"]  # TensorRT's set-up outside, then the capture
    assert FakeGraphCapture.modes == ["thread_local"] * 4
    assert plain.set_calls == [] and plain.executions == []

    for b in (4, 1, 8, 2, 4):  # replays: no new context, no capture, no rebinding
        out = engine(**_inputs(b))
        assert out["latent"].shape == (b, 4, 8, 8)
    assert len(fake.contexts) == 5 and len(FakeGraphCapture.modes) == 4
    assert all(len(c.set_calls) == 3 for c in graph_contexts)
    assert [engine._graphs[engine._key(engine._prepare(_inputs(b)))].graph.replays
            for b in (1, 2, 4, 8)] == [1, 1, 2, 1]


def test_after_start_up_an_uncaptured_shape_runs_without_a_capture(fake_runtime, caplog):
    engine, fake = fake_runtime(1, 2, 8)
    engine.capture_all([_shapes(b) for b in (1, 2)])
    with caplog.at_level("WARNING"):
        engine(**_inputs(3))
        engine(**_inputs(3))
    assert len(FakeGraphCapture.modes) == 2 and len(fake.contexts) == 3  # nothing captured mid-run
    assert fake.contexts[0].executions == ["run", "run"]  # on the plain context
    assert sum("not captured at start-up" in r.message for r in caplog.records) == 1


def test_without_start_up_capture_shapes_are_captured_as_they_come(fake_runtime):
    engine, fake = fake_runtime(1, 2, 8)
    engine(**_inputs(2))
    engine(**_inputs(2))
    engine(**_inputs(5))
    assert FakeGraphCapture.modes == ["thread_local", "thread_local"] and len(fake.contexts) == 3


# ------------------------------------------------------------------ apply_acceleration with a plan
class CudaParam(nn.Module):
    """Reports a CUDA parameter (the TensorRT path checks the device) without allocating one."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    @property
    def config(self):
        return self.inner.config

    def parameters(self, recurse: bool = True):
        yield SimpleNamespace(device=torch.device("cuda"), dtype=torch.float16)


def test_tensorrt_acceleration_sizes_engines_from_the_plan_and_captures_every_size_at_start_up(
        tiny, monkeypatch, tmp_path):
    from streamstudio.kernels.tensorrt import runtime

    built, made = {}, []

    class RecordingEngine:
        def __init__(self, path, device="cuda", cuda_graphs=False):
            self.path, self.cuda_graphs, self.captured, self.calls = path, cuda_graphs, None, 0
            made.append(self)

        def capture_all(self, shape_sets):
            assert self.calls == 0, "captured after a call"
            self.captured = [s["batch"] for s in shape_sets]

    def ensure_engine(spec, cache, shapes, precision="fp16"):
        built[spec.name] = shapes
        return tmp_path / f"{spec.name}.engine"

    monkeypatch.setattr(trt_kernels, "tensorrt_available", lambda: True)
    monkeypatch.setattr(acceleration, "image_specs", lambda comps, parts: [
        SimpleNamespace(name=p, input_shapes=lambda b, h, w: {"batch": b, "size": (h, w)}) for p in parts])
    monkeypatch.setattr(acceleration, "ensure_engine", ensure_engine)
    monkeypatch.setattr(runtime, "TRTEngine", RecordingEngine)
    comps = replace(tiny, unet=CudaParam(tiny.unet), notes=[])
    plan = BatchPlan.for_streams(height=64, width=64, steps=2, cfg_types=["full"], max_rows=16)
    fast = acceleration.apply_acceleration(comps, "tensorrt", engine_dir=tmp_path, plan=plan)
    assert built["unet"].batch == (1, 4, 16) and built["unet"].height == (64, 64, 64)
    assert built["vae_decoder"].batch == (1, 1, 16)
    assert [e.captured for e in made] == [list(plan.sizes[p]) for p in ("unet", "vae_encoder", "vae_decoder")]
    assert fast.net.unet_engine is made[0] and "unet batches (1, 2, 4, 8, 16)" in fast.notes[-1]


def test_build_engines_asks_for_the_same_profiles_as_the_app(tiny, monkeypatch, tmp_path):
    """`build-engines` with the app's settings builds engines of the profiles (hence cache keys)
    that `apply_acceleration(..., plan=...)` looks up."""
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli import build_engines_run as build_engines

    asked = []
    monkeypatch.setattr(trt_kernels, "tensorrt_available", lambda: True)
    monkeypatch.setattr(build_engines, "_load", lambda args: tiny)
    monkeypatch.setattr(shared, "build_engines",
                        lambda specs, root, shapes=None, precision="fp16", plan=None:
                        [asked.append(shared.engine_shapes(s.name, plan, shapes)) or tmp_path / "e"
                         for s in specs])
    args = build_parser().parse_args(["build-engines", "--model", "tiny", "--cfg", "full", "--steps", "2",
                                      "--max-batch-rows", "16", "--width", "64", "--height", "64",
                                      "--engine-dir", str(tmp_path)])
    assert build_engines.run(args) == 0
    plan = BatchPlan.for_streams(height=64, width=64, steps=2, cfg_types=["full"], max_rows=16)
    assert [s.batch for s in asked] == [plan.batch_range(p) for p in ("unet", "vae_encoder", "vae_decoder")]
    assert all(s.height == (64, 64, 64) for s in asked)
