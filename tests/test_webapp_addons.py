"""The Live tab's controls of the model's add-ons (app/ui.py): a conditioning-scale slider per
ControlNet (each session's own scales, through the Live tab's settings path), the IP-Adapter's
scale and reference picture (an upload, or the camera's current frame); none of them for a model
without add-ons. Tiny ControlNets and a tiny IP-Adapter as tests/test_controlnet.py and
tests/test_ip_adapter.py make them."""

from __future__ import annotations

import dataclasses
import time

import gradio as gr
import numpy as np
import pytest
import torch

from streamstudio.app.sessions import ServerModel, SessionManager
from streamstudio.pipelines.stream_diffusion import StreamDiffusionConfig

SIZE = 32


@pytest.fixture(scope="module")
def addon_model(tmp_path_factory):
    from test_controlnet import tiny_controlnet
    from test_ip_adapter import write_tiny_ip_adapter

    from streamstudio.models.controlnet import load_controlnet
    from streamstudio.models.ip_adapter import IPAdapter
    from streamstudio.models.loading import load_components

    torch.set_num_threads(1)
    comps = load_components("tiny", device="cpu", dtype=torch.float32)
    folder = tmp_path_factory.mktemp("cn") / "canny_net"
    tiny_controlnet(comps.unet, 0).save_pretrained(folder)
    nets = [load_controlnet(str(folder)), tiny_controlnet(comps.unet, 1)]  # one loaded by path: its id is the path
    ip = IPAdapter(comps, f"{write_tiny_ip_adapter(comps.unet, tmp_path_factory.mktemp('ip') / 'ip')}:0.5")
    comps = dataclasses.replace(comps, controlnets=nets, control_defaults=[("canny", 1.0), ("none", 0.5)],
                                ip_adapter=ip)
    model = ServerModel(comps, StreamDiffusionConfig(width=SIZE, height=SIZE, steps=2, strength=0.7), prompt="a fox")
    yield model
    model.close()


@pytest.fixture(scope="module")
def plain_model():
    from streamstudio.models.loading import load_components

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
    from streamstudio.app.ui import build_ui

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
    assert found["live-ip-scale"]["props"]["value"] == 0.5
    assert {"live-ip-reference", "live-ip-grab", "live-ip-status"} <= set(found)
    # the sliders are inputs of the Live tab's stream (the settings path of the other controls)
    ids = {found[k]["id"] for k in ("live-control-scale-0", "live-control-scale-1")}
    assert any(ids <= set(d["inputs"]) and found["live-prompt"]["id"] in d["inputs"]
               for d in with_addons.config["dependencies"])
    assert not {"live-control-scale-0", "live-ip-scale", "live-ip-reference", "live-ip-grab"} & set(components(plain))
    assert "live-prompt" in components(plain)


def live_keys_of(model) -> tuple[str, ...]:
    """The keys the Live tab hands its stream handler, as `_live_tab` makes them."""
    from streamstudio.app.ui import addon_controls
    from streamstudio.app.settings import live_controls

    with gr.Blocks():
        controls = live_controls(model.config) | addon_controls(model)
    return tuple(controls)


def test_control_scale_sliders_reach_the_sessions_pipeline(addon_model):
    """The sliders' values, handed to the WebRTC handler with the other Live controls, become the
    session's control_scales; another session keeps its own."""
    from streamstudio.app.ui import fallback_step
    from streamstudio.app.webrtc import LiveHandler

    keys = live_keys_of(addon_model)
    assert keys[-2:] == ("control_scales.0", "control_scales.1")
    manager = SessionManager(addon_model, max_streams=2)
    try:
        handler = LiveHandler(manager, keys, webrtc_id=lambda: "a")
        values = ["a fox", "", 0.7, 1.2, 1.0, "self", 0, False, 0.98, "off", "crop"]
        assert len(values) == len(keys) - 2
        handler(frame(10), *values, 0.25, 0.0)
        session = manager.get("a")
        scales = lambda s: [u.scale for u in s.processor.pipe.control.units]  # noqa: E731
        wait_for(lambda: session.processor.pipe is not None and scales(session) == [0.25, 0.0], session)
        assert session.stats()["settings"]["control_scales"] == [0.25, 0.0]
        handler(frame(20), *values, 1.5, 0.75)  # moved: applied before a later frame
        wait_for(lambda: scales(session) == [1.5, 0.75], session)
        # the fallback webcam path takes the same controls; that session has its own scales
        fallback_step(manager, "fb", frame(30), (*values, 0.5, 2.0), keys)
        other = manager.get("fb")
        wait_for(lambda: other.processor.pipe is not None and scales(other) == [0.5, 2.0], other)
        assert scales(session) == [1.5, 0.75]
        cond = session.processor.pipe._stream_cond(session.processor.pipe._text, False)
        assert cond.control_scale.tolist() == [[1.5, 0.75]]  # what its UNet calls take
    finally:
        manager.shutdown()


def test_ip_adapter_scale_upload_and_grabbed_frame_reach_the_pipeline(addon_model):
    from streamstudio.app.ui import grab_reference, set_ip_adapter

    ip = addon_model.comps.ip_adapter
    manager = SessionManager(addon_model, max_streams=2)
    try:
        assert "start the Live tab's camera" in grab_reference(manager, ["nobody"])[1]
        session = manager.open("cam")
        picture = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
        session.submit(picture)
        wait_for(lambda: session.processed >= 1, session)
        pipe = session.processor.pipe
        text = set_ip_adapter(manager, scale=0.8)
        assert "scale 0.8" in text and ip.scale == 0.8
        assert all(p.scale == [0.8] for p in addon_model.comps.unet.attn_processors.values() if hasattr(p, "to_k_ip"))
        # an uploaded picture (RGBA too): its embedding once, in the session's calls
        upload = np.dstack([np.full((24, 24, 3), (200, 30, 90), np.uint8), np.full((24, 24, 1), 255, np.uint8)])
        encodes = ip.encodes
        assert "reference set" in set_ip_adapter(manager, reference=upload)
        assert "reference set" in set_ip_adapter(manager, reference=upload.copy())
        assert ip.encodes == encodes + 1
        expected = ip.set_reference(torch.from_numpy(upload[..., :3]).permute(2, 0, 1).float() / 255)
        assert torch.equal(pipe._stream_cond(pipe._text, False).image_embeds, expected)
        # the camera's current frame
        image, text = grab_reference(manager, [None, "cam"])
        assert np.array_equal(image, picture) and "reference set" in text and ip.encodes == encodes + 2
        embeds = pipe._stream_cond(pipe._text, False).image_embeds
        assert not torch.equal(embeds, expected)
        assert torch.equal(embeds, ip.set_reference(torch.from_numpy(picture).permute(2, 0, 1).float() / 255))
        assert "must be a number" in set_ip_adapter(manager, scale=float("nan"))
    finally:
        set_ip_adapter(manager, scale=0.5)
        manager.shutdown()
