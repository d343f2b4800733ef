"""Prompt schedules: prompts at timestamps, blended over a transition.

Text format, one entry per line (`#` starts a comment; times in seconds, mm:ss or hh:mm:ss):

    0      a watercolor city at dawn
    0:05   a neon city at night
    12.5   a snowy forest
    transition 2          # optional: seconds of blending after each change (default 1)

YAML / JSON format:

    transition: 2
    prompts:
      - {at: 0, prompt: a watercolor city at dawn}
      - {at: "0:05", prompt: a neon city at night}

At time t the prompt is the last entry at or before t; during the `transition` seconds after
an entry starts, it is blended with the one before: [(previous, 1 - w), (new, w)],
w = (t - start) / transition. That list is what `set_prompt` of the image pipeline takes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streamstudio.errors import StreamStudioError

PromptSpec = str | list[tuple[str, float]]


@dataclass(frozen=True)
class PromptKey:
    at: float  # seconds
    prompt: str


@dataclass
class PromptSchedule:
    keys: list[PromptKey]
    transition: float = 1.0
    weight_step: float = 0.05  # weights are rounded to this so set_prompt runs a bounded number of times
    _last: PromptSpec | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise StreamStudioError("a prompt schedule needs at least one prompt")
        if not math.isfinite(self.transition) or self.transition < 0:
            raise StreamStudioError(f"transition must be >= 0 seconds, got {self.transition}")
        self.keys = sorted(self.keys, key=lambda k: k.at)
        times = [k.at for k in self.keys]
        if len(set(times)) != len(times):
            raise StreamStudioError("two prompts in the schedule start at the same time")

    def at(self, t: float) -> PromptSpec:
        """The prompt (or weighted blend) at t seconds."""
        i = max(0, sum(1 for k in self.keys if k.at <= t) - 1)
        key = self.keys[i]
        if i == 0 or self.transition <= 0 or t >= key.at + self.transition:
            return key.prompt
        w = (t - key.at) / self.transition
        w = round(round(w / self.weight_step) * self.weight_step, 6)
        if w <= 0:
            return self.keys[i - 1].prompt
        if w >= 1:
            return key.prompt
        return [(self.keys[i - 1].prompt, round(1.0 - w, 6)), (key.prompt, w)]

    def apply(self, set_prompt: Callable[[PromptSpec], None], t: float) -> bool:
        """Call set_prompt when the prompt at t differs from the last one applied."""
        spec = self.at(t)
        if spec == self._last:
            return False
        set_prompt(spec)
        self._last = spec
        return True


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


def parse_text(text: str, transition: float = 1.0) -> PromptSchedule:
    keys: list[PromptKey] = []
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
            keys.append(PromptKey(parse_time(head), rest.strip()))
        except StreamStudioError as exc:
            raise StreamStudioError(f"prompt schedule line {n}: {exc}") from exc
    return PromptSchedule(keys, transition)


def parse_mapping(data, transition: float = 1.0) -> PromptSchedule:
    if isinstance(data, dict):
        transition = _number(data.get("transition", transition), "transition")
        entries = data.get("prompts")
    else:
        entries = data
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise StreamStudioError("a YAML/JSON prompt schedule needs a list 'prompts' of {at, prompt} entries")
    keys = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "prompt" not in entry or "at" not in entry:
            raise StreamStudioError(f"prompt schedule entry {i + 1}: expected {{at: TIME, prompt: TEXT}}, got {entry!r}")
        keys.append(PromptKey(parse_time(entry["at"]), str(entry["prompt"])))
    return PromptSchedule(keys, transition)


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
        schedule = PromptSchedule(schedule.keys, transition, schedule.weight_step)
    return schedule


def _load_structured(text: str, path: Path):
    import yaml

    try:
        return json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise StreamStudioError(f"prompt schedule {path} is not valid {path.suffix[1:].upper()}: {exc}") from exc


def _number(value, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise StreamStudioError(f"prompt schedule {what}: expected a number, got {value!r}") from exc
