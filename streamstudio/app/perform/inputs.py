"""What a server's performance listens to, shared by its streams' modulations (app/perform/
modulation.py): the tempo clock, the last value of each MIDI control change (sent by the Live
tab's WebMIDI or a server port), and, per stream, its audio's features (app/perform/
audio_features.py), fed by the stream's own audio (a WHIP publisher's track, an NDI source's audio),
read behind by the stream's latency offset (app/perform/latency.py: its measured glass-to-glass
latency unless one is set); a stream whose mapping reads audio keeps its setting until the stream
has audio."""

from __future__ import annotations

import threading
import time

import numpy as np

from streamstudio.app.perform.audio_features import AudioFeatures
from streamstudio.app.perform.latency import LatencyOffsets
from streamstudio.app.perform.modulation import Modulations
from streamstudio.app.perform.tempo import TempoClock
from streamstudio.errors import StreamStudioError


class LiveInputs:
    def __init__(self, clock: TempoClock | None = None, audio_latency_s: float | None = None, sessions=None):
        """`audio_latency_s`: the audio's latency offset set for every stream (None: each stream's
        measured glass-to-glass latency); `sessions(name)`: a stream's session, whose metrics measure it."""
        self.clock = clock or TempoClock()
        self.latency = LatencyOffsets(sessions, audio_latency_s)  # the picture's delay behind the sound
        self._cc: dict[tuple[int | None, int], float] = {}  # (channel or None for any, cc) -> 0..1
        self._audio: dict[str, AudioFeatures] = {}  # stream -> its audio's features
        self._show: dict = {}  # stream name or "*" -> the show's Modulations for it (`load_show`)
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
        return None  # the server's own: no audio (a stream's view reads its own)

    def feed_audio(self, stream: str, samples: np.ndarray, sample_rate: int, t_end: float, channels: int = 1) -> None:
        """Audio of `stream` whose last sample was captured at `t_end` (time.monotonic())."""
        with self._lock:
            features = self._audio.get(stream)
            if features is None or features.sample_rate != sample_rate:
                features = self._audio[stream] = AudioFeatures(sample_rate)
        features.push(samples, t_end, channels)

    def forget(self, stream: str) -> None:
        with self._lock:
            self._audio.pop(stream, None)
        self.latency.forget(stream)

    def load_show(self, raw) -> dict:
        """A show (one file a show): {"tempo": {"bpm": ...}?, "streams": {name or "*": modulations}};
        the tempo set now, each stream's modulations kept for when it opens ("*": any stream without
        its own). Every part is checked before anything changes. Returns the show as kept."""
        if not isinstance(raw, dict) or set(raw) - {"tempo", "streams"}:
            raise StreamStudioError('a show is {"tempo": {"bpm": 120}, "streams": {"name or *": {"mappings": ...}}}')
        streams = raw.get("streams", {})
        if not isinstance(streams, dict):
            raise StreamStudioError('a show\'s "streams" is an object: stream name (or "*") -> modulations')
        parsed = {str(name): Modulations.parse(mods) for name, mods in streams.items()}
        bpm = (raw.get("tempo") or {}).get("bpm") if isinstance(raw.get("tempo", {}), dict) else None
        if bpm is not None:
            self.clock.set_bpm(bpm, time.monotonic())
        with self._lock:
            self._show = parsed
        return self.show()

    def show(self) -> dict:
        with self._lock:
            streams = {name: mods.to_json() for name, mods in self._show.items()}
        return {"tempo": {"bpm": self.clock.bpm}, "streams": streams}

    def show_for(self, stream: str):
        """A fresh copy of the show's modulations for `stream` (its own, else "*"), or None."""
        with self._lock:
            mods = self._show.get(stream, self._show.get("*"))
        return None if mods is None else Modulations(list(mods.mappings), mods.table, mods.latency_ms)

    def view(self, stream: str) -> "StreamInputs":
        """What stream `stream`'s modulations read: the server's clock and knobs, its own audio."""
        return StreamInputs(self, stream)


class StreamInputs:
    def __init__(self, inputs: LiveInputs, stream: str):
        self.inputs, self.stream, self.clock = inputs, stream, inputs.clock

    def cc(self, number: int, channel: int | None = None) -> float | None:
        return self.inputs.cc(number, channel)

    def audio(self, feature: str, t: float) -> float | None:
        features = self.inputs._audio.get(self.stream)
        return None if features is None else features.at(feature, t, self.latency_s())

    def latency_s(self) -> float:
        """The latency offset the stream's audio is read behind by now."""
        return self.inputs.latency.seconds(self.stream)


def audio_samples(frame) -> tuple[np.ndarray, int, int]:
    """A PyAV AudioFrame (a WHIP publisher's) as (samples interleaved, sample rate, channels)."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    samples = data.T.ravel() if frame.format.is_planar else data.ravel()
    return samples, frame.sample_rate, channels


def stream_audio(manager, sid: str, samples: np.ndarray, sample_rate: int, t_end: float, channels: int = 1) -> bool:
    """Audio of stream `sid` (its last sample captured at `t_end`, time.monotonic()) to its audio
    features, when one of its mappings reads audio (a WHIP publisher's, an NDI source's); returns
    whether it was taken."""
    session, inputs = manager.get(sid), getattr(manager, "inputs", None)
    mods = getattr(session, "modulations", None)
    if inputs is None or mods is None or not mods.uses("audio"):
        return False
    inputs.feed_audio(sid, samples, sample_rate, t_end, channels)
    return True


def opened(manager, session) -> None:
    """A stream that opens on `manager` listens to the server's inputs and takes the show's
    modulations for it (its name's, else the show's "*")."""
    inputs = getattr(manager, "inputs", None)
    if inputs is not None and session.modulations is None:
        session.inputs, session.modulations = inputs, inputs.show_for(session.sid)
