"""What a server's performance listens to, shared by its streams' modulations (app/perform/
modulation.py): the tempo clock, the last value of each MIDI control change (sent by the Live
tab's WebMIDI or a server port), and, per stream, its audio's features (none yet: a stream whose
mapping reads audio keeps its setting until the stream has audio)."""

from __future__ import annotations

import threading

from streamstudio.app.perform.tempo import TempoClock
from streamstudio.errors import StreamStudioError


class LiveInputs:
    def __init__(self, clock: TempoClock | None = None):
        self.clock = clock or TempoClock()
        self._cc: dict[tuple[int | None, int], float] = {}  # (channel or None for any, cc) -> 0..1
        self._lock = threading.Lock()

    def control_change(self, cc, value, channel=None) -> float:
        """MIDI control change `cc` (0..127) to `value` (0..127) on `channel` (1..16, or None);
        returns the value as 0..1."""
        for name, v, top in (("cc", cc, 127), ("value", value, 127)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
                raise StreamStudioError(f"a MIDI control change's {name} is a whole number 0..{top}, got {v!r}")
        bad_channel = isinstance(channel, bool) or not isinstance(channel, int) or not 1 <= channel <= 16
        if channel is not None and bad_channel:
            raise StreamStudioError(f"a MIDI channel is 1..16, got {channel!r}")
        x = value / 127.0
        with self._lock:
            self._cc[(channel, cc)] = x
            self._cc[(None, cc)] = x  # the newest on any channel
        return x

    def cc(self, number: int, channel: int | None = None) -> float | None:
        with self._lock:
            return self._cc.get((channel, number))

    def audio(self, feature: str, t: float) -> float | None:
        return None
