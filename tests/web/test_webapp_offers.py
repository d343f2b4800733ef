"""POST /webrtc/offer against bad input, as an attacker sends it: every bad offer gets 400 and a
reason, holds no stream afterwards, and a normal client still connects at once; an offer that
never connects frees its stream within the bound; the server's ICE candidates and UDP sockets
stay on the address the server binds (loopback by default)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import httpx
import psutil
import pytest
from live_server import connected, run, start, wait_for

from streamstudio.app.web.sessions import BusyError

MAX_STREAMS = 2


@pytest.fixture(scope="module")
def server():
    srv = start("--max-streams", str(MAX_STREAMS))
    yield srv
    srv.close()


def stream_of(srv):
    return srv.server.config.app.state.studio_stream


def status(srv) -> dict:
    return httpx.get(f"{srv.url}/studio/status").json()


def assert_no_slot_held(srv, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        now = status(srv)
        if now["in_use"] == now["peer_connections"] == now["pending"] == now["streams"] == 0:
            return
        assert time.monotonic() < deadline, now
        time.sleep(0.1)


async def client_offer_sdp(close: bool = True) -> str:
    """A real offer as aiortc makes it (a data channel and a video track)."""
    from aiortc import RTCConfiguration, RTCPeerConnection, VideoStreamTrack

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("text")
    pc.addTrack(VideoStreamTrack())
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    if close:
        await pc.close()
    return sdp


@pytest.fixture(scope="module")
def good_sdp() -> str:
    return asyncio.run(client_offer_sdp())


def without(sdp: str, prefix: str) -> str:
    return "".join(line for line in sdp.splitlines(keepends=True) if not line.startswith(prefix))


def attacks(sdp: str) -> list[tuple[str, dict | bytes, str]]:
    """(name, body, the error code the server must give)."""
    def offer(**kw):
        return {"sdp": sdp, "type": "offer", "webrtc_id": "attack01", **kw}
    return [
        ("type answer", offer(type="answer"), "bad_type"),
        ("no type", {"sdp": sdp, "webrtc_id": "attack01"}, "bad_type"),
        ("no ice-ufrag", offer(sdp=without(sdp, "a=ice-ufrag")), "bad_sdp"),
        ("no ice-pwd", offer(sdp=without(sdp, "a=ice-pwd")), "bad_sdp"),
        ("no fingerprint", offer(sdp=without(sdp, "a=fingerprint")), "bad_sdp"),
        ("no m= line", offer(sdp=sdp.split("m=")[0]), "bad_sdp"),
        # directions the stream cannot use (recvonly with a data channel once leaked fastrtc tasks for ever)
        ("video recvonly", offer(sdp=sdp.replace("a=sendrecv", "a=recvonly")), "bad_direction"),
        ("video sendonly", offer(sdp=sdp.replace("a=sendrecv", "a=sendonly")), "bad_direction"),
        ("video inactive", offer(sdp=sdp.replace("a=sendrecv", "a=inactive")), "bad_direction"),
        ("garbage sdp", offer(sdp="hello, world"), "bad_sdp"),
        ("broken m= line", offer(sdp="v=0\r\nm=video\r\n"), "bad_sdp"),
        ("sdp not a string", offer(sdp=["v=0"]), "bad_sdp"),
        ("no sdp", offer(sdp=None), "bad_sdp"),
        ("huge sdp", offer(sdp=sdp + "a=x-padding:" + "x" * 40_000 + "\r\n"), "sdp_too_large"),
        ("huge body", offer(junk="x" * 300_000), "body_too_large"),
        ("bad webrtc_id", offer(webrtc_id="../../etc"), "bad_webrtc_id"),
        ("long webrtc_id", offer(webrtc_id="a" * 65), "bad_webrtc_id"),
        ("numeric webrtc_id", offer(webrtc_id=12), "bad_webrtc_id"),
        ("empty webrtc_id", offer(webrtc_id=""), "bad_webrtc_id"),
        ("not json", b"{sdp: nope", "bad_request"),
        ("json list", b"[1, 2]", "bad_request"),
        ("candidate for nobody", {"type": "ice-candidate", "webrtc_id": "nobody",
                                  "candidate": {"candidate": "candidate:1 1 udp 1 10.0.0.1 9 typ host"}},
         "unknown_connection"),
    ]


def post(url: str, body) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{url}/webrtc/offer", content=body, headers={"content-type": "application/json"})
    return httpx.post(f"{url}/webrtc/offer", content=json.dumps(body), headers={"content-type": "application/json"})


def test_bad_offers_are_refused_and_hold_no_slot(server, good_sdp):
    for name, body, code in attacks(good_sdp):
        for _ in range(MAX_STREAMS + 3):  # far past --max-streams
            r = post(server.url, body)
            data = r.json()
            if r.status_code == 413 and code == "body_too_large":  # the request guard's cap came first
                assert "too large" in data["error"]
                continue
            assert r.status_code in (400, 404), (name, r.status_code, r.text[:300])
            assert data["status"] == "failed" and data["meta"]["error"] == code, (name, data)
            assert data["meta"]["message"], name
        assert_no_slot_held(server, timeout=0.5)
    stream = stream_of(server)
    assert not stream.pcs and not stream.connections and not stream.handlers


def test_missing_ice_ufrag_message_says_why(server, good_sdp):
    r = post(server.url, {"sdp": without(good_sdp, "a=ice-ufrag"), "type": "offer", "webrtc_id": "x1"})
    assert r.status_code == 400 and "ice-ufrag" in r.json()["meta"]["message"]
    r = post(server.url, {"sdp": good_sdp, "type": "answer", "webrtc_id": "x1"})
    assert r.status_code == 400 and '"offer"' in r.json()["meta"]["message"]


def test_a_normal_client_connects_at_once_after_the_attacks(server, good_sdp):
    for name, body, _ in attacks(good_sdp):
        for _ in range(MAX_STREAMS + 2):
            post(server.url, body)

    async def main():
        t0 = time.monotonic()
        client, got = await connected(server.url, "a cat")
        try:
            await wait_for(lambda: len(got.processed()) >= 3, timeout=15)
        finally:
            await client.close()
        return time.monotonic() - t0

    assert run(main()) < 15
    assert_no_slot_held(server, timeout=15)


def test_failures_inside_fastrtc_free_the_slot(server, good_sdp, monkeypatch):
    """An offer that passes the checks but fails in aiortc/fastrtc after taking a slot: the peer
    connection is closed and every table entry dropped; a bug answers 500, bad input 400."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    stream = stream_of(server)
    made = []

    def failing(error):
        async def handle_offer(body, set_outputs):
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            made.append(pc)
            stream.pcs[body["webrtc_id"]] = pc
            stream.handlers[body["webrtc_id"]] = object()
            raise error

        return handle_offer

    for error, code, expected in ((ValueError("Media sections in answer do not match offer"), 400, "offer_refused"),
                                  (RuntimeError("a bug"), 500, "internal_error")):
        monkeypatch.setattr(stream, "handle_offer", failing(error))
        r = post(server.url, {"sdp": good_sdp, "type": "offer", "webrtc_id": f"fail{code}"})
        assert r.status_code == code and r.json()["meta"]["error"] == expected, r.text
        assert made[-1].connectionState == "closed"
        assert f"fail{code}" not in stream.pcs and f"fail{code}" not in stream.handlers
        assert_no_slot_held(server, timeout=0.5)


def test_an_offer_never_completed_frees_its_slot(server, good_sdp):
    """Answered offers that never connect count against --max-streams, then go after the bound."""
    stream = stream_of(server)
    saved, stream.pending_timeout = stream.pending_timeout, 1.5

    async def main():
        sdps = [await client_offer_sdp() for _ in range(MAX_STREAMS)]  # their clients are gone
        async with httpx.AsyncClient(timeout=20) as http:
            for i, sdp in enumerate(sdps):
                r = await http.post(f"{server.url}/webrtc/offer",
                                    json={"sdp": sdp, "type": "offer", "webrtc_id": f"ghost{i}"})
                assert r.status_code == 200 and r.json()["type"] == "answer", r.text
                held = (await http.get(f"{server.url}/studio/status")).json()
                assert held["pending"] == held["peer_connections"] == held["in_use"] == i + 1, held
            t0 = time.monotonic()
            with pytest.raises(BusyError):  # the pending offers hold every stream
                await connected(server.url, "one too many")
            await wait_for(lambda: not stream.pcs, timeout=5)
            freed_after = time.monotonic() - t0
        stream.pending_timeout = saved
        client, got = await connected(server.url, "a dog")  # at once, not 30 or 60 s later
        try:
            await wait_for(lambda: len(got.processed()) >= 2, timeout=15)
        finally:
            await client.close()
        return freed_after

    try:
        assert run(main()) < 4.0
    finally:
        stream.pending_timeout = saved
    assert_no_slot_held(server, timeout=15)


async def connect_with(server, track, webrtc_id: str):
    """An aiortc client sending `track` (and the data channel fastrtc waits for), its offer
    answered by the server's /webrtc/offer; the caller closes it."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("text")
    pc.addTrack(track)
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(timeout=20) as http:
        r = await http.post(f"{server.url}/webrtc/offer",
                            json={"sdp": pc.localDescription.sdp, "type": "offer", "webrtc_id": webrtc_id})
    await pc.setRemoteDescription(RTCSessionDescription(**r.json()))
    return pc


def test_a_connection_that_sends_no_frame_is_freed(server):
    """Connected (ICE and DTLS up) but never a frame: no session, so freed after the bound too."""
    from aiortc import VideoStreamTrack

    class Silent(VideoStreamTrack):
        async def recv(self):
            await asyncio.Event().wait()

    stream = stream_of(server)
    saved, stream.pending_timeout = stream.pending_timeout, 3.0

    async def main():
        pc = await connect_with(server, Silent(), "silent")
        try:
            await wait_for(lambda: pc.connectionState == "connected", timeout=10)
            held = status(server)
            assert held["pending"] == held["in_use"] == 1 and held["streams"] == 0, held
            await wait_for(lambda: "silent" not in stream.pcs, timeout=8)
        finally:
            await pc.close()

    try:
        run(main())
    finally:
        stream.pending_timeout = saved
    assert_no_slot_held(server, timeout=5)


def test_a_client_that_stops_sending_frees_its_slot_after_the_idle_timeout(server):
    """A client that sent frames and then stopped held its slot for the idle timeout (its session
    reaped) plus the pending timeout (its connection, now without a session): about 40 s against
    the documented 20. Now the connection goes with its session."""
    from aiortc import VideoStreamTrack

    class Stalls(VideoStreamTrack):
        sent = 0

        async def recv(self):
            if self.sent >= 5:
                await asyncio.Event().wait()  # the camera froze: no more frames, the connection stays up
            self.sent += 1
            return await super().recv()

    stream, manager = stream_of(server), server.manager
    saved = stream.pending_timeout, manager.idle_timeout
    stream.pending_timeout, manager.idle_timeout = 30.0, 1.0

    async def main():
        pc = await connect_with(server, Stalls(), "stalls")
        try:
            await wait_for(lambda: manager.get("stalls") is not None, timeout=15)  # frames came: a session
            t0 = time.monotonic()
            await wait_for(lambda: "stalls" not in stream.pcs, timeout=8)  # idle 1 s + the reaper's second
            assert time.monotonic() - t0 < 8 and pc.connectionState != "failed"
        finally:
            await pc.close()

    try:
        run(main())
    finally:
        stream.pending_timeout, manager.idle_timeout = saved
    assert_no_slot_held(server, timeout=5)


def test_duplicate_webrtc_id_is_refused(server, good_sdp):
    stream = stream_of(server)
    saved, stream.pending_timeout = stream.pending_timeout, 1.5
    try:
        body = {"sdp": good_sdp, "type": "offer", "webrtc_id": "twice"}
        assert post(server.url, body).status_code == 200
        r = post(server.url, body)
        assert r.status_code == 409 and r.json()["meta"]["error"] == "connection_already_exists"
        assert_no_slot_held(server, timeout=5)
    finally:
        stream.pending_timeout = saved


def test_an_offer_cannot_join_a_running_stream_of_another_front_end(server, good_sdp):
    """A stream already running under that id (a WHIP publisher, the fallback webcam) is not
    joined: two sources' frames would mix in one stream."""
    server.manager.open("taken-by-whip")
    try:
        r = post(server.url, {"sdp": good_sdp, "type": "offer", "webrtc_id": "taken-by-whip"})
        assert r.status_code == 409 and r.json()["meta"]["error"] == "connection_already_exists"
        assert not stream_of(server).pcs
    finally:
        server.manager.close("taken-by-whip", wait=0.0)
    assert_no_slot_held(server, timeout=5)


# ---------------------------------------------------------------------- ICE on the bound address
def candidate_hosts(sdp: str) -> list[tuple[str, int]]:
    out = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            parts = line.split()
            out.append((parts[4], int(parts[5])))
    return out


def udp_sockets() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="udp")}


def server_ice_sockets(pc) -> list[tuple[str, int]]:
    """The local addresses of the UDP sockets aioice opened for a server peer connection."""
    out = []
    for transceiver in pc.getTransceivers():
        connection = transceiver.receiver.transport.transport.iceGatherer._connection
        out += [p.transport.get_extra_info("sockname")[:2] for p in connection._protocols]
    return out


def test_server_ice_is_loopback_only_by_default(server):
    stream = stream_of(server)
    assert stream.ice_addresses == ("127.0.0.1",)
    before = udp_sockets()

    async def main():
        client, got = await connected(server.url, "a cat")
        try:
            await wait_for(lambda: len(got.processed()) >= 2, timeout=15)
            answer = client.pc.remoteDescription.sdp
            mine = {(ip, port) for ip, port in candidate_hosts(client.pc.localDescription.sdp)}
            opened = udp_sockets() - before
            server_pc = stream.pcs[client.webrtc_id]
            return answer, mine, opened, server_ice_sockets(server_pc)
        finally:
            await client.close()

    answer, mine, opened, server_sockets = run(main())
    hosts = candidate_hosts(answer)
    assert hosts and all(ip == "127.0.0.1" for ip, _ in hosts), hosts
    assert server_sockets and all(ip == "127.0.0.1" for ip, _ in server_sockets), server_sockets
    # every UDP socket this process opened meanwhile is the client's own or on loopback
    client_ports = {port for _, port in mine}
    stray = [(ip, port) for ip, port in opened if port not in client_ports and ip != "127.0.0.1"]
    assert not stray, (stray, opened, mine)
    assert {port for _, port in hosts} <= {port for ip, port in opened if ip == "127.0.0.1"}


def test_every_route_of_the_app_gathers_on_the_bound_address(server):
    """The Gradio WebRTC component answers its offers in its own route: any request of the app
    runs in the scope, so its peer connections gather on loopback too."""
    import aioice.ice

    async def gather():
        connection = aioice.ice.Connection(ice_controlling=False)
        await connection.gather_candidates()
        hosts = [c.host for c in connection.local_candidates]
        await connection.close()
        return hosts

    app = server.server.config.app
    app.add_api_route("/test-only/gather", gather)
    app.router.routes.insert(0, app.router.routes.pop())  # before the Gradio app mounted at /
    assert httpx.get(f"{server.url}/test-only/gather").json() == ["127.0.0.1"]
    assert "127.0.0.1" not in asyncio.run(gather())  # this test's own loop: aioice's own list


def test_ice_addresses_follow_the_bind_address():
    from streamstudio.app.web.ice import ice_addresses

    assert ice_addresses(None) == ("127.0.0.1",)
    assert ice_addresses("127.0.0.1") == ("127.0.0.1",)
    assert ice_addresses("localhost") == ("127.0.0.1",)
    assert ice_addresses("::1") == ("::1",)
    assert ice_addresses("[::1]") == ("::1",)
    assert ice_addresses("10.1.2.3") == ("10.1.2.3",)
    assert ice_addresses("0.0.0.0") is None and ice_addresses("::") is None


def test_the_scope_is_narrow():
    """Inside a scope aioice gathers on its addresses only; outside it, as aioice always does."""
    import aioice.ice

    from streamstudio.app.web import ice

    ice.install()
    ice.install()  # idempotent
    default = ice._original(use_ipv4=True, use_ipv6=True)
    assert aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True) == default

    async def gather(addresses):
        connection = aioice.ice.Connection(ice_controlling=False)
        with ice.scoped(addresses) if addresses != "none" else contextlib.nullcontext():
            await connection.gather_candidates()
        hosts = [c.host for c in connection.local_candidates]
        await connection.close()
        return hosts

    assert asyncio.run(gather(("127.0.0.1",))) == ["127.0.0.1"]
    assert asyncio.run(gather("none")) == default
    assert asyncio.run(gather(None)) == default  # --host 0.0.0.0: aioice's own list
    assert ice.current() is None


def test_build_stream_takes_the_host(server):
    from streamstudio.app.web.webrtc import build_stream

    assert build_stream(server.manager, host="0.0.0.0").ice_addresses is None
    assert build_stream(server.manager, host="127.0.0.1").ice_addresses == ("127.0.0.1",)
    assert build_stream(server.manager).ice_addresses == ("127.0.0.1",)
    assert build_stream(server.manager, pending_timeout=2.0).pending_timeout == 2.0


def live_component_of(srv):
    """The Live tab's WebRTC component (the browser's offers go to it, not to /webrtc/offer)."""
    from streamstudio.app.web.security import _find_gradio_app
    from streamstudio.app.web.webrtc import GuardedOffers

    blocks = _find_gradio_app(srv.server.config.app).get_blocks()
    return next(b for b in blocks.blocks.values() if isinstance(b, GuardedOffers))


def test_the_live_tabs_offer_route_is_guarded_too(server, good_sdp):
    """The same attacks through Gradio's component route (`fn_name: offer` of the Live tab's
    component): refused with the same codes, nothing held afterwards."""
    component = live_component_of(server)
    import streamstudio.app.web.webrtc as module
    assert not Path(module.__file__).with_suffix(".pyi").exists(), "Gradio wrote a stub into the package"
    config = httpx.get(f"{server.url}/config").json()
    assert "offer" in next(c for c in config["components"] if c["id"] == component._id)["props"]["server_fns"]
    for name, body, code in attacks(good_sdp):
        if isinstance(body, bytes) or code == "body_too_large":
            continue  # the component route takes any JSON; the guard caps bodies for every route
        for _ in range(MAX_STREAMS + 2):
            r = httpx.post(f"{server.url}/gradio_api/component_server", json={
                "component_id": component._id, "fn_name": "offer", "data": body, "session_hash": "attacker"})
            data = r.json()
            assert r.status_code in (400, 404), (name, r.status_code, r.text[:300])
            assert data["meta"]["error"] == code, (name, data)
    assert not component.pcs and not component.connections and not component.handlers
    assert_no_slot_held(server, timeout=0.5)


def test_only_the_page_that_streams_sets_its_streams_inputs(server, monkeypatch):
    """The Live tab's inputs (prompt, sliders) reach a stream through the component's
    `set_input_gradio`, in a Gradio event of the page that sent them (issue 28): the first page
    owns the stream; another page that learnt its id sets nothing and records nothing."""
    from types import SimpleNamespace

    from gradio.context import LocalContext

    from streamstudio.app.web.webrtc import may_control

    component = live_component_of(server)
    reached = []
    monkeypatch.setattr(type(component), "set_input", lambda self, sid, *args: reached.append((sid, args)))
    monkeypatch.setitem(component.pcs, "ownedstream1", object())  # its page's connection is open

    def as_page(page: str, *args):
        token = LocalContext.request.set(SimpleNamespace(session_hash=page, username=None))
        try:
            component.set_input_gradio("ownedstream1", *args)
        finally:
            LocalContext.request.reset(token)

    as_page("page-a", "a cat")
    as_page("page-b", "a forged prompt")
    as_page("page-a", "a dog")
    assert [args[-1] for _, args in reached] == ["a cat", "a dog"]
    assert server.manager.owner("ownedstream1") == "page-a"
    assert may_control(server.manager, "ownedstream1", "page-a")
    assert not may_control(server.manager, "ownedstream1", "page-b")
    assert may_control(server.manager, "ownedstream1", "page-b", operator=True)  # serve --auth: logged in
    server.manager.close("ownedstream1")
