"""A running server on 127.0.0.1 with the tiny model and headless aiortc clients, shared by the
web app's tests (live streams, offers, security, WHIP/WHEP)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import torch
from rtmp_server import free_port

SIZE = 64


def start(*extra: str):
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.serve_run import start_in_thread

    torch.set_num_threads(1)
    args = build_parser().parse_args(["serve", "--model", "tiny", "--width", str(SIZE), "--height", str(SIZE),
                                      "--port", str(free_port()), "--idle-timeout", "30",
                                      # tests connect often and at once from one address; a test may lower these
                                      "--offers-per-minute", "1000", "--max-pending-per-source", "1000",
                                      "--max-pending", "1000", *extra])
    return start_in_thread(args)


def pattern(i: int) -> np.ndarray:
    """A 96x128 test card with a moving bar (RGB)."""
    img = np.zeros((96, 128, 3), np.uint8)
    img[:, :64] = (200, 40, 40)
    img[48:, :, 2] = 220
    x = (4 * i) % 128
    img[:, x:x + 8] = 255
    return img


class Collector:
    def __init__(self):
        self.frames: list[np.ndarray] = []

    def __call__(self, frame, t):
        self.frames.append(frame)
        del self.frames[:-50]

    def processed(self) -> list[np.ndarray]:
        return [f for f in self.frames if f.mean() > 5]  # past the black waiting frames


async def connected(url: str, prompt: str, make=pattern, fps: float = 15.0, token: str | None = None):
    from studio_client import StudioClient

    got = Collector()
    client = StudioClient(url, make, got, fps=fps, token=token)
    await client.connect(settings={"prompt": prompt, "seed": 3})
    return client, got


async def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


# WHEP viewers in a process of their own (killed with SIGKILL: a player that dies without a word);
# each prints "201 watching" once it has a frame, or the refusal's status and error.
VIEWERS_SCRIPT = """
import asyncio, sys, httpx
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

async def one(url, headers):
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    got = asyncio.Event()
    def on_track(track):
        async def loop():
            await track.recv()
            got.set()
            while True:
                await track.recv()
        asyncio.ensure_future(loop())
    pc.on("track", on_track)
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(timeout=20) as http:
        r = await http.post(url, content=pc.localDescription.sdp, headers=headers)
    if r.status_code != 201:
        print(r.status_code, r.json()["meta"]["error"], flush=True)
        return pc
    await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
    await got.wait()
    print(201, "watching", flush=True)
    return pc

async def main(url, n, token):
    headers = {"Content-Type": "application/sdp"}
    if token:
        headers["Authorization"] = "Bearer " + token
    pcs = [await one(url, headers) for _ in range(n)]
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None))
"""


def viewers_in_a_process(url: str, n: int, token: str | None = None):
    """(the process, its n lines): n WHEP viewers of `url`, one after another."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", VIEWERS_SCRIPT, url, str(n), *([token] if token else [])],
                            stdout=subprocess.PIPE, text=True)
    return proc, [proc.stdout.readline().strip() for _ in range(n)]


# A WHIP publisher in a process of its own (an encoder that crashes: SIGKILL, no DELETE): it
# publishes the test card at 15 fps and prints "201 LOCATION" once its connection is up.
PUBLISHER_SCRIPT = """
import asyncio, sys, time, httpx
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription, VideoStreamTrack
from aiortc.mediastreams import VIDEO_CLOCK_RATE, VIDEO_TIME_BASE
from av import VideoFrame
import numpy as np

class Card(VideoStreamTrack):
    def __init__(self):
        super().__init__()
        self.i, self.t0 = 0, time.time()

    async def recv(self):
        await asyncio.sleep(max(0.0, self.t0 + self.i / 15 - time.time()))
        img = np.zeros((96, 128, 3), np.uint8)
        img[:, :64] = (200, 40, 40)
        img[:, (4 * self.i) % 128:(4 * self.i) % 128 + 8] = 255
        frame = VideoFrame.from_ndarray(img, format="rgb24")
        frame.pts, frame.time_base = int(self.i * VIDEO_CLOCK_RATE / 15), VIDEO_TIME_BASE
        self.i += 1
        return frame

async def main(url, token):
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver(Card(), direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    headers = {"Content-Type": "application/sdp", **({"Authorization": "Bearer " + token} if token else {})}
    async with httpx.AsyncClient(timeout=20) as http:
        r = await http.post(url, content=pc.localDescription.sdp, headers=headers)
    if r.status_code != 201:
        print(r.status_code, r.json()["meta"]["error"], flush=True)
        return
    await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
    while pc.connectionState != "connected":
        await asyncio.sleep(0.05)
    print(201, r.headers["location"], flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
"""


def publisher_in_a_process(url: str, token: str | None = None):
    """(the process, its line): a WHIP publisher to `url` in a process of its own."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", PUBLISHER_SCRIPT, url, *([token] if token else [])],
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()

