"""A video file at another frame rate: `resample_file(source, fps)` wraps a file's source in a
`ResampledSource` (frames picked by timestamp, dropped or repeated, duration kept); live sources
keep their own timing. The sources themselves are in `streaming/sources.py`."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sources import Source, VideoFileSource, VideoFrame


class ResampledSource(Source):
    """Another source's frames at `fps`, chosen by timestamp: output frame k (at k / fps seconds)
    is the latest input frame whose pts <= k / fps (the first frame for ticks before it), so frames
    are dropped when the rate goes down and repeated when it goes up. Ticks run until the last input
    frame's end (its pts + 1 / the input's fps), so the duration, and audio a sink copies beside
    it, are kept to within one frame. For files only: a live source's timing is its own."""

    def __init__(self, source: Source, fps: float):
        super().__init__()
        if fps <= 0:
            raise StreamStudioError(f"the frame rate must be positive, got {fps}")
        if source.info.live:
            raise StreamStudioError(f"{source.info.description} is live; it cannot be resampled")
        info = source.info
        self.source, self.fps = source, float(fps)
        self.warnings = source.warnings  # one list: the wrapped source's problems show through
        self._handed: int | None = None  # index of the input frame handed on last
        # timestamps are rounded to the container's time base (mkv: 1 ms): a frame that far past
        # a tick still counts as on it
        self.tolerance = min(1e-3, 0.25 / max(self.fps, info.fps))
        count = None
        if info.frame_count and info.fps:
            count = max(1, math.ceil(info.frame_count / info.fps * self.fps - self.tolerance))
        self.info = replace(info, fps=self.fps, frame_count=count,
                            description=f"{info.description}, resampled to {self.fps:g} fps")

    def frames(self) -> Iterator[VideoFrame]:
        tick, last = 0, None  # the next output frame's number; the latest input frame before it
        for frame in self.source.frames():
            while self._at(tick) < frame.pts:  # ticks before this frame show the one before it
                yield self._tick(frame if last is None else last, tick)
                tick += 1
            last = frame
        if last is None:
            return
        end = last.pts + 1.0 / self.source.info.fps  # the last frame lasts one input frame
        while self._at(tick) < end:
            yield self._tick(last, tick)
            tick += 1

    def _at(self, tick: int) -> float:
        return tick / self.fps + self.tolerance

    def _tick(self, frame: VideoFrame, tick: int) -> VideoFrame:
        repeated = frame.index == self._handed
        self._handed = frame.index
        # a repeat is a copy, so that it is not shared with whoever changes the frame before it
        image = frame.image
        return VideoFrame(image.copy() if repeated and image is not None else image, tick / self.fps, tick)

    def close(self) -> None:
        self.source.close()


def resample_file(source: Source, fps: float | None) -> Source:
    """`source` at `fps` when it is a video file (not live) with another frame rate; otherwise as
    it is (image folders and patterns already run at the asked rate; live sources keep theirs)."""
    if not fps or not isinstance(source, VideoFileSource) or source.info.live:
        return source
    if math.isclose(source.info.fps, fps, rel_tol=1e-4):
        return source
    return ResampledSource(source, fps)
