"""`streamstudio serve`'s runner: the model, the web app (Gradio UI, WebRTC, WHIP/WHEP, the
studio's routes) behind the request guard, and uvicorn; `start_in_thread` runs it in a thread
(tests, benchmarks). Its parser and the checks said before the model loads are in serve.py."""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import gradio as gr
import gradio.routes
import uvicorn
from fastapi import FastAPI

from streamstudio.app import streams
from streamstudio.app.cli.requests import serve_request
from streamstudio.app.cli.serve import LOOPBACK, bind_host, check_osc, check_outputs, parse_auth, proxy_options
from streamstudio.app.perform.inputs import LiveInputs, stream_audio
from streamstudio.app.web import (api_docs, metrics, outputs, perform_routes, ray_cluster, ray_replicas, replicas,
                                  security, ui, video_deck, webrtc, whip)
from streamstudio.app.perform.link import LinkFollower
from streamstudio.app.perform.midi_port import MidiPort
from streamstudio.app.web.osc import OscControl
from streamstudio.app.web.outputs import DEFAULT_FPS, OutputLimits, OutputRefused
from streamstudio.app.web.security import Credentials, GuardConfig, parse_size
from streamstudio.app.web.sessions import ServerModel, SessionManager
from streamstudio.app.web.webrtc import WEBRTC_ID
from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sources import NdiSource, open_source, source_kind


def build_model(args):
    """Load the model once and keep the defaults new streams start from (`--live-pipeline video`:
    the video model, app/web/video_deck.py)."""
    request = serve_request(args)
    image = request.image
    if request.live_pipeline == "video":
        return video_deck.live_video_model(request.video_model, image)
    pipe = streams.build_pipeline(image, "img2img", serving=True)
    return ServerModel(pipe.comps, pipe.config, prompt=image.prompt, negative_prompt=image.negative_prompt,
                       latency_probe=request.latency_probe, batching=image.batching)


def guard_config(args):
    """The request guard's limits (login, body caps, upload quotas) from the command line."""
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
    view = getattr(args, "whep_token", None)
    view = view if view is not None else os.environ.get("STREAMSTUDIO_WHEP_TOKEN")
    return Credentials(publish_token=whip_token(args), view_token=view or None, auth=parse_auth(args.auth))


GRADIO_DEBUG_PRINTS = ("content_type",)  # gradio 5.50 prints this for every component request


def silence_gradio_debug_prints() -> None:
    """Drop the debug lines Gradio 5.50 left in its routes (`print("content_type", ...)` on every
    component request, e.g. each Live-tab WebRTC offer): the server's terminal is for what a
    person running it needs. Only those lines: anything else gradio.routes prints goes through."""
    if getattr(gradio.routes, "print", builtins.print) is not builtins.print:
        return  # already done

    def quiet_print(*values, **kwargs):
        if values and isinstance(values[0], str) and values[0] in GRADIO_DEBUG_PRINTS:
            return
        builtins.print(*values, **kwargs)

    setattr(gradio.routes, "print", quiet_print)  # (a module global over the builtin, as the check above reads it)


def build_app(args, model=None):
    """(FastAPI app, SessionManager): the Gradio UI at /, the WebRTC and JSON API beside it, all
    behind the request guard (`app/web/security.py`)."""
    guard = guard_config(args)
    guard.self_auth_prefixes = ("/whip", "/whep")  # they take a bearer token (app/web/whip.py)
    guard.credentials = credentials(args)  # /studio/* behind the publish credential
    rtc = webrtc.rtc_config_from_env()
    if getattr(args, "live_pipeline", "image") == "video" and (getattr(args, "cluster", None)
                                                                or getattr(args, "gpus", 1) != 1):
        raise StreamStudioError("--live-pipeline video runs the video model in this process: leave --gpus and "
                                "--cluster out")
    if model is None and getattr(args, "cluster", None):  # replicas as Ray actors (app/web/ray_replicas.py)
        manager = ray_cluster.build_manager(serve_request(args))
    elif model is None and getattr(args, "gpus", 1) != 1:  # N replicas of the model (app/web/replicas.py)
        manager = replicas.build_manager(serve_request(args))
    else:
        manager = SessionManager(model or build_model(args), max_streams=args.max_streams,
                                 idle_timeout=args.idle_timeout, owns_model=model is None)
    # With a login, the API's docs are not served at all (FastAPI would serve them to anyone).
    docs = {} if guard.auth is None else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="StreamStudio", **docs)
    stream = webrtc.build_stream(manager, rtc, host=args.host or "127.0.0.1")
    webrtc.mount_api(app, manager, stream)
    if hasattr(manager.placement, "drain"):  # serve --cluster: replicas taken out of service on purpose
        ray_replicas.mount(app, manager.placement)
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
    latency_ms = getattr(args, "audio_latency_ms", None)  # (None: each stream's measured glass-to-glass)
    manager.inputs = LiveInputs(audio_latency_s=None if latency_ms is None else latency_ms / 1000.0,
                                sessions=manager.get)  # the tempo clock, MIDI and audio the modulations read (issue 48)
    if getattr(args, "show", None):
        manager.inputs.load_show(read_show(args.show))
    perform_routes.mount(app, manager, manager.inputs)
    app.state.midi = MidiPort(manager.inputs, args.midi_in) if getattr(args, "midi_in", None) else None
    app.state.link = LinkFollower(manager.inputs.clock) if getattr(args, "link", False) else None
    api_docs.mount(app)  # /studio/openapi.json and /studio/api: every route above, for show-control tools
    blocks = ui.build_ui(manager, rtc_config=rtc, outputs=live_outputs,
                         file_ttl=int(getattr(args, "upload_ttl", 300.0)), host=args.host or "127.0.0.1",
                         video_model=getattr(args, "video_model", None))
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
        source_kind(args.input)  # before the model loads
    if getattr(args, "osc_port", None) is not None:
        app.state.osc = OscControl(manager, args.osc_port, args.osc_host,
                                   feedback=getattr(args, "osc_feedback", None), outputs=live_outputs)
    app.state.feed = None
    if getattr(args, "input", None):
        app.state.feed = InputFeed(manager, args.input, args.input_stream, check_outputs(args), live_outputs)
    return app, manager


class InputFeed:
    """`serve --input`: a live source the server reads in a thread of its own into the stream
    `name` (as a WHIP publisher feeds one; an NDI source's audio too, to the stream's audio
    features); a source that stops, or cannot be opened yet (an NDI sender not started), is tried
    again every RETRY_S seconds until the server stops."""

    RETRY_S = 2.0

    def __init__(self, manager, spec: str, name: str, outputs: Sequence[tuple[str, str]] = (), live_outputs=None):
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
        log = logging.getLogger(__name__)
        while not self._stop.is_set():
            try:
                with open_source(self.spec) as source:
                    if isinstance(source, NdiSource):  # its sound, stamped with its capture time
                        source.on_audio = self._audio
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

    def _audio(self, samples, sample_rate: int, channels: int, captured: float, timecode: float) -> None:
        stream_audio(self.manager, self.name, samples, sample_rate, captured, channels)

    def _start_outputs(self, fps: float | None) -> None:
        """Start each `--output` the stream does not run now (first frame, a restarted stream, an
        output whose server went away); a refusal is said and tried again 30 frames later."""
        if self.live_outputs is None:
            return
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
    for extra in ("midi", "link"):  # the MIDI port, the Link session
        held = getattr(app.state, extra, None)
        if held is not None:
            held.close()
            setattr(app.state, extra, None)
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


def start_in_thread(args, model=None, timeout: float = 60.0) -> ServerThread:
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


def run(args) -> int:
    """The web app, once serve.check passed: the model, the routes, uvicorn until stopped."""
    for noisy in ("aioice", "aiortc"):  # a line per ICE check otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    host = args.host or "127.0.0.1"
    app, manager = build_app(args)
    print(f"model: {manager.model.name}" + (" (a built-in model)" if manager.model.is_demo else ""))
    print(f"StreamStudio on http://{host}:{args.port}  (WebRTC endpoint: POST /webrtc/offer; "
          f"WHIP: POST /whip/<stream>, WHEP: POST /whep/<stream>)")
    if app.state.osc is not None:
        print("OSC control on udp://{}:{}".format(*app.state.osc.address))
    if app.state.midi is not None:
        print(f"MIDI input: {app.state.midi.name}")
    if app.state.link is not None:
        print("Ableton Link: on (the tempo follows the session)")
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
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise StreamStudioError(f"--show {path!r} is not a readable JSON file ({exc})") from exc

