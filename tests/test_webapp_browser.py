"""A real browser: Debian's chromium (headless, Playwright) with a fake webcam opens the app,
starts the Live tab and must show a non-blank processed frame (the model's size, not the
camera's), then walks the other tabs as a person would (Text to image's Stop after typing, Live
output's error message, the Splats tab's slider boxes and a bad upload); without a camera the
Live tab says so. Screenshots are kept in test-artifacts/."""

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
def chromium_page(flags: list[str] | None = None):
    """A page of headless Debian chromium with a fake webcam (or `flags`), in a fresh profile."""
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tempfile.mkdtemp(prefix="streamstudio-chromium-")
    try:
        with sync_api.sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=flags or FLAGS,
                                                       headless=True,
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


NO_CAMERA_FLAGS = [f for f in FLAGS if f != "--use-fake-device-for-media-stream"]  # permission granted, no device


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)")
def test_browser_without_a_camera_says_so(server):
    """fastrtc's webcam box drops getUserMedia's failure unseen; the page must say there is no
    camera and point to the other ways in."""
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page(NO_CAMERA_FLAGS) as page:
        page.goto(server.url, timeout=90_000)
        page.get_by_text("Demo model").first.wait_for(timeout=90_000)
        page.locator("#live-webrtc").get_by_text("Click to Access Webcam").click(timeout=60_000)
        note = page.locator("#live-camera-note")
        note.get_by_text("No camera found").wait_for(timeout=20_000)
        page.screenshot(path=str(ARTIFACTS / "webapp_no_camera.png"), full_page=True)
        text = note.inner_text()
        assert note.is_visible()
    assert "No picture? Use the plain webcam stream" in text and "Text to image" in text, text


# "Error" labels a person can see outside the toast (Gradio's status trackers keep hidden ones)
VISIBLE_ERROR_PILLS_JS = """() => [...document.querySelectorAll('*')].filter(el => {
  if (el.childElementCount || el.textContent.trim() !== 'Error' || el.offsetParent === null
      || el.closest('.toast-wrap')) return false;
  for (let p = el; p; p = p.parentElement) {
    const s = getComputedStyle(p);
    if (s.opacity === '0' || s.visibility === 'hidden' || s.display === 'none') return false;
  }
  return true;
}).length"""


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)")
def test_browser_walks_the_tabs(server, tmp_path):
    """The Live tab's output at the model's size and aspect, Text to image stopping on Stop after
    typing, Live output keeping its error, Splats re-rendering on Enter in a slider box, its time
    slider's round labels and one clear message for a bad upload; a screenshot of each tab."""
    ARTIFACTS.mkdir(exist_ok=True)
    bad = tmp_path / "upload" / "my_scene.ply"
    bad.parent.mkdir()
    bad.write_text("not a ply file")
    for sid in server.manager.ids():  # an earlier test's text-to-image stream, left to its idle timeout
        server.manager.close(sid)
    with chromium_page() as page:
        stats = _stream_in_page(page, server)
        _stop_in_page(page, server)
        stopped = _t2i_stop_after_typing(page)
        output_status = _live_output_keeps_its_error(page)
        page.get_by_role("tab", name="Video").click()
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "webapp_video_tab.png"), full_page=True)
        splats = _splats_in_page(page, bad)
    assert (stats["w"], stats["h"]) == (SIZE, SIZE) and stats["w"] / stats["h"] == 1.0, stats  # the model's
    assert stopped["status"] == "Stopped." and stopped["src_before"] == stopped["src_after"], stopped
    assert all("No live stream" in text for text in output_status), output_status
    assert splats["enter_rerendered"], "Enter in the azimuth box did not re-render the view"
    assert splats["time_labels"] == ["0", "1"], splats["time_labels"]
    assert "my_scene.ply" in splats["toast"] and str(tmp_path) not in splats["toast"], splats["toast"]
    assert splats["toasts"] == 1 and splats["pills"] == 0, splats


def _t2i_stop_after_typing(page) -> dict:
    """Start, type into the prompt while it generates, Stop: no new image comes after Stop."""
    page.get_by_role("tab", name="Text to image").click()
    page.get_by_role("button", name="Start").first.click()
    image = page.locator("#t2i-image img")
    image.wait_for(timeout=60_000)
    page.locator("#t2i-prompt-1 textarea").type(" at dusk", delay=50)
    page.get_by_role("button", name="Stop").first.click()
    page.wait_for_timeout(800)  # a tick already on its way may land
    before = image.get_attribute("src")
    page.wait_for_timeout(2000)
    page.screenshot(path=str(ARTIFACTS / "webapp_text_to_image_stopped.png"), full_page=True)
    status = page.locator("#t2i-image").locator("xpath=../..").get_by_text("Stopped.").first
    return {"src_before": before, "src_after": image.get_attribute("src"),
            "status": status.inner_text().strip() if status.count() else None}


def _live_output_keeps_its_error(page) -> list[str]:
    """Start with no live stream: the message stays (it was replaced by 'Not running.' within a second)."""
    page.get_by_role("tab", name="Live output").click()
    page.get_by_role("button", name="Start").last.click()  # the Live output tab's own Start
    status = page.locator("#output-status")
    status.get_by_text("No live stream").wait_for(timeout=20_000)
    texts = [status.inner_text()]
    page.wait_for_timeout(2500)  # the status line refreshes every second
    texts.append(status.inner_text())
    page.screenshot(path=str(ARTIFACTS / "webapp_live_output.png"), full_page=True)
    return texts


def _splats_in_page(page, bad: Path) -> dict:
    page.get_by_role("tab", name="Splats").click()
    page.get_by_label("Sample scene").first.click()
    page.get_by_role("option", name="4D sample (orbiting moons)").click()
    page.get_by_role("button", name="Load", exact=True).click()
    view = page.locator("#splat-view img")
    view.wait_for(timeout=60_000)
    page.get_by_text("Loaded sample_4d.ply").wait_for(timeout=30_000)
    before = view.get_attribute("src")
    box = page.locator("#splat-controls input[type=number]").first  # the azimuth's box
    box.fill("120")
    box.press("Enter")
    rerendered = False
    for _ in range(40):
        page.wait_for_timeout(250)
        if view.get_attribute("src") != before:
            rerendered = True
            break
    time_block = page.locator("#splat-controls").get_by_text("Time (4D scenes)").locator("xpath=ancestor::*[.//input[@type='range']][1]")
    labels = [t.strip() for t in time_block.locator(".min_value, .max_value").all_inner_texts()]
    page.screenshot(path=str(ARTIFACTS / "webapp_splats.png"), full_page=True)
    page.locator("#splat-upload input[type=file]").set_input_files(str(bad))
    # the file's row once uploaded (Gradio writes its name as stem and suffix in two spans)
    page.locator("#splat-upload").get_by_text("my_scene").first.wait_for(timeout=30_000)
    page.get_by_role("button", name="Load", exact=True).click()
    toast = page.locator(".toast-body")
    toast.first.wait_for(timeout=20_000)
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "webapp_splats_bad_upload.png"), full_page=True)
    return {"enter_rerendered": rerendered, "time_labels": labels, "toast": toast.first.inner_text(),
            "toasts": toast.count(), "pills": page.evaluate(VISIBLE_ERROR_PILLS_JS)}
