"""Issue 28's and issue 44's attacks replayed against `streamstudio serve --model tiny` in its own process,
with an honest stream running throughout: offers of every direction (the WebRTC API and the Live
tab's component route), WHIP POSTs that never connect, uploads with forged headers, concurrent
chunked uploads, malformed multipart bodies, Gradio's unused recording route, Live-output Starts
from made-up sessions, WHEP viewers past the per-address cap and viewers whose process is killed.

Afterwards the server's threads, resident memory, idle CPU and the bytes it holds on disk are
back at their baseline (taken after a warm-up that started everything lazy), the honest stream
kept its frames, and every refusal was the documented one. `-s` prints the figures."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from live_server import viewers_in_a_process
from rtmp_server import free_port

psutil = pytest.importorskip("psutil")
pytest.importorskip("aiortc")

pytestmark = pytest.mark.slow

def pattern(i: int) -> np.ndarray:
    img = np.zeros((64, 64, 3), np.uint8)
    img[:, : (i * 5) % 64] = (200, 60, 90)
    return img


class Server:
    """`streamstudio serve` in a subprocess, its temporary files in `root`."""

    def __init__(self, root: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.root = root
        for name in ("spool", "gradio", "out"):
            (root / name).mkdir()
        env = {**os.environ, "TMPDIR": str(root / "spool"), "GRADIO_TEMP_DIR": str(root / "gradio"),
               "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamstudio", "serve", "--model", "tiny", "--device", "cpu", "--width", "64",
             "--height", "64", "--port", str(self.port), "--max-streams", "3", "--idle-timeout", "5",
             "--max-upload-size", "200kb", "--max-upload-total", "600kb", "--upload-ttl", "10",
             "--max-viewers-per-source", "4", "--offers-per-minute", "200", "--output-dir", str(root / "out"),
             "--threads", "1", *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.process = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()[-3000:]
            try:
                if httpx.get(f"{self.url}/studio/status", timeout=2).status_code in (200, 401):  # 401: a token
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("the server did not start")

    def figures(self, cpu_window: float = 3.0) -> dict:
        p = self.process
        p.cpu_percent(None)
        time.sleep(cpu_window)
        disk = sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())
        return {"threads": p.num_threads(), "rss_mb": p.memory_info().rss / 2**20,
                "cpu_percent": p.cpu_percent(None), "disk_bytes": disk,
                "files": sorted(str(f.relative_to(self.root)) for f in self.root.rglob("*") if f.is_file())}

    def close(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err


async def client_offer(direction: str = "sendrecv", channel: bool = True) -> str:
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction=direction)
    if channel:
        pc.createDataChannel("text")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def gradio_event(url: str, output_elem: str, inputs: int) -> dict:
    config = httpx.get(f"{url}/config").json()
    target = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == output_elem)
    return next(d for d in config["dependencies"] if d["outputs"] == [target] and len(d["inputs"]) == inputs)


def run_event(url: str, event: dict, data: list, session: str) -> dict:
    body = {"data": data, "event_data": None, "fn_index": event["id"], "trigger_id": event["targets"][0][0],
            "session_hash": session}
    assert httpx.post(f"{url}/gradio_api/queue/join", json=body).status_code == 200
    with httpx.stream("GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}, timeout=30) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    return message
    raise AssertionError("the event never completed")


def upload(url: str, size: int, name: str, headers: dict | None = None) -> int:
    return httpx.post(f"{url}/gradio_api/upload", files={"files": (name, b"p" * size)}, headers=headers,
                      timeout=30).status_code


def chunked_upload(url: str, i: int, size: int = 150_000) -> int:
    def body():
        yield (f'--b{i}\r\nContent-Disposition: form-data; name="files"; filename="c{i}.ply"\r\n'
               "Content-Type: application/octet-stream\r\n\r\n").encode()
        for _ in range(size // 10_000):
            time.sleep(0.01)
            yield b"p" * 10_000
        yield f"\r\n--b{i}--\r\n".encode()

    return httpx.post(f"{url}/gradio_api/upload", content=body(), timeout=60,
                      headers={"content-type": f"multipart/form-data; boundary=b{i}"}).status_code


def warm_up(srv: Server) -> None:
    """Start what the server starts lazily (a stream, its encoder for a viewer, an upload)."""
    from studio_client import StudioClient

    async def stream():
        client = StudioClient(srv.url, pattern, fps=10)
        await client.connect(settings={"prompt": "warm"})
        await asyncio.sleep(2)
        watch = httpx.get(f"{srv.url}/studio/sessions/{client.webrtc_id}").json()
        assert watch  # the stream runs
        loop = asyncio.get_running_loop()  # (the client keeps sending on this loop meanwhile)
        proc, lines = await loop.run_in_executor(None, viewers_in_a_process, f"{srv.url}/whep/{client.webrtc_id}", 1)
        assert lines == ["201 watching"], lines
        proc.kill()
        proc.wait()
        await client.close()

    asyncio.run(stream())
    assert upload(srv.url, 1000, "warm.ply") == 200


def attack(srv: Server, honest_id: str) -> dict:
    """Every attack once; returns what the server answered, by attack."""
    import concurrent.futures

    said: dict[str, list] = {}
    url = srv.url
    # offers of every direction, through the API and the Live tab's component route
    config = httpx.get(f"{url}/config").json()
    live = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "live-webrtc")
    for direction in ("sendonly", "recvonly", "inactive"):
        sdp = asyncio.run(client_offer(direction))
        for i in range(10):
            body = {"sdp": sdp, "type": "offer", "webrtc_id": f"dir{direction}{i}"}
            r = httpx.post(f"{url}/webrtc/offer", json=body, timeout=20)
            said.setdefault("offer " + direction, []).append(r.json()["meta"]["error"])
            r = httpx.post(f"{url}/gradio_api/component_server", json={
                "component_id": live, "fn_name": "offer", "data": body, "session_hash": f"evil{i}"}, timeout=20)
            said.setdefault("component " + direction, []).append(r.json()["meta"]["error"])
    # sendrecv offers that never connect, and WHIP POSTs that never connect: each would hold a slot
    sdp = asyncio.run(client_offer("sendrecv"))
    for i in range(6):
        r = httpx.post(f"{url}/webrtc/offer", json={"sdp": sdp, "type": "offer", "webrtc_id": f"squat{i}"},
                       timeout=20).json()
        said.setdefault("offer never connected", []).append(r.get("type") or r["meta"]["error"])
    whip_sdp = asyncio.run(client_offer("sendonly", channel=False))
    for i in range(16):
        r = httpx.post(f"{url}/whip/squat-whip{i}", content=whip_sdp, headers={"Content-Type": "application/sdp"},
                       timeout=20)
        said.setdefault("whip never connected", []).append(r.status_code if r.status_code == 201
                                                          else r.json()["meta"]["error"])
    # uploads with a made-up Authorization each; concurrent chunked uploads past the total
    said["forged uploads"] = [upload(url, 1000, f"f{i}.ply", {"authorization": f"Bearer forged-{i}"})
                              for i in range(25)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        said["chunked uploads"] = list(pool.map(lambda i: chunked_upload(url, i), range(8)))
    said["malformed multipart"] = [httpx.post(f"{url}/gradio_api/upload", content=b"v=0\r\na=x\r\n", timeout=20,
                                              headers={"content-type": "multipart/form-data; boundary=x"}).status_code
                                   for _ in range(10)]
    said["process_recording"] = [httpx.post(f"{url}/gradio_api/process_recording",
                                            files={"video": ("a.mp4", b"x" * 1000)}, timeout=20).status_code
                                 for _ in range(5)]
    # Live output Starts from made-up sessions against the honest stream
    start = gradio_event(url, "output-status", 5)  # (the page's stream, the stream chosen, kind, target, fps)
    said["foreign outputs"] = [run_event(url, start, [honest_id, honest_id if i % 2 else "live", "file",
                                                      f"steal{i}.mp4", 30], f"forged{i}")["output"]["data"][0][:60]
                               for i in range(40)]
    # viewers past the per-address cap, then their process killed without a word
    proc, lines = viewers_in_a_process(f"{url}/whep/{honest_id}", 6)
    said["viewers"] = lines
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return said


def test_the_attacks_leave_the_server_as_it_was(tmp_path):
    from studio_client import StudioClient

    srv = Server(tmp_path)
    try:
        warm_up(srv)
        time.sleep(12)  # the warm-up's stream reaped, its upload past the TTL
        before = srv.figures()

        async def honest_run():
            got = []
            client = StudioClient(srv.url, pattern, lambda frame, t: got.append(t), fps=8)
            await client.connect(settings={"prompt": "honest"})
            loop = asyncio.get_running_loop()
            said = await loop.run_in_executor(None, attack, srv, client.webrtc_id)
            t = time.monotonic()
            n0 = len(got)
            await asyncio.sleep(3)
            said["honest fps after"] = (len(got) - n0) / (time.monotonic() - t)
            await client.close()
            return said

        said = asyncio.run(honest_run())
        deadline = time.monotonic() + 60  # pending connections time out (20 s), uploads pass their TTL
        while True:
            after = srv.figures()
            status = httpx.get(f"{srv.url}/studio/status").json()
            settled = after["threads"] <= before["threads"] + 2 and after["disk_bytes"] <= before["disk_bytes"] \
                and status["peer_connections"] == 0 and status["streams"] == 0
            if settled or time.monotonic() > deadline:
                break
    finally:
        log = srv.close()
    print(json.dumps({"before": before, "after": after, "said": said}, indent=1, default=str))

    assert set(said["offer sendonly"]) == set(said["offer recvonly"]) == {"bad_direction"}
    assert set(said["component recvonly"]) == set(said["component inactive"]) == {"bad_direction"}
    assert said["offer never connected"].count("answer") <= 1  # one address: half of 3 slots, at least 1
    assert set(said["offer never connected"]) <= {"answer", "too_many_pending"}
    assert set(said["whip never connected"]) <= {"too_many_pending", "busy"}
    assert said["forged uploads"].count(200) <= 20 and set(said["forged uploads"]) <= {200, 429, 507}
    assert set(said["chunked uploads"]) <= {200, 429, 507}  # (the forged ones used up this address's quota)
    assert set(said["malformed multipart"]) <= {400, 429} and set(said["process_recording"]) == {404}
    assert all("not this page's" in s for s in said["foreign outputs"]), said["foreign outputs"][:3]
    assert said["viewers"].count("201 watching") == 4 and said["viewers"].count("429 too_many_viewers") == 2
    assert said["honest fps after"] > 2, said["honest fps after"]
    assert status["streams"] == 0 and status["peer_connections"] == 0, status
    assert after["threads"] <= before["threads"] + 2, (before, after)
    assert after["rss_mb"] <= before["rss_mb"] + 100, (before, after)
    assert after["cpu_percent"] <= before["cpu_percent"] + 5, (before, after)
    assert after["disk_bytes"] <= before["disk_bytes"], (before["files"], after["files"])
    assert not list((tmp_path / "out").iterdir())  # no recording was started for an attacker
    assert "Traceback" not in log, log[-3000:]


# ---------------------------------------------------------------------- issue 44: the doors, proxies, slots, OSC
TOKEN = "replay-token"


def whip_post(url: str, sdp: str, name: str, address: str | None = None, headers: dict | None = None):
    transport = httpx.HTTPTransport(local_address=address) if address else None
    with httpx.Client(transport=transport, timeout=20) as http:
        r = http.post(f"{url}/whip/{name}", content=sdp, headers={
            "Content-Type": "application/sdp", "Authorization": f"Bearer {TOKEN}", **(headers or {})})
    return r.status_code if r.status_code == 201 else r.json()["meta"]["error"]


def osc_packet(address: str, payload: bytes = b"") -> bytes:
    def pad(raw: bytes) -> bytes:
        return raw + b"\0" * (4 - len(raw) % 4)
    return pad(address.encode()) + pad(b",") + payload


def attack_44(srv: Server, osc_port: int, honest: str) -> dict:
    """Issue 44's attacks once each; returns what the server answered, by attack."""
    said: dict[str, list] = {}
    url = srv.url
    # the control routes without the token: steer, end, push out the honest stream by its name
    said["control without a token"] = [
        httpx.post(f"{url}/studio/settings/{honest}", json={"prompt": "taken over"}).status_code,
        httpx.delete(f"{url}/studio/sessions/{honest}").status_code,
        httpx.post(f"{url}/studio/outputs/{honest}", json={"kind": "file", "target": "x.mp4"}).status_code,
        httpx.post(f"{url}/studio/settings/{honest}", json={"prompt": "x"},
                   headers={"Authorization": "Bearer guessed"}).status_code]
    sdp = asyncio.run(client_offer("sendonly", channel=False))
    # 25 offers, each naming another client in X-Forwarded-For
    said["forwarded rotating"] = [whip_post(url, sdp, f"fwd{i}", headers={"X-Forwarded-For": f"10.1.2.{i}"})
                                  for i in range(25)]
    # 20 offers naming 127.0.0.43, then 127.0.0.43 itself
    for i in range(20):
        whip_post(url, sdp, f"frame{i}", headers={"X-Forwarded-For": "127.0.0.43"})
    said["the named address"] = [whip_post(url, sdp, "named", address="127.0.0.43")]
    # never-connecting offers from 20 addresses, three rounds, then an honest publisher from another
    said["twenty addresses"] = [whip_post(url, sdp, f"squat{r}-{i}", address=f"127.0.0.{2 + i}")
                                for r in range(3) for i in range(20)]
    stop = threading.Event()

    def keep_squatting():
        r = 3
        while not stop.is_set():
            for i in range(20):
                if stop.is_set():
                    return
                whip_post(url, sdp, f"squat{r}-{i}", address=f"127.0.0.{2 + i}")
            r += 1

    squatter = threading.Thread(target=keep_squatting, daemon=True)
    squatter.start()
    try:
        said["honest publisher"] = [asyncio.run(publish_from("127.0.0.30", f"{url}/whip/honest-whip", srv))]
    finally:
        stop.set()
        squatter.join(30)
    # OSC: a 32-byte query, invalid UTF-8, a 3,000-deep bundle
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(1.0)
        query = osc_packet(f"/streamstudio/{honest}/get")  # 40 bytes
        sock.sendto(query, ("127.0.0.1", osc_port))
        got = []
        try:
            while True:
                got.append(len(sock.recv(65536)))
        except TimeoutError:
            pass
        said["osc get"] = [len(query), sum(got)]
        bad_utf8 = b"/streamstudio/\xff\xfe/prompt\0\0,s\0\0x\0\0\0"
        deep = b"".join([b"#bundle\0" + b"\0" * 8 + (10 ** 6).to_bytes(4, "big")] * 3000)
        for _ in range(50):
            sock.sendto(bad_utf8, ("127.0.0.1", osc_port))
        sock.sendto(deep, ("127.0.0.1", osc_port))
    return said


async def publish_from(address: str, url: str, srv: Server) -> str:
    """An honest WHIP publisher from `address`: its POST's answer, then whether it streams."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription, VideoStreamTrack

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver(VideoStreamTrack(), direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    try:
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address), timeout=20) as http:
            r = await http.post(url, content=pc.localDescription.sdp, headers={
                "Content-Type": "application/sdp", "Authorization": f"Bearer {TOKEN}"})
            if r.status_code != 201:
                return f"{r.status_code} {r.json()['meta']['error']}"
            await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
            stream = url.rsplit("/", 1)[1]
            for _ in range(150):  # streaming: its frames reach the model
                stats = (await http.get(f"{srv.url}/studio/sessions/{stream}",
                                        headers={"Authorization": f"Bearer {TOKEN}"})).json()
                if stats.get("processed", 0) >= 3:
                    return "streaming"
                await asyncio.sleep(0.2)
            return "connected, no frame"
    finally:
        await pc.close()


def test_the_doors_proxies_slots_and_osc_hold(tmp_path):
    """Issue 44's attacks, with an honest stream running: control routes without the token, forged
    X-Forwarded-For (rotating, and naming another client), never-connecting offers from 20
    addresses against an honest publisher, and OSC as a reflector and a log bomb. Each gets its
    documented refusal, the honest stream keeps its frames, the log has no traceback."""
    from studio_client import StudioClient

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        osc_port = s.getsockname()[1]
    srv = Server(tmp_path, "--whip-token", TOKEN, "--osc-port", str(osc_port), "--max-streams", "4",
                 "--offers-per-minute", "20")
    try:
        async def honest_run():
            got = []
            client = StudioClient(srv.url, pattern, lambda frame, t: got.append(t), fps=8, token=TOKEN)
            await client.connect(settings={"prompt": "honest"})
            said = await asyncio.get_running_loop().run_in_executor(None, attack_44, srv, osc_port, client.webrtc_id)
            n0, t = len(got), time.monotonic()
            await asyncio.sleep(3)
            said["honest fps after"] = (len(got) - n0) / (time.monotonic() - t)
            await client.close()
            return said

        said = asyncio.run(honest_run())
    finally:
        log = srv.close()
    print(json.dumps(said, indent=1, default=str))
    assert said["control without a token"] == [401] * 4
    forwarded = said["forwarded rotating"]  # one client: its per-address caps, whatever the header says
    assert forwarded.count(201) <= 2 and set(forwarded) <= {201, "too_many_pending", "too_many_offers"}, forwarded
    assert said["the named address"] == [201]  # not locked out by offers that named it
    assert (set(said["twenty addresses"])
            <= {201, "busy", "too_many_pending", "too_many_offers"}), said["twenty addresses"]
    assert said["honest publisher"] == ["streaming"], said
    query, answered = said["osc get"]
    assert answered <= 2 * query, said["osc get"]  # no amplification
    assert said["honest fps after"] > 2, said["honest fps after"]
    assert "Traceback" not in log, log[-3000:]
    assert sum("OSC from 127.0.0.1" in line for line in log.splitlines()) <= 3, log[-3000:]  # throttled
