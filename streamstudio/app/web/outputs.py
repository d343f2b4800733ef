"""The server's live outputs: any running stream (a WHIP publisher such as OBS, `serve --input`, the
Live tab's camera, a `/webrtc/offer` client) pushed to RTMP, written as HLS, recorded to a file or
sent as an NDI source, as many outputs a stream as `OutputLimits.per_stream`.

One registry (`Outputs`) for every way in: the HTTP API (`POST /studio/outputs/{stream}`), the Live
output tab, OSC (`/streamstudio/{stream}/output`) and `serve --output` for an `--input` stream. Each
output is a sink attached to the stream's session (`streaming.runner.Attachment`): it writes the
stream's newest output at a constant frame rate from its own thread, so a slow network sink never
slows the stream or the other outputs. An output stops on request, when its sink fails (the RTMP
server went away) or when its stream ends; a stopped one stays listed until it is removed or a new
output needs its place.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse
import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.runner import Attachment
from streamstudio.streaming.sinks import open_sink
from streamstudio.app.web.webrtc import OfferRefused, read_json

if TYPE_CHECKING:
    from streamstudio.app.web.sessions import SessionManager, StreamSession

log = logging.getLogger(__name__)

KINDS = ("rtmp", "hls", "file", "ndi")
DEFAULT_FPS = 30.0
MAX_FPS = 120.0


class OutputRefused(StreamStudioError):
    """A start or stop the registry refuses: `status` is the HTTP status the API answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class OutputLimits:
    """Outputs per stream and on the server at most (each holds a thread and an encoder), and the
    RTMP hosts a push may go to (None: any; `serve --allow-push`, by default none when the server is
    reachable from the network)."""

    per_stream: int = 2
    total: int = 8
    allow_push: tuple[str, ...] | None = None


def clean_name(name: str, default: str) -> str:
    """A file name without folders or odd characters (a request names no server path)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name or default).name).strip("._") or default
    return stem[:80]


def output_location(kind: str, target: str, output_dir: Path) -> str:
    """Where an output goes (a `streaming.sinks.open_sink` spec): kind file | rtmp | hls | ndi;
    files and HLS playlists go under `output_dir`, under a cleaned name; an NDI source is named by
    the target (cleaned)."""
    if kind == "rtmp":
        if not re.match(r"^rtmps?://[^\s/]+/\S+$", target or ""):
            raise OutputRefused("give an RTMP URL like rtmp://host/live/streamkey")
        return target
    if kind == "hls":
        folder = output_dir / "hls" / clean_name(target, "live")
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder / "index.m3u8")
    if kind == "file":
        name = clean_name(target, "recording.mp4")
        suffix_ok = Path(name).suffix.lower() in (".mp4", ".mkv", ".webm", ".mov")
        output_dir.mkdir(parents=True, exist_ok=True)
        return str(output_dir / (name if suffix_ok else name + ".mp4"))
    if kind == "ndi":
        name = re.sub(r"[^A-Za-z0-9 ._-]+", "_", target or "").strip(" ._") or "StreamStudio"
        return f"ndi://{name[:64]}"
    raise OutputRefused(f"unknown output kind {kind!r}; use {', '.join(KINDS)}")


def parse_output_url(url: str) -> tuple[str, str]:
    """`serve --output URL` as (kind, target): rtmp(s)://..., ndi://NAME, a .m3u8 path (HLS, its
    folder's name the stream name), or a file name (.mp4 .mkv .webm .mov)."""
    if url.startswith(("rtmp://", "rtmps://")):
        return "rtmp", url
    if url.startswith("ndi://"):
        return "ndi", url[len("ndi://"):]
    path = Path(url)
    if path.suffix.lower() == ".m3u8":
        return "hls", path.parent.name or path.stem
    if path.suffix.lower() in (".mp4", ".mkv", ".webm", ".mov"):
        return "file", path.name
    raise StreamStudioError(f"--output {url!r}: give rtmp://HOST/APP/KEY, ndi://NAME, NAME.m3u8 (HLS) or a "
                            "file name ending .mp4, .mkv, .webm or .mov (written under --output-dir)")


@dataclass
class LiveOutput:
    """One output of a stream: where it goes and the attachment that feeds it."""

    oid: str
    sid: str
    kind: str
    target: str
    location: str  # a file, an RTMP URL, an HLS playlist, ndi://NAME
    owner: str | None  # the page that started it (a Gradio session hash), None: the API, OSC or the CLI
    session: StreamSession
    attachment: Attachment
    started: float = field(default_factory=time.time)

    @property
    def running(self) -> bool:
        return self.attachment.running

    def stop(self) -> None:
        self.session.detach(self.attachment)

    def status(self) -> dict:
        """What the API lists and the tab shows: where it goes, its state and its counters."""
        a, st = self.attachment, self.attachment.sink.status
        state = "running" if a.running else ("failed" if a.error else "stopped")
        return {"id": self.oid, "stream": self.sid, "kind": self.kind, "target": self.target,
                "location": self.location, "state": state, "fps": a.fps, "frames": a.frames,
                "frames_lost": st.frames_lost, "reconnects": st.reconnects,
                "error": a.error or st.error or None, "stream_ended": bool(a.ended),
                "started": round(self.started, 3)}


class Outputs:
    """Every live output of the server (see the module docstring)."""

    def __init__(self, manager: SessionManager, output_dir: str | Path = "outputs", limits: OutputLimits | None = None):
        self.manager, self.output_dir, self.limits = manager, Path(output_dir), limits or OutputLimits()
        self._outputs: dict[str, LiveOutput] = {}
        self._lock = threading.Lock()

    def start(self, sid: str, kind: str, target: str, fps: float = DEFAULT_FPS, owner: str | None = None) -> LiveOutput:
        """Start an output of stream `sid`: OutputRefused (with its HTTP status) when the stream
        does not run, the limits are reached, the push target is not allowed or the sink cannot
        open. Who may start it is the caller's check (a page: its own streams; the API: the
        publish credential)."""
        if kind not in KINDS:
            raise OutputRefused(f"unknown output kind {kind!r}; use {', '.join(KINDS)}")
        if not isinstance(fps, (int, float)) or not 1 <= fps <= MAX_FPS:
            raise OutputRefused(f"fps must be a number from 1 to {MAX_FPS:g}")
        session = self.manager.get(sid) if sid else None
        if session is None or session.closed:
            raise OutputRefused(f"no running stream {sid!r}: start its source first (the Live tab's camera, a WHIP "
                                "publisher, serve --input)", 404)
        self._check_push(kind, target)
        location = output_location(kind, target, self.output_dir)
        with self._lock:
            self._drop_finished()
            self._check_room(session)
        try:  # (outside the lock: an RTMP server may take seconds to answer)
            sink = open_sink(location, *session.size, float(fps))
        except Exception as exc:  # StreamStudioError, or the encoder library's own error
            raise OutputRefused(f"could not start the output: {exc}", 502) from exc
        with self._lock:
            try:
                self._check_room(session)  # again: another start may have taken the place meanwhile
                attachment = session.attach(sink, float(fps))
            except OutputRefused:
                sink.close()
                raise
            except StreamStudioError:  # the stream ended meanwhile
                sink.close()
                raise OutputRefused(f"the stream {sid!r} has ended", 404) from None
            out = LiveOutput(secrets.token_hex(6), sid, kind, target, location, owner, session, attachment)
            self._outputs[out.oid] = out
        log.info("output %s of stream %s: %s -> %s", out.oid, sid, kind, location)
        return out

    def _check_push(self, kind: str, target: str) -> None:
        if kind == "rtmp" and self.limits.allow_push is not None:
            host = (urlparse(target or "").hostname or "").lower()
            if host not in self.limits.allow_push:
                raise OutputRefused(f"this server does not push to {host or 'that address'}: its admin can allow it "
                                    f"with `serve --allow-push {host or 'HOST'}`", 403)

    def _check_room(self, session) -> None:  # (under self._lock)
        running = [o for o in self._outputs.values() if o.running]
        if sum(o.session is session for o in running) >= self.limits.per_stream:
            raise OutputRefused(f"this stream already has {self.limits.per_stream} output(s), the most it may have; "
                                "stop one first", 409)
        if len(running) >= self.limits.total:
            raise OutputRefused(f"the server already runs {self.limits.total} outputs, the most it takes; try again "
                                "later", 503)

    def _drop_finished(self) -> None:  # (under self._lock)
        """Forget stopped outputs whose stream has ended (a stopped one of a running stream stays
        listed, with its error, until it is removed)."""
        for oid in [k for k, o in self._outputs.items() if not o.running and o.session.closed]:
            self._outputs.pop(oid)

    def stop(self, oid: str, sid: str | None = None) -> LiveOutput:
        """Stop and remove output `oid` (of stream `sid`, when given); OutputRefused 404 when there
        is no such output."""
        with self._lock:
            out = self._outputs.get(oid)
            if out is None or (sid is not None and out.sid != sid):
                raise OutputRefused(f"no output {oid!r}" + (f" of stream {sid!r}" if sid else ""), 404)
            self._outputs.pop(oid)
        out.stop()
        log.info("output %s of stream %s stopped: %d frame(s)", oid, out.sid, out.attachment.frames)
        return out

    def get(self, oid: str) -> LiveOutput | None:
        return self._outputs.get(oid)

    def of(self, sid: str | None = None, owner: str | None = None) -> list[LiveOutput]:
        """The outputs of stream `sid` (None: every stream), those `owner` started when given."""
        with self._lock:
            self._drop_finished()
            return [o for o in self._outputs.values()
                    if (sid is None or o.sid == sid) and (owner is None or o.owner == owner)]

    def counts(self) -> dict:
        running = [o for o in list(self._outputs.values()) if o.running]
        return {kind: sum(o.kind == kind for o in running) for kind in KINDS}

    def close(self) -> None:
        with self._lock:
            outs, self._outputs = list(self._outputs.values()), {}
        for out in outs:
            out.stop()


def mount(app, outputs: Outputs) -> None:
    """The output routes on `app` (FastAPI), behind the publish credential like every /studio route
    (`security.GuardConfig.control_prefixes`):

        POST   /studio/outputs/{stream}       {kind, target, fps?} -> 201 {output}, Location
        GET    /studio/outputs                 -> {outputs: [...]}, every stream's
        GET    /studio/outputs/{stream}        -> {outputs: [...], per_stream, total}
        GET    /studio/outputs/{stream}/{id}   -> {output}
        DELETE /studio/outputs/{stream}/{id}   -> {output}: stopped, with its final counters
    """
    def refused(exc: OutputRefused) -> JSONResponse:
        return JSONResponse({"status": "failed", "error": str(exc)}, status_code=exc.status)

    async def start(stream: str, request: Request):
        try:
            raw = await read_json(request, 16 * 1024)
        except OfferRefused as exc:
            return refused(OutputRefused(str(exc)))
        if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str) or \
                not isinstance(raw.get("target", ""), str):
            return refused(OutputRefused('send a JSON object {"kind": "rtmp"|"hls"|"file"|"ndi", "target": "...", '
                                         '"fps": 30}'))
        try:
            out = await asyncio.to_thread(outputs.start, stream, raw["kind"], raw.get("target", ""),
                                          raw.get("fps", DEFAULT_FPS))
        except OutputRefused as exc:
            return refused(exc)
        return JSONResponse({"status": "ok", "output": out.status()}, status_code=201,
                            headers={"Location": f"/studio/outputs/{stream}/{out.oid}"})

    start.__annotations__["request"] = Request  # resolved here: this module has lazy annotations
    app.post("/studio/outputs/{stream}", tags=["outputs"], status_code=201)(start)

    @app.get("/studio/outputs", tags=["outputs"])
    async def every():
        return {"outputs": [o.status() for o in outputs.of()]}

    @app.get("/studio/outputs/{stream}", tags=["outputs"])
    async def listing(stream: str):
        return {"outputs": [o.status() for o in outputs.of(stream)], "per_stream": outputs.limits.per_stream,
                "total": outputs.limits.total}

    @app.get("/studio/outputs/{stream}/{oid}", tags=["outputs"])
    async def one(stream: str, oid: str):
        out = outputs.get(oid)
        if out is None or out.sid != stream:
            return refused(OutputRefused(f"no output {oid!r} of stream {stream!r}", 404))
        return {"output": out.status()}

    @app.delete("/studio/outputs/{stream}/{oid}", tags=["outputs"])
    async def stop(stream: str, oid: str):
        try:
            out = await asyncio.to_thread(outputs.stop, oid, stream)
        except OutputRefused as exc:
            return refused(exc)
        return {"status": "ok", "output": out.status()}

    app.state.outputs = outputs
