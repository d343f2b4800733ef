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

Fan-out: app/web/fanout.py (one encoder per codec a stream, shared by its viewers).

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
import json
import logging
import secrets
from typing import Callable

from fastapi import Request
from fastapi.responses import Response

from streamstudio.app.web.security import Credentials, peer
from streamstudio.app.web.sessions import BusyError, SessionManager
from streamstudio.app.web.webrtc import (
    MAX_SDP_BYTES,
    PENDING_TIMEOUT,
    WEBRTC_ID,
    OfferRefused,
    make_room,
    take_connection,
)
from streamstudio.app.web.whip_sdp import (
    check_sdp,
    etag,
    rtc_configuration,
    trickle_candidates,
)
from streamstudio.app.web.whip_sessions import Resource, WhipSessions, end_orphans
from streamstudio.errors import StreamStudioError
from streamstudio.app.web import ice

log = logging.getLogger(__name__)

SDP_TYPE = "application/sdp"
TRICKLE_TYPE = "application/trickle-ice-sdpfrag"
MAX_VIEWERS = 32  # WHEP viewers on the server, all streams together (--max-viewers)
MAX_VIEWERS_PER_SOURCE = 8  # WHEP viewers one client address may hold (--max-viewers-per-source)
# The WHEP server-sent events extension (draft-ietf-wish-whep): a viewer's event stream, linked from
# its 201, tells it when its stream ends (a player otherwise notices 6-16 s later, by ICE).
SSE_REL = "urn:ietf:params:whep:ext:core:server-sent-events"
SSE_EVENTS = ("active", "inactive")
SSE_KEEPALIVE_S = 15.0




class WhipServer:
    """The WHIP and WHEP endpoints of one server (see the module docstring)."""

    def __init__(self, manager: SessionManager, host: str | None = None, credentials: Credentials | None = None,
                 rtc_config: dict | None = None,
                 pending_timeout: float = PENDING_TIMEOUT, max_viewers: int = MAX_VIEWERS,
                 other_slots: Callable[[], set] = set, max_viewers_per_source: int = MAX_VIEWERS_PER_SOURCE,
                 cors_origins: tuple[str, ...] = ()):
        if max_viewers < 0:
            raise StreamStudioError("--max-viewers must be 0 or more")
        ice.install()
        self.manager, self.credentials = manager, credentials or Credentials()
        self.ice_addresses = ice.ice_addresses(host)
        self.rtc_config = rtc_config
        self.cors_origins = tuple(cors_origins)  # --whip-cors: pages allowed without a login
        self.sessions = WhipSessions(manager, pending_timeout, max_viewers, max_viewers_per_source, other_slots)

    @property
    def resources(self) -> dict[str, Resource]:
        return self.sessions.resources

    @property
    def broadcasters(self) -> dict:
        return self.sessions.broadcasters

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
        origin = request.headers.get("origin")
        if rid is not None:
            kind = request.url.path.strip("/").split("/")[0]
            try:
                self.sessions.find(kind, stream, rid)
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
        app.router.on_shutdown.append(self.sessions.close)  # peer connections closed with the server

    # ------------------------------------------------------------------ POST
    async def _post(self, kind: str, request, stream: str | None):
        origin = request.headers.get("origin")
        try:
            sdp, who = await self._read_sdp(request, SDP_TYPE, kind)
            if stream is not None and not WEBRTC_ID.fullmatch(stream):
                raise OfferRefused("bad_stream", "the stream name must be 1 to 64 letters, digits, '-' or '_'")
            check_sdp(sdp, kind)
            sid = stream or secrets.token_hex(8)
            old = None  # the publisher a new one replaces (a reconnect: same name, valid login)
            if kind == "whip":
                await end_orphans(self.sessions, sid)  # publishers of a stream that ended hold its name no longer
                old = self.sessions.publisher(sid)
                if old is None:
                    self.sessions.check_in_use(sid)
                else:
                    self.sessions.check_replace(old, who)
            else:
                sid = self.sessions.check_view(sid, peer())
            take_connection(self.manager, takes_slot=kind == "whip" and old is None)
            if kind == "whip" and old is None:
                await make_room(self.manager, peer(), self.sessions.full())
                if self.sessions.full():
                    raise OfferRefused("busy", self.manager.busy_message(), 503)
        except OfferRefused as exc:
            return self._refused(exc, origin)
        pc = None
        owned = kind == "whip" and old is None  # a session this POST opens (closed again if it fails)
        try:
            from aiortc import RTCPeerConnection, RTCSessionDescription

            with ice.scoped(self.ice_addresses):
                pc = RTCPeerConnection(rtc_configuration(self.rtc_config))
                res = Resource(kind, sid, pc, stream)
                res.source, res.identity = peer(), who
                if kind == "whip":  # settings set for `sid` beforehand apply now
                    session = self.manager.open(sid) if old is None else old.session
                    assert session is not None  # (a publisher's session opens with it)
                    res.session = session
                    session.named = True  # its name is the publisher's URL: no secret
                    pc.on("track", lambda track: self.sessions.on_publisher_track(res, track))
                await pc.setRemoteDescription(RTCSessionDescription(sdp, "offer"))
                if kind == "whep":
                    self.sessions.add_viewer_tracks(res)
                await pc.setLocalDescription(await pc.createAnswer())
                if kind == "whep":
                    self.sessions.bind_viewer(res)
        except BusyError as exc:
            await self.sessions.discard(pc, sid if owned else None)
            self.sessions.prune(sid)
            return self._refused(OfferRefused("busy", str(exc), 503), origin)
        except OfferRefused as exc:
            await self.sessions.discard(pc, sid if owned else None)
            self.sessions.prune(sid)
            return self._refused(exc, origin)
        except Exception as exc:  # aiortc refused the offer (bad parameters, nothing in common)
            await self.sessions.discard(pc, sid if owned else None)
            self.sessions.prune(sid)
            log.info("%s offer for %s refused: %s: %s", kind.upper(), sid, type(exc).__name__, exc)
            return self._refused(OfferRefused("offer_refused", f"the offer was refused: {type(exc).__name__}: "
                                              f"{str(exc)[:200]}"), origin)
        answer = pc.localDescription.sdp
        res.etag = etag(answer)
        if old is not None:  # the stream goes on: its session, settings and viewers stay
            for stale in [r for r in self.sessions.resources.values() if r.kind == "whip" and r.sid == sid]:
                stale.session = None  # (also one that replaced `old` meanwhile: the newest POST wins)
                await self.sessions.end(stale, "replaced by a new publisher on the same stream")
        self.sessions.resources[res.rid] = res
        pc.on("connectionstatechange", lambda: self.sessions.on_state(res))
        res.tasks.append(asyncio.ensure_future(self.sessions.watch(res)))
        log.info("%s session %s for stream %s", kind.upper(), res.rid[:6], sid)
        headers = {"Location": res.location, "ETag": res.etag, "Accept-Patch": TRICKLE_TYPE}
        if kind == "whep":  # the WHEP server-sent events extension: "inactive" when the stream ends
            headers["Link"] = f'<{res.location}/sse>; rel="{SSE_REL}"; events="{",".join(SSE_EVENTS)}"'
        return Response(answer, status_code=201, media_type=SDP_TYPE, headers=self._headers(headers, origin))









    # ------------------------------------------------------------------ WHIP: the publisher




    # ------------------------------------------------------------------ WHEP: the viewers



    # ------------------------------------------------------------------ life and end






    async def _delete(self, request, stream: str, rid: str):
        kind, origin = request.url.path.strip("/").split("/")[0], request.headers.get("origin")
        try:
            self.identity(kind, request.headers)
            res = self.sessions.find(kind, stream, rid)
        except OfferRefused as exc:
            return self._refused(exc, origin)
        await self.sessions.end(res, "DELETE")
        return Response(status_code=200, headers=self._headers(origin=origin))

    async def _patch(self, request, stream: str, rid: str):
        kind, origin = request.url.path.strip("/").split("/")[0], request.headers.get("origin")
        try:
            frag, _ = await self._read_sdp(request, TRICKLE_TYPE, kind)
            res = self.sessions.find(kind, stream, rid)
            match = request.headers.get("if-match")
            if match is None:  # RFC 9725 4.3.1: "428 Precondition Required" for a missing entity-tag
                raise OfferRefused("etag_missing", "a PATCH needs If-Match: the ETag of the session's 201 "
                                   "(RFC 9725 4.3.1)", 428)
            if match.strip() != "*" and match.strip() != res.etag:
                raise OfferRefused("etag_mismatch", "If-Match does not match this session's ETag", 412)
            candidates = trickle_candidates(frag, match.strip(), self._offer_ice(res))
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
            res = self.sessions.find("whep", stream, rid)
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
    def _offer_ice(res: Resource) -> set[str]:
        """The offer's ICE credentials (what a trickle PATCH repeats; others mean an ICE restart)."""
        sdp = res.pc.remoteDescription.sdp if res.pc.remoteDescription else ""
        return {line.strip() for line in sdp.splitlines() if line.startswith(("a=ice-ufrag:", "a=ice-pwd:"))}

    # ------------------------------------------------------------------ status




def whep_path(sid: str) -> str:
    return f"/whep/{sid}"
