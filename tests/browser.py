"""Headless Debian Chromium for the browser tests: its path, the flags every page starts with
(no multicast: host candidates without mDNS; a fake camera and microphone, permission granted),
a fresh profile per context, and polling a page until something holds. Shared by
tests/web/test_webapp_browser.py, test_whip_browser.py, tests/perform/test_midi_learn.py and
test_mapping_ui.py (a test file never imports another)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-features=WebRtcHideLocalIpsWithMdns",  # host candidates without mDNS: no multicast
         "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
MISSING = f"{CHROMIUM} is missing (apt-get install chromium)"
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=MISSING)


@contextlib.contextmanager
def chromium_context(flags: list[str] | None = None, viewport: dict | None = None, init_script: str | None = None):
    """A Playwright browser context of Chromium with `flags` (FLAGS by default) in a fresh profile,
    `init_script` run in every page before its own scripts."""
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tempfile.mkdtemp(prefix="streamstudio-chromium-")
    try:
        with sync_api.sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=flags or FLAGS,
                                                       headless=True, viewport=viewport)
            if init_script:
                ctx.add_init_script(init_script)
            try:
                yield ctx
            finally:
                ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.contextmanager
def chromium_page(flags: list[str] | None = None, viewport: dict | None = None, init_script: str | None = None):
    """A page of a fresh `chromium_context` (1280 x 900 unless `viewport`)."""
    with chromium_context(flags, viewport or {"width": 1280, "height": 900}, init_script) as ctx:
        yield ctx.new_page()


def wait_until(page, predicate, timeout: float = 60.0, what: str = ""):
    """`predicate()` until it gives something true (returned), polling every 200 ms of the page."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        page.wait_for_timeout(200)
    raise AssertionError(f"timed out: {what}")


def start_live_stream(page, server):
    """Open the app in `page`, start the Live tab's webcam stream (the fake camera), and wait for
    frames through the model: the server's session of it. (150 s: a CI machine running another
    browser test beside this one is slow to connect.)"""
    manager = server.manager
    page.goto(server.url, timeout=90_000)
    live = page.locator("#live-webrtc")
    live.get_by_text("Click to Access Webcam").click(timeout=90_000)
    live.locator('button[aria-label="start stream"]').click(timeout=60_000)
    sid = wait_until(page, lambda: next(iter(manager.ids()), None), timeout=150, what="the Live stream to start")
    session = manager.get(sid)
    wait_until(page, lambda: session.processed > 2, what="frames through the model")
    return session
