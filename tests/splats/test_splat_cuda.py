"""The CUDA splat rasterizer: dispatch and its no-GPU behaviour here; on a GPU it matches the reference.
Its nvcc and binding compile checks are those of every csrc/ file, in test_kernels_ops.py."""

from __future__ import annotations

import warnings

import pytest
import torch

from streamstudio.kernels import splat_cuda
from streamstudio.kernels.splat import pick_impl, rasterize_gaussians


def test_cpu_tensors_take_the_fast_path():
    assert pick_impl("auto", torch.device("cpu")) in ("cpp", "fast")
    with pytest.raises(ValueError):
        pick_impl("warp-drive", torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_without_cuda_the_kernel_is_not_loaded_and_forcing_it_fails_clearly():
    splat_cuda.reset_for_tests()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no GPU: None, quietly
        assert splat_cuda.load() is None
    with pytest.raises(RuntimeError, match="not available"):
        rasterize_gaussians(torch.zeros(1, 3), torch.tensor([[1.0, 0, 0, 0]]), torch.ones(1, 3), torch.ones(1),
                            torch.ones(1, 3), torch.eye(4), (10.0, 10.0, 4.0, 4.0), 8, 8, impl="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("n,width,height", [(3000, 160, 120), (40000, 161, 119), (1, 17, 9)])
def test_cuda_matches_reference_on_gpu(n, width, height):
    """Fresh random scenes each run; odd image sizes (partial tiles) and tiles with more
    Gaussians than one shared-memory batch (256)."""
    seed = int(torch.randint(0, 2 ** 31 - 1, ()))
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g) * 0.7
    means[:, 2] += 3.0
    quats = torch.randn(n, 4, generator=g)
    scales = torch.exp(torch.randn(n, 3, generator=g) * 0.3 - 3.5)
    opac = torch.rand(n, generator=g)
    sh = torch.randn(n, 16, 3, generator=g) * 0.3
    args = dict(viewmat=torch.eye(4), intrinsics=(0.75 * width, 0.75 * width, width / 2, height / 2), width=width,
                height=height, background=torch.tensor([0.1, 0.2, 0.3]))
    ref = rasterize_gaussians(means, quats, scales, opac, sh, impl="fast", **args)
    cuda = rasterize_gaussians(means.cuda(), quats.cuda(), scales.cuda(), opac.cuda(), sh.cuda(), impl="cuda",
                               **{**args, "background": args["background"].cuda()})
    assert cuda.impl == "cuda"
    for name in ("rgb", "alpha", "depth"):
        diff = (getattr(cuda, name).cpu() - getattr(ref, name)).abs()
        assert float(diff.max()) < 2e-3 and float(diff.mean()) < 1e-5, f"{name} (seed {seed})"
