"""The live-performance routes on a running server (app/web/perform_routes.py, issue 48): a stream's
modulations set over HTTP drive its settings frame by frame (an LFO on strength, a MIDI knob on
the CFG delta), tempo set and tapped, bad requests refused, the routes behind the publish door."""

from __future__ import annotations

import time

import httpx
import pytest
from helpers import feed_frames

from streamstudio.errors import StreamStudioError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    import live_server

    srv = live_server.start("--whip-token", "perf-token")
    yield srv
    srv.close()


AUTH = {"Authorization": "Bearer perf-token"}


def feed(session, frames: int) -> None:
    feed_frames(session, frames, step=11)


def test_an_lfo_and_a_midi_knob_drive_a_streams_settings(server):
    session = server.manager.open("perf-a")
    url = f"{server.url}/studio/modulations/perf-a"
    raw = {"mappings": [
        {"setting": "strength", "source": {"kind": "lfo", "shape": "sine", "rate": 3.0}, "low": 0.3, "high": 0.9},
        {"setting": "delta", "source": {"kind": "midi", "cc": 74}, "low": 0.0, "high": 2.0}]}
    assert httpx.put(url, json=raw, timeout=10).status_code == 401  # behind the publish credential
    r = httpx.put(url, json=raw, headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["modulations"]["mappings"][0]["source"]["shape"] == "sine"
    assert httpx.get(url, headers=AUTH, timeout=10).json()["modulations"]["mappings"][1]["setting"] == "delta"
    seen = set()
    for _ in range(12):
        feed(session, 1)
        seen.add(round(session.stats()["settings"]["strength"], 3))
        time.sleep(0.05)
    assert len(seen) >= 4 and all(0.3 <= v <= 0.9 for v in seen), seen  # the LFO moves it, within its range
    assert "delta" not in session.stats()["settings"]  # no knob moved yet: left as it was
    r = httpx.post(f"{server.url}/studio/midi", json={"cc": 74, "value": 127}, headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["value"] == 1.0
    feed(session, 2)
    assert session.stats()["settings"]["delta"] == pytest.approx(2.0)
    httpx.post(f"{server.url}/studio/midi", json={"cc": 74, "value": 0, "channel": 3}, headers=AUTH, timeout=10)
    feed(session, 2)
    assert session.stats()["settings"]["delta"] == pytest.approx(0.0)
    assert httpx.delete(url, headers=AUTH, timeout=10).json() == {"status": "ok"}
    assert session.modulations is None
    server.manager.close("perf-a")


def test_tempo_is_set_and_tapped(server):
    r = httpx.put(f"{server.url}/studio/tempo", json={"bpm": 128}, headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["bpm"] == 128 and r.json()["source"] == "set"
    for _ in range(3):
        state = httpx.post(f"{server.url}/studio/tempo/tap", headers=AUTH, timeout=10).json()
        time.sleep(0.3)
    assert state["source"] == "tap" and 120 < state["bpm"] < 300  # about 200 bpm from taps 0.3 s apart
    assert httpx.get(f"{server.url}/studio/tempo", headers=AUTH, timeout=10).json()["bpm"] == state["bpm"]


@pytest.mark.parametrize("method, path, body, status, words", [
    ("put", "/studio/modulations/nobody", {"mappings": []}, 404, "no stream"),
    ("put", "/studio/tempo", {"bpm": 9000}, 400, "beats a minute"),
    ("post", "/studio/midi", {"cc": 300, "value": 1}, 400, "0..127"),
    ("post", "/studio/midi", {"cc": 1, "value": 1, "channel": 17}, 400, "1..16"),
])
def test_bad_requests_are_refused(server, method, path, body, status, words):
    r = getattr(httpx, method)(server.url + path, json=body, headers=AUTH, timeout=10)
    assert r.status_code == status and words in r.json()["error"], r.text


def test_a_bad_modulation_is_refused_and_the_stream_keeps_its_old_one(server):
    session = server.manager.open("perf-b")
    url = f"{server.url}/studio/modulations/perf-b"
    good = {"mappings": [{"setting": "guidance_scale", "source": {"kind": "lfo"}, "low": 1.0, "high": 2.0}]}
    assert httpx.put(url, json=good, headers=AUTH, timeout=10).status_code == 200
    r = httpx.put(url, json={"mappings": [{"setting": "prompt"}]}, headers=AUTH, timeout=10)
    assert r.status_code == 400 and "cannot be modulated" in r.json()["error"]
    assert session.modulations is not None and session.modulations.mappings[0].setting == "guidance_scale"
    server.manager.close("perf-b")


def test_the_control_api_is_described_for_show_control_tools(server):
    """Issue 48, item 3: an OpenAPI document of every /studio route, and a page of it, behind the door."""
    assert httpx.get(f"{server.url}/studio/openapi.json", timeout=10).status_code == 401
    doc = httpx.get(f"{server.url}/studio/openapi.json", headers=AUTH, timeout=10).json()
    assert doc["openapi"].startswith("3.") and doc["security"] == [{"publish": []}]
    paths = doc["paths"]
    for path, method in (("/studio/modulations/{stream}", "put"), ("/studio/tempo/tap", "post"),
                         ("/studio/midi", "post"), ("/studio/settings/{webrtc_id}", "post"),
                         ("/studio/outputs/{stream}", "post"), ("/studio/status", "get"), ("/metrics", "get")):
        assert method in paths.get(path, {}), (path, sorted(paths))
    assert all(p.startswith(("/studio", "/metrics")) for p in paths)  # only the control API
    assert "requestBody" in paths["/studio/modulations/{stream}"]["put"]
    page = httpx.get(f"{server.url}/studio/api", headers=AUTH, timeout=10)
    assert page.status_code == 200 and "/studio/modulations/{stream}" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing fetched from elsewhere


def test_a_show_is_saved_and_loaded_and_streams_take_it_when_they_open(server, tmp_path):
    """One file a show: PUT /studio/show sets the tempo and keeps each stream's modulations for
    when it opens ("*" for any other); GET /studio/show gives it back with the running streams'."""
    show = {"tempo": {"bpm": 90}, "streams": {
        "stage": {"mappings": [{"setting": "delta", "source": {"kind": "beat", "beats": 2}, "low": 0, "high": 1}]},
        "*": {"mappings": [{"setting": "guidance_scale", "source": {"kind": "lfo"}, "low": 1, "high": 2}]}}}
    r = httpx.put(f"{server.url}/studio/show", json=show, headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["show"]["tempo"] == {"bpm": 90.0}
    stage, other = server.manager.open("stage"), server.manager.open("somebody")
    assert stage.modulations.mappings[0].setting == "delta" and stage.modulations.mappings[0].source.beats == 2
    assert other.modulations.mappings[0].setting == "guidance_scale"
    assert stage.modulations is not other.modulations
    saved = httpx.get(f"{server.url}/studio/show", headers=AUTH, timeout=10).json()
    assert saved["streams"]["stage"]["mappings"][0]["source"]["kind"] == "beat" and "somebody" in saved["streams"]
    bad = httpx.put(f"{server.url}/studio/show", json={"streams": {"x": {"mappings": [{"setting": "prompt"}]}}},
                    headers=AUTH, timeout=10)
    assert bad.status_code == 400 and server.manager.inputs.clock.bpm == 90.0  # nothing changed
    feed(stage, 2)
    assert 0.0 <= stage.stats()["settings"]["delta"] <= 1.0
    for sid in ("stage", "somebody"):
        server.manager.close(sid)
    httpx.put(f"{server.url}/studio/show", json={"streams": {}}, headers=AUTH, timeout=10)

    from streamstudio.app.cli.serve_run import read_show

    path = tmp_path / "show.json"
    path.write_text("{not json")
    with pytest.raises(StreamStudioError, match="--show .* is not a readable JSON file"):
        read_show(str(path))
