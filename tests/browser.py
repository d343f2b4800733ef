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
