"""A file's own audio as the modulations' audio source in `render --modulation` (issue 48): the
audio track decoded as the frames' media times advance, analysed by `AudioFeatures` on the file's
clock (no latency offset: a file's sound and picture are already in step), an onset held for one
video frame so each frame sees the hits since the last one. `NdiAudio`: a live NDI input's own
audio the same way, on its frames' clock (the sender's timecodes).
"""

from __future__ import annotations

from collections.abc import Iterator

import av
import numpy as np

from streamstudio.app.perform.audio_features import AudioFeatures
from streamstudio.errors import StreamStudioError

LOOKAHEAD_S = 0.05  # audio decoded past a frame's time: the analysis window that ends at it is whole


class FileAudio:
    """`audio(feature, t)` of `path`'s first audio track, for frames `frame_period` seconds apart;
    `cc` answers None (a file has no knobs)."""

    def __init__(self, path: str, frame_period: float):
        try:
            self._container = av.open(path)
        except (OSError, av.FFmpegError) as exc:
            raise StreamStudioError(f"--modulation reads the input's audio, and {path!r} cannot be opened: "
                                    f"{exc}") from exc
        if not self._container.streams.audio:
            self._container.close()
            raise StreamStudioError(f"--modulation maps an audio feature, and {path!r} has no audio track")
        stream = self._container.streams.audio[0]
        self._rate = stream.rate or 48_000
        self.features = AudioFeatures(self._rate, onset_hold_s=frame_period)
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=self._rate)
        self._frames: Iterator = self._container.decode(stream)
        self._decoded = 0  # samples pushed so far: their end is the time of the last one
        self._done = False

    def _advance(self, t: float) -> None:
        while not self._done and self._decoded / self._rate < t + LOOKAHEAD_S:
            frame = next(self._frames, None)
            if frame is None:
                self._done = True
                return
            if self._decoded == 0 and frame.time:  # the track starts later than the file's clock
                self._decoded = max(0, round(frame.time * self._rate))
            for out in self._resampler.resample(frame):
                x = out.to_ndarray().reshape(-1).astype(np.float32)
                self._decoded += len(x)
                self.features.push(x, self._decoded / self._rate)

    def audio(self, feature: str, t: float) -> float | None:
        self._advance(t)
        return self.features.at(feature, t)

    def cc(self, number: int, channel: int | None = None) -> float | None:
        return None

    def close(self) -> None:
        self._container.close()


class NdiAudio:
    """`audio(feature, t)` of a live NDI input's own sound (`streaming.sources.NdiSource`) in
    `render --modulation`: each audio frame analysed as it comes, on the frames' clock (its
    sender's timecode less that of the first video frame, as the frames' pts are: a sender stamps
    its audio and video on one clock), no latency offset; `cc` answers None."""

    def __init__(self, source, frame_period: float):
        self.source, self.frame_period = source, frame_period
        self.features: AudioFeatures | None = None
        source.on_audio = self._push

    def _push(self, samples: np.ndarray, rate: int, channels: int, captured: float, timecode: float) -> None:
        origin = self.source.origin
        if origin is None:  # (before the first video frame: no pts yet)
            return
        if self.features is None or self.features.sample_rate != rate:
            self.features = AudioFeatures(rate, onset_hold_s=self.frame_period)
        self.features.push(samples, timecode - origin, channels)

    def audio(self, feature: str, t: float) -> float | None:
        return None if self.features is None else self.features.at(feature, t)

    def cc(self, number: int, channel: int | None = None) -> float | None:
        return None

    def close(self) -> None:
        self.source.on_audio = None
