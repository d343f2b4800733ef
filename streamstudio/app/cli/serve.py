"""`streamstudio serve`: the web app (Gradio UI + WebRTC endpoint) on one server.

Binds to 127.0.0.1:7860 unless --host is given. Settings from the environment:
STREAMSTUDIO_AUTH (USER:PASS, as --auth), STREAMSTUDIO_TURN_URLS, STREAMSTUDIO_TURN_USERNAME,
STREAMSTUDIO_TURN_CREDENTIAL and STREAMSTUDIO_STUN_URLS (ICE servers for use across networks),
STREAMSTUDIO_WHIP_TOKEN (as --whip-token), STREAMSTUDIO_WHEP_TOKEN (as --whep-token).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from streamstudio.errors import StreamStudioError

if TYPE_CHECKING:  # (the server's packages load when it starts, not when the command line is parsed)
    import uvicorn
    from fastapi import FastAPI

    from streamstudio.app.web.sessions import SessionManager

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(subparsers) -> argparse.ArgumentParser:
    from streamstudio.app.settings import add_pipeline_arguments
    from streamstudio.app.settings import host_port, number

    p = subparsers.add_parser("serve", description=__doc__.splitlines()[0])
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1; anything else "
                                                "exposes the app to the network: use --auth)")
    p.add_argument("--port", type=number(int, 1, 65535), default=7860, help="port (default 7860)")
    p.add_argument("--auth", default=None, metavar="USER:PASS",
                   help="require this login (default: $STREAMSTUDIO_AUTH when set)")
    p.add_argument("--max-streams", type=number(int, 1, 10_000), default=4,
                   help="concurrent live streams at most, every tab's together (default 4)")
    p.add_argument("--gpus", type=number(int, 1, 1024), default=1,
                   help="model replicas, one per GPU (cuda:0 .. N-1; with --device cpu, N CPU replicas), each with "
                        "its own batching and --max-streams streams; a new stream goes to the least-loaded one "
                        "(app/web/replicas.py)")
    p.add_argument("--cluster", default=None, metavar="auto|local|ray://HOST:10001|HOST:6379",
                   help="model replicas as Ray actors, one process each: one per GPU of the cluster (CPU nodes: "
                        "--node-replicas); this server stays the one front end and moves a failed replica's "
                        "streams to the others. local: a Ray on this machine; auto: $RAY_ADDRESS, else local "
                        "(docs/cluster.md)")
    p.add_argument("--node-replicas", type=number(int, 1, 64), default=1,
                   help="with --cluster, CPU replicas on each node without GPUs (default 1)")
    p.add_argument("--max-replicas", type=number(int, 1, 4096), default=None,
                   help="with --cluster, elastic replicas: at most this many, one more whenever every replica is full "
                        "(on a node with room, else asked of Ray's autoscaler); default: one per GPU of every node")
    p.add_argument("--min-replicas", type=number(int, 1, 4096), default=None,
                   help="with --max-replicas, the replicas kept running however idle (default 1)")
    p.add_argument("--replica-idle-release", type=number(float, 1, 86400), default=60.0,
                   help="with --max-replicas, stop a replica that held no stream this many seconds (default 60)")
    p.add_argument("--replica-transport", choices=("auto", "compiled", "calls"), default="auto",
                   help="with --cluster, how frames reach the replicas: compiled (Ray compiled graphs: under 1 ms a "
                        "512x512 frame, a CPU core kept busy per replica), calls (plain actor calls: ~7 ms more, no "
                        "core spent waiting); auto: compiled for GPU replicas, calls for CPU ones (docs/cluster.md)")
    p.add_argument("--idle-timeout", type=number(float, 0, 86400, low_open=True), default=20.0,
                   help="free a stream that sent no frame for this many seconds (default 20)")
    p.add_argument("--max-upload-size", default="20mb", help="largest upload accepted (default 20mb)")
    p.add_argument("--max-upload-total", default="200mb",
                   help="the uploads this server holds on disk, all clients together (default 200mb; "
                        "uploads are deleted after --upload-ttl)")
    p.add_argument("--uploads-per-client", type=number(int, 1, 10**6), default=20,
                   help="uploads one client may make in 10 minutes (default 20)")
    p.add_argument("--upload-ttl", type=number(float, 10, 86400 * 7), default=300.0,
                   help="seconds an upload or cached file is kept before it is deleted (default 300)")
    p.add_argument("--show", default=None, metavar="FILE",
                   help="a show file (JSON): the tempo and each stream's modulations, taken when the stream opens "
                        "(\"*\": any stream); GET /studio/show writes one (README, live performance)")
    p.add_argument("--latency-probe", action="store_true",
                   help="copy a frame counter drawn in the input's top band onto the output (benchmarks/webapp.py)")
    p.add_argument("--output-dir", default="outputs", help="folder for Live output recordings (default outputs)")
    p.add_argument("--allow-push", default=None, metavar="HOST[,HOST...]|any|none",
                   help="the RTMP hosts the Live output tab may push a stream to (default: any when the server "
                        "binds a loopback address, none otherwise: a page could make the server push anywhere)")
    p.add_argument("--no-stream-batching", action="store_true",
                   help="let live streams take turns on the model instead of batching their network calls together")
    p.add_argument("--max-batch-rows", type=number(int, 1, 1024), default=16,
                   help="cross-stream batching: UNet/VAE batch rows per call at most (default 16; TensorRT "
                        "engines are sized from it)")
    p.add_argument("--batch-wait-ms", type=number(float, 0, 1000), default=2.0,
                   help="cross-stream batching: how long a call waits for other streams' calls (default 2 ms)")
    p.add_argument("--whip-token", default=None, metavar="TOKEN",
                   help="bearer token WHIP publishers (OBS) must send, and every control route (/studio/*: "
                        "settings, sessions, outputs); WHEP viewers may send it too (default: "
                        "$STREAMSTUDIO_WHIP_TOKEN; without either, --auth's USER:PASS; without --auth, none)")
    p.add_argument("--whep-token", default=None, metavar="TOKEN",
                   help="a bearer token that lets WHEP players watch and do nothing else (default: "
                        "$STREAMSTUDIO_WHEP_TOKEN; without either, viewers need --whip-token or the --auth login, "
                        "so that nothing a viewer holds can publish or steer a stream)")
    p.add_argument("--whip-cors", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin (https://studio.example.com, or * for any) whose pages may publish "
                        "(WHIP) and watch (WHEP) without a login; repeatable (default: none; with a token or "
                        "--auth, any origin may, the token being the credential)")
    p.add_argument("--max-viewers", type=number(int, 0, 10_000), default=32,
                   help="WHEP viewers on the server at most, all streams together (default 32)")
    p.add_argument("--max-viewers-per-source", type=number(int, 1, 10_000), default=8,
                   help="WHEP viewers one client address may hold at once (default 8)")
    p.add_argument("--max-pending-per-source", type=number(int, 1, 10_000), default=None,
                   help="connections one client address may hold before they stream (offered, not connected "
                        "or no frame yet; each holds a stream slot for up to 8 s) (default: half of --max-streams, "
                        "at least 1)")
    p.add_argument("--max-pending", type=number(int, 1, 10_000), default=None,
                   help="connections of every address together that may hold a stream slot before they stream; at "
                        "the cap a new connection ends the waiting one of the address that made the most "
                        "connections this minute (default: half of --max-streams, at least 1)")
    p.add_argument("--offers-per-minute", type=number(int, 1, 100_000), default=20,
                   help="new connections (WebRTC offers, WHIP and WHEP POSTs) one client address may make "
                        "per minute (default 20)")
    p.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                   help="a reverse proxy (an address or a network, e.g. 127.0.0.1 or 10.0.0.0/8) whose "
                        "X-Forwarded-For / X-Forwarded-Proto headers are believed; repeatable (default: none: a "
                        "client is its peer address, whatever it sends)")
    p.add_argument("--osc-port", type=number(int, 1, 65535), default=None,
                   help="take OSC control messages on this UDP port (default: off)")
    p.add_argument("--input", default=None, metavar="SOURCE",
                   help="a live source the server streams itself (ndi://NAME, webcam:N, rtmp://..., srt://..., "
                        "pattern): a stream like a WHIP publisher's, named by --input-stream, for WHEP viewers, "
                        "the Live outputs and OSC; reopened when it stops (default: none)")
    p.add_argument("--input-stream", default="input", metavar="NAME",
                   help="the stream name --input feeds (default input)")
    p.add_argument("--output", action="append", default=[], metavar="URL",
                   help="with --input: an output of its stream, started as soon as it runs and again whenever it "
                        "restarts: rtmp://HOST/APP/KEY, ndi://NAME, NAME.m3u8 (HLS) or a file name (.mp4, .mkv, .webm, "
                        ".mov; under --output-dir); repeatable, up to 2 (the outputs a stream may have)")
    p.add_argument("--osc-feedback", type=host_port, default=None, metavar="HOST:PORT",
                   help="send every running stream's state (fps, latency, prompt, settings) to this OSC "
                        "target twice a second, from the --osc-port (default: off; queries are answered "
                        "without it)")
    p.add_argument("--osc-host", default="127.0.0.1",
                   help="address the OSC port binds (default 127.0.0.1; OSC has no login)")
    add_pipeline_arguments(p)
    return p


def parse_auth(value: str | None) -> tuple[str, str] | None:
    value = value if value is not None else os.environ.get("STREAMSTUDIO_AUTH")
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise StreamStudioError("--auth (or STREAMSTUDIO_AUTH) must be USER:PASS with both parts non-empty")
    return user, password


def bind_host(args) -> str:
    host = args.host or "127.0.0.1"
    if args.host and host not in LOOPBACK:
        print(f"warning: binding to {host}: the app is reachable from the network"
              + ("" if parse_auth(args.auth) else " WITHOUT a login; add --auth USER:PASS")
              + ". Put it behind HTTPS for webcam access from other machines.", file=sys.stderr)
    return host


def build_model(args):
    """Load the model once and keep the defaults new streams start from."""
    from streamstudio.app.cli.requests import serve_request
    from streamstudio.app.streams import build_pipeline
    from streamstudio.app.web.sessions import ServerModel

    request = serve_request(args)
    image = request.image
    pipe = build_pipeline(image, "img2img", serving=True)
    return ServerModel(pipe.comps, pipe.config, prompt=image.prompt, negative_prompt=image.negative_prompt,
                       latency_probe=request.latency_probe, batching=image.batching)


def guard_config(args):
    """The request guard's limits (login, body caps, upload quotas) from the command line."""
    from streamstudio.app.web.security import GuardConfig, parse_size

    if getattr(args, "uploads_per_client", 20) < 1:
        raise StreamStudioError("--uploads-per-client must be at least 1")
    if getattr(args, "upload_ttl", 300.0) < 10:
        raise StreamStudioError("--upload-ttl must be at least 10 seconds")
    return GuardConfig(auth=parse_auth(args.auth), max_upload_bytes=parse_size(args.max_upload_size),
                       max_upload_total_bytes=parse_size(getattr(args, "max_upload_total", "200mb")),
                       uploads_per_client=getattr(args, "uploads_per_client", 20))


def output_limits(args):
    """The Live output tab's limits: 2 outputs per stream, 2 per stream slot on the server, and the
    RTMP hosts --allow-push names (default: any on loopback, none when reachable from the network)."""
    from streamstudio.app.web.outputs import OutputLimits

    allow = getattr(args, "allow_push", None)
    if allow is None:
        allow = "any" if (args.host or "127.0.0.1") in LOOPBACK else "none"
    hosts = None if allow.strip().lower() == "any" else tuple(
        h.strip().lower() for h in allow.split(",") if h.strip() and h.strip().lower() != "none")
    return OutputLimits(per_stream=2, total=2 * args.max_streams, allow_push=hosts)


def whip_token(args) -> str | None:
    token = getattr(args, "whip_token", None)
    token = token if token is not None else os.environ.get("STREAMSTUDIO_WHIP_TOKEN")
    return token or None


def credentials(args):
    """Who may publish and control (--whip-token, --auth) and who may watch (--whep-token)."""
    from streamstudio.app.web.security import Credentials

    view = getattr(args, "whep_token", None)
    view = view if view is not None else os.environ.get("STREAMSTUDIO_WHEP_TOKEN")
    return Credentials(publish_token=whip_token(args), view_token=view or None, auth=parse_auth(args.auth))


GRADIO_DEBUG_PRINTS = ("content_type",)  # gradio 5.50 prints this for every component request


def silence_gradio_debug_prints() -> None:
    """Drop the debug lines Gradio 5.50 left in its routes (`print("content_type", ...)` on every
    component request, e.g. each Live-tab WebRTC offer): the server's terminal is for what a
    person running it needs. Only those lines: anything else gradio.routes prints goes through."""
    import builtins

    import gradio.routes

    if getattr(gradio.routes, "print", builtins.print) is not builtins.print:
        return  # already done

    def quiet_print(*values, **kwargs):
        if values and isinstance(values[0], str) and values[0] in GRADIO_DEBUG_PRINTS:
            return
        builtins.print(*values, **kwargs)

    setattr(gradio.routes, "print", quiet_print)  # (a module global over the builtin, as the check above reads it)


def check_outputs(args) -> list[tuple[str, str]]:
    """`--output` URLs as (kind, target), checked before the model loads."""
    from streamstudio.app.web.outputs import parse_output_url

    urls = list(getattr(args, "output", None) or ())
    if urls and not getattr(args, "input", None):
        raise StreamStudioError("--output sends the --input stream out: give --input too (other streams' outputs "
                                "start from the Live output tab or POST /studio/outputs/{stream})")
    if len(urls) > 2:
        raise StreamStudioError(f"--output given {len(urls)} times: a stream may have 2 outputs")
    return [parse_output_url(u) for u in urls]


def check_osc(args) -> None:
    if getattr(args, "osc_feedback", None) is not None and getattr(args, "osc_port", None) is None:
        raise StreamStudioError("--osc-feedback sends from the OSC port: give --osc-port too")


def build_app(args, model=None):
    """(FastAPI app, SessionManager): the Gradio UI at /, the WebRTC and JSON API beside it, all
    behind the request guard (`app/web/security.py`)."""
    import gradio as gr
    from fastapi import FastAPI

    from streamstudio.app.perform.inputs import LiveInputs
    from streamstudio.app.web import api_docs, metrics, outputs, perform_routes, security, ui, webrtc, whip
    from streamstudio.app.web.sessions import SessionManager

    guard = guard_config(args)
    guard.self_auth_prefixes = ("/whip", "/whep")  # they take a bearer token (app/web/whip.py)
    guard.credentials = credentials(args)  # /studio/* behind the publish credential
    rtc = webrtc.rtc_config_from_env()
    if model is None and getattr(args, "cluster", None):  # replicas as Ray actors (app/web/ray_replicas.py)
        from streamstudio.app.cli.requests import serve_request
        from streamstudio.app.web.ray_cluster import build_manager

        manager = build_manager(serve_request(args))
    elif model is None and getattr(args, "gpus", 1) != 1:  # N replicas of the model (app/web/replicas.py)
        from streamstudio.app.cli.requests import serve_request
        from streamstudio.app.web.replicas import build_manager

        manager = build_manager(serve_request(args))
    else:
        manager = SessionManager(model or build_model(args), max_streams=args.max_streams,
                                 idle_timeout=args.idle_timeout, owns_model=model is None)
    # With a login, the API's docs are not served at all (FastAPI would serve them to anyone).
    docs = {} if guard.auth is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="StreamStudio", **docs)
    stream = webrtc.build_stream(manager, rtc, host=args.host or "127.0.0.1")
    webrtc.mount_api(app, manager, stream)
    if hasattr(manager.placement, "drain"):  # serve --cluster: replicas taken out of service on purpose
        from streamstudio.app.web.ray_replicas import mount as mount_replicas

        mount_replicas(app, manager.placement)
    manager.offer_rate = security.SourceRate(getattr(args, "offers_per_minute", 20))
    if getattr(args, "max_pending_per_source", None) is not None:
        manager.max_pending_per_source = args.max_pending_per_source
    if getattr(args, "max_pending", None) is not None:
        manager.max_pending = args.max_pending
    whip.WhipServer(manager, host=args.host or "127.0.0.1", credentials=guard.credentials,
                    rtc_config=rtc, max_viewers=getattr(args, "max_viewers", 32),
                    max_viewers_per_source=getattr(args, "max_viewers_per_source", 8),
                    cors_origins=tuple(getattr(args, "whip_cors", None) or ()),
                    other_slots=lambda: set(stream.pcs)).mount(app)
    live_outputs = outputs.Outputs(manager, args.output_dir, output_limits(args))
    outputs.mount(app, live_outputs)
    metrics.mount(app, manager, live_outputs)
    manager.inputs = LiveInputs()  # the tempo clock and MIDI the streams' modulations read (issue 48)
    if getattr(args, "show", None):
        manager.inputs.load_show(read_show(args.show))
    perform_routes.mount(app, manager, manager.inputs)
    api_docs.mount(app)  # /studio/openapi.json and /studio/api: every route above, for show-control tools
    blocks = ui.build_ui(manager, rtc_config=rtc, outputs=live_outputs,
                         file_ttl=int(getattr(args, "upload_ttl", 300.0)), host=args.host or "127.0.0.1")
    silence_gradio_debug_prints()
    with contextlib.redirect_stdout(io.StringIO()):  # gradio prints "new /" here
        app = gr.mount_gradio_app(app, blocks, path="/", server_name=args.host or "127.0.0.1",
                                  server_port=args.port, show_api=False, auth=guard.auth,
                                  max_file_size=guard.max_upload_bytes, ssr_mode=False)
    security.install(app, guard, blocks)
    app.state.manager = manager
    app.state.osc = None
    check_osc(args)
    if getattr(args, "input", None):
        from streamstudio.streaming.sources import source_kind

        source_kind(args.input)  # before the model loads
    if getattr(args, "osc_port", None) is not None:
        from streamstudio.app.web.osc import OscControl

        app.state.osc = OscControl(manager, args.osc_port, args.osc_host,
                                   feedback=getattr(args, "osc_feedback", None), outputs=live_outputs)
    app.state.feed = None
    if getattr(args, "input", None):
        app.state.feed = InputFeed(manager, args.input, args.input_stream, check_outputs(args), live_outputs)
    return app, manager


class InputFeed:
    """`serve --input`: a live source the server reads in a thread of its own into the stream
    `name` (as a WHIP publisher feeds one); a source that stops, or cannot be opened yet (an NDI
    sender not started), is tried again every RETRY_S seconds until the server stops."""

    RETRY_S = 2.0

    def __init__(self, manager, spec: str, name: str, outputs: Sequence[tuple[str, str]] = (), live_outputs=None):
        from streamstudio.app.web.webrtc import WEBRTC_ID
        from streamstudio.streaming.sources import source_kind

        if not WEBRTC_ID.fullmatch(name):
            raise StreamStudioError("--input-stream must be 1 to 64 letters, digits, '-' or '_'")
        source_kind(spec)  # a spec that cannot be opened says so now
        self.manager, self.spec, self.name = manager, spec, name
        self.outputs, self.live_outputs = list(outputs), live_outputs  # `serve --output`: (kind, target)
        self.frames = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serve-input", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from streamstudio.streaming.sources import open_source

        log = logging.getLogger(__name__)
        while not self._stop.is_set():
            try:
                with open_source(self.spec) as source:
                    log.info("--input %s feeds the stream %r", source.info.description or self.spec, self.name)
                    session = self.manager.open(self.name)
                    session.named = True  # --input-stream names it for viewers, OSC and the outputs
                    for frame in source.frames():
                        if self._stop.is_set() or session.closed:
                            break
                        session.submit(frame.image)
                        self.frames += 1
                        if self.frames == 1 or self.frames % 30 == 0:  # (again after a failure or a restart)
                            self._start_outputs(source.info.fps)
            except StreamStudioError as exc:  # not there yet, gone, or every slot busy: said, tried again
                log.warning("--input %s: %s; trying again in %.0f s", self.spec, exc, self.RETRY_S)
            except Exception:  # noqa: BLE001 - a bug: its traceback, and the server goes on
                log.exception("--input %s failed", self.spec)
            self._stop.wait(self.RETRY_S)

    def _start_outputs(self, fps: float | None) -> None:
        """Start each `--output` the stream does not run now (first frame, a restarted stream, an
        output whose server went away); a refusal is said and tried again 30 frames later."""
        if self.live_outputs is None:
            return
        from streamstudio.app.web.outputs import DEFAULT_FPS, OutputRefused

        running = {(o.kind, o.target) for o in self.live_outputs.of(self.name) if o.running}
        for kind, target in self.outputs:
            if (kind, target) in running:
                continue
            for old in [o for o in self.live_outputs.of(self.name) if (o.kind, o.target) == (kind, target)]:
                self.live_outputs.stop(old.oid)  # a failed one: its place goes to the new one
            try:
                out = self.live_outputs.start(self.name, kind, target, min(60.0, fps or DEFAULT_FPS))
            except OutputRefused as exc:
                logging.getLogger(__name__).warning("--output %s: %s", target, exc)
            else:
                logging.getLogger(__name__).info("--output: the stream %r goes to %s", self.name, out.location)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def close_extras(app) -> None:
    """Stop what build_app started beside the HTTP server (the OSC port, the --input feed)."""
    osc = getattr(app.state, "osc", None)
    if osc is not None:
        osc.close()
        app.state.osc = None
    feed = getattr(app.state, "feed", None)
    if feed is not None:
        feed.close()
        app.state.feed = None
    live_outputs = getattr(app.state, "outputs", None)
    if live_outputs is not None:
        live_outputs.close()


@dataclass
class ServerThread:
    """The server in a background thread (tests, benchmarks): `.url`, `.close()`."""

    server: uvicorn.Server
    thread: threading.Thread
    manager: SessionManager
    url: str
    app: FastAPI | None = None

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        if self.app is not None:
            close_extras(self.app)
        self.manager.shutdown()


def proxy_options(args) -> dict:
    """uvicorn's proxy-header options: believed only from the --trusted-proxy addresses (uvicorn's
    own default believes X-Forwarded-For from 127.0.0.1, so any local client could name itself)."""
    import ipaddress

    trusted = list(getattr(args, "trusted_proxy", None) or ())
    for addr in trusted:
        try:
            ipaddress.ip_network(addr, strict=False)
        except ValueError:
            raise StreamStudioError(f"--trusted-proxy {addr!r} is not an address or a network "
                                    "(write it like 127.0.0.1, ::1 or 10.0.0.0/8)") from None
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or ""}


def start_in_thread(args, model=None, timeout: float = 60.0) -> ServerThread:
    import uvicorn

    app, manager = build_app(args, model)
    host = bind_host(args)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=args.port, log_level="warning",
                                           **proxy_options(args)))
    thread = threading.Thread(target=server.run, name="streamstudio-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            close_extras(app)
            manager.shutdown()
            raise StreamStudioError(f"the server did not start on {host}:{args.port} (is the port in use?)")
        time.sleep(0.05)
    return ServerThread(server, thread, manager, f"http://{host}:{args.port}", app)


def check_port_free(host: str, port: int, kind: int = socket.SOCK_STREAM, flag: str = "--port") -> None:
    """The port can be bound on `host` now (TCP as uvicorn binds it, with SO_REUSEADDR; UDP for
    OSC): said before the model loads, with what to do, instead of a bind error after it."""
    try:
        infos = socket.getaddrinfo(host, port, type=kind)
    except socket.gaierror as exc:
        raise StreamStudioError(f"cannot serve on {host}: the address does not resolve ({exc.strerror}); "
                                "give --host an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from exc
    family, _, _, _, address = infos[0]
    with socket.socket(family, kind) as sock:
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StreamStudioError(f"port {port} on {host} is in use (another StreamStudio, or another "
                                        f"program); stop it or pick another {flag}, e.g. {flag} {port + 1}") from exc
            raise StreamStudioError(f"cannot serve on {host}:{port} ({exc.strerror or exc}); give --host an "
                                    f"address of this machine and {flag} a port you may open (1024 and above "
                                    "without root)") from exc


def run(args) -> int:
    import uvicorn

    for noisy in ("aioice", "aiortc"):  # a line per ICE check otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    output_dir = Path(getattr(args, "output_dir", None) or "outputs")
    if output_dir.exists() and not output_dir.is_dir():  # (said before anything starts)
        raise StreamStudioError(f"--output-dir {output_dir} is a file; name a folder for the Live output recordings "
                                "(it is made when missing)")
    host = bind_host(args)
    proxy_options(args)  # a bad --trusted-proxy is said before the model loads
    check_port_free(host, args.port)  # before the model loads
    check_osc(args)
    check_outputs(args)
    if getattr(args, "osc_port", None) is not None:
        check_port_free(args.osc_host, args.osc_port, socket.SOCK_DGRAM, "--osc-port")
    from streamstudio.models.hub import check_model_source

    check_model_source(args.model)
    app, manager = build_app(args)
    print(f"model: {manager.model.name}" + (" (a built-in model)" if manager.model.is_demo else ""))
    print(f"StreamStudio on http://{host}:{args.port}  (WebRTC endpoint: POST /webrtc/offer; "
          f"WHIP: POST /whip/<stream>, WHEP: POST /whep/<stream>)")
    if app.state.osc is not None:
        print("OSC control on udp://{}:{}".format(*app.state.osc.address))
    try:
        uvicorn.run(app, host=host, port=args.port, log_level="warning", **proxy_options(args))
    except OSError as exc:
        raise StreamStudioError(f"cannot serve on {host}:{args.port}: {exc}; pick another --port") from exc
    finally:
        close_extras(app)
        manager.shutdown()
    return 0


def read_show(path: str) -> dict:
    """A show file's JSON, or a one-line error naming the file."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise StreamStudioError(f"--show {path!r} is not a readable JSON file ({exc})") from exc
