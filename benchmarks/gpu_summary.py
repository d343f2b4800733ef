"""The GPU session's bookkeeping and its one summary table (benchmarks/gpu_session.sh calls it).

    python3 benchmarks/gpu_summary.py record --out DIR --stage NAME --rc RC --seconds S --limit L --log FILE
    python3 benchmarks/gpu_summary.py record --out DIR --stage webapp --missing "why it did not run"
    python3 benchmarks/gpu_summary.py table DIR [DIR ...] [--write FILE]

`record` adds one stage's outcome to DIR/stages.json (rewritten whole after every stage, so a
call killed later still leaves what ran): ok, failed, killed (at its time limit), missing (not
run, with the reason), dry-run; for a stage that did not end well, its first error line.
`table` reads the stages and the benchmarks' JSON in one or more result folders (the two calls
of a session come back in two folders; a later folder's stage wins) and prints every figure
against its target (issue 12: one H100, 512x512, sd-turbo architecture with random weights,
1 step, fp16, TAESD, img2img), then every stage with its status. A figure whose stage did not
run, failed or was killed says so instead of a value. Standard library only: it runs where
torch does not import.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

STAGES_FILE = "stages.json"

# which stage writes which file
STAGE_OF = {"gpu_tests.xml": "tests", "gpu_tests_slow.xml": "tests_slow", "kernels.json": "kernels",
            "stream_diffusion.json": "stream_diffusion", "splats.json": "splats", "stream_video.json": "video",
            "multistream.json": "multistream", "webapp.json": "webapp", "stream_diffusion_addons.json": "addons",
            "kernels_full.json": "kernels_full", "frame_path.json": "frame_path", "peers.json": "peers",
            "frame_path_tuned.json": "tuned", "frame_path_autotune.json": "autotune", "splats_gsplat.json": "gsplat",
            "causal_video.json": "causal"}

KILLED_RCS = (124, 137)  # timeout's exit status, and SIGKILL after --kill-after

ERROR_PATTERNS = (
    re.compile(r"^(FAILED|ERROR) \S"),  # pytest's short summary
    re.compile(r"^(ERROR|error|fatal error|FATAL)\b.*"),
    re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(:.*)?$"),  # a traceback's last line
    re.compile(r"(error|Error|ERROR)[: ]"),
)

PYTEST_WORDS = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")


# ------------------------------------------------------------------------------ record
def first_error_line(text: str) -> str | None:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pattern in ERROR_PATTERNS:
        for ln in lines:
            if pattern.search(ln):
                return ln[:300]
    return lines[-1][:300] if lines else None


def pytest_counts(text: str) -> dict:
    """Per-test outcome words of a `pytest -v` log, for a test stage killed before its XML."""
    counts = {w.lower(): 0 for w in PYTEST_WORDS}
    for ln in text.splitlines():
        m = re.match(r"^\S+::\S+.*? (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", ln)
        if m:
            counts[m.group(1).lower()] += 1
    counts["collected"] = None
    m = re.search(r"(\d+)(?:/\d+)? tests? collected", text)
    if m:
        counts["collected"] = int(m.group(1))
    return counts


def load_stages(folder: Path) -> list[dict]:
    path = Path(folder) / STAGES_FILE
    if not path.is_file():
        return []
    try:
        return json.loads(path.read_text()).get("stages", [])
    except (json.JSONDecodeError, AttributeError):
        return []


def record(out: Path, stage: str, rc: int | None = None, seconds: float | None = None, limit: float | None = None,
           log: Path | None = None, missing: str | None = None, dry_run: bool = False,
           command: str | None = None) -> dict:
    text = ""
    if log is not None and Path(log).is_file():
        text = Path(log).read_text(errors="replace")
    if missing is not None:
        status = "missing"
    elif rc in KILLED_RCS:
        status = "killed"
    elif rc:
        status = "failed"
    else:
        status = "dry-run" if dry_run else "ok"
    entry = {"stage": stage, "status": status, "rc": rc, "seconds": seconds, "limit_s": limit, "command": command}
    if status == "missing":
        entry["error"] = missing
    elif status == "killed":
        last = [ln for ln in text.splitlines() if ln.strip()]
        entry["error"] = f"killed at its time limit ({limit} s)" + (f"; last line: {last[-1].strip()[:200]}"
                                                                    if last else "")
    elif status == "failed":
        entry["error"] = first_error_line(text) or f"exit status {rc}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    entry["last_line"] = lines[-1][:300] if lines else None
    if stage in ("tests", "tests_slow"):
        entry["counts"] = pytest_counts(text)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stages = [s for s in load_stages(out) if s.get("stage") != stage] + [entry]
    tmp = out / (STAGES_FILE + ".tmp")
    tmp.write_text(json.dumps({"stages": stages}, indent=1))
    os.replace(tmp, out / STAGES_FILE)
    return entry


# ------------------------------------------------------------------------------ figures
class Missing(Exception):
    """A figure that is not in the results, with the reason."""


def _json(files: dict, name: str) -> dict:
    if name not in files:
        raise Missing(None)
    try:
        return json.loads(files[name].read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise Missing(f"{name} unreadable: {e}") from None


def _pipeline_fps(mode: str, absent: str, name: str = "kernels.json"):
    def get(files):
        data = _json(files, name)
        for row in data.get("pipeline", []):
            if row.get("mode") == mode:
                return row.get("fps"), row.get("model")
        notes = "; ".join(data.get("notes", []))
        raise Missing(absent + (f" ({notes})" if notes else ""))
    return get


def _ops(files) -> list[tuple[str, float | None, str | None]]:
    data = _json(files, "kernels.json")
    out = []
    for row in data.get("ops", []):
        pct = next((row[k] for k in ("floor_pct", "bandwidth_pct", "pct_of_copy_bandwidth") if k in row), None)
        out.append((row.get("op", "?"), pct, row.get("size") or row.get("shape")))
    return out


def _multistream_scaling(files):
    data = _json(files, "multistream.json")
    rows = data.get("rows", [])

    def total(mode, k):
        return next((r.get("total_fps") for r in rows if r.get("mode") == mode and r.get("streams") == k), None)

    four, one = total("batched", 4), total("batched", 1) or total("turns", 1)
    if four is None or not one:
        raise Missing("no 1- and 4-stream rows in multistream.json")
    return four / one, data.get("model")


def _turns_scaling(files):
    rows = _json(files, "multistream.json").get("rows", [])
    four = next((r.get("total_fps") for r in rows if r.get("mode") == "turns" and r.get("streams") == 4), None)
    one = next((r.get("total_fps") for r in rows if r.get("mode") == "turns" and r.get("streams") == 1), None)
    if four is None or not one:
        raise Missing("no 1- and 4-stream turns rows in multistream.json")
    return four / one, "taking turns on one model"


def _multistream_over_turns(files):
    data = _json(files, "multistream.json")
    value = data.get("batched_over_turns", {}).get("4")
    if value is None:
        raise Missing("no 4-stream row in multistream.json")
    return value, data.get("model")


def _webapp_latency(files):
    data = _json(files, "webapp.json")
    level = next((lv for lv in data.get("levels", []) if lv.get("clients") == 1), None)
    if level is None or level.get("latency_ms_median") is None:
        raise Missing("no 1-client latency in webapp.json")
    return level["latency_ms_median"], f"{data.get('model')} at {data.get('size')}x{data.get('size')}"


def _key(name, *path, on=None):
    def get(files):
        data = _json(files, name)
        value = data
        for p in path:
            value = value.get(p) if isinstance(value, dict) else None
        if value is None:
            section = data.get(path[0]) if isinstance(data.get(path[0]), dict) else {}
            raise Missing(section.get("status") or section.get("note") or f"{'.'.join(path)} not in {name}")
        return value, (on(data) if on else None)
    return get


def _tests(files, stages, xml="gpu_tests.xml"):
    if xml in files:
        try:
            root = ET.parse(files[xml]).getroot()
        except ET.ParseError as e:
            raise Missing(f"{xml} unreadable: {e}") from None
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
        passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
        return dict(passed=passed, failed=n["failures"], errors=n["errors"], skipped=n["skipped"], tests=n["tests"],
                    partial=False)
    stage = stages.get(STAGE_OF[xml])
    if stage and stage.get("counts") and stage["status"] in ("killed", "failed"):
        c = stage["counts"]
        if any(c.get(w.lower()) for w in PYTEST_WORDS):
            return dict(passed=c["passed"], failed=c["failed"], errors=c["error"], skipped=c["skipped"],
                        tests=c.get("collected"), partial=True)
    raise Missing(None)


def _frame_mode(*modes, file="frame_path.json"):
    def get(files):
        data = _json(files, file)
        found = [v for k, v in data.get("modes", {}).items() if k in modes and v]
        if not found:
            raise Missing(f"no {' / '.join(modes)} row in {file}")
        return max(found), data.get("model")
    return get


def _mode_ratio(file, over, under):
    """One frame_path mode's fps over another's, from the same interleaved run."""
    def get(files):
        data = _json(files, file)
        modes = data.get("modes", {})
        if not modes.get(over) or not modes.get(under):
            raise Missing(next(iter(data.get("notes", [])), f"no {over} and {under} rows in {file}"))
        return modes[over] / modes[under], data.get("model")
    return get


def _host_share(files):
    """The host's cost in an eager frame: its time against the same frame replayed as one CUDA graph
    (the same kernels, launched at once). CUDA-event intervals cannot say it: they include the gaps
    where the GPU waits for the host's next launch."""
    modes = _json(files, "frame_path.json").get("modes", {})
    if not modes.get("eager") or not modes.get("graph"):
        raise Missing("no eager and graph rows in frame_path.json")
    eager, graph = 1e3 / modes["eager"], 1e3 / modes["graph"]
    return eager - graph, f"of {eager:.1f} ms an eager frame; {graph:.1f} ms as one graph"


# (label, file, getter, target text, check): check(value) -> bool, or None for a figure with no target
FIGURES = [
    ("one stream, frame graph + compile (fps)", "frame_path.json", _frame_mode("graph+compile", "graph+compile+cl"),
     ">= 200 (moonshot 300)", lambda v: v >= 200),
    ("one stream, frame graph, eager networks (fps)", "frame_path.json", _frame_mode("graph"), "-", None),
    ("one stream, tuned frame graph: channels_last, fused QKV (fps)", "frame_path_tuned.json",
     _frame_mode("graph+compile+cl", "graph+compile+clv", file="frame_path_tuned.json"), ">= 200 (moonshot 300)",
     lambda v: v >= 200),
    ("one stream, tuned frame graph + FP8 UNet (fps)", "frame_path_tuned.json",
     _frame_mode("graph+compile+clv+fp8", file="frame_path_tuned.json"), ">= 200 (moonshot 300)", lambda v: v >= 200),
    ("FP8 over float16, tuned frame graph (x)", "frame_path_tuned.json",
     _mode_ratio("frame_path_tuned.json", "graph+compile+clv+fp8", "graph+compile+clv"), "-", None),
    ("FP8 UNet output, relative L2 from float16", "frame_path.json", _key("frame_path.json", "fp8", "unet_rel_l2"),
     "- (reported)", None),
    ("FP8 frames, PSNR against float16 (dB)", "frame_path.json",
     _key("frame_path.json", "fp8", "frame_psnr_db_median"), "- (reported)", None),
    ("max-autotune over default compile, tuned frame graph (x)", "frame_path_autotune.json",
     _mode_ratio("frame_path_autotune.json", "graph+autotune", "graph+compile+clv"), "-", None),
    ("one stream, compile per network (fps, before)", "frame_path.json", _frame_mode("compile"), "-", None),
    ("RCFG self over full (frame graph)", "frame_path.json",
     _key("frame_path.json", "ratios", "RCFG self over full", on=lambda d: d.get("model")), ">= 1.6",
     lambda v: v >= 1.6),
    ("Stream Batch speedup, 4 steps (frame graph)", "frame_path.json",
     _key("frame_path.json", "ratios", "Stream Batch speedup", on=lambda d: d.get("model")), "-", None),
    ("host overhead of an eager frame (ms)", "frame_path.json", _host_share, "-", None),
    ("ours eager / peer eager (StreamDiffusion 0.1.1)", "peers.json",
     _key("peers.json", "summary", "eager", "ratio", on=lambda d: d.get("model")), ">= 1.0", lambda v: v >= 1.0),
    ("ours compiled / peer compiled", "peers.json",
     _key("peers.json", "summary", "compiled", "ratio", on=lambda d: d.get("model")), ">= 1.5", lambda v: v >= 1.5),
    ("img2img eager (fps)", "kernels.json", _pipeline_fps("eager", "no eager row"), ">= 70", lambda v: v >= 70),
    ("img2img fused kernels (fps)", "kernels.json",
     _pipeline_fps("fused kernels", "fused kernels unavailable"), "-", None),
    ("img2img --acceleration compile (fps)", "kernels.json",
     _pipeline_fps("fused + torch.compile", "no torch.compile row"), ">= 150", lambda v: v >= 150),
    ("img2img TensorRT (fps)", "kernels.json",
     _pipeline_fps("fused + tensorrt", "TensorRT not installed here"), ">= 200", lambda v: v >= 200),
    ("4 streams batched / 1 stream (total fps)", "multistream.json", _multistream_scaling, ">= 2.0x",
     lambda v: v >= 2.0),
    ("4 streams batched / taking turns (total fps)", "multistream.json", _multistream_over_turns, "-", None),
    ("4 streams taking turns / 1 stream (total fps)", "multistream.json", _turns_scaling, ">= 0.8x",
     lambda v: v >= 0.8),
    ("camera-to-screen latency, web app, 1 client (ms)", "webapp.json", _webapp_latency, "<= 50",
     lambda v: v <= 50),
    ("Stream Batch speedup", "stream_diffusion.json",
     _key("stream_diffusion.json", "stream_batch_speedup", on=lambda d: d.get("speedups_measured_on")), ">= 1.4",
     lambda v: v >= 1.4),
    ("RCFG self speedup over full CFG", "stream_diffusion.json",
     _key("stream_diffusion.json", "rcfg_self_speedup", on=lambda d: d.get("speedups_measured_on")), ">= 1.8",
     lambda v: v >= 1.8),
    ("pipeline overhead ratio", "stream_diffusion.json", _key("stream_diffusion.json", "overhead_ratio"),
     "<= 1.10", lambda v: v <= 1.10),
    ("sd-turbo arch 1 step 512 (fps, stream_diffusion.py)", "stream_diffusion.json",
     _key("stream_diffusion.json", "sd_turbo_arch", "fps_1step_512"), "-", None),
    ("splats 1M Gaussians 1920x1080 CUDA (fps)", "splats.json", _key("splats.json", "cuda", "fps"),
     "- (gsplat 172 on a TITAN RTX)", None),
    ("splats 1M 1920x1080: ours / gsplat 1.5.3, same card and cameras (x)", "splats_gsplat.json",
     _key("splats_gsplat.json", "gsplat", "ours_over_gsplat"), ">= 1.0", lambda v: v >= 1.0),
    ("StreamDiT 4B step (ms)", "stream_video.json", _key("stream_video.json", "gpu_4b", "step_ms"),
     "<= 350 on an H100 (paper 482)", lambda v: v <= 350),
    ("causal 1.3B 480x832, Self-Forcing text-to-video (fps)", "causal_video.json",
     _key("causal_video.json", "gpu", "self_forcing_t2v", "fps"), ">= 16.1 (StreamDiffusionV2: 64.5 on 4 H100s)",
     lambda v: v >= 16.1),
    ("causal 1.3B 480x832, StreamDiffusionV2 video-to-video (fps)", "causal_video.json",
     _key("causal_video.json", "gpu", "streamdiffusionv2_v2v", "fps"), ">= 16.1 (StreamDiffusionV2: 64.5 on 4 H100s)",
     lambda v: v >= 16.1),
    ("causal 1.3B, 2 streams batched over one by one (x)", "causal_video.json",
     _key("causal_video.json", "gpu", "batch", "speedup"), "-", None),
    # the second call's
    ("one ControlNet's cost (x the plain model)", "stream_diffusion_addons.json",
     _key("stream_diffusion_addons.json", "controlnet_1_cost", on=lambda d: d.get("addons_measured_on")), "<= 1.4",
     lambda v: v <= 1.4),
    ("LoRA unfused cost (x fused)", "stream_diffusion_addons.json",
     _key("stream_diffusion_addons.json", "lora_unfused_cost", on=lambda d: d.get("addons_measured_on")), "-", None),
    ("img2img eager, long run (fps)", "kernels_full.json", _pipeline_fps("eager", "no eager row", "kernels_full.json"),
     "(checks the quick run)", None),
]


def _cpu_run(files: dict, file: str) -> bool:
    """A figure from a run without a GPU: its GPU target does not apply."""
    try:
        data = json.loads(files[file].read_text())
    except (KeyError, OSError, json.JSONDecodeError):
        return False
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    device = str(data.get("device") or machine.get("device") or "")
    return device.lower().startswith("cpu")


def _short(text, n: int = 160) -> str:
    text = str(text or "").replace("|", "/").replace("\n", " ")
    return text if len(text) <= n else text[: n - 3] + "..."


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def collect(folders: list[Path]) -> tuple[dict, dict]:
    """The result files and stage records of the folders, a later folder's winning."""
    files, stages = {}, {}
    for folder in folders:
        folder = Path(folder)
        for name in STAGE_OF:
            if (folder / name).is_file():
                files[name] = folder / name
        for s in load_stages(folder):
            stages[s["stage"]] = s
            # a stage that ran again in a later folder owns its file: drop an older copy it did not rewrite
            for name, owner in STAGE_OF.items():
                if owner == s["stage"] and name in files and files[name].parent != folder:
                    del files[name]
    return files, stages


def why_missing(file: str, stages: dict) -> str:
    stage = STAGE_OF[file]
    s = stages.get(stage)
    if s is None:
        return f"stage {stage} not run"
    if s["status"] == "dry-run":
        return f"stage {stage}: dry run"
    if s["status"] in ("missing", "killed", "failed"):
        return f"stage {stage} {s['status']}: {s.get('error')}"
    return f"stage {stage} ended without writing {file}"


def rows(folders: list[Path]) -> tuple[list[tuple], list[dict]]:
    files, stages = collect(folders)
    out = []  # (figure, value, target, verdict, note)

    def missing(label, file, target, reason):
        out.append((label, "missing", target, "MISSING", reason or why_missing(file, stages)))

    for label, xml in (("gpu tests", "gpu_tests.xml"), ("slow gpu tests", "gpu_tests_slow.xml")):
        try:
            t = _tests(files, stages, xml)
            ok = t["failed"] == 0 and t["errors"] == 0 and (t["passed"] + t["skipped"]) > 0
            value = f"{t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped"
            note = "partial: stage did not finish; counts from its log" if t["partial"] else ""
            out.append((label, value, "0 failed, 0 errors", "pass" if ok and not t["partial"] else "FAIL", note))
        except Missing as e:
            missing(label, xml, "0 failed, 0 errors", e.args[0])
    for label, file, get, target, check in FIGURES:
        try:
            value, on = get(files)
        except Missing as e:
            missing(label, file, target, e.args[0])
            continue
        verdict = "-" if check is None else ("pass" if check(value) else "FAIL")
        if check is not None and _cpu_run(files, file):
            verdict = "- (CPU run)"
        out.append((label, _fmt(value), target, verdict, on or ""))
    try:
        for op, pct, size in _ops(files):
            label = f"fused {op} (% of bandwidth floor)"
            if pct is None:
                out.append((label, "missing", ">= 70", "MISSING", "fused kernel not built or not timed"))
            else:
                out.append((label, _fmt(pct), ">= 70", "pass" if pct >= 70 else "FAIL", str(size or "")))
    except Missing as e:
        missing("fused ops (% of bandwidth floor)", "kernels.json", ">= 70", e.args[0])
    return out, list(stages.values())


def table(folders: list[Path]) -> str:
    figures, stages = rows(folders)
    device = None
    files, _ = collect(folders)
    for name in ("kernels.json", "stream_diffusion.json", "multistream.json"):
        try:
            device = json.loads(files[name].read_text()).get("device")
            if device:
                break
        except (KeyError, OSError, json.JSONDecodeError):
            continue
    lines = [f"# GPU session summary ({device or 'device unknown'}; folders: {', '.join(map(str, folders))})", "",
             "| figure | value | target | verdict | note |", "| --- | --- | --- | --- | --- |"]
    for label, value, target, verdict, note in figures:
        lines.append(f"| {label} | {value} | {target} | {verdict} | {_short(note)} |")
    lines += ["", "| stage | status | seconds / limit | first error line |", "| --- | --- | --- | --- |"]
    for s in stages:
        took = f"{_fmt(s.get('seconds'))} / {_fmt(s.get('limit_s'))}" if s.get("seconds") is not None else "-"
        detail = s.get("error") or (s.get("last_line") if s["status"] == "dry-run" else "") or ""
        lines.append(f"| {s['stage']} | {s['status']} | {took} | {_short(detail, 240)} |")
    bad = [s["stage"] for s in stages if s["status"] in ("failed", "killed")]
    lines += ["", f"stages failed or killed: {', '.join(bad)}" if bad else "no stage failed"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("record", help="add one stage's outcome to OUT/stages.json")
    r.add_argument("--out", required=True, type=Path)
    r.add_argument("--stage", required=True)
    r.add_argument("--rc", type=int, default=None)
    r.add_argument("--seconds", type=int, default=None)
    r.add_argument("--limit", type=int, default=None)
    r.add_argument("--log", type=Path, default=None)
    r.add_argument("--missing", default=None, help="the stage did not run: why")
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--command", default=None)
    t = sub.add_parser("table", help="print the summary of one or more result folders")
    t.add_argument("folders", nargs="+", type=Path)
    t.add_argument("--write", type=Path, default=None, help="also write the table to this file")
    t.add_argument("--quiet", action="store_true", help="write only")
    t.add_argument("--strict", action="store_true", help="exit 1 when a stage failed or was killed")
    args = parser.parse_args(argv)
    if args.verb == "record":
        entry = record(args.out, args.stage, args.rc, args.seconds, args.limit, args.log, args.missing, args.dry_run,
                       args.command)
        if entry.get("error"):
            print(f"## {entry['stage']}: {entry['status']}: {entry['error']}")
        return 0
    text = table(args.folders)
    if args.write:
        args.write.write_text(text + "\n")
    if not args.quiet:
        print(text)
    if args.strict and any(s["status"] in ("failed", "killed") for s in rows(args.folders)[1]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
