"""fastrtc WebRTC streams: the live handler, the plain `/webrtc/offer` endpoint with per-stream
settings, TURN settings from the environment, and a small aiortc client for scripts.

fastrtc calls the handler on the event loop with each received frame (BGR). The handler
never waits on inference: it hands the frame to the stream's session (RGB) and returns the
session's latest output (back to BGR) at once.

Endpoints (same server as the UI; HTTP basic auth when the server has --auth):
    POST   /webrtc/offer                {sdp, type: "offer", webrtc_id}  -> {sdp, type: "answer"}
    POST   /studio/settings/{webrtc_id} {prompt, strength, seed, ...}    -> {status, settings}
    GET    /studio/sessions/{webrtc_id}                                  -> live stats
    DELETE /studio/sessions/{webrtc_id}                                  -> frees the stream
    GET    /studio/status                                                -> model, streams in use
The client must open a data channel (any label; fastrtc waits for one) before its offer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from typing import Any, Callable

import numpy as np

from streamstudio.app.sessions import BusyError, SessionManager, StreamSession
from streamstudio.errors import StreamStudioError

log = logging.getLogger(__name__)

# The UI's live controls, in the order the WebRTC component passes them to the handler.
UI_SETTING_KEYS = ("prompt", "negative_prompt", "strength", "guidance_scale", "delta", "cfg_type",
                   "seed", "similarity_filter", "similarity_threshold")

TURN_ENV = ("STREAMSTUDIO_TURN_URLS", "STREAMSTUDIO_TURN_USERNAME", "STREAMSTUDIO_TURN_CREDENTIAL",
            "STREAMSTUDIO_STUN_URLS")


def rtc_config_from_env(environ=None) -> dict[str, Any]:
    """ICE servers from STREAMSTUDIO_STUN_URLS / STREAMSTUDIO_TURN_URLS (comma-separated) with
    STREAMSTUDIO_TURN_USERNAME and STREAMSTUDIO_TURN_CREDENTIAL. Without them: no ICE servers
    (host candidates only: same machine or LAN)."""
    env = os.environ if environ is None else environ
    servers = []
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


def current_webrtc_id() -> str:
    from fastrtc.utils import get_current_context

    return get_current_context().webrtc_id


class LiveHandler:
    """The fastrtc video handler: `handler(frame_bgr, *ui_values) -> frame_bgr` at once."""

    def __init__(self, manager: SessionManager, arg_keys: tuple[str, ...] = (),
                 webrtc_id: Callable[[], str] = current_webrtc_id):
        from fastrtc import CloseStream

        self._close = CloseStream
        self.manager, self.arg_keys, self._webrtc_id = manager, arg_keys, webrtc_id
        w, h = manager.model.size
        self._waiting = np.zeros((h, w, 3), np.uint8)  # shown until the first output

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
        session.submit(np.ascontiguousarray(frame[:, :, ::-1]))  # fastrtc's BGR -> RGB
        out = session.latest()
        return self._waiting if out is None else np.ascontiguousarray(out[:, :, ::-1])

    def _settings_from_ui(self, session: StreamSession, args) -> None:
        values = tuple(args[:len(self.arg_keys)])
        if getattr(session, "ui_values", None) == values:
            return
        session.ui_values = values
        try:
            self.manager.settings(session.sid, ui_settings(self.arg_keys, values))
        except StreamStudioError as exc:
            session.notice = f"setting not applied: {exc}"


def ui_settings(keys, values) -> dict:
    """Settings from the UI controls' values (Gradio gives numbers as floats, may give None)."""
    out = {}
    for key, value in zip(keys, values):
        if value is not None:
            out[key] = int(value) if key == "seed" else bool(value) if key == "similarity_filter" else value
    return out


def _auth_dependency(auth: tuple[str, str] | None):
    """HTTP basic auth for the API routes when the server has --auth."""
    from fastapi import Depends, HTTPException
    from fastapi.security import HTTPBasic, HTTPBasicCredentials

    if auth is None:
        return []
    basic = HTTPBasic()

    def check(credentials: HTTPBasicCredentials = Depends(basic)):
        ok = secrets.compare_digest(credentials.username.encode(), auth[0].encode()) & \
            secrets.compare_digest(credentials.password.encode(), auth[1].encode())
        if not ok:
            raise HTTPException(status_code=401, detail="wrong user or password",
                                headers={"WWW-Authenticate": "Basic"})

    return [Depends(check)]


def build_stream(manager: SessionManager, rtc_config: dict | None = None):
    """The fastrtc Stream behind POST /webrtc/offer (non-browser clients)."""
    from fastapi.responses import JSONResponse
    from fastrtc import Stream
    from fastrtc.stream import Body

    class StudioStream(Stream):
        async def offer(self, body: Body):
            if body.type == "offer" and body.webrtc_id not in self.connections and not manager.has_capacity():
                return JSONResponse({"status": "failed", "meta": {
                    "error": "concurrency_limit_reached", "limit": manager.max_streams,
                    "message": manager.busy_message()}})
            answer = await super().offer(body)
            if body.type == "offer" and body.webrtc_id in self.connections:
                self.set_input(body.webrtc_id, None)  # start calling the handler (no UI inputs here)
            return answer

        offer.__annotations__["body"] = Body  # resolved here: this module has lazy annotations

        def clean_up(self, webrtc_id: str):
            manager.close(webrtc_id, wait=0.0)
            return super().clean_up(webrtc_id)

    return StudioStream(LiveHandler(manager), mode="send-receive", modality="video",
                        concurrency_limit=manager.max_streams, rtc_configuration=rtc_config,
                        server_rtc_configuration=rtc_config, verbose=False)


def free_on_disconnect(component, manager: SessionManager) -> None:
    """Free a session when fastrtc cleans up its connection (component or Stream)."""
    original = component.clean_up

    def clean_up(webrtc_id: str):
        manager.close(webrtc_id, wait=0.0)
        return original(webrtc_id)

    component.clean_up = clean_up


def mount_api(app, manager: SessionManager, stream, auth: tuple[str, str] | None = None) -> None:
    """POST /webrtc/offer and the /studio JSON routes on `app` (FastAPI)."""
    from fastapi import Body as JsonBody
    from fastapi.responses import JSONResponse

    deps = _auth_dependency(auth)
    app.post("/webrtc/offer", dependencies=deps, tags=["webrtc"])(stream.offer)

    @app.get("/studio/status", dependencies=deps, tags=["studio"])
    async def status():
        return status_payload(manager)

    @app.post("/studio/settings/{webrtc_id}", dependencies=deps, tags=["studio"])
    async def settings(webrtc_id: str, raw: dict = JsonBody(...)):
        try:
            applied = manager.settings(webrtc_id, raw)
        except StreamStudioError as exc:
            return JSONResponse({"status": "failed", "error": str(exc)}, status_code=400)
        return {"status": "ok", "settings": applied}

    @app.get("/studio/sessions/{webrtc_id}", dependencies=deps, tags=["studio"])
    async def session_stats(webrtc_id: str):
        session = manager.get(webrtc_id)
        if session is None:
            return JSONResponse({"status": "failed", "error": f"no stream {webrtc_id!r}"}, status_code=404)
        return session.stats()

    @app.delete("/studio/sessions/{webrtc_id}", dependencies=deps, tags=["studio"])
    async def close_session(webrtc_id: str):
        return {"status": "ok", "closed": manager.close(webrtc_id, wait=0.0)}


def status_payload(manager: SessionManager) -> dict:
    model = manager.model
    return {"model": model.name, "demo": model.is_demo, "size": list(model.size),
            "max_streams": manager.max_streams, "streams": len(manager)}


# ---------------------------------------------------------------------- a client for scripts
class StudioClient:
    """A headless WebRTC client (aiortc): sends frames from `make_frame(i) -> RGB uint8`, keeps
    every received frame's arrival through `on_frame(rgb, t)`. Used by tests and benchmarks.

        client = StudioClient("http://127.0.0.1:7860", make_frame, on_frame)
        await client.connect(settings={"prompt": "a cat"})
        ...
        await client.close()
    """

    def __init__(self, url: str, make_frame: Callable[[int], np.ndarray],
                 on_frame: Callable[[np.ndarray, float], None] | None = None, fps: float = 30.0,
                 webrtc_id: str | None = None, auth: tuple[str, str] | None = None):
        self.url, self.make_frame, self.fps = url.rstrip("/"), make_frame, fps
        self.on_frame = on_frame or (lambda frame, t: None)
        self.webrtc_id = webrtc_id or secrets.token_hex(8)
        self.auth = auth
        self.sent: list[float] = []  # send times
        self.received = 0
        self.pc = None
        self._task: asyncio.Task | None = None

    async def connect(self, settings: dict | None = None, timeout: float = 20.0) -> None:
        import httpx
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        async with httpx.AsyncClient(auth=self.auth, timeout=timeout) as http:
            if settings:
                await self._post(http, f"/studio/settings/{self.webrtc_id}", settings)
            self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            self.pc.createDataChannel("text")
            self.pc.addTrack(_FrameTrack(self))
            self.pc.on("track", lambda track: self._start_receiving(track))
            await self.pc.setLocalDescription(await self.pc.createOffer())
            answer = await self._post(http, "/webrtc/offer", {
                "sdp": self.pc.localDescription.sdp, "type": "offer", "webrtc_id": self.webrtc_id})
        await self.pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))

    async def _post(self, http, path: str, payload: dict) -> dict:
        response = await http.post(self.url + path, json=payload)
        data = response.json()
        if response.status_code != 200 or data.get("status") == "failed":
            meta = data.get("meta", {})
            message = data.get("error") or meta.get("message") or meta.get("error") or response.text
            if meta.get("error") == "concurrency_limit_reached":
                raise BusyError(message)
            raise StreamStudioError(f"{path}: {message}")
        return data

    async def update(self, settings: dict) -> dict:
        import httpx

        async with httpx.AsyncClient(auth=self.auth, timeout=10) as http:
            return await self._post(http, f"/studio/settings/{self.webrtc_id}", settings)

    async def stats(self) -> dict | None:
        import httpx

        async with httpx.AsyncClient(auth=self.auth, timeout=10) as http:
            response = await http.get(f"{self.url}/studio/sessions/{self.webrtc_id}")
        return response.json() if response.status_code == 200 else None

    def _start_receiving(self, track) -> None:
        self._task = asyncio.ensure_future(self._receive(track))

    async def _receive(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            self.received += 1
            self.on_frame(frame.to_ndarray(format="rgb24"), time.perf_counter())

    async def close(self) -> None:
        if self.pc is not None:
            await self.pc.close()
        if self._task is not None:
            self._task.cancel()


def _frame_track_class():
    from aiortc import VideoStreamTrack

    class FrameTrack(VideoStreamTrack):
        def __init__(self, client: StudioClient):
            super().__init__()
            self.client, self.index = client, 0

        async def recv(self):
            from av import VideoFrame

            pts, time_base = await self.next_timestamp()
            frame = VideoFrame.from_ndarray(self.client.make_frame(self.index), format="rgb24")
            frame.pts, frame.time_base = pts, time_base
            self.index += 1
            self.client.sent.append(time.perf_counter())
            return frame

        async def next_timestamp(self):  # paced at the client's fps
            from aiortc.mediastreams import VIDEO_CLOCK_RATE, VIDEO_TIME_BASE

            if hasattr(self, "_timestamp"):
                self._timestamp += int(VIDEO_CLOCK_RATE / self.client.fps)
                wait = self._start + self._timestamp / VIDEO_CLOCK_RATE - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            else:
                self._start, self._timestamp = time.time(), 0
            return self._timestamp, VIDEO_TIME_BASE

    return FrameTrack


def _FrameTrack(client: StudioClient):
    return _frame_track_class()(client)
