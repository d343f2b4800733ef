"""NDI in and out (streaming/ndi.py).

NDI announces and discovers sources by multicast, and tests may send packets only to 127.0.0.0/8
and ::1, so most of these tests run at the library's boundary: `FakeNdi` is ndi-python's module
as far as streaming/ndi.py uses it (senders, finders, receivers), handing frames from a sender to
the receivers connected to it and recording what every sender set on every frame. With it:
`render`/`serve --input ndi://` take no frame while the model loads, the sender's timecodes are the
stream's times and its rate the measured one, and `--help` names ndi://.

The real runtime's tests (names with `runtime`) run only in a network namespace of their own, with
nothing but loopback (`test_the_ndi_library_in_a_network_namespace` starts one with `unshare -rn`):
an NdiSink's frames come back through an NdiSource found by name (size, colour within the NDI
codec's loss, the sender's timecodes as the frames' pts, exactly); bad specs and missing sources
say what to do."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ndi_fake import FakeNdi, install_fake_ndi

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.ndi import TICKS, parse_ndi

IN_NAMESPACE = os.environ.get("STREAMSTUDIO_NDI_NETNS") == "1"
runtime = pytest.mark.skipif(not IN_NAMESPACE, reason="the NDI runtime announces by multicast: it runs in a "
                                                      "network namespace (test_the_ndi_library_in_a_network_namespace)")


def test_parse_ndi():
    assert parse_ndi("ndi://studio") == ("studio", [])
    assert parse_ndi("ndi://MYPC (OBS main)") == ("MYPC (OBS main)", [])
    assert parse_ndi("ndi://cam%201?ips=10.0.0.5,10.0.0.6") == ("cam 1", ["10.0.0.5", "10.0.0.6"])
    for bad in ("ndi://", "rtmp://x/y", "ndi://" + "x" * 201):
        with pytest.raises(StreamStudioError):
            parse_ndi(bad)


@pytest.fixture
def fake_ndi(monkeypatch) -> FakeNdi:
    return install_fake_ndi(monkeypatch)


class Camera:
    """An NDI sender written from ndi-python's API (as an outside tool's): frame i, a flat grey,
    sent every 1/fps s with the timecode START + i / fps (100 ns units). `sent_at(i)` is when
    frame i went."""

    START = 7 * 3600 * TICKS  # a sender's timecodes need not start at 0

    def __init__(self, ndi, name: str, fps: float = 30.0):
        self.ndi, self.fps, self.times = ndi, fps, []
        settings = ndi.SendCreate(ndi_name=name, clock_video=False)
        self.sender = ndi.send_create(settings)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def timecode(self, i: int) -> int:
        return self.START + round(i * TICKS / self.fps)

    def _run(self) -> None:
        frame = self.ndi.VideoFrameV2(FourCC=self.ndi.FOURCC_VIDEO_TYPE_RGBX, frame_rate_N=round(self.fps * 1000),
                                      frame_rate_D=1000)
        i, t0 = 0, time.monotonic()
        while not self.stop.wait(max(0.0, t0 + i / self.fps - time.monotonic())):
            frame.data = np.full((48, 64, 4), 40 + i % 200, np.uint8)
            frame.timecode = self.timecode(i)
            self.times.append(time.monotonic())
            self.ndi.send_send_video_v2(self.sender, frame)
            i += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.ndi.send_destroy(self.sender)


@pytest.fixture
def camera(fake_ndi):
    cam = Camera(fake_ndi, "cam")
    yield cam
    cam.close()


# ---------------------------------------------------------------------------- input: once the model is ready
def test_an_ndi_source_takes_its_frames_from_when_they_are_asked_for(fake_ndi, camera):
    """Made, an NdiSource reads the sender's size and rate and lets go; frames() starts at a frame
    sent after it was asked (on main the frame read when it was made came first, however old)."""
    from streamstudio.streaming.sources import open_source

    with open_source("ndi://cam") as source:
        assert (source.info.width, source.info.height, source.info.fps, source.info.live) == (64, 48, 30.0, True)
        assert source.name == "FAKEHOST (cam)"
        time.sleep(0.5)  # a model loading
        assert not [c for c in fake_ndi.connections if c[1] == float("inf")], "connected while nothing reads"
        asked = time.monotonic()
        frames = []
        for frame in source.frames():
            frames.append(frame)
            if len(frames) == 3:
                break
    first = fake_ndi.made[-1].took[0]  # the first frame frames() gave (its receiver's, connected again)
    assert len(fake_ndi.made) == 2 and camera.times[round((first - Camera.START) * 30 / TICKS)] > asked
    assert frames[0].pts == 0.0 and [round(f.pts * 30) for f in frames] == [0, 1, 2]


def test_render_records_no_frame_from_while_the_model_loads(fake_ndi, camera, monkeypatch):
    """`render --input ndi://cam` with a model that takes 1.5 s to load: no receiver is connected
    meanwhile, and the recording's first two frames are a frame time or so apart, not the load
    time (on main the first frame was held for the whole load)."""
    from streamstudio.app import streams
    from streamstudio.app.cli import main

    loading = []
    build = streams.build_pipeline

    def slow_build(*args, **kwargs):
        loading.append(time.monotonic())
        time.sleep(1.5)
        loading.append(time.monotonic())
        return build(*args, **kwargs)

    monkeypatch.setattr(streams, "build_pipeline", slow_build)
    assert main(["render", "--model", "tiny", "--input", "ndi://cam", "--max-frames", "12", "--width", "64",
                 "--height", "48", "--steps", "1", "--output", "ndi://out"]) == 0
    start, end = loading
    assert all(off <= start or on >= end for on, off in fake_ndi.connections), fake_ndi.connections
    out = [f.timecode for f in fake_ndi.sent["out"]]
    assert len(out) >= 5 and out[0] == 0 and (out[1] - out[0]) / TICKS < 1.0, out[:3]  # main: >= 1.5


def test_serve_feeds_an_ndi_source_into_its_stream(fake_ndi, camera):
    """`serve --input ndi://cam --input-stream stage` streams the sender through the model."""
    from live_server import start

    server = start("--input", "ndi://cam", "--input-stream", "stage")
    try:
        deadline = time.monotonic() + 30
        while (session := server.manager.get("stage")) is None or session.processed < 5:
            assert time.monotonic() < deadline, "the NDI input never reached the model"
            time.sleep(0.1)
        assert session.error is None and server.app.state.feed.frames >= 5
    finally:
        server.close()


# ---------------------------------------------------------------------------- output: times and rate
def test_the_sender_timecodes_are_the_stream_times(fake_ndi):
    """A frame's NDI timecode is its pts (100 ns units), however late it is sent; without a pts
    (a Live output paced at 25 fps) one frame time after the last, never the clock at send time
    (main sent SEND_TIMECODE_SYNTHESIZE, the runtime's clock)."""
    from streamstudio.streaming.sinks import open_sink

    frame = np.zeros((48, 64, 3), np.uint8)
    with_pts = open_sink("ndi://timed", 64, 48, 30.0)
    for pts in (0.0, 0.04, 1.5, 1.5 + 1001 / 30000):
        with_pts.write(frame, pts=pts)
        time.sleep(0.01)
    with_pts.close()
    paced = open_sink("ndi://paced", 64, 48, 25.0)
    for _ in range(4):
        paced.write(frame)
        time.sleep(0.01)
    paced.close()
    assert [f.timecode for f in fake_ndi.sent["timed"]] == [0, 400_000, 15_000_000, 15_333_667]
    assert [f.timecode for f in fake_ndi.sent["paced"]] == [0, 400_000, 800_000, 1_200_000]


def test_render_carries_the_source_timecodes_to_its_ndi_output(fake_ndi, camera):
    """render ndi:// -> ndi://: each output frame's timecode is its input frame's, counted from
    the first frame taken."""
    from streamstudio.app.cli import main

    assert main(["render", "--model", "tiny", "--input", "ndi://cam", "--max-frames", "20", "--width", "64",
                 "--height", "48", "--steps", "1", "--output", "ndi://out"]) == 0
    first = fake_ndi.made[-1].took[0]  # frames()' first frame (the receiver that read the size is gone)
    sent = {camera.timecode(i) - first for i in range(len(camera.times))}
    out = [f.timecode for f in fake_ndi.sent["out"]]
    assert len(out) >= 5 and all(min(abs(t - s) for s in sent) <= 1 for t in out), out
    assert all(b > a for a, b in itertools.pairwise(out))


def test_frame_rates_as_ndi_rationals():
    from streamstudio.streaming.ndi import frame_rate

    assert frame_rate(30) == (30, 1) and frame_rate(25.0) == (25, 1)
    assert frame_rate(29.97) == (30000, 1001) and frame_rate(59.94) == (60000, 1001)
    assert frame_rate(23.976) == (24000, 1001) and frame_rate(30.05) == (30, 1)
    assert frame_rate(7.5) == (15, 2) and frame_rate(12.345) == (2469, 200)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(StreamStudioError):
            frame_rate(bad)


def test_the_sender_advertises_the_rate_it_sends_at(fake_ndi):
    """A sink opened at 30 fps whose frames come 12.5 a second (a live model keeping up with that)
    advertises 25/2 once RATE_MIN_FRAMES have gone; frames at 29.97 advertise 30000/1001 (main: 30
    always)."""
    from streamstudio.streaming.ndi import RATE_MIN_FRAMES
    from streamstudio.streaming.sinks import open_sink

    frame = np.zeros((48, 64, 3), np.uint8)
    for name, step in (("slow", 0.08), ("ntsc", 1001 / 30000)):
        sink = open_sink(f"ndi://{name}", 64, 48, 30.0)
        for i in range(40):
            sink.write(frame, pts=i * step)
        sink.close()
    rates = [f.rate for f in fake_ndi.sent["slow"]]
    assert rates[:RATE_MIN_FRAMES - 1] == [(30, 1)] * (RATE_MIN_FRAMES - 1)
    assert set(rates[RATE_MIN_FRAMES - 1:]) == {(25, 2)}
    assert {f.rate for f in fake_ndi.sent["ntsc"][RATE_MIN_FRAMES - 1:]} == {(30000, 1001)}


def test_a_bad_output_rate_is_refused(fake_ndi):
    from streamstudio.streaming.ndi import NdiSender

    for bad in (0.0, float("nan")):
        with pytest.raises(StreamStudioError, match="frame rate must be a positive number"):
            NdiSender("ndi://x", bad)
    assert not fake_ndi.senders


# ---------------------------------------------------------------------------- help
@pytest.mark.parametrize("command, options", [("render", ("--input", "--output")), ("serve", ("--input",))])
def test_help_names_ndi(command, options, capsys):
    from streamstudio.app.cli import main

    try:
        main([command, "--help"])
    except SystemExit:
        pass
    text = " ".join(capsys.readouterr().out.split())
    for option in options:
        helped = text.split(f" {option} ", 1)[1].split(" --", 1)[0]
        assert "ndi://NAME" in helped, (option, helped)


# ---------------------------------------------------------------------------- the real runtime, in a namespace
def test_the_ndi_library_in_a_network_namespace():
    """The tests below with the real NDI runtime, in a user and network namespace with loopback
    alone (its multicast announcements reach no network)."""
    pytest.importorskip("NDIlib")
    if IN_NAMESPACE:
        pytest.skip("already in the namespace")
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rn", "true"], capture_output=True, check=False).returncode:
        pytest.skip("no network namespace to be had here (unshare -rn)")
    run = ("import fcntl, socket, struct, sys, pytest; "  # loopback up: SIOCSIFFLAGS, IFF_UP | IFF_RUNNING
           "fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sH14x', b'lo', 0x1 | 0x40)); "
           "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', 'runtime_', sys.argv[1]]))")
    env = {**os.environ, "STREAMSTUDIO_NDI_NETNS": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([unshare, "-rn", sys.executable, "-c", run, os.path.abspath(__file__)], env=env,
                            capture_output=True, text=True, timeout=300, check=False, cwd=root)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("2 passed") and "skipped" not in summary, result.stdout[-2000:]


def card(i: int, w: int = 64, h: int = 48) -> np.ndarray:
    """Frame i: four flat colour quadrants that change with i (flat areas survive NDI's codec)."""
    img = np.zeros((h, w, 3), np.uint8)
    img[: h // 2, : w // 2] = (200, 30 + 5 * i, 40)
    img[: h // 2, w // 2:] = (20, 180, 220)
    img[h // 2:, : w // 2] = (240, 240, 240)
    img[h // 2:, w // 2:] = (10, 10, 10)
    return img


class Sender:
    """An NdiSink sending card(i) with pts i / 30 in a thread, 30 times a second."""

    def __init__(self, spec: str, count: int = 10_000):
        from streamstudio.streaming.sinks import open_sink

        self.sink = open_sink(spec, 64, 48, 30.0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(count,), daemon=True)
        self.thread.start()

    def _run(self, count: int) -> None:
        for i in range(count):
            if self.stop.wait(1 / 30):
                return
            self.sink.write(card(i % 40), pts=i / 30)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sink.close()


@runtime
def test_runtime_a_sender_round_trips_to_a_receiver_on_this_machine():
    """Through the runtime: found by NAME as "HOST (NAME)", the size and rate read, frames from
    frames() on (a receiver connected again), colour within the codec's loss, the pts exact."""
    from streamstudio.streaming.sources import open_source, source_kind

    name = f"streamstudio-test-{secrets.token_hex(3)}"
    sender = Sender(f"ndi://{name}")
    try:
        assert source_kind(f"ndi://{name}") == "ndi"
        with open_source(f"ndi://{name}") as source:
            assert source.info.live and (source.info.width, source.info.height) == (64, 48)
            assert source.info.fps == 30.0
            assert source.name.endswith(f"({name})")
            frames = []
            for frame in source.frames():
                frames.append(frame)
                if len(frames) == 20:
                    break
    finally:
        sender.close()
    assert frames[0].pts == 0.0
    steps = np.diff([f.pts for f in frames])
    assert np.allclose(steps * 30, np.round(steps * 30), atol=1e-5) and (steps > 0).all()  # whole frames of 1/30 s
    for f in frames:
        i = round(f.pts * 30 + first_index(frames[0].image)) % 40  # the card the pts says it is
        assert np.abs(f.image.astype(int) - card(i).astype(int))[4:-4, 4:-4].max() <= 12, i


def first_index(image: np.ndarray) -> int:
    """Which card(i) the first received frame is (its green in the top-left quadrant)."""
    return round((float(image[6:18, 6:26, 1].mean()) - 30) / 5)


@runtime
def test_runtime_a_missing_source_says_what_it_saw():
    from streamstudio.streaming.sources import NdiSource

    t0 = time.monotonic()
    with pytest.raises(StreamStudioError, match="no NDI source 'nobody-here' within 1 s"):
        NdiSource("ndi://nobody-here", find_timeout=1)
    assert time.monotonic() - t0 < 5
