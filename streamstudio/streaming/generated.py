"""Sources whose frames are made, not read: `NoInputSource` (a generator's clock, frames without a
picture) and `SplatPathSource` (frames rendered along a camera path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sources import Source, SourceInfo, VideoFrame


class NoInputSource(Source):
    """A generator's clock: `count` frames without a picture (image None), 1 / fps apart. The
    runner hands each to its processor as `push(None)`, which a pipeline takes as "make the next
    frame from the prompt alone" (txt2img, text-to-video)."""

    def __init__(self, count: int, fps: float, width: int, height: int, description: str = "no input"):
        super().__init__()
        if count < 1 or fps <= 0:
            raise StreamStudioError(f"frame count and rate must be positive, got {count} @ {fps}")
        self.count = count
        self.info = SourceInfo(width=width, height=height, fps=float(fps), live=False, frame_count=count,
                               duration=count / fps, description=description)

    def frames(self) -> Iterator[VideoFrame]:
        for i in range(self.count):
            yield VideoFrame(None, i / self.info.fps, i)


class SplatPathSource(Source):
    """Frames rendered along a camera path, `fps` apart: frame i is `render(cameras[i], times[i])`,
    an RGB uint8 (height, width, 3) image (the caller's renderer: a Gaussian scene, any scene;
    `times` are a 4D scene's times, None for a static one). Rendered as the runner asks for them."""

    def __init__(self, render: Callable[[Any, float | None], np.ndarray], cameras: Sequence[Any],
                 times: Sequence[float | None], fps: float, width: int, height: int,
                 description: str = "camera path"):
        super().__init__()
        if not len(cameras) or len(cameras) != len(times):
            raise StreamStudioError(f"a camera path needs one time per camera, got {len(cameras)} camera(s) "
                                    f"and {len(times)} time(s)")
        if fps <= 0:
            raise StreamStudioError(f"the frame rate must be positive, got {fps}")
        self.render, self.cameras, self.times = render, list(cameras), list(times)
        self.info = SourceInfo(width=width, height=height, fps=float(fps), live=False, frame_count=len(self.cameras),
                               duration=len(self.cameras) / fps, description=description)

    def frames(self) -> Iterator[VideoFrame]:
        for i, (camera, t) in enumerate(zip(self.cameras, self.times)):
            image = self.render(camera, t)
            if image.shape != (self.info.height, self.info.width, 3) or image.dtype != np.uint8:
                raise StreamStudioError(f"the renderer gave a {image.dtype} {image.shape} frame; expected uint8 "
                                        f"({self.info.height}, {self.info.width}, 3)")
            yield VideoFrame(image, i / self.info.fps, i)
