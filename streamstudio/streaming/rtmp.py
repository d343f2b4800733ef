"""RTMP output: `RtmpSink` pushes flv (libx264 tuned for zero latency) to an RTMP server, with
an `RtmpConfig`'s timeouts and reconnects; each connection's libav calls run on a thread of its
own so that a stalled server never blocks the caller longer than a timeout. Opened by
`streaming/sinks.open_sink` for rtmp:// specs."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from fractions import Fraction
from urllib.parse import urlparse

import numpy as np

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sink_base import Sink, VideoEncoder, x264_options

log = logging.getLogger(__name__)


@dataclass
class RtmpConfig:
    connect_timeout: float = 5.0  # seconds to reach the server before giving up
    io_timeout: float = 5.0  # seconds one write (or the close) may wait on the server
    max_reconnects: int = 3  # attempts after a drop or a stall, then the sink fails
    backoff: float = 0.5  # first wait between attempts, doubled each time


class _Stalled(Exception):
    """A call on an RTMP connection did not finish in time; the connection is abandoned."""


class _RtmpConnection:
    """One RTMP connection: an flv container and its encoder, used only by this object's daemon
    thread. PyAV gives output containers no timeout (the protocol is opened without options and
    without an interrupt callback), so a server that stops reading blocks a mux inside libav
    until TCP gives up, minutes later. Callers hand each call to the thread and wait at most
    `timeout` seconds; after an overrun the connection is abandoned: nobody touches the
    container again, and its thread, stuck inside libav, closes it and ends whenever libav
    returns (the server wakes up, or the socket fails)."""

    def __init__(self, url: str, width: int, height: int, fps: float, config: RtmpConfig):
        import av

        self.config = config
        try:
            container = av.open(url, "w", format="flv")  # no I/O yet: libav connects at the first mux
        except (av.error.FFmpegError, OSError) as exc:
            raise StreamStudioError(f"cannot open RTMP stream {url}: {exc}") from exc
        self._container = container
        self._enc = VideoEncoder(container, "libx264", width, height, fps, x264_options(fps, live=True),
                             time_base=Fraction(1, 1000))
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._started = False  # the first mux also connects, handshakes and publishes
        self.ended = False  # finished or abandoned: takes no more calls
        threading.Thread(target=self._run, daemon=True, name="rtmp-writer").start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, future = job
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)
        try:
            self._container.close()  # a no-op when finish() closed it already
        except Exception as exc:  # the connection is already gone
            log.debug("closing an RTMP connection: %s", exc)

    def _call(self, fn, *args):
        if self.ended:
            raise StreamStudioError("this RTMP connection is closed")
        timeout = self.config.io_timeout + (0 if self._started else self.config.connect_timeout)
        self._started = True
        future: Future = Future()
        self._jobs.put((fn, args, future))
        try:
            return future.result(timeout)
        except FutureTimeout:
            self.abandon()
            raise _Stalled(f"did not finish in {timeout:g} s") from None

    def write(self, frame: np.ndarray, pts: float) -> None:
        self._call(self._enc.write, frame, pts)

    def finish(self) -> None:
        """Drain the encoder and close the container (the server sees the stream end)."""
        if self.ended:
            return
        try:
            self._call(self._finish)
        finally:
            self.abandon()

    def _finish(self) -> None:
        self._enc.flush()
        self._container.close()

    def abandon(self) -> None:
        """Take no more calls; the thread closes the container and ends once libav lets it."""
        if not self.ended:
            self.ended = True
            self._jobs.put(None)


class RtmpSink(Sink):
    """Push to an RTMP server: flv, libx264 tuned for zero latency, a keyframe every second.
    An unreachable server fails at open within `connect_timeout`. A dropped connection, or one
    where a write does not finish within `io_timeout` (a stalled server), is given up and
    retried `max_reconnects` times with backoff, frames meanwhile counted as lost; then
    `write` raises StreamStudioError. `write` and `close` never wait on the server longer than
    `io_timeout` per call (plus `connect_timeout` for a connection's first frame)."""

    def __init__(self, url: str, width: int, height: int, fps: float, config: RtmpConfig | None = None):
        super().__init__(url, width, height, fps)
        self.url, self.config = url, config or RtmpConfig()
        parsed = urlparse(url)
        if not parsed.hostname or not parsed.path.strip("/"):
            raise StreamStudioError(f"bad RTMP url {url!r}; expected rtmp://host[:port]/app/stream_key")
        self._host, self._port = parsed.hostname, parsed.port or 1935
        self._conn: _RtmpConnection | None = None
        self._t0: float | None = None  # pts offset of the current connection
        self._lock = threading.Lock()  # guards _conn and closed (close() may come from another thread)
        self._connect()

    def _reachable(self) -> None:
        """Connect and start an RTMP handshake (C0 + C1, then wait for S0): a server that is down,
        or that accepts connections but never answers, fails here within `connect_timeout`
        instead of blocking the first write (libav opens the connection holding Python's GIL,
        so no thread could time that out)."""
        try:
            with socket.create_connection((self._host, self._port), timeout=self.config.connect_timeout) as probe:
                probe.settimeout(self.config.connect_timeout)
                probe.sendall(b"\x03" + bytes(1536))  # C0 (version 3) + C1 (time 0, zero, zero bytes)
                answer = probe.recv(1)  # S0
        except TimeoutError as exc:
            raise StreamStudioError(f"RTMP server {self._host}:{self._port} did not answer within "
                                    f"{self.config.connect_timeout:g} s ({exc}); check that it is running and "
                                    "not overloaded") from exc
        except OSError as exc:
            raise StreamStudioError(f"RTMP server {self._host}:{self._port} is unreachable ({exc}); "
                                    "check that it is running and the url is right") from exc
        if answer != b"\x03":
            raise StreamStudioError(f"{self._host}:{self._port} does not answer the RTMP handshake; "
                                    "check that an RTMP server listens there")

    def _connect(self) -> None:
        self._reachable()
        conn = _RtmpConnection(self.url, self.width, self.height, self.fps, self.config)
        with self._lock:
            if self.status.closed:  # closed from another thread meanwhile
                conn.abandon()
                raise StreamStudioError(f"RTMP stream {self.url} is closed")
            self._conn, self._t0 = conn, None

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        if self.status.closed:
            raise StreamStudioError(f"RTMP stream {self.url} is closed")
        pts = self.status.frames_written / self.fps if pts is None else pts
        if self._conn is None:
            self._reconnect("dropped the stream")
        conn = self._conn
        if conn is None:  # closed from another thread meanwhile
            raise StreamStudioError(f"RTMP stream {self.url} is closed")
        if self._t0 is None:
            self._t0 = pts
        try:
            conn.write(frame, pts - self._t0)
        except _Stalled as exc:
            self._lost(conn, f"RTMP server {self.url} stalled: a write {exc}", "stalled")
            return
        except Exception as exc:  # av errors, BrokenPipe: the server dropped us
            self._lost(conn, f"RTMP connection lost: {exc}", "dropped the stream")
            return
        self.status.frames_written += 1

    def _lost(self, conn: _RtmpConnection, error: str, what: str) -> None:
        """The frame in hand is lost and the connection given up; reconnect (or raise)."""
        self.status.frames_lost += 1
        self.status.error = error
        conn.abandon()
        with self._lock:
            if self._conn is conn:
                self._conn = None
        if self.status.closed:
            raise StreamStudioError(f"RTMP stream {self.url} is closed")
        log.warning("%s; reconnecting", error)
        self._reconnect(what)

    def _reconnect(self, what: str) -> None:
        wait = self.config.backoff
        for attempt in range(1, self.config.max_reconnects + 1):
            time.sleep(wait)
            if self.status.closed:
                raise StreamStudioError(f"RTMP stream {self.url} is closed")
            try:
                self._connect()
                self.status.reconnects += 1
                log.info("RTMP reconnected to %s (attempt %d)", self.url, attempt)
                return
            except StreamStudioError as exc:
                self.status.error = str(exc)
            wait *= 2
        raise StreamStudioError(f"RTMP server {self.url} {what} and {self.config.max_reconnects} "
                                f"reconnect attempts failed; {self.status.frames_lost} frame(s) lost")

    def close(self) -> None:
        """Drain the encoder and end the stream, waiting on the server at most `io_timeout`."""
        with self._lock:
            if self.status.closed:
                return
            self.status.closed = True
            conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.finish()
        except _Stalled as exc:  # closing a dead connection must not hide the run's result
            self.status.error = f"RTMP close: the server stalled, the close {exc}"
        except Exception as exc:
            self.status.error = f"RTMP close: {exc}"
