"""benchmarks/peers.py on the CPU: our StreamDiffusion and the peer package (streamdiffusion
0.1.1, installed into a temporary folder with --no-deps) on the same tiny model, and its JSON.
Without the peer the script records it as missing and exits 0."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "peers.py"


def run_bench(out: Path, pythonpath: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def peer_dir(tmp_path_factory):
    target = tmp_path_factory.mktemp("peer")
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                               "streamdiffusion==0.1.1"], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("pip install streamdiffusion==0.1.1 timed out")
    if done.returncode != 0 or not (target / "streamdiffusion").is_dir():
        pytest.skip(f"pip install streamdiffusion==0.1.1 failed: {(done.stderr or done.stdout).strip()[-400:]}")
    return target


@pytest.mark.slow
def test_both_pipelines_run_side_by_side_and_the_ratio_is_ours_over_the_peers(peer_dir, tmp_path):
    out = tmp_path / "peers.json"
    done = run_bench(out, str(peer_dir), "--quick", "--seconds", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["benchmark"] == "peers" and result["device"].startswith("CPU") and result["date"]
    assert result["peer"]["status"] == "ok" and result["peer"]["version"] == "0.1.1"
    assert result["model"].startswith("tiny model")
    eager = result["summary"]["eager"]
    assert eager["ours_fps"] > 0 and eager["peer_fps"] > 0
    assert eager["ratio"] == pytest.approx(eager["ours_fps"] / eager["peer_fps"])
    rows = {(r["mode"], r["pipeline"]): r for r in result["rows"]}
    assert set(rows) == {("eager", "ours"), ("eager", "peer")}
    assert all(len(r["windows_fps"]) == result["rounds"] == 2 for r in rows.values())  # taken in turn
    assert "skipped" in result["summary"]["compiled"]  # compiled runs on CUDA only
    assert "ours eager fps" in done.stdout and "peer eager fps" in done.stdout


def test_without_the_peer_the_figure_is_recorded_missing(tmp_path):
    if importlib.util.find_spec("streamdiffusion") is not None:
        pytest.skip("streamdiffusion is installed in this environment")
    out = tmp_path / "peers.json"
    done = run_bench(out, None, "--quick", "--seconds", "1", "--modes", "eager")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["peer"]["status"] == "missing" and "pip install" in result["peer"]["note"]
    assert result["summary"]["eager"]["peer_fps"] is None and result["summary"]["eager"]["missing"] == "streamdiffusion"
    assert result["rows"] == []
