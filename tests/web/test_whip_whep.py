"""WHIP ingest (RFC 9725) and WHEP egress on a running server on 127.0.0.1 (tiny model), with
clients written here from the RFCs (aiortc peer connections, plain HTTP): a publisher's frames
come back processed to WHEP viewers, the session resource's DELETE frees the stream, tokens and
bad offers are refused with reasons, and ten viewers cost one model run per frame."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest
from helpers import wait_for_sync
from live_server import SIZE, pattern, publisher_in_a_process, start, viewers_in_a_process, wait_for

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def server():
    srv = start("--max-streams", "2", "--whip-token", TOKEN)
    yield srv
    srv.close()


def run(coro, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ---------------------------------------------------------------------- RFC clients
def synthetic_track(fps: float):
    from aiortc import VideoStreamTrack
    from aiortc.mediastreams import VIDEO_CLOCK_RATE, VIDEO_TIME_BASE
    from av import VideoFrame

    class Synthetic(VideoStreamTrack):
        def __init__(self):
            super().__init__()
            self.index, self.start = 0, None

        async def recv(self):
            if self.start is None:
                self.start = time.time()
            wait = self.start + self.index / fps - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            frame = VideoFrame.from_ndarray(pattern(self.index), format="rgb24")
            frame.pts, frame.time_base = int(self.index * VIDEO_CLOCK_RATE / fps), VIDEO_TIME_BASE
            self.index += 1
            return frame

    return Synthetic()


def headers(token: str | None = TOKEN, content_type: str = "application/sdp") -> dict:
    out = {"Content-Type": content_type}
    if token is not None:
        out["Authorization"] = f"Bearer {token}"
    return out


class Publisher:
    """A WHIP client (RFC 9725 section 4.2): POST the offer, apply the 201's answer, DELETE the
    Location to end."""

    def __init__(self, base: str, path: str = "/whip", token: str | None = TOKEN, fps: float = 10.0,
                 local_address: str | None = None):
        self.base, self.path, self.token, self.fps = base, path, token, fps
        self.local_address = local_address  # another loopback address (127.0.0.2): another client
        self.pc = self.response = self.location = None

    async def start(self) -> httpx.Response:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTransceiver(synthetic_track(self.fps), direction="sendonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())  # gathers every candidate
        transport = httpx.AsyncHTTPTransport(local_address=self.local_address) if self.local_address else None
        async with httpx.AsyncClient(timeout=20, transport=transport) as http:
            self.response = await http.post(self.base + self.path, content=self.pc.localDescription.sdp,
                                            headers=headers(self.token))
        if self.response.status_code == 201:
            self.location = self.response.headers["location"]
            await self.pc.setRemoteDescription(RTCSessionDescription(self.response.text, "answer"))
        return self.response

    @property
    def stream(self) -> str:
        return self.location.strip("/").split("/")[1]

    async def delete(self) -> httpx.Response:
        async with httpx.AsyncClient(timeout=20) as http:
            url = httpx.URL(self.base).join(self.location)
            return await http.delete(url, headers={"Authorization": f"Bearer {self.token}"})

    async def close(self) -> None:
        if self.pc is not None:
            await self.pc.close()


class Viewer:
    """A WHEP client: a recvonly video transceiver, its frames counted with their arrival times.
    `frozen` stops calling recv (a player that hangs)."""

    def __init__(self, base: str, stream: str, token: str | None = TOKEN):
        self.base, self.stream, self.token = base, stream, token
        self.times: list[float] = []
        self.last: np.ndarray | None = None
        self.frozen = False
        self.pc = self.response = None
        self._task = None

    async def start(self) -> httpx.Response:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTransceiver("video", direction="recvonly")
        self.pc.on("track", lambda track: self._receive(track))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with httpx.AsyncClient(timeout=20) as http:
            self.response = await http.post(f"{self.base}/whep/{self.stream}", content=self.pc.localDescription.sdp,
                                            headers=headers(self.token))
        if self.response.status_code == 201:
            await self.pc.setRemoteDescription(RTCSessionDescription(self.response.text, "answer"))
        return self.response

    def _receive(self, track) -> None:
        async def loop():
            from aiortc.mediastreams import MediaStreamError

            while True:
                while self.frozen:
                    await asyncio.sleep(0.05)
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                self.times.append(time.monotonic())
                self.last = frame.to_ndarray(format="rgb24")

        self._task = asyncio.ensure_future(loop())

    def count_between(self, t0: float, t1: float) -> int:
        return sum(t0 <= t < t1 for t in self.times)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.pc is not None:
            await self.pc.close()


# ---------------------------------------------------------------------- tests
def test_publish_view_delete(server):
    async def main():
        r = httpx.post(f"{server.url}/studio/settings/stage1", json={"prompt": "a neon city", "seed": 5},
                       headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        pub = Publisher(server.url, "/whip/stage1")
        response = await pub.start()
        assert response.status_code == 201, response.text
        assert response.headers["content-type"].startswith("application/sdp")
        assert response.headers["location"].startswith("/whip/stage1/")
        assert response.headers["etag"].startswith('"')
        assert response.text.startswith("v=0")
        session = lambda: server.manager.get("stage1")  # noqa: E731
        await wait_for(lambda: session() is not None and session().processed >= 3)
        assert session().stats()["settings"]["prompt"] == "a neon city"  # the settings set beforehand
        # the publisher's frames leave aiortc's jitter buffer at their marker packet (app/web/rtp_receive.py)
        from streamstudio.app.web.rtp_receive import MarkerJitterBuffer

        res = next(r for r in server.app.state.whip.resources.values() if r.kind == "whip" and r.sid == "stage1")
        buffers = [t.receiver._RTCRtpReceiver__jitter_buffer for t in res.pc.getTransceivers()]
        assert any(isinstance(b, MarkerJitterBuffer) and b.early >= 3 for b in buffers), buffers

        viewer = Viewer(server.url, "stage1")
        response = await viewer.start()
        assert response.status_code == 201, response.text
        assert response.headers["location"].startswith("/whep/stage1/")
        await wait_for(lambda: len(viewer.times) >= 5)
        out = viewer.last
        assert out.shape == (48, SIZE, 3)  # the publisher's 4:3 with the model's 64 as the longer side
        rows, cols = np.arange(48) * 96 // 48, np.arange(SIZE) * 128 // SIZE
        small_input = pattern(0)[rows][:, cols]
        assert np.abs(out.astype(int) - small_input.astype(int)).mean() > 20  # processed, not the input

        # the session resource: OPTIONS, a trickle PATCH (accepted), an ICE restart (422), DELETE
        async with httpx.AsyncClient(timeout=10) as http:
            url = server.url + pub.location
            options = await http.options(url)
            assert options.status_code == 200 and "DELETE" in options.headers["allow"]
            assert options.headers["access-control-allow-origin"] == "*"
            frag = "a=ice-ufrag:{}\r\na=ice-pwd:{}\r\nm=video 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:0\r\n" \
                   "a=candidate:1 1 udp 2113937151 127.0.0.1 9 typ host\r\n"
            ufrag = next(line.split(":", 1)[1] for line in pub.pc.localDescription.sdp.splitlines()
                         if line.startswith("a=ice-ufrag:"))
            pwd = next(line.split(":", 1)[1] for line in pub.pc.localDescription.sdp.splitlines()
                       if line.startswith("a=ice-pwd:"))
            patch_headers = {**headers(content_type="application/trickle-ice-sdpfrag"),
                             "If-Match": response.headers.get("etag", "")}
            patch_headers["If-Match"] = pub.response.headers["etag"]
            r = await http.patch(url, content=frag.format(ufrag, pwd), headers=patch_headers)
            assert r.status_code == 204, r.text
            r = await http.patch(url, content=frag.format("newufrag", "newpassword0123456789"),
                                 headers={**patch_headers, "If-Match": "*"})
            assert r.status_code == 422
            r = await http.patch(url, content=frag.format(ufrag, pwd), headers={**patch_headers, "If-Match": '"x"'})
            assert r.status_code == 412
            assert (await http.delete(url)).status_code == 401  # no token
        assert (await pub.delete()).status_code == 200
        await wait_for(lambda: server.manager.get("stage1") is None, timeout=10)
        await wait_for(lambda: not server.app.state.whip.resources, timeout=15)  # the viewer ended with it
        assert (await pub.delete()).status_code == 404
        await asyncio.gather(pub.close(), viewer.close())

    run(main())


def test_refusals(server):
    async def main():
        wrong = Publisher(server.url, token="wrong")
        r = await wrong.start()
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        await wrong.close()
        none = Publisher(server.url, token=None)
        assert (await none.start()).status_code == 401
        await none.close()

    run(main())
    base = f"{server.url}/whip"
    r = httpx.post(base, content="v=0\r\nthis is not sdp", headers=headers())
    assert r.status_code == 400 and "SDP" in r.json()["meta"]["message"]
    r = httpx.post(base, content="hello", headers=headers())
    assert r.status_code == 400 and "v=0" in r.json()["meta"]["message"]
    r = httpx.post(base, content="v=0", headers=headers(content_type="application/json"))
    assert r.status_code == 415
    r = httpx.post(base + "/bad%20name", content="v=0", headers=headers())
    assert r.status_code == 400
    r = httpx.post(f"{server.url}/whep/nobody", content="v=0\r\n", headers=headers())
    assert r.status_code in (400, 404)
    basic = {"Content-Type": "application/sdp"}
    assert httpx.post(base, content="hello", headers=basic, auth=("obs", TOKEN)).status_code == 400  # let in
    assert httpx.post(base, content="hello", headers=basic, auth=("obs", "nope")).status_code == 401
    r = httpx.options(base)
    assert r.status_code == 200 and r.headers["accept-post"] == "application/sdp" and "POST" in r.headers["allow"]
    assert httpx.get(f"{server.url}/studio/status", headers={"Authorization": f"Bearer {TOKEN}"}).json()["streams"] == 0


def test_protocol_details_follow_rfc_9725(server):
    """Each point of issue 29's list, against the text of RFC 9725 (WHIP; the WHEP draft -03 has
    the same sentences in its 4.1, 4.3, 4.4.1 and 4.4.2)."""
    async def main():
        pub = Publisher(server.url, "/whip/details")
        try:
            assert (await pub.start()).status_code == 201
            session_url, etag = server.url + pub.location, pub.response.headers["etag"]
            async with httpx.AsyncClient(timeout=10) as http:
                # 4.1: "the WHIP endpoints and sessions MUST return a 2xx successful response with no
                # content when a GET request is received" (HEAD: the same, without a body)
                for url in (f"{server.url}/whip", f"{server.url}/whip/details", session_url,
                            f"{server.url}/whep/details"):
                    for method in ("GET", "HEAD"):
                        r = await http.request(method, url)
                        assert r.status_code == 204 and r.content == b"", (method, url, r.status_code)
                r = await http.get(f"{server.url}/whip/details/not-a-session")
                assert r.status_code == 404 and r.json()["meta"]["error"] == "no_session"
                # 4.2: "The "200 OK" response to any OPTIONS request SHOULD include an Accept-Post
                # header with a media type value of "application/sdp""
                r = await http.options(f"{server.url}/whip/details")
                assert r.status_code == 200 and r.headers["accept-post"] == "application/sdp"
                frag = "a=ice-ufrag:{}\r\na=ice-pwd:{}\r\nm=video 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:0\r\n{}"
                sdp = pub.pc.localDescription.sdp.splitlines()
                ufrag = next(line.split(":", 1)[1] for line in sdp if line.startswith("a=ice-ufrag:"))
                pwd = next(line.split(":", 1)[1] for line in sdp if line.startswith("a=ice-pwd:"))
                host = frag.format(ufrag, pwd, "a=candidate:1 1 udp 2113937151 127.0.0.1 9 typ host\r\n")
                patch = headers(content_type="application/trickle-ice-sdpfrag")
                # 4.3.1: "a "428 Precondition Required" response for a missing entity-tag and a "412
                # Precondition Failed" response for a non-matching entity-tag"
                r = await http.patch(session_url, content=host, headers=patch)
                assert r.status_code == 428 and r.json()["meta"]["error"] == "etag_missing"
                r = await http.patch(session_url, content=host, headers={**patch, "If-Match": '"other"'})
                assert r.status_code == 412
                # 4.3.2: a trickle PATCH gets "204 No Content" "and MUST NOT include an ETag header"
                r = await http.patch(session_url, content=host, headers={**patch, "If-Match": etag})
                assert r.status_code == 204 and "etag" not in r.headers and r.content == b""
                # 4.3.2: a candidate whose address cannot be resolved (an mDNS .local name) is
                # "silently discard[ed]": answered as fast as any other (aiortc took 1.01 s)
                mdns = frag.format(ufrag, pwd, "a=candidate:2 1 udp 2113937151 "
                                               "1f2e3d4c-aaaa-bbbb-cccc-123456789abc.local 50000 typ host\r\n")
                t0 = time.monotonic()
                r = await http.patch(session_url, content=mdns, headers={**patch, "If-Match": etag})
                mdns_s = time.monotonic() - t0
                assert r.status_code == 204 and mdns_s < 0.5, mdns_s
        finally:
            await pub.delete()
            await pub.close()

    run(main())


def test_cors_without_a_login_is_for_the_origins_named():
    """4.2: "The WHIP endpoints MUST support OPTIONS requests for Cross-Origin Resource Sharing
    (CORS)". Without a token a page of any origin could publish into a local server, so only the
    page origins --whip-cors names get CORS headers (with a login: any, the token is the credential)."""
    page = "http://127.0.0.1:8123"
    srv = start("--whip-cors", page)
    try:
        preflight = {"Origin": page, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "content-type"}
        r = httpx.options(f"{srv.url}/whip/cam", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == page
        assert "POST" in r.headers["access-control-allow-methods"] and r.headers["vary"] == "Origin"
        r = httpx.post(f"{srv.url}/whip/cam", content="hello", headers={"Origin": page, **headers(None)})
        assert r.status_code == 400 and r.headers["access-control-allow-origin"] == page  # a reason it can read
        other = {**preflight, "Origin": "http://evil.example"}
        r = httpx.options(f"{srv.url}/whip/cam", headers=other)
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    finally:
        srv.close()


def test_whep_needs_a_running_stream(server):
    async def main():
        viewer = Viewer(server.url, "nostream")
        r = await viewer.start()
        await viewer.close()
        return r

    r = run(main())
    assert r.status_code == 404 and "no running stream" in r.json()["meta"]["message"]


def test_auth_fallback_and_guard():
    """Without --whip-token, --auth's USER:PASS is the bearer token; the guard lets WHIP through."""
    srv = start("--auth", "ann:pw")
    try:
        async def main():
            pub = Publisher(srv.url, "/whip/authed", token="ann:pw")
            r = await pub.start()
            assert r.status_code == 201, r.text
            bad = Publisher(srv.url, "/whip/authed2", token="ann:nope")
            assert (await bad.start()).status_code == 401
            await wait_for(lambda: srv.manager.get("authed") is not None and srv.manager.get("authed").processed >= 1)
            assert (await pub.delete()).status_code == 200
            await asyncio.gather(pub.close(), bad.close())

        run(main())
        assert httpx.get(f"{srv.url}/studio/status").status_code == 401  # the rest still wants the login
    finally:
        srv.close()


def test_control_routes_are_behind_the_publish_door(server):
    """Issue 44: with --whip-token (no --auth), anyone who knew a stream's name could steer or end
    it through /studio/settings and /studio/sessions. Every /studio route now wants the publish
    credential (the bearer token, or basic auth with it as the password)."""
    from base64 import b64encode

    url = server.url
    open_calls = [("POST", "/studio/settings/door", {"prompt": "taken over"}),
                  ("DELETE", "/studio/sessions/door", None),
                  ("GET", "/studio/sessions/door", None), ("GET", "/studio/status", None),
                  ("POST", "/studio/lora", {"scales": {}})]
    for method, path, body in open_calls:
        for auth in (None, "Bearer wrong-token", f"Basic {b64encode(b'x:wrong').decode()}"):
            r = httpx.request(method, url + path, json=body, headers={"Authorization": auth} if auth else {})
            assert r.status_code == 401, (method, path, auth, r.status_code)
            assert r.headers["www-authenticate"].startswith("Bearer")
    assert "door" not in server.manager._presets  # the refused settings were not kept
    ok = httpx.post(url + "/studio/settings/door", json={"prompt": "a boat"},
                    headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["status"] == "ok", ok.text
    basic = b64encode(f"obs:{TOKEN}".encode()).decode()
    assert httpx.get(url + "/studio/status", headers={"Authorization": f"Basic {basic}"}).status_code == 200


def test_a_view_token_watches_and_does_nothing_else():
    """--whep-token is the viewers' credential: WHEP takes it, WHIP, the control routes and a
    publisher's session URL refuse it; the publish token still watches. The same token for both
    is refused at start-up."""
    from streamstudio.errors import StreamStudioError

    with pytest.raises(StreamStudioError, match="must differ"):
        start("--whip-token", "same", "--whep-token", "same")
    srv = start("--whip-token", TOKEN, "--whep-token", "view-only")

    async def main():
        pub = Publisher(srv.url, "/whip/viewed")
        squat = Publisher(srv.url, "/whip/viewed2", token="view-only")
        viewer, owner_view = Viewer(srv.url, "viewed", token="view-only"), Viewer(srv.url, "viewed", token=TOKEN)
        anonymous = Viewer(srv.url, "viewed", token=None)
        try:
            assert (await pub.start()).status_code == 201
            assert (await squat.start()).status_code == 401  # a viewer cannot publish
            await wait_for(lambda: (s := srv.manager.get("viewed")) is not None and s.processed >= 1)
            assert (await anonymous.start()).status_code == 401
            assert (await viewer.start()).status_code == 201
            assert (await owner_view.start()).status_code == 201
            await wait_for(lambda: len(viewer.times) >= 2)
            view = {"Authorization": "Bearer view-only"}
            assert httpx.post(f"{srv.url}/studio/settings/viewed", json={"prompt": "x"},
                              headers=view).status_code == 401
            assert httpx.delete(f"{srv.url}/studio/sessions/viewed", headers=view).status_code == 401
            assert httpx.delete(httpx.URL(srv.url).join(pub.location), headers=view).status_code == 401
            assert srv.manager.get("viewed") is not None
        finally:
            await asyncio.gather(pub.close(), squat.close(), viewer.close(), owner_view.close(), anonymous.close())

    try:
        run(main())
    finally:
        srv.close()


def test_a_live_publisher_is_replaced_only_by_its_credential_or_once_stale():
    """Without a token any client replaced a live publisher. Now, on an open door, a second
    publisher to a live stream gets 409 while the first sends frames, and takes the stream once
    the first has sent nothing for STALE_PUBLISHER_S (its process gone without DELETE)."""
    from streamstudio.app.web.whip_sessions import STALE_PUBLISHER_S

    srv = start("--max-streams", "2")

    async def main():
        first, second = Publisher(srv.url, "/whip/held", token=None), Publisher(srv.url, "/whip/held", token=None)
        try:
            assert (await first.start()).status_code == 201
            await wait_for(lambda: (s := srv.manager.get("held")) is not None and s.processed >= 2)
            session = srv.manager.get("held")
            r = await second.start()
            assert r.status_code == 409 and r.json()["meta"]["error"] == "stream_in_use", r.text
            await second.close()
            first.pc.getTransceivers()[0].sender.replaceTrack(None)  # the encoder stops sending, says nothing
            stopped = time.monotonic()
            second = Publisher(srv.url, "/whip/held", token=None)
            while (r := await second.start()).status_code == 409:
                await second.close()
                second = Publisher(srv.url, "/whip/held", token=None)
                assert time.monotonic() - stopped < STALE_PUBLISHER_S + 10, "never replaced"
                await asyncio.sleep(0.5)
            assert r.status_code == 201, r.text
            assert time.monotonic() - stopped >= STALE_PUBLISHER_S - 0.5  # not before it was stale
            assert srv.manager.get("held") is session  # the stream goes on
            processed = session.processed
            await wait_for(lambda: session.processed >= processed + 2)
        finally:
            await asyncio.gather(first.close(), second.close())

    try:
        run(main())
    finally:
        srv.close()


def offer_sdp() -> str:
    """A real sendonly offer (aiortc), never answered: for the checks before a connection."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    async def make():
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="sendonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    return run(make())


@pytest.mark.parametrize("trusted", [False, True])
def test_forwarded_addresses_are_believed_only_from_a_trusted_proxy(trusted):
    """Issue 44: uvicorn believed X-Forwarded-For from 127.0.0.1 by default, so a local client
    passed the per-address rate by rotating the header, or locked another address out by naming
    it. Now a client is its peer address unless --trusted-proxy names the proxy it comes through."""
    extra = ("--trusted-proxy", "127.0.0.1") if trusted else ()
    srv = start("--offers-per-minute", "2", "--whip-token", TOKEN, *extra)
    sdp = offer_sdp()
    try:
        codes = []
        for i in range(4):  # a rotating forged address each time
            r = httpx.post(f"{srv.url}/whip/fwd{i}", content=sdp, timeout=20,
                           headers={**headers(), "X-Forwarded-For": f"10.9.8.{i}"})
            codes.append(r.status_code if r.status_code != 429 else r.json()["meta"]["error"])
        if trusted:  # through a trusted proxy: four clients, one offer each
            assert codes == [201] * 4, codes
        else:  # one client (127.0.0.1): its third offer in the minute is refused
            assert codes == [201, 201, "too_many_offers", "too_many_offers"], codes
        if trusted:
            return
        # naming another address never uses up that address's rate
        victim = httpx.AsyncHTTPTransport(local_address="127.0.0.43")
        async def as_victim():
            async with httpx.AsyncClient(transport=victim, timeout=20) as http:
                return (await http.post(f"{srv.url}/whip/victim", content=sdp, headers=headers())).status_code
        for _ in range(3):
            httpx.post(f"{srv.url}/whip/forged", content=sdp, timeout=20,
                       headers={**headers(), "X-Forwarded-For": "127.0.0.43"})
        assert run(as_victim()) == 201
    finally:
        srv.close()


def test_offers_that_never_stream_from_many_addresses_cannot_keep_a_publisher_out():
    """Issue 44: never-connecting offers from a few addresses, each within its own per-address
    cap, filled every slot, and an honest publisher got 0 of 12 tries. Now at most --max-pending
    connections of every address together wait for their first frame (here 2 of 4 slots); a new
    one ends the waiting one of the address that offered most this minute (ties: the oldest), an
    address that offered more than every waiting one's is refused (503), and a publisher that
    offers once always gets in."""
    srv = start("--max-streams", "4", "--max-pending", "2", "--max-pending-per-source", "2",
                "--offers-per-minute", "20", "--whip-token", TOKEN)
    sdp = offer_sdp()

    async def post(address: str, name: str) -> int:
        transport = httpx.AsyncHTTPTransport(local_address=address)
        async with httpx.AsyncClient(transport=transport, timeout=20) as http:
            return (await http.post(f"{srv.url}/whip/{name}", content=sdp, headers=headers())).status_code

    async def main():
        codes = [await post(f"127.0.0.{2 + i}", f"squat{i}") for i in range(4)]
        assert codes == [201] * 4, codes  # each ended the oldest waiting one
        waiting = srv.manager.pending_connections()
        assert sorted(p.source for p in waiting) == ["127.0.0.4", "127.0.0.5"]  # the cap holds: 2, the newest
        assert len(srv.manager.ids()) == 2
        # 127.0.0.2 offers again: more often than the waiting ones' addresses, so it may not end them
        assert await post("127.0.0.2", "again") == 503
        honest = Publisher(srv.url, "/whip/honest", local_address="127.0.0.9")
        try:
            assert (await honest.start()).status_code == 201
            await wait_for(lambda: (s := srv.manager.get("honest")) is not None and s.processed >= 2)
            assert all(p.source != "127.0.0.9" for p in srv.manager.pending_connections())  # streaming now
            for i in range(3):  # and the waiting ones' churn never ends it
                await post(f"127.0.0.{10 + i}", f"late{i}")
            assert srv.manager.get("honest") is not None and not srv.manager.get("honest").closed
        finally:
            await honest.close()

    try:
        run(main())
    finally:
        srv.close()


def test_a_trusted_proxy_must_be_an_address():
    from streamstudio.app.cli.serve import proxy_options
    from streamstudio.errors import StreamStudioError

    class Args:
        trusted_proxy = ["not an address"]

    with pytest.raises(StreamStudioError, match="--trusted-proxy"):
        proxy_options(Args())
    Args.trusted_proxy = ["127.0.0.1", "10.0.0.0/8"]
    assert proxy_options(Args()) == {"proxy_headers": True, "forwarded_allow_ips": ["127.0.0.1", "10.0.0.0/8"]}


def count_calls(module):
    calls = [0]
    handle = module.register_forward_hook(lambda *args: calls.__setitem__(0, calls[0] + 1))
    return calls, handle


def fps_between(viewer: Viewer, t0: float, t1: float) -> float:
    return viewer.count_between(t0, t1) / (t1 - t0)


async def ten_viewers(srv, calls, window: float, freeze: bool) -> dict:
    pub = Publisher(srv.url, "/whip/show", token=None, fps=8)
    assert (await pub.start()).status_code == 201
    session = lambda: srv.manager.get("show")  # noqa: E731
    await wait_for(lambda: session() is not None and session().processed >= 5)
    c0, p0 = calls[0], session().processed  # UNet calls per processed frame with no viewer
    await asyncio.sleep(window / 2)
    out = {"alone": (calls[0] - c0) / max(1, session().processed - p0)}
    viewers = [Viewer(srv.url, "show", token=None) for _ in range(10)]
    try:
        for v in viewers:
            assert (await v.start()).status_code == 201
        await wait_for(lambda: all(len(v.times) >= 5 for v in viewers), timeout=60)
        c1, p1, t0 = calls[0], session().processed, time.monotonic()
        await asyncio.sleep(window)
        t1 = time.monotonic()
        out["watched"] = (calls[0] - c1) / max(1, session().processed - p1)
        out["before"] = [fps_between(v, t0, t1) for v in viewers[1:]]
        if freeze:
            viewers[0].frozen = True
            await asyncio.sleep(1)
            t2 = time.monotonic()
            await asyncio.sleep(window)
            out["during"] = [fps_between(v, t2, time.monotonic()) for v in viewers[1:]]
        out["whip"] = srv.app.state.whip.sessions.status()
    finally:
        await asyncio.gather(pub.close(), *(v.close() for v in viewers))
    return out


def watched_show(window: float, freeze: bool) -> dict:
    srv = start("--max-streams", "1", "--no-stream-batching", "--max-viewers-per-source", "16")  # (10 from here)
    calls, handle = count_calls(srv.manager.model.comps.unet)
    try:
        out = run(ten_viewers(srv, calls, window, freeze), timeout=240)
    finally:
        handle.remove()
        srv.close()
    print(out)
    return out


def test_ten_viewers_one_model_run_per_frame():
    out = watched_show(3.0, freeze=False)
    # one UNet call per frame (1 step), alone or watched by ten: never one per viewer
    assert out["watched"] <= 1.1 and out["watched"] == pytest.approx(out["alone"], abs=0.15)
    assert all(f > 2 for f in out["before"])  # every viewer gets frames (the publisher sends 8 fps)
    encoders = out["whip"]["streams"]["show"]
    assert list(encoders) == ["vp8"] and encoders["vp8"]["viewers"] == 10  # one encoder for all ten


@pytest.mark.slow
def test_a_frozen_viewer_does_not_slow_the_others():
    out = watched_show(6.0, freeze=True)
    before, during = out["before"], out["during"]
    assert sum(during) / len(during) >= 0.9 * sum(before) / len(before), (before, during)
    assert min(during) >= 0.9 * min(before)


def test_a_stalled_viewer_queue_is_bounded():
    """Server side: a viewer whose sender stops reading holds at most VIEWER_QUEUE frames, is
    reset to the next key frame (and asks for one); the other viewer of the codec gets all."""
    from streamstudio.app.web import fanout

    async def main():
        Track = fanout.viewer_track_class()
        asked = []
        stalled, live = Track("video", lambda: asked.append(1)), Track("video")
        got = []
        for i in range(200):
            key = i % 50 == 0
            stalled.push(i, key)
            live.push(i, key)
            got.append(await live.recv())
        assert got == list(range(200))
        assert len(stalled._queue) <= fanout.VIEWER_QUEUE and stalled.resets >= 1 and asked
        stalled.push(200, True)
        first = await stalled.recv()
        assert first % 50 == 0  # it starts again at a key frame
        stalled.stop()
        live.stop()

    run(main(), timeout=20)


def prefer(pc, kind: str, codec: str) -> None:
    from aiortc import RTCRtpSender

    caps = RTCRtpSender.getCapabilities(kind).codecs
    for t in pc.getTransceivers():
        if t.kind == kind:
            t.setCodecPreferences([c for c in caps if c.mimeType.lower() == f"{kind}/{codec}"])


def test_h264_with_audio_passed_through(server):
    """An H.264 publisher with audio (as OBS sends): H.264 viewers get the processed video and
    the publisher's audio."""
    from aiortc import AudioStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamError

    async def main():
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver(synthetic_track(10), direction="sendonly")
        pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
        prefer(pc, "video", "h264")
        await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient(timeout=20) as http:
            r = await http.post(f"{server.url}/whip/h264show", content=pc.localDescription.sdp, headers=headers())
            assert r.status_code == 201, r.text
            assert "H264" in r.text
            await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
            location = r.headers["location"]
            session = lambda: server.manager.get("h264show")  # noqa: E731
            await wait_for(lambda: session() is not None and session().processed >= 3)

            viewer = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            viewer.addTransceiver("video", direction="recvonly")
            viewer.addTransceiver("audio", direction="recvonly")
            prefer(viewer, "video", "h264")
            got = {"video": [], "audio": 0}

            def on_track(track):
                async def loop():
                    while True:
                        try:
                            frame = await track.recv()
                        except MediaStreamError:
                            return
                        if track.kind == "video":
                            got["video"].append(frame.to_ndarray(format="rgb24"))
                        else:
                            got["audio"] += 1
                asyncio.ensure_future(loop())

            viewer.on("track", on_track)
            await viewer.setLocalDescription(await viewer.createOffer())
            r = await http.post(f"{server.url}/whep/h264show", content=viewer.localDescription.sdp,
                                headers=headers())
            assert r.status_code == 201, r.text
            await viewer.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
            await wait_for(lambda: len(got["video"]) >= 5 and got["audio"] >= 20)
            assert got["video"][-1].shape == (48, SIZE, 3)  # the publisher's 4:3
            assert list(server.app.state.whip.sessions.status()["streams"]["h264show"]) == ["h264"]
            r = await http.delete(server.url + location, headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200
        await asyncio.gather(pc.close(), viewer.close())

    run(main())


def test_a_publisher_that_never_connects_is_freed(server):
    whip = server.app.state.whip
    saved, whip.sessions.pending_timeout = whip.sessions.pending_timeout, 1.5

    async def main():
        pub = Publisher(server.url, "/whip/ghost")
        from aiortc import RTCConfiguration, RTCPeerConnection

        pub.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pub.pc.addTransceiver(synthetic_track(10), direction="sendonly")
        await pub.pc.setLocalDescription(await pub.pc.createOffer())
        async with httpx.AsyncClient(timeout=20) as http:  # the answer is never applied: no ICE, no frame
            r = await http.post(server.url + "/whip/ghost", content=pub.pc.localDescription.sdp, headers=headers())
        assert r.status_code == 201
        assert server.manager.get("ghost") is not None  # the stream is held while it may connect
        await wait_for(lambda: server.manager.get("ghost") is None and not whip.resources, timeout=10)
        await pub.close()

    try:
        run(main())
    finally:
        whip.sessions.pending_timeout = saved


def test_a_viewer_watches_by_the_watch_id_and_never_learns_the_stream_id(server):
    """The Live tab shows `/whep/<watch id>` (issue 28): the stream id controls the stream (its
    settings, its outputs), so a viewer must never see it, neither in the URL nor in the
    resource's Location; the viewer gets frames, and DELETE on that Location ends it."""
    from streamstudio.app.web.ui import whep_text

    async def main():
        pub = Publisher(server.url, "/whip/controlid7")
        assert (await pub.start()).status_code == 201
        await wait_for(lambda: (s := server.manager.get("controlid7")) is not None and s.processed >= 2)
        watch = server.manager.get("controlid7").watch_id
        shown = whep_text(server.manager, "controlid7")
        assert f"/whep/{watch}`" in shown and "controlid7" not in shown
        viewer = Viewer(server.url, watch)
        try:
            r = await viewer.start()
            assert r.status_code == 201, r.text
            location = r.headers["location"]
            assert location.startswith(f"/whep/{watch}/") and "controlid7" not in location + r.text
            await wait_for(lambda: len(viewer.times) >= 3)
            async with httpx.AsyncClient(timeout=20) as http:
                wrong = await http.delete(server.url + location.replace(watch, "controlid7"),
                                          headers=headers())
                gone = await http.delete(server.url + location, headers=headers())
            assert wrong.status_code == 404 and gone.status_code == 200
        finally:
            await asyncio.gather(viewer.close(), pub.close())
            await pub.delete()

    run(main())


def test_connections_and_viewers_per_source_address_are_limited():
    """Issue 28: sixteen WHIP POSTs a minute from one address once kept most honest attempts
    busy, and 32 WHEP viewers from one process took every viewer place. One address now gets
    --offers-per-minute new connections (every kind counted together) and
    --max-viewers-per-source viewers; the answers say which limit, with 429."""
    srv = start("--offers-per-minute", "5", "--max-viewers-per-source", "2", "--whip-token", TOKEN)

    async def main():
        pub = Publisher(srv.url, "/whip/ratelimited")  # connection 1
        viewers = [Viewer(srv.url, "ratelimited") for _ in range(6)]
        try:
            assert (await pub.start()).status_code == 201
            await wait_for(lambda: (s := srv.manager.get("ratelimited")) is not None and s.processed >= 1)
            codes = [(await v.start()).status_code for v in viewers[:3]]  # connections 2, 3; a third viewer
            assert codes == [201, 201, 429], codes
            assert viewers[2].response.json()["meta"]["error"] == "too_many_viewers"
            await asyncio.gather(viewers[0].close(), viewers[1].close())
            await wait_for(lambda: not [r for r in srv.app.state.whip.resources.values() if r.kind == "whep"])
            assert (await viewers[3].start()).status_code == 201  # connection 4
            assert (await viewers[4].start()).status_code == 201  # connection 5
            await viewers[4].close()
            await wait_for(lambda: len([r for r in srv.app.state.whip.resources.values() if r.kind == "whep"]) == 1)
            r = await viewers[5].start()  # connection 6 within the minute
            assert r.status_code == 429 and r.json()["meta"]["error"] == "too_many_offers", r.text
            assert "at most 5 a minute" in r.json()["meta"]["message"]
            sendrecv = pub.pc.localDescription.sdp.replace("a=sendonly", "a=sendrecv")  # what /webrtc/offer takes
            offer = httpx.post(f"{srv.url}/webrtc/offer", json={"sdp": sendrecv, "type": "offer",
                                                               "webrtc_id": "another1"}, timeout=20)
            assert offer.json()["meta"]["error"] == "too_many_offers"  # the WebRTC API counts with them
        finally:
            await asyncio.gather(pub.close(), *(v.close() for v in viewers))

    try:
        run(main())
    finally:
        srv.close()


def test_a_viewer_whose_process_dies_is_dropped_within_seconds(server):
    """A WHEP viewer killed with SIGKILL (no DELETE, no DTLS close) held its place until ICE
    consent failed, about 27-30 s. Its RTCP reports stop with it: the server ends it within
    VIEWER_SILENCE_S of the last one, while another viewer of the stream goes on."""

    from streamstudio.app.web.whip_sessions import VIEWER_SILENCE_S

    whep = lambda: [r for r in server.app.state.whip.resources.values() if r.kind == "whep"]  # noqa: E731

    async def main():
        pub = Publisher(server.url, "/whip/diesoon")
        keeper = Viewer(server.url, "diesoon")
        proc = None
        try:
            assert (await pub.start()).status_code == 201
            await wait_for(lambda: (s := server.manager.get("diesoon")) is not None and s.processed >= 1)
            assert (await keeper.start()).status_code == 201
            proc, lines = await asyncio.wait_for(
                asyncio.to_thread(viewers_in_a_process, f"{server.url}/whep/diesoon", 1, TOKEN), 60)
            assert lines == ["201 watching"] and len(whep()) == 2
            proc.kill()
            killed = time.monotonic()
            await wait_for(lambda: len(whep()) == 1, timeout=25)
            gone_after = time.monotonic() - killed
            before = len(keeper.times)
            await asyncio.sleep(1.0)
            assert len(keeper.times) > before  # the other viewer goes on
        finally:
            if proc is not None:
                proc.kill()
            await asyncio.gather(pub.close(), keeper.close())
        return gone_after

    gone_after = run(main())
    assert gone_after <= VIEWER_SILENCE_S + 3, gone_after


def test_a_publisher_killed_without_delete_is_replaced_by_its_reconnect_and_viewers_go_on(server):
    """Issue 29: an encoder that crashes (SIGKILL: no DELETE, no DTLS close) held its stream name
    until the idle timeout, so its reconnect got 409 for 20 s. A new POST with valid credentials
    to the same name now replaces it at once (MediaMTX's default): the stale session ends, the
    stream (its session, settings and counters) goes on, and its WHEP viewer keeps receiving on
    the same resource without reconnecting. A stream whose source is not a WHIP publisher is
    still refused (409)."""
    whip = server.app.state.whip

    async def main():
        proc = None
        viewer = Viewer(server.url, "reconnect")
        pub = Publisher(server.url, "/whip/reconnect")
        try:
            proc, line = await asyncio.wait_for(
                asyncio.to_thread(publisher_in_a_process, f"{server.url}/whip/reconnect", TOKEN), 60)
            assert line.startswith("201 /whip/reconnect/"), line
            await wait_for(lambda: (s := server.manager.get("reconnect")) is not None and s.processed >= 2)
            session = server.manager.get("reconnect")
            assert (await viewer.start()).status_code == 201
            await wait_for(lambda: len(viewer.times) >= 3)
            viewer_rid = next(r.rid for r in whip.resources.values() if r.kind == "whep" and r.sid == "reconnect")
            proc.kill()
            proc.wait()
            t0 = time.monotonic()
            response = await pub.start()  # the encoder's reconnect, at once
            replaced_after = time.monotonic() - t0
            assert response.status_code == 201, response.text
            assert server.manager.get("reconnect") is session  # the same stream goes on
            publishers = [r for r in whip.resources.values() if r.kind == "whip" and r.sid == "reconnect"]
            assert [r.location for r in publishers] == [pub.location]  # the stale session ended
            processed = session.processed
            await wait_for(lambda: session.processed >= processed + 3, timeout=20)  # the new publisher's frames
            seen = len(viewer.times)
            await wait_for(lambda: len(viewer.times) >= seen + 3, timeout=20)
            assert viewer_rid in whip.resources and viewer.pc.connectionState == "connected"
            return replaced_after
        finally:
            if proc is not None:
                proc.kill()
            await asyncio.gather(pub.close(), viewer.close())

    assert run(main()) < 1.0


def test_a_stream_from_another_front_end_is_not_taken_over(server):
    """Replacing is for WHIP publishers only: a stream fed by the API's /webrtc/offer client keeps
    answering a WHIP POST to its name with 409."""
    from live_server import connected

    async def main():
        client, got = await connected(server.url, "a cat", token=TOKEN)
        try:
            await wait_for(lambda: len(got.processed()) >= 2)
            pub = Publisher(server.url, f"/whip/{client.webrtc_id}")
            try:
                response = await pub.start()
            finally:
                await pub.close()
            assert response.status_code == 409 and response.json()["meta"]["error"] == "stream_in_use"
            assert server.manager.get(client.webrtc_id) is not None
        finally:
            await client.close()

    run(main())


def test_one_address_cannot_hold_every_slot_with_offers_that_never_stream():
    """Issue 28: WHIP POSTs that never connect each held a stream slot for the pending timeout,
    so one address posting sixteen a minute kept most honest publishers busy. An address now
    holds at most --max-pending-per-source such connections (default half of --max-streams);
    the next gets 429 too_many_pending, and a publisher from another address still gets in."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    from streamstudio.app.web.sessions import SessionManager, pending_from

    srv = start("--max-streams", "4", "--max-pending-per-source", "2", "--whip-token", TOKEN)

    async def main():
        held, codes = [], []
        honest = Publisher(srv.url, "/whip/honest", local_address="127.0.0.2")
        try:
            for i in range(4):  # offers whose answers are never applied: they never connect
                pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
                held.append(pc)
                pc.addTransceiver("video", direction="sendonly")
                await pc.setLocalDescription(await pc.createOffer())
                r = httpx.post(f"{srv.url}/whip/squat{i}", content=pc.localDescription.sdp, headers=headers(),
                               timeout=20)
                codes.append(r.status_code if r.status_code != 429 else r.json()["meta"]["error"])
            assert codes == [201, 201, "too_many_pending", "too_many_pending"], codes
            assert (await honest.start()).status_code == 201  # another address: two slots are still free
            await wait_for(lambda: (s := srv.manager.get("honest")) is not None and s.processed >= 2)
            # the WebRTC API's offers count as the same address's pending connections
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            held.append(pc)
            pc.addTransceiver("video", direction="sendrecv")
            await pc.setLocalDescription(await pc.createOffer())
            r = httpx.post(f"{srv.url}/webrtc/offer", json={"sdp": pc.localDescription.sdp, "type": "offer",
                                                            "webrtc_id": "squat9"}, timeout=20)
            assert r.json()["meta"]["error"] == "too_many_pending", r.text
            api = []
            async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.3")) as http:
                for i in range(2):  # another address: its first takes the last slot; its second finds the
                    # server full and ends a waiting connection of 127.0.0.1, which offered more this minute
                    r = await http.post(f"{srv.url}/webrtc/offer", json={
                        "sdp": pc.localDescription.sdp, "type": "offer", "webrtc_id": f"api{i}"}, timeout=20)
                    api.append(r.json().get("meta", {}).get("error") or r.json().get("type"))
            assert api == ["answer", "answer"], api
            assert pending_from(srv.app.state.manager, "127.0.0.3") == 2  # counted by the WebRTC front end
            assert pending_from(srv.app.state.manager, "127.0.0.1") == 1
        finally:
            await asyncio.gather(honest.close(), *(pc.close() for pc in held))

    try:
        run(main())
        for slots, pending in ((4, 2), (5, 2), (1, 1)):  # the default: half the slots, at least 1
            manager = SessionManager(srv.manager.model, max_streams=slots)
            assert manager.max_pending_per_source == pending
            manager.shutdown()
    finally:
        srv.close()


def test_a_stream_that_ended_does_not_keep_its_name_from_a_new_publisher(server):
    """The stream's session ends (its idle timeout, DELETE on the session, the server) while its
    publisher's connection is still up; the watcher ends that connection at its next look (every
    0.5 s), and a new publisher of the name that came before it was refused with 409 (the outputs
    test's fixture met this in a loaded full run). The offer ends such orphans itself now: a
    publisher right after the stream ends is taken."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    first, line = publisher_in_a_process(f"{server.url}/whip/orphan", TOKEN)
    try:
        assert line.startswith("201 /whip/orphan/"), line
        assert wait_for_sync(lambda: (s := server.manager.get("orphan")) is not None and s.processed >= 2, 30)
        old = server.app.state.whip.sessions.publisher("orphan")

        async def main():
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTransceiver(synthetic_track(10), direction="sendonly")
            await pc.setLocalDescription(await pc.createOffer())
            server.manager.close("orphan", wait=5.0)  # the stream ends; its publisher is still connected
            async with httpx.AsyncClient(timeout=20) as http:  # and at once a new one comes
                r = await http.post(f"{server.url}/whip/orphan", content=pc.localDescription.sdp, headers=headers())
            assert r.status_code == 201, r.text  # not 409: the name is free again
            await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
            assert old.closed
            await pc.close()

        run(main())
    finally:
        first.kill()
        first.wait()
        server.manager.close("orphan", wait=5.0)
