"""The tempo a performance follows: beats per minute and where the beat is, set outright, tapped,
or followed from MIDI clock (24 pulses a quarter note, MIDI 1.0's timing clock message 0xF8).

`beat(t)` is the beat count at time t (seconds on the clock the taps and pulses were stamped with,
`time.monotonic()` on the server): its whole part counts beats since the clock's origin, its
fraction is the phase within the beat, 0 on the beat. A change of tempo keeps the beat count
continuous (the phase does not jump), as a DJ's tempo fader does.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

from streamstudio.errors import StreamStudioError

MIN_BPM, MAX_BPM = 20.0, 400.0
TAP_RESET_S = 2.0  # a tap this long after the last starts a new count
MIDI_PPQN = 24  # MIDI clock pulses per quarter note


class TempoClock:
    """Beats per minute and the beat's phase; thread-safe (taps and pulses come from the web and
    OSC threads, frames read it from their runners)."""

    def __init__(self, bpm: float = 120.0, origin: float = 0.0):
        self._lock = threading.Lock()
        self._bpm = check_bpm(bpm)
        self._origin_t, self._origin_beat = origin, 0.0  # beat(origin_t) == origin_beat
        self._taps: deque[float] = deque(maxlen=8)
        self._pulses: deque[float] = deque(maxlen=MIDI_PPQN * 2 + 1)
        self.source = "set"  # set, tap, midi or link: what decided the tempo last

    @property
    def bpm(self) -> float:
        return self._bpm

    def beat(self, t: float) -> float:
        with self._lock:
            return self._origin_beat + (t - self._origin_t) * self._bpm / 60.0

    def set_bpm(self, bpm: object, t: float, source: str = "set") -> None:
        """A new tempo from time t on, the beat count continuous through it."""
        bpm = check_bpm(bpm)
        with self._lock:
            self._origin_beat += (t - self._origin_t) * self._bpm / 60.0
            self._origin_t, self._bpm, self.source = t, bpm, source

    def follow(self, bpm: float, beat: float, t: float, source: str) -> None:
        """Another clock's tempo and beat at time t (an Ableton Link session): taken as they are."""
        bpm = check_bpm(bpm)
        with self._lock:
            self._origin_t, self._origin_beat, self._bpm, self.source = t, float(beat), bpm, source

    def tap(self, t: float) -> float:
        """A tap at time t: the beat lands on it, and from the second tap on the tempo is the
        median interval of the recent taps. Returns the tempo."""
        with self._lock:
            if self._taps and t - self._taps[-1] > TAP_RESET_S:
                self._taps.clear()
            self._taps.append(t)
            taps = list(self._taps)
        if len(taps) >= 2:
            interval = statistics.median(b - a for a, b in zip(taps, taps[1:]))
            self.set_bpm(min(MAX_BPM, max(MIN_BPM, 60.0 / interval)), t, "tap")
        self.downbeat(t, "tap")  # the tap is on the beat
        return self._bpm

    def downbeat(self, t: float, source: str | None = None) -> None:
        """A beat lands at t (a tap, MIDI Start's first pulse): the phase is 0 there, the count
        moved to its nearest whole beat."""
        with self._lock:
            beat = self._origin_beat + (t - self._origin_t) * self._bpm / 60.0
            self._origin_t, self._origin_beat = t, float(round(beat))
            self.source = source or self.source

    def midi_pulse(self, t: float) -> None:
        """A MIDI clock pulse (0xF8) at time t: the tempo follows the pulses of the last two beats."""
        with self._lock:
            self._pulses.append(t)
            pulses = list(self._pulses)
        if len(pulses) > MIDI_PPQN:
            per_beat = (pulses[-1] - pulses[0]) / (len(pulses) - 1) * MIDI_PPQN
            if per_beat > 0:
                self.set_bpm(min(MAX_BPM, max(MIN_BPM, 60.0 / per_beat)), t, "midi")

    def state(self, t: float) -> dict:
        return {"bpm": round(self._bpm, 3), "beat": round(self.beat(t), 4), "source": self.source}


def check_bpm(bpm: object) -> float:
    if isinstance(bpm, bool) or not isinstance(bpm, (int, float)) or not MIN_BPM <= bpm <= MAX_BPM:
        raise StreamStudioError(f"tempo must be {MIN_BPM:g}..{MAX_BPM:g} beats a minute, got {bpm!r}")
    return float(bpm)
