"""benchmarks/kernel_ops.py on the CPU: the sizes it times on a GPU, its CPU run and its JSON.

Its GPU path (CUDA graphs, events, the L2 size, the fused rows) runs on the CPU with faked
torch.cuda functions in tests/acceleration/test_gpu_branches.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
H100_L2 = 50 * 2**20


@pytest.fixture(scope="module")
def bench():
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    key = "_bench_kernel_ops"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / "kernel_ops.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def test_every_op_moves_four_times_an_h100_l2_at_gpu_sizes(bench):
    cases = bench.op_cases(torch.device("meta"), True)  # GPU sizes, fp16, nothing allocated
    names = [c.op for c in cases]
    for want in ("preprocess resize 1080x1920->512", "preprocess same size 1080x1920", "postprocess 1080x1920",
                 "stream_step no CFG", "stream_step self-CFG", "stream_step full CFG", "cosine similarity"):
        assert want in names
    for c in cases:
        assert c.nbytes >= 4 * H100_L2, (c.op, c.nbytes)
    by = {c.op: c for c in cases}
    # 32 1080p RGB frames in, 32 fp16 512x512 images out
    assert by["preprocess resize 1080x1920->512"].read == 32 * 1080 * 1920 * 3
    assert by["preprocess resize 1080x1920->512"].written == 32 * 3 * 512 * 512 * 2
    # self-CFG: x, eps_text, stock, noise (+ coef) in; x0, x_next, stock_next out; 2048 rows of 4x64x64 fp16
    row = 4 * 64 * 64 * 2
    assert by["stream_step self-CFG"].read == 2048 * (4 * row + 6 * 4)
    assert by["stream_step self-CFG"].written == 2048 * 3 * row
    assert by["cosine similarity"].read == 2 * (64 << 20) * 2
    assert bench.GPU_COPY_BYTES == 1 << 30


def test_cpu_run_records_the_gpu_figures_as_missing(bench, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "CPU_SIZES", bench.Sizes(cam=(12, 20), size=8, resize_batch=1, frame_batch=1,
                                                        rows=2, latent=(4, 2, 4), cosine=64))
    monkeypatch.setattr(bench, "CPU_COPY_BYTES", 1 << 16)
    out = tmp_path / "kernels.json"
    assert bench.main(["--device", "cpu", "--quick", "--no-pipeline", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"].startswith("CPU") and result["cuda"] == torch.version.cuda
    assert "no CUDA GPU in this run" in result["gpu"]["missing"]
    assert result["cpu"] == {k: v for k, v in result.items() if k not in ("gpu", "cpu")}
    assert any(n.startswith("GPU figures missing") for n in result["notes"])
    for r in result["ops"]:
        assert r["eager_us"] > 0 and r["eager_GBps"] > 0 and r["fused_us"] is None and r["meets_target"] is None
        assert r["timing"] == "2 back-to-back calls, median of 3"
    table = capsys.readouterr().out
    assert "floor %" in table and "cosine similarity" in table

    # a GPU run recorded before is kept by a later CPU run (and a CPU run by a later GPU run)
    gpu_run = {"device": "NVIDIA H100 80GB HBM3", "ops": [{"op": "cosine similarity", "floor_pct": 80.0}]}
    out.write_text(json.dumps(gpu_run))  # the older one-run format
    assert bench.main(["--device", "cpu", "--quick", "--no-pipeline", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["gpu"] == gpu_run and result["cpu"]["device"].startswith("CPU")
    assert bench.main(["--device", "cpu", "--quick", "--no-pipeline", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["gpu"] == gpu_run


def test_json_written_before_the_pipeline_runs(bench, monkeypatch, tmp_path):
    """A run killed in the pipeline part (the GPU session's time limit) leaves the op figures."""
    monkeypatch.setattr(bench, "CPU_SIZES", bench.Sizes(cam=(12, 20), size=8, resize_batch=1, frame_batch=1,
                                                        rows=2, latent=(4, 2, 4), cosine=64))
    monkeypatch.setattr(bench, "CPU_COPY_BYTES", 1 << 16)
    out = tmp_path / "kernels.json"

    def killed(device, quick, on_row=None):
        on_row([{"mode": "eager", "model": "m", "fps": 1.0}])
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "bench_pipeline", killed)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--device", "cpu", "--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["ops"]) >= 7 and result["pipeline"] == [{"mode": "eager", "model": "m", "fps": 1.0}]


def test_an_op_that_fails_is_recorded_and_the_others_measured(bench, monkeypatch):
    monkeypatch.setattr(bench, "CPU_SIZES", bench.Sizes(cam=(12, 20), size=8, resize_batch=1, frame_batch=1,
                                                        rows=2, latent=(4, 2, 4), cosine=64))
    real = bench.op_cases

    def cases(device, gpu, sizes=None):
        out = real(device, gpu, sizes)

        def oom():
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")

        out[0].eager = oom
        return out

    monkeypatch.setattr(bench, "op_cases", cases)
    rows = bench.bench_ops(torch.device("cpu"), quick=True, bandwidth=1e9)
    assert rows[0]["error"] == "eager: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert rows[0]["eager_us"] is None and rows[0]["eager_floor_pct"] is None
    assert all("error" not in r and r["eager_us"] > 0 for r in rows[1:])
    bench.print_table(rows, [], 1e9)  # prints a row without figures
