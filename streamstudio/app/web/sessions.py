"""Many users over one model: a shared `ServerModel`, one `StreamSession` per live stream.

The model's modules are loaded once and shared; every session builds its own StreamDiffusion
over them (the pipeline object holds per-stream state only: buffer, prompt, seed, filter).
One `ModelGuard` says who may use the model when: with cross-stream batching (the default;
`models/image/batching.py`) one executor thread runs every UNet and VAE call, and the calls of several
sessions that arrive together run as one batch; the text encoder and tokenizer stay behind the
guard's lock. Without it, each session's whole frame runs under that lock, so sessions take
turns on the model.

A session is a `streaming.Runner` over a `PushSource`: it takes frames with `submit()` (never
blocks: a newer frame replaces one that is still waiting) and hands back `latest()` at once.
Its size follows its first frame's aspect ratio (`ServerModel.stream_size`: a 4:3 camera on a
256 model streams at 256x192); later frames of another aspect are cropped or padded to it (the
session's `fit` setting), so the outputs, and the recordings and viewers fed from them, keep one size
(until a deck B of another size is switched to: `resize`).
A session that fails stops alone; the manager frees sessions that disconnect or go idle.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from streamstudio.app.streams.image import output_size
from streamstudio.app.settings import parse_settings
from streamstudio.app.perform.inputs import LiveInputs, opened
from streamstudio.app.web.model_guard import ModelGuard
from streamstudio.app.web.placement import OneModel
from streamstudio.app.web.security import SourceRate
from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit_aspect
from streamstudio.models.image.batching import (BatchedImageNet, BatchExecutor, BatchingConfig, ClientStats,
                                                batched_components, warm_up)
from streamstudio.models.image.net_thread import NetworkThread, threaded_components
from streamstudio.streaming.probe import draw_probe, read_probe
from streamstudio.streaming.runner import Runner, RunnerConfig
from streamstudio.streaming.sinks import NullSink
from streamstudio.streaming.sources import DEFAULT_FPS, PushSource
from streamstudio.app.streams.image import new_stream
from streamstudio.frames import to_rgb
from streamstudio.models.image.lora import check_scale

if TYPE_CHECKING:  # (names for the type checker: modules that import this one, and torch's types)
    import torch

    from streamstudio.app.web.placement import Placement
    from streamstudio.app.web.session_model import SessionModel, SessionProcessor
    from streamstudio.models.image.components import SDComponents
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig, StreamStats
    from streamstudio.streaming.runner import Attachment, RunMetrics
    from streamstudio.streaming.sink_base import Sink

log = logging.getLogger(__name__)

MAX_PRESETS = 64  # settings kept for streams that have not connected yet (each a few KB at most)


class BusyError(StreamStudioError):
    """Every stream slot is taken."""


@dataclass
class ServerModel:
    """The one loaded model, the defaults every new stream starts from, and the one guard of
    the model (`guard`)."""

    comps: SDComponents
    config: StreamDiffusionConfig  # size, steps, guidance, ...
    prompt: str = ""
    negative_prompt: str = ""
    latency_probe: bool = False  # copy the input's probe counter onto the output (benchmarks)
    batching: BatchingConfig | None = None  # batch the sessions' network calls; None: take turns
    network_thread: bool | None = None  # taking turns: every network call on one thread (None: on a GPU,
    #                                     where cuDNN tunes per thread: models/image/net_thread.py)

    def __post_init__(self) -> None:
        self.executor: BatchExecutor | None = None
        self.thread: NetworkThread | None = None
        self._stream_comps = self.comps
        on_gpu = self.comps.net.device.type == "cuda"
        if self.batching is None and (self.network_thread or (self.network_thread is None and on_gpu)):
            self.thread = NetworkThread("model-network")
            self._stream_comps = threaded_components(self.comps, self.thread)
        if self.batching is not None:
            self.executor = BatchExecutor(self.batching)
            self._stream_comps = batched_components(self.comps, self.executor)
            net = self._stream_comps.net
            if isinstance(net, BatchedImageNet) and net.pad:  # compiled / TensorRT: every bucket warmed up now
                warm_up(self._stream_comps, self.config.height, self.config.width)
        self.guard = ModelGuard(self.executor)

    @property
    def name(self) -> str:
        return self.comps.name

    @property
    def is_demo(self) -> bool:
        return bool(self.comps.is_demo)

    @property
    def size(self) -> tuple[int, int]:
        """The configured (width, height): text-to-image streams' size, and the longer side of
        camera streams (`stream_size`)."""
        return self.config.width, self.config.height

    def stream_size(self, aspect: float | None) -> tuple[int, int]:
        """A camera stream's (width, height) for frames of `aspect` (width / height): that aspect
        with the configured longer side, multiples of 8 (`output_size`; 4:3 on a 256 model:
        256x192). The configured size when the aspect is not known, or when the networks take
        only the shapes they were built and warmed up for (compiled, TensorRT)."""
        if aspect is None or self._stream_comps.net.fixed_shapes:
            return self.size
        return output_size(None, None, max(self.size), aspect)

    def build(self, mode: str, size: tuple[int, int] | None = None) -> StreamDiffusion:
        """A new stream (per-session state) over the shared modules, at `size` (width, height;
        default the configured size)."""
        width, height = size or self.size
        with self.guard.text():
            return new_stream(self._stream_comps, replace(self.config, mode=mode, width=width, height=height),
                              prompt=self.prompt, negative_prompt=self.negative_prompt)

    def processor(self, mode: str, sid: str) -> "StreamProcessor":
        """The frame step of stream `sid` on this model (`serve --cluster`'s remote replicas
        return one that runs in a Ray actor)."""
        return StreamProcessor(self, mode, sid)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
        if self.thread is not None:
            self.thread.close()

    def lora_listing(self) -> list[tuple[str, float]]:
        """(source, scale) of each loaded LoRA (the model banner's list)."""
        loras = getattr(self.comps, "loras", None)
        return loras.listing() if loras is not None else []

    def set_lora_scales(self, scales: object) -> list[tuple[str, float]]:
        """Server-wide LoRA scales {name or source: scale}: the LoRAs are fused into the shared
        weights, so every stream gets them. Applied between frames (`ModelGuard.exclusive`); the
        streams encode their prompts again at their next frame when a LoRA changes the text
        encoders. All names are checked before any scale changes."""
        loras = getattr(self.comps, "loras", None)
        if loras is None or not loras.loras:
            raise StreamStudioError("no LoRA is loaded on this server (serve --lora PATH_OR_ID[:scale])")
        if not isinstance(scales, dict) or not scales:
            raise StreamStudioError('LoRA scales are an object {"name or source": scale, ...}')
        checked = {loras.find(str(name)).source: check_scale(scale) for name, scale in scales.items()}
        with self.guard.exclusive():
            for source, scale in checked.items():
                loras.set_scale(source, scale)
        log.info("LoRA scales set for every stream: %s", checked)
        return loras.listing()

    def batching_stats(self) -> dict | None:
        if self.executor is None:
            return None
        s = self.executor.stats
        return {"calls": s.calls, "requests": s.requests, "batched_calls": s.batched_calls,
                "requests_per_call": round(s.requests_per_call, 2), "largest": s.largest}


@contextlib.contextmanager
def _reported(sid: str):
    """Log why stream `sid` stops (a traceback only for a bug), then let the error stop it."""
    try:
        yield
    except StreamStudioError as exc:
        log.warning("stream %s stopped: %s", sid, exc)
        raise
    except Exception:
        log.exception("stream %s stopped", sid)
        raise


class StreamProcessor:
    """A web stream's frame step, the processor of its runner (live: `processor(frame)`): the
    camera frame brought to the stream's aspect (the `fit` setting: crop or pad), the stream's
    own pipeline over the shared model run in the guard's frame context and, with the latency
    probe, the probe of the input each output came from drawn onto it. txt2img streams ignore
    the frame (it only asks for the next image)."""

    def __init__(self, model: ServerModel, mode: str, sid: str):
        self.model, self.mode, self.sid = model, mode, sid
        self.pipe: StreamDiffusion | None = None  # built by open(), in the runner's thread (the text encoder runs)
        self.fit = "crop"  # the session's own setting, not the pipeline's
        self._probes: deque[int | None] = deque()
        self.calls: ClientStats | None = None  # this stream's network calls, shared or alone
        if model.executor is not None:
            self.calls = ClientStats()

    def open(self, size: tuple[int, int]) -> None:
        """Build the stream's pipeline at `size` (width, height), once."""
        if self.pipe is None:
            self.pipe = self.model.build(self.mode, size)

    def close(self) -> None:
        """The stream ended: nothing to free here (its pipeline goes with the session)."""

    @property
    def stats(self) -> StreamStats | None:
        """The pipeline's similarity-filter counts (the runner's metrics read `skipped`)."""
        return None if self.pipe is None else self.pipe.stats

    def apply(self, changes: dict) -> None:
        """Checked settings (`parse_settings`); a StreamStudioError when the pipeline refuses one."""
        changes = dict(changes)
        self.fit = changes.pop("fit", self.fit)
        if self.mode == "txt2img":
            changes.pop("strength", None)
        if not changes:
            return
        pipe = self.pipe
        assert pipe is not None  # (open() built it)
        with self.model.guard.text():
            if "prompt" in changes:
                pipe.set_prompt(changes.pop("prompt"))
            if "negative_prompt" in changes:
                pipe.set_negative_prompt(changes.pop("negative_prompt"))
            if changes:
                pipe.update(**changes)

    def __call__(self, frame: np.ndarray | None) -> np.ndarray:
        """(A replica actor steps a txt2img stream with None: its frame only asks for the next image.)"""
        with _reported(self.sid), self.model.guard.frame(self.calls):
            return self._step(frame)

    def _step(self, frame: np.ndarray | None) -> np.ndarray:
        pipe, txt2img = self.pipe, self.mode == "txt2img"
        assert pipe is not None  # (open() built it)
        image = None if txt2img else frame
        probe = read_probe(image) if self.model.latency_probe and image is not None else None
        if image is not None:
            image = fit_aspect(image, pipe.config.width, pipe.config.height, self.fit)
        skipped = pipe.stats.skipped
        out = pipe(image)
        if isinstance(out, list):
            out = out[-1]
        if self.model.latency_probe:
            out = self._stamp(out, probe, skipped != pipe.stats.skipped)
        return out

    def _stamp(self, out: np.ndarray, probe: int | None, skipped: bool) -> np.ndarray:
        """Draw the probe of the input this output came from (Stream Batch: N - 1 calls ago)."""
        if not skipped:
            assert self.pipe is not None  # (open() built it)
            self._probes.append(probe)
            while len(self._probes) > self.pipe.latency_frames + 1:
                self._probes.popleft()
        source = self._probes[0] if self._probes else None
        return out if source is None else draw_probe(out.copy(), source)


class StreamSession:
    """One user's live stream: a `streaming.Runner` over a `PushSource` (frames handed in with
    `submit`), the stream's `StreamProcessor`, and the browser's view as its sink (the
    latest-result slot `latest()` reads). Its `size` is decided by the first frame handed in (see
    the module's docstring; text-to-image: the configured size). Settings asked for with `request`
    apply between frames (the runner's on_input hook). A recording, an RTMP or HLS push and WHEP
    viewers are sinks attached to the running session (`attach`, `detach`)."""

    def __init__(self, sid: str, model: SessionModel, mode: str = "img2img", settings: dict | None = None):
        self.sid, self.model, self.mode = sid, model, mode
        # the name WHEP viewers watch it by: a viewer never learns the id that controls the stream
        self.watch_id = "w" + secrets.token_urlsafe(12)
        self.named = False  # its id is a public name (a WHIP publisher's URL, serve --input's stream)
        self.created = self.last_seen = time.monotonic()
        self.notice: str | None = None  # a rejected setting; the stream goes on
        self.last_frame: np.ndarray | None = None  # the newest frame handed in (RGB uint8)
        self._pending: dict = dict(settings or {})
        self._reference: torch.Tensor | None = None  # an IP-Adapter reference embedding waiting for the next frame
        self.has_reference = False  # the stream has its own IP-Adapter reference (not the model's default)
        self._applied: dict = {}
        self._lock = threading.Lock()
        self._closed = False
        self.modulations = None  # app/perform/modulation.Modulations: settings driven by sources, each frame
        self.inputs = None  # app/perform/inputs.LiveInputs: the tempo clock and MIDI the modulations read
        width, height = model.size
        self._tick = np.zeros((height, width, 3), np.uint8) if mode == "txt2img" else None  # txt2img: "next image"
        self._size: tuple[int, int] | None = model.size if mode == "txt2img" else None  # camera: the first frame's
        self._source = PushSource(width, height, maxsize=1, description=f"stream {sid}")
        self._view = NullSink("the page's view", width, height, DEFAULT_FPS)  # keeps the latest output
        self.processor: SessionProcessor = model.processor(mode, sid)
        self.runner = Runner(self._source, self.processor, self._view, RunnerConfig(live=True, queue_size=1),
                             on_input=self._between_frames).start()

    # ------------------------------------------------------------------ caller side (never blocks)
    def submit(self, frame: np.ndarray | None) -> None:
        """Hand in the newest frame (RGB uint8; None asks a txt2img stream for its next image);
        it replaces one still waiting."""
        if self.closed:
            return
        self.last_seen = time.monotonic()
        if frame is not None:
            self.last_frame = frame  # the camera's newest picture (the Live tab's "use as reference")
        if self._size is None and frame is not None:
            with self._lock:  # (set before the frame goes in: the runner builds the pipeline at this size)
                if self._size is None:
                    h, w = frame.shape[:2]
                    self._size = self.model.stream_size(w / h)
        try:
            image = self._tick if frame is None else frame
            if image is None:  # (only a text-to-image stream takes None, as "the next image")
                raise StreamStudioError(f"stream {self.sid} takes camera frames; give it a frame")
            self._source.put(image)
        except StreamStudioError:
            if not self.closed:  # (closed meanwhile: the frame is not wanted)
                raise

    def latest(self) -> np.ndarray | None:
        return self._view.last

    def request(self, settings: dict) -> None:
        """Change settings (checked by `parse_settings`); they apply before the next frame."""
        with self._lock:
            self._pending.update(settings)

    def set_reference(self, image: np.ndarray) -> None:
        """This stream's IP-Adapter reference picture (HxWx3 or 4 uint8): its embedding is computed
        here (once per new picture), under the model's text guard, and the stream takes it before
        its next frame; other streams keep theirs."""
        import torch

        ip = getattr(self.model.comps, "ip_adapter", None)
        if ip is None:
            raise StreamStudioError("this model has no IP-Adapter (serve --ip-adapter ID)")
        pixels = torch.from_numpy(np.ascontiguousarray(to_rgb(image))).permute(2, 0, 1).float() / 255.0  # (3, H, W)
        with self.model.guard.text():
            embeds = ip.embed(pixels)
        with self._lock:
            self._reference = embeds

    def refused(self, exc: StreamStudioError) -> None:
        """A setting asked for was refused: said in the stream's stats; the stream goes on."""
        self.notice = f"setting not applied: {exc}"

    @property
    def public_name(self) -> str:
        """The name replies show (OSC): the id of a named stream (a WHIP publisher, serve --input),
        else the watch id, so the id that controls a page's stream never leaves the server."""
        return self.sid if self.named else self.watch_id

    def attach(self, sink: Sink, fps: float | None = None) -> Attachment:
        """Feed `sink` this stream's outputs from now on (`streaming.runner.Attachment`)."""
        return self.runner.attach(sink, fps)

    def detach(self, attachment: Attachment, wait: float | None = 10.0) -> None:
        """Stop feeding an attached sink; it is closed (within `wait` s when wait is given)."""
        self.runner.detach(attachment, wait)

    @property
    def size(self) -> tuple[int, int]:
        """The stream's output (width, height); before its first frame, the configured size."""
        return self._size or self.model.size

    def resize(self, size: tuple[int, int]) -> None:
        """The stream's output size from now on (a deck B of another size switched to, app/web/decks.py): outputs
        started later open at it; running ones fit the frames to theirs (WHEP and WebRTC re-open their encoders)."""
        with self._lock:
            self._size = size

    @property
    def frames_in(self) -> int:
        return self._source.received

    @property
    def processed(self) -> int:
        """Outputs that reached the page's view."""
        return self.runner.counts["out"]

    @property
    def fit(self) -> str:
        return self.processor.fit

    @property
    def error(self) -> str | None:
        """Why the stream stopped, when it failed."""
        return None if self.runner.error is None else str(self.runner.error)

    @property
    def closed(self) -> bool:
        return self._closed or self.runner.stopped

    def close(self, wait: float = 5.0) -> None:
        """Stop the stream; wait=0 returns at once (from the event loop) and its threads end by
        themselves."""
        self._closed = True
        self._source.close()
        self.runner.stop(interrupted=False)
        if wait:
            try:
                self.runner.wait(wait)
            except StreamStudioError:
                pass  # a failure was logged when it happened
        self.processor.close()

    def metrics(self) -> RunMetrics:
        """The stream's `streaming.runner.RunMetrics`: frames in, processed, out, drops, latency."""
        return self.runner.metrics()

    def stats(self) -> dict:
        """What the page and `GET /studio/sessions/{id}` show, from the runner's metrics."""
        m, pipe = self.metrics(), self.processor.pipe
        return {
            "id": self.sid, "mode": self.mode, "model": self.model.name,
            "fps": round(m.recent_fps, 2),
            "latency_ms": None if m.recent_latency_ms is None else round(m.recent_latency_ms, 1),
            "skip_rate": round(float(pipe.skip_rate), 3) if pipe is not None else 0.0,
            "frame_latency": pipe.latency_frames if pipe is not None else None,
            "frames_in": self._source.received, "processed": m.frames_out, "dropped": self._source.dropped + m.dropped,
            "settings": _jsonable(self._applied), "error": self.error,
            "notice": self.notice or getattr(self.processor, "notice", None),
            "batching": _batching_stats(self.model, self.processor),
            **_ip_stats(self.model, pipe, self.has_reference),
        }

    # ------------------------------------------------------------------ the runner's thread
    def _between_frames(self, pts: float) -> None:
        """The runner's on_input hook: the stream's pipeline built at the first frame (at the size
        that frame decided in `submit`), then the
        settings asked for since the last frame applied (one the pipeline refuses is said in the
        stats; the stream goes on)."""
        with self._lock:
            changes, self._pending = self._pending, {}
            reference, self._reference = self._reference, None
        mods, inputs = self.modulations, self.inputs
        if mods is not None:  # the modulated settings at this frame's time (over the ones asked for)
            view = None if inputs is None else inputs.view(self.sid)
            changes.update(mods.values(time.monotonic(), getattr(inputs, "clock", None), view))
        changes = {k: v for k, v in changes.items() if self._applied.get(k, _MISSING) != v}
        with _reported(self.sid):
            self.processor.open(self.size)
            if reference is not None:
                processor = self.processor  # (a reference needs the model's IP-Adapter: this process's model)
                assert isinstance(processor, StreamProcessor) and processor.pipe is not None
                processor.pipe.addons.set_reference_embeds(reference)
                self.has_reference = True
            if not changes:
                return
            try:
                self.processor.apply(changes)
            except StreamStudioError as exc:
                self.refused(exc)
                return
        self._applied.update(changes)
        self.notice = None


_MISSING = object()


def _batching_stats(model: SessionModel, processor: SessionProcessor) -> dict | None:
    """The model's batching counts and one stream's own: its calls shared with other streams or
    run alone (`shares_calls` False: none of its calls ran with another stream's)."""
    stats = model.batching_stats()
    calls = processor.calls
    if stats is None or calls is None:
        return stats
    own = calls.as_dict()
    return {**stats, **own, "shares_calls": own["shared_calls"] > 0}


def _ip_stats(model: SessionModel, pipe, has_reference: bool) -> dict:
    if pipe is None or getattr(model.comps, "ip_adapter", None) is None:
        return {}
    return {"ip_adapter": {"scale": pipe.addons.ip_adapter_scale, "own_reference": has_reference}}


def _jsonable(settings: dict) -> dict:
    return {k: ([list(p) for p in v] if k == "prompt" and not isinstance(v, str) else v) for k, v in settings.items()}


@dataclass(frozen=True)
class Pending:
    """A connection that holds a stream slot without streaming yet (offered, not connected, or no
    frame yet): where it came from, since when, and how to end it (closes it, frees its slot)."""

    source: str | None
    since: float  # time.monotonic() of its offer
    drop: Callable[[], Awaitable[None]]


class SessionManager:
    """Open, find and free sessions; at most `max_streams` live streams at once, the Live tab's
    sessions and the other tabs' streams (the Video tab's, Splats Stylize: `take_slot`) together.
    Its `placement` (app/web/placement.py; default: every session on `model`) puts each on a model."""

    def __init__(self, model: SessionModel | None = None, max_streams: int = 4, idle_timeout: float = 20.0,
                 preset_ttl: float = 120.0, owns_model: bool = False, placement: Placement | None = None):
        if max_streams < 1:
            raise StreamStudioError("--max-streams must be at least 1")
        # (model None and no placement: a manager of the other tabs' slots alone, as some tests build it)
        self.placement: Placement = placement or OneModel(model, max_streams, owns_model)  # type: ignore[arg-type]
        self.model = self.placement.models()[0]  # (the model the banner and status show)
        self.idle_timeout, self.preset_ttl = idle_timeout, preset_ttl
        self._sessions: dict[str, StreamSession] = {}
        self._slots: dict[str, str] = {}  # key -> tab: the other tabs' live streams (take_slot)
        self._presets: dict[str, tuple[dict, float]] = {}
        self._owners: dict[str, str] = {}  # stream id -> the page (Gradio session hash) that owns it
        self.offer_rate = SourceRate()  # new connections per source address (serve --offers-per-minute)
        self.inputs: LiveInputs | None = None  # what the streams' modulations read (serve sets it; issue 48)
        # connections one address may hold before they stream (serve --max-pending-per-source)
        self.max_pending_per_source = max(1, max_streams // 2)
        # connections of every address together that hold a slot without streaming (serve --max-pending)
        self.max_pending = max(1, max_streams // 2)
        self.pending_lists: list[Callable[[], list[Pending]]] = []  # each front end's pending connections
        self.peer_counters: dict[str, Callable[[], int]] = {}  # peer connections by kind (/studio/status)
        self._lock = threading.Lock()
        self.stopping = threading.Event()  # set by shutdown: the reaper (and a placement's threads) end
        self._reaper = threading.Thread(target=_reap_forever, args=(self,), name="session-reaper", daemon=True)
        self._reaper.start()
        self.placement.attach(self)

    @property
    def max_streams(self) -> int:
        return self.placement.limit()

    def busy_message(self) -> str:
        return self.placement.busy_message()

    def has_capacity(self) -> bool:
        with self._lock:
            return len(self) < self.max_streams and self.placement.has_room()

    def take_slot(self, key: str, tab: str) -> None:
        """Count another tab's live stream (`key`, unique to it) against --max-streams until
        `free_slot(key)`; BusyError when every slot is taken. Taking a held key again is a no-op."""
        with self._lock:
            if key in self._slots:
                return
            if len(self) >= self.max_streams:
                raise BusyError(self.busy_message())
            self._slots[key] = tab
        log.info("%s stream %s started (%d live stream(s))", tab, key, len(self))

    def free_slot(self, key: str) -> None:
        with self._lock:
            self._slots.pop(key, None)

    def open(self, sid: str, mode: str = "img2img") -> StreamSession:
        """The session `sid`, created on first use; BusyError when every slot is taken."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None:  # a failed one too: its error shows until the reaper frees it
                return session
            model = self.placement.place(sid) if len(self) < self.max_streams else None  # (other tabs count too)
            if model is None:
                raise BusyError(self.busy_message())
            preset, _ = self._presets.pop(sid, ({}, 0.0))
            try:
                session = StreamSession(sid, model, mode, preset)
            except BaseException:
                self.placement.release(sid)
                raise
            self._sessions[sid] = session
            opened(self, session)  # the show's modulations for it (app/perform/inputs.py)
            return session

    def get(self, sid: str) -> StreamSession | None:
        return self._sessions.get(sid)

    def watched(self, name: str) -> StreamSession | None:
        """The stream a WHEP viewer asks for by `name`: its watch id (the URL the Live tab shows),
        or its stream id (a WHIP publisher names its stream for its viewers)."""
        session = self._sessions.get(name)
        if session is not None:
            return session
        return next((s for s in list(self._sessions.values()) if s.watch_id == name), None)

    def claim(self, sid: str, owner: str | None) -> bool:
        """Whether the page `owner` (a Gradio session hash) may set or record stream `sid`: the
        first page that sends it inputs owns it from then on (until it closes). None: the server's
        own code, which may."""
        if owner is None:
            return True
        with self._lock:
            held = self._owners.setdefault(sid, owner)
            while len(self._owners) > MAX_PRESETS:  # bounded: ids a page named but never streamed
                self._owners.pop(next(iter(self._owners)))
        return held == owner

    def pending_connections(self) -> list[Pending]:
        """Connections that hold a slot without streaming yet (offered, not connected or no
        frame), every front end's together."""
        return [p for pending in self.pending_lists for p in pending()]

    def owner(self, sid: str) -> str | None:
        """The page that owns stream `sid` (`claim`), None when no page does (WHIP, the API)."""
        return self._owners.get(sid)

    def settings(self, sid: str, raw: dict) -> dict:
        """Validated settings for `sid`: applied at its next frame, or kept for when it connects."""
        settings = parse_settings(raw)
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                old = self._presets.pop(sid, ({}, 0.0))[0]
                self._presets[sid] = ({**old, **settings}, time.monotonic())
                while len(self._presets) > MAX_PRESETS:  # bounded: forget the oldest
                    self._presets.pop(next(iter(self._presets)))
        if session is not None:
            session.request(settings)
        return settings

    def close(self, sid: str, wait: float = 5.0) -> bool:
        """Stop and free `sid`; wait=0 returns at once (from the event loop)."""
        with self._lock:
            session = self._sessions.pop(sid, None)
            self._presets.pop(sid, None)
            self._owners.pop(sid, None)
            self.placement.release(sid)
        if session is None:
            return False
        if self.inputs is not None:
            self.inputs.forget(sid)  # its audio's features
        session.close(wait)
        log.info("stream %s closed (%d frames processed)", sid, session.processed)
        return True

    def models(self) -> list[SessionModel]:
        """Every model the sessions run on (one; `serve --gpus N`, `--cluster`: the replicas')."""
        return self.placement.models()

    def set_lora_scales(self, scales: object) -> list[tuple[str, float]]:
        """Server-wide LoRA scales (`ServerModel.set_lora_scales`), on every replica."""
        listing: list[tuple[str, float]] = []
        for model in self.models():
            listing = model.set_lora_scales(scales)
        return listing

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    def __len__(self) -> int:
        """Live streams: the sessions and the other tabs' streams."""
        return len(self._sessions) + len(self._slots)

    def reap(self) -> int:
        """Free sessions idle past idle_timeout or stopped by an error (kept briefly so the
        client can read the error); drop old presets. Returns how many sessions were freed."""
        now = time.monotonic()
        with self._lock:
            stale = [sid for sid, s in self._sessions.items()
                     if now - s.last_seen > (self.idle_timeout if not s.closed else min(self.idle_timeout, 10.0))]
            for sid in [k for k, (_, t) in self._presets.items() if now - t > self.preset_ttl]:
                self._presets.pop(sid)
        for sid in stale:
            self.close(sid)
        return len(stale)

    def shutdown(self) -> None:
        self.stopping.set()
        for sid in self.ids():
            self.close(sid)
        self.placement.shutdown()


def _reap_forever(manager: SessionManager) -> None:
    """The reaper thread: `manager.reap()` every second until it shuts down."""
    while not manager.stopping.wait(1.0):
        try:
            manager.reap()
        except Exception:  # pragma: no cover - keep reaping
            log.exception("session reaper")


def pending_from(manager: SessionManager, source: str) -> int:
    """`manager.pending_connections()` from the address `source`."""
    return sum(p.source == source for p in manager.pending_connections())
