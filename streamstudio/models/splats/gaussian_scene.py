"""A Gaussian-splat scene in memory (`GaussianScene`: 3DGS fields, optional 4D time fields)
and what every scene format's reader checks it against (finite values, the memory a scene of N
Gaussians takes), shared by `gaussians.py` (the formats and their dispatch) and the format modules
beside it (`gaussians_4dgs.py`, `gaussians_ksplat.py`), which import this, not `gaussians.py`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from streamstudio.errors import StreamStudioError


SH_C0 = 0.28209479177387814

BYTES_PER_GAUSSIAN_IN_MEMORY = 4 * (3 + 4 + 3 + 1 + 48 + 9)  # float32 fields once loaded, with covariances

@dataclass
class GaussianScene:
    """A 3D (or 4D) Gaussian scene, in the raw parameters of the 3DGS files.

    `covars`, when set (a 4D time slice), replaces quats and log_scales as the 3D covariance.
    """

    means: torch.Tensor  # (N, 3) world positions
    quats: torch.Tensor  # (N, 4) rotation quaternions, w first, not necessarily normalised
    log_scales: torch.Tensor  # (N, 3) log standard deviations
    opacity_logits: torch.Tensor  # (N,) logit of the opacity
    sh: torch.Tensor  # (N, K, 3) SH coefficients, K = (degree + 1)^2, sh[:, 0] the DC term
    t_centers: torch.Tensor | None = None  # (N,) 4D only: time centre
    t_log_scales: torch.Tensor | None = None  # (N,) 4D only: log time standard deviation
    quats_r: torch.Tensor | None = None  # (N, 4) 4D only: right quaternion of the 4D rotation
    covars: torch.Tensor | None = None  # (N, 3, 3) explicit 3D covariance (time slices)
    opacity_scale: torch.Tensor | None = None  # (N,) time-slice marginal multiplying the opacity
    antialiased: bool = False  # trained with gsplat's "antialiased" mode (Mip-Splatting's 2D filter)

    def __len__(self) -> int:
        return int(self.means.shape[0])

    @property
    def sh_degree(self) -> int:
        return int(round(math.sqrt(self.sh.shape[1]))) - 1

    @property
    def is_4d(self) -> bool:
        return self.t_centers is not None

    @property
    def time_range(self) -> tuple[float, float]:
        """(earliest, latest) time a Gaussian is centred at; (0, 0) for a 3D scene."""
        t = self.t_centers
        if t is None or len(self) == 0:  # (not is_4d, or empty)
            return (0.0, 0.0)
        return (float(t.min()), float(t.max()))

    def opacities(self) -> torch.Tensor:
        """(N,) activated opacity in [0, 1] (times the time marginal for a slice)."""
        o = torch.sigmoid(self.opacity_logits)
        return o if self.opacity_scale is None else o * self.opacity_scale

    def scales(self) -> torch.Tensor:
        return torch.exp(self.log_scales)  # (N, 3)

    def bounds(self, quantile: float = 0.02) -> tuple[torch.Tensor, torch.Tensor]:
        """Robust axis-aligned bounds (lo, hi) of the means, ignoring the outer quantiles."""
        if len(self) == 0:
            return torch.zeros(3), torch.zeros(3)
        m = self.means.float()
        return torch.quantile(m, quantile, dim=0), torch.quantile(m, 1 - quantile, dim=0)

    def subset(self, mask: torch.Tensor) -> "GaussianScene":
        """The Gaussians where `mask` (N,) is true (or the given indices)."""
        pick: dict[str, Any] = {k: (None if v is None else v[mask]) for k, v in self._fields().items()}
        return GaussianScene(**pick, antialiased=self.antialiased)

    def _fields(self) -> dict:
        return {k: getattr(self, k) for k in ("means", "quats", "log_scales", "opacity_logits", "sh",
                                               "t_centers", "t_log_scales", "quats_r", "covars",
                                               "opacity_scale")}

def _err(path, what: str) -> StreamStudioError:
    return StreamStudioError(f"{path}: {what}")

def _check_memory(path, n: int, max_gaussians: int | None) -> None:
    if max_gaussians is not None and n > max_gaussians:
        raise _err(path, f"{n} Gaussians is more than the limit of {max_gaussians}")
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    need = n * BYTES_PER_GAUSSIAN_IN_MEMORY * 3  # the file, the tensors and the renderer's copies
    if need > available:
        raise _err(path, f"{n} Gaussians need about {need / 2**30:.1f} GiB but only "
                         f"{available / 2**30:.1f} GiB of memory is free; use a smaller scene")

OPACITY_LOGIT_LIMIT = 20.0  # sigmoid(+-20) is 0 or 1 to 9 digits


def _check_finite(path, scene: GaussianScene) -> None:
    """NaN anywhere, or an infinite value but an opacity logit, is a corrupt file. Infinite opacity
    logits are fully opaque (+inf) or transparent (-inf) Gaussians, as splat-transform writes them
    (log(a / (1 - a)) of alpha 1 or 0, also decompressing SuperSplat's compressed .ply): clamped."""
    logits = scene.opacity_logits
    if torch.isinf(logits).any():
        scene.opacity_logits = logits.clamp(-OPACITY_LOGIT_LIMIT, OPACITY_LOGIT_LIMIT)
    for name, value in scene._fields().items():
        if value is not None and not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).reshape(len(scene), -1).any(dim=1).sum())
            raise _err(path, f"{bad} Gaussians have NaN or infinite {name}; the file is corrupt")
    if len(scene) and (scene.quats.norm(dim=-1) == 0).any():
        raise _err(path, "some rotation quaternions are all zero; the file is corrupt")

def rotation_4d(quats_l: torch.Tensor, quats_r: torch.Tensor) -> torch.Tensor:
    """(N, 4), (N, 4) left and right quaternions (w first) -> (N, 4, 4) rotation over (x, y, z, t)."""
    a, b, c, d = torch.nn.functional.normalize(quats_l, dim=-1).unbind(-1)
    p, q, r, s = torch.nn.functional.normalize(quats_r, dim=-1).unbind(-1)
    m_l = torch.stack([a, -b, -c, -d, b, a, -d, c, c, d, a, -b, d, -c, b, a], -1).reshape(-1, 4, 4)
    m_r = torch.stack([p, q, r, s, -q, p, -s, r, -r, s, p, -q, -s, -r, q, p], -1).reshape(-1, 4, 4)
    return m_l @ m_r  # (N, 4, 4)
