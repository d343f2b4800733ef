"""Call the CUDA splat rasterizer (`csrc/splat_rasterizer.cu`, binding in `.cpp`).

It is built on first use by the same machinery as the image pipeline's fused ops
(`cuda_build.load_extension`: torch's extension loader, cached on disk by the sources' hash);
`load()` returns None, with one warning, when it cannot be built, and callers use the
reference. Projection and tile binning run in torch on the GPU; the kernel blends the tiles.
"""

from __future__ import annotations

from types import ModuleType

import torch

from streamstudio.kernels import cuda_build
from streamstudio.kernels.splat_reference import TILE, bin_gaussians

EXTENSION = "splat_rasterizer"
SOURCES = ("splat_rasterizer.cu", "splat_rasterizer.cpp")
SOURCE = cuda_build.CSRC / SOURCES[0]


def load() -> ModuleType | None:
    """The compiled extension, or None (no GPU, no toolkit, or the build failed; warns once)."""
    if not torch.cuda.is_available():
        return None
    return cuda_build.load_extension(EXTENSION, SOURCES)


def rasterize_projected(means2d: torch.Tensor, conics: torch.Tensor, opacities: torch.Tensor, features: torch.Tensor,
                        depths: torch.Tensor, radii: torch.Tensor, width: int, height: int,
                        background: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as `splat_reference.rasterize_projected` (3 feature channels), on CUDA."""
    module = load()
    if module is None:
        reason = cuda_build.failure_reason(EXTENSION) or "no CUDA GPU is visible"
        raise RuntimeError(f"the CUDA splat rasterizer is not available ({reason})")
    if features.shape[1] != 3:
        raise ValueError("the CUDA rasterizer blends 3 colour channels")
    if means2d.shape[0] >= 2 ** 31:
        raise ValueError("too many Gaussians for 32-bit ids")
    gauss_ids, _, offsets = bin_gaussians(means2d, depths, radii, width, height, TILE, conics, opacities)
    feats = torch.cat([features.float(), depths[:, None].float()], 1).contiguous()  # (N, 4)
    bg = background if background is not None else torch.empty(0, device=means2d.device)
    out, trans = module.rasterize_forward(means2d.float().contiguous(), conics.float().contiguous(),
                                          opacities.float().contiguous(), feats, gauss_ids.int(), offsets.int(),
                                          bg.float(), int(width), int(height))
    return out[..., :3], out[..., 3], 1.0 - trans  # (H, W, 3), (H, W), (H, W)


def reset_for_tests() -> None:
    """Forget a previous load attempt (tests)."""
    cuda_build.forget(EXTENSION)
