"""Build (once, cached by torch's extension cache) and call the CUDA splat rasteriser.

`load()` compiles `csrc/splat_rasterizer.cu` with torch.utils.cpp_extension.load the first time
it is asked for on a machine with CUDA, and returns None, with one warning, when it cannot be
built; callers then fall back to the reference. Projection and tile binning run in torch on the
GPU; the kernel does the per-tile blending.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import torch

from streamstudio.kernels.splat_reference import TILE, bin_gaussians

SOURCE = Path(__file__).resolve().parent / "csrc" / "splat_rasterizer.cu"
EXTENSION_NAME = "streamstudio_splat_rasterizer"
_lock = threading.Lock()
_state: dict = {"module": None, "tried": False}


def nvcc_flags() -> list[str]:
    return ["-O3"]  # torch adds its own -std (c++20 in torch 2.13)


def load(verbose: bool = False):
    """The compiled extension module, or None (CUDA missing or build failed; warns once)."""
    with _lock:
        if _state["tried"]:
            return _state["module"]
        _state["tried"] = True
        if not torch.cuda.is_available():
            return None
        try:
            from torch.utils.cpp_extension import load as load_extension

            _state["module"] = load_extension(name=EXTENSION_NAME, sources=[str(SOURCE)],
                                              extra_cuda_cflags=nvcc_flags(), verbose=verbose)
        except Exception as exc:  # noqa: BLE001 - any build failure means: use the reference
            warnings.warn(f"CUDA splat rasteriser could not be built ({type(exc).__name__}: {exc}); "
                          f"using the pure-torch reference on the GPU", RuntimeWarning, stacklevel=2)
            _state["module"] = None
        return _state["module"]


def rasterize_projected(means2d, conics, opacities, features, depths, radii, width: int, height: int,
                        background: torch.Tensor | None = None):
    """Same contract as `splat_reference.rasterize_projected` (3 feature channels), on CUDA."""
    module = load()
    if module is None:
        raise RuntimeError("the CUDA splat rasteriser is not available (no GPU, or it failed to build)")
    if features.shape[1] != 3:
        raise ValueError("the CUDA rasteriser blends 3 colour channels")
    if means2d.shape[0] >= 2 ** 31:
        raise ValueError("too many Gaussians for 32-bit ids")
    gauss_ids, _, offsets = bin_gaussians(means2d, depths, radii, width, height, TILE, conics, opacities)
    feats = torch.cat([features.float(), depths[:, None].float()], 1).contiguous()  # (N, 4)
    bg = background if background is not None else torch.empty(0, device=means2d.device)
    out, trans = module.rasterize_forward(means2d.float().contiguous(), conics.float().contiguous(),
                                          opacities.float().contiguous(), feats, gauss_ids.int(), offsets.int(),
                                          bg.float(), int(width), int(height))
    return out[..., :3], out[..., 3], 1.0 - trans


def reset_for_tests() -> None:
    """Forget a previous load attempt (tests)."""
    with _lock:
        _state.update(module=None, tried=False)

