"""TensorRT path without TensorRT: the export's opset, engine cache keys, profiles, the engine
builder against a stand-in of TensorRT 10's and 11's Python API, and the acceleration modes' CPU
behaviour (the model specs' own exports: tests/acceleration/test_export_specs.py)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from streamstudio.kernels import tensorrt as trt_kernels
from streamstudio.kernels.tensorrt.build import ShapeRange, engine_key, profile_for
from streamstudio.kernels.tensorrt.cache import EngineCache, EngineKey, model_identity
from streamstudio.kernels.tensorrt.export import export_onnx
from streamstudio.models import acceleration as shared
from streamstudio.models.image import acceleration
from streamstudio.models.image.export_specs import EngineImageNet, eps_spec, image_specs, vae_decoder_spec
from streamstudio.models.image.image_net import ImageCond

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

def test_export_refuses_old_opset(comps, tmp_path):
    with pytest.raises(ValueError, match="opset"):
        export_onnx(vae_decoder_spec(comps.net), tmp_path / "x.onnx", opset=17)


# ------------------------------------------------------------------------------ engine cache
def _key(**changes) -> EngineKey:
    base = dict(name="unet", model_id="abc", profile={"sample": ((1, 4, 32, 32), (1, 4, 64, 64), (4, 4, 128, 128))},
                precision="fp16", trt_version="10.3.0", gpu="NVIDIA H100 80GB HBM3 sm_90")
    base.update(changes)
    return EngineKey.make(**base)


def test_engine_key_changes_with_every_component():
    base = _key()
    assert _key().filename() == base.filename()  # deterministic
    variants = [_key(name="vae_decoder"), _key(model_id="abd"), _key(precision="fp32"), _key(trt_version="10.4.0"),
                _key(gpu="NVIDIA GeForce RTX 4090 sm_89"),
                _key(profile={"sample": ((1, 4, 32, 32), (1, 4, 64, 64), (8, 4, 128, 128))}),
                _key(profile={"sample": ((1, 4, 32, 32), (2, 4, 64, 64), (4, 4, 128, 128))})]
    names = {v.filename() for v in variants}
    assert base.filename() not in names and len(names) == len(variants)


def test_model_identity_follows_weights_and_config(comps):
    vae = comps.vae
    first = model_identity(vae)
    assert model_identity(vae) == first
    param = next(vae.parameters())
    old = param.data.flatten()[0].item()
    try:
        param.data.flatten()[0] += 1e-3
        assert model_identity(vae) != first
    finally:
        param.data.flatten()[0] = old
    assert model_identity(vae) == first
    from diffusers import AutoencoderKL

    config = {k: v for k, v in vae.config.items() if not k.startswith("_")}
    other = AutoencoderKL(**{**config, "scaling_factor": 0.5})
    other.load_state_dict(vae.state_dict())
    assert model_identity(other) != first  # same weights, other config


def test_cache_lookup_needs_the_exact_key(tmp_path):
    cache = EngineCache(tmp_path)
    key = _key()
    assert cache.lookup(key) is None
    path = cache.store(key, b"engine bytes")
    assert cache.lookup(key) == path and path.read_bytes() == b"engine bytes"
    assert cache.lookup(_key(trt_version="10.4.0")) is None
    meta = path.with_suffix(".json")
    stored = json.loads(meta.read_text())
    meta.write_text(json.dumps({**stored, "gpu": "something else"}))  # a copied / tampered engine
    assert cache.lookup(key) is None
    assert cache.entries()[0]["file"] == path.name


def test_profiles_cover_batch_and_resolution(comps):
    spec = eps_spec(comps.net)
    prof = profile_for(spec, ShapeRange(batch=(1, 2, 4), height=(256, 512, 1024), width=(256, 512, 1024)))
    assert prof["sample"] == ((1, 4, 32, 32), (2, 4, 64, 64), (4, 4, 128, 128))
    assert prof["timestep"] == ((1,), (2,), (4,))
    assert prof["text"][2] == (4, 77, 32)
    dec = profile_for(vae_decoder_spec(comps.net), ShapeRange())
    assert dec["latents"][0] == (1, 4, 32, 32) and dec["latents"][2] == (4, 4, 128, 128)
    with pytest.raises(ValueError):
        ShapeRange(batch=(2, 1, 4))


def test_engine_key_of_a_spec_tracks_the_model(comps):
    spec = vae_decoder_spec(comps.net)
    key = engine_key(spec, ShapeRange())
    assert key.model_id == model_identity(comps.vae)
    assert key.trt_version == trt_kernels.tensorrt_version()
    assert engine_key(spec, ShapeRange(), precision="fp32").filename() != key.filename()
    assert engine_key(spec, ShapeRange(batch=(1, 1, 8))).filename() != key.filename()


# ------------------------------------------------------------------------------ acceleration modes
@pytest.mark.skipif(trt_kernels.tensorrt_available(), reason="TensorRT is installed")
def test_tensorrt_mode_without_tensorrt_falls_back_once(comps):
    shared._said.clear()
    with pytest.warns(RuntimeWarning, match="TensorRT is not installed"):
        out = acceleration.apply_acceleration(comps, "tensorrt")
    assert out.network is None and out.unet is comps.unet and out.vae is comps.vae
    assert any("tensorrt unavailable" in n for n in out.notes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acceleration.apply_acceleration(comps, "tensorrt")  # said once only
    with pytest.raises(trt_kernels.TensorRTUnavailable, match="pip install streamstudio\\[tensorrt\\]"):
        shared.build_engines(image_specs(comps, ("vae_decoder",)))


def test_none_mode_and_bad_mode(comps):
    assert acceleration.apply_acceleration(comps, "none") is comps
    from streamstudio.errors import StreamStudioError

    with pytest.raises(StreamStudioError, match="none, compile, tensorrt"):
        acceleration.apply_acceleration(comps, "fast")


def _check_compiled(comps, fast):
    assert isinstance(fast.net, acceleration.CompiledImageNet) and fast.unet is comps.unet
    gen = torch.Generator().manual_seed(0)
    x, text = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 77, 32, generator=gen)
    t = torch.tensor([999, 500])
    images = torch.rand(1, 3, 64, 64, generator=gen) * 2 - 1
    with torch.no_grad():
        want = comps.unet(x, t, encoder_hidden_states=text).sample
        got = fast.net.eps(x, t, ImageCond(text=text))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        z = torch.randn(1, 4, 8, 8, generator=gen)
        torch.testing.assert_close(fast.net.decode(z), comps.net.decode(z), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(fast.net.encode(images), comps.net.encode(images), rtol=1e-4, atol=1e-4)
    assert comps.unet.__class__.__name__ == "UNet2DConditionModel"  # the input is untouched


def test_compile_mode_matches_eager_on_cpu(tiny_components_factory):
    """Graph capture (dynamo + AOTAutograd) of the tiny UNet and TAESD; inductor's C++ builds
    take minutes on CPU, so the default run uses the aot_eager backend (see the slow test)."""
    comps = tiny_components_factory(taesd=True)
    fast = acceleration.apply_acceleration(comps, "compile", compile_options={"backend": "aot_eager"})
    assert any("torch.compile" in n for n in fast.notes)
    _check_compiled(comps, fast)


@pytest.mark.slow
def test_compile_mode_inductor_matches_eager_on_cpu(tiny_components_factory):
    comps = tiny_components_factory(taesd=True)
    _check_compiled(comps, acceleration.apply_acceleration(comps, "compile"))


def test_export_onnx_models_writes_and_checks(comps, tmp_path):
    specs = image_specs(comps, ("vae_decoder",))
    results = shared.export_onnx_models(specs, tmp_path, batch=1, height=64, width=64)
    assert results[0].path.is_file() and results[0].check.ok()


# ------------------------------------------------------------------------------ with TensorRT (GPU)
@pytest.mark.gpu
def test_tensorrt_engines_match_torch(tmp_path):
    pytest.importorskip("tensorrt")
    from streamstudio.kernels.tensorrt.build import ensure_engine
    from streamstudio.kernels.tensorrt.runtime import TRTEngine
    from streamstudio.models.image.loading import load_components

    comps = load_components("tiny", device="cuda", dtype=torch.float16, taesd=True)
    shapes = ShapeRange(batch=(1, 2, 4), height=(64, 64, 128), width=(64, 64, 128))
    cache = EngineCache(tmp_path)
    unet_path = ensure_engine(eps_spec(comps.net), cache, shapes)
    assert ensure_engine(eps_spec(comps.net), cache, shapes) == unet_path  # cache hit
    dec_path = ensure_engine(vae_decoder_spec(comps.net), cache, shapes)
    net = EngineImageNet(comps.net, TRTEngine(unet_path, "cuda", cuda_graphs=True), None,
                         TRTEngine(dec_path, "cuda", cuda_graphs=False))
    x = torch.randn(3, 4, 12, 16, device="cuda", dtype=torch.float16)
    text = torch.randn(3, 77, 32, device="cuda", dtype=torch.float16)
    t = torch.tensor([999, 500, 10], device="cuda")
    with torch.no_grad():
        want = comps.unet(x, t, encoder_hidden_states=text).sample.float()
        for _ in range(2):  # capture, then replay
            got = net.eps(x, t, ImageCond(text=text)).float()
            assert (got - want).abs().max() / want.abs().max() < 2e-2
        want = comps.vae.decode(x / comps.vae.config.scaling_factor).sample.float()
        got = net.decode(x).float()
        assert (got - want).abs().max() / want.abs().max().clamp_min(1e-3) < 2e-2
    fast = acceleration.apply_acceleration(comps, "tensorrt", engine_dir=tmp_path, shapes=shapes)
    assert isinstance(fast.net, EngineImageNet) and fast.net.unet_engine is not None


@pytest.mark.skipif(trt_kernels.tensorrt_available(), reason="TensorRT is installed")
def test_build_engines_command_without_tensorrt_exports_and_checks(tmp_path, capsys):
    from streamstudio.app.cli import main

    code = main(["build-engines", "--model", "tiny", "--parts", "vae_decoder", "--resolution", "64", "64", "128",
                 "--engine-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "engines need TensorRT" in out and "onnxruntime rel. error" in out and "(ok)" in out
    assert (tmp_path / "onnx" / "vae_decoder" / "model.onnx").is_file()
    capsys.readouterr()
    assert main(["build-engines", "--model", "tiny", "--resolution", "100", "200", "300",
                 "--engine-dir", str(tmp_path)]) == 2  # not multiples of 64: a usage error, before anything loads
    assert "--resolution: must be a multiple of 64, got 100" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["auto", "float16"])
def test_build_engines_loads_the_model_as_the_app_does(monkeypatch, dtype):
    """The engine cache is keyed by the weights (dtype included): build-engines must load the
    model in the dtype the app will run it in, or the app never finds the prebuilt engines."""
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.requests import image_request
    from streamstudio.app import streams
    from streamstudio.app.cli import build_engines_run as build_engines
    from streamstudio.models.image import loading

    seen = []

    def fake_load(model, device, dtype, taesd=None, lcm_lora="auto"):
        seen.append((str(device), dtype))
        raise SystemExit  # stop here: only the load arguments matter

    monkeypatch.setattr(loading, "resolve_demo_default", fake_load)
    for argv in (["build-engines", "--model", "tiny", "--device", "cpu", "--dtype", dtype],
                 ["generate", "--model", "tiny", "--device", "cpu", "--dtype", dtype, "--output", "x"]):
        args = build_parser().parse_args(argv)
        with pytest.raises(SystemExit):
            (build_engines._load if argv[0] == "build-engines"
             else lambda a: streams.build_pipeline(image_request(a), "txt2img"))(args)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert seen[0][1] == (torch.float32 if dtype == "auto" else torch.float16)


@pytest.mark.skipif(trt_kernels.tensorrt_available(), reason="TensorRT is installed")
def test_video_acceleration_modes_on_cpu():
    from streamstudio.models.video.stream_dit import StreamDiT, named_config
    from streamstudio.models.video.video_engine import apply_video_acceleration

    model = StreamDiT(named_config("tiny")).eval()
    assert apply_video_acceleration(model, "none", frames=4, height=32, width=32) is model
    shared._said.clear()
    with pytest.warns(RuntimeWarning, match="TensorRT is not installed"):
        assert apply_video_acceleration(model, "tensorrt", frames=4, height=32, width=32) is model


@pytest.mark.gpu
@pytest.mark.slow
def test_compile_mode_pipeline_on_gpu_matches_eager(tiny_components_factory):
    """reduce-overhead (CUDA graphs) through the whole stream, flush included."""
    import numpy as np

    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    comps = tiny_components_factory(taesd=True).to(torch.device("cuda"), torch.float32)
    config = StreamDiffusionConfig(width=64, height=64, steps=2, cfg_type="initialize", guidance_scale=1.4)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(5)]

    def run(c):
        stream = StreamDiffusion(c, config, prompt="a dog")
        out = [f for frame in frames for f in stream.push(frame)]
        return out + stream.flush()

    want = run(comps)
    got = run(acceleration.apply_acceleration(comps, "compile"))
    assert len(got) == len(want) == len(frames)
    for a, b in zip(got, want):
        assert np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 2


# ------------------------------------------------------------------------------ the builder on both API generations
class FakeTensorRT:
    """The slice of TensorRT's Python API that build_engine uses, recording what it is asked.
    `generation` 10 has the FP16 builder flag (weak typing); 11 has none (strongly typed)."""

    class Logger:
        WARNING = 2

        def __init__(self, severity):
            self.severity = severity

    def __init__(self, generation: int):
        fake = self
        self.__version__ = f"{generation}.0.0"
        self.calls: dict = {"flags": [], "profile": {}, "parsed": None, "network_flags": None}
        self.BuilderFlag = type("BuilderFlag", (), {"FP16": "FP16"} if generation <= 10 else {})
        self.NetworkDefinitionCreationFlag = type("NetworkDefinitionCreationFlag", (), {})
        self.MemoryPoolType = type("MemoryPoolType", (), {"WORKSPACE": "WORKSPACE"})

        class Profile:
            def set_shape(self, name, lo, opt, hi):
                fake.calls["profile"][name] = (tuple(lo), tuple(opt), tuple(hi))

        class Config:
            def set_flag(self, flag):
                fake.calls["flags"].append(flag)

            def set_memory_pool_limit(self, pool, size):
                fake.calls["workspace"] = (pool, size)

            def add_optimization_profile(self, profile):
                fake.calls["profiles_added"] = fake.calls.get("profiles_added", 0) + 1

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                fake.calls["network_flags"] = flags
                return object()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                return memoryview(b"serialized engine")

        class OnnxParser:
            num_errors = 0

            def __init__(self, network, logger):
                pass

            def parse_from_file(self, path):
                fake.calls["parsed"] = path
                return Path(path).is_file()

            def get_error(self, i):
                return "no such file"

        self.Builder, self.OnnxParser = Builder, OnnxParser


@pytest.fixture()
def fake_trt(monkeypatch):
    def install(generation: int) -> FakeTensorRT:
        fake = FakeTensorRT(generation)
        monkeypatch.setattr(trt_kernels, "_trt", fake)
        monkeypatch.setattr(trt_kernels, "_checked", True)
        return fake

    return install


@pytest.mark.parametrize("generation", [10, 11])
def test_engine_build_sets_the_profile_and_precision_for_each_tensorrt(comps, tmp_path, fake_trt, generation):
    from streamstudio.kernels.tensorrt.build import ensure_engine

    fake = fake_trt(generation)
    spec = eps_spec(comps.net)  # a float32 model: its ONNX graph is fp32
    shapes = ShapeRange(batch=(1, 2, 4), height=(64, 64, 128), width=(64, 64, 128))
    cache = EngineCache(tmp_path)
    if generation <= 10:  # weak typing: the FP16 flag lets TensorRT pick half kernels
        path = ensure_engine(spec, cache, shapes, precision="fp16")
        assert fake.calls["flags"] == ["FP16"]
    else:  # strongly typed: an fp16 engine of an fp32 graph is refused, with what to do
        with pytest.raises(RuntimeError, match="strongly typed.*is fp32.*--dtype float16"):
            ensure_engine(spec, cache, shapes, precision="fp16")
        path = ensure_engine(spec, cache, shapes, precision="fp32")
        assert fake.calls["flags"] == []
    assert path.read_bytes() == b"serialized engine"
    assert fake.calls["profile"] == profile_for(spec, shapes)
    assert fake.calls["profiles_added"] == 1
    assert Path(fake.calls["parsed"]).is_file()  # the exported ONNX
    fake.calls["profile"] = {}
    assert ensure_engine(spec, cache, shapes, precision="fp16" if generation <= 10 else "fp32") == path
    assert fake.calls["profile"] == {}  # second time: from the cache, no build


def test_onnx_float_type_reads_the_graph(comps, tmp_path):
    from streamstudio.kernels.tensorrt.build import onnx_float_type

    path = export_onnx(vae_decoder_spec(comps.net), tmp_path / "dec.onnx", batch=1, height=64, width=64)
    assert onnx_float_type(path) == "fp32"
