"""Prompt schedules: prompts, ControlNet scales and the IP-Adapter scale at timestamps,
blended over a transition.

Text format, one entry per line (`#` starts a comment; times in seconds, mm:ss or hh:mm:ss):

    0      a watercolor city at dawn
    0      control_scales = 1.0 0.5    # one conditioning scale per --controlnet
    0:05   a neon city at night
    0:05   control_scales = 0.2 0.5
    0:08   ip_adapter_scale = 0.8      # the --ip-adapter's scale
    12.5   a snowy forest
    transition 2          # optional: seconds of blending after each change (default 1)

YAML / JSON format (an entry holds a prompt, scales, or both):

    transition: 2
    prompts:
      - {at: 0, prompt: a watercolor city at dawn, control_scales: [1.0, 0.5]}
      - {at: "0:05", prompt: a neon city at night, control_scales: [0.2, 0.5], ip_adapter_scale: 0.8}

At time t the prompt is the last entry at or before t; during the `transition` seconds after
an entry starts, it is blended with the one before: [(previous, 1 - w), (new, w)],
w = (t - start) / transition. That list is what `set_prompt` of the image pipeline takes.
Each scale setting (the names are the web API's) is its own track: the value of its last entry
at or before t (before its first entry, the first entry's), moved linearly from the one before
over the same transition, and handed to the pipeline's `update` (`apply_to`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from streamstudio.errors import StreamStudioError

PromptSpec = str | list[tuple[str, float]]
SCALE_SETTINGS = ("control_scales", "ip_adapter_scale")  # the pipeline's update() keys a schedule may set
MAX_SCALE = 10.0  # |scale| at most, as the pipeline and the web API take


@dataclass(frozen=True)
class PromptKey:
    at: float  # seconds
    prompt: str


@dataclass(frozen=True)
class ScaleKey:
    """A scale setting at a time: control_scales (a tuple, one per ControlNet) or
    ip_adapter_scale (a number)."""

    at: float  # seconds
    name: str
    value: float | tuple[float, ...]


class _AddOns(Protocol):
    @property
    def controlnets(self) -> Sized: ...

    @property
    def ip_adapter(self) -> object: ...


class ScheduledPipeline(Protocol):
    """What a schedule reads and sets of an image pipeline (a StreamDiffusion: the streaming layer
    names no pipeline): its model's add-ons, its prompt and its settings."""

    @property
    def comps(self) -> _AddOns: ...

    def set_prompt(self, prompt: PromptSpec) -> None: ...

    def update(self, **changes: Any) -> None: ...


@dataclass
class PromptSchedule:
    keys: list[PromptKey]
    transition: float = 1.0
    weight_step: float = 0.05  # weights are rounded to this so set_prompt runs a bounded number of times
    scales: list[ScaleKey] = field(default_factory=list)
    _last: PromptSpec | None = field(default=None, init=False, repr=False)
    _last_settings: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.keys and not self.scales:
            raise StreamStudioError("a prompt schedule needs at least one prompt")
        if not math.isfinite(self.transition) or self.transition < 0:
            raise StreamStudioError(f"transition must be >= 0 seconds, got {self.transition}")
        self.keys = sorted(self.keys, key=lambda k: k.at)
        times = [k.at for k in self.keys]
        if len(set(times)) != len(times):
            raise StreamStudioError("two prompts in the schedule start at the same time")
        self.scales = sorted(self.scales, key=lambda k: k.at)
        for name in SCALE_SETTINGS:
            track = self.track(name)
            if len({k.at for k in track}) != len(track):
                raise StreamStudioError(f"two {name} entries in the schedule start at the same time")
            if len({len(k.value) for k in track if isinstance(k.value, tuple)}) > 1:
                raise StreamStudioError(f"every {name} entry of the schedule needs the same number of scales "
                                        "(one per ControlNet)")

    def track(self, name: str) -> list[ScaleKey]:
        return [k for k in self.scales if k.name == name]

    def _weight(self, t: float, start: float) -> float:
        """The new entry's share at t, rounded to weight_step (1 after the transition)."""
        if self.transition <= 0 or t >= start + self.transition:
            return 1.0
        w = (t - start) / self.transition
        return min(1.0, max(0.0, round(round(w / self.weight_step) * self.weight_step, 6)))

    def at(self, t: float) -> PromptSpec | None:
        """The prompt (or weighted blend) at t seconds (None: the schedule sets no prompt)."""
        if not self.keys:
            return None
        i = max(0, sum(1 for k in self.keys if k.at <= t) - 1)
        key = self.keys[i]
        if i == 0:
            return key.prompt
        w = self._weight(t, key.at)
        if w <= 0:
            return self.keys[i - 1].prompt
        if w >= 1:
            return key.prompt
        return [(self.keys[i - 1].prompt, round(1.0 - w, 6)), (key.prompt, w)]

    def settings_at(self, t: float) -> dict:
        """The scale settings at t seconds, {name: value} for the pipeline's `update` (lists for
        control_scales), of the tracks the schedule has."""
        out = {}
        for name in SCALE_SETTINGS:
            track = self.track(name)
            if not track:
                continue
            i = max(0, sum(1 for k in track if k.at <= t) - 1)
            new = track[i].value
            w = 1.0 if i == 0 else self._weight(t, track[i].at)
            old = track[i - 1].value if i else new
            mix = (lambda a, b: round(a + (b - a) * w, 6)) if 0 < w < 1 else (lambda a, b: b if w >= 1 else a)
            if isinstance(new, tuple) and isinstance(old, tuple):  # (a track's values are all of one kind)
                out[name] = [mix(a, b) for a, b in zip(old, new)]
            else:
                out[name] = mix(old, new)
        return out

    def apply(self, set_prompt: Callable[[PromptSpec], None], t: float,
              update: Callable[..., None] | None = None) -> bool:
        """Call set_prompt when the prompt at t differs from the last one applied, and
        update(**changes) with the scale settings that changed (when `update` is given)."""
        changed = False
        spec = self.at(t)
        if spec is not None and spec != self._last:
            set_prompt(spec)
            self._last = spec
            changed = True
        if update is not None:
            settings = self.settings_at(t)
            changes = {k: v for k, v in settings.items() if self._last_settings.get(k) != v}
            if changes:
                update(**changes)
                self._last_settings.update(changes)
                changed = True
        return changed

    def apply_to(self, pipe: ScheduledPipeline, t: float) -> bool:
        """Apply the schedule at t to an image pipeline: its prompt and its scales."""
        return self.apply(pipe.set_prompt, t, pipe.update)

    def check(self, pipe: ScheduledPipeline) -> None:
        """Refuse, before a run starts, scales the pipeline cannot take: control_scales without one
        per ControlNet, ip_adapter_scale without an IP-Adapter."""
        nets = len(pipe.comps.controlnets)
        for key in self.track("control_scales")[:1]:
            assert isinstance(key.value, tuple)  # (scale_key makes control_scales a tuple)
            if len(key.value) != nets:
                raise StreamStudioError(f"the prompt schedule sets {len(key.value)} ControlNet scale(s) but the model "
                                        f"has {nets} ControlNet(s) (--controlnet); give one scale per ControlNet")
        if self.track("ip_adapter_scale") and pipe.comps.ip_adapter is None:
            raise StreamStudioError("the prompt schedule sets ip_adapter_scale but the model has no IP-Adapter "
                                    "(--ip-adapter)")


_TIME = re.compile(r"^(?:(\d+):)?(?:(\d+):)?(\d+(?:\.\d*)?)$")


def parse_time(text: str | float) -> float:
    """Seconds from 12.5, "12.5", "1:02.5" or "1:00:02"."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _TIME.match(str(text).strip())
        if not m:
            raise StreamStudioError(f"bad time {text!r}; use seconds (12.5), mm:ss or hh:mm:ss")
        parts = [p for p in m.groups() if p is not None]
        value = 0.0
        for p in parts:
            value = value * 60 + float(p)
    if not math.isfinite(value):
        raise StreamStudioError(f"bad time {text!r}; use seconds (12.5), mm:ss or hh:mm:ss")
    if value < 0:
        raise StreamStudioError(f"times must not be negative, got {text!r}")
    return value


_SCALE_LINE = re.compile(r"^(" + "|".join(SCALE_SETTINGS) + r")\s*=\s*(.*)$")


def parse_text(text: str, transition: float = 1.0) -> PromptSchedule:
    keys: list[PromptKey] = []
    scales: list[ScaleKey] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head, _, rest = line.partition(" ")
        if head.lower() == "transition":
            transition = _number(rest, f"line {n}")
            continue
        if not rest.strip():
            raise StreamStudioError(f"prompt schedule line {n}: expected 'TIME PROMPT', got {raw.strip()!r}")
        try:
            at = parse_time(head)
            setting = _SCALE_LINE.match(rest.strip())
            if setting:  # TIME control_scales = 0.8 0.5 | TIME ip_adapter_scale = 0.6
                values = setting.group(2).replace(",", " ").split()
                scales.append(scale_key(at, setting.group(1), values if setting.group(1) == "control_scales"
                                        else (values[0] if len(values) == 1 else values)))
            else:
                keys.append(PromptKey(at, rest.strip()))
        except StreamStudioError as exc:
            raise StreamStudioError(f"prompt schedule line {n}: {exc}") from exc
    return PromptSchedule(keys, transition, scales=scales)


def scale_key(at: float, name: str, value: object) -> ScaleKey:
    """A checked ScaleKey: control_scales a list of 1 or more numbers, ip_adapter_scale one
    number, each in [-10, 10] (numbers may be given as text)."""
    if name == "control_scales":
        if isinstance(value, (str, int, float)) or not isinstance(value, Sequence) or not value:
            raise StreamStudioError(f"control_scales takes one number per ControlNet, e.g. [0.8, 0.5]; got {value!r}")
        return ScaleKey(at, name, tuple(_scale(v, name) for v in value))
    if name == "ip_adapter_scale":
        if isinstance(value, (list, tuple)):
            raise StreamStudioError(f"ip_adapter_scale takes one number, got {value!r}")
        return ScaleKey(at, name, _scale(value, name))
    raise StreamStudioError(f"unknown schedule setting {name!r}; known: {', '.join(SCALE_SETTINGS)}")


def _scale(value: object, name: str) -> float:
    number = None if isinstance(value, bool) else _number(value, name)
    if number is None or not math.isfinite(number) or abs(number) > MAX_SCALE:
        raise StreamStudioError(f"{name}: a scale is a number in [-{MAX_SCALE:g}, {MAX_SCALE:g}], got {value!r}")
    return number


def parse_mapping(data: object, transition: float = 1.0) -> PromptSchedule:
    if isinstance(data, dict):
        transition = _number(data.get("transition", transition), "transition")
        entries = data.get("prompts")
    else:
        entries = data
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise StreamStudioError("a YAML/JSON prompt schedule needs a list 'prompts' of {at, prompt} entries")
    keys, scales = [], []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "at" not in entry or not ({"prompt", *SCALE_SETTINGS} & set(entry)):
            raise StreamStudioError(f"prompt schedule entry {i + 1}: expected {{at: TIME, prompt: TEXT}} (and/or "
                                    f"{', '.join(SCALE_SETTINGS)}), got {entry!r}")
        unknown = sorted(set(entry) - {"at", "prompt", *SCALE_SETTINGS})
        if unknown:
            raise StreamStudioError(f"prompt schedule entry {i + 1}: unknown key(s) {', '.join(map(str, unknown))}; "
                                    f"known: at, prompt, {', '.join(SCALE_SETTINGS)}")
        try:
            at = parse_time(entry["at"])
            if "prompt" in entry:
                keys.append(PromptKey(at, str(entry["prompt"])))
            scales += [scale_key(at, name, entry[name]) for name in SCALE_SETTINGS if name in entry]
        except StreamStudioError as exc:
            raise StreamStudioError(f"prompt schedule entry {i + 1}: {exc}") from exc
    return PromptSchedule(keys, transition, scales=scales)


def load_schedule(path: str | Path, transition: float | None = None) -> PromptSchedule:
    """Read a schedule file (.yaml/.yml/.json, else the text format). `transition` overrides
    the file's."""
    path = Path(path)
    if not path.is_file():
        raise StreamStudioError(f"prompt schedule {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise StreamStudioError(f"prompt schedule {path} is not a UTF-8 text file ({exc.reason} at byte "
                                f"{exc.start}); give a text, YAML or JSON schedule (see docs/streaming.md)") from exc
    except OSError as exc:
        raise StreamStudioError(f"prompt schedule {path} cannot be read ({exc.strerror or exc})") from exc
    if "\x00" in text:
        raise StreamStudioError(f"prompt schedule {path} is a binary file, not text; give a text, YAML or JSON "
                                "schedule (see docs/streaming.md)")
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        schedule = parse_mapping(_load_structured(text, path))
    else:
        schedule = parse_text(text)
    if transition is not None:
        schedule = PromptSchedule(schedule.keys, transition, schedule.weight_step, scales=schedule.scales)
    return schedule


def _load_structured(text: str, path: Path) -> object:
    try:
        return json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise StreamStudioError(f"prompt schedule {path} is not valid {path.suffix[1:].upper()}: {exc}") from exc


def _number(value: Any, what: str) -> float:  # value: anything a file held; what float() refuses is an error
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise StreamStudioError(f"prompt schedule {what}: expected a number, got {value!r}") from exc
