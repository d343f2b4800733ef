"""WHIP and WHEP with a real, independent client (issue 29): Debian's Chromium (headless,
Playwright) publishes its fake camera over WHIP and watches the processed stream over WHEP from
pages served by another origin (another port: every request is cross-origin, so the CORS preflight
of RFC 9725 4.2 is exercised), with the browser's own RTCPeerConnection, fetch and getStats. The
RFC clients written here (test_whip_whep.py) stay; this checks that what a browser sends is taken."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest
from browser import chromium_context, needs_chromium
from live_server import SIZE, publisher_in_a_process, start

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
import glass_to_glass  # noqa: E402  (the page origin and the pages' offer steps, shared with the benchmark)
from glass_to_glass import SIGNAL_JS, VIEWER_JS  # noqa: E402

TOKEN = "browser-token"

pytestmark = needs_chromium

# A WHIP publisher as a web page writes one: the fake camera at 320x240.
PUBLISH_JS = """async ([url, token]) => {
  const media = await navigator.mediaDevices.getUserMedia({video: {width: 320, height: 240}});
  const pc = new RTCPeerConnection({iceServers: []});
  pc.addTransceiver(media.getVideoTracks()[0], {direction: 'sendonly'});
""" + SIGNAL_JS + """  window.studio = {pc, location: new URL(res.headers.get('Location'), url).href};
  return {status: res.status, location: res.headers.get('Location'), etag: res.headers.get('ETag')};
}"""

# A WHEP viewer: a recvonly transceiver, the stream shown in a <video>.
WATCH_JS = """async ([url, token]) => {
""" + VIEWER_JS + SIGNAL_JS + """\
  window.studio = {pc, video, location: new URL(res.headers.get('Location'), url).href};
  return {status: res.status, location: res.headers.get('Location')};
}"""

# What the page's connection says: its state and (a viewer) the inbound video's decoding.
STATS_JS = """async () => {
  const {pc, video} = window.studio;
  const out = {state: pc.connectionState, decoded: 0, fps: null, width: null, height: null, sent: 0};
  for (const s of (await pc.getStats()).values()) {
    if (s.type === 'inbound-rtp' && s.kind === 'video') {
      out.decoded = s.framesDecoded || 0; out.fps = s.framesPerSecond ?? null;
      out.width = s.frameWidth ?? null; out.height = s.frameHeight ?? null;
    }
    if (s.type === 'outbound-rtp' && s.kind === 'video') out.sent = s.framesSent || 0;
  }
  if (video) { out.playing_width = video.videoWidth; out.playing_height = video.videoHeight; }
  return out;
}"""

DELETE_JS = """async ([token]) => {
  const res = await fetch(window.studio.location, {method: 'DELETE', headers: {'Authorization': 'Bearer ' + token}});
  window.studio.pc.close();
  return res.status;
}"""


@pytest.fixture(scope="module")
def server():
    srv = start("--max-streams", "2", "--whip-token", TOKEN)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def page_origin():
    """An empty page on another port of 127.0.0.1: another origin than the server's."""
    with glass_to_glass.page_origin() as origin:
        yield origin


def chromium():
    """A headless Debian chromium with a fake webcam, in a fresh profile."""
    return chromium_context()


def poll(page, predicate, timeout: float = 40.0) -> dict:
    """STATS_JS of `page` until `predicate` holds (the last stats, for the assertion message)."""
    deadline, stats = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        stats = page.evaluate(STATS_JS)
        if predicate(stats):
            return stats
        page.wait_for_timeout(250)
    raise AssertionError(f"timed out; the page's last stats: {stats}")


def publish(page, base_url: str, name: str) -> dict:
    """`page` publishes its fake camera to /whip/`name` and is connected and sending (the 201's answer)."""
    published = page.evaluate(PUBLISH_JS, [f"{base_url}/whip/{name}", TOKEN])
    assert published["status"] == 201, published
    poll(page, lambda s: s["state"] == "connected" and s["sent"] > 5)
    return published


def wait_for_session(srv, name: str, ready, what: str, timeout: float = 40.0):
    """The server's session `name` once `ready(session)` holds."""
    deadline = time.monotonic() + timeout
    while (session := srv.manager.get(name)) is None or not ready(session):
        assert time.monotonic() < deadline, f"{what}: {session.stats() if session is not None else 'no session'}"
        time.sleep(0.1)
    return session


def test_chromium_publishes_over_whip_and_watches_over_whep(server, page_origin):
    """A Chromium page publishes its fake camera to /whip/browser; another page (the same origin,
    not the server's) watches /whep/browser: the viewer decodes the processed frames at the
    model's size (the camera's 4:3 with the tiny model's 64 as the longer side), both connections
    are up, and the publisher's DELETE frees the stream."""
    with chromium() as ctx:
        publisher, viewer = ctx.new_page(), ctx.new_page()
        publisher.goto(page_origin)
        viewer.goto(page_origin)
        published = publish(publisher, server.url, "browser")
        assert published["location"].startswith("/whip/browser/") and published["etag"]
        # the browser's frames go through the model
        session = wait_for_session(server, "browser", lambda s: s.processed >= 3, "no processed frame")

        watching = viewer.evaluate(WATCH_JS, [f"{server.url}/whep/browser", TOKEN])
        assert watching["status"] == 201, watching
        first = poll(viewer, lambda s: s["state"] == "connected" and s["decoded"] >= 5)
        later = poll(viewer, lambda s: s["decoded"] >= first["decoded"] + 10)
        assert (later["width"], later["height"]) == (SIZE, SIZE * 3 // 4), later  # 320x240 -> 64x48
        assert (later["playing_width"], later["playing_height"]) == (SIZE, SIZE * 3 // 4), later
        assert session.stats()["frames_in"] > 10 and session.error is None

        assert publisher.evaluate(DELETE_JS, [TOKEN]) == 200
        deadline = time.monotonic() + 15
        while server.manager.get("browser") is not None or server.app.state.whip.resources:
            assert time.monotonic() < deadline, "the stream and its viewer were not freed"
            time.sleep(0.1)


@pytest.mark.skipif(shutil.which("ffprobe") is None, reason="ffprobe is missing (apt-get install ffmpeg)")
def test_chromium_publishes_and_the_stream_is_pushed_to_rtmp(server, page_origin, nginx):
    """Issue 44, OBS in and RTMP out with a browser as the encoder: a Chromium page publishes its
    fake camera over WHIP; `POST /studio/outputs/{stream}` pushes the processed stream to a real
    nginx-rtmp, and ffprobe, an independent reader, finds H.264 at the stream's size there."""
    from rtmp_server import ffprobe

    auth = {"Authorization": f"Bearer {TOKEN}"}
    with chromium() as ctx:
        publisher = ctx.new_page()
        publisher.goto(page_origin)
        publish(publisher, server.url, "chrome-out")
        wait_for_session(server, "chrome-out", lambda s: s.processed >= 3, "no processed frame")
        r = httpx.post(f"{server.url}/studio/outputs/chrome-out", headers=auth, timeout=30,
                       json={"kind": "rtmp", "target": nginx.url("chrome"), "fps": 15})
        assert r.status_code == 201, r.text
        probed = ffprobe(nginx.url("chrome"))
        # the fake camera's 320x240 at the tiny model's 64 wide
        assert (probed.get("codec_name"), probed.get("width"), probed.get("height")) == ("h264", SIZE, SIZE * 3 // 4)
        stopped = httpx.delete(server.url + r.headers["location"], headers=auth)
        assert stopped.status_code == 200 and stopped.json()["output"]["frames"] > 0
        assert publisher.evaluate(DELETE_JS, [TOKEN]) == 200


# A WHEP player that follows the 201's server-sent events link (the WHEP extension), as
# broadcast-box's and Eyevinn's players do: each event with the page's clock and the connection's state.
FOLLOW_EVENTS_JS = """async ([url]) => {
  const link = window.studio.link;
  const m = link && link.match(/<([^>]+)>;\\s*rel="urn:ietf:params:whep:ext:core:server-sent-events"/);
  if (!m) return null;
  window.studio.events = [];
  const source = new EventSource(new URL(m[1], url).href);
  for (const name of ['active', 'inactive'])
    source.addEventListener(name, e => window.studio.events.push(
      {name, data: JSON.parse(e.data), at: performance.now(), state: window.studio.pc.connectionState}));
  await new Promise(done => source.addEventListener('active', done, {once: true}));
  return m[1];
}"""

WATCH_WITH_LINK_JS = WATCH_JS.replace("  window.studio = {pc, video,",
                                      "  window.studio = {link: res.headers.get('Link'), pc, video,")


def test_a_chromium_viewer_is_told_at_once_when_the_publisher_ends(server, page_origin):
    """Issue 44: a WHEP viewer got no signal when its publisher ended; Chromium noticed by ICE
    after 6 s (disconnected) and 16 s (failed). The 201 now links the viewer's event stream (the
    WHEP server-sent events extension): `active` while it runs, `inactive` the moment the publisher
    ends, while the connection still looks up to the browser."""
    proc, line = publisher_in_a_process(f"{server.url}/whip/ending", TOKEN)
    try:
        assert line.startswith("201 /whip/ending/"), line
        with chromium() as ctx:
            viewer = ctx.new_page()
            viewer.goto(page_origin)
            assert viewer.evaluate(WATCH_WITH_LINK_JS, [f"{server.url}/whep/ending", TOKEN])["status"] == 201
            poll(viewer, lambda s: s["state"] == "connected" and s["decoded"] >= 3)
            sse = viewer.evaluate(FOLLOW_EVENTS_JS, [f"{server.url}/whep/ending"])
            assert sse and sse.endswith("/sse"), sse
            asked = viewer.evaluate("() => performance.now()")
            r = httpx.delete(server.url + line.split()[1], headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200
            deadline = time.monotonic() + 10
            while not (events := viewer.evaluate("() => window.studio.events"))[1:]:
                assert time.monotonic() < deadline, events
                viewer.wait_for_timeout(50)
        active, inactive = events[:2]
        assert (active["name"], inactive["name"]) == ("active", "inactive"), events
        assert inactive["data"]["reason"] == "the publisher ended" and inactive["state"] == "connected", inactive
        print(f"\nthe viewer was told {inactive['at'] - asked:.0f} ms after the publisher's DELETE was sent")
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_five_chromium_viewers_and_a_publisher_that_reconnects(server, page_origin):
    """Five Chromium viewers of one stream each decode it; then the publisher comes back on a new
    connection (a second page POSTs to the same name, as a restarted encoder does): it replaces the
    first at once, the first page's connection is ended by the server, and every viewer goes on
    decoding on its own WHEP session without reconnecting."""
    with chromium() as ctx:
        first, again = ctx.new_page(), ctx.new_page()
        viewers = [ctx.new_page() for _ in range(5)]
        for page in (first, again, *viewers):
            page.goto(page_origin)
        publish(first, server.url, "stage")
        session = server.manager.get("stage")
        for page in viewers:
            assert page.evaluate(WATCH_JS, [f"{server.url}/whep/stage", TOKEN])["status"] == 201
        counts = [poll(page, lambda s: s["state"] == "connected" and s["decoded"] >= 10)["decoded"] for page in viewers]

        t0 = time.monotonic()
        replaced = again.evaluate(PUBLISH_JS, [f"{server.url}/whip/stage", TOKEN])
        assert replaced["status"] == 201 and time.monotonic() - t0 < 5, replaced
        poll(again, lambda s: s["state"] == "connected" and s["sent"] > 5)
        poll(first, lambda s: s["state"] in ("closed", "failed", "disconnected"), timeout=40)
        assert server.manager.get("stage") is session
        for page, count in zip(viewers, counts):
            later = poll(page, lambda s, c=count: s["decoded"] >= c + 15)
            assert later["state"] == "connected", later
        assert len([r for r in server.app.state.whip.resources.values() if r.kind == "whep"]) == 5


def test_chromium_publishes_into_the_causal_model_from_its_first_frame(page_origin):
    """`serve --live-pipeline video --video-model builtin-causal`: a Chromium page's fake camera
    over WHIP goes through the causal video model from the stream's first frame (no deck step),
    and a second page watches it over WHEP at the model's output size."""
    from streamstudio.app.web.video_deck import VideoLiveProcessor

    srv = start("--live-pipeline", "video", "--video-model", "builtin-causal", "--whip-token", TOKEN,
                "--prompt", "a red circle moving left")
    try:
        with chromium() as ctx:
            publisher, viewer = ctx.new_page(), ctx.new_page()
            publisher.goto(page_origin)
            viewer.goto(page_origin)
            publish(publisher, srv.url, "causal")
            session = wait_for_session(srv, "causal", lambda s: getattr(s.processor, "ready", False),
                                       "the causal stream gave no chunk")
            assert isinstance(session.processor, VideoLiveProcessor) and "builtin-causal" in session.stats()["model"]
            watching = viewer.evaluate(WATCH_JS, [f"{srv.url}/whep/causal", TOKEN])
            assert watching["status"] == 201, watching
            stats = poll(viewer, lambda s: s["state"] == "connected" and s["decoded"] >= 10)
            assert (stats["width"], stats["height"]) == (SIZE, SIZE), stats  # the model's square output
            assert session.error is None and session.processed > 10
    finally:
        srv.close()
