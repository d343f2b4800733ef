"""WHIP ingest (RFC 9725) and WHEP egress over plain aiortc, next to fastrtc's JSON endpoint.

WHIP (OBS 30+, GStreamer's whipsink, MediaMTX, browsers) publishes into a stream:

    POST    /whip, /whip/{stream}     application/sdp offer -> 201, the SDP answer, Location, ETag;
                                      a POST to a stream that has a WHIP publisher replaces it
                                      (an encoder reconnecting with the same credential, or a stale
                                      publisher): the stream, its settings and its WHEP viewers go on
    PATCH   /whip/{stream}/{session}  application/trickle-ice-sdpfrag with If-Match: the session's
                                      ETag (428 without it, 412 for another): remote candidates
                                      (204, no ETag; mDNS .local ones dropped); an ICE restart is
                                      answered 422 (RFC 9725 4.3.1-4.3.2)
    DELETE  /whip/{stream}/{session}  ends the session and frees the stream (200)
    OPTIONS any of them               200: Allow, Accept-Post / Accept-Patch (and CORS, below)
    GET, HEAD any of them             204 with no content (RFC 9725 4.1); 404 for a session URL
                                      that names no session

WHEP players watch a stream's processed output, any number per stream:

    POST    /whep/{stream}            application/sdp offer (recvonly) -> 201, answer, Location
    PATCH / DELETE /whep/{stream}/{session}, OPTIONS as above

`{stream}` is the session id every front end shares: a WHIP publisher's, a `/webrtc/offer`
client's `webrtc_id` or the Live tab's; `POST /studio/settings/{stream}` sets its prompt and
settings (before the offer: from the first frame). No data channel is needed (fastrtc's Stream
waits for one, so WHIP uses aiortc directly): the publisher's video track is decoded by aiortc
(VP8 or H.264) and each frame goes to the stream's session (`session.submit`), which keeps only
the newest waiting frame.

Fan-out. aiortc encodes in each `RTCRtpSender`, once per viewer, unless the track hands it
already-encoded `av.Packet`s (then the sender only packetizes). So a stream's viewers share one
`Broadcaster`: one encoder per codec in use (VP8, H.264), each a sink attached to the stream's
session (the model runs once per frame, whatever the number of viewers; each encoder writes the
newest processed frame in its own thread), and the encoded packets go to every viewer of that codec through its own bounded queue. A viewer
that stalls fills only its queue: it is then emptied and the viewer waits for the next key
frame (one is asked for), so it never holds back the encoder or the others. Key frames: when a
viewer joins or sends a PLI/FIR (at most one forced every KEYFRAME_MIN_INTERVAL s), and every
GOP_FRAMES frames. The encoders run at a fixed bitrate from the frame size (there is no
per-viewer congestion control: aiortc's REMB-driven bitrate is per encoder).

Audio. A publisher's audio is received and passed through to WHEP viewers (each viewer's
sender encodes Opus itself: cheap next to video); viewers of streams without audio (the Live
tab, `/webrtc/offer`) get none. It is not delayed to match the processed video (which is
behind by the model's latency).

Login (`security.Credentials`): publishing needs the publish credential, a bearer token
(`Authorization: Bearer ...`, as OBS sends it) equal to `--whip-token` (or $STREAMSTUDIO_WHIP_TOKEN),
or HTTP basic auth with the token as the password (any user name: for clients that only take
`user:pass@host` URLs); without a token, `--auth`'s `USER:PASS` as the token, or HTTP basic auth
with that login; without either, no login (the server binds to loopback by default). Watching
takes the publish credential or the view token `--whep-token`, which opens WHEP only: a viewer
cannot publish, replace a publisher or steer a stream. A POST to a stream with a live publisher
replaces it only with the same credential (a reconnect, at once) or once it is stale (no frame for
STALE_PUBLISHER_S s, or its connection failed); else 409. CORS (RFC 9725 4.2: endpoints "MUST
support OPTIONS requests for Cross-Origin Resource Sharing"): when a login is required,
`Access-Control-Allow-Origin: *`, the token being the credential; without a login only the page
origins `--whip-cors` names get CORS headers (any page could otherwise publish into or watch a
local server).
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import functools
import hashlib
import json
import logging
import secrets
import time
from typing import Any, Callable

import numpy as np

from streamstudio.app.web.sessions import BusyError, Pending, SessionManager
from streamstudio.app.web.security import ANONYMOUS, Credentials, peer
from streamstudio.app.web.webrtc import (MAX_CANDIDATES, MAX_SDP_BYTES, PENDING_TIMEOUT, WEBRTC_ID, OfferRefused,
                                     check_offer_sdp, make_room, take_connection)
from streamstudio.errors import StreamStudioError
from streamstudio.streaming.runner import Attachment
from streamstudio.streaming.sinks import Sink

log = logging.getLogger(__name__)

SDP_TYPE = "application/sdp"
TRICKLE_TYPE = "application/trickle-ice-sdpfrag"
MAX_VIEWERS = 32  # WHEP viewers on the server, all streams together (--max-viewers)
MAX_VIEWERS_PER_SOURCE = 8  # WHEP viewers one client address may hold (--max-viewers-per-source)
# A viewer that sends no RTCP receiver report for this long while packets go to it is gone (its
# process died, its network dropped): it is ended then, not when ICE consent fails (about 30 s).
# Players report every second or so (aiortc every 0.5-1.5 s, browsers about 1 s).
VIEWER_SILENCE_S = 5.0
VIEWER_QUEUE = 30  # encoded frames a viewer may fall behind before it is reset to the next key frame
AUDIO_QUEUE = 25  # audio frames (20 ms each) a viewer may fall behind; the oldest go first
GOP_FRAMES = 60  # a key frame at least this often
KEYFRAME_MIN_INTERVAL = 0.5  # seconds between forced key frames (viewers joining, PLI), at most
VIDEO_CLOCK = 90_000
VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK)
CODECS = ("vp8", "h264")  # what the shared encoders make (aiortc negotiates these two)
# A live publisher that has sent no video frame for this long (an encoder that crashed or lost its
# network) may be replaced by a publisher with another credential, or on an open door by anyone.
STALE_PUBLISHER_S = 3.0
# The WHEP server-sent events extension (draft-ietf-wish-whep): a viewer's event stream, linked from
# its 201, tells it when its stream ends (a player otherwise notices 6-16 s later, by ICE).
SSE_REL = "urn:ietf:params:whep:ext:core:server-sent-events"
SSE_EVENTS = ("active", "inactive")
SSE_KEEPALIVE_S = 15.0


# ---------------------------------------------------------------------- offer checks
def check_sdp(sdp: Any, role: str) -> None:
    """Refuse an SDP offer that could not make a working WHIP (role "whip": the client sends
    video, maybe audio) or WHEP (role "whep": the client receives) session: the checks of
    `webrtc.check_offer_sdp` for audio and video without a data channel, then the direction
    and the codecs."""
    parsed = check_offer_sdp(sdp, kinds=("video", "audio"), rtcp_mux_kinds=("video", "audio"))
    sending = ("sendonly", "sendrecv") if role == "whip" else ("recvonly", "sendrecv")
    video = [m for m in parsed.media if m.kind == "video"]
    if not any((m.direction or "sendrecv") in sending for m in video):
        raise OfferRefused("bad_sdp", "the video m= line must be " + (
            "sendonly (a WHIP client publishes)" if role == "whip" else "recvonly (a WHEP client watches)"))
    names = {c.name.lower() for m in video for c in m.rtp.codecs}
    if not names & set(CODECS):
        raise OfferRefused("unsupported_codec", "the offer has no VP8 or H.264 video codec", 400)


def rtc_configuration(rtc_config: dict | None):
    """aiortc's RTCConfiguration from the server's {iceServers: [...]} (webrtc.rtc_config_from_env)."""
    from aiortc import RTCConfiguration, RTCIceServer

    servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
               for s in (rtc_config or {}).get("iceServers", [])]
    return RTCConfiguration(iceServers=servers)


def _etag(sdp: str) -> str:
    """An entity tag for the ICE session: the answer's ice-ufrag and ice-pwd."""
    ice = [line for line in sdp.splitlines() if line.startswith(("a=ice-ufrag:", "a=ice-pwd:"))]
    return '"' + hashlib.sha256("\n".join(ice).encode()).hexdigest()[:16] + '"'


# ---------------------------------------------------------------------- shared encoding
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
        self._ctx = None
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


def _viewer_track_class():
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
            encoder = SharedEncoder(codec, self._loop, lambda p, k, c=codec: self._deliver(c, p, k),
                                    *self.session.size)
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


# ---------------------------------------------------------------------- sessions
class _Resource:
    """A WHIP or WHEP session: its peer connection and the tasks that serve it."""

    def __init__(self, kind: str, sid: str, pc, name: str | None = None):
        self.kind, self.sid, self.pc = kind, sid, pc
        self.source: str | None = None  # the client's address
        self.report: tuple | None = None  # a viewer's last RTCP report seen (`WhipServer._viewer_silent`)
        self.name = name or sid  # the stream as its URL names it (a viewer's: the watch id)
        self.rid = secrets.token_urlsafe(16)
        self.etag = ""
        self.created = time.monotonic()
        self.last_media = self.created  # a publisher's last video frame (`WhipServer._stale`)
        self.identity = ANONYMOUS  # the credential it came with (`security.Credentials`)
        self.listeners: list[asyncio.Queue] = []  # a viewer's event streams (WhipServer._events)
        self.tasks: list[asyncio.Task] = []
        self.tracks: list = []
        self.session = None
        self.closed = False

    @property
    def location(self) -> str:
        return f"/{self.kind}/{self.name}/{self.rid}"


class WhipServer:
    """The WHIP and WHEP endpoints of one server (see the module docstring)."""

    def __init__(self, manager: SessionManager, host: str | None = None, credentials: Credentials | None = None,
                 rtc_config: dict | None = None,
                 pending_timeout: float = PENDING_TIMEOUT, max_viewers: int = MAX_VIEWERS,
                 other_slots: Callable[[], set] = set, max_viewers_per_source: int = MAX_VIEWERS_PER_SOURCE,
                 cors_origins: tuple[str, ...] = ()):
        from streamstudio.app.web import ice

        if max_viewers < 0:
            raise StreamStudioError("--max-viewers must be 0 or more")
        ice.install()
        self.manager, self.credentials = manager, credentials or Credentials()
        self.ice_addresses = ice.ice_addresses(host)
        self.rtc_config, self.pending_timeout, self.max_viewers = rtc_config, pending_timeout, max_viewers
        self.max_viewers_per_source = max_viewers_per_source
        self.cors_origins = tuple(cors_origins)  # --whip-cors: pages allowed without a login
        manager.pending_lists.append(self.pending_connections)
        for kind in ("whip", "whep"):
            manager.peer_counters[kind] = functools.partial(self._count, kind)
        self.other_slots = other_slots  # stream ids other front ends hold without a session yet
        self.resources: dict[str, _Resource] = {}
        self.broadcasters: dict[str, Broadcaster] = {}

    # ------------------------------------------------------------------ HTTP
    @property
    def login_required(self) -> bool:
        return self.credentials.view_required

    def identity(self, kind: str, headers) -> str:
        """The identity `headers` carry for a `kind` ("whip": publish, "whep": view) request
        (`security.Credentials`); OfferRefused 401 without a valid credential."""
        who = self.credentials.publisher(headers) if kind == "whip" else self.credentials.viewer(headers)
        if who is None:
            needed = "--whip-token" if kind == "whip" else "--whep-token or --whip-token"
            raise OfferRefused("unauthorized", f"a valid bearer token is needed (Authorization: Bearer <{needed}>)",
                               401)
        return who

    def _allowed_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin for a request from `origin`: any page when a login is
        required (the token is the credential), else only the pages --whip-cors names."""
        if self.login_required:
            return "*"
        if origin and (origin in self.cors_origins or "*" in self.cors_origins):
            return origin
        return None

    def _headers(self, extra: dict | None = None, origin: str | None = None) -> dict:
        headers = dict(extra or {})
        allowed = self._allowed_origin(origin)
        if allowed is not None:
            headers.update({"Access-Control-Allow-Origin": allowed,
                            "Access-Control-Expose-Headers": "Location, ETag, Accept-Patch, Accept-Post, Link"})
            if allowed != "*":
                headers["Vary"] = "Origin"
        return headers

    def _refused(self, exc: OfferRefused, origin: str | None = None):
        response = exc.response()
        response.headers.update(self._headers(origin=origin))
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="StreamStudio"'
        return response

    def _options(self, request, methods: str, post: bool):
        """OPTIONS (RFC 9725 4.2: "The "200 OK" response to any OPTIONS request SHOULD include an
        Accept-Post header"), also the browsers' CORS preflight (no login asked)."""
        from fastapi.responses import Response

        origin = request.headers.get("origin")
        headers = {"Allow": methods}
        if post:
            headers["Accept-Post"] = SDP_TYPE
        else:
            headers["Accept-Patch"] = TRICKLE_TYPE
        if self._allowed_origin(origin) is not None:
            headers.update({"Access-Control-Allow-Methods": methods,
                            "Access-Control-Allow-Headers": "Authorization, Content-Type, If-Match",
                            "Access-Control-Max-Age": "86400"})
        return Response(status_code=200, headers=self._headers(headers, origin))

    def _get(self, request, stream: str | None = None, rid: str | None = None):
        """GET and HEAD (RFC 9725 4.1: the endpoints and sessions "MUST return a 2xx successful
        response with no content when a GET request is received"); a session URL that names no
        session is 404."""
        from fastapi.responses import Response

        origin = request.headers.get("origin")
        if rid is not None:
            kind = request.url.path.strip("/").split("/")[0]
            try:
                self._find(kind, stream, rid)
            except OfferRefused as exc:
                return self._refused(exc, origin)
        return Response(status_code=204, headers=self._headers(origin=origin))

    async def _read_sdp(self, request, content_type: str, kind: str) -> tuple[str, str]:
        """(the body, the identity of the request's credential for `kind`)."""
        who = self.identity(kind, request.headers)
        given = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if given != content_type:
            raise OfferRefused("bad_content_type", f"Content-Type must be {content_type}", 415)
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_SDP_BYTES:
                raise OfferRefused("sdp_too_large", f"the SDP is larger than {MAX_SDP_BYTES // 1024} KB", 413)
        try:
            return raw.decode("utf-8"), who
        except UnicodeDecodeError:
            raise OfferRefused("bad_sdp", "the SDP must be UTF-8 text") from None

    def mount(self, app) -> None:
        """The routes on `app` (FastAPI). Under --auth the request guard lets /whip and /whep
        through to these, which check their own login (`security.GuardConfig.self_auth_prefixes`)."""
        from fastapi import Request

        async def whip_post(request: Request, stream: str | None = None):
            return await self._post("whip", request, stream)

        async def whep_post(request: Request, stream: str):
            return await self._post("whep", request, stream)

        async def patch(request: Request, stream: str, rid: str):
            return await self._patch(request, stream, rid)

        async def delete(request: Request, stream: str, rid: str):
            return await self._delete(request, stream, rid)

        async def options_endpoint(request: Request):
            return self._options(request, "GET, HEAD, POST, OPTIONS", True)

        async def options_session(request: Request):
            return self._options(request, "GET, HEAD, PATCH, DELETE, OPTIONS", False)

        async def get_endpoint(request: Request, stream: str | None = None):
            return self._get(request)

        async def get_session(request: Request, stream: str, rid: str):
            return self._get(request, stream, rid)

        async def events(request: Request, stream: str, rid: str):
            return await self._events(request, stream, rid)

        for f in (whip_post, whep_post, patch, delete, options_endpoint, options_session, get_endpoint, get_session,
                  events):
            f.__annotations__["request"] = Request  # resolved here: this module has lazy annotations
        for kind in ("whip", "whep"):
            app.add_api_route(f"/{kind}/{{stream}}/{{rid}}", patch, methods=["PATCH"], include_in_schema=False)
            app.add_api_route(f"/{kind}/{{stream}}/{{rid}}", delete, methods=["DELETE"], include_in_schema=False)
            app.add_api_route(f"/{kind}/{{stream}}/{{rid}}", options_session, methods=["OPTIONS"],
                              include_in_schema=False)
            app.add_api_route(f"/{kind}/{{stream}}/{{rid}}", get_session, methods=["GET", "HEAD"],
                              include_in_schema=False)
            app.add_api_route(f"/{kind}/{{stream}}", options_endpoint, methods=["OPTIONS"], include_in_schema=False)
            app.add_api_route(f"/{kind}/{{stream}}", get_endpoint, methods=["GET", "HEAD"], include_in_schema=False)
        app.add_api_route("/whep/{stream}/{rid}/sse", events, methods=["GET", "POST"], include_in_schema=False)
        app.add_api_route("/whip", whip_post, methods=["POST"], include_in_schema=False)
        app.add_api_route("/whip", options_endpoint, methods=["OPTIONS"], include_in_schema=False)
        app.add_api_route("/whip", get_endpoint, methods=["GET", "HEAD"], include_in_schema=False)
        app.add_api_route("/whip/{stream}", whip_post, methods=["POST"], include_in_schema=False)
        app.add_api_route("/whep/{stream}", whep_post, methods=["POST"], include_in_schema=False)
        app.state.whip = self
        app.router.on_shutdown.append(self.close)  # peer connections closed with the server

    # ------------------------------------------------------------------ POST
    async def _post(self, kind: str, request, stream: str | None):
        from fastapi.responses import Response

        from streamstudio.app.web import ice

        origin = request.headers.get("origin")
        try:
            sdp, who = await self._read_sdp(request, SDP_TYPE, kind)
            if stream is not None and not WEBRTC_ID.fullmatch(stream):
                raise OfferRefused("bad_stream", "the stream name must be 1 to 64 letters, digits, '-' or '_'")
            check_sdp(sdp, kind)
            sid = stream or secrets.token_hex(8)
            old = None  # the publisher a new one replaces (a reconnect: same name, valid login)
            if kind == "whip":
                old = self._publisher(sid)
                if old is None:
                    self._check_in_use(sid)
                else:
                    self._check_replace(old, who)
            else:
                sid = self._check_view(sid, peer())
            take_connection(self.manager, takes_slot=kind == "whip" and old is None)
            if kind == "whip" and old is None:
                await make_room(self.manager, peer(), self._full())
                if self._full():
                    raise OfferRefused("busy", self.manager.busy_message(), 503)
        except OfferRefused as exc:
            return self._refused(exc, origin)
        pc = None
        owned = kind == "whip" and old is None  # a session this POST opens (closed again if it fails)
        try:
            from aiortc import RTCPeerConnection, RTCSessionDescription

            with ice.scoped(self.ice_addresses):
                pc = RTCPeerConnection(rtc_configuration(self.rtc_config))
                res = _Resource(kind, sid, pc, stream)
                res.source, res.identity = peer(), who
                if kind == "whip":  # settings set for `sid` beforehand apply now
                    res.session = self.manager.open(sid) if old is None else old.session
                    res.session.named = True  # its name is the publisher's URL: no secret
                    pc.on("track", lambda track: self._on_publisher_track(res, track))
                await pc.setRemoteDescription(RTCSessionDescription(sdp, "offer"))
                if kind == "whep":
                    self._add_viewer_tracks(res)
                await pc.setLocalDescription(await pc.createAnswer())
                if kind == "whep":
                    self._bind_viewer(res)
        except BusyError as exc:
            await self._discard(pc, sid if owned else None)
            self._prune(sid)
            return self._refused(OfferRefused("busy", str(exc), 503), origin)
        except OfferRefused as exc:
            await self._discard(pc, sid if owned else None)
            self._prune(sid)
            return self._refused(exc, origin)
        except Exception as exc:  # aiortc refused the offer (bad parameters, nothing in common)
            await self._discard(pc, sid if owned else None)
            self._prune(sid)
            log.info("%s offer for %s refused: %s: %s", kind.upper(), sid, type(exc).__name__, exc)
            return self._refused(OfferRefused("offer_refused", f"the offer was refused: {type(exc).__name__}: "
                                              f"{str(exc)[:200]}"), origin)
        answer = pc.localDescription.sdp
        res.etag = _etag(answer)
        if old is not None:  # the stream goes on: its session, settings and viewers stay
            for stale in [r for r in self.resources.values() if r.kind == "whip" and r.sid == sid]:
                stale.session = None  # (also one that replaced `old` meanwhile: the newest POST wins)
                await self.end(stale, "replaced by a new publisher on the same stream")
        self.resources[res.rid] = res
        pc.on("connectionstatechange", lambda: self._on_state(res))
        res.tasks.append(asyncio.ensure_future(self._watch(res)))
        log.info("%s session %s for stream %s", kind.upper(), res.rid[:6], sid)
        headers = {"Location": res.location, "ETag": res.etag, "Accept-Patch": TRICKLE_TYPE}
        if kind == "whep":  # the WHEP server-sent events extension: "inactive" when the stream ends
            headers["Link"] = f'<{res.location}/sse>; rel="{SSE_REL}"; events="{",".join(SSE_EVENTS)}"'
        return Response(answer, status_code=201, media_type=SDP_TYPE, headers=self._headers(headers, origin))

    def _publisher(self, sid: str) -> _Resource | None:
        """The live WHIP publisher of stream `sid`, which a new POST to the same name replaces
        (an encoder reconnecting after a crash or a network drop, without DELETE: as MediaMTX
        does by default); None when the stream has no such publisher (its source is a page or a
        /webrtc/offer client, or it ended)."""
        session = self.manager.get(sid)
        for res in self.resources.values():
            if res.kind == "whip" and res.sid == sid and not res.closed and res.session is not None \
                    and res.session is session and not session.closed:
                return res
        return None

    def _check_replace(self, old: _Resource, who: str) -> None:
        """A new publisher may take over the live publisher `old` of its stream only with the same
        credential (an encoder reconnecting: at once), or once `old` is stale (no frame for
        STALE_PUBLISHER_S seconds, or its connection failed); anyone else gets 409."""
        if who != ANONYMOUS and who == old.identity:
            return
        if self._stale(old):
            return
        raise OfferRefused("stream_in_use", f"the stream {old.sid!r} has a live publisher: a reconnect needs the same "
                           f"credential, or waits until it has sent nothing for {STALE_PUBLISHER_S:g} s", 409)

    @staticmethod
    def _stale(res: _Resource) -> bool:
        if res.pc.connectionState in ("failed", "closed") or res.pc.iceConnectionState == "failed":
            return True
        return time.monotonic() - res.last_media > STALE_PUBLISHER_S

    def _check_in_use(self, sid: str) -> None:
        if self.manager.get(sid) is not None or sid in self.other_slots() or \
                any(r.sid == sid and r.kind == "whip" for r in self.resources.values()):
            raise OfferRefused("stream_in_use", f"the stream {sid!r} already has a source", 409)

    def _full(self) -> bool:
        in_use = set(self.manager.ids()) | set(self.other_slots())
        return len(in_use) >= self.manager.max_streams or not self.manager.has_capacity()

    def pending_connections(self) -> list[Pending]:
        """WHIP publishers that have sent no frame yet, for the server's cap (`webrtc.make_room`)."""
        return [Pending(r.source, r.created, functools.partial(self.end, r, "ended to make room: it sent no frame"))
                for r in list(self.resources.values())
                if r.kind == "whip" and not r.closed and (r.session is None or r.session.frames_in == 0)]

    def _check_view(self, name: str, source: str | None) -> str:
        """The id of the stream a viewer asks for by `name` (`SessionManager.watched`), within the
        viewers the server takes and those one source address may hold."""
        session = self.manager.watched(name)
        if session is None or session.closed:
            raise OfferRefused("no_stream", f"no running stream {name!r}: start publishing to it first", 404)
        viewers = [r for r in self.resources.values() if r.kind == "whep"]
        if source is not None and sum(r.source == source for r in viewers) >= self.max_viewers_per_source:
            raise OfferRefused("too_many_viewers", f"your address has {self.max_viewers_per_source} viewers open "
                                                   "already, the most one address may (--max-viewers-per-source)", 429)
        if len(viewers) >= self.max_viewers:
            raise OfferRefused("busy", f"StreamStudio has {self.max_viewers} viewers already (--max-viewers)", 503)
        return session.sid

    async def _discard(self, pc, sid: str | None) -> None:
        if pc is not None:
            try:
                await pc.close()
            except Exception:
                log.debug("closing a refused connection", exc_info=True)
        if sid is not None:
            self.manager.close(sid, wait=0.0)

    # ------------------------------------------------------------------ WHIP: the publisher
    def _on_publisher_track(self, res: _Resource, track) -> None:
        from streamstudio.app.web.rtp_receive import receive_video_without_delay

        res.tracks.append(track)
        if track.kind == "video":
            receive_video_without_delay(res.pc)  # a frame decoded at its last packet, not a frame later
        if track.kind == "video" and not any(t.kind == "video" for t in res.tracks[:-1]):
            res.tasks.append(asyncio.ensure_future(self._read_video(res, track)))
        elif track.kind == "audio" and not any(t.kind == "audio" for t in res.tracks[:-1]):
            res.tasks.append(asyncio.ensure_future(self._read_audio(res, track)))
        else:  # a second track of a kind: read and dropped, so its frames do not pile up
            res.tasks.append(asyncio.ensure_future(self._drain(track)))

    async def _read_video(self, res: _Resource, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        while not res.closed:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            session = res.session
            if session is None or session.closed:
                return
            res.last_media = time.monotonic()
            session.submit(frame.to_ndarray(format="rgb24"))

    async def _read_audio(self, res: _Resource, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        while not res.closed:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            broadcaster = self.broadcasters.get(res.sid)
            if broadcaster is not None and broadcaster.session is res.session:
                broadcaster.push_audio(frame)

    @staticmethod
    async def _drain(track) -> None:
        from aiortc.mediastreams import MediaStreamError

        try:
            while True:
                await track.recv()
        except MediaStreamError:
            return

    # ------------------------------------------------------------------ WHEP: the viewers
    def _broadcaster(self, sid: str) -> Broadcaster:
        session = self.manager.get(sid)
        b = self.broadcasters.get(sid)
        if b is not None and b.session is not session:
            b.close()
            b = None
        if b is None:
            b = self.broadcasters[sid] = Broadcaster(sid, session, asyncio.get_running_loop())
            b.has_audio = any(r.kind == "whip" and r.sid == sid and r.session is session
                              and any(t.kind == "audio" for t in r.tracks) for r in self.resources.values())
        return b

    def _add_viewer_tracks(self, res: _Resource) -> None:
        Track = _viewer_track_class()
        b = self._broadcaster(res.sid)
        kinds = [t.kind for t in res.pc.getTransceivers()]
        video = Track("video")
        video.send_through(res.pc)
        res.tracks.append(video)
        if b.has_audio and "audio" in kinds:
            audio = Track("audio")
            res.pc.addTrack(audio)
            res.tracks.append(audio)
        res.session = b.session

    def _bind_viewer(self, res: _Resource) -> None:
        b = self._broadcaster(res.sid)
        video = res.tracks[0]
        transceiver = next(t for t in res.pc.getTransceivers() if t.sender is video.sender)
        codecs = [c.mimeType.split("/")[-1].lower() for c in transceiver._codecs if
                  c.mimeType.split("/")[-1].lower() in CODECS]
        if not codecs:
            raise OfferRefused("unsupported_codec", "the offer has no VP8 or H.264 video codec")
        b.add_video(codecs[0], video)
        for track in res.tracks[1:]:
            b.audio.add(track)

    # ------------------------------------------------------------------ life and end
    def _on_state(self, res: _Resource) -> None:
        if res.pc.connectionState in ("failed", "closed") and not res.closed:
            asyncio.ensure_future(self.end(res, f"connection {res.pc.connectionState}"))

    async def _watch(self, res: _Resource) -> None:
        """End a session whose stream has gone (freed, idle, failed) or that has not connected
        (or, a publisher, sent no frame) within pending_timeout seconds."""
        step = min(0.5, self.pending_timeout / 5)
        while not res.closed:
            await asyncio.sleep(step)
            session, now = res.session, time.monotonic()
            if session is None or session.closed or self.manager.get(res.sid) is not session:
                reason = "the stream stopped" if session is not None and session.error else "the stream ended"
                return await self.end(res, reason)
            if res.kind == "whep" and res.pc.connectionState == "connected" and await self._viewer_silent(res, now):
                return await self.end(res, f"the viewer sent no report for {VIEWER_SILENCE_S:.0f} s")
            if now - res.created > self.pending_timeout:
                if res.pc.connectionState != "connected":
                    return await self.end(res, f"not connected after {self.pending_timeout:.0f} s")
                if res.kind == "whip" and session.frames_in == 0:
                    return await self.end(res, f"no frame after {self.pending_timeout:.0f} s")

    async def _viewer_silent(self, res: _Resource, now: float) -> bool:
        """Whether the viewer `res` has sent no RTCP report for VIEWER_SILENCE_S seconds while
        packets went to it (a stream with no frames, e.g. a paused publisher, drops nobody)."""
        sender = getattr(res.tracks[0], "sender", None) if res.tracks else None
        if sender is None:
            return False
        stamp, sent = None, 0
        for stat in (await sender.getStats()).values():
            if stat.type == "remote-inbound-rtp":
                stamp = stat.timestamp
            elif stat.type == "outbound-rtp":
                sent = stat.packetsSent
        if res.report is None or stamp != res.report[0]:
            res.report = (stamp, now, sent)  # (the viewer's last report, when it came, packets sent then)
            return False
        _, heard, sent_then = res.report
        return now - heard > VIEWER_SILENCE_S and sent > sent_then

    async def end(self, res: _Resource, reason: str) -> None:
        if res.closed:
            return
        res.closed = True
        self.resources.pop(res.rid, None)
        log.info("%s session %s of stream %s ended: %s", res.kind.upper(), res.rid[:6], res.sid, reason)
        current = asyncio.current_task()
        for task in res.tasks:
            if task is not current:
                task.cancel()
        if res.kind == "whep":
            b = self.broadcasters.get(res.sid)
            for track in res.tracks:
                if b is not None:
                    b.remove(track)
                track.stop()
            self._prune(res.sid)
        try:
            await res.pc.close()
        except Exception:
            log.debug("closing %s", res.rid, exc_info=True)
        for queue in res.listeners:  # its event streams: "inactive", then they end
            queue.put_nowait(("inactive", {"reason": reason}))
            queue.put_nowait(None)
        if res.kind == "whip" and res.session is not None and self.manager.get(res.sid) is res.session:
            self.manager.close(res.sid, wait=0.0)
            for viewer in [r for r in list(self.resources.values()) if r.kind == "whep" and r.sid == res.sid]:
                await self.end(viewer, "the publisher ended")  # told now, not at the next watch step

    def _prune(self, sid: str) -> None:
        """Drop `sid`'s broadcaster once it has no viewer (its encoders detached from the stream)."""
        b = self.broadcasters.get(sid)
        if b is not None and b.viewers == 0 and not b.audio:
            self.broadcasters.pop(sid, None)
            b.close()

    def _find(self, kind: str, stream: str, rid: str) -> _Resource:
        res = self.resources.get(rid)
        if res is None or res.kind != kind or res.name != stream:
            raise OfferRefused("no_session", f"no {kind.upper()} session here", 404)
        return res

    async def _delete(self, request, stream: str, rid: str):
        from fastapi.responses import Response

        kind, origin = request.url.path.strip("/").split("/")[0], request.headers.get("origin")
        try:
            self.identity(kind, request.headers)
            res = self._find(kind, stream, rid)
        except OfferRefused as exc:
            return self._refused(exc, origin)
        await self.end(res, "DELETE")
        return Response(status_code=200, headers=self._headers(origin=origin))

    async def _patch(self, request, stream: str, rid: str):
        from aiortc.sdp import candidate_from_sdp
        from fastapi.responses import Response

        kind, origin = request.url.path.strip("/").split("/")[0], request.headers.get("origin")
        try:
            frag, _ = await self._read_sdp(request, TRICKLE_TYPE, kind)
            res = self._find(kind, stream, rid)
            match = request.headers.get("if-match")
            if match is None:  # RFC 9725 4.3.1: "428 Precondition Required" for a missing entity-tag
                raise OfferRefused("etag_missing", "a PATCH needs If-Match: the ETag of the session's 201 "
                                   "(RFC 9725 4.3.1)", 428)
            if match.strip() != "*" and match.strip() != res.etag:
                raise OfferRefused("etag_mismatch", "If-Match does not match this session's ETag", 412)
            lines = [line.strip() for line in frag.splitlines() if line.strip()]
            if match.strip() == "*" or any(line.startswith(("a=ice-ufrag:", "a=ice-pwd:"))
                                                                  and line not in self._offer_ice(res)
                                                                  for line in lines):
                raise OfferRefused("ice_restart_unsupported", "ICE restarts are not supported: start a new "
                                   "session (trickle ICE candidates are)", 422)
            candidates, mid = [], None
            for line in lines:
                if line.startswith("a=mid:"):
                    mid = line[6:]
                elif line.startswith("a=candidate:"):
                    if len(candidates) >= MAX_CANDIDATES or len(line) > 1024:
                        raise OfferRefused("bad_candidate", f"at most {MAX_CANDIDATES} candidates of 1 KB")
                    try:
                        candidate = candidate_from_sdp(line[len("a=candidate:"):])
                    except Exception:  # noqa: BLE001
                        raise OfferRefused("bad_candidate", f"a candidate does not parse: {line[:80]}") from None
                    candidate.sdpMid = mid
                    if mid is None:
                        candidate.sdpMLineIndex = 0
                    if candidate.ip.lower().endswith(".local"):
                        # an mDNS name (a browser's hidden host address): a server cannot resolve it
                        # (aiortc tried for a second per candidate); RFC 9725 4.3.2: a session "not
                        # able to resolve the connection address ... MUST silently discard the
                        # candidate". The browser's checks still reach us (peer-reflexive).
                        continue
                    candidates.append(candidate)
        except OfferRefused as exc:
            return self._refused(exc, origin)
        for candidate in candidates:
            try:
                await res.pc.addIceCandidate(candidate)
            except Exception as exc:  # noqa: BLE001 - one bad candidate is the client's loss only
                log.info("%s %s: a candidate was not added: %s", kind.upper(), rid[:6], exc)
        # RFC 9725 4.3.2: a trickle PATCH's 204 "MUST NOT include an ETag header"
        return Response(status_code=204, headers=self._headers(origin=origin))

    async def _events(self, request, stream: str, rid: str):
        """A viewer's event stream (text/event-stream, the WHEP server-sent events extension):
        `active` at once while its stream runs, `inactive` (with the reason) the moment the
        publisher or the stream ends, then the stream closes. EventSource cannot send a header, so
        the session URL, a 128-bit random name only its viewer knows, is the credential (as for
        its DELETE by an RFC 9725 client's session URL). A POST (the draft's subscription, a JSON
        list of events) is answered 201 with this URL as its Location."""
        from fastapi.responses import Response, StreamingResponse

        origin = request.headers.get("origin")
        try:
            res = self._find("whep", stream, rid)
        except OfferRefused as exc:
            return self._refused(exc, origin)
        if request.method == "POST":
            return Response(status_code=201, headers=self._headers({"Location": f"{res.location}/sse"}, origin))
        queue: asyncio.Queue = asyncio.Queue()
        res.listeners.append(queue)
        queue.put_nowait(("active", {"stream": res.name}))

        async def lines():
            try:
                while True:
                    try:
                        item = await asyncio.wait_for(queue.get(), SSE_KEEPALIVE_S)
                    except asyncio.TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if item is None:
                        return
                    name, data = item
                    yield f"event: {name}\ndata: {json.dumps(data)}\n\n"
            finally:
                if queue in res.listeners:
                    res.listeners.remove(queue)

        return StreamingResponse(lines(), media_type="text/event-stream", headers=self._headers(
            {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}, origin))

    @staticmethod
    def _offer_ice(res: _Resource) -> set[str]:
        """The offer's ICE credentials (what a trickle PATCH repeats; others mean an ICE restart)."""
        sdp = res.pc.remoteDescription.sdp if res.pc.remoteDescription else ""
        return {line.strip() for line in sdp.splitlines() if line.startswith(("a=ice-ufrag:", "a=ice-pwd:"))}

    # ------------------------------------------------------------------ status
    def _count(self, kind: str) -> int:
        return sum(r.kind == kind for r in list(self.resources.values()))

    def status(self) -> dict:
        return {"publishers": sum(r.kind == "whip" for r in self.resources.values()),
                "viewers": sum(r.kind == "whep" for r in self.resources.values()),
                "streams": {sid: b.stats() for sid, b in self.broadcasters.items()}}

    async def close(self) -> None:
        for res in list(self.resources.values()):
            await self.end(res, "server stopping")
        for b in self.broadcasters.values():
            b.close()
        self.broadcasters.clear()


def whep_path(sid: str) -> str:
    return f"/whep/{sid}"
