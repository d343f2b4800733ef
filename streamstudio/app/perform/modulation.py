"""Modulation of a stream's live settings (issue 48): any numeric row of the settings tables
(strength, guidance, delta, seed, the add-on scales, the video rows) driven by a source, through a
range, a curve and smoothing, evaluated once per frame at the frame's time.

Sources give a value in [0, 1]:
- `lfo`: sine, triangle, square, saw or random (a new value each cycle), at `rate` Hz or, with
  `beats`, one cycle every `beats` beats of the tempo clock; `phase` in cycles;
- `beat`: the tempo clock's phase within `beats` beats (a ramp 0 -> 1, 0 on the downbeat);
- `midi`: the last value of MIDI control change `cc` (0..127 -> 0..1) on `channel` (any when
  None), from the browser's WebMIDI or a server port (`MidiInputs.control_change`);
- `audio`: a feature of the stream's audio (rms, low, mid, high, onset) at the frame's time less
  the audio's latency offset, from what `inputs.audio(feature, t)` reads.

A mapping's value is `low + curve(x) * (high - low)` (curves: linear, exp (x^2), log (sqrt x),
smooth (smoothstep); `invert` takes 1 - x first), smoothed by a one-pole filter of time constant
`smoothing` seconds, and checked against its setting's range; whole-number settings are rounded.
`low`/`high` default to the setting's slider range (else its range). The JSON form (`PUT
/studio/modulations/{stream}`, OSC, `--modulation FILE`, a show's preset file) is
`{"mappings": [{"setting": "strength", "source": {"kind": "lfo", "shape": "sine", "rate": 0.5},
"low": 0.3, "high": 0.8, "curve": "linear", "smoothing": 0.1}, ...], "latency_ms": 120}`; `latency_ms`
(optional) sets the audio's latency offset for the stream (without it: its measured glass-to-glass
latency, app/perform/latency.py).
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import asdict, dataclass, field
import json

from streamstudio.app.settings import CONTROL_SCALES, MAX_CONTROLNETS, control_scale_key
from streamstudio.errors import StreamStudioError
from streamstudio.pipelines.live_settings import ADDON_SCALE, SETTINGS, VIDEO_SETTINGS, LiveSetting

SHAPES = ("sine", "triangle", "square", "saw", "random")
KINDS = ("lfo", "beat", "midi", "audio")
FEATURES = ("rms", "low", "mid", "high", "onset")
CURVES = ("linear", "exp", "log", "smooth")
MAX_MAPPINGS = 32
MAX_LATENCY_MS = 5000.0  # a latency offset set by hand (the features keep 10 s)
TABLES = {"image": SETTINGS, "video": VIDEO_SETTINGS}


def modulatable(table: dict[str, LiveSetting]) -> dict[str, LiveSetting]:
    """The rows a source may drive: the live numeric settings with a range."""
    return {n: s for n, s in table.items()
            if s.kind in (int, float) and s.live and s.low is not None and s.high is not None}


@dataclass(frozen=True)
class Source:
    kind: str = "lfo"
    shape: str = "sine"  # lfo
    rate: float = 1.0  # lfo: cycles a second (without `beats`)
    beats: float | None = None  # lfo, beat: a cycle every this many beats of the tempo clock
    phase: float = 0.0  # lfo: offset, in cycles
    cc: int = 1  # midi: the control change number
    channel: int | None = None  # midi: 1..16, None for any
    feature: str = "rms"  # audio

    def check(self) -> "Source":
        if self.kind not in KINDS:
            raise StreamStudioError(f"a modulation source is one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.shape not in SHAPES:
            raise StreamStudioError(f"an LFO's shape is one of {', '.join(SHAPES)}, got {self.shape!r}")
        if not (_number(self.rate) and 0 < self.rate <= 100):
            raise StreamStudioError(f"an LFO's rate is over 0 and at most 100 Hz, got {self.rate!r}")
        if self.beats is not None and not (_number(self.beats) and 1 / 64 <= self.beats <= 1024):
            raise StreamStudioError(f"beats is 1/64..1024, got {self.beats!r}")
        if self.kind == "beat" and self.beats is None:
            object.__setattr__(self, "beats", 1.0)
        if not (isinstance(self.cc, int) and 0 <= self.cc <= 127) or \
                (self.channel is not None and not (isinstance(self.channel, int) and 1 <= self.channel <= 16)):
            raise StreamStudioError("a MIDI source's cc is 0..127 and its channel 1..16 (or none for any)")
        if self.feature not in FEATURES:
            raise StreamStudioError(f"an audio feature is one of {', '.join(FEATURES)}, got {self.feature!r}")
        if not _number(self.phase):
            raise StreamStudioError(f"phase is a number of cycles, got {self.phase!r}")
        return self


@dataclass(frozen=True)
class Mapping:
    setting: str
    source: Source = field(default_factory=Source)
    low: float = 0.0  # (parse fills in the setting's range when a client leaves them out)
    high: float = 1.0
    curve: str = "linear"
    invert: bool = False
    smoothing: float = 0.0  # seconds (one-pole time constant)


class Modulations:
    """A stream's mappings and their smoothing state. `values(t, clock, inputs)` gives the
    settings for a frame at time t (seconds, `time.monotonic()`)."""

    def __init__(self, mappings: list[Mapping], table: dict[str, LiveSetting], latency_ms: float | None = None):
        self.mappings, self.table = mappings, table
        self.latency_ms = latency_ms  # the audio's latency offset set for the stream (None: measured)
        self._smoothed: dict[int, tuple[float, float]] = {}  # mapping index -> (time, value)
        self._random: dict[int, tuple[int, float]] = {}  # mapping index -> (cycle, its random value)
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, raw, pipeline: str = "image") -> "Modulations":
        """From the JSON form; every field checked, a clear error naming the first bad one."""
        table = modulatable(_table(pipeline))
        if not isinstance(raw, dict) or not isinstance(raw.get("mappings"), list) or \
                set(raw) - {"mappings", "latency_ms"}:
            raise StreamStudioError('modulations are {"mappings": [{"setting": ..., "source": {...}}, ...], '
                                    '"latency_ms": 120 (optional)}')
        if len(raw["mappings"]) > MAX_MAPPINGS:
            raise StreamStudioError(f"at most {MAX_MAPPINGS} mappings a stream, got {len(raw['mappings'])}")
        latency = raw.get("latency_ms")
        if latency is not None and not (_number(latency) and 0 <= latency <= MAX_LATENCY_MS):
            raise StreamStudioError(f"latency_ms is 0..{MAX_LATENCY_MS:.0f} (or left out: measured), got {latency!r}")
        return cls([_mapping(m, table) for m in raw["mappings"]], table,
                   None if latency is None else float(latency))

    def uses(self, kind: str) -> bool:
        """Whether a mapping reads a source of `kind` (lfo, beat, midi, audio)."""
        return any(m.source.kind == kind for m in self.mappings)

    def to_json(self) -> dict:
        out: dict = {"mappings": [asdict(m) for m in self.mappings]}
        if self.latency_ms is not None:
            out["latency_ms"] = self.latency_ms
        return out

    def values(self, t: float, clock=None, inputs=None) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        with self._lock:
            for i, m in enumerate(self.mappings):
                x = self._source(i, m.source, t, clock, inputs)
                if x is None:
                    continue  # no reading yet (no MIDI message, no audio): the setting stays as it is
                x = 1.0 - x if m.invert else x
                value = m.low + _curve(m.curve, x) * (m.high - m.low)
                value = self._smooth(i, m.smoothing, t, value)
                setting = self.table[m.setting]
                out[m.setting] = setting.check(round(value) if setting.kind is int else value)
        return _fold_control_scales(out)

    def _source(self, i: int, s: Source, t: float, clock, inputs) -> float | None:
        if s.kind == "midi":
            return None if inputs is None else inputs.cc(s.cc, s.channel)
        if s.kind == "audio":
            return None if inputs is None else inputs.audio(s.feature, t)
        beats = None if clock is None or s.beats is None else clock.beat(t) / s.beats  # cycles of the tempo
        if s.kind == "beat":
            return None if beats is None else beats % 1.0
        cycles = (beats if beats is not None else t * s.rate) + s.phase
        if s.shape == "random":
            n = math.floor(cycles)
            last = self._random.get(i)
            if last is None or last[0] != n:
                self._random[i] = (n, random.Random(hash((i, n))).random())
            return self._random[i][1]
        return lfo(s.shape, cycles)

    def _smooth(self, i: int, tau: float, t: float, value: float) -> float:
        last = self._smoothed.get(i)
        if tau > 0 and last is not None and t > last[0]:
            k = 1.0 - math.exp(-(t - last[0]) / tau)
            value = last[1] + k * (value - last[1])
        self._smoothed[i] = (t, value)
        return value


def lfo(shape: str, cycles: float) -> float:
    """The waveform in [0, 1] at `cycles` (its fraction is the phase): sine starts at 0.5 rising,
    triangle at 0 rising to 1 at half a cycle, square 1 then 0, saw a ramp 0 -> 1."""
    p = cycles % 1.0
    if shape == "sine":
        return 0.5 + 0.5 * math.sin(2 * math.pi * p)
    if shape == "triangle":
        return 2 * p if p < 0.5 else 2 - 2 * p
    if shape == "square":
        return 1.0 if p < 0.5 else 0.0
    return p  # saw


def _curve(name: str, x: float) -> float:
    x = min(1.0, max(0.0, x))
    return {"linear": x, "exp": x * x, "log": math.sqrt(x), "smooth": x * x * (3 - 2 * x)}[name]


def _mapping(raw, table: dict[str, LiveSetting]) -> Mapping:
    if not isinstance(raw, dict) or not isinstance(raw.get("setting"), str):
        raise StreamStudioError('each mapping names its "setting"')
    name = raw["setting"]
    if name not in table:
        raise StreamStudioError(f"{name!r} cannot be modulated; the numeric live settings are: {', '.join(table)}")
    unknown = set(raw) - {"setting", "source", "low", "high", "curve", "invert", "smoothing"}
    if unknown:
        raise StreamStudioError(f"a mapping has no {', '.join(sorted(unknown))}")
    source = raw.get("source", {})
    if not isinstance(source, dict) or set(source) - set(Source.__dataclass_fields__):
        raise StreamStudioError(f"a source has only {', '.join(Source.__dataclass_fields__)}")
    checked = Source(**source).check()
    setting = table[name]
    bottom, top = float(setting.low or 0.0), float(setting.high or 0.0)  # (a modulatable row has both)
    floor = bottom + (setting.step or 1e-3) if setting.low_open else bottom  # (0, 1]: from one step up
    low = raw.get("low", setting.slider_low if setting.slider_low is not None else floor)
    high = raw.get("high", setting.slider_high if setting.slider_high is not None else top)
    setting.check(low), setting.check(high)  # the ends within the setting's own range
    curve, smoothing = raw.get("curve", "linear"), raw.get("smoothing", 0.0)
    if curve not in CURVES:
        raise StreamStudioError(f"a curve is one of {', '.join(CURVES)}, got {curve!r}")
    if not (_number(smoothing) and 0 <= smoothing <= 60):
        raise StreamStudioError(f"smoothing is 0..60 seconds, got {smoothing!r}")
    if not isinstance(raw.get("invert", False), bool):
        raise StreamStudioError("invert is true or false")
    return Mapping(name, checked, float(low), float(high), curve, raw.get("invert", False), float(smoothing))


def _table(pipeline: str) -> dict[str, LiveSetting]:
    if pipeline not in TABLES:
        raise StreamStudioError(f"no settings table for {pipeline!r}")
    table = dict(TABLES[pipeline])
    if pipeline == "image":  # the model's add-ons: the IP-Adapter's scale, each ControlNet's ("control_scales.0")
        table["ip_adapter_scale"] = ADDON_SCALE
        table.update({control_scale_key(i): ADDON_SCALE for i in range(MAX_CONTROLNETS)})
    return table


def _fold_control_scales(values: dict) -> dict:
    """Each modulated ControlNet's scale ("control_scales.1": 0.7) as one partial update of the
    pipeline's `control_scales` ({1: 0.7}: the other nets keep theirs)."""
    keys = [k for k in values if k.startswith(CONTROL_SCALES + ".")]
    scales = {int(k.rsplit(".", 1)[1]): values.pop(k) for k in keys}
    if scales:
        values[CONTROL_SCALES] = scales
    return values


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_modulations(path: str, pipeline: str = "image") -> Modulations:
    """A file of modulations (the JSON form above; `render --modulation FILE`), or a one-line error
    naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as exc:
        raise StreamStudioError(f"--modulation {path!r} is not a readable JSON file ({exc})") from exc
    return Modulations.parse(raw, pipeline)


def apply_at(pipe, mods: Modulations, clock, t: float, inputs=None) -> dict:
    """The modulated settings at media time `t` given to `pipe` (an image stream: `update`); a file's
    frames follow its own clock, so an offline render's modulation is the same run after run.
    `inputs`: what the audio sources read (a file's own audio: app/perform/file_audio.py)."""
    values = mods.values(t, clock, inputs)
    if values:
        pipe.update(**values)
    return values
