"""Every stream reaches every output (issue 44): OBS in, RTMP out. A WHIP publisher written from
RFC 9725 in a process of its own (aiortc; Chromium's in test_whip_browser.py) publishes into a
server with --whip-token; `POST /studio/outputs/{stream}` pushes the processed stream to a real
nginx-rtmp on 127.0.0.1, which ffprobe reads back; the list, the limits, the refusals and
`DELETE` follow the documented API; `serve --input ... --output ...` records its stream with no
page open. RTMP tests skip without nginx-rtmp, ffprobe checks without ffmpeg."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest
from live_server import SIZE, publisher_in_a_process, start
from rtmp_server import ffprobe

TOKEN = "outputs-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
needs_ffprobe = pytest.mark.skipif(shutil.which("ffprobe") is None,
                                   reason="ffprobe is missing (apt-get install ffmpeg)")


def wait_until(cond, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server():
    srv = start("--max-streams", "2", "--whip-token", TOKEN)
    yield srv
    srv.close()


@pytest.fixture
def obs(server):
    """A WHIP publisher (an encoder such as OBS) streaming into `obs` until the test ends."""
    proc, line = publisher_in_a_process(f"{server.url}/whip/obs", TOKEN)
    try:
        assert line.startswith("201 /whip/obs/"), line
        wait_until(lambda: (s := server.manager.get("obs")) is not None and s.processed >= 2, what="the stream")
        yield "obs"
    finally:
        proc.kill()
        proc.wait()
        server.manager.close("obs", wait=5.0)


@needs_ffprobe
def test_a_whip_publishers_stream_is_pushed_to_rtmp_and_read_back(server, obs, nginx):
    status = httpx.get(f"{server.url}/studio/status", headers=AUTH).json()
    # every peer connection counted by its kind (only /webrtc/offer's were once)
    assert status["connections"] == {"webrtc_offer": 0, "live_tab": 0, "whip": 1, "whep": 0}, status
    assert status["peer_connections"] == 1 and status["pending"] == 0
    url = f"{server.url}/studio/outputs/{obs}"
    body = {"kind": "rtmp", "target": nginx.url("obs-out"), "fps": 15}
    assert httpx.post(url, json=body).status_code == 401  # behind the publish door
    r = httpx.post(url, json=body, headers=AUTH, timeout=30)
    assert r.status_code == 201, r.text
    output = r.json()["output"]
    assert r.headers["location"] == f"/studio/outputs/{obs}/{output['id']}"
    assert (output["stream"], output["kind"], output["location"]) == (obs, "rtmp", nginx.url("obs-out"))
    listed = httpx.get(url, headers=AUTH).json()
    assert [o["id"] for o in listed["outputs"]] == [output["id"]] and listed["per_stream"] == 2
    wait_until(lambda: server.app.state.outputs.get(output["id"]).attachment.frames >= 5, what="frames pushed")
    probed = ffprobe(nginx.url("obs-out"))  # an independent reader of the RTMP server
    # the publisher's 128x96 card at the model's 64 wide, its 4:3 kept
    assert ((probed.get("codec_name"), probed.get("width"), probed.get("height"))
            == ("h264", SIZE, SIZE * 3 // 4)), probed
    one = httpx.get(server.url + r.headers["location"], headers=AUTH).json()["output"]
    assert one["state"] == "running" and one["frames"] >= 5 and one["frames_lost"] == 0
    stopped = httpx.delete(server.url + r.headers["location"], headers=AUTH)
    assert stopped.status_code == 200 and stopped.json()["output"]["state"] == "stopped"
    assert httpx.get(url, headers=AUTH).json()["outputs"] == []
    assert httpx.delete(server.url + r.headers["location"], headers=AUTH).status_code == 404
    wait_until(lambda: nginx.recording("obs-out").exists(), 5, "nginx's recording")
    time.sleep(0.5)  # nginx finishes the recording file when the publisher leaves
    recorded = ffprobe(str(nginx.recording("obs-out")))
    assert int(recorded.get("nb_read_frames", 0)) >= 5, recorded
    assert not server.manager.get(obs).closed  # stopping an output leaves the stream running


def test_outputs_per_stream_and_refusals(server, obs, tmp_path):
    url = f"{server.url}/studio/outputs/{obs}"
    made = [httpx.post(url, json={"kind": kind, "target": target}, headers=AUTH, timeout=30)
            for kind, target in (("file", "a.mp4"), ("hls", "obs"), ("file", "b.mp4"))]
    assert [r.status_code for r in made] == [201, 201, 409], [r.text for r in made]
    assert "2 output(s)" in made[2].json()["error"]
    every = httpx.get(f"{server.url}/studio/outputs", headers=AUTH).json()["outputs"]
    assert sorted(o["kind"] for o in every) == ["file", "hls"] and {o["stream"] for o in every} == {obs}
    refused = {
        "no such stream": (f"{server.url}/studio/outputs/nobody", {"kind": "file", "target": "x.mp4"}, 404),
        "a kind it lacks": (url, {"kind": "srt", "target": "x"}, 400),
        "an RTMP URL without a key": (url, {"kind": "rtmp", "target": "rtmp://127.0.0.1"}, 400),
        "not an object": (url, ["file"], 400),
        "a frame rate out of range": (url, {"kind": "file", "target": "x.mp4", "fps": 0}, 400),
    }
    for what, (where, body, status) in refused.items():
        r = httpx.post(where, json=body, headers=AUTH)
        assert r.status_code == status, (what, r.status_code, r.text)
        assert r.json()["status"] == "failed" and r.json()["error"], what
    for o in every:
        assert httpx.delete(f"{url}/{o['id']}", headers=AUTH).status_code == 200
    assert httpx.delete(f"{url}/nothing", headers=AUTH).status_code == 404


@needs_ffprobe
def test_serve_output_records_the_input_stream_with_no_page_open(tmp_path):
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.serve import check_outputs
    from streamstudio.errors import StreamStudioError

    srv = start("--input", "pattern:96x64", "--input-stream", "stage", "--output", "stage.mp4",
                "--output-dir", str(tmp_path))
    try:
        outs = srv.app.state.outputs
        wait_until(lambda: any(o.attachment.frames >= 10 for o in outs.of("stage")), 60, "--output's frames")
        [out] = outs.of("stage")
        assert out.kind == "file" and out.location == str(tmp_path / "stage.mp4")
    finally:
        srv.close()
    probed = ffprobe(str(tmp_path / "stage.mp4"))
    # the 96x64 pattern at the model's 64 wide, its 3:2 kept to the model's multiple of 8 (42.7 -> 40)
    assert (probed.get("width"), probed.get("height")) == (SIZE, int(SIZE * 64 / 96) // 8 * 8) and \
        int(probed["nb_read_frames"]) >= 10
    parse = build_parser().parse_args
    with pytest.raises(StreamStudioError, match="give --input too"):
        check_outputs(parse(["serve", "--output", "x.mp4"]))
    with pytest.raises(StreamStudioError, match="--output 'x.avi'"):
        check_outputs(parse(["serve", "--input", "pattern", "--output", "x.avi"]))
    assert check_outputs(parse(["serve", "--input", "pattern", "--output", "rtmp://h/live/k", "--output",
                                "ndi://Stage Out"])) == [("rtmp", "rtmp://h/live/k"), ("ndi", "Stage Out")]
