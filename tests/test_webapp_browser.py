"""A real browser: Debian's chromium (headless, Playwright) with a fake webcam opens the app,
starts the Live tab and must show a non-blank processed frame (the model's size, not the
camera's). The screenshot is kept in test-artifacts/."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
SIZE = 64

# The <video> of the WebRTC component (the only playing one) as seen by the page: its size and pixel spread.
VIDEO_STATS_JS = """() => {
  const videos = [...document.querySelectorAll('video')].filter(v => v.videoWidth && v.readyState >= 2);
  if (!videos.length) return null;
  const v = videos[videos.length - 1];
  const c = document.createElement('canvas');
  c.width = v.videoWidth; c.height = v.videoHeight;
  const g = c.getContext('2d');
  g.drawImage(v, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let sum = 0, sq = 0, n = 0;
  for (let i = 0; i < d.length; i += 4) { const y = (d[i] + d[i + 1] + d[i + 2]) / 3; sum += y; sq += y * y; n++; }
  const mean = sum / n;
  return {w: v.videoWidth, h: v.videoHeight, mean: mean, std: Math.sqrt(Math.max(0, sq / n - mean * mean))};
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    import torch

    from streamstudio.app.cli import build_parser
    from streamstudio.app.commands.serve import start_in_thread

    torch.set_num_threads(1)
    args = build_parser().parse_args(["serve", "--model", "tiny", "--width", str(SIZE), "--height", str(SIZE),
                                      "--port", str(free_port()), "--prompt", "a painting"])
    srv = start_in_thread(args)
    yield srv
    srv.close()


@contextlib.contextmanager
def chromium_page():
    """A page of headless Debian chromium with a fake webcam, in a fresh profile."""
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tempfile.mkdtemp(prefix="streamstudio-chromium-")
    try:
        with sync_api.sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=FLAGS, headless=True,
                                                       viewport={"width": 1280, "height": 900})
            try:
                yield ctx.new_page()
            finally:
                ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)")
def test_browser_live_tab_shows_processed_frames(server):
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page() as page:
        stats = _stream_in_page(page, server)
        freed = _stop_in_page(page, server)
        t2i_src = _text_to_image_in_page(page)
    assert (stats["w"], stats["h"]) == (SIZE, SIZE), stats  # the processed stream, not the camera
    assert stats["std"] > 3.0 and 5.0 < stats["mean"] < 250.0, stats  # a picture, not a blank frame
    assert freed, "stopping the stream in the page did not free its session"
    assert t2i_src, "the text-to-image tab showed no image"


def _stream_in_page(page, server, navigate: bool = True) -> dict:
    if navigate:
        page.goto(server.url, timeout=90_000)
    page.get_by_text("Demo model").first.wait_for(timeout=90_000)  # the notice is shown
    live = page.locator("#live-webrtc")
    live.get_by_text("Click to Access Webcam").click(timeout=60_000)
    live.locator('button[aria-label="start stream"]').click(timeout=60_000)
    deadline = time.monotonic() + 60
    stats = None
    while time.monotonic() < deadline:
        stats = page.evaluate(VIDEO_STATS_JS)
        if stats and stats["w"] == SIZE and stats["std"] > 3.0:
            break
        page.wait_for_timeout(500)
    page.wait_for_timeout(1500)  # a few more frames, and the stats line
    page.screenshot(path=str(ARTIFACTS / "webapp_live_tab.png"), full_page=True)
    assert stats is not None, "the live video never played"
    assert len(server.manager) == 1 and next(iter(server.manager.ids()))  # one session on the server
    return page.evaluate(VIDEO_STATS_JS)


def _stop_in_page(page, server) -> bool:
    """Stop in the page: the server frees the session (well before the idle timeout)."""
    # fastrtc keeps the aria-label "start stream"; the running button reads "Stop"
    page.locator('#live-webrtc button[aria-label="start stream"]', has_text="Stop").click(timeout=30_000)
    deadline = time.monotonic() + 10
    while len(server.manager) and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    return len(server.manager) == 0


def _text_to_image_in_page(page) -> str | None:
    """The Text to image tab: Start, then an image must appear (and keep regenerating)."""
    page.get_by_role("tab", name="Text to image").click()
    page.get_by_role("button", name="Start").first.click()
    image = page.locator("#t2i-image img")
    image.wait_for(timeout=60_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(ARTIFACTS / "webapp_text_to_image.png"), full_page=True)
    return image.get_attribute("src")


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)")
def test_browser_login_then_live_under_auth():
    """With --auth every route wants a login (app/security.py): the login page must still load,
    and once logged in the Live tab streams (its WebRTC offer goes through the guard too)."""
    import torch

    from streamstudio.app.cli import build_parser
    from streamstudio.app.commands.serve import start_in_thread

    torch.set_num_threads(1)
    args = build_parser().parse_args(["serve", "--model", "tiny", "--width", str(SIZE), "--height", str(SIZE),
                                      "--port", str(free_port()), "--auth", "ann:secret"])
    srv = start_in_thread(args)
    try:
        with chromium_page() as page:
            page.goto(srv.url, timeout=90_000)
            page.get_by_label("username").fill("ann", timeout=60_000)
            page.get_by_label("password").fill("secret")
            page.get_by_role("button", name="Login").click()
            stats = _stream_in_page(page, srv, navigate=False)  # the page reloads into the app
    finally:
        srv.close()
    assert (stats["w"], stats["h"]) == (SIZE, SIZE), stats
