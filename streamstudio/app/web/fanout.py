"""WHEP fan-out: a stream's viewers share its encodings.

Fan-out. aiortc encodes in each `RTCRtpSender`, once per viewer, unless the track hands it
already-encoded `av.Packet`s (then the sender only packetizes). So a stream's viewers share one
`Broadcaster`: one encoder per codec in use (VP8, H.264), each a sink attached to the stream's
session (the model runs once per frame, whatever the number of viewers; each encoder writes the
newest processed frame in its own thread), and the encoded packets go to every viewer of that codec
through its own bounded queue. A viewer that stalls fills only its queue: it is then emptied and the
viewer waits for the next key
frame (one is asked for), so it never holds back the encoder or the others. Key frames: when a
viewer joins or sends a PLI/FIR (at most one forced every KEYFRAME_MIN_INTERVAL s), and every
GOP_FRAMES frames. The encoders run at a fixed bitrate from the frame size (there is no
per-viewer congestion control: aiortc's REMB-driven bitrate is per encoder).
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import logging
import functools
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from streamstudio.streaming.runner import Attachment
from streamstudio.streaming.sink_base import Sink

if TYPE_CHECKING:
    from av.video.codeccontext import VideoCodecContext

log = logging.getLogger(__name__)

VIEWER_QUEUE = 30  # encoded frames a viewer may fall behind before it is reset to the next key frame
AUDIO_QUEUE = 25  # audio frames (20 ms each) a viewer may fall behind; the oldest go first
GOP_FRAMES = 60  # a key frame at least this often
KEYFRAME_MIN_INTERVAL = 0.5  # seconds between forced key frames (viewers joining, PLI), at most
VIDEO_CLOCK = 90_000
VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK)
CODECS = ("vp8", "h264")  # what the shared encoders make (aiortc negotiates these two)


class SharedEncoder(Sink):
    """One codec's encoder for one stream's viewers: a sink attached to the stream's session
    (the attachment's thread hands it the newest processed frame; one waiting is replaced),
    which encodes each frame once and hands every packet to `deliver` on the event loop."""

    def __init__(self, codec: str, loop: asyncio.AbstractEventLoop, deliver: Callable[[Any, bool], None],
                 width: int, height: int):
        super().__init__(f"whep-{codec}", width, height, 30.0)
        self.codec, self._loop, self._deliver = codec, loop, deliver
        self._keyframe = True
        self._last_forced = 0.0
        self._t0 = time.monotonic()
        self._last_pts = -1
        self._ctx: VideoCodecContext | None = None  # made at the first frame's size (`_context`)
        self._since_key = self._frame_index = 0
        self.frames = self.packets = 0  # encoded / sent
        self.encode_ms: collections.deque = collections.deque(maxlen=300)  # the last frames' encode times

    def request_keyframe(self) -> None:
        self._keyframe = True

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        t0 = time.perf_counter()
        try:
            packets = self._encode(frame)
            self.encode_ms.append(1000 * (time.perf_counter() - t0))
        except Exception:  # a broken encoder loses this frame; the next starts a new encoder
            log.exception("WHEP %s encoder failed", self.codec)
            self._ctx = None
            return
        for packet, key in packets:
            try:
                self._loop.call_soon_threadsafe(self._deliver, packet, key)
            except RuntimeError:  # the event loop has closed: the server is stopping
                return
            self.packets += 1
        self.status.frames_written += 1

    def _encode(self, rgb: np.ndarray) -> list:
        import av

        h, w = rgb.shape[:2]
        w2, h2 = w - w % 2, h - h % 2
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb[:h2, :w2]), format="rgb24").reformat(
            format="yuv420p")
        pts = max(self._last_pts + 1, int((time.monotonic() - self._t0) * VIDEO_CLOCK))
        self._last_pts = pts
        now = time.monotonic()
        if self._ctx is None or self._ctx.width != w2 or self._ctx.height != h2:
            self._ctx = self._context(w2, h2)
            force = True
        else:
            force = self._since_key >= GOP_FRAMES or (self._keyframe and now - self._last_forced
                                                      >= KEYFRAME_MIN_INTERVAL)
        if force:  # a request that came too soon after the last forced key frame waits
            frame.pict_type = av.video.frame.PictureType.I
            self._keyframe, self._last_forced, self._since_key = False, now, 0
        else:
            frame.pict_type = av.video.frame.PictureType.NONE
        frame.pts, frame.time_base = self._frame_index, self._ctx.time_base
        self._frame_index += 1
        out = []
        for packet in self._ctx.encode(frame):
            packet.pts, packet.time_base = pts, VIDEO_TIME_BASE
            out.append((packet, bool(packet.is_keyframe)))
        self._since_key += 1
        self.frames += 1
        return out

    def _context(self, width: int, height: int):
        import av

        bitrate = int(min(4_000_000, max(300_000, width * height * 3)))
        if self.codec == "vp8":
            ctx = av.CodecContext.create("libvpx", "w")
            ctx.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0",
                           "static-thresh": "1", "undershoot-pct": "100", "overshoot-pct": "15",
                           "error-resilient": "1"}
        else:
            ctx = av.CodecContext.create("libx264", "w")
            ctx.options = {"level": "31", "tune": "zerolatency", "preset": "veryfast"}
            ctx.profile = "Baseline"
        ctx.width, ctx.height, ctx.pix_fmt, ctx.bit_rate = width, height, "yuv420p", bitrate
        ctx.framerate = fractions.Fraction(30, 1)
        ctx.time_base = fractions.Fraction(1, 30)
        ctx.gop_size = GOP_FRAMES
        ctx.thread_count = 1
        self._frame_index, self._since_key = 0, 0
        return ctx


def viewer_track_class():
    from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

    class ViewerTrack(MediaStreamTrack):
        """What one viewer's RTCRtpSender reads: encoded packets (video) or audio frames from a
        bounded queue that the broadcaster fills; it never blocks the broadcaster."""

        def __init__(self, kind: str, on_keyframe_needed: Callable[[], None] | None = None):
            super().__init__()
            self.kind = kind
            self.sender = None
            self._need_key = on_keyframe_needed or (lambda: None)
            self._queue: collections.deque = collections.deque()
            self._ready = asyncio.Event()
            self._waiting_key = kind == "video"
            self.received = self.dropped = self.resets = 0

        def send_through(self, pc) -> None:
            """Add this track to the peer connection `pc`; its sender's key frame requests
            (the viewer's PLI/FIR) come back here."""
            self.sender = pc.addTrack(self)

        def ask_keyframes_of(self, request_keyframe: Callable[[], None]) -> None:
            self._need_key = request_keyframe

        def push(self, item, key: bool = False) -> None:  # on the event loop
            if self.readyState != "live":
                return
            self.received += 1
            if self.kind == "audio":
                if len(self._queue) >= AUDIO_QUEUE:
                    self._queue.popleft()
                    self.dropped += 1
            else:
                if self._waiting_key and not key:
                    self.dropped += 1
                    return
                self._waiting_key = False
                if len(self._queue) >= VIEWER_QUEUE:  # stalled: start again at the next key frame
                    self.dropped += len(self._queue) + 1
                    self._queue.clear()
                    self._waiting_key, self.resets = True, self.resets + 1
                    self._need_key()
                    return
            self._queue.append(item)
            self._ready.set()

        async def recv(self):
            sender = self.sender
            if sender is not None and getattr(sender, "_RTCRtpSender__force_keyframe", False):
                sender._RTCRtpSender__force_keyframe = False  # the viewer sent a PLI or FIR
                self._need_key()
            while not self._queue:
                if self.readyState != "live":
                    raise MediaStreamError
                self._ready.clear()
                await self._ready.wait()
            return self._queue.popleft()

        def stop(self) -> None:
            super().stop()
            self._ready.set()

    return ViewerTrack


class Broadcaster:
    """One stream's viewers (on the event loop): one SharedEncoder per codec in use, each a sink
    attached to the stream's session, and the publisher's audio (a WHIP stream's) fanned out as
    it arrives."""

    def __init__(self, sid: str, session, loop: asyncio.AbstractEventLoop):
        self.sid, self.session, self._loop = sid, session, loop
        self.encoders: dict[str, SharedEncoder] = {}
        self._feeds: dict[str, Attachment] = {}  # codec -> its encoder's attachment to the session
        self.video: dict[str, set] = {codec: set() for codec in CODECS}
        self.audio: set = set()
        self.has_audio = False

    def add_video(self, codec: str, track) -> None:
        if codec not in self.encoders:
            encoder = SharedEncoder(codec, self._loop, functools.partial(self._deliver, codec), *self.session.size)
            self._feeds[codec] = self.session.attach(encoder)
            self.encoders[codec] = encoder
        encoder = self.encoders[codec]
        track.ask_keyframes_of(encoder.request_keyframe)
        self.video[codec].add(track)
        encoder.request_keyframe()
        latest = self.session.latest()
        if latest is not None:  # a still stream (similarity filter, paused source) shows at once
            self._feeds[codec].offer(latest, 0.0)

    def remove(self, track) -> None:
        self.audio.discard(track)
        for codec, tracks in self.video.items():
            tracks.discard(track)
            if not tracks and codec in self.encoders:
                self._stop_encoder(codec)

    def _stop_encoder(self, codec: str) -> None:
        self.encoders.pop(codec)
        self.session.detach(self._feeds.pop(codec), wait=None)  # (on the event loop: no waiting)

    def _deliver(self, codec: str, packet, key: bool) -> None:  # the event loop
        for track in list(self.video[codec]):
            track.push(packet, key)

    def push_audio(self, frame) -> None:  # the event loop
        for track in list(self.audio):
            track.push(frame)

    @property
    def viewers(self) -> int:
        return sum(len(t) for t in self.video.values())

    def close(self) -> None:
        for codec in list(self.encoders):
            self._stop_encoder(codec)
        for track in [t for ts in self.video.values() for t in ts] + list(self.audio):
            track.stop()

    def stats(self) -> dict:
        return {codec: {"viewers": len(self.video[codec]), "frames_encoded": e.frames, "packets": e.packets,
                        "encode_ms": round(float(np.median(e.encode_ms)), 2) if e.encode_ms else None}
                for codec, e in self.encoders.items()}
