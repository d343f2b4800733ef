"""benchmarks/gpu_video_train.sh (one GPU call for issue 30's wider video model) and
gpu_causal_train.sh (issue 49's causal model, 256 wide) run end to end on the CPU with tiny knobs,
and what they leave in $OUT is what the device tool brings back: fp16 weights under 20 MB that
load and sample."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_video_train.sh"


def run_script(name: str, tmp_path: Path, **knobs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "BUDGET": "4",
           "PROBE": "2", "MINSTEPS": "3", **knobs,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / name)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_gpu_video_run_brings_back_loadable_fp16_weights(tmp_path):
    from safetensors.torch import load_file

    from streamstudio.models.video.stream_dit import count_parameters, load_checkpoint

    run = run_script(SCRIPT.name, tmp_path, BATCH="2", WORKERS="1")
    assert run.returncode == 0, run.stdout + run.stderr
    wide = tmp_path / "out" / "wide"
    weights = wide / "model.safetensors"
    assert weights.stat().st_size < 20e6  # fp32 (20.6 MB) did not come back from the device
    assert all(v.dtype == torch.float16 for v in load_file(str(weights)).values())
    model, meta = load_checkpoint(wide)
    assert (meta["model"]["hidden_size"], meta["model"]["depth"]) == (192, 6)
    assert count_parameters(model) > 4 * 1.2e6  # four times the built-in model
    assert (wide / "trainer_state.json").exists() and (tmp_path / "out" / "train.log").exists()
    with torch.no_grad():
        v = model(torch.randn(1, 8, 3, 32, 32), torch.rand(1, 8), model.encode_text(["a red circle moving left"]))
    assert v.shape == (1, 8, 3, 32, 32) and torch.isfinite(v).all()


def test_the_gpu_causal_run_brings_back_loadable_fp16_snapshots(tmp_path):
    """gpu_causal_train.sh's two phases: phase A's weights and phase B's snapshots in fp16, with the
    configs and logs in one archive, within the device tool's limits (8 files, 16 MiB each), each
    loadable beside its config and sampling."""
    import shutil
    import tarfile

    from safetensors.torch import load_file

    from streamstudio.models.video.causal_backbone import CausalWanBackbone
    from streamstudio.models.video.causal_checkpoint import load_causal_checkpoint
    from streamstudio.pipelines.video.causal_video import CausalConfig, CausalSampler

    run = run_script("gpu_causal_train.sh", tmp_path, BATCH="4", BUDGET_A="4", BUDGET_B="3", MINSTEPS_B="4", SNAPS="2")
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "out"
    files = sorted(p.name for p in out.iterdir())
    snaps = [f for f in files if f.startswith("causal_b")]
    assert "causal_a.safetensors" in files and "causal_logs.tgz" in files and len(snaps) == 2, files
    assert len(files) <= 8 and all((out / f).stat().st_size < 16 * 2**20 for f in files)
    with tarfile.open(out / "causal_logs.tgz") as tar:
        tar.extractall(tmp_path / "logs", filter="data")
    logs = tmp_path / "logs"
    assert (logs / "logs" / "train_a.log").exists() and (logs / "logs" / "train_b.log").exists()
    train_b = __import__("json").loads((logs / "bcfg" / "config.json").read_text())["train"]
    assert train_b["self_context"] == 0.5 and train_b["init"].endswith("run")
    for weights, config in (("causal_a.safetensors", logs / "a" / "config.json"),
                            (snaps[-1], logs / "bcfg" / "config.json")):
        folder = tmp_path / weights.split(".")[0]
        folder.mkdir()
        shutil.copy(out / weights, folder / "model.safetensors")
        shutil.copy(config, folder / "config.json")
        assert all(v.dtype == torch.float16 for v in load_file(str(folder / "model.safetensors")).values())
        causal = load_causal_checkpoint(folder)
        assert causal.model.cfg.patch_size == (1, 8, 8) and causal.model.cfg.dim == 256
        sampler = CausalSampler(CausalWanBackbone(causal.model, causal.text_encoder),
                                CausalConfig(chunk_frames=2, window=6, steps=(1000.0, 500.0)), (3, 32, 32),
                                "a red circle moving left")
        with torch.no_grad():
            chunk = sampler.chunk()
        assert chunk.shape == (2, 3, 32, 32) and torch.isfinite(chunk).all()
