"""The web server's defences against hostile and careless clients.

One ASGI middleware in front of the whole app (`RequestGuard`) and one switch on the Gradio
Blocks (`enable_gradio_path_checks`):

- **No server path leaves the machine.** Gradio checks that a file named in a request lies in
  its upload folder only once `blocks.has_launched` is true, and `gr.mount_gradio_app` never
  sets it (only `launch()` does). Without the check, a client could name any server file in an
  image argument, have Gradio copy it into its cache and download the copy.
- **A login on every route** when the server has `--auth`: a Gradio login cookie or HTTP basic
  auth, except for what the login page itself needs (its HTML, scripts, styles, `/login`).
  Gradio leaves `/monitoring/summary` and the heartbeat open, FastAPI its docs.
- **Bounded requests.** Every request body has a cap (small for the JSON API, the upload size for
  uploads); a body longer than its cap is refused with 413 before the app reads it.
- **Bounded uploads.** Uploads per client in a time window, and the bytes this server's uploads
  hold on disk in all; Gradio's `delete_cache` (set on the Blocks) removes them on a timer and
  at exit. A chunked upload streams to disk as it arrives.
- **New connections per source.** The guard notes each request's peer address (`peer()`); the
  offer routes (WebRTC, the Live tab, WHIP, WHEP) take one from that address's `SourceRate`.

A client is its peer address, never something it sends (a header, a token it makes up).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
from base64 import b64decode
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass

from streamstudio.errors import StreamStudioError

log = logging.getLogger(__name__)

UPLOAD_PATH = "/gradio_api/upload"
# Gradio routes no component of the app uses, refused: process_recording (gr.Video and gr.Audio
# webcam recordings; the app has neither) ran ffmpeg on any posted video outside every upload
# quota and left tmp*_processed.mp4 files behind that outlived the upload TTL and the server.
UNUSED_PATHS = frozenset({"/gradio_api/process_recording"})
# What the login page needs before anyone has logged in (exact paths, then prefixes).
PUBLIC_PATHS = frozenset({"/", "/login", "/login/", "/logout", "/favicon.ico", "/robots.txt", "/manifest.json",
                          "/theme.css", "/gradio_api/theme.css", "/gradio_api/login_check",
                          "/gradio_api/login_check/", "/gradio_api/token", "/gradio_api/token/",
                          "/gradio_api/app_id", "/gradio_api/app_id/"})
PUBLIC_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon")
# Request body caps by path prefix (the first that matches); everything else gets `max_body_bytes`.
SMALL_BODY_PREFIXES = ("/studio/", "/webrtc/")
SMALL_BODY_BYTES = 64 * 1024
UPLOAD_OVERHEAD_BYTES = 64 * 1024  # multipart headers and boundaries around the file

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}


def parse_size(text: str | int) -> int:
    """'20mb', '1.5GB', '512kib', '1000' -> bytes (decimal units as Gradio counts them)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    unit = (m.group(2) or "").lower() if m else None
    if m is None or unit not in _UNITS:
        raise StreamStudioError(f"{text!r} is not a size; write it like 20mb, 512kb or 1gb")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise StreamStudioError(f"size {text!r} must be above zero")
    return size


_PEER: ContextVar[str | None] = ContextVar("streamstudio_peer", default=None)


def peer() -> str | None:
    """The peer address of the HTTP request being served (set by `RequestGuard`), else None."""
    return _PEER.get()


class SourceRate:
    """At most `per_minute` new connections (WebRTC offers, WHIP and WHEP POSTs) per source
    address in any 60 s: sixteen WHIP POSTs a minute from one address, each holding a slot until
    its pending timeout, once kept 13 of 19 honest attempts busy (`serve --offers-per-minute`)."""

    def __init__(self, per_minute: int = 20, window_s: float = 60.0):
        if per_minute < 1:
            raise StreamStudioError("--offers-per-minute must be at least 1")
        self.per_minute, self.window_s = per_minute, window_s
        self._times: dict[str, deque] = {}
        self._lock = threading.Lock()

    def take(self, source: str | None) -> float | None:
        """Count a new connection from `source`: None when it may go on, else the seconds until
        it may. No source (not an HTTP request: the server's own code) is never limited."""
        if source is None:
            return None
        now = time.monotonic()
        with self._lock:
            times = self._times.setdefault(source, deque())
            while times and now - times[0] > self.window_s:
                times.popleft()
            if len(times) >= self.per_minute:
                return self.window_s - (now - times[0])
            times.append(now)
            for stale in [k for k, q in self._times.items() if not q]:
                del self._times[stale]
        return None

    def recent(self, source: str | None) -> int:
        """The connections `source` made in the last window (0 for None)."""
        if source is None:
            return 0
        now = time.monotonic()
        with self._lock:
            return sum(now - t <= self.window_s for t in self._times.get(source, ()))

    def refusal_words(self, wait: float) -> str:
        return (f"too many new connections from your address: at most {self.per_minute} a minute "
                f"(--offers-per-minute); try again in {max(1, round(wait))} s")


ANONYMOUS = ""  # the identity of a client when the door it uses needs no credential


@dataclass(frozen=True)
class Credentials:
    """Who may publish and control streams, and who may watch them.

    - **publish**: a bearer token equal to `publish_token` (`--whip-token`), or HTTP basic auth
      with it as the password (any user name: clients that only take `user:pass@host` URLs); without
      a token, `--auth`'s USER:PASS as the bearer token or as basic auth. WHIP, and every control
      route (`/studio/*`: settings, sessions, outputs, LoRA scales) when either is set.
    - **view**: the publish credential, or a bearer token equal to `view_token` (`--whep-token`),
      which opens WHEP and nothing else. Without a publish credential and a view token, viewing is
      as open as publishing.

    A credential's identity ("token", "view", "user:NAME"; ANONYMOUS on an open door) tells a
    reconnecting publisher from another client: only the same identity replaces a live publisher."""

    publish_token: str | None = None
    view_token: str | None = None
    auth: tuple[str, str] | None = None

    def __post_init__(self):
        for flag, token in (("--whip-token", self.publish_token), ("--whep-token", self.view_token)):
            if token is not None and not token.strip():
                raise StreamStudioError(f"{flag} must not be empty")
        if self.view_token is not None and self.view_token == self.publish_token:
            raise StreamStudioError("--whep-token must differ from --whip-token: a viewer could publish and control")

    @property
    def publish_required(self) -> bool:
        return self.publish_token is not None or self.auth is not None

    @property
    def view_required(self) -> bool:
        return self.publish_required or self.view_token is not None

    def publisher(self, headers) -> str | None:
        """The identity `headers` publish and control with; None when they may not."""
        if not self.publish_required:
            return ANONYMOUS
        scheme, value = _authorization(headers)
        if scheme == "bearer":
            if self.publish_token is not None:
                return "token" if _same(value, self.publish_token) else None
            assert self.auth is not None  # (publishing needs a credential: a token, or else a login)
            return f"user:{self.auth[0]}" if _same(value, f"{self.auth[0]}:{self.auth[1]}") else None
        if scheme == "basic":
            user, _, password = _basic(value)
            if self.auth is not None and _same(user, self.auth[0]) & _same(password, self.auth[1]):
                return f"user:{user}"
            if self.publish_token is not None and _same(password, self.publish_token):
                return "token"
        return None

    def viewer(self, headers) -> str | None:
        """The identity `headers` watch with; None when they may not."""
        if not self.view_required:
            return ANONYMOUS
        identity = self.publisher(headers)
        if identity is not None:
            return identity
        scheme, value = _authorization(headers)
        if self.view_token is not None and scheme in ("bearer", "basic"):
            given = value if scheme == "bearer" else _basic(value)[2]
            return "view" if _same(given, self.view_token) else None
        return None


def _authorization(headers) -> tuple[str, str]:
    """(scheme in lower case, value) of the Authorization header; ("", "") without one."""
    scheme, _, value = headers.get("authorization", "").strip().partition(" ")
    value = value.strip()
    return (scheme.lower(), value) if value else ("", "")


def _basic(value: str) -> tuple[str, str, str]:
    """HTTP basic auth's (user, ":", password); empty strings when it does not decode."""
    try:
        return b64decode(value).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return "", "", ""


def _same(given: str, expected: str) -> bool:
    return secrets.compare_digest(given.encode(), expected.encode())


@dataclass
class GuardConfig:
    """What `RequestGuard` allows."""

    auth: tuple[str, str] | None = None  # USER, PASS; None: no login
    max_upload_bytes: int = 20_000_000  # one uploaded file
    max_body_bytes: int = 8_000_000  # any other request (the webcam fallback's frames come as base64 JSON)
    uploads_per_client: int = 20  # per window
    upload_window_s: float = 600.0
    max_upload_total_bytes: int = 200_000_000  # this server's uploads on disk, all clients together
    # Routes that check their own login (WHIP/WHEP: a bearer token, as OBS sends it; app/web/whip.py):
    # the guard lets them through under --auth and still caps their bodies.
    self_auth_prefixes: tuple[str, ...] = ()
    # The control routes and the metrics: behind the publish credential when there is one
    # (`Credentials`); under --auth a login (cookie, basic) or the publish bearer token opens them.
    credentials: Credentials | None = None
    control_prefixes: tuple[str, ...] = ("/studio", "/metrics")

    def checks_own_login(self, path: str) -> bool:
        return _under(path, self.self_auth_prefixes)

    def is_control(self, path: str) -> bool:
        return self.credentials is not None and self.credentials.publish_required and \
            _under(path, self.control_prefixes)

    def body_cap(self, path: str) -> int:
        if path == UPLOAD_PATH or path == UPLOAD_PATH + "/":
            return self.max_upload_bytes + UPLOAD_OVERHEAD_BYTES
        if path.startswith(SMALL_BODY_PREFIXES):
            return SMALL_BODY_BYTES
        return self.max_body_bytes


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def enable_gradio_path_checks(blocks) -> None:
    """Turn on Gradio's own checks of the file paths a client names (see the module docstring).

    `launch()` sets these two flags; a Blocks served through `mount_gradio_app` never gets
    them, so Gradio treats every request as coming from the developer before launch. This is
    what Gradio's own reloader sets on a Blocks it swaps into a running server."""
    blocks.has_launched = True
    blocks.is_running = True


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


class RequestGuard:
    """ASGI middleware: login, body caps and upload quotas for every route of the server.

    `gradio_tokens` returns Gradio's login sessions ({cookie name: {token: user}}), read at
    request time (the Gradio app is mounted after the middleware is made)."""

    def __init__(self, app, config: GuardConfig, gradio_tokens: Callable[[], tuple[str, dict]] | None = None,
                 upload_files: Callable[[], set] | None = None):
        self.app, self.config = app, config
        self._gradio_tokens = gradio_tokens or (lambda: ("", {}))
        self._upload_files = upload_files or set
        self._uploads: dict[str, deque] = {}  # client -> times of its recent uploads
        self._reserved = 0  # bytes the uploads under way may still write (their space is taken first)
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        token = _PEER.set((scope.get("client") or ("?", 0))[0])
        try:
            return await self._guarded(scope, receive, send)
        finally:
            _PEER.reset(token)

    async def _guarded(self, scope, receive, send):
        path = scope.get("path", "")
        if path.rstrip("/") in UNUSED_PATHS:
            return await _refuse(scope, send, 404, "not found (this app does not use this Gradio route)")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.config.is_control(path):
            if self.config.credentials.publisher(headers) is None and \
                    not (self.config.auth is not None and self._logged_in(headers)):
                return await _refuse(scope, send, 401, "the control routes need the publish credential: "
                                     "Authorization: Bearer <--whip-token> (or the --auth login)",
                                     {"www-authenticate": 'Bearer realm="StreamStudio"'})
        elif self.config.auth is not None and not is_public(path) and not self.config.checks_own_login(path) \
                and not self._logged_in(headers):
            return await _refuse(scope, send, 401, "log in first (the server has --auth)",
                                 {"www-authenticate": 'Basic realm="StreamStudio"'})
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        cap = self.config.body_cap(path)
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return await _refuse(scope, send, 400, "bad Content-Length")
            if int(length) > cap:
                return await _refuse(scope, send, 413, f"request body too large ({int(length):,} bytes; "
                                                       f"at most {cap:,} here)")
        reserved = 0
        if scope["method"] == "POST" and path.rstrip("/") == UPLOAD_PATH:
            reserved = int(length) if length else cap
            refusal = self._take_upload_slot(scope, reserved)
            if refusal is not None:
                return await _refuse(scope, send, *refusal)
        try:
            if reserved and length is None:  # a chunked upload: streamed to disk as it arrives, counted
                return await _streamed_upload(self.app, scope, receive, send, cap)
            if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
                body = await _read_body(receive, cap)  # chunked, and small: read it here, up to the cap
                if body is None:
                    return await _refuse(scope, send, 413, f"request body too large (at most {cap:,} bytes here)")
                receive = _replay(body, receive)
            if scope["method"] == "GET" and path in ("", "/"):
                send = _without_third_party(send)
            return await self.app(scope, receive, send)
        finally:
            if reserved:  # the upload is on disk now (counted there) or failed
                with self._lock:
                    self._reserved -= reserved

    # ------------------------------------------------------------------ login
    def _logged_in(self, headers: dict) -> bool:
        assert self.config.auth is not None  # (asked only with serve --auth)
        user, password = self.config.auth
        basic = headers.get("authorization", "")
        if basic[:6].lower() == "basic ":
            try:
                given_user, _, given_password = b64decode(basic[6:].strip()).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            return secrets.compare_digest(given_user.encode(), user.encode()) & \
                secrets.compare_digest(given_password.encode(), password.encode())
        cookie_id, tokens = self._gradio_tokens()
        if not cookie_id:
            return False
        cookies = _cookies(headers.get("cookie", ""))
        token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
        return token is not None and token in tokens

    # ------------------------------------------------------------------ uploads
    def _take_upload_slot(self, scope, size: int) -> tuple[int, str] | None:
        """None when this upload may go on (it is counted, and `size` bytes of the total are
        reserved for it until it ends), else (status, reason). A client is its peer address: a
        header it sends (a made-up Authorization per upload) once gave it a fresh quota each time."""
        key = (scope.get("client") or ("?", 0))[0]
        now = time.monotonic()
        with self._lock:
            recent = self._uploads.setdefault(key, deque())
            while recent and now - recent[0] > self.config.upload_window_s:
                recent.popleft()
            if len(recent) >= self.config.uploads_per_client:
                wait = self.config.upload_window_s - (now - recent[0])
                return 429, (f"too many uploads: at most {self.config.uploads_per_client} per "
                             f"{self.config.upload_window_s / 60:g} minutes; try again in {wait:.0f} s")
            held = self.uploads_on_disk() + self._reserved
            if held + size > self.config.max_upload_total_bytes:
                return 507, ("the server's upload space is full; try again in a few minutes "
                             "(old uploads are removed on a timer)")
            recent.append(now)
            self._reserved += size
            for stale in [k for k, q in self._uploads.items() if not q]:
                del self._uploads[stale]
        return None

    def uploads_on_disk(self) -> int:
        total = 0
        for name in list(self._upload_files()):
            try:
                total += os.stat(name).st_size
            except OSError:
                continue
        return total


async def _streamed_upload(app, scope, receive, send, cap: int) -> None:
    """Run Gradio's upload route on a chunked body without holding it in memory: each chunk goes
    on to Gradio's multipart parser (which writes it to a file) as it arrives, counted. Past `cap`
    bytes, or when the client goes away, the body ends with the multipart parser's own error, so
    Gradio deletes the files it began; the client gets 413 (thirty concurrent chunked 19 MB
    uploads once grew the server by 1.2 GB while the guard read each one whole)."""
    from starlette.formparsers import MultiPartException

    seen, over, started = 0, False, False

    async def counted():
        nonlocal seen, over
        message = await receive()
        if message["type"] != "http.request":
            raise MultiPartException("the client went away during the upload")
        seen += len(message.get("body", b""))
        if seen > cap:
            over = True
            raise MultiPartException(f"the upload passed the maximum allowed size of {cap} bytes")
        return message

    async def guarded_send(message):
        nonlocal started
        if over:  # the route's own answer to the error above: the guard's 413 goes instead
            return
        started = True
        await send(message)

    await app(scope, counted, guarded_send)
    if over and not started:
        await _refuse(scope, send, 413, f"request body too large (at most {cap:,} bytes here)")


async def _read_body(receive, cap: int) -> bytes | None:
    """The whole request body, or None once it passes `cap` bytes."""
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client went away; the app sees an empty body
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > cap:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """`receive` that hands the app `body` once, then what the client sends next (a disconnect)."""
    sent = False

    async def wrapped():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return wrapped


def _cookies(header: str) -> dict[str, str]:
    out = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name] = value
    return out


# What Gradio's page fetches from other hosts on every load, dropped from it: a preconnect to
# Google's font servers and iframe-resizer from cdnjs (only for a page embedded in another site's
# iframe). An audience's browser asks nobody but this server (the theme's fonts: ui.theme).
THIRD_PARTY = re.compile(rb'<link\s+rel="preconnect"\s+href="https://fonts\.(?:googleapis|gstatic)\.com"[^>]*>'
                         rb'|<script\s+src="https://cdnjs\.cloudflare\.com/[^"]*"[^>]*>\s*</script>')


def _without_third_party(send: Callable[[dict], Awaitable[None]]) -> Callable[[dict], Awaitable[None]]:
    """`send` for the app's page: an HTML answer without THIRD_PARTY's tags (its length fixed)."""
    start: dict = {}
    body = bytearray()

    async def wrapped(message):
        if message["type"] == "http.response.start":
            start.update(message)
            return
        if message["type"] != "http.response.body" or not start:
            return await send(message)
        body.extend(message.get("body", b""))
        if message.get("more_body"):
            return
        headers = dict(start.get("headers", []))
        html = headers.get(b"content-type", b"").startswith(b"text/html")
        out = THIRD_PARTY.sub(b"", bytes(body)) if html else bytes(body)
        start["headers"] = [(k, str(len(out)).encode() if k == b"content-length" else v)
                            for k, v in start.get("headers", [])]
        await send(start)
        await send({"type": "http.response.body", "body": out})

    return wrapped


async def _refuse(scope, send, status: int, reason: str, headers: dict | None = None) -> None:
    """Answer an HTTP request with a JSON error, or close a websocket before accepting it."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})
        return
    body = json.dumps({"status": "failed", "error": reason}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def install(app, config: GuardConfig, blocks) -> None:
    """Put the guard in front of `app` (FastAPI, with the Gradio app mounted on it) and turn on
    Gradio's path checks on `blocks`."""
    enable_gradio_path_checks(blocks)

    found = []  # the mounted Gradio app, looked up on the first request that needs it
    gradio_app = _find_gradio_app(app)
    if gradio_app is not None:
        no_tracebacks(gradio_app)
        found.append(gradio_app)

    def gradio_tokens():
        if not found:
            gradio_app = _find_gradio_app(app)
            if gradio_app is None:
                return "", {}
            found.append(gradio_app)
        return found[0].cookie_id, found[0].tokens

    app.add_middleware(RequestGuard, config=config, gradio_tokens=gradio_tokens,
                       upload_files=lambda: blocks.upload_file_set)


def no_tracebacks(gradio_app) -> None:
    """No response carries a traceback. Gradio builds its app with debug=True, whose error page is
    the Python traceback (install paths included); a multipart body that does not open with its
    boundary raised python-multipart's parse error through Gradio's upload route as such a page.
    Now: a malformed form body is the client's HTTP 400, logged in one line; any other error is
    Starlette's plain "Internal Server Error", its traceback in the server's log once."""
    from starlette.responses import JSONResponse

    try:
        from python_multipart.exceptions import FormParserError
    except ImportError:  # python-multipart < 0.0.13 (a type checker sees one name imported twice)
        from multipart.exceptions import FormParserError  # type: ignore[no-redef]

    async def malformed_form(request, exc):
        log.warning("refused %s %s from %s: malformed multipart/form-data (%s)", request.method, request.url.path,
                    request.client.host if request.client else "?", str(exc)[:120])
        return JSONResponse({"status": "failed", "error": "malformed multipart/form-data body"}, status_code=400)

    gradio_app.debug = False
    gradio_app.add_exception_handler(FormParserError, malformed_form)
    gradio_app.middleware_stack = None  # (built on the first request, with the two changes)


def _find_gradio_app(app):
    from gradio.routes import App as GradioApp

    for route in app.routes:
        sub = getattr(route, "app", None)
        if isinstance(sub, GradioApp):
            return sub
    return None
