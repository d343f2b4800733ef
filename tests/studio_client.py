"""A headless WebRTC client of the server's `/webrtc/offer` endpoint (aiortc), for tests and
benchmarks (benchmarks/webapp.py puts tests/ on its path): it sends frames and times what comes
back, as a script or a camera-less client would."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Callable

import numpy as np

from streamstudio.app.web.sessions import BusyError
from streamstudio.errors import StreamStudioError

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
                 webrtc_id: str | None = None, auth: tuple[str, str] | None = None, token: str | None = None):
        self.url, self.make_frame, self.fps = url.rstrip("/"), make_frame, fps
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}  # the server's --whip-token
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

        async with httpx.AsyncClient(auth=self.auth, headers=self.headers, timeout=timeout) as http:
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

        async with httpx.AsyncClient(auth=self.auth, headers=self.headers, timeout=10) as http:
            return await self._post(http, f"/studio/settings/{self.webrtc_id}", settings)

    async def stats(self) -> dict | None:
        import httpx

        async with httpx.AsyncClient(auth=self.auth, headers=self.headers, timeout=10) as http:
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
