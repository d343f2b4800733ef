"""The one public entry of the Gaussian-splatting renderer: `rasterize_gaussians`.

`impl="auto"` takes the CUDA kernel when it is built and the tensors are on a GPU, the fast
CPU path for CPU tensors (the C++ renderer of `splat_cpu` when it builds, else the vectorised
torch path), and the pure-torch reference on any other device. `impl=` may force
"reference", "cpp" (the C++ CPU renderer), "fast" (the vectorised torch path), "fast_compiled"
(the fast path with its inner step through torch.compile: a first call of ~20-40 s, then
~1.2-1.5x) or "cuda". See `splat_reference` for the conventions (camera, pixel
centres, blending rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from streamstudio.kernels import splat_fast, splat_reference
from streamstudio.kernels.splat_reference import (CAMERA_MODELS, antialias_compensation, project_gaussians,
                                                  quat_scale_to_covar, sh_colors)
from streamstudio.kernels import splat_cpu
from streamstudio.kernels import splat_cuda

IMPLS = ("auto", "reference", "cpp", "fast", "fast_compiled", "cuda")


@dataclass
class SplatRender:
    """What one rasterisation gives back (float32 tensors on the input device)."""

    rgb: torch.Tensor  # (H, W, 3) in [0, 1] (not clamped; SH colours may exceed 1)
    depth: torch.Tensor  # (H, W) sum of blend weight x camera depth: gsplat's "D" (accumulated depth)
    alpha: torch.Tensor  # (H, W) 1 - final transmittance
    n_visible: int  # Gaussians that survived culling
    impl: str  # which implementation ran

    @property
    def expected_depth(self) -> torch.Tensor:
        """(H, W) gsplat's "ED": depth / alpha (alpha clamped at 1e-10, so 0 where nothing is drawn)."""
        return self.depth / self.alpha.clamp_min(1e-10)


def pick_impl(impl: str, device: torch.device) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown splat implementation {impl!r}; use one of {IMPLS}")
    if impl != "auto":
        return impl
    if device.type == "cuda":
        return "cuda" if splat_cuda.load() is not None else "reference"
    if device.type == "cpu":
        return "cpp" if splat_cpu.load() is not None else "fast"
    return "reference"


def _check(means: torch.Tensor, opacities: torch.Tensor, sh_or_colors: torch.Tensor, viewmat: torch.Tensor,
           width: int, height: int) -> None:
    n = means.shape[0]
    if means.dim() != 2 or means.shape[1] != 3:
        raise ValueError(f"means must be (N, 3), got {tuple(means.shape)}")
    if opacities.shape != (n,):
        raise ValueError(f"opacities must be (N,), got {tuple(opacities.shape)}")
    if sh_or_colors.shape[0] != n or sh_or_colors.shape[-1] != 3:
        raise ValueError(f"colours must be (N, 3) or SH (N, K, 3), got {tuple(sh_or_colors.shape)}")
    if viewmat.shape != (4, 4):
        raise ValueError(f"viewmat must be (4, 4), got {tuple(viewmat.shape)}")
    if width < 1 or height < 1 or width * height > 8192 * 8192:
        raise ValueError(f"bad image size {width}x{height}")


def rasterize_gaussians(means: torch.Tensor, quats: torch.Tensor | None, scales: torch.Tensor | None,
                        opacities: torch.Tensor, colors: torch.Tensor, viewmat: torch.Tensor,
                        intrinsics: tuple[float, float, float, float], width: int, height: int,
                        sh_degree: int | None = None, background: torch.Tensor | None = None,
                        covars: torch.Tensor | None = None, near: float = 0.01, far: float = 1e10,
                        impl: str = "auto", antialiased: bool = False, camera_model: str = "pinhole") -> SplatRender:
    """Render Gaussians to an image.

    means (N, 3); quats (N, 4) w first and linear scales (N, 3), or covars (N, 3, 3);
    opacities (N,) in [0, 1]; colors (N, 3) RGB, or SH (N, K, 3) evaluated up to `sh_degree`
    (default: all of K); viewmat (4, 4) world -> camera (OpenCV axes); intrinsics
    (fx, fy, cx, cy) in pixels; background (3,) RGB added with the final transmittance.
    `antialiased`: gsplat's rasterize_mode="antialiased", each opacity times
    sqrt(det(S) / det(S + 0.3 I)) of its projected covariance S (Mip-Splatting's 2D filter), for
    scenes trained in that mode. `camera_model`: "pinhole" (fx, fy focal lengths in pixels),
    "ortho" (fx, fy pixels per world unit) or "fisheye" (equidistant, r = f theta), with
    gsplat's projections and Jacobians (`splat_reference.project_points`).
    """
    _check(means, opacities, colors, viewmat, width, height)
    if camera_model not in CAMERA_MODELS:
        raise ValueError(f"unknown camera model {camera_model!r}; use one of {CAMERA_MODELS}")
    device = means.device
    chosen = pick_impl(impl, device)
    if chosen == "cpp":  # the whole frame (projection, SH, binning, blending) in C++
        rgb, depth, alpha, n_visible = splat_cpu.render(means, quats, scales, opacities, colors, viewmat, intrinsics,
                                                        width, height, sh_degree, background, covars, near, far,
                                                        antialiased=antialiased, camera_model=camera_model)
        return SplatRender(rgb=rgb.float(), depth=depth.float(), alpha=alpha.float(), n_visible=n_visible,
                           impl=chosen)
    dtype = torch.float64 if means.dtype == torch.float64 else torch.float32
    means, opacities, viewmat = means.to(dtype), opacities.to(dtype), viewmat.to(device, dtype)
    if covars is None:
        if quats is None or scales is None:
            raise ValueError("give quats and scales, or covars")
        covars = quat_scale_to_covar(quats.to(dtype), scales.to(dtype))  # (N, 3, 3)
    if colors.dim() == 3:
        degree = colors.shape[1] if sh_degree is None else sh_degree
        colors = sh_colors(colors.to(dtype), means, viewmat, min(degree, 3))  # (N, 3)
    fx, fy, cx, cy = (float(v) for v in intrinsics)
    means2d, conics, depths, radii, cov2d = project_gaussians(means, covars.to(dtype), opacities, viewmat,
                                                              fx, fy, cx, cy, width, height, near, far, antialiased,
                                                              camera_model)
    if antialiased:  # the opacities the radii were sized for
        opacities = opacities * antialias_compensation(cov2d)
    bg = None if background is None else torch.as_tensor(background, dtype=dtype, device=device)
    args = (means2d, conics, opacities, colors.to(dtype), depths, radii, width, height, bg)
    if chosen == "cuda":
        rgb, depth, alpha = splat_cuda.rasterize_projected(*args)
    elif chosen in ("fast", "fast_compiled"):
        if device.type != "cpu":
            raise ValueError("the fast splat path runs on CPU tensors; use impl='auto' or 'reference'")
        rgb, depth, alpha = splat_fast.rasterize_projected(*args, compile=chosen == "fast_compiled")
    else:
        rgb, depth, alpha = splat_reference.rasterize_projected(*args)
    return SplatRender(rgb=rgb.float(), depth=depth.float(), alpha=alpha.float(),
                       n_visible=int((radii[:, 0] > 0).sum()), impl=chosen)


render = rasterize_gaussians

__all__ = ["rasterize_gaussians", "render", "SplatRender", "pick_impl", "IMPLS", "CAMERA_MODELS"]
