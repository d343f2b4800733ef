"""The running server against an attacker's requests (issue 11): no server file leaves the
machine, --auth covers every route, request bodies and uploads are bounded, uploads are
cleaned up. Each attack is sent as the attacker sends it, with httpx against a real server."""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path

import httpx
import pytest

from live_server import start

SECRET = f"TOP-SECRET-{secrets.token_hex(8)}"


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("outside-the-project") / "secret.ply"
    path.write_text(f"ply\n{SECRET}\n")
    return path


@pytest.fixture(scope="module")
def server():
    srv = start("--uploads-per-client", "3", "--max-upload-size", "200kb", "--max-upload-total", "500kb")
    yield srv
    srv.close()


def gradio_events(url: str, auth=None) -> dict[str, dict]:
    """api_name -> the event's dependency entry in the app's config."""
    config = httpx.get(f"{url}/config", auth=auth).json()
    return {d["api_name"]: d for d in config["dependencies"] if d.get("api_name")}


def default_inputs(url: str, event: dict) -> list:
    """The values the page would send for the event's inputs before anyone touched them."""
    config = httpx.get(f"{url}/config").json()
    values = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}
    return [values.get(i) for i in event["inputs"]]


def join_and_wait(url: str, event: dict, data: list, session: str, auth=None, cookies=None) -> dict:
    """The attacker's first request: POST /gradio_api/queue/join, then the event's result."""
    body = {"data": data, "event_data": None, "fn_index": event["id"], "trigger_id": event["targets"][0][0],
            "session_hash": session}
    r = httpx.post(f"{url}/gradio_api/queue/join", json=body, auth=auth, cookies=cookies)
    assert r.status_code == 200, r.text
    with httpx.stream("GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}, timeout=30,
                      auth=auth, cookies=cookies) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    return message
    raise AssertionError("the event never completed")


def file_data(path: Path) -> dict:
    return {"path": str(path), "meta": {"_type": "gradio.FileData"}}


def assert_not_leaked(url: str, message: dict, auth=None) -> None:
    """The second request: GET /gradio_api/file= for every path the answer names, and the
    secret's own path. None may return the secret."""
    text = json.dumps(message)
    assert SECRET not in text
    for named in set(re.findall(r"(/[\w./-]+)", text)):
        r = httpx.get(f"{url}/gradio_api/file={named}", auth=auth)
        assert SECRET not in r.text, f"the secret leaked through {named}"


def test_a_server_file_named_in_the_live_tab_never_leaves(server, secret_file):
    event = gradio_events(server.url)["step"]
    data = [file_data(secret_file)] + [None] * (len(event["inputs"]) - 1)
    message = join_and_wait(server.url, event, data, "attacker1")
    assert message["success"] is False
    assert "not uploaded" in json.dumps(message)  # Gradio's own check refused the path
    assert_not_leaked(server.url, message)
    direct = httpx.get(f"{server.url}/gradio_api/file={secret_file}")
    assert direct.status_code == 403 and SECRET not in direct.text


def test_the_splats_tab_loads_no_server_path(server, secret_file):
    events = gradio_events(server.url)
    event = next(e for name, e in events.items() if name.startswith("on_load"))
    data = [None, file_data(secret_file), "Sample scene"] + [None] * (len(event["inputs"]) - 3)
    message = join_and_wait(server.url, event, data, "attacker2")
    assert message["success"] is False
    assert_not_leaked(server.url, message)


def test_uploaded_path_accepts_only_gradio_uploads(tmp_path, monkeypatch):
    from streamstudio.app.web.splat_tab import uploaded_path
    from streamstudio.errors import StreamStudioError

    uploads = tmp_path / "uploads"
    (uploads / "abc").mkdir(parents=True)
    good = uploads / "abc" / "scene.ply"
    good.write_bytes(b"ply")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    assert uploaded_path(str(good)) == str(good.resolve())
    assert uploaded_path(None) is None
    for bad in (tmp_path / "elsewhere.ply", uploads / "abc" / ".." / ".." / "elsewhere.ply", Path("/etc/passwd")):
        with pytest.raises(StreamStudioError, match="not uploaded here"):
            uploaded_path(str(bad))
    with pytest.raises(StreamStudioError, match="upload is gone"):
        uploaded_path(str(uploads / "abc" / "deleted.ply"))


# ---------------------------------------------------------------------- bodies and uploads
def test_request_bodies_are_capped(server):
    huge = {"prompt": "x" * 10_000_000}
    r = httpx.post(f"{server.url}/studio/settings/abc", json=huge)
    assert r.status_code == 413 and "too large" in r.json()["error"]

    def chunks():  # no Content-Length: the body is counted as it arrives
        for _ in range(200):
            yield b"x" * 1024

    r = httpx.post(f"{server.url}/studio/settings/abc", content=chunks(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert httpx.get(f"{server.url}/studio/status").status_code == 200  # the server goes on


def test_long_prompts_are_refused_not_stored(server):
    r = httpx.post(f"{server.url}/studio/settings/abc", json={"prompt": "a cat " * 2000})
    assert r.status_code == 400 and "prompt" in r.json()["error"]
    r = httpx.post(f"{server.url}/studio/settings/abc", json={"prompt": [["a cat " * 2000, 1.0]]})
    assert r.status_code == 400


def upload(url: str, size: int, name: str = "scene.ply", auth=None) -> httpx.Response:
    return httpx.post(f"{url}/gradio_api/upload", files={"files": (name, b"p" * size)}, auth=auth, timeout=30)


def test_uploads_are_limited_per_client_and_in_total():
    srv = start("--uploads-per-client", "3", "--max-upload-size", "200kb", "--max-upload-total", "500kb")
    try:
        assert upload(srv.url, 300_000).status_code == 413  # one file over --max-upload-size
        stored = []
        for i in range(3):
            r = upload(srv.url, 150_000, f"scene{i}.ply")
            assert r.status_code == 200, r.text
            stored += r.json()
        assert all(Path(p).is_file() for p in stored)
        r = upload(srv.url, 1000)  # the fourth in the window
        assert r.status_code == 429 and "too many uploads" in r.json()["error"]
    finally:
        srv.close()
    assert not any(Path(p).exists() for p in stored), "uploads are deleted when the server stops"


def test_upload_space_in_total_is_bounded():
    srv = start("--uploads-per-client", "50", "--max-upload-size", "200kb", "--max-upload-total", "500kb")
    try:
        codes = [upload(srv.url, 150_000, f"s{i}.ply").status_code for i in range(5)]
        assert codes[:3] == [200, 200, 200] and codes[3:] == [507, 507]
    finally:
        srv.close()


def test_a_made_up_authorization_header_gets_no_fresh_upload_quota():
    """The per-client count was keyed on the peer address and the Authorization header the client
    sends: a different bogus bearer token per upload got every upload accepted."""
    srv = start("--uploads-per-client", "2", "--max-upload-size", "200kb", "--max-upload-total", "5mb")
    try:
        codes = [httpx.post(f"{srv.url}/gradio_api/upload", files={"files": (f"s{i}.ply", b"p" * 1000)},
                            headers={"authorization": f"Bearer forged-{i}"}, timeout=30).status_code
                 for i in range(4)]
        assert codes == [200, 200, 429, 429], codes
    finally:
        srv.close()


def test_concurrent_chunked_uploads_stay_within_the_total():
    """The total was checked against what was on disk when each upload started: thirty concurrent
    chunked uploads all passed the check before any was written, far beyond the cap. Each
    upload's size (for a chunked one, the upload cap) is now reserved before its bytes are read."""
    import concurrent.futures

    srv = start("--uploads-per-client", "50", "--max-upload-size", "200kb", "--max-upload-total", "600kb")
    size = 150_000

    def chunked(i):
        def body():  # no Content-Length: the guard cannot know the size before reading it
            boundary = f"b{i}"
            yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"c{i}.ply\"\r\n"
                   "Content-Type: application/octet-stream\r\n\r\n").encode()
            for _ in range(size // 10_000):
                time.sleep(0.02)  # a slow client: all of them are under way at once
                yield b"p" * 10_000
            yield f"\r\n--{boundary}--\r\n".encode()

        return httpx.post(f"{srv.url}/gradio_api/upload", content=body(), timeout=60,
                          headers={"content-type": f"multipart/form-data; boundary=b{i}"})

    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(chunked, range(8)))
        codes = [r.status_code for r in responses]
        stored = [Path(p) for r in responses if r.status_code == 200 for p in r.json()]
        assert 1 <= len(stored) and set(codes) <= {200, 507}, codes
        assert sum(p.stat().st_size for p in stored) <= 600_000, codes
        assert 507 in codes  # 8 x 150 KB is twice the total
    finally:
        srv.close()


def test_a_chunked_upload_goes_on_as_it_arrives_and_is_never_held_whole():
    """A chunked upload (no Content-Length) was read whole into memory by the guard before Gradio
    saw a byte: thirty concurrent 19 MB ones grew the server by 1.2 GB. Now each chunk reaches
    the route (Gradio's parser writes it to a file) before the next is asked of the client."""
    import asyncio

    from streamstudio.app.web.security import UPLOAD_PATH, GuardConfig, RequestGuard

    events = []

    async def client():
        for i in range(4):
            events.append(f"client sends {i}")
            yield {"type": "http.request", "body": b"x" * 1000, "more_body": i < 3}

    async def app(scope, receive, send):  # reads the body as Gradio's upload route does
        while True:
            message = await receive()
            events.append(f"route got {len(message['body'])}")
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"[]"})

    async def main():
        chunks = client()
        sent = []

        async def send(message):
            sent.append(message)

        guard = RequestGuard(app, GuardConfig(max_upload_bytes=10_000))
        scope = {"type": "http", "method": "POST", "path": UPLOAD_PATH, "headers": [], "client": ("10.0.0.1", 1)}
        await guard(scope, chunks.__anext__, send)
        return sent

    sent = asyncio.run(main())
    assert sent[0]["status"] == 200
    assert events == [e for i in range(4) for e in (f"client sends {i}", "route got 1000")], events


def test_a_chunked_upload_past_the_guards_cap_ends_with_the_parsers_own_error():
    """Past the guard's cap the route's next read raises the multipart parser's error (the one on
    which Gradio deletes its partial files); the route's answer is replaced by the guard's 413."""
    import asyncio

    from starlette.formparsers import MultiPartException

    from streamstudio.app.web.security import UPLOAD_OVERHEAD_BYTES, UPLOAD_PATH, GuardConfig, RequestGuard

    caught = []

    async def app(scope, receive, send):  # Gradio's upload route, in short
        try:
            while (await receive())["more_body"]:
                pass
        except MultiPartException as exc:
            caught.append(exc.message)
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": exc.message.encode()})

    async def main():
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"x" * 10_000, "more_body": True}  # never ends

        async def send(message):
            sent.append(message)

        guard = RequestGuard(app, GuardConfig(max_upload_bytes=50_000))
        scope = {"type": "http", "method": "POST", "path": UPLOAD_PATH, "headers": [], "client": ("10.0.0.1", 1)}
        await guard(scope, receive, send)
        return sent, guard

    sent, guard = asyncio.run(main())
    assert len(caught) == 1 and str(50_000 + UPLOAD_OVERHEAD_BYTES) in caught[0]
    assert sent[0]["status"] == 413 and b"too large" in sent[1]["body"]
    assert guard._reserved == 0  # the upload's reserved space is given back


def test_a_chunked_upload_past_the_cap_is_413_and_leaves_no_partial_file(tmp_path, monkeypatch):
    """Past the cap mid-body the route's parser gets its own error, so Gradio deletes the file it
    began (its temporary files live in the system temp folder, outside the upload quota)."""
    import tempfile

    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    srv = start("--max-upload-size", "100kb")
    try:
        def body():
            yield (b'--b\r\nContent-Disposition: form-data; name="files"; filename="big.ply"\r\n'
                   b"Content-Type: application/octet-stream\r\n\r\n")
            for _ in range(30):
                yield b"p" * 10_000
            yield b"\r\n--b--\r\n"

        r = httpx.post(f"{srv.url}/gradio_api/upload", content=body(), timeout=30,
                       headers={"content-type": "multipart/form-data; boundary=b"})
        assert r.status_code == 413 and ("maximum allowed size" in r.text or "too large" in r.text), r.text
        ok = httpx.post(f"{srv.url}/gradio_api/upload", files={"files": ("small.ply", b"p" * 5000)}, timeout=30)
        assert ok.status_code == 200, ok.text  # the server goes on
    finally:
        srv.close()
    assert [f.name for f in spool.iterdir() if f.is_file()] == []


# ---------------------------------------------------------------------- --auth on every route
def test_auth_covers_every_route(secret_file):
    srv = start("--auth", "ann:secret")
    try:
        for path in ("/openapi.json", "/docs", "/redoc", "/monitoring/summary", "/gradio_api/monitoring/summary",
                     "/gradio_api/heartbeat/abc", "/gradio_api/info", "/config", "/studio/status",
                     f"/gradio_api/file={secret_file}"):
            r = httpx.get(srv.url + path, timeout=10)
            assert r.status_code == 401, f"{path} answered {r.status_code} without a login"
        r = httpx.post(f"{srv.url}/gradio_api/upload", files={"files": ("a.ply", b"ply")})
        assert r.status_code == 401
        # The login page itself is public; logging in through it gives the whole app.
        assert httpx.get(srv.url + "/").status_code == 200
        with httpx.Client(base_url=srv.url) as browser:
            assert browser.post("/login", data={"username": "ann", "password": "wrong"}).status_code == 400
            assert browser.post("/login", data={"username": "ann", "password": "secret"}).status_code == 200
            assert browser.get("/config").status_code == 200
            assert browser.get("/studio/status").status_code == 200  # the JSON API takes the UI's login too
            assert browser.get("/monitoring/summary").status_code == 200
        # Scripts log in to the JSON API with basic auth.
        assert httpx.get(f"{srv.url}/studio/status", auth=("ann", "secret")).status_code == 200
        assert httpx.get(f"{srv.url}/studio/status", auth=("ann", "nope")).status_code == 401
        # The JSON API's docs page is off under --auth, even logged in.
        assert httpx.get(f"{srv.url}/docs", auth=("ann", "secret")).status_code == 404
    finally:
        srv.close()


def test_a_damaged_scene_upload_is_one_message_and_no_traceback(server, capfd):
    """A user's mistake in the Splats tab: the tab shows what is wrong, the server log has no
    traceback (the issue's 'list index out of range')."""
    bad = b"ply\nformat binary_little_endian 1.0\nelement vertex abc\nproperty float x\nend_header\n"
    r = httpx.post(f"{server.url}/gradio_api/upload", files={"files": ("broken.ply", bad)})
    assert r.status_code == 200, r.text
    events = gradio_events(server.url)
    event = next(e for name, e in events.items() if name.startswith("on_load"))
    data = default_inputs(server.url, event)
    data[1] = file_data(Path(r.json()[0]))
    message = join_and_wait(server.url, event, data, "careless1")
    assert message["success"] is False
    error = message["output"]["error"]
    assert "broken.ply" in error and "index out of range" not in error, error
    assert "Traceback" not in capfd.readouterr().err


def test_gradios_recording_route_is_refused_and_leaves_no_file(server):
    """POST /gradio_api/process_recording (gr.Video's webcam recordings, which the app does not
    use) ran ffmpeg on any posted video outside every quota and left tmp*_processed.mp4 behind."""
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("tmp*_processed*"))
    r = httpx.post(f"{server.url}/gradio_api/process_recording",
                   files={"video": ("clip.mp4", b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 4096, "video/mp4")},
                   data={"params": json.dumps({"mirror_webcam": True})})
    assert r.status_code == 404 and "does not use" in r.json()["error"]
    assert set(Path(tempfile.gettempdir()).glob("tmp*_processed*")) == before
    assert httpx.get(f"{server.url}/studio/status").status_code == 200


def test_a_malformed_multipart_upload_is_a_400_with_no_traceback(server, capfd, caplog):
    """A multipart body that does not open with its boundary raised python-multipart's parse error
    through Gradio's upload route, and Gradio's app (built with debug=True) answered HTTP 500 with
    the whole traceback, install paths included."""
    with caplog.at_level("WARNING", logger="streamstudio.app.web.security"):
        r = httpx.post(f"{server.url}/gradio_api/upload", content=b"v=0\r\na=x\r\n",
                       headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400, r.text[:300]
    assert r.json() == {"status": "failed", "error": "malformed multipart/form-data body"}
    assert "Traceback" not in r.text and "site-packages" not in r.text
    refused = [rec.getMessage() for rec in caplog.records if "malformed multipart" in rec.getMessage()]
    assert len(refused) == 1 and "\n" not in refused[0]
    assert "Traceback" not in capfd.readouterr().err
    assert httpx.get(f"{server.url}/studio/status").status_code == 200  # the server goes on


@pytest.mark.slow
def test_uploads_are_deleted_on_a_timer():
    import time

    srv = start("--upload-ttl", "10")
    try:
        r = upload(srv.url, 1000)
        assert r.status_code == 200
        stored = Path(r.json()[0])
        deadline = time.monotonic() + 40
        while stored.exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert not stored.exists(), "an upload outlived --upload-ttl by 30 s"
        assert httpx.get(f"{srv.url}/studio/status").status_code == 200
    finally:
        srv.close()


def test_the_server_terminal_has_no_gradio_debug_lines(capfd):
    """Gradio 5.50 printed "new /" on start and "content_type ..." on every component request
    (each Live-tab offer): not for the person running the server."""
    srv = start()
    try:
        config = httpx.get(f"{srv.url}/config").json()
        component = next(c for c in config["components"] if c.get("props", {}).get("elem_id") == "live-webrtc")
        r = httpx.post(f"{srv.url}/gradio_api/component_server", json={
            "component_id": component["id"], "fn_name": "offer", "data": {"sdp": "x", "type": "offer",
                                                                          "webrtc_id": "quiet"},
            "session_hash": "s"})
        assert r.status_code == 400
    finally:
        srv.close()
    out = capfd.readouterr().out
    assert "content_type" not in out and "new /" not in out, out


def test_the_page_names_no_third_party_host(server):
    """Gradio's page preconnected to Google's font servers and loaded iframe-resizer from cdnjs on
    every load, and its default theme fetched its font from fonts.googleapis.com: an audience's
    browser asked Google and Cloudflare (and failed DNS on an offline stage). The page served now
    names no other host to fetch from (the theme uses the machine's fonts), its length fixed."""
    r = httpx.get(server.url + "/", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert int(r.headers["content-length"]) == len(r.content)
    for host in ("fonts.googleapis.com", "fonts.gstatic.com", "cdnjs.cloudflare.com"):
        assert host not in r.text, host
    css = httpx.get(server.url + "/theme.css", timeout=30)
    assert css.status_code == 200 and "fonts.googleapis.com" not in css.text and "ui-sans-serif" in css.text
