"""What the benchmark scripts share: the device they run on, timing with the device's
synchronisation, the run's date, writing the results JSON and printing tables. The scripts run
with this folder on sys.path (`python benchmarks/NAME.py`), so they `from common import ...`."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:  # the package, when it is not installed
    sys.path.insert(0, str(ROOT))

from streamstudio.device import pick_device  # noqa: E402

CPU_THREADS = 2  # torch's threads on a CPU run: the shared CI machine has two cores


def bench_device(name: str = "auto", cpu_threads: int | None = CPU_THREADS) -> torch.device:
    """The device `name` names (streamstudio.device.pick_device); on the CPU torch's threads are
    capped at `cpu_threads` (None: torch's default), so figures compare across runs."""
    device = pick_device(name)
    if device.type == "cpu" and cpu_threads is not None:
        torch.set_num_threads(min(cpu_threads, os.cpu_count() or 1))
    return device


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for the device's queued work: torch.cuda.synchronize on a GPU, nothing on the CPU."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def timed(fn: Callable[[], object], sync: Callable[[], None] = lambda: None) -> tuple[object, float]:
    """fn()'s result and the wall seconds it took, the device synchronised before and after."""
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def utc_now() -> str:
    """The run's date and time, UTC, to the second (ISO 8601)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_json(path: str | Path, result: dict, indent: int = 2) -> Path:
    """Write a result (its folder made when missing); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent) + "\n")
    return path


def table(columns: Sequence[tuple[str, str | Callable[[dict], object], str]], rows: Iterable[dict]) -> str:
    """Rows (dicts) as aligned text under a header and a rule. A column is (header, the row's key
    or a function of the row, a format spec that starts with the alignment and width: "<34",
    ">8.3f", ">9,"); a missing value (None) prints as "-", a longer one widens its row."""
    widths = [int(re.match(r"[<>^](\d+)", spec).group(1)) for _, _, spec in columns]
    head = " ".join(f"{name:{spec[0]}{w}}" for (name, _, spec), w in zip(columns, widths)).rstrip()
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = []
        for (_, get, spec), w in zip(columns, widths):
            value = get(row) if callable(get) else row.get(get)
            cells.append(f"{'-':>{w}}" if value is None else f"{value:{spec}}")
        lines.append(" ".join(cells).rstrip())
    return "\n".join(lines)
