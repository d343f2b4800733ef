"""Web app units: settings checks, sessions over one shared tiny model, the fastrtc handler
(BGR at the edge, never blocking), busy limit, error isolation, freeing, serve options."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import frame, wait_output

from streamstudio.app.web.sessions import BusyError, ServerModel, SessionManager, parse_settings
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig


@pytest.fixture(scope="module")
def model():
    from streamstudio.models.image.loading import load_components

    torch.set_num_threads(1)
    comps = load_components("tiny", device="cpu", dtype=torch.float32)
    return ServerModel(comps, StreamDiffusionConfig(width=64, height=64, steps=2, strength=0.6), prompt="a cat")


@pytest.fixture
def manager(model):
    m = SessionManager(model, max_streams=2, idle_timeout=30.0)
    yield m
    m.shutdown()


# ---------------------------------------------------------------------- settings
def test_parse_settings_accepts_and_normalizes():
    out = parse_settings({"prompt": [["a cat", 2], ["a dog", 1]], "strength": 1, "seed": 5, "cfg_type": "full",
                          "similarity_filter": True, "similarity_threshold": 0.9})
    assert out["prompt"] == [("a cat", 2.0), ("a dog", 1.0)]
    assert out["strength"] == 1.0 and isinstance(out["strength"], float)


@pytest.mark.parametrize("bad, words", [
    ({"strength": 0}, "strength"), ({"strength": 1.5}, "strength"), ({"cfg_type": "x"}, "cfg_type"),
    ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"), ({"prompt": [["a", 1]] * 4}, "1 to 3"),
    ({"prompt": [["a", 0]]}, "weights"), ({"color": 1}, "unknown"), ({"similarity_filter": 1}, "type"),
    ({"guidance_scale": "high"}, "type"),
])
def test_parse_settings_rejects_with_a_message(bad, words):
    with pytest.raises(StreamStudioError, match=words):
        parse_settings(bad)


def test_fit_setting_pads_the_camera_frame_in_a_session(manager):
    assert parse_settings({"fit": "pad"}) == {"fit": "pad"}
    with pytest.raises(StreamStudioError, match="fit must be one of crop, pad"):
        parse_settings({"fit": "stretch"})
    session = manager.open("a")
    manager.settings("a", {"fit": "pad"})
    session.submit(frame())
    wait_output(session)
    assert session.fit == "pad" and session.stats()["settings"] == {"fit": "pad"}


# ---------------------------------------------------------------------- sessions
def test_session_processes_frames_at_the_model_size(manager):
    session = manager.open("a")
    session.submit(frame(h=64, w=64))
    out = wait_output(session)
    assert out.shape == (64, 64, 3) and out.dtype == np.uint8  # a square camera: the model's square
    stats = session.stats()
    assert stats["processed"] == 1 and stats["model"] == "tiny" and stats["latency_ms"] > 0


@pytest.mark.parametrize("h, w, size", [(480, 640, (64, 48)), (360, 640, (64, 40)), (640, 480, (48, 64)),
                                        (48, 80, (64, 40)), (100, 100, (64, 64))])
def test_a_session_takes_its_first_frames_aspect(manager, h, w, size):
    """The stream's size follows the camera: the configured longer side (64), the frame's aspect,
    multiples of 8 (4:3 -> 64x48, 16:9 -> 64x40, portrait 3:4 -> 48x64); square stays square."""
    session = manager.open("a")
    assert session.size == (64, 64)  # before any frame: the configured size
    session.submit(frame(h=h, w=w))
    out = wait_output(session)
    assert session.size == size and out.shape == (size[1], size[0], 3)
    assert (session.processor.pipe.config.width, session.processor.pipe.config.height) == size


def test_a_later_frame_of_another_aspect_is_fitted_to_the_stream(manager, monkeypatch):
    """The first frame decides the size (the outputs, a recording and WHEP viewers keep it); a
    later frame of another aspect is cropped (the default) or padded (fit "pad") to it, never
    stretched, and the stream is not rebuilt."""
    from streamstudio.app.web import sessions

    fitted = []
    real = sessions.fit_aspect
    monkeypatch.setattr(sessions, "fit_aspect", lambda *a: fitted.append(real(*a)) or fitted[-1])
    session = manager.open("a")
    session.submit(frame(h=48, w=64))  # 4:3: the stream is 64x48
    wait_output(session)
    pipe = session.processor.pipe
    square = np.full((60, 60, 3), 255, np.uint8)
    session.submit(square)  # crop: the middle 60x45 (top and bottom cut)
    out = wait_output(session, 2)
    assert fitted[-1].shape == (45, 60, 3) and fitted[-1].all()
    manager.settings("a", {"fit": "pad"})
    session.submit(square)  # pad: 80x60 with black bars left and right of the whole picture
    out = wait_output(session, 3)
    assert fitted[-1].shape == (60, 80, 3) and not fitted[-1][:, :10].any() and not fitted[-1][:, 70:].any()
    assert fitted[-1][:, 10:70].all()
    assert out.shape == (48, 64, 3) and session.size == (64, 48) and session.processor.pipe is pipe


def test_accelerated_networks_keep_the_configured_size(model):
    """Compiled and TensorRT networks take only the shapes they were built and warmed up for:
    their streams stay at the configured size whatever the camera (frames are fitted to it)."""
    from dataclasses import replace as dc_replace

    from streamstudio.models.image.image_net import ImageNet

    class FixedNet(ImageNet):
        fixed_shapes = True
        device = torch.device("cpu")

    assert model.stream_size(4 / 3) == (64, 48) and model.stream_size(None) == (64, 64)
    fixed = ServerModel(dc_replace(model.comps, network=FixedNet()), model.config)
    assert fixed.stream_size(4 / 3) == (64, 64) and fixed.stream_size(0.5) == (64, 64)


def test_a_web_sessions_frames_pass_through_its_runner(manager):
    """The session is a streaming.Runner over a push source: its frames and its stats are the
    runner's metrics."""
    session = manager.open("a")
    for i in range(3):
        session.submit(frame(40 * i))
        wait_output(session, i + 1)
    m = session.runner.metrics()
    assert m.live and (m.frames_in, m.frames_processed, m.frames_out) == (3, 3, 3)
    assert m.latency_ms["process"]["p50"] > 0 and m.recent_fps > 0
    stats = session.stats()
    assert (stats["frames_in"], stats["processed"], stats["dropped"]) == (3, 3, 0)
    assert stats["fps"] == round(m.recent_fps, 2) and stats["latency_ms"] == round(m.recent_latency_ms, 1)
    assert session.processor.stats is session.processor.pipe.stats  # the filter's skips, read by the metrics


def test_a_sink_attached_to_a_running_session_gets_its_outputs_until_detached(manager):
    from streamstudio.streaming.sinks import NullSink

    session = manager.open("a")
    session.submit(frame())
    wait_output(session)
    sink = NullSink("collect", 64, 64, 30)
    attachment = session.attach(sink)
    for i in (2, 3):
        session.submit(frame(50 * i))
        out = wait_output(session, i)
        deadline = time.monotonic() + 10
        while sink.status.frames_written < i - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sink.status.frames_written == i - 1 and np.array_equal(sink.last, out)
    session.detach(attachment)
    assert sink.status.closed and not attachment.running and session.runner.attachments == []
    session.submit(frame(200))
    wait_output(session, 4)
    time.sleep(0.1)
    assert sink.status.frames_written == 2 and attachment.frames == 2


def test_settings_take_effect_on_the_next_frame(manager):
    session = manager.open("a")
    session.submit(frame())
    first = wait_output(session).copy()
    session.submit(frame())
    same = wait_output(session, 2).copy()
    manager.settings("a", {"seed": 123, "prompt": "a dog"})
    session.submit(frame())
    changed = wait_output(session, 3).astype(int)
    # constant input, constant settings: the same output, up to float rounding (the first frame
    # fills the Stream Batch buffer, so it takes other batch rows: a pixel may round one level off)
    assert np.abs(first.astype(int) - same).max() <= 1 and (first != same).mean() < 0.001
    assert (same != changed).any(axis=2).mean() > 0.01  # the new seed and prompt show
    assert session.stats()["settings"] == {"prompt": "a dog", "seed": 123}


def test_a_rejected_setting_keeps_the_stream_running(manager):
    session = manager.open("a")
    session.request({"steps": 0})  # past the API check: the pipeline refuses it
    session.submit(frame())
    assert wait_output(session) is not None
    assert "not applied" in session.notice and session.error is None


def test_busy_beyond_max_streams_and_free_again(manager):
    manager.open("a")
    manager.open("b")
    with pytest.raises(BusyError, match="busy.*--max-streams"):
        manager.open("c")
    assert manager.close("a")
    assert manager.open("c") is not None


def test_the_other_tabs_streams_count_against_max_streams(manager):
    """A Video-tab stream takes one of --max-streams as a Live-tab session does (it was outside
    the manager, under a concurrency limit of its own): the two share the server's slots."""
    from streamstudio.app.web import video_tab

    manager.open("live-1")
    video = video_tab.VideoSession(slots=manager)
    gen = video_tab.generate(video, "a blue square moving up", max_frames=2)
    next(gen)  # the Video tab's text-to-video stream: the second of two slots
    assert len(manager) == 2 and not manager.has_capacity()
    with pytest.raises(BusyError, match="busy.*--max-streams"):
        manager.open("live-2")
    with pytest.raises(BusyError):  # the page's webcam stream would be a third
        video_tab.webcam_frame(video, np.zeros((32, 32, 3), np.uint8), "", {"strength": 0.6})
    assert video.v2v is None
    list(gen)  # the stream ends: its slot is free
    assert len(manager) == 1
    manager.open("live-2")
    with pytest.raises(BusyError):
        next(video_tab.generate(video, "a red circle moving left", max_frames=1))
    assert manager.close("live-1")
    frames = list(video_tab.generate(video, "a red circle moving left", max_frames=1))
    assert len(frames) == 1 and len(manager) == 1  # made, and freed again


def test_an_error_in_one_session_leaves_the_others_alone(manager, monkeypatch, caplog):
    good, bad = manager.open("good"), manager.open("bad")

    def boom(frame):
        raise RuntimeError("kaput")

    monkeypatch.setattr(bad.processor, "_step", boom)
    bad.submit(frame())
    good.submit(frame())
    wait_output(good)
    deadline = time.monotonic() + 10
    while bad.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "kaput" in bad.error and bad.closed
    bug = [r for r in caplog.records if "stream bad stopped" in r.getMessage()]
    assert len(bug) == 1 and bug[0].exc_info is not None  # a bug: logged once, with its traceback
    good.submit(frame(90))
    wait_output(good, 2)
    assert good.error is None
    assert manager.open("bad") is bad  # its error stays visible (no restart loop) ...
    bad.last_seen -= 11
    manager.reap()
    assert manager.open("bad") is not bad  # ... until the reaper frees it; then a fresh stream


def test_close_and_idle_free_the_session(model):
    manager = SessionManager(model, max_streams=3, idle_timeout=0.3)
    try:
        session = manager.open("x")
        session.submit(frame())
        wait_output(session)
        time.sleep(0.5)
        assert manager.reap() == 1 and manager.get("x") is None
        assert not session.runner.running
    finally:
        manager.shutdown()


def test_presets_apply_when_the_stream_connects(manager):
    manager.settings("later", {"prompt": "a red house"})
    session = manager.open("later")
    session.submit(frame())
    wait_output(session)
    assert session.stats()["settings"]["prompt"] == "a red house"


def test_txt2img_session(manager):
    session = manager.open("t", mode="txt2img")
    manager.settings("t", {"prompt": [("a cat", 0.5), ("a dog", 0.5)], "strength": 0.3})
    session.submit(None)
    first = wait_output(session).copy()
    for i in (2, 3):  # Stream Batch (N=2): the first N outputs show the first image
        session.submit(None)
        third = wait_output(session, i)
    assert first.shape == (64, 64, 3) and not np.array_equal(first, third)  # then a new image each call


def test_latency_probe_round_trip_and_stream_batch_alignment(model):
    from dataclasses import replace as dc_replace

    from streamstudio.streaming.probe import draw_probe, read_probe

    img = draw_probe(frame(), 677)
    assert read_probe(img) == 677 and read_probe(frame()) is None
    manager = SessionManager(dc_replace(model, latency_probe=True), max_streams=1)
    try:
        session = manager.open("p")
        seen = []
        for i in range(4):  # N = 2: outputs carry the inputs 0, 0, 1, 2
            session.submit(draw_probe(frame(), i))
            seen.append(read_probe(wait_output(session, i + 1)))
        assert seen == [0, 0, 1, 2]
    finally:
        manager.shutdown()


# ---------------------------------------------------------------------- the fastrtc handler
def test_handler_converts_bgr_and_returns_at_once(manager):
    from streamstudio.app.web.ui import LIVE_KEYS
    from streamstudio.app.web.webrtc import LiveHandler

    handler = LiveHandler(manager, LIVE_KEYS, webrtc_id=lambda: "h")
    bgr = frame(30)
    values = ("a cat", "", 0.6, 1.2, 1.0, "self", 7, False, 0.98)
    t0 = time.perf_counter()
    first = handler(bgr, *values)
    assert time.perf_counter() - t0 < 0.2  # never waits for inference
    assert first.shape == (64, 64, 3) and not first.any()  # the waiting frame
    session = manager.get("h")
    out = wait_output(session)
    assert np.array_equal(handler(bgr, *values), out[:, :, ::-1])  # RGB -> BGR on the way out
    assert session.stats()["settings"]["seed"] == 7


def test_live_tab_fit_control_reaches_the_session(manager, monkeypatch):
    """The Live tab's last control is the crop / pad choice: with "pad" a frame of another aspect
    than the stream's reaches the pipeline whole, with black bars; the output keeps the stream's
    size (the first frame's aspect)."""
    from streamstudio.app.web import sessions
    from streamstudio.app.web.ui import LIVE_KEYS
    from streamstudio.app.web.webrtc import LiveHandler

    fitted = []
    real = sessions.fit_aspect
    monkeypatch.setattr(sessions, "fit_aspect", lambda *a: fitted.append(real(*a)) or fitted[-1])
    assert LIVE_KEYS[-1] == "fit"
    handler = LiveHandler(manager, LIVE_KEYS, webrtc_id=lambda: "fit")
    values = ("a cat", "", 0.6, 1.2, 1.0, "self", 7, False, 0.98, "off", "pad")
    handler(frame(30, h=64, w=64), *values)  # a square camera: a 64x64 stream
    session = manager.get("fit")
    wait_output(session)
    handler(frame(30), *values)  # then an 80x48 frame: padded to 80x80
    out = wait_output(session, 2)
    assert session.fit == "pad" and out.shape == (64, 64, 3)
    assert fitted[-1].shape == (80, 80, 3) and not fitted[-1][:16].any() and not fitted[-1][64:].any()


def test_handler_hands_the_session_rgb(manager, monkeypatch):
    from streamstudio.app.web.webrtc import LiveHandler

    handler = LiveHandler(manager, webrtc_id=lambda: "rgb")
    session = manager.open("rgb")
    got = []
    monkeypatch.setattr(session, "submit", got.append)
    bgr = frame(10)
    handler(bgr)
    assert np.array_equal(got[0], bgr[:, :, ::-1]) and got[0].flags["C_CONTIGUOUS"]


def test_handler_says_busy_and_closes_the_stream(manager):
    CloseStream = pytest.importorskip("fastrtc").CloseStream

    from streamstudio.app.web.webrtc import LiveHandler

    manager.open("a")
    manager.open("b")
    out = LiveHandler(manager, webrtc_id=lambda: "c")(frame())
    assert isinstance(out, CloseStream) and "busy" in out.msg


# ---------------------------------------------------------------------- UI helpers, serve options
def test_ui_helpers():
    from streamstudio.app.web.outputs import clean_name
    from streamstudio.app.web.ui import blend_spec, format_stats

    assert blend_spec(["a cat", "", "a dog"], [1.0, 0.5, 0.0]) == "a cat"
    assert blend_spec(["a cat", "a dog", ""], [1.0, 0.5, 1.0]) == [("a cat", 1.0), ("a dog", 0.5)]
    assert clean_name("../../etc/passwd", "x.mp4") == "passwd"
    assert clean_name("my clip!.mp4", "x") == "my_clip_.mp4"
    assert "Not streaming" in format_stats(None)


def test_model_banner_shows_the_demo_notice(manager):
    from streamstudio.app.web.ui import model_banner

    text = model_banner(manager)
    assert "`tiny`" in text and "Demo model" in text and "hf download" in text
    assert "noise-like" in text  # random weights: said plainly
    builtin = SimpleNamespace(model=SimpleNamespace(name="builtin", is_demo=True, size=(256, 256)), max_streams=2)
    text = model_banner(builtin)
    assert "small built-in model" in text and "noise-like" not in text and "hf download" in text


def test_rtc_config_from_env():
    from streamstudio.app.web.webrtc import rtc_config_from_env

    assert rtc_config_from_env({}) == {"iceServers": []}
    env = {"STREAMSTUDIO_TURN_URLS": "turn:t.example:3478, turns:t.example:5349",
           "STREAMSTUDIO_TURN_USERNAME": "u", "STREAMSTUDIO_TURN_CREDENTIAL": "p",
           "STREAMSTUDIO_STUN_URLS": "stun:s.example:3478"}
    assert rtc_config_from_env(env) == {"iceServers": [
        {"urls": ["stun:s.example:3478"]},
        {"urls": ["turn:t.example:3478", "turns:t.example:5349"], "username": "u", "credential": "p"}]}
    with pytest.raises(StreamStudioError, match="USERNAME"):
        rtc_config_from_env({"STREAMSTUDIO_TURN_URLS": "turn:x"})


def test_serve_options(monkeypatch, capsys):
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.serve import bind_host, parse_auth

    args = build_parser().parse_args(["serve", "--model", "tiny"])
    assert (args.port, args.max_streams, args.host) == (7860, 4, None)
    assert bind_host(args) == "127.0.0.1" and capsys.readouterr().err == ""
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0"])
    monkeypatch.delenv("STREAMSTUDIO_AUTH", raising=False)
    assert bind_host(args) == "0.0.0.0"
    assert "WITHOUT a login" in capsys.readouterr().err
    monkeypatch.setenv("STREAMSTUDIO_AUTH", "ann:secret")
    assert parse_auth(None) == ("ann", "secret")
    assert parse_auth("bob:pw:x") == ("bob", "pw:x")
    with pytest.raises(StreamStudioError, match="USER:PASS"):
        parse_auth("nopassword")


# ---------------------------------------------------------------------- live output
def test_live_output_records_the_stream_to_a_file(manager, tmp_path):
    av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")

    from streamstudio.app.web.outputs import Outputs
    from streamstudio.app.web.ui import NOT_YOURS, _output_status, _start_output

    session = manager.open("rec")
    session.submit(frame())  # the camera's first frame (80x48) makes it a 64x40 stream
    wait_output(session)
    outputs = Outputs(manager, tmp_path)
    assert "start the Live tab" in _start_output(manager, outputs, "browser", None, "file", "x.mp4", 10)
    assert manager.claim("rec", "browser")  # the page that streams owns the stream (its first inputs)
    assert not manager.claim("rec", "intruder") and manager.owner("rec") == "browser"
    # another page that knows the stream id (it was the WHEP URL once) records nothing
    assert _start_output(manager, outputs, "intruder", "rec", "file", "x.mp4", 10) == NOT_YOURS
    assert outputs.of() == [] and not (tmp_path / "x.mp4").exists()
    message = _start_output(manager, outputs, "browser", "rec", "file", "../../clip", 10)
    assert message.startswith("Started") and str(tmp_path / "clip.mp4") in message
    for i in range(1, 7):
        session.submit(frame(20 * i))
        wait_output(session, i + 1)
    [out] = outputs.of("rec", owner="browser")
    deadline = time.monotonic() + 10
    while out.attachment.frames < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "running" in _output_status(out)
    outputs.stop(out.oid)
    assert out.attachment.frames >= 3 and out.attachment.error is None and not out.attachment.running
    with av.open(str(tmp_path / "clip.mp4")) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == out.attachment.frames and decoded[0].shape == (40, 64, 3)  # the stream's size


def test_live_outputs_are_capped_per_stream_and_server_and_pushes_go_where_allowed(manager, tmp_path):
    """Start, called with made-up session hashes against one stream, once added an output (a
    thread and an encoder) per call, never pruned: 40 calls took the stream to 1.1 fps."""
    pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.serve_run import output_limits
    from streamstudio.app.web.outputs import OutputLimits, Outputs
    from streamstudio.app.web.ui import _start_output

    session = manager.open("rec")
    session.submit(frame())
    wait_output(session)
    outputs = Outputs(manager, tmp_path, OutputLimits(per_stream=2, total=3, allow_push=("live.example.com",)))
    # a logged-in operator may record any stream (a page, only its own), within the caps
    said = [_start_output(manager, outputs, f"forged-{i}", "rec", "file", f"r{i}.mp4", 10, True) for i in range(6)]
    assert [m.startswith("Started") for m in said] == [True, True, False, False, False, False], said
    assert "already has 2 output(s)" in said[2] and len(outputs.of()) == 2
    other = manager.open("rec2")
    other.submit(frame())
    wait_output(other)
    manager.claim("rec2", "b3")  # page b3 streams rec2; b4 and b5 below are operators
    assert _start_output(manager, outputs, "b3", "rec2", "file", "o.mp4", 10).startswith("Started")
    assert "already runs 3 outputs" in _start_output(manager, outputs, "b4", "rec2", "file", "p.mp4", 10, True)
    refused = _start_output(manager, outputs, "b3", "rec2", "rtmp", "rtmp://elsewhere.net/live/k", 10)
    assert "does not push to elsewhere.net" in refused and "--allow-push elsewhere.net" in refused
    manager.close("rec")  # its outputs go with it: the next Start prunes them
    assert _start_output(manager, outputs, "b5", "rec2", "file", "q.mp4", 10, True).startswith("Started")
    assert sorted(o.owner for o in outputs.of()) == ["b3", "b5"]  # b3's file output outlived its refused push
    outputs.close()

    parse = build_parser().parse_args
    assert output_limits(parse(["serve"])).allow_push is None  # loopback: any host
    assert output_limits(parse(["serve", "--host", "0.0.0.0"])).allow_push == ()  # reachable: none by default
    assert output_limits(parse(["serve", "--host", "0.0.0.0", "--allow-push", "A.example, b.example"])).allow_push \
        == ("a.example", "b.example")
    assert output_limits(parse(["serve", "--max-streams", "3"])).total == 6


def test_live_output_refuses_a_bad_rtmp_url(manager, tmp_path):
    from streamstudio.app.web.outputs import Outputs
    from streamstudio.app.web.ui import _start_output

    manager.open("rec")
    manager.claim("rec", "b")
    message = _start_output(manager, Outputs(manager, tmp_path), "b", "rec", "rtmp", "http://example.com/x", 30)
    assert "rtmp://host/live/streamkey" in message


def test_fallback_webcam_path(manager):
    from streamstudio.app.web.ui import fallback_step

    values = ("a cat", "", 0.6, 1.2, 1.0, "self", 4, False, 0.98)
    image, text = fallback_step(manager, "fb", frame(), values)
    assert image is None and "processed 0" in text  # returns at once, before any output
    wait_output(manager.get("fb"))
    image, text = fallback_step(manager, "fb", frame(), values)
    assert image.shape == (40, 64, 3) and "fps" in text  # the webcam's aspect (80x48 -> 64x40)
    assert manager.get("fb").stats()["settings"]["seed"] == 4
    bad = values[:2] + (7.0,) + values[3:]
    assert "strength must be in" in fallback_step(manager, "fb", frame(), bad)[1]
    manager.open("x")
    assert "busy" in fallback_step(manager, "fb2", frame(), values)[1]


def test_text_to_image_ticks(manager):
    from streamstudio.app.web.ui import t2i_step

    image, text, go_on = t2i_step(manager, "t2i", ("a cat", "a dog", ""), (1.0, 0.5, 0.5), "", 5)
    assert image is None and go_on
    session = manager.get("t2i")
    wait_output(session)
    image, _, _ = t2i_step(manager, "t2i", ("a cat", "a dog", ""), (1.0, 0.5, 0.5), "", 5)
    assert image.shape == (64, 64, 3) and session.mode == "txt2img"
    assert session.stats()["settings"]["prompt"] == [["a cat", 1.0], ["a dog", 0.5]]
    manager.open("other")
    assert t2i_step(manager, "t2i-2", ("a",), (1.0,), "", 0)[2] is False  # busy: stop ticking


def test_text_to_image_stop_holds_until_start(manager, monkeypatch):
    """Typing while it generates, then Stop: it stops, and neither a tick already on its way nor
    more typing brings it back; Start does."""
    from streamstudio.app.web import ui

    control = ui.T2IControl(manager)
    args = (("a cat", "", ""), (1.0, 0.5, 0.5), "", 1)
    assert control.start("b") and control.typed("b")
    assert control.tick("b", *args)[2] is True and manager.get("t2i-b") is not None

    real = ui.t2i_step

    def stopped_meanwhile(*a, **k):  # Stop pressed while this tick runs
        out = real(*a, **k)
        control.stop("b")
        return out

    monkeypatch.setattr(ui, "t2i_step", stopped_meanwhile)
    assert control.tick("b", *args) == (None, "Stopped.", False)
    assert manager.get("t2i-b") is None  # what the late tick had opened is gone too
    monkeypatch.setattr(ui, "t2i_step", real)
    assert control.typed("b") is False  # typing after Stop does not restart it
    assert control.tick("b", *args) == (None, "Stopped.", False) and manager.get("t2i-b") is None
    assert control.start("b") and control.tick("b", *args)[2] is True


def test_model_guard_frame_and_text_contexts():
    import threading

    from streamstudio.models.image.batching import BatchExecutor
    from streamstudio.app.web.model_guard import ModelGuard

    def enters(context) -> bool:  # can another thread enter `context` now?
        inside = threading.Event()

        def go():
            with context():
                inside.set()

        threading.Thread(target=go, daemon=True).start()
        return inside.wait(0.3)

    turns = ModelGuard()
    with turns.frame():  # no batching: a frame holds the lock, prompt changes and other frames wait
        assert not enters(turns.text) and not enters(turns.frame)
    executor = BatchExecutor()
    try:
        batched = ModelGuard(executor)
        with batched.frame():  # batching: the executor runs the networks; text and frames go on meanwhile
            assert enters(batched.text) and enters(batched.frame)
        with batched.text():
            assert not enters(batched.text) and enters(batched.frame)
    finally:
        executor.close()


def test_guarded_pipeline_takes_the_model_guard(model):
    import threading

    from streamstudio.app.web.model_guard import GuardedPipeline

    pipe = GuardedPipeline(model.build("img2img"), model.guard)
    held = []
    real_set_prompt = pipe._pipe.set_prompt
    pipe._pipe.set_prompt = lambda p: (held.append(model.guard._lock.locked()), real_set_prompt(p))
    pipe.set_prompt("a boat")
    assert held == [True] and not model.guard._lock.locked()
    assert pipe(frame()).shape == (64, 64, 3) and pipe.config.width == 64
    with model.guard.text():  # another stream is busy with the model (no batching): this frame waits for it
        t = threading.Thread(target=pipe, args=(frame(),))
        t.start()
        t.join(0.3)
        assert t.is_alive()
    t.join(30)


def test_handler_ends_a_failed_stream_with_its_error(manager, monkeypatch, caplog):
    CloseStream = pytest.importorskip("fastrtc").CloseStream

    from streamstudio.app.web.webrtc import LiveHandler

    session = manager.open("f")

    def out_of_memory(frame):
        raise StreamStudioError("the GPU ran out of memory; lower --width/--height")

    monkeypatch.setattr(session.processor, "_step", out_of_memory)
    session.submit(frame())
    deadline = time.monotonic() + 10
    while session.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    out = LiveHandler(manager, webrtc_id=lambda: "f")(frame())
    assert isinstance(out, CloseStream) and "ran out of memory" in out.msg
    said = [r for r in caplog.records if "stream f stopped" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None  # a user's error: one line, no traceback
