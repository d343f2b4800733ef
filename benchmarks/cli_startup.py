"""CLI start-up: how long the command takes to answer when it needs no model (issue 25).

    python benchmarks/cli_startup.py            # 3 runs of each command, the median
    python benchmarks/cli_startup.py --runs 1
    python benchmarks/cli_startup.py --before /tmp/old   # also time another checkout (once each), same run

Each command runs as a user types it, `python -m streamstudio ...`, in a new interpreter; its CPU
seconds (user + system, from the child's rusage) and wall seconds are measured. Targets:

- `--help` (top level and every command's) and every argument error: under 1 s of CPU, and
  as a ratio, below the CPU of `python -c "import torch"` measured in the same run (the cost
  the CLI used to pay before saying anything);
- a hub id that cannot be had offline (HF_HUB_OFFLINE=1, an unreachable hub): one line with the
  full repository id and the command that fetches it, within 5 s of wall time.

Results go to benchmarks/results/cli_startup.json with the machine and date.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))

CPU_TARGET_S = 1.0
OFFLINE_WALL_TARGET_S = 5.0


def timed_run(argv: list[str], env: dict | None = None, cwd: str | None = None) -> dict:
    """One run of `python argv`: wall and CPU seconds, exit code, the last line it printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    said = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else "")
    return {"wall_s": wall, "cpu_s": cpu, "rc": proc.returncode, "said": said.strip()}


def median_run(argv: list[str], runs: int, **kw) -> dict:
    results = [timed_run(argv, **kw) for _ in range(runs)]
    return {"wall_s": statistics.median(r["wall_s"] for r in results),
            "cpu_s": statistics.median(r["cpu_s"] for r in results),
            "rc": results[-1]["rc"], "said": results[-1]["said"]}


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cases(tmp: str, busy_port: int) -> list[tuple[str, str, list[str], dict]]:
    """(name, kind, argv after `-m streamstudio`, environment changes)."""
    out = str(Path(tmp) / "out")
    clip = Path(tmp) / "clip.mp4"
    clip.write_bytes(b"a user's video")
    help_cases = [("--help", "help", ["--help"], {})]
    help_cases += [(f"{c} --help", "help", [c, "--help"], {})
                   for c in ("serve", "generate", "render", "splat", "train-image", "train-video", "bench")]
    errors = [
        ("generate --strength 2", "argument error", ["generate", "--output", out, "--strength", "2"], {}),
        ("generate --guidance nan", "argument error", ["generate", "--output", out, "--guidance", "nan"], {}),
        ("generate --width 100", "argument error", ["generate", "--output", out, "--width", "100"], {}),
        ("generate --promt red", "argument error", ["generate", "--output", out, "--promt", "red"], {}),
        ("render --output x.avi", "argument error", ["render", "--input", "pattern", "--output", "x.avi"], {}),
        ("render missing input", "argument error", ["render", "--input", "none.mp4", "--output", "o.mp4"], {}),
        ("render output is input", "argument error", ["render", "--input", str(clip), "--output", str(clip)], {}),
        ("serve --port 99999", "argument error", ["serve", "--port", "99999"], {}),
        ("serve port in use", "argument error", ["serve", "--port", str(busy_port)], {}),
        ("splat --fov 200", "argument error", ["splat", "sample", "--output", "o.mp4", "--fov", "200"], {}),
    ]
    empty_cache = {"HF_HOME": str(Path(tmp) / "hf")}
    offline = [
        ("sd-turbo, HF_HUB_OFFLINE=1", "offline hub id", ["generate", "--model", "sd-turbo", "--output", out],
         {**empty_cache, "HF_HUB_OFFLINE": "1"}),
        ("sd-turbo, hub refused", "offline hub id", ["generate", "--model", "sd-turbo", "--output", out],
         {**empty_cache, "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}),
        ("sd-turbo, this machine's network", "offline hub id", ["generate", "--model", "sd-turbo", "--output", out],
         empty_cache),
    ]
    return help_cases + errors + offline


def main() -> int:
    from common import table, utc_now, write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each command; the median is reported (default 3)")
    ap.add_argument("--before", default=None, metavar="DIR",
                    help="a checkout of an earlier version (e.g. `git worktree add /tmp/old cc87b99`): each command "
                         "also runs once with its package, in the same run, for the before/after ratio")
    args = ap.parse_args()

    base_env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    base_env["PYTHONPATH"] = str(ROOT) + os.pathsep + base_env.get("PYTHONPATH", "")
    torch_import = median_run(["-c", "import torch"], args.runs, env=base_env)
    python_alone = median_run(["-c", "pass"], args.runs, env=base_env)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        for name, kind, argv, env in cases(tmp, busy.getsockname()[1]):
            r = median_run(["-m", "streamstudio", *argv], args.runs, env={**base_env, **env}, cwd=tmp)
            if kind == "offline hub id":
                met = r["wall_s"] <= OFFLINE_WALL_TARGET_S and "stabilityai/sd-turbo" in r["said"]
                target = f"<= {OFFLINE_WALL_TARGET_S:g} s wall, full id"
            else:
                met = r["cpu_s"] < CPU_TARGET_S and r["cpu_s"] < torch_import["cpu_s"]
                target = f"< {CPU_TARGET_S:g} s CPU"
            row = {"command": name, "kind": kind, **r, "vs_torch": r["cpu_s"] / torch_import["cpu_s"],
                   "target": target, "met": met}
            if args.before:
                old_env = {**base_env, **env, "PYTHONPATH": str(Path(args.before).resolve())}
                old = timed_run(["-m", "streamstudio", *argv], env=old_env, cwd=tmp)
                row.update(before_cpu_s=old["cpu_s"], before_wall_s=old["wall_s"], before_said=old["said"])
            rows.append(row)
    print(f"python alone: {python_alone['cpu_s']:.2f} s CPU; `import torch`: {torch_import['cpu_s']:.2f} s CPU, "
          f"{torch_import['wall_s']:.2f} s wall (median of {args.runs})\n")
    print(table([("command", "command", "<34"), ("rc", "rc", ">3"), ("CPU s", "cpu_s", ">6.2f"),
                 ("wall s", "wall_s", ">7.2f"), ("/torch", "vs_torch", ">7.2f"),
                 ("before CPU", "before_cpu_s", ">10.2f"), ("before wall", "before_wall_s", ">11.2f"),
                 ("target", "target", "<28"),
                 ("met", lambda r: "yes" if r["met"] else "NO", "<4")], rows))
    print()
    for r in rows:
        if r["kind"] == "offline hub id":
            print(f"{r['command']}: {r['said'][:200]}")
    result = {"benchmark": "cli_startup", "date": utc_now(), "machine": platform.platform(),
              "cpu_count": os.cpu_count(), "python": platform.python_version(), "runs": args.runs,
              "python_alone_cpu_s": python_alone["cpu_s"], "import_torch_cpu_s": torch_import["cpu_s"],
              "import_torch_wall_s": torch_import["wall_s"], "before": args.before, "rows": rows,
              "all_met": all(r["met"] for r in rows)}
    path = write_json(RESULTS / "cli_startup.json", result)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
