"""The audio's latency offset (app/perform/latency.py, issue 48): by default each stream's measured
glass-to-glass latency (frame in -> frame out on the server, plus the path to its viewers), updated
as it changes; a value set in the stream's modulations or by `serve --audio-latency-ms` wins, and
`GET /studio/modulations/{stream}` says which is in use."""

from __future__ import annotations

import asyncio
import time
import types

import httpx
import numpy as np
import pytest
from helpers import feed_frames

from streamstudio.app.perform.inputs import LiveInputs
from streamstudio.app.perform.latency import ASSUMED_SERVER_S, VIEWER_PLAYOUT_S
from streamstudio.app.perform.modulation import Modulations

pytestmark = pytest.mark.timeout(180)
TOKEN = "latency-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAPPING = {"setting": "delta", "source": {"kind": "audio", "feature": "onset"}, "low": 0.0, "high": 2.0}


@pytest.fixture(scope="module")
def server():
    import live_server

    srv = live_server.start("--whip-token", TOKEN)
    yield srv
    srv.close()


def slow_down(session, delay: list[float]) -> None:
    """Each frame of `session` takes `delay[0]` seconds more (a heavier model)."""
    step = session.processor._step

    def slow(frame):
        time.sleep(delay[0])
        return step(frame)

    session.processor._step = slow


def latency(server, name: str) -> dict:
    r = httpx.get(f"{server.url}/studio/modulations/{name}", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["latency"]


def test_the_offset_follows_a_streams_measured_latency_and_a_set_one_wins(server):
    name, delay = "lat-a", [0.2]
    session = server.manager.open(name)
    try:
        r = httpx.put(f"{server.url}/studio/modulations/{name}", json={"mappings": [MAPPING]}, headers=AUTH,
                      timeout=10)
        assert r.status_code == 200, r.text
        said = r.json()["latency"]  # no frame out yet: the server's part assumed
        assert said["source"] == "assumed" and said["ms"] == pytest.approx(1000 * (ASSUMED_SERVER_S + VIEWER_PLAYOUT_S))
        assert "no viewer's RTCP report" in said["path"]

        slow_down(session, delay)
        feed_frames(session, 32, step=17)  # the runner's recent latency: the mean of its last 30 outputs
        time.sleep(0.6)  # (a measured offset is looked at again every 0.5 s)
        slow = latency(server, name)
        assert slow["source"] == "measured" and 200 <= slow["server_ms"] <= 320, slow
        assert slow["ms"] == pytest.approx(slow["server_ms"] + 1000 * VIEWER_PLAYOUT_S, abs=0.2)

        delay[0] = 0.05  # the model gets faster: the offset follows
        feed_frames(session, 32, step=17)
        time.sleep(0.6)
        fast = latency(server, name)
        assert fast["source"] == "measured" and 50 <= fast["server_ms"] <= 170, fast
        assert slow["ms"] - fast["ms"] == pytest.approx(150, abs=40), (slow, fast)

        # the offset is what the audio is read behind by: a click at c is an onset at c + offset
        view = server.manager.inputs.view(name)
        c = clicks_into(server.manager.inputs, name)
        offset = view.latency_s()
        assert offset == pytest.approx(fast["ms"] / 1000, abs=0.03)
        assert view.audio("onset", c + offset - 0.03) == 0.0 and view.audio("onset", c + offset + 0.015) == 1.0

        # set in the stream's modulations, it wins at once (and GET says so); left out again, measured
        r = httpx.put(f"{server.url}/studio/modulations/{name}", json={"mappings": [MAPPING], "latency_ms": 250},
                      headers=AUTH, timeout=10)
        assert r.json()["latency"] == {"ms": 250.0, "source": "set", "by": "the stream's modulations (latency_ms)"}
        assert r.json()["modulations"]["latency_ms"] == 250 and view.latency_s() == 0.25
        assert view.audio("onset", c + 0.25 - 0.03) == 0.0 and view.audio("onset", c + 0.25 + 0.015) == 1.0
        r = httpx.put(f"{server.url}/studio/modulations/{name}", json={"mappings": [MAPPING], "latency_ms": -1},
                      headers=AUTH, timeout=10)
        assert r.status_code == 400 and "latency_ms is 0..5000" in r.json()["error"]
        httpx.put(f"{server.url}/studio/modulations/{name}", json={"mappings": [MAPPING]}, headers=AUTH, timeout=10)
        assert latency(server, name)["source"] == "measured"
    finally:
        server.manager.close(name)


def clicks_into(inputs: LiveInputs, name: str) -> float:
    """A second of 48 kHz audio with one click, fed as stream `name`'s; the click's capture time."""
    rate, now = 48_000, time.monotonic()
    x = np.zeros(rate, np.float32)
    x[rate // 2:rate // 2 + 96] = 0.9
    for k in range(0, rate, 960):  # 20 ms packets, the last captured at `now`
        inputs.feed_audio(name, x[k:k + 960], rate, now - 1.0 + (k + 960) / rate)
    return now - 0.5


def test_the_servers_setting_wins_over_the_measured_and_a_streams_own_over_both():
    session = types.SimpleNamespace(modulations=None,
                                    metrics=lambda: types.SimpleNamespace(recent_latency_ms=80.0))
    inputs = LiveInputs(sessions=lambda name: session)
    assert inputs.latency.offset("s")["source"] == "measured"
    inputs.latency.viewer_rtt("s", "viewer-1", 0.02)
    inputs.latency.viewer_rtt("s", "viewer-2", 0.04)
    inputs.latency.forget("s")  # (drops the cached figure; the viewers report again)
    inputs.latency.viewer_rtt("s", "viewer-1", 0.02)
    inputs.latency.viewer_rtt("s", "viewer-2", 0.04)
    said = inputs.latency.offset("s")
    assert said["ms"] == pytest.approx(80 + 15 + 1000 * VIEWER_PLAYOUT_S) and "2 WHEP viewer" in said["path"]

    server_set = LiveInputs(audio_latency_s=0.18, sessions=lambda name: session)
    assert server_set.latency.offset("s") == {"ms": 180.0, "source": "set", "by": "serve --audio-latency-ms"}
    session.modulations = Modulations.parse({"mappings": [MAPPING], "latency_ms": 40})
    assert server_set.latency.offset("s")["ms"] == 40.0 and server_set.view("s").latency_s() == 0.04


def test_serve_takes_and_checks_audio_latency_ms(capsys):
    from streamstudio.app.cli import build_parser

    args = build_parser().parse_args(["serve", "--audio-latency-ms", "120"])
    assert args.audio_latency_ms == 120.0
    for bad in ("9000", "-1", "nan", "inf"):  # refused as the command line is read, with its range
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--audio-latency-ms", bad])
        assert "must be in [0, 5000]" in capsys.readouterr().err


def test_a_whep_viewers_round_trip_time_enters_the_offset(server):
    """A WHIP publisher and a WHEP viewer (aiortc, on loopback): once the viewer's RTCP receiver
    reports give an RTT, the offset's path is RTT/2 + the assumed playout, not the assumption alone."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription, VideoStreamTrack

    name = "lat-whep"

    async def post(http, path: str, pc) -> str:
        await pc.setLocalDescription(await pc.createOffer())
        r = await http.post(f"{server.url}/{path}/{name}", content=pc.localDescription.sdp,
                            headers={**AUTH, "Content-Type": "application/sdp"})
        assert r.status_code == 201, r.text
        await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
        return r.headers["location"]

    async def main():
        publisher, viewer = (RTCPeerConnection(RTCConfiguration(iceServers=[])) for _ in range(2))
        publisher.addTransceiver(VideoStreamTrack(), direction="sendonly")
        viewer.addTransceiver("video", direction="recvonly")
        viewer.on("track", lambda track: asyncio.ensure_future(drain(track)))
        try:
            async with httpx.AsyncClient(timeout=20) as http:
                location = await post(http, "whip", publisher)
                deadline = time.monotonic() + 60
                while (session := server.manager.get(name)) is None or session.processed < 2:
                    assert time.monotonic() < deadline, "the publisher's frames never reached the model"
                    await asyncio.sleep(0.05)
                await http.put(f"{server.url}/studio/modulations/{name}", json={"mappings": [MAPPING]}, headers=AUTH)
                await post(http, "whep", viewer)
                deadline = time.monotonic() + 30
                while "RTCP receiver reports of 1 WHEP viewer" not in (said := latency(server, name))["path"]:
                    assert time.monotonic() < deadline, f"no viewer RTT in the offset: {said}"
                    await asyncio.sleep(0.3)
                await http.delete(f"{server.url}{location}", headers=AUTH)
                return said
        finally:
            await viewer.close()
            await publisher.close()

    said = asyncio.run(asyncio.wait_for(main(), 120))
    half_rtt = said["path_ms"] - 1000 * VIEWER_PLAYOUT_S
    assert said["source"] == "measured" and 0 < half_rtt < 50, said  # loopback: a few ms at most


async def drain(track) -> None:
    from aiortc.mediastreams import MediaStreamError

    try:
        while True:
            await track.recv()
    except MediaStreamError:
        return
