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
    from streamstudio.app.cli.serve import start_in_thread

    torch.set_num_threads(1)
    args = build_parser().parse_args(["serve", "--model", "tiny", "--width", str(SIZE), "--height", str(SIZE),
                                      "--port", str(free_port()), "--idle-timeout", "30",
                                      # tests connect often and at once from one address; a test may lower these
                                      "--offers-per-minute", "1000", "--max-pending-per-source", "1000", *extra])
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


async def connected(url: str, prompt: str, make=pattern, fps: float = 15.0):
    from streamstudio.app.web.webrtc import StudioClient

    got = Collector()
    client = StudioClient(url, make, got, fps=fps)
    await client.connect(settings={"prompt": prompt, "seed": 3})
    return client, got


async def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))
