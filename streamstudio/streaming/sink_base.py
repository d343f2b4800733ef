"""What every sink is, and the encoder the file, HLS and RTMP sinks share: `Sink` (`write(frame,
pts)`, `close()`, a `SinkStatus`; a context manager) and `VideoEncoder`, one libx264 / libvpx-vp9
yuv420p video stream in an open PyAV output container. The sinks themselves are in
`streaming/sinks.py` and `streaming/rtmp.py`."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from streamstudio.errors import StreamStudioError
from streamstudio.frames import even_size, fit
from streamstudio.streaming.sources import as_fraction

if TYPE_CHECKING:
    import av.container

TIME_BASE = Fraction(1, 90000)


@dataclass
class SinkStatus:
    frames_written: int = 0
    frames_lost: int = 0  # frames that could not be delivered (RTMP reconnects); never silent
    reconnects: int = 0
    error: str | None = None
    closed: bool = False


class Sink:
    """Base class: `write(frame, pts)`, `close()`, `status`; a context manager."""

    def __init__(self, spec: str, width: int, height: int, fps: float):
        if width < 1 or height < 1 or fps <= 0:
            raise StreamStudioError(f"bad output size/rate {width}x{height}@{fps}")
        self.spec, self.width, self.height, self.fps = spec, width, height, float(fps)
        self.status = SinkStatus()

    def write(self, frame: np.ndarray, pts: float | None = None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.status.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VideoEncoder:
    """One video stream (libx264 / libvpx-vp9, yuv420p) in an open PyAV output container."""

    def __init__(self, container: av.container.OutputContainer, codec: str, width: int, height: int, fps: float,
                 options: dict[str, str], time_base: Fraction = TIME_BASE):
        import av

        self.container = container
        self.width, self.height = even_size(width, height)
        stream = container.add_stream(codec, rate=as_fraction(fps), options=options)
        if not isinstance(stream, av.VideoStream):
            raise StreamStudioError(f"{codec} is not a video codec")
        self.stream = stream
        self.stream.width, self.stream.height, self.stream.pix_fmt = self.width, self.height, "yuv420p"
        self.stream.codec_context.time_base = time_base
        self.stream.time_base = time_base
        self.time_base = time_base
        self.frame_ticks = max(1, round(1 / (fps * time_base)))
        self.last_pts: int | None = None

    def encode(self, frame: np.ndarray, pts: float) -> list:
        import av

        ticks = round(pts / self.time_base)
        if self.last_pts is not None and ticks <= self.last_pts:
            ticks = self.last_pts + 1  # keep timestamps strictly increasing
        vf = av.VideoFrame.from_ndarray(fit(frame, self.width, self.height), format="rgb24")
        vf.pts, vf.time_base = ticks, self.time_base
        vf.duration = self.frame_ticks
        self.last_pts = ticks
        return self.stream.encode(vf)

    def end_time(self) -> float:
        return 0.0 if self.last_pts is None else float((self.last_pts + self.frame_ticks) * self.time_base)

    def write(self, frame: np.ndarray, pts: float) -> None:
        """Encode one frame and mux its packets."""
        for packet in self.encode(frame, pts):
            self.container.mux(packet)

    def flush(self) -> None:
        """Drain the encoder's delayed packets into the container."""
        for packet in self.stream.encode(None):
            self.container.mux(packet)


def x264_options(fps: float, live: bool) -> dict[str, str]:
    gop = str(max(1, round(fps)))
    opts = {"g": gop, "keyint_min": gop, "sc_threshold": "0", "bf": "0"}
    opts.update({"preset": "veryfast", "tune": "zerolatency"} if live else {"preset": "veryfast", "crf": "20"})
    return opts
