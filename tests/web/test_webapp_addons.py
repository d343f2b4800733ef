"""The Live tab's controls of the model's add-ons (app/web/ui.py): a conditioning-scale slider per
ControlNet and the IP-Adapter's scale (each session's own, through the Live tab's settings path),
the IP-Adapter's reference picture (an upload, or the camera's current frame: the session's own),
a scale slider per LoRA (server-wide: fused weights) and the /studio/lora endpoint; none of them
for a model without add-ons. Tiny ControlNets, a tiny IP-Adapter and a random LoRA as
tests/image/test_controlnet.py, tests/image/test_ip_adapter.py and tests/image/test_lora.py make them."""

from __future__ import annotations

import dataclasses
import time

import gradio as gr
import numpy as np
import pytest
import torch

from streamstudio.models.image.batching import BatchingConfig
from streamstudio.app.web.sessions import ServerModel, SessionManager
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

SIZE = 32


@pytest.fixture(scope="module")
def addon_model(tmp_path_factory):
    from addon_models import tiny_controlnet
    from addon_models import write_tiny_ip_adapter

    from streamstudio.models.image.controlnet import load_controlnet
    from streamstudio.models.image.ip_adapter import IPAdapter
    from streamstudio.models.image.loading import load_components

    torch.set_num_threads(1)
    comps = load_components("tiny", device="cpu", dtype=torch.float32)
    folder = tmp_path_factory.mktemp("cn") / "canny_net"
    tiny_controlnet(comps.unet, 0).save_pretrained(folder)
    nets = [load_controlnet(str(folder)), tiny_controlnet(comps.unet, 1)]  # one loaded by path: its id is the path
    ip = IPAdapter(comps, f"{write_tiny_ip_adapter(comps.unet, tmp_path_factory.mktemp('ip') / 'ip')}:0.5")
    comps = dataclasses.replace(comps, controlnets=nets, control_defaults=[("canny", 1.0), ("none", 0.5)],
                                ip_adapter=ip)
    from streamstudio.models.image.lora import LoraSet, save_random_lora

    path = save_random_lora(comps, tmp_path_factory.mktemp("lora"))[0]
    comps.loras = LoraSet(comps)
    comps.loras.add(f"{path}:0.8")
    model = ServerModel(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2, strength=0.7), prompt="a fox",
                        batching=BatchingConfig(max_wait_ms=100))
    yield model
    model.close()


@pytest.fixture(scope="module")
def plain_model():
    from streamstudio.models.image.loading import load_components

    comps = load_components("tiny", device="cpu", dtype=torch.float32)
    model = ServerModel(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2), prompt="a fox")
    yield model
    model.close()


def frame(value: int = 0) -> np.ndarray:
    img = np.zeros((SIZE, SIZE, 3), np.uint8)
    img[:, : SIZE // 2] = (value, 255 - value, 60)
    img[SIZE // 2:, :, 2] = 200
    return img


def wait_for(predicate, session, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert session.error is None, session.error
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


def components(demo) -> dict:
    """{elem_id: component config} of a built app."""
    return {c["props"].get("elem_id"): c for c in demo.config["components"] if c["props"].get("elem_id")}


def test_the_addon_controls_appear_only_with_such_a_model(addon_model, plain_model):
    from streamstudio.app.web.ui import build_ui

    managers = [SessionManager(addon_model), SessionManager(plain_model)]
    try:
        with_addons, plain = (build_ui(m, file_ttl=60) for m in managers)
    finally:
        for m in managers:
            m.shutdown()
    found = components(with_addons)
    first, second = found["live-control-scale-0"]["props"], found["live-control-scale-1"]["props"]
    assert "ControlNet 1" in first["label"] and "(canny)" in first["label"] and first["value"] == 1.0
    assert "ControlNet 2" in second["label"] and "(none)" in second["label"] and second["value"] == 0.5
    assert first["label"].startswith(f"ControlNet 1: {addon_model.comps.controlnets[0].config._name_or_path} (canny)")
    assert "canny_net" in first["label"] and "ControlNetModel" in second["label"]
    assert found["live-ip-scale"]["props"]["value"] == 0.5 and "your stream" in found["live-ip-scale"]["props"]["label"]
    assert {"live-ip-reference", "live-ip-grab", "live-ip-status"} <= set(found)
    lora = found["live-lora-scale-0"]["props"]
    assert lora["value"] == 0.8 and "all streams" in lora["label"]
    # the ControlNet and IP-Adapter sliders are inputs of the Live tab's stream (the settings path of
    # the other controls: each session's own); the LoRA slider is not (it is the server's)
    ids = {found[k]["id"] for k in ("live-control-scale-0", "live-control-scale-1", "live-ip-scale")}
    assert any(ids <= set(d["inputs"]) and found["live-prompt"]["id"] in d["inputs"]
               for d in with_addons.config["dependencies"])
    assert not any(found["live-lora-scale-0"]["id"] in d["inputs"] and found["live-prompt"]["id"] in d["inputs"]
                   for d in with_addons.config["dependencies"])
    assert not {"live-control-scale-0", "live-ip-scale", "live-ip-reference", "live-ip-grab",
                "live-lora-scale-0"} & set(components(plain))
    assert "live-prompt" in components(plain)


def live_keys_of(model) -> tuple[str, ...]:
    """The keys the Live tab hands its stream handler, as `_live_tab` makes them."""
    from streamstudio.app.web.ui import addon_controls
    from streamstudio.app.settings import live_controls

    with gr.Blocks():
        controls = live_controls(model.config) | addon_controls(model)
    return tuple(controls)


def test_control_scale_sliders_reach_the_sessions_pipeline(addon_model):
    """The sliders' values, handed to the WebRTC handler with the other Live controls, become the
    session's control_scales; another session keeps its own."""
    from streamstudio.app.web.ui import fallback_step
    from streamstudio.app.web.webrtc import LiveHandler

    keys = live_keys_of(addon_model)
    assert keys[-3:] == ("control_scales.0", "control_scales.1", "ip_adapter_scale")
    manager = SessionManager(addon_model, max_streams=2)
    try:
        handler = LiveHandler(manager, keys, webrtc_id=lambda: "a")
        values = ["a fox", "", 0.7, 1.2, 1.0, "self", 0, False, 0.98, "off", "crop"]
        assert len(values) == len(keys) - 3
        handler(frame(10), *values, 0.25, 0.0, 0.5)
        session = manager.get("a")
        scales = lambda s: [u.scale for u in s.processor.pipe.addons.control.units]  # noqa: E731
        wait_for(lambda: session.processor.pipe is not None and scales(session) == [0.25, 0.0], session)
        # the stats record a setting just after the pipeline took it (the runner's thread): wait for both
        wait_for(lambda: session.stats()["settings"].get("control_scales") == [0.25, 0.0], session)
        handler(frame(20), *values, 1.5, 0.75, 1.25)  # moved: applied before a later frame
        wait_for(lambda: scales(session) == [1.5, 0.75], session)
        wait_for(lambda: session.processor.pipe.addons.ip_adapter_scale == 1.25, session)
        # the fallback webcam path takes the same controls; that session has its own scales
        fallback_step(manager, "fb", frame(30), (*values, 0.5, 2.0, 0.0), keys)
        other = manager.get("fb")
        wait_for(lambda: other.processor.pipe is not None and scales(other) == [0.5, 2.0], other)
        wait_for(lambda: other.processor.pipe.addons.ip_adapter_scale == 0.0, other)
        assert scales(session) == [1.5, 0.75] and session.processor.pipe.addons.ip_adapter_scale == 1.25
        cond = session.processor.pipe.prompts.cond(False)
        assert cond.control_scale.tolist() == [[1.5, 0.75]]  # what its UNet calls take
        assert cond.ip_scale.tolist() == [[1.25]]
        assert addon_model.comps.ip_adapter.scale == 0.5  # the model's default: untouched
        assert session.stats()["ip_adapter"]["scale"] == 1.25
    finally:
        manager.shutdown()


def test_ip_adapter_reference_upload_and_grabbed_frame_are_the_sessions_own(addon_model):
    """An upload and a grabbed camera frame set the reference of the user's own stream (its first
    running session of the ids the page knows), embedded once per picture; another session and
    the model's default keep theirs."""
    from streamstudio.app.web.ui import grab_reference, set_ip_adapter

    ip = addon_model.comps.ip_adapter
    default = ip.embeds
    manager = SessionManager(addon_model, max_streams=2)
    try:
        assert "start the Live tab's camera" in grab_reference(manager, ["nobody"])[1]
        assert "Start the Live tab's camera" in set_ip_adapter(manager, ["nobody"], reference=frame())
        mine, other = manager.open("cam"), manager.open("other")
        picture = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
        mine.submit(picture)
        other.submit(frame(5))
        wait_for(lambda: mine.processed >= 1, mine)
        wait_for(lambda: other.processed >= 1, other)
        pipe, other_pipe = mine.processor.pipe, other.processor.pipe
        embeds = lambda p: p.prompts.cond(False).image_embeds  # noqa: E731 - what its UNet calls take
        other_before = embeds(other_pipe)
        # an uploaded picture (RGBA too): its embedding once, in this session's calls only
        upload = np.dstack([np.full((24, 24, 3), (200, 30, 90), np.uint8), np.full((24, 24, 1), 255, np.uint8)])
        encodes = ip.encodes
        assert "your stream" in set_ip_adapter(manager, [None, "cam"], reference=upload)
        assert "your stream" in set_ip_adapter(manager, [None, "cam"], reference=upload.copy())
        assert ip.encodes == encodes + 1
        expected = ip.embed(torch.from_numpy(upload[..., :3]).permute(2, 0, 1).float() / 255)
        mine.submit(picture)
        wait_for(lambda: torch.equal(embeds(pipe), expected), mine)
        assert torch.equal(embeds(other_pipe), other_before) and ip.embeds is default
        assert mine.stats()["ip_adapter"]["own_reference"] and not other.stats()["ip_adapter"]["own_reference"]
        # the camera's current frame
        image, text = grab_reference(manager, [None, "cam"])
        assert np.array_equal(image, picture) and "your stream" in text and ip.encodes == encodes + 2
        grabbed = ip.embed(torch.from_numpy(picture).permute(2, 0, 1).float() / 255)
        mine.submit(picture)
        wait_for(lambda: torch.equal(embeds(pipe), grabbed), mine)
        assert torch.equal(embeds(other_pipe), other_before)
        assert "is a number" in set_ip_adapter(manager, ["cam"], scale=float("nan"))
    finally:
        manager.shutdown()


def test_lora_scale_is_server_wide_between_frames(addon_model):
    """A LoRA's scale (fused into the shared weights) from the Live tab's slider or POST /studio/lora
    changes every stream, between frames: a change waits for the frames under way and no frame
    starts during it; the banner's listing follows; a wrong name or scale is refused."""
    import threading

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from streamstudio.app.web.security import GuardConfig, RequestGuard
    from streamstudio.app.web.ui import set_lora_scale
    from streamstudio.app.web.webrtc import mount_api

    loras = addon_model.comps.loras
    source = loras.listing()[0][0]
    manager = SessionManager(addon_model, max_streams=2)
    try:
        assert "× 0.5" in set_lora_scale(manager, source, 0.5) and loras.listing() == [(source, 0.5)]
        assert "no LoRA" in set_lora_scale(manager, "nope", 0.5)
        # no frame runs while the weights change: the change waits for a frame under way
        guard, order = addon_model.guard, []
        in_frame, release = threading.Event(), threading.Event()

        def a_frame():
            with guard.frame():
                order.append("frame starts")
                in_frame.set()
                release.wait(10)
                order.append("frame ends")

        def change():
            in_frame.wait(10)
            manager.set_lora_scales({source: 0.25})
            order.append("changed")

        threads = [threading.Thread(target=a_frame), threading.Thread(target=change)]
        for t in threads:
            t.start()
        in_frame.wait(10)
        time.sleep(0.2)
        assert order == ["frame starts"]  # the change is waiting
        release.set()
        for t in threads:
            t.join(10)
        assert order == ["frame starts", "frame ends", "changed"] and loras.listing() == [(source, 0.25)]
        # the JSON API, behind the request guard as every route
        app = FastAPI()
        mount_api(app, manager, stream=None)
        app.add_middleware(RequestGuard, config=GuardConfig(auth=("ann", "pw")))
        client = TestClient(app)
        assert client.post("/studio/lora", json={"scales": {source: 1.0}}).status_code == 401
        r = client.post("/studio/lora", json={"scales": {source: 1.0}}, auth=("ann", "pw"))
        assert r.status_code == 200 and r.json()["loras"] == [{"source": source, "scale": 1.0}]
        assert client.get("/studio/lora", auth=("ann", "pw")).json()["loras"][0]["scale"] == 1.0
        assert loras.listing() == [(source, 1.0)]
        r = client.post("/studio/lora", json={"scales": {source: "big"}}, auth=("ann", "pw"))
        assert r.status_code == 400 and "scale" in r.json()["error"]
        # a running session's frames go on over the changed weights
        session = manager.open("s")
        session.submit(frame(1))
        wait_for(lambda: session.processed >= 1, session)
        before = session.processed
        assert client.post("/studio/lora", json={"scales": {source: 0.0}}, auth=("ann", "pw")).status_code == 200
        session.submit(frame(2))
        wait_for(lambda: session.processed > before, session)
    finally:
        set_lora_scale(manager, source, 0.8)
        manager.shutdown()


def test_lora_scales_reach_every_replica(tiny_components_factory, tmp_path):
    """serve --gpus N: a server-wide LoRA scale is set on every replica's model (each has its own
    fused weights); the weights follow the scale; a wrong name changes nothing."""
    from streamstudio.app.web.replicas import LocalReplicas, ReplicaModel
    from streamstudio.models.image.lora import LoraSet, save_random_lora

    base = tiny_components_factory()
    path = save_random_lora(base, tmp_path / "lora")[0]
    models = []
    for _ in range(2):
        comps = tiny_components_factory()
        comps.loras = LoraSet(comps)
        comps.loras.add(f"{path}:1.0")
        models.append(ReplicaModel(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2),
                                   batching=BatchingConfig(max_wait_ms=5)))
    manager = SessionManager(placement=LocalReplicas(models, ["cpu", "cpu"], 1))
    def weights(model):  # the UNet's weights as used (a fused layer's merged weight under its plain name)
        return {k.replace(".base_layer", ""): v.clone() for k, v in model.comps.unet.state_dict().items()
                if ".lora_" not in k}
    try:
        assert manager.models() == models
        fused = weights(models[1])
        with pytest.raises(Exception, match="no LoRA 'nope'"):
            manager.set_lora_scales({"nope": 0.5})
        assert all(torch.equal(v, weights(models[1])[k]) for k, v in fused.items())
        listing = manager.set_lora_scales({str(path): 0.0})
        assert listing == [(str(path), 0.0)] and all(m.lora_listing() == listing for m in models)
        plain = base.unet.state_dict()
        assert set(fused) == set(plain) and any(not torch.equal(fused[k], v) for k, v in plain.items())
        for model in models:  # scale 0: every weight the base model's again
            now = weights(model)
            assert all(torch.equal(now[k], v) for k, v in plain.items())
    finally:
        manager.shutdown()


def test_two_sessions_with_their_own_ip_scales_and_references_batched_equal_their_solo_runs(addon_model):
    """Two web sessions on one server, each with its own IP-Adapter scale (the settings path) and
    reference (set_reference), stream in step: their UNet calls are joined (their stats say so),
    and each session's outputs equal a stream of its settings run alone on the unbatched model."""
    from dataclasses import replace

    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion

    ip = addon_model.comps.ip_adapter
    specs = {"p": (0.0, frame(40)), "q": (1.5, np.random.default_rng(3).integers(0, 256, (20, 30, 3), np.uint8))}
    inputs = [frame(v) for v in (0, 60, 120, 180)]
    manager = SessionManager(addon_model, max_streams=2)
    try:
        sessions = {}
        for sid, (scale, reference) in specs.items():
            manager.settings(sid, {"ip_adapter_scale": scale})
            sessions[sid] = manager.open(sid)
            sessions[sid].set_reference(reference)
        got = {sid: [] for sid in specs}
        for i, picture in enumerate(inputs):
            for s in sessions.values():
                s.submit(picture)
            for sid, s in sessions.items():
                wait_for(lambda: s.processed >= i + 1, s)
                got[sid].append(s.latest().copy())
        for sid, s in sessions.items():
            assert s.stats()["batching"]["shares_calls"], s.stats()["batching"]
            assert s.stats()["ip_adapter"] == {"scale": specs[sid][0], "own_reference": True}
    finally:
        manager.shutdown()
    for sid, (scale, reference) in specs.items():
        solo = StreamDiffusion(addon_model.comps, replace(addon_model.config, mode="img2img"),
                               prompt=addon_model.prompt)
        solo.addons.set_ip_adapter_scale(scale)
        solo.addons.set_reference_embeds(ip.embed(torch.from_numpy(reference).permute(2, 0, 1).float() / 255))
        for picture, out in zip(inputs, got[sid]):
            assert np.abs(solo(picture).astype(np.int16) - out.astype(np.int16)).max() <= 1, sid
    assert any(np.abs(a.astype(np.int16) - b.astype(np.int16)).max() > 2 for a, b in zip(got["p"], got["q"]))


@pytest.mark.parametrize("batching", [True, False])
def test_no_frame_starts_while_the_shared_weights_change(batching):
    """ModelGuard.exclusive (LoRA scale changes): a frame asked for during the change starts only
    after it, with cross-stream batching (frames are executor clients) and without (the lock)."""
    import threading

    from streamstudio.models.image.batching import BatchExecutor
    from streamstudio.app.web.model_guard import ModelGuard

    executor = BatchExecutor(BatchingConfig()) if batching else None
    guard, order = ModelGuard(executor), []
    changing, release = threading.Event(), threading.Event()

    def change():
        with guard.exclusive():
            changing.set()
            release.wait(10)
            order.append("change done")

    def a_frame():
        changing.wait(10)
        with guard.frame():
            order.append("frame")

    threads = [threading.Thread(target=change), threading.Thread(target=a_frame)]
    try:
        for t in threads:
            t.start()
        changing.wait(10)
        time.sleep(0.2)
        assert order == []  # the frame waits
        release.set()
        for t in threads:
            t.join(10)
        assert order == ["change done", "frame"]
    finally:
        release.set()
        if executor is not None:
            executor.close()
