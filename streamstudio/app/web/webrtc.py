"""fastrtc WebRTC streams: the live handler, the plain `/webrtc/offer` endpoint with per-stream
settings, TURN settings from the environment, and a small aiortc client for scripts.

fastrtc calls the handler on the event loop with each received frame (BGR). The handler
never waits on inference: it hands the frame to the stream's session (RGB) and returns the
session's latest output (back to BGR) at once. That handler is the one place where frames
change colour order (`swap_rb`): everything behind it is RGB.

Endpoints (same server as the UI; under --auth, HTTP basic auth or the UI's login):
    POST   /webrtc/offer                {sdp, type: "offer", webrtc_id}  -> {sdp, type: "answer"}
    POST   /studio/settings/{webrtc_id} {prompt, strength, seed, ...}    -> {status, settings}
    GET    /studio/sessions/{webrtc_id}                                  -> live stats
    DELETE /studio/sessions/{webrtc_id}                                  -> frees the stream
    GET    /studio/status                                                -> model, streams in use
    GET    /studio/lora                                                  -> the loaded LoRAs and their scales
    POST   /studio/lora                 {scales: {name or source: scale}} -> every stream's LoRA scales
Offers are checked before they take a stream (400 and a reason otherwise); a connection that
never connects or never sends a frame holds its stream for at most PENDING_TIMEOUT seconds.
The client must open a data channel (any label; fastrtc waits for one) before its offer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable
from unittest import mock
import json

import numpy as np
from fastapi import Body as JsonBody
from fastapi import Request
from fastapi.responses import JSONResponse

from streamstudio.app.web.security import peer
from streamstudio.app.web.sessions import BusyError, Pending, SessionManager, StreamSession, pending_from
from streamstudio.app.settings import settings_from_ui
from streamstudio.errors import StreamStudioError
from streamstudio.app.web import ice
from streamstudio.app.web.ice import IceScopeMiddleware
from streamstudio.app.web.rtp_receive import receive_video_without_delay

if TYPE_CHECKING:  # (fastrtc and aiortc load with the web app's streams)
    from aiortc import RTCPeerConnection
    from fastrtc.webrtc_connection_mixin import WebRTCConnectionMixin as _FastRTC
else:
    _FastRTC = object

log = logging.getLogger(__name__)

TURN_ENV = ("STREAMSTUDIO_TURN_URLS", "STREAMSTUDIO_TURN_USERNAME", "STREAMSTUDIO_TURN_CREDENTIAL",
            "STREAMSTUDIO_STUN_URLS")


def rtc_config_from_env(environ=None) -> dict[str, Any]:
    """ICE servers from STREAMSTUDIO_STUN_URLS / STREAMSTUDIO_TURN_URLS (comma-separated) with
    STREAMSTUDIO_TURN_USERNAME and STREAMSTUDIO_TURN_CREDENTIAL. Without them: no ICE servers
    (host candidates only: same machine or LAN)."""
    env = os.environ if environ is None else environ
    servers: list[dict[str, Any]] = []
    stun = [u.strip() for u in env.get("STREAMSTUDIO_STUN_URLS", "").split(",") if u.strip()]
    if stun:
        servers.append({"urls": stun})
    turn = [u.strip() for u in env.get("STREAMSTUDIO_TURN_URLS", "").split(",") if u.strip()]
    if turn:
        user, cred = env.get("STREAMSTUDIO_TURN_USERNAME"), env.get("STREAMSTUDIO_TURN_CREDENTIAL")
        if not user or not cred:
            raise StreamStudioError("STREAMSTUDIO_TURN_URLS is set: also set STREAMSTUDIO_TURN_USERNAME and "
                                    "STREAMSTUDIO_TURN_CREDENTIAL")
        servers.append({"urls": turn, "username": user, "credential": cred})
    return {"iceServers": servers}


def explicit_rtc_config(rtc_config: dict | None) -> dict[str, Any]:
    """`rtc_config`, or no ICE servers when it is None: fastrtc hands None on to aiortc, whose
    RTCPeerConnection then asks a public STUN server (stun.l.google.com) for every connection."""
    return {"iceServers": []} if rtc_config is None else rtc_config


def current_webrtc_id() -> str:
    from fastrtc.utils import get_current_context

    return get_current_context().webrtc_id


def swap_rb(frame: np.ndarray) -> np.ndarray:
    """BGR <-> RGB (fastrtc's colour order <-> StreamStudio's), contiguous."""
    return np.ascontiguousarray(frame[:, :, ::-1])


class LiveHandler:
    """The fastrtc video handler: `handler(frame_bgr, *ui_values) -> frame_bgr` at once."""

    def __init__(self, manager: SessionManager, arg_keys: tuple[str, ...] = (),
                 webrtc_id: Callable[[], str] = current_webrtc_id):
        from fastrtc import CloseStream

        self._close = CloseStream
        self.manager, self.arg_keys, self._webrtc_id = manager, arg_keys, webrtc_id
        w, h = manager.model.size
        self._waiting = np.zeros((h, w, 3), np.uint8)  # shown until the first output
        self._ui_values: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # session -> last UI values

    def __call__(self, frame: np.ndarray, *args):
        sid = self._webrtc_id()
        try:
            session = self.manager.open(sid)
        except BusyError as exc:
            return self._close(str(exc))
        if session.error:
            return self._close(f"the stream stopped: {session.error}")
        if args:
            self._settings_from_ui(session, args)
        session.submit(swap_rb(frame))
        out = session.latest()
        return self._waiting if out is None else swap_rb(out)

    def _settings_from_ui(self, session: StreamSession, args) -> None:
        values = tuple(args[:len(self.arg_keys)])
        if self._ui_values.get(session) == values:
            return
        self._ui_values[session] = values
        try:
            self.manager.settings(session.sid, settings_from_ui(self.arg_keys, values))
        except StreamStudioError as exc:
            session.refused(exc)


MAX_SDP_BYTES = 32 * 1024  # a browser's offer is 3-10 KB
MAX_OFFER_BODY = 64 * 1024
MAX_MEDIA = 8  # m= sections in one offer
MAX_CANDIDATES = 64  # a=candidate lines in one offer: each one is an address the server probes
# Seconds a connection may hold a stream slot without a session (not connected, or no frame yet):
# a browser or OBS connects and sends its first frame well within 2 s on a LAN.
PENDING_TIMEOUT = 8.0
WEBRTC_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
OFFER_KINDS = ("video", "application")  # the webcam track and the data channel fastrtc waits for


class OfferRefused(StreamStudioError):
    """An offer the server will not take: `code` names the check, the message says why."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.status = code, status

    def response(self):
        return JSONResponse({"status": "failed", "meta": {"error": self.code, "message": str(self)}},
                            status_code=self.status)


def check_webrtc_id(webrtc_id) -> str:
    if not isinstance(webrtc_id, str) or not WEBRTC_ID.fullmatch(webrtc_id):
        raise OfferRefused("bad_webrtc_id", "webrtc_id must be 1 to 64 letters, digits, '-' or '_'")
    return webrtc_id


def check_offer_sdp(sdp, kinds: tuple[str, ...] = OFFER_KINDS, rtcp_mux_kinds: tuple[str, ...] = ("video",)):
    """Refuse an offer SDP that could not make a working stream, before it takes a slot; returns
    it parsed. kinds: the m= sections taken (the WebRTC endpoint's: video and the data channel
    fastrtc waits for; WHIP/WHEP's: video and audio); rtcp_mux_kinds: those that must mux RTCP."""
    from aiortc.sdp import SessionDescription

    if not isinstance(sdp, str) or not sdp.strip():
        raise OfferRefused("bad_sdp", "sdp must be the offer's SDP text")
    if len(sdp.encode("utf-8", "replace")) > MAX_SDP_BYTES:
        raise OfferRefused("sdp_too_large", f"the SDP is larger than {MAX_SDP_BYTES // 1024} KB")
    if not sdp.lstrip().startswith("v=0"):
        raise OfferRefused("bad_sdp", "the SDP must start with v=0")
    if sum(line.startswith("a=candidate:") for line in sdp.splitlines()) > MAX_CANDIDATES:
        raise OfferRefused("bad_sdp", f"the SDP has more than {MAX_CANDIDATES} ICE candidates")
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # noqa: BLE001 - aiortc's parser raises whatever a bad line trips over
        raise OfferRefused("bad_sdp", f"the SDP does not parse ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not parsed.media:
        raise OfferRefused("bad_sdp", "the SDP has no m= line")
    if len(parsed.media) > MAX_MEDIA:
        raise OfferRefused("bad_sdp", f"the SDP has more than {MAX_MEDIA} m= lines")
    taken = " and ".join(k if k != "application" else "a data channel" for k in kinds)
    for i, media in enumerate(parsed.media):
        if media.kind not in kinds:
            raise OfferRefused("bad_sdp", f"m= line {i} is {media.kind!r}: only {taken} are taken")
        if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
            raise OfferRefused("bad_sdp", f"m= line {i} has no a=ice-ufrag and a=ice-pwd")
        if media.dtls is None or not media.dtls.fingerprints:
            raise OfferRefused("bad_sdp", f"m= line {i} has no a=fingerprint")
        if media.kind in rtcp_mux_kinds and not media.rtcp_mux:
            raise OfferRefused("bad_sdp", f"m= line {i} has no a=rtcp-mux")
    if not any(media.kind == "video" for media in parsed.media):
        raise OfferRefused("bad_sdp", "the SDP has no video m= line")
    return parsed


def check_offer(data) -> None:
    """The JSON body of POST /webrtc/offer: {sdp, type: "offer", webrtc_id}."""
    if not isinstance(data, dict):
        raise OfferRefused("bad_request", "send a JSON object {sdp, type, webrtc_id}")
    check_webrtc_id(data.get("webrtc_id"))
    if data.get("type") == "ice-candidate":  # fastrtc's trickle ICE for a connection already made
        candidate = data.get("candidate")
        if not isinstance(candidate, dict) or not isinstance(candidate.get("candidate", ""), str) \
                or len(candidate.get("candidate", "")) > 1024:
            raise OfferRefused("bad_candidate", "candidate must be {candidate: str, sdpMid, sdpMLineIndex}")
        return
    if data.get("type") != "offer":
        raise OfferRefused("bad_type", f'type must be "offer", not {str(data.get("type"))[:20]!r}')
    parsed = check_offer_sdp(data.get("sdp"))
    # The stream takes the camera's frames and sends its output back. A recvonly offer (with a
    # data channel) once left fastrtc polling for a track that never came, for ever.
    for media in parsed.media:
        if media.kind == "video" and (media.direction or "sendrecv") != "sendrecv":
            raise OfferRefused("bad_direction", f"the video m= line is {media.direction}: it must be sendrecv (the "
                                                "stream takes your camera's frames and sends its output back)")


def take_connection(manager: SessionManager, takes_slot: bool = True) -> None:
    """Count a new connection against its source address's rate (`security.SourceRate`) and,
    one that takes a stream slot (not a WHEP viewer), against the connections that address holds
    without a stream yet (`sessions.pending_from`); OfferRefused (429) past either."""
    source = peer()
    if takes_slot and source is not None and pending_from(manager, source) >= manager.max_pending_per_source:
        raise OfferRefused("too_many_pending", f"your address has {manager.max_pending_per_source} connection(s) "
                           "that have not started streaming yet, the most one address may hold "
                           "(--max-pending-per-source); start streaming on one or wait for it to time out", 429)
    wait = manager.offer_rate.take(source)
    if wait is not None:
        raise OfferRefused("too_many_offers", manager.offer_rate.refusal_words(wait), 429)


async def make_room(manager: SessionManager, source: str | None, full: bool) -> None:
    """Keep connections that never stream from holding the server: at most `manager.max_pending`
    connections of every address together may hold a slot without streaming. When the server is
    `full` or at that cap, a new connection from `source` ends the pending connection of another
    address that made the most connections this minute (the oldest of those), if it made at least
    as many as `source`: twenty addresses offering without end cannot keep out a publisher that
    offers once. OfferRefused 503 when the cap is reached and no pending connection may go."""
    pending = manager.pending_connections()
    at_cap = len(pending) >= manager.max_pending
    if not full and not at_cap:
        return
    rate = manager.offer_rate
    others = [p for p in pending if p.source != source]
    victim = max(others, key=lambda p: (rate.recent(p.source), -p.since), default=None)
    if victim is not None and rate.recent(victim.source) >= rate.recent(source):
        log.info("a connection from %s that has not streamed for %.1f s ends to make room for one from %s",
                 victim.source, time.monotonic() - victim.since, source)
        await victim.drop()
    elif at_cap:
        raise OfferRefused("busy", f"{len(pending)} connection(s) are starting up, the most the server holds at "
                                   "once (--max-pending); try again in a few seconds", 503)


class GuardedOffers(_FastRTC):
    """What both fastrtc front ends of the server share (the `Stream` behind POST /webrtc/offer
    and the Live tab's `WebRTC` component, both fastrtc's WebRTCConnectionMixin): offers checked
    before they take a slot, every failure freeing what fastrtc registered, a bounded wait for
    connections, ICE on the bound address, and the session freed with its connection.
    `guard()` sets them up, once the fastrtc object is made."""

    manager: SessionManager
    ice_addresses: tuple[str, ...] | None
    pending_timeout: float

    def guard(self, manager: SessionManager, host: str | None, pending_timeout: float = PENDING_TIMEOUT,
              kind: str = "webrtc_offer"):
        """Take offers for `manager`'s streams, with ICE on `host`'s addresses; returns self.
        `kind` names its connections in /studio/status (`SessionManager.peer_counters`)."""
        ice.install()
        self.manager, self.ice_addresses = manager, ice.ice_addresses(host)
        self.pending_timeout = pending_timeout
        self.sources: dict[str, tuple[str | None, float]] = {}  # webrtc_id -> (its offer's address, time)
        manager.pending_lists.append(self.pending_connections)
        manager.peer_counters[kind] = lambda: len(self.pcs)
        return self

    async def guarded_offer(self, data: dict, answer: Callable[[], Any]):
        """Check `data` ({sdp, type, webrtc_id}), then `await answer()` (fastrtc's own offer)."""
        from aiortc.exceptions import InvalidAccessError, InvalidStateError

        manager = self.manager
        try:
            check_offer(data)
            webrtc_id = data["webrtc_id"]
            if data.get("type") == "ice-candidate":
                if webrtc_id not in self.pcs:
                    raise OfferRefused("unknown_connection", f"no connection {webrtc_id!r}", 404)
                with ice.scoped(self.ice_addresses):
                    return await answer()
            if webrtc_id in self.pcs or webrtc_id in self.connections or manager.get(webrtc_id) is not None:
                # (a running stream of another front end, e.g. a WHIP publisher: its frames must not mix)
                raise OfferRefused("connection_already_exists", f"a connection {webrtc_id!r} is already open", 409)
            take_connection(manager)
            self.sources = {k: v for k, v in self.sources.items() if k in self.pcs}
            await make_room(manager, peer(), self.slots_in_use() >= manager.max_streams or not manager.has_capacity())
            self.sources[webrtc_id] = (peer(), time.monotonic())
        except OfferRefused as exc:
            return exc.response()
        if self.slots_in_use() >= manager.max_streams or not manager.has_capacity():
            return JSONResponse({"status": "failed", "meta": {
                "error": "concurrency_limit_reached", "limit": manager.max_streams,
                "message": manager.busy_message()}})
        try:
            with ice.scoped(self.ice_addresses):
                result = await answer()
            receive_video_without_delay(self.pcs.get(webrtc_id))  # decoded at each frame's last packet
            return result
        except (ValueError, InvalidStateError, InvalidAccessError) as exc:  # aiortc refused it
            await self.free(webrtc_id, self.pcs.get(webrtc_id))
            return OfferRefused("offer_refused", f"the offer was refused: {str(exc)[:200]}").response()
        except BaseException as exc:
            await self.free(webrtc_id, self.pcs.get(webrtc_id))
            if not isinstance(exc, Exception):
                raise
            log.exception("offer %s failed", webrtc_id)
            return OfferRefused("internal_error", f"the server could not answer the offer: "
                                f"{type(exc).__name__}", 500).response()

    def slots_in_use(self) -> int:
        """Streams held: sessions (from any front end) and these peer connections, each id once
        (a connection gets its session at its first frame)."""
        return len(set(self.manager.ids()) | set(self.pcs))

    def pending(self) -> list[str]:
        """Connections that have no session: not connected yet, or no frame yet."""
        return [sid for sid in list(self.pcs) if self.manager.get(sid) is None]

    def pending_connections(self) -> list[Pending]:
        """`pending` as `sessions.Pending`s, for the server's cap on them (`make_room`)."""
        out = []
        for sid in self.pending():
            source, since = self.sources.get(sid, (None, 0.0))
            pc = self.pcs.get(sid)
            out.append(Pending(source, since, functools.partial(self.free, sid, pc)))
        return out

    async def connection_timeout(self, pc: RTCPeerConnection, webrtc_id: str, time_limit: float) -> None:
        # fastrtc starts this (time_limit 30) once the remote description is set, and closes
        # a connection not up by then. This one watches the connection for its whole life: one
        # without a session (never connected, or no frame yet) for `pending_timeout` seconds is
        # closed and its slot freed; one whose session ended (reaped as idle: the client stopped
        # sending) at once, so a stalled client holds its slot for --idle-timeout, not that plus
        # `pending_timeout` (about 40 s instead of the documented 20). It never touches a newer
        # connection under the same id. Offers that fail before it starts are freed in `guarded_offer`.
        loop = asyncio.get_running_loop()
        seen, had_session = loop.time(), False
        while self.pcs.get(webrtc_id) is pc and pc.connectionState not in ("closed", "failed"):
            now = loop.time()
            if self.manager.get(webrtc_id) is not None:
                seen, had_session = now, True
            elif had_session or now - seen >= self.pending_timeout:
                log.info("WebRTC connection %s (%s) %s: freeing its slot", webrtc_id, pc.connectionState,
                         "has lost its stream" if had_session
                         else f"has had no stream for {self.pending_timeout:.0f} s")
                await self.free(webrtc_id, pc)
                return
            await asyncio.sleep(min(0.5, self.pending_timeout / 5))

    async def free(self, webrtc_id: str, pc) -> None:
        """Close `pc` and drop what fastrtc registered for `webrtc_id` (if still pc's)."""
        if pc is not None:
            try:
                await pc.close()
            except Exception:  # closing a half-made connection
                log.debug("closing %s", webrtc_id, exc_info=True)
        if pc is None or self.pcs.get(webrtc_id, pc) is pc:
            for conn in self.clean_up(webrtc_id) or ():
                try:
                    conn.stop()
                except Exception:
                    log.debug("stopping %s", webrtc_id, exc_info=True)
            self.pcs.pop(webrtc_id, None)

    def clean_up(self, webrtc_id: str):
        self.manager.close(webrtc_id, wait=0.0)
        return super().clean_up(webrtc_id)


def build_stream(manager: SessionManager, rtc_config: dict | None = None, host: str | None = None,
                 pending_timeout: float = PENDING_TIMEOUT):
    """The fastrtc Stream behind POST /webrtc/offer (non-browser clients).

    `host` is the address the HTTP server binds (None: its default, 127.0.0.1): the stream's peer
    connections gather ICE candidates and open UDP sockets there only (0.0.0.0 / ::: every
    interface); see streamstudio.app.web.ice. A connection that has no session for `pending_timeout`
    seconds (never connected, no frame yet, or its session reaped as idle) is closed and its
    slot freed."""
    from fastrtc import Stream
    from fastrtc.stream import Body

    class StudioStream(GuardedOffers, Stream):
        """fastrtc's Stream with GuardedOffers' checks."""

        async def offer(self, body: Body):
            answer = await self.guarded_offer(body.model_dump(), lambda: Stream.offer(self, body))
            if isinstance(answer, dict) and body.type == "offer" and body.webrtc_id in self.pcs:
                self.set_input(body.webrtc_id, None)  # start calling the handler (no UI inputs here)
            return answer

        offer.__annotations__["body"] = Body  # resolved here: this module has lazy annotations

    rtc_config = explicit_rtc_config(rtc_config)
    stream = StudioStream(LiveHandler(manager), mode="send-receive", modality="video",
                          concurrency_limit=manager.max_streams, rtc_configuration=rtc_config,
                          server_rtc_configuration=rtc_config, verbose=False)
    return stream.guard(manager, host, pending_timeout)


def page_session() -> str | None:
    """The Gradio session hash of the page whose event is running (None outside an event)."""
    from gradio.context import LocalContext

    return getattr(LocalContext.request.get(None), "session_hash", None)


def may_control(manager: SessionManager, sid: str | None, page: str | None, operator: bool = False) -> bool:
    """Whether `page` (a Gradio session hash) may record, push or steer stream `sid`: the page
    that owns it (`SessionManager.claim`), or a logged-in operator (`serve --auth`)."""
    if not sid:
        return False
    owner = manager.owner(sid)
    return operator or (owner is not None and owner == page)


def operator(request) -> bool:
    """Whether `request` comes from a logged-in user (`serve --auth`)."""
    return bool(getattr(request, "username", None))


def live_component(manager: SessionManager, host: str | None, pending_timeout: float = PENDING_TIMEOUT, **kwargs):
    """The Live tab's fastrtc WebRTC component with GuardedOffers' checks on its offer route
    (Gradio's /gradio_api/component_server, fn_name "offer")."""
    return _studio_webrtc_class()(**kwargs).guard(manager, host, pending_timeout, kind="live_tab")


@functools.cache
def _studio_webrtc_class():
    from fastrtc import WebRTC
    from gradio.components.base import server

    # Gradio's component metaclass writes a .pyi stub beside the module of every Component
    # subclass it creates (for custom-component authors); this class needs none.
    with mock.patch("gradio.component_meta.create_or_modify_pyi", lambda *args: None):
        class StudioWebRTC(GuardedOffers, WebRTC):
            # The page must load fastrtc's own front-end code for it: same name, same class id.
            def get_block_name(self) -> str:
                return WebRTC.get_block_name(self)

            @classmethod
            def get_component_class_id(cls) -> str:
                return WebRTC.get_component_class_id()

            def set_input_gradio(self, webrtc_data, *args):
                """The page's inputs (prompt, sliders) for its stream; the first page to send
                them owns the stream, and another page's inputs for it are dropped. Only a
                connection that exists is claimed (no squatting on an id before its page connects)."""
                sid = getattr(webrtc_data, "webrtc_id", webrtc_data)
                if isinstance(sid, str) and sid in self.pcs and not self.manager.claim(sid, page_session()):
                    log.info("inputs for stream %s from a page that does not own it: dropped", sid)
                    return
                return super().set_input_gradio(webrtc_data, *args)

            @server
            async def offer(self, body):
                if not isinstance(body, dict):
                    return OfferRefused("bad_request", "send a JSON object {sdp, type, webrtc_id}").response()
                return await self.guarded_offer(
                    body, lambda: self.handle_offer(body, self.set_additional_outputs(body["webrtc_id"])))

    return StudioWebRTC


def mount_api(app, manager: SessionManager, stream) -> None:
    """POST /webrtc/offer and the /studio JSON routes on `app` (FastAPI). Every request of `app`
    runs in the stream's ICE scope, so the Gradio WebRTC component's peer connections gather on
    the bound address too (streamstudio.app.web.ice). The login these routes need under --auth is
    the request guard's (streamstudio.app.web.security), as for every route of the server."""
    from fastrtc.stream import Body

    app.state.studio_stream = stream
    if hasattr(stream, "ice_addresses"):
        app.add_middleware(IceScopeMiddleware, addresses=stream.ice_addresses)

    async def offer(request: Request):
        try:
            data = await read_json(request, MAX_OFFER_BODY)
            check_offer(data)
            body = Body(**{k: data.get(k) for k in ("sdp", "candidate", "type", "webrtc_id")})
        except OfferRefused as exc:
            return exc.response()
        return await stream.offer(body)

    offer.__annotations__["request"] = Request  # resolved here: this module has lazy annotations
    app.post("/webrtc/offer", tags=["webrtc"])(offer)

    @app.get("/studio/status", tags=["studio"])
    async def status():
        return status_payload(manager, stream)

    @app.post("/studio/settings/{webrtc_id}", tags=["studio"])
    async def settings(webrtc_id: str, raw: dict = JsonBody(...)):
        try:
            applied = manager.settings(webrtc_id, raw)
        except StreamStudioError as exc:
            return JSONResponse({"status": "failed", "error": str(exc)}, status_code=400)
        return {"status": "ok", "settings": applied}

    @app.get("/studio/sessions/{webrtc_id}", tags=["studio"])
    async def session_stats(webrtc_id: str):
        session = manager.get(webrtc_id)
        if session is None:
            return JSONResponse({"status": "failed", "error": f"no stream {webrtc_id!r}"}, status_code=404)
        return session.stats()

    @app.get("/studio/lora", tags=["studio"])
    async def lora():
        return {"loras": lora_payload(manager.model.lora_listing())}

    @app.post("/studio/lora", tags=["studio"])
    async def set_lora(raw: dict = JsonBody(...)):
        """Server-wide: the LoRAs are fused into the shared weights, so their scales are every
        stream's. Applied between frames (the model guard's exclusive context)."""
        scales = raw.get("scales") if isinstance(raw, dict) else None
        try:
            listing = await asyncio.to_thread(manager.set_lora_scales, scales)
        except StreamStudioError as exc:
            return JSONResponse({"status": "failed", "error": str(exc)}, status_code=400)
        return {"status": "ok", "loras": lora_payload(listing)}

    @app.delete("/studio/sessions/{webrtc_id}", tags=["studio"])
    async def close_session(webrtc_id: str):
        return {"status": "ok", "closed": manager.close(webrtc_id, wait=0.0)}


def lora_payload(listing) -> list[dict]:
    return [{"source": source, "scale": scale} for source, scale in listing]


async def read_json(request, limit: int):
    """The request's JSON body, refused past `limit` bytes without reading further."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise OfferRefused("body_too_large", f"the request body is larger than {limit // 1024} KB")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise OfferRefused("body_too_large", f"the request body is larger than {limit // 1024} KB")
    try:
        return json.loads(raw)
    except ValueError:
        raise OfferRefused("bad_request", "the body must be JSON: {sdp, type, webrtc_id}") from None


def status_payload(manager: SessionManager, stream=None) -> dict:
    """`streams`: sessions running (any front end); `fps` and `frames_out`: their output frame
    rates together and the frames they have put out (their runners' metrics); `connections`: the
    WebRTC peer connections by kind (webrtc_offer, live_tab, whip, whep) and `peer_connections`
    all of them; `pending`: the connections holding a slot without a stream yet (not connected,
    or no frame; every front end's); `in_use`: the streams /webrtc/offer's connections and the
    sessions take together, what `max_streams` is checked against."""
    model = manager.model
    metrics = [s.metrics() for s in map(manager.get, manager.ids()) if s is not None]
    out = {"model": model.name, "demo": model.is_demo, "size": list(model.size),
           "max_streams": manager.max_streams, "streams": len(manager),
           "fps": round(sum(m.recent_fps for m in metrics), 2), "frames_out": sum(m.frames_out for m in metrics)}
    counts = {kind: count() for kind, count in manager.peer_counters.items()}
    out.update(connections=counts, peer_connections=sum(counts.values()), pending=len(manager.pending_connections()))
    if stream is not None:
        out.update(in_use=stream.slots_in_use())
    if (replicas := manager.placement.stats()) is not None:  # serve --gpus / --cluster: each replica's load, health
        out["replicas"] = replicas
    update = getattr(manager.placement, "update", None)
    if update is not None:  # serve --cluster: the rolling update's progress
        out["update"] = update.state()
    return out
