"""The web app's Live output tab end to end: a live session over the tiny model pushed through
the tab's own functions (`_start_output`, `_output_status`, `_stop_output`, `_tab_status`: what
the Start, status timer and Stop controls call) over the server's output registry
(app/web/outputs.py) to a real nginx-rtmp on 127.0.0.1 and to HLS, read back with PyAV; a server
that goes away mid-stream; the live stream ending before Stop; which streams a page may output.
RTMP tests skip without nginx-rtmp (the `nginx` fixture, conftest.py and rtmp_server.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from rtmp_server import read_stream

from streamstudio.app.web.sessions import ServerModel, SessionManager
from streamstudio.app.web.outputs import LiveOutput, Outputs
from streamstudio.app.web.ui import _output_status, _start_output, _stop_output, _tab_status
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig

av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")

W, H = 96, 64  # the session's output size: not square, so a swapped width/height shows
FPS = 15
KEY = "browser"  # the Gradio session hash the tab keys its outputs by


@pytest.fixture(scope="module")
def model(tiny_components_factory):
    return ServerModel(tiny_components_factory(), StreamDiffusionConfig(width=W, height=H, steps=2, strength=0.6),
                       prompt="a cat")


@pytest.fixture
def manager(model):
    m = SessionManager(model, max_streams=2, idle_timeout=60.0)
    yield m
    m.shutdown()


class Camera:
    """Feeds a session changing frames at `fps` in a thread, as the Live tab's webcam does."""

    def __init__(self, session, fps: float = 20.0):
        self.session, self.fps = session, fps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(1 / self.fps):
            img = np.zeros((H, W, 3), np.uint8)
            img[:, : (i * 7) % W] = (200, 40 + i % 200, 90)
            self.session.submit(img)
            i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def live(manager):
    """A live session with a camera feeding it; yields the session id."""
    session = manager.open("live")
    camera = Camera(session)
    yield "live"
    camera.stop()


def wait_until(cond, timeout: float, what: str, session=None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if session is not None:
            assert session.error is None, session.error
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def outputs(manager, tmp_path):
    registry = Outputs(manager, tmp_path)
    yield registry
    registry.close()


def start(manager, outputs, kind, target) -> LiveOutput:
    manager.claim("live", KEY)  # this page streams it (its first inputs made it the owner)
    message = _start_output(manager, outputs, KEY, "live", kind, target, FPS)
    assert message.startswith("Started"), message
    return outputs.of("live", owner=KEY)[-1]


def stop(outputs, out: LiveOutput) -> str:
    return _stop_output(outputs, KEY, out.oid)


# ---------------------------------------------------------------------- RTMP
def test_live_output_to_rtmp_is_played_back_and_ends_cleanly(nginx, manager, outputs, live, tmp_path):
    session = manager.get(live)
    out = start(manager, outputs, "rtmp", nginx.url("studio"))
    assert nginx.url("studio") in out.location
    wait_until(lambda: out.attachment.frames >= 5, 20, "the first frames sent", session)

    played: dict = {}
    viewer = threading.Thread(target=read_stream, args=(nginx.url("studio"), played, 5.0), daemon=True)
    viewer.start()  # a viewer joining the live stream
    wait_until(lambda: played.get("count", 0) >= 10, 20, f"frames played back ({played})")
    status = _output_status(out)
    assert status.startswith("**running**") and "lost 0 · reconnects 0" in status, status

    t_stop = time.monotonic()
    stopped = stop(outputs, out)
    assert stopped.startswith(f"Stopped: {out.attachment.frames} frame(s) at a constant {FPS:g} fps")
    assert outputs.of("live") == [] and _output_status(None) == "Not running."
    assert not out.attachment.running and out.attachment.error is None
    assert out.attachment.sink.status.closed and out.attachment.sink.status.error is None
    sent = out.attachment
    assert sent.sink.status.frames_written == sent.frames and sent.sink.status.frames_lost == 0
    # The publisher unpublished (deleteStream) before it hung up (a reset after that is the
    # socket closing with nginx's last status reply unread: harmless), and nginx then ended the
    # stream for its viewers at once (nginx-rtmp drops them: PyAV says EIO), well before the
    # viewer's 5 s read timeout could fire.
    viewer.join(2.5)
    assert not viewer.is_alive() and time.monotonic() - t_stop < 2.5, "the stream did not end on stop"
    assert "timed out" not in played.get("end", ""), played
    events = [e for line in nginx.publisher_log("studio") for e in ("deleteStream", "disconnect", "failed")
              if f" {e}" in line]
    assert events and events[0] == "deleteStream", nginx.publisher_log("studio")
    assert played["size"] == (W, H)

    assert session.error is None and not session.closed  # stopping the output leaves the stream running
    processed = session.processed
    wait_until(lambda: session.processed >= processed + 3, 20, "more frames after the stop", session)

    wait_until(lambda: nginx.recording("studio").exists(), 5, "nginx's recording")
    time.sleep(0.3)  # nginx finishes the recording file when the publisher leaves
    with av.open(str(nginx.recording("studio"))) as c:
        frames = list(c.decode(video=0))
    assert len(frames) == out.attachment.frames  # every frame sent arrived, the encoder flushed on stop
    assert {(f.width, f.height) for f in frames} == {(W, H)}
    assert frames[0].key_frame


# ---------------------------------------------------------------------- HLS
def test_live_output_to_hls_writes_a_playable_playlist(manager, outputs, live, tmp_path):
    session = manager.get(live)
    out = start(manager, outputs, "hls", "../my stream")  # a cleaned name, inside the output folder
    folder = tmp_path / "hls" / "my_stream"
    assert out.location == str(folder / "index.m3u8")
    wait_until(lambda: out.attachment.frames >= 8, 20, "frames sent", session)
    assert _output_status(out).startswith("**running**")

    message = stop(outputs, out)
    assert message.startswith(f"Stopped: {out.attachment.frames} frame(s)")
    assert out.attachment.error is None and not out.attachment.running
    playlist = folder / "index.m3u8"
    text = playlist.read_text()
    segments = sorted(folder.glob("segment_*.ts"))
    assert segments and all(s.stat().st_size > 0 for s in segments)
    assert all(s.name in text for s in segments) and "#EXT-X-ENDLIST" in text  # finished on stop

    with av.open(str(playlist)) as c:
        frames = list(c.decode(video=0))
    assert len(frames) == out.attachment.frames
    assert {(f.width, f.height) for f in frames} == {(W, H)}
    assert frames[0].to_ndarray(format="rgb24").shape == (H, W, 3)
    assert session.error is None and not session.closed


# ---------------------------------------------------------------------- a server that goes away
def test_live_output_as_an_ndi_source_is_received_by_name(manager, outputs, live, tmp_path, monkeypatch):
    """The Live output tab's NDI choice: the stream becomes an NDI source named by the target
    (cleaned), which a receiver finds and gets at the stream's size (ndi-python faked at its
    boundary: the runtime announces by multicast; tests/ndi_fake.py)."""
    from ndi_fake import install_fake_ndi

    from streamstudio.streaming.sources import NdiSource

    install_fake_ndi(monkeypatch)
    session = manager.get(live)
    name = "studio out"
    out = start(manager, outputs, "ndi", name + "/../!")
    assert out.location == f"ndi://{name}"
    try:
        with NdiSource(out.location, find_timeout=20) as source:
            assert (source.info.width, source.info.height) == (W, H)
            frames = [f for _, f in zip(range(3), source.frames())]
        assert len(frames) == 3 and frames[-1].image.shape == (H, W, 3)
    finally:
        stop(outputs, out)
    assert session.error is None and not session.closed


# ---------------------------------------------------------------------- which streams a page outputs
def test_a_page_outputs_its_own_stream_an_operator_any_and_two_a_stream(manager, outputs, live, tmp_path):
    """Issue 44: the tab took only its page's Live camera, one output a page. Now a page outputs
    its own stream (up to the limit per stream, from one page), never another page's, and a
    logged-in operator any running stream, such as a WHIP publisher's, which the stream choices
    list for it alone."""
    from streamstudio.app.web.ui import LIVE, _tab_streams, _visible_outputs

    manager.claim("live", KEY)
    obs = manager.open("obs")  # a stream no page owns (a WHIP publisher, serve --input)
    obs.submit(np.zeros((H, W, 3), np.uint8))
    said = [_start_output(manager, outputs, KEY, "live", "file", f"{n}.mp4", FPS) for n in ("a", "b", "c")]
    assert [m.split(":")[0] for m in said[:2]] == ["Started", "Started"] and "2 output(s)" in said[2], said
    assert _start_output(manager, outputs, "other page", "live", "file", "x.mp4", FPS).startswith("⚠️ That stream")
    assert _start_output(manager, outputs, KEY, "obs", "file", "x.mp4", FPS).startswith("⚠️ That stream")
    assert _tab_streams(manager, operator=False) == [("This page's Live camera", LIVE)]
    assert ("obs", "obs") in _tab_streams(manager, operator=True)
    assert _start_output(manager, outputs, "admin page", "obs", "file", "obs.mp4", FPS, operator=True) \
        .startswith("Started")
    assert [o.location for o in _visible_outputs(manager, outputs, "other page", "live")] == []
    mine = _visible_outputs(manager, outputs, KEY, "live")
    assert len(mine) == 2 and all(o.owner == KEY for o in mine)
    assert _stop_output(outputs, "other page", mine[0].oid).startswith("⚠️ That stream")  # not its output
    assert _stop_output(outputs, KEY, mine[0].oid).startswith("Stopped:")
    assert len(outputs.of("live")) == 1 and len(outputs.of("obs")) == 1


def test_rtmp_server_gone_mid_stream_stops_the_output_not_the_stream(nginx, manager, outputs, live, tmp_path):
    session = manager.get(live)
    out = start(manager, outputs, "rtmp", nginx.url("gone"))
    wait_until(lambda: out.attachment.frames >= 5, 20, "the first frames sent", session)
    sent = out.attachment.frames

    nginx.stop()  # the server crashes mid-stream; the sink retries, then gives up (a few seconds)
    seen = []  # what the tab's status timer shows meanwhile

    def failed() -> bool:
        seen.append(_output_status(out))
        return out.attachment.error is not None

    wait_until(failed, 20, "the output to report the lost server", session)
    wait_until(lambda: not out.attachment.running, 5, "the output thread to end")
    retrying = [s for s in seen if s.startswith("**running**") and "last error: RTMP" in s]
    assert retrying and "lost 0" not in retrying[-1], seen[-3:]  # while it retries, the tab says so
    status = _output_status(out)
    assert status.startswith("❌ Stopped:") and "RTMP" in status and nginx.url("gone") in status, status
    assert "reconnect attempts failed" in out.attachment.error and out.attachment.sink.status.frames_lost >= 1
    assert out.attachment.sink.status.closed and out.attachment.frames >= sent
    assert out.attachment not in session.runner.attachments  # the broken output no longer hangs on the stream

    # the live session never stopped: it keeps producing frames for the page (and other outputs)
    assert session.error is None and not session.closed
    processed = session.processed
    wait_until(lambda: session.processed >= processed + 5, 20, "frames after the output failed", session)
    assert session.latest().shape == (H, W, 3)

    stopped = stop(outputs, out)  # Stop still answers after a failure, and repeats it
    assert stopped.startswith("Stopped:") and "It had failed" in stopped and "RTMP" in stopped
    assert outputs.of("live") == [] and stop(outputs, out) == "Not running."


# ---------------------------------------------------------------------- the stream ending first
def test_live_output_finishes_when_its_live_stream_ends(manager, outputs, live, tmp_path):
    """The camera stops or the page goes away (the session is freed) before Stop is pressed: the
    output ends by itself and the recording is finished, not left open for ever."""
    session = manager.get(live)
    out = start(manager, outputs, "file", "before-stop.mp4")
    wait_until(lambda: out.attachment.frames >= 5, 20, "frames recorded", session)
    manager.close(live)
    wait_until(lambda: not out.attachment.running, 5, "the output to end with its stream")
    assert out.attachment.sink.status.closed and out.attachment.error is None
    status = _output_status(out)
    assert status.startswith("**stopped**") and "the live stream ended" in status, status
    with av.open(str(tmp_path / "before-stop.mp4")) as c:  # finished: playable to the last frame
        frames = list(c.decode(video=0))
    assert len(frames) == out.attachment.frames and (frames[0].width, frames[0].height) == (W, H)
    assert stop(outputs, out).startswith(f"Stopped: {out.attachment.frames} frame(s)")


# ---------------------------------------------------------------------- what a recording looks like
def test_a_recording_has_a_constant_frame_rate_and_the_tab_says_where_it_went(manager, outputs, live, tmp_path):
    """At the 30 fps setting a recording once came out at 16.8 fps on average with
    r_frame_rate 90000/1; now every frame is 1/fps after the last, as players expect, and the
    status line keeps what Stop said (and what a failed Start said) instead of "Not running."."""
    session = manager.get(live)
    out = start(manager, outputs, "file", "constant.mp4")
    wait_until(lambda: out.attachment.frames >= 12, 20, "frames recorded", session)
    said = stop(outputs, out)
    assert _tab_status(outputs.of("live"), said) == said and "constant.mp4" in said
    with av.open(str(tmp_path / "constant.mp4")) as c:  # (a stream's fields only while it is open)
        stream = c.streams.video[0]
        guessed, average = float(stream.guessed_rate), float(stream.average_rate)
        times = [float(f.pts * f.time_base) for f in c.decode(video=0)]
    assert len(times) == out.attachment.frames
    assert guessed == pytest.approx(FPS) and average == pytest.approx(FPS, rel=0.02)
    steps = np.diff(times)
    assert np.allclose(steps, 1 / FPS, atol=2e-5), steps  # constant: no wall-clock jitter in the timestamps
    failed = _start_output(manager, outputs, KEY, "nobody", "file", "x.mp4", FPS)
    assert _tab_status([], failed) == failed and "No live stream" in failed
