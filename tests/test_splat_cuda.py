"""The CUDA splat rasteriser: nvcc compiles it cleanly here; on a GPU it matches the reference."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from streamstudio.kernels import splat_cuda
from streamstudio.kernels.splat import pick_impl, rasterize_gaussians

NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernel_compiles_without_register_spills(tmp_path, arch):
    proc = subprocess.run([NVCC, "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v", "-DSPLAT_KERNEL_ONLY",
                           str(splat_cuda.SOURCE), "-o", str(tmp_path / "splat.cubin")],
                          capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "splat_rasterize_forward" in log
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and all(n == 0 for n in spills), log
    assert "error" not in log.lower()


def test_cpu_tensors_take_the_fast_path():
    assert pick_impl("auto", torch.device("cpu")) in ("cpp", "fast")
    with pytest.raises(ValueError):
        pick_impl("warp-drive", torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_without_cuda_the_kernel_is_not_loaded_and_forcing_it_fails_clearly():
    splat_cuda.reset_for_tests()
    assert splat_cuda.load() is None
    with pytest.raises(RuntimeError, match="not available"):
        rasterize_gaussians(torch.zeros(1, 3), torch.tensor([[1.0, 0, 0, 0]]), torch.ones(1, 3), torch.ones(1),
                            torch.ones(1, 3), torch.eye(4), (10.0, 10.0, 4.0, 4.0), 8, 8, impl="cuda")


@pytest.mark.gpu
def test_cuda_matches_reference_on_gpu():
    g = torch.Generator().manual_seed(0)
    n = 3000
    means = torch.randn(n, 3, generator=g) * 0.7
    means[:, 2] += 3.0
    quats = torch.randn(n, 4, generator=g)
    scales = torch.exp(torch.randn(n, 3, generator=g) * 0.3 - 3.5)
    opac = torch.rand(n, generator=g)
    sh = torch.randn(n, 16, 3, generator=g) * 0.3
    args = dict(viewmat=torch.eye(4), intrinsics=(120.0, 120.0, 80.0, 60.0), width=160, height=120,
                background=torch.tensor([0.1, 0.2, 0.3]))
    ref = rasterize_gaussians(means, quats, scales, opac, sh, impl="fast", **args)
    cuda = rasterize_gaussians(means.cuda(), quats.cuda(), scales.cuda(), opac.cuda(), sh.cuda(), impl="cuda",
                               **{**args, "background": args["background"].cuda()})
    assert cuda.impl == "cuda"
    for name in ("rgb", "alpha", "depth"):
        diff = (getattr(cuda, name).cpu() - getattr(ref, name)).abs()
        assert float(diff.max()) < 2e-3 and float(diff.mean()) < 1e-5, name
