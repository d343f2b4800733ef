"""RTMP push against a real nginx with the RTMP module, started on 127.0.0.1 at a free port
with its own prefix and config, and stopped after (the `nginx` fixture, conftest.py and
rtmp_server.py). Skipped when nginx or the module is missing."""

from __future__ import annotations

import socket
import threading
import time

import av
import pytest
from rtmp_server import free_port, read_stream

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sinks import RtmpConfig, RtmpSink, open_sink
from streamstudio.streaming.sources import PatternSource, open_source


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
