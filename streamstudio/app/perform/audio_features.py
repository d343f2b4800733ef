"""Features of a stream's audio for modulation (issue 48): loudness (RMS), the energy of the low,
mid and high bands, and onsets, computed at 50 frames a second or more, each stamped with the time
its audio was captured, and read shifted by a latency offset, so a change lands on the beat the
audience hears (the picture reaches them later than the sound: by default the measured
glass-to-glass latency).

Per analysis frame (hop = sample rate / `rate`, a Hann window of twice the hop):
- `rms`: sqrt(mean(x^2)) of the window, in full scale (a full-scale sine: 1/sqrt 2), the channels'
  powers summed (a mono sine sent as stereo at -3 dB a channel, as encoders upmix it, reads as sent);
- `low`, `mid`, `high`: the share of the window's spectral energy below 250 Hz, 250 Hz-4 kHz and
  above 4 kHz (they add up to 1; silence: 0 each);
- `onset`: 1 when the spectral flux (the summed rise of the magnitude spectrum over the last frame)
  exceeds `onset_k` times its recent median (and a floor), else 0: a drum hit, a note's attack.
  Read at a time, it is 1 when an onset fell within the last `onset_hold_s` (a video frame is
  tens of milliseconds apart, an analysis frame 10: without the hold a frame would miss most hits).
Values are 0..1 (RMS clipped at 1), ready for a mapping's range.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque

import numpy as np

BANDS = (("low", 0.0, 250.0), ("mid", 250.0, 4000.0), ("high", 4000.0, float("inf")))
HISTORY_S = 10.0  # features kept, seconds (enough for any latency offset)


class AudioFeatures:
    """Audio in (mono or interleaved channels, int16 or float), features out by time."""

    def __init__(self, sample_rate: int, rate: float = 100.0, latency_s: float = 0.0, onset_k: float = 2.0,
                 onset_hold_s: float = 0.1):
        if not 8000 <= sample_rate <= 192_000 or not 50.0 <= rate <= 1000.0:
            raise ValueError(f"sample rate 8000..192000 Hz and 50..1000 feature frames a second, got "
                             f"{sample_rate} and {rate}")
        self.sample_rate, self.latency_s, self.onset_k = sample_rate, latency_s, onset_k
        self.onset_hold_s = onset_hold_s
        self.hop = max(1, round(sample_rate / rate))
        self.window = np.hanning(2 * self.hop)
        freqs = np.fft.rfftfreq(2 * self.hop, 1.0 / sample_rate)
        self._bands = [(name, (freqs >= lo) & (freqs < hi)) for name, lo, hi in BANDS]
        self._buffer = np.zeros(0, np.float32)
        self._t_end = 0.0  # the capture time of the buffer's last sample
        self._last_mag: np.ndarray | None = None
        self._flux: deque[float] = deque(maxlen=max(8, int(rate)))  # about a second of flux
        self._times: list[float] = []
        self._frames: list[dict[str, float]] = []
        self._lock = threading.Lock()

    def push(self, samples: np.ndarray, t_end: float, channels: int = 1) -> int:
        """Audio whose last sample was captured at `t_end` (seconds, the frames' clock); returns
        how many feature frames it completed."""
        x = np.asarray(samples)
        x = x.astype(np.float32) / 32768.0 if x.dtype == np.int16 else x.astype(np.float32)
        if channels > 1:  # the channels' mean, scaled so that its power is the channels' summed power when
            #               they carry the same sound (as a loudness meter sums them, ITU-R BS.1770)
            x = x.reshape(-1, channels).mean(axis=1) * np.float32(np.sqrt(channels))
        with self._lock:
            self._buffer = np.concatenate([self._buffer, x.ravel()])
            self._t_end = t_end
            made = 0
            n = 2 * self.hop
            while len(self._buffer) >= n:
                frame = self._buffer[:n]
                end = t_end - (len(self._buffer) - n) / self.sample_rate  # the window's last sample
                self._add(end, self._analyse(frame))
                self._buffer = self._buffer[self.hop:]
                made += 1
            return made

    def _analyse(self, frame: np.ndarray) -> dict[str, float]:
        rms = float(np.sqrt(np.mean(frame.astype(np.float64) ** 2)))
        mag = np.abs(np.fft.rfft(frame * self.window))
        energy = mag ** 2
        total = float(energy.sum())
        out = {"rms": min(1.0, rms)}
        for name, mask in self._bands:
            out[name] = float(energy[mask].sum() / total) if total > 1e-12 else 0.0
        flux = 0.0 if self._last_mag is None else float(np.maximum(mag - self._last_mag, 0.0).sum())
        self._last_mag = mag
        recent = np.median(self._flux) if self._flux else 0.0
        out["onset"] = 1.0 if flux > max(self.onset_k * recent, 1e-3 * len(mag)) else 0.0
        self._flux.append(flux)
        return out

    def _add(self, t: float, features: dict[str, float]) -> None:
        self._times.append(t)
        self._frames.append(features)
        while self._times and self._times[0] < t - HISTORY_S:
            self._times.pop(0)
            self._frames.pop(0)

    def at(self, feature: str, t: float, latency_s: float | None = None) -> float | None:
        """`feature` of the audio captured at `t - latency_s` (the newest frame at or before it;
        latency_s: this one's own when None); None before the first frame."""
        at = t - (self.latency_s if latency_s is None else latency_s)
        with self._lock:
            i = bisect.bisect_right(self._times, at) - 1
            if i < 0:
                return None
            if feature != "onset":
                return self._frames[i][feature]
            since = bisect.bisect_right(self._times, at - self.onset_hold_s)
            return max(f["onset"] for f in self._frames[since:i + 1]) if since <= i else self._frames[i]["onset"]
