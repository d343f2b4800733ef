"""RTMP push against a real nginx with the RTMP module, started on 127.0.0.1 at a free port
with its own prefix and config, and stopped after (the `nginx` fixture, conftest.py and
rtmp_server.py). Skipped when nginx or the module is missing."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from rtmp_server import free_port, read_stream

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.rtmp import RtmpConfig, RtmpSink
from streamstudio.streaming.sinks import open_sink
from streamstudio.streaming.sources import PatternSource, open_source

av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")


def push(sink, frames: int, fps: float, w: int = 96, h: int = 64, realtime: bool = True) -> None:
    src = PatternSource(w, h, fps=fps, count=frames, realtime=realtime)
    for f in src.frames():
        sink.write(f.image, f.pts)


def test_push_and_read_back(nginx):
    fps, n = 15, 45
    sink = open_sink(nginx.url(), 96, 64, fps)
    assert isinstance(sink, RtmpSink)
    played: dict = {}
    reader = None
    try:
        push(sink, 8, fps)
        reader = threading.Thread(target=read_stream, args=(nginx.url(), played), daemon=True)
        reader.start()  # a live viewer joining while the stream runs
        push(sink, n - 8, fps)
    finally:
        sink.close()
    assert sink.status.frames_written == n and sink.status.frames_lost == 0
    reader.join(15)
    assert played.get("size") == (96, 64)
    assert played.get("count", 0) >= 15  # it joins late, from a keyframe
    time.sleep(0.3)  # nginx finishes the recording when the publisher leaves
    recorded = nginx.prefix / "rec" / "test.flv"
    with av.open(str(recorded)) as c:
        frames = list(c.decode(video=0))
        keyframes = [f for f in frames if f.key_frame]
    assert len(frames) == n and (frames[0].width, frames[0].height) == (96, 64)
    assert len(keyframes) == pytest.approx(n / fps, abs=1)  # a keyframe every second


def test_odd_size_is_padded_for_yuv420(nginx):
    with open_sink(nginx.url("odd"), 63, 47, 10) as sink:
        push(sink, 10, 10, w=63, h=47, realtime=False)
    time.sleep(0.3)
    with av.open(str(nginx.prefix / "rec" / "odd.flv")) as c:
        frame = next(c.decode(video=0))
    assert (frame.width, frame.height) == (64, 48)


def test_unreachable_server_fails_fast():
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(StreamStudioError, match="unreachable"):
        open_sink(f"rtmp://127.0.0.1:{port}/live/x", 64, 64, 30)
    assert time.monotonic() - t0 < 10


def test_silent_server_fails_within_10_seconds():
    """A server that accepts the connection but never answers the RTMP handshake (on loopback:
    tests never send traffic off this machine) gives a clear error within seconds."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        t0 = time.monotonic()
        config = RtmpConfig(connect_timeout=2.0, io_timeout=2.0, max_reconnects=1, backoff=0.2)
        with pytest.raises(StreamStudioError, match="RTMP"):
            sink = RtmpSink(f"rtmp://127.0.0.1:{port}/live/x", 64, 64, 30, config)
            push(sink, 30, 30, w=64, h=64, realtime=False)  # the handshake happens with the first packets
        assert time.monotonic() - t0 < 10
    finally:
        listener.close()


def test_dropped_server_is_retried_then_fails_with_lost_frames_counted(nginx):
    sink = RtmpSink(nginx.url(), 64, 48, 15, RtmpConfig(max_reconnects=2, backoff=0.2))
    push(sink, 10, 15, w=64, h=48, realtime=False)
    nginx.stop()
    t0 = time.monotonic()
    with pytest.raises(StreamStudioError, match="reconnect attempts failed; [1-9]\\d* frame\\(s\\) lost"):
        push(sink, 600, 15, w=64, h=48, realtime=False)
    assert time.monotonic() - t0 < 10
    assert sink.status.frames_lost >= 1
    sink.close()


def test_reconnects_when_the_server_comes_back(nginx):
    sink = RtmpSink(nginx.url("back"), 64, 48, 15, RtmpConfig(max_reconnects=3, backoff=0.3))
    try:
        push(sink, 10, 15, w=64, h=48, realtime=False)
        nginx.stop()
        nginx.start()
        push(sink, 60, 30, w=64, h=48)  # 2 s
    finally:
        sink.close()
    assert sink.status.reconnects >= 1
    assert sink.status.frames_lost >= 1
    assert sink.status.frames_written + sink.status.frames_lost == 70


class Noise:
    """640x360 random frames at 30 fps: x264 cannot compress them (~200 kB each), so a few
    dozen fill the loopback socket buffers of a server that stopped reading."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.frames = [rng.integers(0, 256, (360, 640, 3), dtype=np.uint8) for _ in range(4)]
        self.n = 0
        self.started = 0.0  # when the last write began

    def write(self, sink) -> float:
        """Write the next frame; how long the write took."""
        self.started = time.monotonic()
        sink.write(self.frames[self.n % len(self.frames)], self.n / 30)
        self.n += 1
        return time.monotonic() - self.started


BLOCKED: list[threading.Thread] = []  # threads in_thread left behind, blocked inside libav


def in_thread(fn, timeout: float):
    """fn() run in a daemon thread, its exception raised here; a failure, not a hang, when it
    still runs after `timeout` s (a write blocked inside libav, which no signal interrupts: the
    thread is left behind, and unblocks when the fixture kills nginx)."""
    error: list[BaseException] = []

    def run():
        try:
            fn()
        except BaseException as exc:  # handed to the test
            error.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        BLOCKED.append(thread)
        pytest.fail(f"the sink is still blocked after {timeout:g} s")
    if error:
        raise error[0]


def close_unless_blocked(sink) -> None:
    """Close the sink, unless a blocked thread still uses it (touching it then could crash)."""
    if not any(t.is_alive() for t in BLOCKED):
        in_thread(sink.close, 5)


@pytest.mark.timeout(60)
def test_stalled_server_fails_within_io_timeout(nginx):
    """nginx frozen mid-stream (SIGSTOP): the connection stays open but nothing is read, so libav
    blocks in send() once the socket buffers are full. That write gives up after io_timeout,
    its frame counted lost; the one reconnect attempt finds a server that accepts the TCP
    connection but never answers the handshake; then a clear error, all within seconds."""
    config = RtmpConfig(connect_timeout=1.0, io_timeout=1.0, max_reconnects=1, backoff=0.1)
    sink = RtmpSink(nginx.url("stall"), 640, 360, 30, config)
    noise = Noise()
    try:
        for _ in range(5):
            noise.write(sink)
        assert sink.status.frames_written == 5
        with nginx.frozen():
            t0 = time.monotonic()

            def write_until_it_fails():
                while time.monotonic() - t0 < 20:
                    assert noise.write(sink) < config.io_timeout + 0.5  # writes that still got through

            with pytest.raises(StreamStudioError, match=r"stalled and 1 reconnect attempts failed; 1 frame\(s\) lost"):
                in_thread(write_until_it_fails, 25)
            # the failing write: io_timeout, the backoff, the probe's connect_timeout, a margin
            assert time.monotonic() - noise.started < 1.0 + 0.1 + 1.0 + 1.0
            assert sink.status.frames_lost == 1 and sink.status.reconnects == 0
            assert sink.status.frames_written == noise.n  # every write but the failing one
            assert "did not answer within 1 s" in sink.status.error
            t1 = time.monotonic()
            in_thread(sink.close, 5)  # the stuck connection is left to its thread, not waited on
            assert time.monotonic() - t1 < 0.5
    finally:
        close_unless_blocked(sink)


@pytest.mark.timeout(60)
def test_stalled_server_is_reconnected_when_it_wakes_up(nginx):
    """The server freezes, a write gives up after io_timeout, and the server wakes up while the
    sink waits to reconnect: a fresh connection takes the stream on, one frame lost."""
    config = RtmpConfig(connect_timeout=1.0, io_timeout=1.0, max_reconnects=3, backoff=0.3)
    sink = RtmpSink(nginx.url("wake"), 640, 360, 30, config)
    noise = Noise()
    try:
        for _ in range(5):
            noise.write(sink)
        with nginx.frozen() as pids:
            t0 = time.monotonic()

            def wake_on_first_loss():
                while sink.status.frames_lost == 0 and time.monotonic() - t0 < 30:
                    time.sleep(0.01)
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)

            def write_until_reconnected():
                while sink.status.reconnects == 0 and time.monotonic() - t0 < 20:
                    # io_timeout, then the first backoff and a probe that the woken server answers
                    assert noise.write(sink) < 1.0 + 0.3 + 1.0

            threading.Thread(target=wake_on_first_loss, daemon=True).start()
            in_thread(write_until_reconnected, 25)
        assert sink.status.reconnects == 1 and sink.status.frames_lost == 1
        assert "stalled" in sink.status.error
        for _ in range(10):  # the fresh connection (its first write also makes the handshake)
            assert noise.write(sink) < config.io_timeout + config.connect_timeout
    finally:
        close_unless_blocked(sink)
    assert sink.status.frames_written + sink.status.frames_lost == noise.n
    time.sleep(0.3)  # nginx finishes the recording when the publisher leaves
    with av.open(str(nginx.recording("wake"))) as c:  # the fresh connection's recording
        assert len(list(c.decode(video=0))) >= 10


def test_rtmp_stream_as_a_live_input(nginx):
    sink = open_sink(nginx.url("in"), 64, 48, 15)
    publisher = threading.Thread(target=lambda: (push(sink, 45, 15, w=64, h=48), sink.close()), daemon=True)
    publisher.start()
    time.sleep(0.5)
    src = open_source(nginx.url("in"))
    try:
        assert src.info.live and (src.info.width, src.info.height) == (64, 48)
        frames = [f for f in src.frames()]
    finally:
        src.close()
    publisher.join(10)
    assert len(frames) >= 15 and frames[0].image.shape == (48, 64, 3)
    assert frames[-1].pts > frames[0].pts
