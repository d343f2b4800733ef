"""A batch worker: loads its model once, then renders jobs one at a time, reporting its progress.
The image pipeline's (`RenderWorker`, app/batch/cluster.py: whole files and segments) and the video
pipeline's (`VideoWorker`, app/batch/video.py: whole files) share this frame; each runs in this
process (--cluster local) or as a Ray actor."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streamstudio.app.batch.segments import Piece
from streamstudio.app.streams.requests import BatchRequest
from streamstudio.errors import StreamStudioError


@dataclass
class PieceResult:
    key: str
    worker: str
    frames: int = 0
    seconds: float = 0.0
    error: str | None = None  # a user-caused failure (a bad input): reported, not retried


class Worker:
    """Loads the model once (`ready`, or on first use) and renders pieces, one at a time: a whole
    file into a temporary name renamed when complete, a segment into its part folder. `board`
    gets its progress (worker name, frames written in all, of the job under way, the job, pid)."""

    def __init__(self, request: BatchRequest, name: str, board=None):
        self.request = request
        self.name, self.board = name, board
        self._frames = 0  # frames written, all jobs
        self._job_frames = 0  # frames written of the job under way
        self._sent = 0.0  # when progress was last reported

    def ready(self) -> int:
        """Load the model (so no job waits for it); returns the process id."""
        self._load()
        return os.getpid()

    def render(self, piece: Piece, work: str) -> PieceResult:
        t0 = time.perf_counter()
        self._job_frames = 0
        self._report(piece.key, force=True)
        try:
            if piece.part is None:
                target = Path(work) / "partial" / Path(piece.output).name
                target.parent.mkdir(parents=True, exist_ok=True)
            else:
                target = Path(piece.part)
                shutil.rmtree(target, ignore_errors=True)  # what a killed attempt left
            frames = self._render(piece, target, lambda: self._report(piece.key))
            if piece.part is None:
                os.replace(target, piece.output)
        except StreamStudioError as exc:
            return PieceResult(piece.key, self.name, error=str(exc))
        finally:
            self._report(None, force=True)
        return PieceResult(piece.key, self.name, frames, time.perf_counter() - t0)

    def _load(self) -> None:
        """Load the model, once."""
        raise NotImplementedError

    def _render(self, piece: Piece, target: Path, on_frame: Callable[[], None]) -> int:
        """Render `piece` into `target` (the output's temporary file, or the segment's part folder),
        calling `on_frame` after each frame written; returns the frames written."""
        raise NotImplementedError

    def _report(self, job: str | None, force: bool = False) -> None:
        if job is not None and not force:
            self._frames += 1
            self._job_frames += 1
        now = time.perf_counter()
        if self.board is None or not (force or now - self._sent >= 0.25):
            return
        self.board(self.name, self._frames, self._job_frames if job else 0, job, os.getpid())
        self._sent = now


__all__ = ["PieceResult", "Worker"]
