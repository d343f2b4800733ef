"""Many users over one model: a shared `ServerModel`, one `StreamSession` per live stream.

The model's modules are loaded once and shared; every session builds its own StreamDiffusion
over them (the pipeline object holds per-stream state only: buffer, prompt, seed, filter).
With cross-stream batching (the default; `app/batching.py`) one executor thread runs every
UNet and VAE call, and the calls of several sessions that arrive together run as one batch;
the text encoder and tokenizer stay behind the model's lock. Without it, each session's whole
frame runs under that lock, so sessions take turns on the model.

A session takes frames with `submit()` (never blocks: a newer frame replaces one that is
still waiting) and hands back `latest()` at once; its worker thread does the inference. A
session that fails stops alone; the manager frees sessions that disconnect or go idle.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from collections.abc import Callable

import numpy as np

from streamstudio.app.settings import parse_settings
from streamstudio.errors import StreamStudioError
from streamstudio.frames import fit_aspect

log = logging.getLogger(__name__)

MAX_PRESETS = 64  # settings kept for streams that have not connected yet (each a few KB at most)


class BusyError(StreamStudioError):
    """Every stream slot is taken."""


PROBE_BITS = 10  # latency probe: a frame counter drawn as blocks in the top band
PROBE_BLOCKS = PROBE_BITS + 2  # plus a white start and a black end block


def draw_probe(frame: np.ndarray, value: int) -> np.ndarray:
    """Draw `value` (mod 2**PROBE_BITS) as black/white blocks across the top sixth of `frame`."""
    h, w = frame.shape[:2]
    bw, bh = w // PROBE_BLOCKS, max(2, h // 6)
    bits = [1] + [(value >> (PROBE_BITS - 1 - i)) & 1 for i in range(PROBE_BITS)] + [0]
    for i, bit in enumerate(bits):
        frame[:bh, i * bw:(i + 1) * bw] = 255 * bit
    return frame


def read_probe(frame: np.ndarray) -> int | None:
    """The value `draw_probe` drew (None when the guard blocks are not there)."""
    h, w = frame.shape[:2]
    bw, bh = w // PROBE_BLOCKS, max(2, h // 6)
    if bw < 1:
        return None
    centres = frame[bh // 2, [i * bw + bw // 2 for i in range(PROBE_BLOCKS)]].astype(np.float32).mean(axis=-1)
    bits = [int(c > 127) for c in centres]
    if bits[0] != 1 or bits[-1] != 0:
        return None
    return int("".join(map(str, bits[1:-1])), 2)


@dataclass
class ServerModel:
    """The one loaded model and the defaults every new stream starts from."""

    comps: object  # SDComponents
    config: object  # StreamDiffusionConfig: size, steps, guidance, ...
    prompt: str = ""
    negative_prompt: str = ""
    latency_probe: bool = False  # copy the input's probe counter onto the output (benchmarks)
    batching: object | None = None  # BatchingConfig: batch the sessions' network calls; None: take turns
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.executor = None
        self._stream_comps = self.comps
        if self.batching is not None:
            from streamstudio.app.batching import BatchExecutor, batched_components

            self.executor = BatchExecutor(self.batching)
            self._stream_comps = batched_components(self.comps, self.executor)
            if self._stream_comps.unet.pad:  # compiled / TensorRT: every bucket warmed up now, not mid-stream
                from streamstudio.app.batching import warm_up

                warm_up(self._stream_comps, self.config.height, self.config.width)

    @property
    def name(self) -> str:
        return self.comps.name

    @property
    def is_demo(self) -> bool:
        return bool(self.comps.is_demo)

    @property
    def size(self) -> tuple[int, int]:
        return self.config.width, self.config.height

    def build(self, mode: str):
        """A new stream (per-session state) over the shared modules."""
        from streamstudio.pipelines.stream_diffusion import StreamDiffusion

        with self.lock:
            return StreamDiffusion(self._stream_comps, replace(self.config, mode=mode),
                                   prompt=self.prompt, negative_prompt=self.negative_prompt)

    def frame_lock(self):
        """What a session holds while its frame runs: the model lock, or nothing when the
        executor batches (and serializes) the network calls."""
        return contextlib.nullcontext() if self.executor is not None else self.lock

    def stream_client(self):
        """Held by a session while its frame runs: the executor waits (briefly) for as many
        calls as there are such sessions before it runs a batch."""
        return self.executor.client() if self.executor is not None else contextlib.nullcontext()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()

    def batching_stats(self) -> dict | None:
        if self.executor is None:
            return None
        s = self.executor.stats
        return {"calls": s.calls, "requests": s.requests, "batched_calls": s.batched_calls,
                "requests_per_call": round(s.requests_per_call, 2), "largest": s.largest}


class LockedPipeline:
    """A stream over the shared model whose every call takes the model's lock: for tabs that
    drive a pipeline themselves (the Splats tab) next to the sessions."""

    def __init__(self, pipe, lock: threading.Lock):
        self._pipe, self._lock = pipe, lock

    def __call__(self, *args, **kwargs):
        with self._lock:
            return self._pipe(*args, **kwargs)

    def __getattr__(self, name: str):
        attr = getattr(self._pipe, name)
        if not callable(attr):
            return attr

        def locked(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)

        return locked


class StreamSession:
    """One user's stream: latest-frame input slot, worker thread, latest output."""

    def __init__(self, sid: str, model: ServerModel, mode: str = "img2img", settings: dict | None = None):
        self.sid, self.model, self.mode = sid, model, mode
        self.created = self.last_seen = time.monotonic()
        self.error: str | None = None  # the stream stopped on this
        self.notice: str | None = None  # a rejected setting; the stream goes on
        self._cond = threading.Condition()
        self._input: tuple[np.ndarray | None, float] | None = None
        self._pending: dict = dict(settings or {})
        self._applied: dict = {}
        self._output: np.ndarray | None = None
        self._listeners: list[Callable[[np.ndarray], None]] = []
        self._closed = False
        self._times: deque[float] = deque(maxlen=60)  # output times
        self._latency: deque[float] = deque(maxlen=30)  # submit -> output seconds
        self.frames_in = self.processed = self.dropped = 0
        self._pipe = None
        self.fit = "crop"  # the "fit" setting: the session's own, not the pipeline's
        self._probes: deque[int | None] = deque()
        self._thread = threading.Thread(target=self._run, name=f"stream-{sid[:12]}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side (never blocks)
    def submit(self, frame: np.ndarray | None) -> None:
        """Hand in the newest frame (RGB uint8, None for txt2img); replaces a waiting one."""
        with self._cond:
            if self._closed:
                return
            self.last_seen = time.monotonic()
            self.frames_in += 1
            if self._input is not None:
                self.dropped += 1
            self._input = (frame, time.perf_counter())
            self._cond.notify()

    def latest(self) -> np.ndarray | None:
        return self._output

    def request(self, settings: dict) -> None:
        """Change settings; they apply before the next frame."""
        with self._cond:
            self._pending.update(settings)
            self._cond.notify()

    def add_listener(self, fn: Callable[[np.ndarray], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[np.ndarray], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, wait: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._input = None
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(wait)
        self._listeners.clear()

    def stats(self) -> dict:
        times = list(self._times)
        fps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
        lat = list(self._latency)
        pipe = self._pipe
        return {
            "id": self.sid, "mode": self.mode, "model": self.model.name,
            "fps": round(fps, 2), "latency_ms": round(1000 * sum(lat) / len(lat), 1) if lat else None,
            "skip_rate": round(float(pipe.skip_rate), 3) if pipe is not None else 0.0,
            "frame_latency": pipe.latency_frames if pipe is not None else None,
            "frames_in": self.frames_in, "processed": self.processed, "dropped": self.dropped,
            "settings": _jsonable(self._applied), "error": self.error, "notice": self.notice,
            "batching": self.model.batching_stats(),
        }

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        try:
            self._pipe = self.model.build(self.mode)
            while True:
                item, changes = self._next()
                if item is None:
                    return
                self._apply(changes)
                with self.model.stream_client():  # in a frame: the executor may wait for this stream
                    self._process(*item)
        except Exception as exc:  # one broken stream never takes the server down
            self.error = str(exc) if isinstance(exc, StreamStudioError) else f"{type(exc).__name__}: {exc}"
            log.exception("stream %s stopped", self.sid) if not isinstance(exc, StreamStudioError) else \
                log.warning("stream %s stopped: %s", self.sid, exc)
        finally:
            self._closed = True
            self._pipe = None  # free the per-stream buffers now

    def _next(self):
        with self._cond:
            while self._input is None and not self._closed:
                self._cond.wait(1.0)
            if self._closed:
                return None, {}
            item, self._input = self._input, None
            changes, self._pending = self._pending, {}
            return item, changes

    def _apply(self, changes: dict) -> None:
        changes = {k: v for k, v in changes.items() if self._applied.get(k, _MISSING) != v}
        if "fit" in changes:
            self.fit = changes["fit"]
            self._applied["fit"] = changes.pop("fit")
        if not changes:
            return
        pipe = self._pipe
        try:
            with self.model.lock:
                if "prompt" in changes:
                    pipe.set_prompt(changes["prompt"])
                if "negative_prompt" in changes:
                    pipe.set_negative_prompt(changes["negative_prompt"])
                rest = {k: v for k, v in changes.items() if k not in ("prompt", "negative_prompt")}
                if self.mode == "txt2img":
                    rest.pop("strength", None)
                if rest:
                    pipe.update(**rest)
            self._applied.update(changes)
            self.notice = None
        except StreamStudioError as exc:
            self.notice = f"setting not applied: {exc}"

    def _process(self, frame: np.ndarray | None, t_submit: float) -> None:
        pipe = self._pipe
        probe = read_probe(frame) if self.model.latency_probe and frame is not None else None
        if frame is not None:
            frame = fit_aspect(frame, pipe.config.width, pipe.config.height, self.fit)
        skipped = pipe.stats.skipped
        with self.model.frame_lock():
            out = pipe(frame)
        if isinstance(out, list):
            out = out[-1]
        if self.model.latency_probe:
            out = self._stamp(out, probe, skipped != pipe.stats.skipped)
        self._output = out
        now = time.perf_counter()
        self._latency.append(now - t_submit)
        self._times.append(now)
        self.processed += 1
        for fn in list(self._listeners):
            try:
                fn(out)
            except Exception:  # a broken listener (a sink) must not stop the stream
                log.exception("output listener of stream %s failed; removed", self.sid)
                self.remove_listener(fn)


    def _stamp(self, out: np.ndarray, probe: int | None, skipped: bool) -> np.ndarray:
        """Draw the probe of the input this output came from (Stream Batch: N - 1 calls ago)."""
        if not skipped:
            self._probes.append(probe)
            while len(self._probes) > self._pipe.latency_frames + 1:
                self._probes.popleft()
        source = self._probes[0] if self._probes else None
        return out if source is None else draw_probe(out.copy(), source)


_MISSING = object()


def _jsonable(settings: dict) -> dict:
    return {k: ([list(p) for p in v] if k == "prompt" and not isinstance(v, str) else v) for k, v in settings.items()}


class SessionManager:
    """Open, find and free sessions; at most `max_streams` at once."""

    def __init__(self, model: ServerModel, max_streams: int = 4, idle_timeout: float = 20.0,
                 preset_ttl: float = 120.0, owns_model: bool = False):
        if max_streams < 1:
            raise StreamStudioError("--max-streams must be at least 1")
        self.model, self.max_streams, self.owns_model = model, max_streams, owns_model
        self.idle_timeout, self.preset_ttl = idle_timeout, preset_ttl
        self._sessions: dict[str, StreamSession] = {}
        self._presets: dict[str, tuple[dict, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="session-reaper", daemon=True)
        self._reaper.start()

    def busy_message(self) -> str:
        return (f"StreamStudio is busy: all {self.max_streams} live stream slot(s) are in use. "
                f"Try again in a minute (the server's admin can raise --max-streams).")

    def has_capacity(self) -> bool:
        with self._lock:
            return len(self._sessions) < self.max_streams

    def open(self, sid: str, mode: str = "img2img") -> StreamSession:
        """The session `sid`, created on first use; BusyError when every slot is taken."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None:  # a failed one too: its error shows until the reaper frees it
                return session
            if len(self._sessions) >= self.max_streams:
                raise BusyError(self.busy_message())
            preset, _ = self._presets.pop(sid, ({}, 0.0))
            session = StreamSession(sid, self.model, mode, preset)
            self._sessions[sid] = session
            return session

    def get(self, sid: str) -> StreamSession | None:
        return self._sessions.get(sid)

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
        if session is None:
            return False
        session.close(wait)
        log.info("stream %s closed (%d frames processed)", sid, session.processed)
        return True

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

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

    def _reap_loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.reap()
            except Exception:  # pragma: no cover - keep reaping
                log.exception("session reaper")

    def shutdown(self) -> None:
        self._stop.set()
        for sid in self.ids():
            self.close(sid)
        if self.owns_model:
            self.model.close()
