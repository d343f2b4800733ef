"""The running server on 127.0.0.1 with headless aiortc clients: processed frames come back at
the camera's aspect with the model's longer side (a 4:3 camera 4:3, a square one square) and
differ from the input, two clients keep their own prompts, leaving frees
the stream, the busy limit speaks clearly, bad settings are refused, --auth guards the API."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from live_server import SIZE, Collector, connected, free_port, pattern, run, start, wait_for  # noqa: F401

from streamstudio.app.web.sessions import BusyError


@pytest.fixture(scope="module")
def server():
    srv = start("--max-streams", "2")
    yield srv
    srv.close()


def test_client_gets_processed_frames(server):
    async def main():
        client, got = await connected(server.url, "a cat")
        session = lambda: server.manager.get(client.webrtc_id)  # noqa: E731
        await wait_for(lambda: len(got.processed()) >= 5 and session() is not None and session().processed >= 5)
        # the client's video is decoded at each frame's marker packet (app/web/rtp_receive.py)
        from streamstudio.app.web.rtp_receive import MarkerJitterBuffer

        pc = server.app.state.studio_stream.pcs[client.webrtc_id]
        buffers = [t.receiver._RTCRtpReceiver__jitter_buffer for t in pc.getTransceivers() if t.receiver.track]
        assert any(isinstance(b, MarkerJitterBuffer) and b.early >= 3 for b in buffers), buffers
        stats = await client.stats()
        async with httpx.AsyncClient() as http:
            status = (await http.get(f"{server.url}/studio/status")).json()
        await client.close()
        return got.processed()[-1], stats, status

    out, stats, status = run(main())
    assert out.shape == (48, SIZE, 3)  # the 128x96 (4:3) camera's aspect, the model's 64 as the longer side
    rows, cols = np.arange(48) * 96 // 48, np.arange(SIZE) * 128 // SIZE
    small_input = pattern(0)[rows][:, cols]  # the whole picture at the output size
    assert np.abs(out.astype(int) - small_input.astype(int)).mean() > 20
    assert stats["processed"] >= 5 and stats["model"] == "tiny"
    assert stats["settings"]["prompt"] == "a cat"
    assert status["frames_out"] >= 5 and status["fps"] > 0  # the streams' runner metrics, server-wide


def test_a_square_camera_gets_a_square_stream(server):
    square = lambda i: pattern(i)[:, 16:112]  # noqa: E731 - 96x96

    async def main():
        client, got = await connected(server.url, "a cat", square)
        await wait_for(lambda: len(got.processed()) >= 3)
        session = server.manager.get(client.webrtc_id)
        size, out = session.size, got.processed()[-1]
        await client.close()
        return size, out

    size, out = run(main())
    assert size == (SIZE, SIZE) and out.shape == (SIZE, SIZE, 3)


def test_two_clients_keep_their_own_prompts(server):
    still = lambda i: pattern(0)  # noqa: E731 - the same input for both

    async def main():
        (a, got_a), (b, got_b) = await asyncio.gather(connected(server.url, "a cat", still),
                                                      connected(server.url, "a dog", still))
        await wait_for(lambda: len(got_a.processed()) >= 5 and len(got_b.processed()) >= 5)
        sessions = [server.manager.get(a.webrtc_id), server.manager.get(b.webrtc_id)]
        prompts = [s.stats()["settings"]["prompt"] for s in sessions]
        outs = [s.latest().copy() for s in sessions]
        received = [got_a.processed()[-1], got_b.processed()[-1]]
        await asyncio.gather(a.close(), b.close())
        return prompts, outs, received

    prompts, outs, received = run(main())
    assert prompts == ["a cat", "a dog"]
    assert not np.array_equal(outs[0], outs[1])
    # what each client receives is its own stream: one stream sent to both would differ by codec
    # noise at most (about 0); the tiny model's two prompts differ by 1.3-2.1 grey levels here
    diff = np.abs(received[0].astype(int) - received[1].astype(int)).mean()
    assert diff > 0.75, diff


def test_disconnect_frees_the_session(server):
    async def main():
        client, got = await connected(server.url, "a house")
        await wait_for(lambda: len(got.processed()) >= 2)
        assert server.manager.get(client.webrtc_id) is not None
        await client.close()
        await wait_for(lambda: server.manager.get(client.webrtc_id) is None, timeout=15)
        await wait_for(lambda: len(server.manager) == 0, timeout=15)

    run(main())


def test_busy_beyond_max_streams(server):
    async def main():
        clients = [await connected(server.url, f"p{i}") for i in range(2)]
        await wait_for(lambda: all(len(g.processed()) >= 1 for _, g in clients))
        try:
            with pytest.raises(BusyError, match="busy"):
                await connected(server.url, "one too many")
        finally:
            await asyncio.gather(*(c.close() for c, _ in clients))

    run(main())


def test_settings_endpoint(server):
    r = httpx.post(f"{server.url}/studio/settings/someid", json={"strength": 3})
    assert r.status_code == 400 and "strength must be in" in r.json()["error"]
    r = httpx.post(f"{server.url}/studio/settings/someid", json={"prompt": "a tree", "cfg_type": "none"})
    assert r.status_code == 200 and r.json()["settings"] == {"prompt": "a tree", "cfg_type": "none"}
    assert httpx.get(f"{server.url}/studio/sessions/nobody").status_code == 404
    status = httpx.get(f"{server.url}/studio/status").json()
    assert status["model"] == "tiny" and status["demo"] is True and status["size"] == [SIZE, SIZE]
    assert "StreamStudio" in httpx.get(server.url + "/").text


def test_auth_guards_the_ui_and_the_api():
    srv = start("--auth", "ann:secret")
    try:
        assert httpx.get(f"{srv.url}/studio/status").status_code == 401
        assert httpx.get(f"{srv.url}/studio/status", auth=("ann", "wrong")).status_code == 401
        assert httpx.get(f"{srv.url}/studio/status", auth=("ann", "secret")).status_code == 200
        offer = {"sdp": "x", "type": "offer", "webrtc_id": "abc"}
        assert httpx.post(f"{srv.url}/webrtc/offer", json=offer).status_code == 401
        assert httpx.get(f"{srv.url}/config").status_code in (401, 403)  # the Gradio app wants a login
    finally:
        srv.close()
