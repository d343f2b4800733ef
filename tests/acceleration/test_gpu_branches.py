"""Every CUDA-only branch of the Python code, run on the CPU.

No line of the GPU code may meet the interpreter for the first time on a GPU: a misspelt
`torch.cuda` function (`streamstudio bench` once called `torch.cuda.getdevice_name`) must fail
here. `fake_gpu` replaces the few `torch.cuda` functions the code calls (is_available,
get_device_name, synchronize, Event, ...) with fakes; monkeypatch only replaces attributes that
exist, so a fake of a misspelt name fails too. `CudaOnCpu` is a torch function mode that puts
tensors and modules asked for on "cuda" on the CPU instead, so code that allocates on the GPU
runs as written. Networks and builds too big or slow for a test (the 865M-parameter UNet, a
kernel build, a TensorRT engine) are swapped for small stand-ins; everything around them runs.

The TensorRT runtime (`kernels/tensorrt/runtime.TRTEngine`) needs the tensorrt module and is
run by the `gpu` tests of test_kernels_tensorrt.py only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from gpu_fakes import CUDA, GPU_NAME, CudaOnCpu, OnCuda

from streamstudio import kernels
from streamstudio.errors import StreamStudioError
from streamstudio.kernels import cuda_build, reference
from streamstudio.kernels.reference import CFG_FULL, CFG_INITIALIZE, CFG_NONE, CFG_SELF

ROOT = Path(__file__).resolve().parents[2]
def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (its folder on sys.path, as when it runs as a script)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    key = f"_bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny():
    from streamstudio.models.image.loading import load_components

    return load_components("tiny", device="cpu", dtype=torch.float32, taesd=True)


def test_fakes_only_replace_real_torch_cuda_functions():
    for name in ("is_available", "device_count", "get_device_name", "synchronize", "current_device",
                 "get_device_capability", "Event"):
        assert hasattr(torch.cuda, name), name
    assert not hasattr(torch.cuda, "getdevice_name")


# ------------------------------------------------------------------ streamstudio.device
def test_pick_device_and_dtype_with_a_gpu(fake_gpu):
    from streamstudio.device import pick_device, pick_dtype

    assert pick_device("auto") == CUDA
    assert pick_device("cuda") == CUDA and pick_device("cuda:0") == torch.device("cuda", 0)
    assert pick_dtype(CUDA) == torch.float16 and pick_dtype(CUDA, "bf16") == torch.bfloat16


def test_pick_device_cuda_without_a_gpu(monkeypatch):
    from streamstudio.device import pick_device, pick_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(StreamStudioError, match="no CUDA GPU"):
        pick_device("cuda")
    assert pick_dtype(torch.device("cpu")) == torch.float32


# ------------------------------------------------------------------ streamstudio bench
class FakePipe:
    """What `bench` reads of a pipeline on a GPU."""

    def __init__(self):
        from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

        self.device, self.dtype, self.n_steps = CUDA, torch.float16, 1
        self.config = StreamDiffusionConfig(width=64, height=64, cfg_type="none")
        self.comps = SimpleNamespace(name="sd-turbo")
        self.calls = 0

    def __call__(self, image=None):
        self.calls += 1
        return np.zeros((64, 64, 3), np.uint8)


def test_bench_device_name_on_a_gpu(fake_gpu):
    from streamstudio.app.cli.bench_run import device_name

    assert device_name(CUDA) == GPU_NAME
    assert device_name(torch.device("cuda", 0)) == GPU_NAME
    assert fake_gpu.names == [CUDA, torch.device("cuda", 0)]


def test_bench_one_stream_synchronizes_the_gpu_after_each_frame(fake_gpu):
    from streamstudio.app.cli.bench_run import time_one_stream

    pipe = FakePipe()
    r = time_one_stream(pipe, frames=5, warmup=2, txt2img=False, progress=False)
    assert pipe.calls == 7 and r["frames"] == 5
    assert fake_gpu.sync == 6  # once after the warm-up, once after each timed frame


def test_bench_command_on_a_gpu(fake_gpu, monkeypatch, tmp_path, capsys):
    from streamstudio.app import cli, streams

    pipe = FakePipe()
    monkeypatch.setattr(cli, "COMMANDS", {"bench": "bench"})
    monkeypatch.setattr(streams, "build_pipeline", lambda args, mode, serving=False: pipe)
    out = tmp_path / "bench.json"
    assert cli.main(["bench", "--model", "tiny", "--device", "cuda", "--frames", "3", "--warmup", "1",
                     "--json", str(out)]) == 0
    assert f"on {GPU_NAME}" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["device"] == GPU_NAME and result["frames"] == 3
    assert fake_gpu.sync == 4


# ------------------------------------------------------------------ kernels: the fused branch of each op
def binding_names() -> set[str]:
    text = (cuda_build.CSRC / "stream_ops.cpp").read_text()
    return set(re.findall(r'm\.def\("(\w+)"', text))


class FakeOps:
    """The stream_ops extension's functions (names read from its binding), with the binding's
    argument checks, computing the references into the output tensors."""

    def __init__(self):
        self.calls = []
        for name in binding_names():
            setattr(self, name, getattr(self, "_" + name))

    @staticmethod
    def _like(t, ref, name):
        assert isinstance(t, torch.Tensor) and t.is_contiguous(), f"{name} must be a contiguous tensor"
        assert t.shape == ref.shape and t.dtype == ref.dtype, f"{name}: {t.shape} {t.dtype} vs {ref.shape} {ref.dtype}"

    def _preprocess(self, frame, out, bgr):
        self.calls.append("preprocess")
        assert frame.dtype == torch.uint8 and frame.dim() == 4 and frame.shape[3] in (3, 4) and frame.is_contiguous()
        assert out.dim() == 4 and out.shape[:2] == (frame.shape[0], 3) and out.is_contiguous()
        assert isinstance(bgr, bool)
        out.copy_(reference.preprocess(frame, out.shape[2], out.shape[3], out.dtype, bgr))

    def _postprocess(self, images, out):
        self.calls.append("postprocess")
        assert images.dim() == 4 and images.shape[1] == 3 and images.is_contiguous()
        b, _, h, w = images.shape
        assert out.dtype == torch.uint8 and out.shape == (b, h, w, 3) and out.is_contiguous()
        out.copy_(reference.postprocess(images))

    def _cosine_similarity(self, a, b, partial, out):
        self.calls.append("cosine_similarity")
        self._like(b, a, "b")
        assert partial.dtype == torch.float32 and partial.dim() == 1 and partial.numel() % 3 == 0
        assert out.dtype == torch.float32 and out.shape == (1,)
        out.copy_(reference.cosine_similarity(a, b).view(1))

    def _stream_step(self, x, text, uncond, stock, noise, coef, x0, x_next, stock_next, guidance, delta, cfg):
        self.calls.append("stream_step")
        for name, t in dict(text=text, uncond=uncond, stock=stock, noise=noise, x0=x0, x_next=x_next,
                            stock_next=stock_next).items():
            self._like(t, x, name)
        assert coef.dtype == torch.float32 and coef.shape == (x.shape[0], 6) and coef.is_contiguous()
        assert isinstance(guidance, float) and isinstance(delta, float) and isinstance(cfg, int) and 0 <= cfg <= 3
        got = reference.stream_step(x, text, uncond if cfg == CFG_FULL else None, stock, noise, coef,
                                    guidance, delta, cfg)
        x0.copy_(got[0])
        x_next.copy_(got[1])
        if cfg in (CFG_SELF, CFG_INITIALIZE):
            stock_next.copy_(got[2])


@pytest.fixture
def fake_ops(monkeypatch):
    ops = FakeOps()
    monkeypatch.setattr(kernels, "_ops", lambda *tensors: ops)
    return ops


def test_the_binding_has_the_ops_the_dispatch_calls():
    assert binding_names() == {"preprocess", "postprocess", "stream_step", "cosine_similarity"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_preprocess_and_postprocess_branches(fake_ops, dtype):
    gen = torch.Generator().manual_seed(0)
    frame = torch.randint(0, 256, (20, 24, 3), generator=gen, dtype=torch.uint8)
    got = kernels.preprocess(frame, 16, 8, dtype, bgr=True)
    assert got.shape == (1, 3, 16, 8) and got.dtype == dtype
    torch.testing.assert_close(got, reference.preprocess(frame, 16, 8, dtype, bgr=True))
    images = torch.rand(2, 3, 5, 7, generator=gen, dtype=dtype) * 2 - 1
    torch.testing.assert_close(kernels.postprocess(images), reference.postprocess(images))
    assert fake_ops.calls == ["preprocess", "postprocess"]


def test_fused_cosine_branch(fake_ops):
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 3, 4, 5, generator=gen), torch.randn(2, 3, 4, 5, generator=gen)
    got = kernels.cosine_similarity(a, b)
    assert got.shape == () and fake_ops.calls == ["cosine_similarity"]
    torch.testing.assert_close(got, reference.cosine_similarity(a, b))


@pytest.mark.parametrize("cfg", [CFG_NONE, CFG_SELF, CFG_INITIALIZE, CFG_FULL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_stream_step_branch(fake_ops, cfg, dtype):
    gen = torch.Generator().manual_seed(cfg)
    shape = (3, 4, 5, 6)
    x, text, uncond, stock, noise = (torch.randn(shape, generator=gen).to(dtype) for _ in range(5))
    abar = torch.rand(3, 2, generator=gen) * 0.8 + 0.1
    coef = torch.stack([abar[:, 0].sqrt(), (1 - abar[:, 0]).sqrt(), torch.full((3,), 0.1), torch.full((3,), 0.9),
                        abar[:, 1].sqrt(), (1 - abar[:, 1]).sqrt()], 1).double()  # not float32: the dispatch casts
    got = kernels.stream_step(x, text, uncond, stock, noise, coef, 1.5, 0.7, cfg)
    want = reference.stream_step(x, text, uncond, stock, noise, coef, 1.5, 0.7, cfg)
    assert fake_ops.calls == ["stream_step"]
    for g, w in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g, w)


def test_ops_picks_the_extension_for_cuda_tensors(monkeypatch):
    loaded = object()
    monkeypatch.setattr(cuda_build, "load_extension", lambda name, sources: loaded)
    on_gpu = SimpleNamespace(is_cuda=True, requires_grad=False)
    assert kernels._ops(on_gpu, on_gpu) is loaded
    assert kernels._ops(on_gpu, SimpleNamespace(is_cuda=False, requires_grad=False)) is None
    with torch.enable_grad():
        assert kernels._ops(SimpleNamespace(is_cuda=True, requires_grad=True)) is None


def test_fused_available_on_a_gpu(fake_gpu, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.delenv(cuda_build.DISABLE_ENV, raising=False)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    assert cuda_build.unavailable_reason() is None
    monkeypatch.setattr(cuda_build, "load_extension", lambda name, sources: object())
    assert kernels.fused_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_build.unavailable_reason() == "no CUDA GPU is visible"


# ------------------------------------------------------------------ models/acceleration, per product
def test_compile_on_a_gpu_uses_cuda_graphs(tiny, monkeypatch):
    from streamstudio.models import acceleration as shared
    from streamstudio.models.image import acceleration
    from streamstudio.models.video.video_engine import apply_video_acceleration

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: (compiled.append(kw), fn)[1])
    comps = replace(tiny, unet=OnCuda(tiny.unet), vae=OnCuda(tiny.vae), notes=[])
    fast = acceleration.apply_acceleration(comps, "compile")
    assert compiled == [{"mode": "reduce-overhead"}, {}, {"mode": "reduce-overhead"}]  # unet, vae encode, decode
    assert "mode=reduce-overhead" in fast.notes[-1]
    assert shared.compile_kwargs(CUDA, cuda_graphs=False) == {}
    compiled.clear()
    model = OnCuda(nn.Linear(2, 2))
    assert apply_video_acceleration(model, "compile", frames=4, height=8, width=8) is model
    assert compiled == [{"mode": "reduce-overhead"}]


class FakeTRTEngine:
    def __init__(self, path, device="cuda", cuda_graphs=False):
        self.path, self.device, self.cuda_graphs = path, device, cuda_graphs


def test_tensorrt_on_a_gpu_wraps_each_engine(tiny, monkeypatch, tmp_path, cuda_on_cpu):
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.kernels.tensorrt import runtime
    from streamstudio.models.image import acceleration
    from streamstudio.models.image.export_specs import EngineImageNet

    built = []

    def ensure_engine(spec, cache, shapes, precision="fp16"):
        if spec.name == "vae_encoder":
            raise RuntimeError("parser failed")
        built.append((spec.name, precision))
        return tmp_path / f"{spec.name}.engine"

    monkeypatch.setattr(trt_kernels, "tensorrt_available", lambda: True)
    monkeypatch.setattr(acceleration, "image_specs",
                        lambda comps, parts: [SimpleNamespace(name=p) for p in parts])
    monkeypatch.setattr(acceleration, "ensure_engine", ensure_engine)
    monkeypatch.setattr(runtime, "TRTEngine", FakeTRTEngine)
    comps = replace(tiny, unet=OnCuda(tiny.unet), vae=OnCuda(tiny.vae), notes=[])
    with pytest.warns(RuntimeWarning, match="vae_encoder failed"):
        fast = acceleration.apply_acceleration(comps, "tensorrt", engine_dir=tmp_path)
    assert built == [("unet", "fp16"), ("vae_decoder", "fp16")]
    net = fast.net
    assert isinstance(net, EngineImageNet) and net.unet_engine.device == CUDA and net.unet_engine.cuda_graphs
    assert net.encoder_engine is None and net.decoder_engine.path.name == "vae_decoder.engine"
    assert fast.unet is comps.unet and net.inner.unet is comps.unet  # the torch path stays underneath
    assert "tensorrt fp16 (unet, vae_decoder)" in fast.notes[-1]


def test_video_tensorrt_on_a_gpu(monkeypatch, tmp_path, cuda_on_cpu):
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.kernels.tensorrt import runtime
    from streamstudio.models.video import video_engine
    from streamstudio.models.video.video_engine import VideoEngine

    shapes = []
    monkeypatch.setattr(trt_kernels, "tensorrt_available", lambda: True)
    monkeypatch.setattr(video_engine, "video_export_spec",
                        lambda model, f, h, w: (SimpleNamespace(name="video"), (h, w)))
    monkeypatch.setattr(video_engine, "ensure_engine",
                        lambda spec, cache, s, precision="fp16": (shapes.append(s), tmp_path / "video.engine")[1])
    monkeypatch.setattr(runtime, "TRTEngine", FakeTRTEngine)
    inner = nn.Linear(2, 2)
    inner.cfg = SimpleNamespace(text=SimpleNamespace(max_tokens=7))
    model = OnCuda(inner)
    out = video_engine.apply_video_acceleration(model, "tensorrt", frames=4, height=8, width=16, max_batch=2)
    assert isinstance(out, VideoEngine) and out.engine.device == CUDA
    assert shapes[0].batch == (1, 1, 2) and shapes[0].height == (8, 8, 8) and shapes[0].width == (16, 16, 16)


# ------------------------------------------------------------------ other kernels: splats, TensorRT cache
def test_splat_auto_picks_cuda_and_dispatches_to_it(fake_gpu, monkeypatch):
    from streamstudio.kernels import splat, splat_cuda, splat_reference

    monkeypatch.setattr(splat_cuda, "load", lambda: object())
    assert splat.pick_impl("auto", CUDA) == "cuda"
    monkeypatch.setattr(splat_cuda, "load", lambda: None)
    assert splat.pick_impl("auto", CUDA) == "reference"
    ran = []
    monkeypatch.setattr(splat_cuda, "rasterize_projected",
                        lambda *a: (ran.append(1), splat_reference.rasterize_projected(*a))[1])
    means = torch.tensor([[0.0, 0.0, 3.0]])
    out = splat.rasterize_gaussians(means, torch.tensor([[1.0, 0, 0, 0]]), torch.full((1, 3), 0.3),
                                    torch.ones(1), torch.ones(1, 3), torch.eye(4), (10.0, 10.0, 4.0, 4.0), 8, 8,
                                    impl="cuda")
    assert ran == [1] and out.impl == "cuda" and out.rgb.shape == (8, 8, 3) and out.alpha.max() > 0


def test_splat_cuda_load_on_a_gpu(fake_gpu, monkeypatch):
    from streamstudio.kernels import splat_cuda

    module = object()
    monkeypatch.setattr(cuda_build, "load_extension", lambda name, sources: module)
    assert splat_cuda.load() is module


def test_tensorrt_gpu_identity(fake_gpu):
    from streamstudio.kernels.tensorrt.cache import gpu_identity

    assert gpu_identity() == f"{GPU_NAME} sm_90"
    assert gpu_identity(torch.device("cuda", 0)) == f"{GPU_NAME} sm_90"


# ------------------------------------------------------------------ benchmarks
class FakeStream:
    def __init__(self, device=None, priority=0):
        self.waited = []

    def wait_stream(self, stream):
        self.waited.append(stream)


class FakeCUDAGraph:
    def __init__(self, keep_graph: bool = False):
        self.captured, self.replays = False, 0

    def replay(self):
        assert self.captured, "replay() of a graph never captured"
        self.replays += 1


@pytest.fixture
def fake_cuda_graph(monkeypatch):
    """torch.cuda's streams and graphs as benchmarks/kernel_ops.py uses them: capture runs the
    Python body once (as a real capture does), replay does nothing. Keyword arguments are
    bound against the real signatures, so a misspelt one fails here."""
    import inspect

    real_graph = inspect.signature(torch.cuda.graph.__init__)
    state = SimpleNamespace(graphs=[], streams=[], capturing=False, fail=None)

    class FakeGraphContext:
        def __init__(self, *args, **kwargs):
            bound = real_graph.bind(None, *args, **kwargs).arguments
            self.graph = bound["cuda_graph"]
            assert isinstance(self.graph, FakeCUDAGraph)
            assert bound.get("stream") is None or isinstance(bound["stream"], FakeStream)

        def __enter__(self):
            assert not state.capturing
            state.capturing = True
            if state.fail:
                raise RuntimeError(state.fail)

        def __exit__(self, *exc):
            state.capturing = False
            self.graph.captured = exc[0] is None
            state.graphs.append(self.graph)
            return False

    def stream(s):
        assert s is None or isinstance(s, FakeStream)
        return contextlib.nullcontext()

    def current_stream(device=None):
        s = FakeStream()
        state.streams.append(s)
        return s

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", FakeGraphContext)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(name=GPU_NAME, L2_cache_size=50 * 2**20))
    return state


def tiny_kernel_sizes(bench):
    """benchmarks/kernel_ops.py's op sizes, small enough for the CPU."""
    return bench.Sizes(cam=(12, 20), size=8, resize_batch=2, frame_batch=2, rows=3, latent=(4, 2, 4), cosine=40)


def test_benchmark_kernels_on_a_gpu(fake_gpu, monkeypatch, tmp_path, tiny, cuda_on_cpu):
    bench = load_benchmark("kernel_ops")
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.models.image import acceleration

    assert bench.device_name(CUDA) == GPU_NAME
    # the pipeline rows on the GPU: the sd-turbo-sized model swapped for the tiny one
    monkeypatch.setattr(bench, "sd_turbo_components", lambda device, dtype: tiny)
    monkeypatch.setattr(kernels, "fused_available", lambda: True)
    monkeypatch.setattr(acceleration, "apply_acceleration", lambda comps, mode: comps)
    monkeypatch.setattr(trt_kernels, "tensorrt_available", lambda: True)
    monkeypatch.setattr(bench, "pipeline_fps", lambda comps, size, frames, warmup, device: 1.0)
    seen = []
    rows = bench.bench_pipeline(CUDA, quick=True, on_row=lambda rows: seen.append(len(rows)))
    assert [r["mode"] for r in rows] == ["eager", "fused kernels", "fused + torch.compile", "fused + tensorrt"]
    assert all("512x512" in r["model"] for r in rows)
    assert seen == [1, 2, 3, 4]  # the JSON is rewritten after each mode


def test_benchmark_kernels_times_a_cuda_graph_of_launches(fake_gpu, fake_cuda_graph):
    bench = load_benchmark("kernel_ops")
    calls = []
    seconds, how = bench.measure(lambda: calls.append(fake_cuda_graph.capturing), CUDA, bench.Timing(4, 3))
    assert seconds >= 0 and how.startswith("cuda graph of 4 launches")
    assert calls == [False, False] + [True] * 4  # two warm-up calls, then 4 captured back to back
    (graph,) = fake_cuda_graph.graphs
    assert graph.replays == 1 + 3  # the upload replay, then 3 timed replays


def test_benchmark_kernels_falls_back_to_back_to_back_launches(fake_gpu, fake_cuda_graph):
    bench = load_benchmark("kernel_ops")
    fake_cuda_graph.fail = "operation not permitted when stream is capturing\nmore"
    calls = []
    seconds, how = bench.measure(lambda: calls.append(1), CUDA, bench.Timing(4, 3))
    assert seconds >= 0 and "graph capture failed: RuntimeError: operation not permitted" in how
    assert "more" not in how
    assert len(calls) == 2 + 2 + 3 * 4  # warm-ups (graph, then loop) and 3 timed runs of 4 launches


def test_benchmark_kernels_ops_on_a_gpu(fake_gpu, fake_cuda_graph, monkeypatch, cuda_on_cpu):
    bench = load_benchmark("kernel_ops")
    monkeypatch.setattr(kernels, "fused_available", lambda: True)
    sizes = tiny_kernel_sizes(bench)
    rows = bench.bench_ops(CUDA, quick=True, bandwidth=1e9, sizes=sizes)
    assert [r["op"] for r in rows][:1] == ["preprocess resize 12x20->8"]
    for r in rows:
        assert "error" not in r and r["fused_us"] is not None and r["timing"].startswith("cuda graph")
        assert r["eager_timing"].startswith("cuda graph")
        assert r["floor_pct"] == pytest.approx(100 * r["fused_GBps"] / 1.0)  # % of the 1 GB/s copy
        assert r["floor_us"] == pytest.approx(r["bytes"] / 1e3)
        assert r["l2_multiple"] == pytest.approx(r["bytes"] / (50 * 2**20))
        assert r["meets_target"] == (r["floor_pct"] >= 70)
        assert r["bytes"] == r["bytes_read"] + r["bytes_written"]
    # bytes: every input read once, every output written once, fp16 on a GPU, written out here
    frames, n, lat = 2 * 12 * 20, 8 * 8, 3 * 4 * 2 * 4
    want = {"preprocess resize 12x20->8": (frames * 3, 2 * 3 * n * 2),
            "preprocess same size 12x20": (frames * 3, frames * 3 * 2),
            "postprocess 12x20": (frames * 3 * 2, frames * 3),
            "stream_step no CFG": (3 * lat * 2 + 3 * 6 * 4, 2 * lat * 2),  # x, eps, noise, coef -> x0, x_next
            "stream_step self-CFG": (4 * lat * 2 + 3 * 6 * 4, 3 * lat * 2),  # + stock -> + stock_next
            "stream_step full CFG": (4 * lat * 2 + 3 * 6 * 4, 2 * lat * 2),  # + eps_uncond
            "cosine similarity": (2 * 40 * 2, 4)}
    if "preprocess RGBA resize 12x20->8" in [r["op"] for r in rows]:
        want["preprocess RGBA resize 12x20->8"] = (frames * 4, 2 * 3 * n * 2)
    assert {r["op"]: (r["bytes_read"], r["bytes_written"]) for r in rows} == want
    # the written bytes are the outputs the ops return (stock_next is `stock` itself without self-CFG)
    for case in bench.op_cases(CUDA, True, sizes):
        out = case.fused()
        outs = list(out) if isinstance(out, tuple) else [out]
        if "no CFG" in case.op or "full CFG" in case.op:
            outs = outs[:2]
        assert all(o.dtype in (torch.float16, torch.uint8, torch.float32) for o in outs)
        assert sum(o.numel() * o.element_size() for o in outs) == case.written, case.op


def test_benchmark_kernels_pipeline_fps_synchronizes(fake_gpu, tiny):
    bench = load_benchmark("kernel_ops")
    assert bench.pipeline_fps(tiny, 32, frames=2, warmup=1, device=CUDA) > 0
    assert fake_gpu.sync == 2


@pytest.mark.parametrize("fused", [False, True])
def test_benchmark_kernels_main_on_a_gpu(fake_gpu, fake_cuda_graph, monkeypatch, tmp_path, cuda_on_cpu, fused):
    bench = load_benchmark("kernel_ops")
    monkeypatch.setattr(kernels, "fused_available", lambda: fused)
    monkeypatch.setattr(bench, "GPU_SIZES", tiny_kernel_sizes(bench))
    monkeypatch.setattr(bench, "GPU_COPY_BYTES", 1 << 16)
    out = tmp_path / "kernels.json"
    cpu_run = {"device": "CPU (x86_64, 2 cores)", "date": "2026-01-01T00:00:00+00:00", "ops": [{"op": "x"}]}
    out.write_text(json.dumps(cpu_run))  # the older one-run format, from a CPU
    assert bench.main(["--device", "cuda", "--quick", "--no-pipeline", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == GPU_NAME and result["cuda"] == "12.8" and result["l2_bytes"] == 50 * 2**20
    assert result["copy_bandwidth_GBps"] > 0 and result["copy_timing"].startswith("dst.copy_(src) of 0 MiB, cuda graph")
    assert result["cpu"] == cpu_run  # the CPU figures are kept
    assert result["gpu"] == {k: v for k, v in result.items() if k not in ("gpu", "cpu")}
    assert len(result["ops"]) >= 7 and all(r["timing"].startswith("cuda graph") for r in result["ops"])
    assert all((r["fused_us"] is not None) == fused for r in result["ops"])
    assert any("fused kernels unavailable" in n for n in result["notes"]) != fused
    assert any("moves less than 4x L2" in n for n in result["notes"])  # the tiny sizes fit in L2


def test_benchmark_kernels_copy_bandwidth_on_a_gpu(fake_gpu, fake_cuda_graph, cuda_on_cpu):
    bench = load_benchmark("kernel_ops")
    assert bench.GPU_COPY_BYTES == 1 << 30
    bandwidth, how = bench.copy_bandwidth(CUDA, quick=True, nbytes=1 << 20)  # 1 MiB on "cuda" (the CPU here)
    assert bandwidth > 0 and how.startswith("dst.copy_(src) of 1 MiB, cuda graph of 10 launches")


def test_benchmark_multistream_on_a_gpu(fake_gpu, monkeypatch, tmp_path, tiny):
    bench = load_benchmark("multistream")
    import stream_diffusion as sd_bench  # benchmarks/stream_diffusion.py, as multistream imports it

    monkeypatch.setattr(sd_bench, "sd_turbo_architecture", lambda device, dtype: tiny)
    comps, size, name = bench.components(CUDA)
    assert comps is tiny and size == 512 and "fp16" in name
    monkeypatch.setattr(bench, "components", lambda device: (tiny, 32, "tiny"))
    monkeypatch.setattr(bench, "closed_loop", lambda manager, k, w, h, warmup, seconds: {
        "streams": k, "total_fps": 2.0 * k, "per_stream_fps": [2.0] * k, "requests_per_call": 1.0})
    out = tmp_path / "multistream.json"
    assert bench.main(["--device", "cuda", "--streams", "1", "2", "--out", str(out)]) == 0
    assert GPU_NAME in out.read_text()


def test_benchmark_stream_diffusion_on_a_gpu(fake_gpu, monkeypatch, tmp_path, tiny, tiny_components_factory):
    bench = load_benchmark("stream_diffusion")
    frames = [np.zeros((32, 32, 3), np.uint8)] * 2
    with CudaOnCpu():  # (own components: the network timer wraps their VAE's methods)
        timed = bench.Timed(tiny_components_factory(taesd=True), frames, width=32, height=32, steps=1, cfg_type="none")
        timed.pipe.device = CUDA  # as on a GPU; CudaOnCpu keeps its tensors on the CPU
        timed.timer.device = CUDA
        timed.round()
    assert timed.best_total > 0 and timed.best_net > 0
    assert fake_gpu.sync >= 2 + 2 * 2 * 2  # round start / end, and around each UNet and VAE call
    one = {"size": 512, "frames": 30, "rounds": 3, "seconds_per_frame_1step": 0.01, "overhead_ratio": 1.2,
           "steps": 4, "stream_batch_speedup": 1.5, "rcfg_self_speedup": 1.9,
           "seconds_per_frame": {k: 0.01 for k in ("one_step", "batch", "sequential", "self", "full")}}
    sizes = []
    monkeypatch.setattr(bench, "load_components", lambda name, device, dtype: tiny)
    monkeypatch.setattr(bench, "sd_turbo_architecture", lambda device, dtype: (sizes.append(dtype), tiny)[1])
    monkeypatch.setattr(bench, "measure",
                        lambda comps, size, frames, steps, full, rounds: (sizes.append(size), dict(one))[1])
    monkeypatch.setattr(bench, "ssf_static_rate", lambda comps: 0.5)
    addons = {k: 1.1 for k in ("controlnet_1_cost", "controlnet_2_cost", "lora_fused_cost", "lora_unfused_cost")}
    monkeypatch.setattr(bench, "sdxl_architecture", lambda big, device, dtype: (sizes.append("sdxl"), tiny)[1])
    monkeypatch.setattr(bench, "measure_addons", lambda comps, size, frames, rounds, sdxl=None:
                        dict(addons, **({"sdxl_arch_cost": 2.0} if sdxl is not None else {})))
    out = tmp_path / "sd.json"
    bench.main(["--device", "cuda", "--threads", str(torch.get_num_threads()), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["device"] == GPU_NAME and result["sd_turbo_arch"]["fps_1step_512"] == pytest.approx(100.0)
    assert sizes == [torch.float16, 64, 512, "sdxl"]  # the SDXL add-on row runs on a GPU
    assert result["addons_measured_on"] == "sd_turbo_arch" and result["sdxl_arch_cost"] == 2.0
    # the GPU session's two calls: the core figures in the first, the add-ons' costs in the second
    bench.main(["--device", "cuda", "--threads", str(torch.get_num_threads()), "--part", "core", "--out", str(out)])
    core = json.loads(out.read_text())
    assert core["stream_batch_speedup"] == 1.5 and "controlnet_1_cost" not in core and "addons" not in core
    bench.main(["--device", "cuda", "--threads", str(torch.get_num_threads()), "--part", "addons", "--out", str(out)])
    later = json.loads(out.read_text())
    assert later["controlnet_1_cost"] == 1.1 and later["sdxl_arch_cost"] == 2.0 and "stream_batch_speedup" not in later


def test_benchmark_splats_on_a_gpu(fake_gpu, monkeypatch, tmp_path):
    bench = load_benchmark("splats")
    from streamstudio.kernels import splat_cuda

    monkeypatch.setattr(splat_cuda, "load", lambda: None)
    assert bench.gpu_row()["status"] == "missing: the CUDA kernel did not build"
    monkeypatch.setattr(splat_cuda, "load", lambda: object())
    seen = {}
    monkeypatch.setattr(bench, "synthetic_scene", lambda n: n)
    monkeypatch.setattr(bench, "frame_args", lambda scene, side, frames, device="cpu", width=None:
                        seen.update(device=device, size=(width, side)) or [])
    monkeypatch.setattr(bench, "time_frames", lambda args, impl, sync: (sync(), seen.update(impl=impl),
                                                                        {"wall_s": 0.004})[2])
    out = tmp_path / "splats.json"
    assert bench.main(["--cuda-only", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["cuda"]
    assert row["status"] == "measured" and row["device"] == GPU_NAME and row["fps"] == pytest.approx(250)
    assert seen == {"device": "cuda", "size": (1920, 1080), "impl": "cuda"} and fake_gpu.sync == 1


def test_benchmark_stream_video_on_a_gpu(fake_gpu, monkeypatch, cuda_on_cpu):
    bench = load_benchmark("stream_video")
    g = bench.gpu_4b(1, config="tiny", latent=(1, 4, 3, 32, 32))
    assert g["device"] == GPU_NAME and g["step_ms"] > 0 and g["params"] > 0
    assert fake_gpu.sync >= 2


def test_benchmark_webapp_machine_on_a_gpu(fake_gpu):
    pytest.importorskip("gradio")  # the web app benchmark imports the app (the GPU image has no Gradio)
    pytest.importorskip("fastrtc")
    bench = load_benchmark("webapp")
    assert bench.machine()["gpu"] == GPU_NAME and bench.machine()["device"] == "cuda"


def test_splat_tab_renders_on_the_gpu_when_there_is_one(fake_gpu):
    from streamstudio.app.web.splat_tab import ViewSettings

    assert ViewSettings().render_config().device == "cuda"
    assert ViewSettings().render_config("cpu").device == "cpu"


def test_tensorrt_engine_key_names_the_gpu(fake_gpu):
    from streamstudio.kernels.tensorrt.build import ShapeRange, engine_key
    from streamstudio.kernels.tensorrt.export import ExportSpec

    lin = nn.Linear(2, 2)
    spec = ExportSpec("unet", lin, OnCuda(lin), ["x"], ["y"], {"x": {0: "batch"}},
                      lambda b, h, w, device, dtype, gen: {"x": torch.empty(b, 3, h, w, device=device, dtype=dtype)})
    key = engine_key(spec, ShapeRange((1, 1, 2), (64, 64, 64), (64, 64, 64)))
    assert f"{GPU_NAME} sm_90" in repr(key)


def test_cpu_threads_leave_a_core_and_a_gpu_keeps_torchs_default(monkeypatch):
    from streamstudio import device as dev

    for cpus, want in ((1, 1), (2, 1), (4, 3), (16, 8)):
        monkeypatch.setattr(dev, "usable_cpus", lambda cpus=cpus: cpus)
        assert dev.pick_threads(None, torch.device("cpu")) == want
    assert dev.pick_threads(None, CUDA) is None
    assert dev.pick_threads(3, CUDA) == 3 and dev.pick_threads(5, torch.device("cpu")) == 5
    with pytest.raises(StreamStudioError, match="--threads must be at least 1"):
        dev.pick_threads(0, torch.device("cpu"))
    before = torch.get_num_threads()
    try:
        assert dev.use_threads(None, CUDA) == before  # left alone on a GPU
        assert dev.use_threads(1, torch.device("cpu")) == 1
    finally:
        torch.set_num_threads(before)
