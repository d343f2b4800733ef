"""benchmarks/gpu_video_train.sh (one GPU call for issue 30's wider video model) runs end to end
on the CPU with tiny knobs, and what it leaves in $OUT is what the device tool brings back: fp16
weights of the wider model under 20 MB that load and sample."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_video_train.sh"


def test_the_gpu_video_run_brings_back_loadable_fp16_weights(tmp_path):
    from safetensors.torch import load_file

    from streamstudio.models.video.stream_dit import count_parameters, load_checkpoint

    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "BUDGET": "4",
           "BATCH": "2", "WORKERS": "1", "PROBE": "2", "MINSTEPS": "3",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
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
