"""TensorRT with the model's add-ons (ControlNets, IP-Adapter, LoRAs), without TensorRT or a GPU.

`apply_acceleration(comps, "tensorrt", plan=...)` runs its real path (image_specs, the plan's
profiles and start-up captures, EngineImageNet) with TensorRT's two GPU steps stood in for: the
engine build (`ensure_engine`: records the spec and its profile) and the engine
(`helpers.SpecEngine`: runs the spec's own module in torch, fed by name as TRTEngine is). So
the frames of an accelerated stream equal the eager stream's exactly when the engine wrapper
feeds every input (ControlNet images and scales, IP-Adapter embedding and scale) right.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from addon_models import reference_image, tiny_controlnet, write_tiny_ip_adapter
from helpers import SpecEngine

from streamstudio.errors import StreamStudioError
from streamstudio.kernels.tensorrt.build import ShapeRange, engine_key, profile_for
from streamstudio.models import acceleration as shared
from streamstudio.models.image import acceleration
from streamstudio.models.image.acceleration import BatchPlan
from streamstudio.models.image.export_specs import IP_SCALE, EngineImageNet, image_specs
from streamstudio.models.image.image_net import ImageCond
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

SIZE = 32


class FakeTensorRT:
    """ensure_engine and TRTEngine stood in for: every build is recorded (spec, profile, cache
    key's model identity) and every engine is a SpecEngine of the spec it was built from."""

    def __init__(self, monkeypatch, tmp_path):
        from streamstudio.kernels.tensorrt import runtime

        self.builds, self.engines, self.specs, self.tmp = [], [], {}, tmp_path
        monkeypatch.setattr(acceleration, "tensorrt_missing", lambda device: None)  # TensorRT "here"
        monkeypatch.setattr(acceleration, "ensure_engine", self.ensure_engine)
        monkeypatch.setattr(runtime, "TRTEngine", self.engine)

    def ensure_engine(self, spec, cache, shapes, precision="fp16"):
        key = engine_key(spec, shapes, precision)
        self.builds.append((spec.name, key.model_id, profile_for(spec, shapes)))
        path = self.tmp / f"{spec.name}-{key.digest()}.engine"
        self.specs[path] = spec
        return path

    def engine(self, path, device="cuda", cuda_graphs=False):
        fake = self

        class Engine(SpecEngine):
            captured: list = []

            def capture_all(self, shape_sets):
                self.captured = list(shape_sets)

        engine = Engine(fake.specs[path])
        self.engines.append(engine)
        return engine

    def unet_builds(self):
        return [b for b in self.builds if b[0] == "unet"]


def frames(n=4, seed=0):
    return [np.random.default_rng(seed + i).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for i in range(n)]


CONFIG = StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2, strength=0.7, cfg_type="self", guidance_scale=1.4)
PLAN = BatchPlan.for_streams(height=SIZE, width=SIZE, steps=2, cfg_types=["self"])


def run(stream, inputs):
    return [o for f in inputs for o in stream.push(f)] + stream.flush()


def assert_same_frames(a, b):
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert np.abs(x.astype(np.int16) - y.astype(np.int16)).max() <= 1


def assert_differ(a, b):
    assert any(np.abs(x.astype(np.int16) - y.astype(np.int16)).max() > 1 for x, y in zip(a, b))


@pytest.fixture
def with_controlnets(tiny_components_factory):
    comps = tiny_components_factory()
    comps.controlnets = [tiny_controlnet(comps.unet, 0), tiny_controlnet(comps.unet, 1)]
    comps.control_defaults = [("canny", 0.8), ("softedge", 0.5)]
    return comps


def test_controlnet_stream_on_the_engine_equals_eager(with_controlnets, monkeypatch, tmp_path):
    """Two ControlNets: the UNet engine takes both control images at full image size and the (B, 2)
    scales; its profile and the start-up captures cover them at every planned batch; the frames
    equal the eager stream's, at the default scales and after a live scale change (the scales are
    inputs: no new engine)."""
    comps = with_controlnets
    trt = FakeTensorRT(monkeypatch, tmp_path)
    fast = acceleration.apply_acceleration(comps, "tensorrt", engine_dir=tmp_path, plan=PLAN)
    net = fast.net
    assert isinstance(net, EngineImageNet) and "the UNet engine takes 2 ControlNet(s)" in fast.notes[-1]
    unet = net.unet_engine
    assert unet.input_names == ["sample", "timestep", "text", "control_0", "control_1", "control_scale"]

    name, _, profile = trt.unet_builds()[0]
    lo, hi = PLAN.batch_range("unet")[0], PLAN.batch_range("unet")[2]
    assert profile["control_0"][0] == (lo, 3, SIZE, SIZE) and profile["control_1"][2] == (hi, 3, SIZE, SIZE)
    assert profile["control_scale"][2] == (hi, 2) and profile["sample"][2] == (hi, 4, SIZE // 8, SIZE // 8)
    assert [s["control_1"] for s in unet.captured] == [(b, 3, SIZE, SIZE) for b in PLAN.sizes["unet"]]
    assert [s["control_scale"] for s in unet.captured] == [(b, 2) for b in PLAN.sizes["unet"]]

    inputs = frames()
    eager = StreamDiffusion(comps, CONFIG, prompt="a red ball")
    engine = StreamDiffusion(fast, CONFIG, prompt="a red ball")
    want, got = run(eager, inputs), run(engine, inputs)
    assert_same_frames(got, want)
    assert unet.calls > 0 and all(s["control_0"][1:] == (3, SIZE, SIZE) for s in unet.shapes)

    for stream in (eager, engine):
        stream.update(control_scales=[0.0, 1.2])
    rescaled = run(engine, inputs)
    assert_same_frames(rescaled, run(eager, inputs))
    assert_differ(rescaled, got)
    assert len(trt.unet_builds()) == 1  # no rebuild for a scale


def test_ip_adapter_stream_on_the_engine_equals_eager(tiny_components_factory, monkeypatch, tmp_path):
    """An IP-Adapter: its reference embedding (B, 1, D) and its per-row scale (B, 1) are engine
    inputs; the frames equal eager's with a reference, and again after a live scale change of the
    stream (no rebuild); a call without per-row scales (a warm-up's) gets the adapter's default."""
    from streamstudio.models.image.ip_adapter import IPAdapter

    comps = tiny_components_factory()
    comps.ip_adapter = IPAdapter(comps, f"{write_tiny_ip_adapter(comps.unet, tmp_path / 'ip')}:1.0")
    trt = FakeTensorRT(monkeypatch, tmp_path)
    fast = acceleration.apply_acceleration(comps, "tensorrt", engine_dir=tmp_path, plan=PLAN)
    unet = fast.net.unet_engine
    assert unet.input_names == ["sample", "timestep", "text", "image_embeds", IP_SCALE]
    assert [s[IP_SCALE] for s in unet.captured] == [(b, 1) for b in PLAN.sizes["unet"]]
    assert "IP-Adapter" in fast.notes[-1]

    inputs = frames(seed=5)
    reference = (reference_image(2).permute(1, 2, 0).numpy() * 255).astype(np.uint8)
    eager = StreamDiffusion(comps, CONFIG, prompt="a fox")
    engine = StreamDiffusion(fast, CONFIG, prompt="a fox")
    for stream in (eager, engine):
        stream.addons.set_reference(reference)
    got = run(engine, inputs)
    assert_same_frames(got, run(eager, inputs))
    assert unet.calls > 0

    for stream in (eager, engine):
        stream.addons.set_ip_adapter_scale(0.3)  # the stream's own scale: its rows' ip_scale input
    lower = run(engine, inputs)
    assert_same_frames(lower, run(eager, inputs))
    assert_differ(lower, got)
    assert unet.shapes[-1][IP_SCALE] == (unet.shapes[-1]["sample"][0], 1)
    assert len(trt.unet_builds()) == 1

    x = torch.randn(2, 4, SIZE // 8, SIZE // 8)
    cond = dataclasses.replace(comps.example_cond(2, SIZE, SIZE, torch.device("cpu"), torch.float32), ip_scale=None)
    cond = dataclasses.replace(cond, image_embeds=torch.randn(2, 1, 32))
    with torch.no_grad():  # no per-row scales: the adapter's default scale (1.0), as the eager call
        torch.testing.assert_close(fast.net.eps(x, 500, cond), comps.net.eps(x, 500, cond), rtol=1e-4, atol=1e-5)
    assert unet.shapes[-1][IP_SCALE] == (2, 1)


def test_engine_refuses_a_condition_it_was_not_built_for(with_controlnets, tiny_components_factory):
    """A condition missing an input the engine takes (or carrying one it does not) is a clear error."""
    comps = with_controlnets
    spec = image_specs(comps, ("unet",))[0]
    net = EngineImageNet(comps.net, SpecEngine(spec))
    x = torch.zeros(1, 4, SIZE // 8, SIZE // 8)
    text_only = comps.example_cond(1, SIZE, SIZE, torch.device("cpu"), torch.float32)
    text_only = ImageCond(text=text_only.text)
    with pytest.raises(StreamStudioError, match=r"missing \['control_0', 'control_1', 'control_scale'\]"):
        net.eps(x, 999, text_only)
    plain = tiny_components_factory()
    plain_net = EngineImageNet(plain.net, SpecEngine(image_specs(plain, ("unet",))[0]))
    with pytest.raises(StreamStudioError, match="not taken"):
        plain_net.eps(x, 999, comps.example_cond(1, SIZE, SIZE, torch.device("cpu"), torch.float32))


def test_cache_key_covers_controlnets_ip_adapter_and_fused_loras(tiny_components_factory, tmp_path):
    """The UNet engine's cache key changes when a ControlNet is added (and with its weights), when
    an IP-Adapter is added, and when a LoRA is fused or its scale changes; removing the LoRA gives
    the base key back (the base engine is found in the cache again)."""
    from addon_models import make_lora

    from streamstudio.models.image.ip_adapter import IPAdapter
    from streamstudio.models.image.lora import LoraSet

    shapes = ShapeRange((1, 1, 2), (SIZE,) * 3, (SIZE,) * 3)

    def key(c):
        return engine_key(image_specs(c, ("unet",))[0], shapes)

    comps = tiny_components_factory()
    base = key(comps)
    make_lora(comps, tmp_path / "lora")
    loras = LoraSet(comps)
    loras.add(str(tmp_path / "lora"))
    fused = key(comps)
    loras.set_scale(loras.loras[0].name, 0.5)
    half = key(comps)
    assert len({base.model_id, fused.model_id, half.model_id}) == 3
    loras.clear()
    assert key(comps) == base

    comps.controlnets = [tiny_controlnet(comps.unet, 0)]
    one_net = key(comps)
    assert one_net.model_id != base.model_id and "control_0" in one_net.profile_dict()
    with torch.no_grad():
        comps.controlnets[0].controlnet_mid_block.weight.mul_(2)
    assert key(comps).model_id != one_net.model_id
    comps.controlnets = []
    assert key(comps) == base
    comps.ip_adapter = IPAdapter(comps, str(write_tiny_ip_adapter(comps.unet, tmp_path / "ip")))
    with_ip = key(comps)
    assert with_ip.model_id != base.model_id and IP_SCALE in with_ip.profile_dict()


def test_a_lora_change_rebuilds_the_unet_engine(tiny_components_factory, monkeypatch, tmp_path):
    """With LoRAs the UNet engine is rebuilt (not refit) when they change: the next call builds the
    engine of the new weights (a new cache key) and its frames equal eager's with the new scale;
    removing the LoRA asks for the base weights' key again. The program says so."""
    from addon_models import make_lora

    from streamstudio.models.image.lora import LoraSet

    comps = tiny_components_factory()
    base_id = engine_key(image_specs(comps, ("unet",))[0], PLAN.shapes("unet")).model_id
    make_lora(comps, tmp_path / "lora")
    comps.loras = LoraSet(comps)
    comps.loras.add(str(tmp_path / "lora"))
    trt = FakeTensorRT(monkeypatch, tmp_path)
    monkeypatch.setattr(shared, "_said", set())  # the rebuild message is said once per process
    fast = acceleration.apply_acceleration(comps, "tensorrt", engine_dir=tmp_path, plan=PLAN)
    assert acceleration.LORA_REBUILD_MESSAGE in fast.notes and "rebuilt, not refit" in fast.notes[-1]
    assert "not measured" in fast.notes[-1]
    inputs = frames(seed=9)
    eager = StreamDiffusion(comps, CONFIG, prompt="a house")
    engine = StreamDiffusion(fast, CONFIG, prompt="a house")
    first = run(engine, inputs)
    assert_same_frames(first, run(eager, inputs))
    assert len(trt.unet_builds()) == 1 and fast.net.rebuilds == 0

    name = comps.loras.loras[0].name
    engine.addons.set_lora_scale(name, 0.3)  # the shared LoRA set: the eager stream sees it too
    with pytest.warns(RuntimeWarning, match="rebuilds the UNet engine"):
        second = run(engine, inputs)
    assert fast.net.rebuilds == 1 and len(trt.unet_builds()) == 2
    assert trt.unet_builds()[1][1] != trt.unet_builds()[0][1]  # another model identity: another engine
    assert fast.net.unet_engine is trt.engines[-1] and trt.engines[-1].captured  # captured again
    assert_same_frames(second, run(eager, inputs))
    assert_differ(second, first)

    comps.loras.remove(name)
    run(engine, inputs[:1])
    assert fast.net.rebuilds == 2 and trt.unet_builds()[-1][1] == base_id

    def fails(*args, **kwargs):
        raise RuntimeError("builder out of memory")

    monkeypatch.setattr(acceleration, "ensure_engine", fails)  # a failed rebuild: the UNet goes on in torch
    comps.loras.add(str(tmp_path / "lora"))
    with pytest.warns(RuntimeWarning, match="new weights failed"):
        after = run(engine, inputs)
    assert fast.net.unet_engine is None and fast.net.rebuilds == 3
    assert_same_frames(after, run(eager, inputs))


def test_generate_no_longer_refuses_tensorrt_with_a_controlnet(tiny_components_factory, tmp_path, capsys, monkeypatch):
    """`generate --acceleration tensorrt --controlnet ...` runs (here without TensorRT: the torch
    path, said once) instead of being refused."""
    from PIL import Image

    from streamstudio.app.cli import main

    monkeypatch.setattr(shared, "_said", set())  # said once per process: an earlier test may have said it

    comps = tiny_components_factory()
    tiny_controlnet(comps.unet).save_pretrained(tmp_path / "net")
    (tmp_path / "in").mkdir()
    Image.fromarray(frames(1)[0]).save(tmp_path / "in" / "0.png")
    with pytest.warns(RuntimeWarning):
        code = main(["generate", "--model", "tiny", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                     "--width", str(SIZE), "--height", str(SIZE), "--controlnet", str(tmp_path / "net"),
                     "--acceleration", "tensorrt"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert len(list((tmp_path / "out").glob("*.png"))) == 1
    assert "do not take ControlNet" not in out.err + out.out


def test_engine_net_keeps_the_image_shapes_it_is_fed(with_controlnets):
    """Sanity of the stand-in: the spec's inputs are what the plan's profile names."""
    spec = image_specs(with_controlnets, ("unet",))[0]
    assert set(profile_for(spec, PLAN.shapes("unet"))) == set(spec.input_names)
    assert dataclasses.is_dataclass(PLAN)


def _controlnet_and_ip_adapter(tiny_components_factory, tmp_path):
    from streamstudio.models.image.ip_adapter import IPAdapter

    comps = tiny_components_factory()
    comps.controlnets = [tiny_controlnet(comps.unet, 0)]
    comps.ip_adapter = IPAdapter(comps, f"{write_tiny_ip_adapter(comps.unet, tmp_path / 'ip')}:1.0")
    return comps


def _eager_at(comps, feeds, scale):
    """The eager seam's call on the spec's inputs, the adapter's processors at `scale`."""
    saved = comps.ip_adapter.scale
    comps.ip_adapter.set_scale(scale)
    try:
        cond = {k: v for k, v in feeds.items() if k not in ("sample", "timestep", IP_SCALE)}
        with torch.no_grad():
            return comps.net.eps(feeds["sample"], feeds["timestep"],
                                 ImageCond(text=cond["text"], image_embeds=cond["image_embeds"],
                                           control=(cond["control_0"],), control_scale=cond["control_scale"]))
    finally:
        comps.ip_adapter.set_scale(saved)


def test_the_ip_adapter_scale_input_drives_the_graph(tiny_components_factory, tmp_path):
    """The spec's module scales the adapter's attention by its ip_scale input, row by row
    (not by the processors' float): rows at 0 and 0.6 equal the eager call at those scales, and
    the processors' own scale is put back after the call."""
    comps = _controlnet_and_ip_adapter(tiny_components_factory, tmp_path)
    spec = image_specs(comps, ("unet",))[0]
    feeds = spec.make_inputs(2, SIZE, SIZE, torch.device("cpu"), torch.float32, torch.Generator().manual_seed(3))
    feeds[IP_SCALE] = torch.tensor([[0.0], [0.6]])
    with torch.no_grad():
        got = spec.module(*feeds.values())
    assert comps.ip_adapter.scale == 1.0 and acceleration_ip_scale(comps) == 1.0
    torch.testing.assert_close(got[:1], _eager_at(comps, feeds, 0.0)[:1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1:], _eager_at(comps, feeds, 0.6)[1:], rtol=1e-4, atol=1e-5)
    assert (got[1:] - _eager_at(comps, feeds, 0.0)[1:]).abs().max() > 1e-3


def acceleration_ip_scale(comps):
    from streamstudio.models.image.export_specs import ip_scale

    return ip_scale(comps.unet)


def test_unet_export_with_a_controlnet_and_an_ip_adapter_matches_onnxruntime(tiny_components_factory, tmp_path):
    """The UNet engine's ONNX graph with a ControlNet and an IP-Adapter: its inputs are the spec's
    (control image at pixel size, control scale, image embedding, IP scale), onnxruntime equals
    torch at another batch and size, and the IP scale is an input of the graph (onnxruntime at scale
    0 equals the eager call at 0 though the adapter was exported at 1). About 4 s."""
    pytest.importorskip("onnxruntime")
    import onnx
    import onnxruntime as ort

    from streamstudio.kernels.tensorrt.export import check_onnx, export_onnx

    comps = _controlnet_and_ip_adapter(tiny_components_factory, tmp_path)
    spec = image_specs(comps, ("unet",))[0]
    path = export_onnx(spec, tmp_path / "unet" / "model.onnx", batch=2, height=64, width=64)
    assert [i.name for i in onnx.load(str(path)).graph.input] == spec.input_names
    result = check_onnx(spec, path, batch=1, height=96, width=128)
    assert result.rel_error < 1e-3
    assert result.shapes["control_0"] == (1, 3, 96, 128) and result.shapes["image_embeds"] == (1, 1, 32)

    feeds = spec.make_inputs(2, 64, 64, torch.device("cpu"), torch.float32, torch.Generator().manual_seed(4))
    feeds[IP_SCALE] = torch.zeros(2, 1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in feeds.items()})[0]
    want = _eager_at(comps, feeds, 0.0).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-3


def test_build_engines_builds_the_unet_engine_the_app_looks_up_with_addons(tiny_components_factory, monkeypatch,
                                                                           tmp_path):
    """`build-engines --controlnet ... --lora ...` builds the UNet engine of the same cache key as the
    app's `--acceleration tensorrt` with those add-ons (the ControlNet inside, the LoRA fused)."""
    from addon_models import make_lora

    from streamstudio.app.cli import main
    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.models.image.lora import LoraSet

    comps = tiny_components_factory()
    tiny_controlnet(comps.unet).save_pretrained(tmp_path / "net")
    make_lora(comps, tmp_path / "lora")
    asked = {}
    monkeypatch.setattr(trt_kernels, "tensorrt_available", lambda: True)
    monkeypatch.setattr(shared, "build_engines", lambda specs, root, shapes=None, precision="fp16", plan=None: [
        asked.setdefault(s.name, engine_key(s, shared.engine_shapes(s.name, plan, shapes), precision)) and
        tmp_path / "e" for s in specs])
    assert main(["build-engines", "--model", "tiny", "--parts", "unet", "--controlnet", str(tmp_path / "net"),
                 "--lora", str(tmp_path / "lora"), "--cfg", "self", "--steps", "2", "--max-batch-rows", "0",
                 "--width", str(SIZE), "--height", str(SIZE), "--device", "cpu", "--engine-dir", str(tmp_path)]) == 0
    assert "control_0" in asked["unet"].profile_dict()

    from streamstudio.models.image.controlnet import load_controlnet

    comps.controlnets = [load_controlnet(str(tmp_path / "net"), torch.device("cpu"), torch.float32)]
    comps.loras = LoraSet(comps)
    comps.loras.add(str(tmp_path / "lora"))
    trt = FakeTensorRT(monkeypatch, tmp_path)
    acceleration.apply_acceleration(comps, "tensorrt", engine_dir=tmp_path, plan=PLAN, parts=("unet",))
    spec = trt.specs[next(iter(trt.specs))]
    assert engine_key(spec, PLAN.shapes("unet")) == asked["unet"]


def test_ensure_engine_exports_the_addons_graph_and_profiles_every_input(with_controlnets, monkeypatch, tmp_path):
    """The real ensure_engine up to TensorRT's builder (stood in for): the ONNX file it exports for a
    UNet with two ControlNets has exactly the spec's inputs, the profile handed to the builder names
    each of them (control images at the plan's pixel size), the engine is found in the cache the
    second time, and the plain UNet (no ControlNets) is another engine."""
    from types import SimpleNamespace

    import onnx

    from streamstudio.kernels import tensorrt as trt_kernels
    from streamstudio.kernels.tensorrt import build
    from streamstudio.kernels.tensorrt.cache import EngineCache

    monkeypatch.setattr(trt_kernels, "_trt", SimpleNamespace(__version__="10.fake"))
    monkeypatch.setattr(trt_kernels, "_checked", True)
    built = []

    def build_engine(onnx_path, profile, fp16=True, workspace_gb=None):
        built.append(([i.name for i in onnx.load(str(onnx_path), load_external_data=False).graph.input], profile))
        return b"engine"

    monkeypatch.setattr(build, "build_engine", build_engine)
    cache, shapes = EngineCache(tmp_path / "engines"), PLAN.shapes("unet")
    spec = image_specs(with_controlnets, ("unet",))[0]
    path = build.ensure_engine(spec, cache, shapes)
    inputs, profile = built[0]
    assert inputs == spec.input_names and set(profile) == set(inputs)
    lo, _, hi = PLAN.batch_range("unet")
    assert profile["control_1"] == ((lo, 3, SIZE, SIZE), (PLAN.opt["unet"], 3, SIZE, SIZE), (hi, 3, SIZE, SIZE))
    assert build.ensure_engine(image_specs(with_controlnets, ("unet",))[0], cache, shapes) == path and len(built) == 1
    plain = dataclasses.replace(with_controlnets, controlnets=[], control_defaults=[])
    assert build.ensure_engine(image_specs(plain, ("unet",))[0], cache, shapes) != path and len(built) == 2
    assert "control_0" not in built[1][1]


def test_controlnet_streams_batched_across_users_on_the_engine(with_controlnets, monkeypatch, tmp_path):
    """serve's path: two ControlNet streams at different conditioning scales and CFG types share
    UNet engine calls through the batching executor (rows padded to the plan's buckets, every
    bucket captured at start-up with its control images); each gets the frames it gets alone,
    eagerly."""
    from helpers import run_in_lockstep

    from addon_models import make_pipe, stream_frames

    from streamstudio.app.streams.image import stream_plan
    from streamstudio.models.image.batching import BatchExecutor, BatchingConfig, batched_components

    comps, nets = with_controlnets, with_controlnets.controlnets
    specs = [([0.7, 0.4], "self", stream_frames(3, seed=5)), ([0.1, 1.2], "initialize", stream_frames(3, seed=6))]
    alone = []
    for scales, cfg, inputs in specs:
        pipe = make_pipe(comps, nets, scales, steps=2, cfg_type=cfg, guidance_scale=1.3)
        alone.append([pipe(f) for f in inputs])
    batching = BatchingConfig(max_wait_ms=500)
    plan = stream_plan(make_pipe(comps, nets, steps=2).config, batching)
    trt = FakeTensorRT(monkeypatch, tmp_path)
    fast = acceleration.apply_acceleration(comps, "tensorrt", engine_dir=tmp_path, plan=plan)
    unet = fast.net.unet_engine
    assert [s["control_0"] for s in unet.captured] == [(b, 3, SIZE, SIZE) for b in plan.sizes["unet"]]
    executor = BatchExecutor(batching)
    try:
        shared = batched_components(fast, executor)
        pipes = [make_pipe(shared, nets, scales, steps=2, cfg_type=cfg, guidance_scale=1.3) for scales, cfg, _ in specs]
        got = run_in_lockstep(executor, pipes, [spec[2] for spec in specs])
        assert executor.stats.batched_calls > 0, "no call served both streams"
        assert {s["sample"][0] for s in unet.shapes} <= set(plan.sizes["unet"])  # only captured batch sizes
        for want, have in zip(alone, got):
            assert_same_frames(have, want)
    finally:
        executor.close()
    assert len(trt.unet_builds()) == 1


def test_sdxl_stream_with_a_controlnet_and_an_ip_adapter_on_the_engine_equals_eager(monkeypatch, tmp_path):
    """SDXL: the engine takes the pooled text and time ids beside the ControlNet's image and scale
    and the IP-Adapter's embedding and per-row scale; the frames equal the eager stream's."""
    from streamstudio.models.image.ip_adapter import IPAdapter
    from streamstudio.models.image.loading import load_components

    xl = load_components("tiny-sdxl")
    xl.controlnets = [tiny_controlnet(xl.unet, 3)]
    xl.control_defaults = [("softedge", 0.9)]
    xl.ip_adapter = IPAdapter(xl, f"{write_tiny_ip_adapter(xl.unet, tmp_path / 'ip')}:0.7")
    want_inputs = ["sample", "timestep", "text", "text_embeds", "time_ids", "image_embeds", "control_0",
                   "control_scale", IP_SCALE]
    FakeTensorRT(monkeypatch, tmp_path)
    fast = acceleration.apply_acceleration(xl, "tensorrt", engine_dir=tmp_path, plan=PLAN)
    assert fast.net.unet_engine.input_names == want_inputs
    inputs = frames(2, seed=11)
    streams = [StreamDiffusion(c, CONFIG, prompt="a lighthouse") for c in (xl, fast)]
    for stream in streams:
        stream.addons.set_reference((reference_image(4).permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    eager, engine = (run(s, inputs) for s in streams)
    assert_same_frames(engine, eager)
    assert fast.net.unet_engine.calls > 0


@pytest.mark.slow
def test_build_engines_without_tensorrt_exports_and_checks_the_addons_unet(tiny_components_factory, tmp_path, capsys):
    """Without TensorRT, `build-engines --controlnet ... --ip-adapter ...` exports the UNet with both
    inside (their inputs in the graph) and checks it against onnxruntime (about 7 s)."""
    import onnx

    from streamstudio.app.cli import main

    comps = tiny_components_factory()
    tiny_controlnet(comps.unet).save_pretrained(tmp_path / "net")
    adapter = write_tiny_ip_adapter(comps.unet, tmp_path / "ip")
    code = main(["build-engines", "--model", "tiny", "--parts", "unet", "--controlnet", str(tmp_path / "net"),
                 "--ip-adapter", str(adapter), "--cfg", "self", "--steps", "2", "--max-batch-rows", "0",
                 "--width", str(SIZE), "--height", str(SIZE), "--device", "cpu", "--onnx-dir", str(tmp_path / "onnx")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ControlNet: " in out and "IP-Adapter: " in out
    graph = onnx.load(str(tmp_path / "onnx" / "unet" / "model.onnx"), load_external_data=False).graph
    assert [i.name for i in graph.input] == ["sample", "timestep", "text", "image_embeds", "control_0",
                                             "control_scale", IP_SCALE]
