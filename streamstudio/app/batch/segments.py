"""One input file as jobs: cutting it into segments, rendering a segment with its warm-up so its
frames are the whole file's, and stitching the segments back into one output.

Why a warm-up, and how long (`pipelines/image/stream_diffusion.py`, `pipelines/image/similarity_filter.py`):

- The noise is per slot, drawn once from the seed: every frame gets the same noise whichever
  frame a run starts at. Each frame's trajectory (latents, residual-CFG stock) is its own.
- Stream Batch: at call c the batch holds frame c at step 0 and frames c-1 .. c-N+1 at steps
  1 .. N-1. A run primes its buffer from its first frame (that frame's steps run one by one,
  in a batch of its own), so a segment starts N processed frames early: its first frame's
  batch then holds real frames in every slot, as in the whole-file run.
- Its end: the frames of the last N - 1 calls leave through `flush`, which feeds the last input
  again (and skips a prompt schedule's changes). A segment therefore goes on N - 1 processed
  frames past its end, and only the file's last segment flushes, as the whole-file run does.
- The similarity filter decides from the last processed input, the skips in a row and a seeded
  random stream whose draws depend on every earlier decision. A segment replays the filter
  (input decode and the preprocess kernel only, no network) from the file's first frame, keeps
  a copy of its state, and starts the pipeline at a frame the filter processes, with that
  state. Its warm-up and tail count processed frames, so they span up to `max_skip_frame + 1`
  times as many input frames.
- Temporal consistency (latent feedback, the feature bank) carries state from every earlier
  frame, so such files are rendered whole, never split.

Segments are written as raw frames and their timestamps into a part folder; the stitch encodes
them in order into the output with the input's audio, through the same sink a local render
uses, so the output is the local render's. It can follow the rendering, part by part. Segment
boundaries sit on the input's keyframes.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from streamstudio.app.streams.requests import BatchRequest
from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sink_base import Sink
from streamstudio.streaming.sinks import open_sink
from streamstudio.streaming.resample import resample_file
from streamstudio.streaming.sources import Source, VideoFrame, open_source

if TYPE_CHECKING:
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion

MIN_SEGMENT = 300  # frames: shorter segments are not worth their warm-up, tail and stitch
PTS_FILE = "pts.json"  # a part folder's timestamps; written last, so its presence means the part is complete


@dataclass(frozen=True)
class Piece:
    """What one job renders: frames [start, end) of `input` (end None: to the input's end).
    `part`: the folder its frames go to when the file is split; None: the whole file, straight
    into `output`."""

    input: str
    output: str
    index: int = 0  # the segment's number
    count: int = 1  # the file's segments
    start: int = 0
    end: int | None = None
    part: str | None = None
    frames: int | None = None  # expected frames (the progress bar's total)

    @property
    def key(self) -> str:
        return f"{self.output}#{self.index}/{self.count}"

    @property
    def name(self) -> str:
        name = Path(self.input).name
        return name if self.count == 1 else f"{name} [{self.index + 1}/{self.count}]"


# ---------------------------------------------------------------------------- planning
def keyframe_indices(path: str | Path) -> tuple[int, list[int]]:
    """(frames, the indices of its keyframes in presentation order) of a video file, from its
    packets (demuxed, not decoded). Raises StreamStudioError for a file that is not a video."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise StreamStudioError(f"{path} has no video stream")
            stream = container.streams.video[0]
            stamps = [(p.pts, p.is_keyframe) for p in container.demux(stream) if p.pts is not None and p.size]
    except (av.error.FFmpegError, OSError, UnicodeDecodeError) as exc:
        raise StreamStudioError(f"{path} is not a readable video ({exc})") from exc
    stamps.sort()
    return len(stamps), [i for i, (_, key) in enumerate(stamps) if key]


def plan_pieces(input: str, output: str, parts: str, frames: int, keyframes: list[int], segment_frames: int | None,
                workers: int = 1, max_frames: int | None = None, resample: float = 1.0) -> list[Piece]:
    """The pieces of one input of `frames` frames, cut at the keyframes nearest the even cuts:
    about frames / segment_frames segments (a file shorter than two stays whole); None: one
    segment per worker for files of at least MIN_SEGMENT frames per worker (a worker decodes
    from the file's start, so more segments than workers cost more decoding than they save).
    `resample`: output frames per input frame (--fps), to put the keyframes in output frames."""
    total = math.ceil(frames * resample) if frames else 0
    if max_frames:
        total = min(total, max_frames) if total else max_frames
    if segment_frames:
        count = total // segment_frames if total else 1
    else:
        count = min(workers, total // MIN_SEGMENT) if total else 1
    cuts = sorted({round(k * resample) for k in keyframes} - {0})
    starts = [0]
    for n in range(1, count):
        target = n * total / count
        best = min((c for c in cuts if starts[-1] < c < total), key=lambda c: abs(c - target), default=None)
        if best is not None and best not in starts:
            starts.append(best)
    if len(starts) == 1:
        return [Piece(input, output, frames=total or None)]
    ends = starts[1:] + [max_frames]  # the last segment runs to the file's end (or --max-frames)
    count = len(starts)
    # a part is named by its frames, so a run again with other cuts (other workers) never takes it for one of its own
    return [Piece(input, output, i, count, s, e, str(Path(parts) / f"{s:09d}-{'end' if e is None else f'{e:09d}'}"),
                  frames=(e if e is not None else total) - s) for i, (s, e) in enumerate(zip(starts, ends))]


def split_allowed(config) -> str | None:
    """None when a stream of `config` (StreamDiffusionConfig) can be cut into segments; else why not."""
    if config.uses_feedback or config.uses_bank:
        return f"--temporal {config.temporal} carries state from every earlier frame"
    return None


# ---------------------------------------------------------------------------- one piece
class Window:
    """Which frames of the input a piece pushes through its pipeline and which outputs it keeps.

    Frames before the warm-up are only replayed through a copy of the similarity filter (when
    the stream has one); the warm-up's and the tail's outputs are dropped (`keep`)."""

    def __init__(self, pipe, piece: Piece, prepare: Callable):
        from streamstudio.pipelines.image.similarity_filter import SimilarityFilter, SimilarityFilterConfig

        cfg = pipe.config
        self.start, self.end = piece.start, piece.end
        batch = pipe.n_steps if cfg.use_denoising_batch and pipe.n_steps > 1 else 0
        spread = cfg.max_skip_frame + 1 if cfg.similarity_filter else 1  # input frames per processed frame, at most
        self.first = max(0, piece.start - max(batch, 1 if cfg.similarity_filter else 0) * spread)
        self.stop = None if piece.end is None else piece.end + pipe.latency_frames * spread
        self.filter = None
        if cfg.similarity_filter:
            self.filter = SimilarityFilter(SimilarityFilterConfig(cfg.similarity_threshold, cfg.max_skip_frame,
                                                                  cfg.seed))
        self._pipe, self._prepare = pipe, prepare
        self._start_pts: float | None = None
        self._end_pts: float | None = None

    def frames(self, frames: Iterator[VideoFrame]) -> Iterator[VideoFrame]:
        started = False
        for frame in frames:
            if self.stop is not None and frame.index >= self.stop:
                return
            if not started:
                if frame.index >= self.first:  # the pipeline starts at a frame the filter processes
                    state = copy.deepcopy(self.filter)
                    if self.filter is None or not self.filter.should_skip(self._prepare(frame.image)):
                        started = True
                        if state is not None:  # the filter's state where the whole-file run has it
                            self._pipe.resume_filter(state)
                elif self.filter is not None:  # replayed: decisions and random draws as in the whole file
                    self.filter.should_skip(self._prepare(frame.image))
                if not started:
                    continue
            if frame.index == self.start:
                self._start_pts = frame.pts
            if self.end is not None and frame.index == self.end:
                self._end_pts = frame.pts
            yield frame

    def keep(self, pts: float) -> bool:
        """Whether the output with timestamp `pts` is the piece's (not the warm-up's or the tail's)."""
        if self._start_pts is None or pts < self._start_pts:
            return False
        return self._end_pts is None or pts < self._end_pts


class WindowSource(Source):
    """The input's frames that a piece pushes (see Window)."""

    def __init__(self, source: Source, window: Window):
        super().__init__()
        self.source, self.window = source, window
        self.info = source.info
        self.warnings = source.warnings

    def frames(self) -> Iterator[VideoFrame]:
        return self.window.frames(self.source.frames())

    def close(self) -> None:
        self.source.close()


class WindowSink(Sink):
    """Writes the piece's own outputs into `inner` (the warm-up's and the tail's are dropped),
    keeping their timestamps."""

    def __init__(self, inner: Sink, window: Window, on_frame: Callable[[], None] | None = None):
        super().__init__(inner.spec, inner.width, inner.height, inner.fps)
        self.inner, self.window, self.on_frame = inner, window, on_frame
        self.pts: list[float] = []
        self.status = inner.status

    def write(self, frame, pts: float | None = None) -> None:
        assert pts is not None  # (the runner stamps every output)
        if not self.window.keep(pts):
            return
        self.inner.write(frame, pts)
        self.pts.append(pts)
        if self.on_frame is not None:
            self.on_frame()

    def close(self) -> None:
        self.inner.close()


class PartSink(Sink):
    """A segment's frames as raw arrays (`frame_000000.npy`, ...) and, when it closes cleanly,
    their timestamps (`pts.json`, the mark of a finished part). Raw, because the frames are
    written once and read once: PNG costs ~100 ms a 512x512 frame to save, `np.save` under 1 ms,
    for ~30% more bytes (benchmarks/cluster.py)."""

    def __init__(self, folder: Path, width: int, height: int, fps: float):
        super().__init__(str(folder), width, height, fps)
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.pts: list[float] = []

    def write(self, frame, pts: float | None = None) -> None:
        import numpy as np

        assert pts is not None  # (the runner stamps every output)
        np.save(self.folder / f"frame_{len(self.pts):06d}.npy", frame)
        self.pts.append(pts)
        self.status.frames_written += 1

    def finish(self) -> None:
        write_json(self.folder / PTS_FILE, {"pts": self.pts, "fps": self.fps, "width": self.width,
                                            "height": self.height})


def read_part(folder: Path):
    """(frame, pts) of a finished part, in order."""
    import numpy as np

    meta = json.loads((folder / PTS_FILE).read_text())
    for k, pts in enumerate(meta["pts"]):
        path = folder / f"frame_{k:06d}.npy"
        if not path.is_file():
            raise StreamStudioError(f"part {folder} lacks {path.name}; delete the part and run again")
        yield np.load(path, allow_pickle=False), pts


def render_piece(pipe_for: Callable[[float | None], StreamDiffusion], request: BatchRequest, piece: Piece, target: Path,
                 on_frame: Callable[[], None] | None = None) -> int:
    """Render `piece` into `target` (the output file, or the part folder) with the pipeline
    `pipe_for(aspect)` gives for the input's aspect ratio (a StreamDiffusion of the input's size,
    used by one job at a time, as `render` builds it). Returns the frames written."""
    from streamstudio.app.streams import FittedFrames, rtmp_config
    from streamstudio.streaming.runner import Runner, RunnerConfig
    from streamstudio.streaming.schedule import load_schedule

    source = open_input(piece.input, request.fps)
    part_sink: PartSink | None = None
    try:
        info = source.info
        pipe = pipe_for(info.width / info.height if info.width and info.height else None)
        pipe.reset()  # empty buffer and filter, as a new stream
        pipe.set_prompt(request.image.prompt)  # not the last job's scheduled prompt
        fitted = FittedFrames(pipe, request.fit)
        cfg = pipe.config

        def prepare(image):  # the pipeline's own input path up to its similarity filter
            return pipe.filter_input(fitted.fit_frame(image))

        window = Window(pipe, piece, prepare)
        fps = request.fps or info.fps
        if piece.part is None:
            audio = None if request.no_audio else info.audio
            inner = open_sink(str(target), cfg.width, cfg.height, fps, audio_from=audio,
                              rtmp=rtmp_config(request.rtmp_timeout))
        else:
            inner = part_sink = PartSink(target, cfg.width, cfg.height, fps)
    except BaseException:
        source.close()
        raise
    sink = WindowSink(inner, window, on_frame)
    schedule = load_schedule(request.prompt_schedule, request.transition) if request.prompt_schedule else None
    on_input = (lambda pts: schedule.apply_to(pipe, pts)) if schedule else None  # prompt and scales
    # counted from the warm-up's start
    limit = None if request.max_frames is None else request.max_frames - window.first
    Runner(WindowSource(source, window), fitted, sink, RunnerConfig(live=False, max_frames=limit),
           on_input=on_input).run()
    if part_sink is not None:  # (a segment's part)
        part_sink.finish()
    return len(sink.pts)


def open_input(path: str, fps: float | None) -> Source:
    """An input file as `render` reads it offline (resampled to --fps `fps`; None: its own)."""
    source = open_source(path, fps=fps, realtime=False)
    if source.info.live:
        source.close()
        raise StreamStudioError(f"{path} is a live input; batch rendering takes files")
    return resample_file(source, fps)


def part_done(part: str | Path) -> bool:
    return (Path(part) / PTS_FILE).is_file()


# ---------------------------------------------------------------------------- stitching
def stitch(pieces: list[Piece], target: Path, request: BatchRequest,
           ready: Callable[[Piece], bool] = lambda piece: True, on_frame: Callable[[], None] | None = None) -> int:
    """Encode the pieces' parts, in order, into `target` with the input's audio (as a local render
    of the whole file writes it). `ready(piece)` waits until the piece's part is finished (False:
    it never will be, and the stitch stops), so a stitch can follow the rendering. Returns the
    frames written."""
    from streamstudio.app.streams import rtmp_config

    with open_input(pieces[0].input, request.fps) as source:
        audio = None if request.no_audio else source.info.audio
    sink, written = None, 0
    try:
        for piece in pieces:
            if not ready(piece):
                raise StreamStudioError(f"segment {piece.index + 1} of {piece.count} was not rendered")
            assert piece.part is not None  # (a stitched piece is a segment: it has a part)
            folder = Path(piece.part)
            if sink is None:
                meta = json.loads((folder / PTS_FILE).read_text())
                sink = open_sink(str(target), meta["width"], meta["height"], meta["fps"], audio_from=audio,
                                 rtmp=rtmp_config(request.rtmp_timeout))
            for frame, pts in read_part(folder):
                sink.write(frame, pts)
                written += 1
                if on_frame is not None:
                    on_frame()
    finally:
        if sink is not None:
            sink.close()
    return written


def remove_parts(pieces: list[Piece]) -> None:
    """The file's folder of parts (its pieces' parts and any left by a run cut otherwise)."""
    for parent in {Path(p.part).parent for p in pieces if p.part is not None}:
        shutil.rmtree(parent, ignore_errors=True)


def write_json(path: Path, data) -> None:
    """Written whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


__all__ = ["Piece", "Window", "keyframe_indices", "part_done", "plan_pieces", "remove_parts", "render_piece",
           "split_allowed", "stitch"]
