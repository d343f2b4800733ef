"""source -> queue -> processor -> queue -> sink, each stage in its own thread, with metrics.

Live mode (webcam, screen, paced pattern): the queues hold the latest frames only; when a
stage falls behind the oldest frame is dropped and counted, so latency stays bounded, and the
processor is called as `processor(frame)` (latest output at once).

Offline mode (files, folders): every frame goes through, the queues apply back-pressure, and
the processor is driven with `push()` / `flush()`, so output frame i is the processed input
frame i with input frame i's timestamp, whatever the processor's internal delay.

Sinks attached to a running run (`attach(sink, fps)`: a recording, an RTMP push, a viewer's
encoder) each get the newest output in their own thread, so a slow sink never holds back the run
or the other sinks; `detach()` ends one (its sink closed), and all end with the run. A sink that
fails ends alone, with its error kept on its `Attachment`.

A stage that fails stops the run; `Runner.wait()` re-raises its error in the caller's thread.
`stop()` (e.g. on Ctrl-C) ends the stages and the sink is always closed, so a partial file is
complete and playable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sink_base import Sink
from streamstudio.streaming.sources import Source, VideoFrame

log = logging.getLogger(__name__)

SinkFactory = Callable[[int, int], Sink]  # (width, height) of the first output -> an open sink
RECENT = 30  # outputs the "recent" figures of the metrics span (a live display's fps and latency)
T = TypeVar("T")


class Closed(Exception):
    """The queue was closed and is empty."""


class FrameQueue(Generic[T]):
    """A small queue between two stages. live: put never blocks, the oldest item is dropped
    (and counted); offline: put blocks while full. `close()` ends it: get raises Closed once
    drained; `abort()` ends it at once, discarding what is inside."""

    def __init__(self, maxsize: int, live: bool):
        self.maxsize, self.live = max(1, maxsize), live
        self.dropped = 0
        self._items: deque[T] = deque()
        self._cond = threading.Condition()
        self._closed = self._aborted = False

    def put(self, item: T) -> bool:
        with self._cond:
            while not self.live and len(self._items) >= self.maxsize and not self._aborted:
                self._cond.wait(0.1)
            if self._aborted or self._closed:
                return False
            if len(self._items) >= self.maxsize:
                self._items.popleft()
                self.dropped += 1
            self._items.append(item)
            self._cond.notify_all()
            return True

    def get(self, timeout: float = 0.1) -> T:
        with self._cond:
            while not self._items:
                if self._closed or self._aborted:
                    raise Closed
                self._cond.wait(timeout)
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
            self._items.clear()
            self._cond.notify_all()


class Attachment:
    """A sink fed from a running run in its own thread, the newest output first: with `fps`, at
    that constant rate (the newest output written every 1/fps seconds, repeated when the run is
    slower, skipped when it is faster; timestamps frames / fps, which players show correctly),
    else each new output once, with its timestamp. It ends on `stop()`, when the run ends
    (`ended`), or when its sink fails (`error`); its sink is closed then, by its own thread."""

    STALL = 1.0  # seconds behind its schedule after which a paced sink catches up instead of bursting

    def __init__(self, sink: Sink, fps: float | None = None, on_end: Callable[[Attachment], None] | None = None):
        if fps is not None and fps <= 0:
            raise StreamStudioError(f"an output's frame rate must be above 0, got {fps}")
        self.sink, self.fps = sink, fps
        self.frames = 0  # frames written to the sink
        self.error: str | None = None  # why the sink failed
        self.ended = False  # it stopped because the run ended
        self._on_end = on_end
        self._latest: tuple[np.ndarray, float] | None = None
        self._fresh = False
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="streamstudio-attached-sink", daemon=True)
        self._thread.start()

    def offer(self, frame: np.ndarray, pts: float) -> None:
        """From the run's output stage: never blocks (a frame not written yet is replaced)."""
        with self._cond:
            self._latest, self._fresh = (frame, pts), True
            self._cond.notify_all()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, ended: bool = False, wait: float | None = 10.0) -> None:
        """End it (ended: because the run ended); wait up to `wait` s for its sink to be closed."""
        with self._cond:
            self.ended = self.ended or (ended and not self._stop.is_set())
            self._stop.set()
            self._cond.notify_all()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(wait)

    def _run(self) -> None:
        try:
            self._paced(self.fps) if self.fps else self._each()
        except Exception as exc:  # the sink failed (server gone, disk full): this output alone stops
            self.error = str(exc) if isinstance(exc, StreamStudioError) else f"{type(exc).__name__}: {exc}"
            log.warning("%s output stopped: %s", type(self.sink).__name__, self.error)  # (no URL: it may hold a key)
        finally:
            try:
                self.sink.close()
            except Exception as exc:  # already stopping: say so, keep the first error
                log.warning("closing the %s output: %s", type(self.sink).__name__, exc)
            if self._on_end is not None:
                self._on_end(self)

    def _next(self, timeout: float | None) -> tuple[np.ndarray, float] | None:
        """The newest output (None when stopped); waits up to `timeout` s for a new one when
        there is none yet or, timeout None, until a new one comes."""
        with self._cond:
            while not self._stop.is_set() and (self._latest is None or (timeout is None and not self._fresh)):
                if not self._cond.wait(0.5 if timeout is None else timeout) and timeout is not None:
                    break
            if self._stop.is_set():
                return None
            self._fresh = False
            return self._latest

    def _each(self) -> None:
        while (item := self._next(None)) is not None:
            self.sink.write(*item)
            self.frames += 1

    def _paced(self, fps: float) -> None:
        period, due = 1.0 / fps, None
        while not self._stop.is_set():
            now = time.monotonic()
            item = self._next(0.5 if due is None else max(0.0, due - now))
            if item is None:
                continue
            now = time.monotonic()
            due = now if due is None else due
            if now < due:
                continue
            self.sink.write(item[0])  # timestamped frames / fps by the sink
            self.frames += 1
            due += period
            if now - due > self.STALL:  # a stall (a slow network sink): catch up, don't burst
                due = now


class AttachedSinks:
    """The sinks attached to a run (`Runner.attach`), each fed by its `Attachment`'s own thread;
    one that ends, for whatever reason, is forgotten."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._list: list[Attachment] = []

    def add(self, sink: Sink, fps: float | None) -> Attachment:
        attachment = Attachment(sink, fps, on_end=self._forget)
        with self._lock:
            self._list.append(attachment)
        return attachment

    def listing(self) -> list[Attachment]:
        with self._lock:
            return list(self._list)

    def offer(self, frame: np.ndarray, pts: float) -> None:
        for attachment in self.listing():
            attachment.offer(frame, pts)

    def end(self, wait: float | None = None) -> None:
        """Stop each because the run ended; wait up to `wait` s for each sink to be closed."""
        for attachment in self.listing():
            attachment.stop(ended=True, wait=wait)

    def _forget(self, attachment: Attachment) -> None:
        with self._lock:
            if attachment in self._list:
                self._list.remove(attachment)


@dataclass
class RunnerConfig:
    live: bool | None = None  # None: follow source.info.live
    queue_size: int = 2  # live queues; offline queues hold up to 8 frames
    max_frames: int | None = None  # stop after this many input frames
    pace: bool | None = None  # feed frames at their timestamps; None: in live mode when the source is not live
    join_timeout: float = 5.0  # seconds to wait for a stage to end after a stop


@dataclass
class _Item:
    image: np.ndarray | None  # None: a frame of a source that has no input (a generator's clock), not an output
    pts: float
    index: int
    t_capture: float  # time.perf_counter() when the frame entered the run


class _InOrder:
    """Offline processing: a processor driven by `push()` / `flush()`, its outputs matched to the
    inputs in order, so that output i carries input i's timestamp whatever the processor's delay.
    The outputs come as they are matched (a generator), so those before a mismatch still go out."""

    def __init__(self, processor: Any):
        self.processor = processor
        self.pending: deque[_Item] = deque()  # inputs whose outputs have not come out yet

    def push(self, item: _Item) -> Iterator[_Item]:
        self.pending.append(item)
        return self._match(self.processor.push(item.image))

    def flush(self) -> Iterator[_Item]:
        return self._match(self.processor.flush())

    def _match(self, outs: Iterable[object]) -> Iterator[_Item]:
        for out in outs:
            if not self.pending:
                raise StreamStudioError("the processor returned more outputs than it was given inputs")
            item = self.pending.popleft()
            yield _Item(_as_frame(out), item.pts, item.index, item.t_capture)


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    if not len(values):
        return {f"p{q}": 0.0 for q in qs}
    arr = np.asarray(values, dtype=np.float64) * 1000.0
    return {f"p{q}": round(float(np.percentile(arr, q)), 3) for q in qs}


@dataclass
class RunMetrics:
    live: bool
    frames_in: int = 0
    frames_processed: int = 0
    frames_out: int = 0
    dropped_input: int = 0  # live: frames dropped before the processor
    dropped_output: int = 0  # live: outputs dropped before the sink
    filter_skipped: int = 0  # frames the processor's similarity filter skipped
    sink_lost: int = 0  # frames the sink could not deliver (RTMP drops)
    elapsed: float = 0.0
    input_fps: float = 0.0
    output_fps: float = 0.0
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> p50/p90/p99
    recent_fps: float = 0.0  # output fps over the last RECENT outputs (what a live display shows)
    recent_latency_ms: float | None = None  # mean end-to-end latency of the last RECENT outputs
    warnings: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def dropped(self) -> int:
        return self.dropped_input + self.dropped_output

    def summary(self) -> str:
        lat = self.latency_ms.get("end_to_end", {})
        return (f"{self.frames_in} in, {self.frames_out} out in {self.elapsed:.1f}s "
                f"({self.input_fps:.1f} fps in, {self.output_fps:.1f} fps out); dropped {self.dropped}, "
                f"filter-skipped {self.filter_skipped}, lost {self.sink_lost}; "
                f"latency p50 {lat.get('p50', 0):.1f} ms, p90 {lat.get('p90', 0):.1f} ms")


class Runner:
    """Run `source` through `processor` into `sink` (a Sink, or a factory called with the first
    output's size), and into the sinks attached meanwhile (`attach`). `on_input(pts)` runs in the
    processing thread before each frame (prompt schedules, settings changed while running);
    `on_output(frame, pts)` after each frame is written (previews)."""

    def __init__(self, source: Source, processor: Any, sink: Sink | SinkFactory,
                 config: RunnerConfig | None = None, on_input: Callable[[float], object] | None = None,
                 on_output: Callable[[np.ndarray, float], None] | None = None):
        self.source, self.processor = source, processor
        self.config = config or RunnerConfig()
        self.live = source.info.live if self.config.live is None else self.config.live
        self._factory = None if isinstance(sink, Sink) else sink
        self.sink: Sink | None = sink if isinstance(sink, Sink) else None
        self.on_input, self.on_output = on_input, on_output
        size = self.config.queue_size if self.live else max(8, self.config.queue_size)
        self._q_in: FrameQueue[_Item] = FrameQueue(size, self.live)
        self._q_out: FrameQueue[_Item] = FrameQueue(size, self.live)
        self._stop = threading.Event()
        self._errors: list[StreamStudioError] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._counts = {"in": 0, "processed": 0, "out": 0}
        self._lat: dict[str, deque] = {k: deque(maxlen=20000) for k in ("capture", "process", "output", "end_to_end")}
        self._t_start: float | None = None
        self._t_end: float | None = None
        self._t_stop: float | None = None
        self._t_first_out: float | None = None
        self._out_times: deque[float] = deque(maxlen=RECENT)
        self._interrupted = False
        self._finished = threading.Event()
        self._sinks = AttachedSinks()

    # ------------------------------------------------------------------ control
    def start(self) -> Runner:
        self._t_start = time.perf_counter()
        self._threads = [threading.Thread(target=self._guard, args=(name, target), name=f"streamstudio-{name}",
                                          daemon=True)
                         for name, target in (("capture", self._capture), ("process", self._process),
                                              ("output", self._output))]
        for thread in self._threads:
            thread.start()
        return self

    def attach(self, sink: Sink, fps: float | None = None) -> Attachment:
        """Feed `sink` this run's outputs from now on, in its own thread (see `Attachment`);
        a StreamStudioError once the run has stopped."""
        with self._lock:
            if self._stop.is_set() or self._finished.is_set():
                raise StreamStudioError("the stream has ended")
            return self._sinks.add(sink, fps)

    def detach(self, attachment: Attachment, wait: float | None = 10.0) -> None:
        """Stop feeding an attached sink; it is closed (within `wait` s when wait is given)."""
        attachment.stop(wait=wait)

    @property
    def attachments(self) -> list[Attachment]:
        return self._sinks.listing()

    @property
    def counts(self) -> dict[str, int]:
        """Frames in, processed and out so far (cheaper than `metrics()`)."""
        with self._lock:
            return dict(self._counts)

    @property
    def stopped(self) -> bool:
        """The run was stopped (stop(), a stage's failure) or has ended."""
        return self._stop.is_set() or self._finished.is_set()

    @property
    def running(self) -> bool:
        """A stage is still running."""
        return any(t.is_alive() for t in self._threads)

    @property
    def error(self) -> StreamStudioError | None:
        """The error that stopped the run, if one did."""
        return self._errors[0] if self._errors else None

    def stop(self, interrupted: bool = True) -> None:
        """End the run early (Ctrl-C, a UI button); frames in flight are discarded."""
        self._interrupted = self._interrupted or interrupted
        self._signal_stop()
        self._q_in.abort()
        if self.live:
            self._q_out.abort()  # live: what is in flight is stale; offline: processed frames are written

    def _signal_stop(self) -> None:
        with self._lock:  # (attach() checks the stop under this lock: no sink is attached after it)
            if self._stop.is_set():
                return
            self._t_stop = time.perf_counter()
            self._stop.set()
        self._sinks.end()

    def wait(self, timeout: float | None = None) -> bool:
        """True once every stage has ended (the sink is then closed); re-raises a stage's error.
        After a stop or a failure, stages get `join_timeout` seconds to end, then the run is
        closed anyway (a stuck stage is reported, never waited on forever)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                self._finalize()
                return True
            if self._stop.is_set():
                return self._finish_stopped()
            remaining = 0.05 if deadline is None else min(0.05, deadline - time.perf_counter())
            if remaining <= 0:
                return False
            alive[0].join(remaining)

    def run(self) -> RunMetrics:
        """start(), wait until done (Ctrl-C stops cleanly, then re-raises), return the metrics."""
        try:
            self.start()
            while not self.wait(0.2):
                pass
        except KeyboardInterrupt:
            self.stop()
            self.wait(self.config.join_timeout * 3)
            raise
        return self.metrics()

    # ------------------------------------------------------------------ stages
    def _guard(self, name: str, target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # any stage failure ends the whole run
            if not isinstance(exc, (StreamStudioError, Closed)):
                log.debug("stage %s failed", name, exc_info=True)
            self._errors.append(exc if isinstance(exc, StreamStudioError) else
                                StreamStudioError(f"{name} stage failed: {type(exc).__name__}: {exc}"))
            self._signal_stop()
            self._q_in.abort()
            self._q_out.abort()

    def _capture(self) -> None:
        limit = self.config.max_frames
        pace = self.config.pace if self.config.pace is not None else (self.live and not self.source.info.live)
        try:
            t_prev = t_zero = time.perf_counter()
            for frame in self.source.frames():
                now = time.perf_counter()
                self._lat["capture"].append(now - t_prev)
                if pace and t_zero + frame.pts > now:  # a file played as if live
                    self._stop.wait(t_zero + frame.pts - now)
                    now = time.perf_counter()
                if self._stop.is_set():
                    break
                if not self._q_in.put(_Item(frame.image, frame.pts, frame.index, now)):
                    break
                with self._lock:
                    self._counts["in"] += 1
                if limit is not None and self._counts["in"] >= limit:
                    break
                t_prev = time.perf_counter()
        finally:
            self._q_in.close()

    def _process(self) -> None:
        """Live: `processor(frame)`, its output at once; offline: `push()` / `flush()` (`_InOrder`)."""
        order = None if self.live else _InOrder(self.processor)

        def put(outs: Iterable[_Item]) -> None:
            for out in outs:
                with self._lock:
                    self._counts["processed"] += 1
                self._q_out.put(out)

        try:
            while not self._stop.is_set():
                try:
                    item = self._q_in.get()
                except Closed:
                    break
                t0 = time.perf_counter()
                if self.on_input:
                    self.on_input(item.pts)
                outs: Iterable[_Item]
                if order is None:
                    out = self.processor(item.image)
                    outs = (_Item(_as_frame(out), item.pts, item.index, item.t_capture),)
                else:
                    outs = order.push(item)
                self._lat["process"].append(time.perf_counter() - t0)
                put(outs)
            if order is not None and not self._stop.is_set():
                put(order.flush())
                if order.pending:
                    raise StreamStudioError(f"the processor returned {len(order.pending)} output(s) fewer than "
                                            "its inputs")
        finally:
            self._q_out.close()

    def _output(self) -> None:
        try:
            while True:
                try:
                    item = self._q_out.get()
                except Closed:
                    return
                if self._stop.is_set() and self.live:
                    return
                t0 = time.perf_counter()
                image = item.image
                assert image is not None  # (an output is a frame: `_as_frame`)
                if self.sink is None:  # a factory: opened at the first output's size
                    assert self._factory is not None  # (self.sink is None only when a factory was given)
                    h, w = image.shape[:2]
                    self.sink = self._factory(w, h)
                self.sink.write(image, item.pts)
                self._sinks.offer(image, item.pts)
                if self.on_output:
                    self.on_output(image, item.pts)
                now = time.perf_counter()
                self._lat["output"].append(now - t0)
                self._lat["end_to_end"].append(now - item.t_capture)
                self._t_first_out = self._t_first_out or now
                self._out_times.append(now)
                with self._lock:
                    self._counts["out"] += 1
        finally:
            self._sinks.end()

    # ------------------------------------------------------------------ ending
    def _finish_stopped(self) -> bool:
        """After a stop/failure: give the stages join_timeout, then close anyway."""
        deadline = (self._t_stop or time.perf_counter()) + self.config.join_timeout
        capture, process, output = self._threads
        for thread in (capture, process):
            if thread.ident is not None:  # started (a Ctrl-C can come while starting)
                thread.join(max(0.0, deadline - time.perf_counter()))
        if process.is_alive() or output.ident is None:
            self._q_out.abort()  # nothing more will come; do not wait for it
        if output.ident is not None:
            output.join(max(0.0, deadline - time.perf_counter()))
        stuck = [t.name.split("-", 1)[1] for t in self._threads if t.is_alive()]
        if stuck and not self._finished.is_set():
            self._errors.append(StreamStudioError(f"stage(s) {', '.join(stuck)} did not stop within "
                                                  f"{self.config.join_timeout:g}s; the output was closed anyway"))
        self._finalize()
        return True

    def _finalize(self) -> None:
        if self._finished.is_set():
            if self._errors:
                raise self._errors[0]
            return
        self._finished.set()
        self._t_end = time.perf_counter()
        self._sinks.end(wait=self.config.join_timeout)  # their sinks are closed by their own threads
        try:
            if self.sink is not None:
                self.sink.close()
        except Exception as exc:  # report, but a stage's error comes first
            self._errors.append(exc if isinstance(exc, StreamStudioError) else
                                StreamStudioError(f"closing the output failed: {exc}"))
        finally:
            self.source.close()
        if self._errors:
            raise self._errors[0]

    def metrics(self) -> RunMetrics:
        """A snapshot; safe to call from any thread while the run goes on."""
        now = self._t_end or time.perf_counter()
        elapsed = now - (self._t_start or now)
        with self._lock:
            counts = dict(self._counts)
        stats = getattr(self.processor, "stats", None)
        status = self.sink.status if self.sink is not None else None
        out_span = now - self._t_first_out if self._t_first_out else 0.0
        times, recent_lat = list(self._out_times), list(self._lat["end_to_end"])[-RECENT:]
        return RunMetrics(
            live=self.live, frames_in=counts["in"], frames_processed=counts["processed"], frames_out=counts["out"],
            dropped_input=self._q_in.dropped, dropped_output=self._q_out.dropped,
            filter_skipped=int(getattr(stats, "skipped", 0) or 0), sink_lost=status.frames_lost if status else 0,
            elapsed=elapsed, input_fps=counts["in"] / elapsed if elapsed > 0 else 0.0,
            output_fps=(counts["out"] - 1) / out_span if out_span > 0 and counts["out"] > 1 else 0.0,
            latency_ms={k: percentiles(list(v)) for k, v in self._lat.items()},
            recent_fps=(len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0,
            recent_latency_ms=1000.0 * sum(recent_lat) / len(recent_lat) if recent_lat else None,
            warnings=list(self.source.warnings), interrupted=self._interrupted,
        )


def _as_frame(out: object) -> np.ndarray:
    """A processor's output (an array, or a list of one for frame_buffer_size 1)."""
    if isinstance(out, (list, tuple)):
        if len(out) != 1:
            raise StreamStudioError(f"the processor returned {len(out)} frames for one input")
        out = out[0]
    if not isinstance(out, np.ndarray) or out.ndim != 3 or out.shape[2] != 3 or out.dtype != np.uint8:
        raise StreamStudioError("the processor must return RGB uint8 (H, W, 3) frames")
    return out


def run_stream(source: Source, processor: Any, sink: Sink | SinkFactory, **config: Any) -> RunMetrics:
    """One call: build a Runner with RunnerConfig(**config) and run it to the end."""
    return Runner(source, processor, sink, RunnerConfig(**config)).run()


__all__ = ["Attachment", "FrameQueue", "RunMetrics", "Runner", "RunnerConfig", "VideoFrame", "percentiles",
           "run_stream"]
