"""`GET /metrics` (issue 47, operations): the server's figures in Prometheus's text format, read back
with prometheus_client's own parser (an independent reader); behind the control door; streams
labelled by public names, never by a page's control id."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest
from live_server import start

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is not installed (test extra)")
TOKEN = "metrics-token"


@pytest.fixture(scope="module")
def server():
    srv = start("--max-streams", "3", "--whip-token", TOKEN)
    yield srv
    srv.close()


def families(text: str) -> dict:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def samples(family, label: str | None = None) -> dict:
    return {(s.labels.get(label) if label else None): s.value for s in family.samples}


def feed(session, stop: threading.Event) -> None:
    i = 0
    while not stop.wait(0.05):
        session.submit(np.full((64, 64, 3), i % 250, np.uint8))
        i += 1


def test_metrics_parse_and_count_what_runs(server):
    assert httpx.get(f"{server.url}/metrics").status_code == 401  # behind the control door
    named, page = server.manager.open("stage"), server.manager.open("page" + "4d" * 10)
    named.named = True  # as a WHIP publisher's stream is
    stop = threading.Event()
    feeders = [threading.Thread(target=feed, args=(s, stop), daemon=True) for s in (named, page)]
    for t in feeders:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while named.processed < 5 or page.processed < 5:
            assert time.monotonic() < deadline, "no frames"
            time.sleep(0.1)
        r = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    finally:
        stop.set()
        for t in feeders:
            t.join()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = families(r.text)
    assert samples(got["streamstudio_streams"]) == {None: 2.0}
    assert samples(got["streamstudio_max_streams"]) == {None: 3.0}
    fps = samples(got["streamstudio_stream_fps"], "stream")
    assert set(fps) == {"stage", page.watch_id} and all(v > 0 for v in fps.values()), fps
    assert page.sid not in r.text  # a page's control id never leaves
    frames = samples(got["streamstudio_stream_frames_out"], "stream")  # (the parser drops _total)
    assert frames["stage"] >= 5 and got["streamstudio_stream_frames_out"].type == "counter"
    kinds = samples(got["streamstudio_peer_connections"], "kind")
    assert set(kinds) == {"webrtc_offer", "live_tab", "whip", "whep"} and sum(kinds.values()) == 0
    assert samples(got["streamstudio_outputs"], "kind") == {"rtmp": 0.0, "hls": 0.0, "file": 0.0, "ndi": 0.0}
    server.manager.close("stage")
    server.manager.close(page.sid)


def test_label_values_are_escaped():
    from streamstudio.app.web.metrics import _Text

    out = _Text()
    out.family("x_total", "counter", "a test", [({"stream": 'a"b\\c\nd'}, 3)])
    [family] = parser.text_string_to_metric_families(out.text())
    assert family.samples[0].labels == {"stream": 'a"b\\c\nd'} and family.samples[0].value == 3
