"""Test data shared by several test files (imported as `helpers`; pytest puts tests/ on the path)."""

from __future__ import annotations

import numpy as np
import torch


def half_points(step: int = 7) -> np.ndarray:
    """float32 inputs v with fl(fl(v + 1) * 127.5) exactly k + 0.5, for k = 0, step, 2 step...
    below 255: the rounding ties of postprocess."""
    found = []
    for k in range(0, 255, step):
        v = np.float32((k + 0.5) / 127.5 - 1.0)
        for _ in range(64):
            y = (v + np.float32(1.0)) * np.float32(127.5)
            if y == k + 0.5:
                found.append(v)
                break
            v = np.nextafter(v, np.float32(np.inf) if y < k + 0.5 else np.float32(-np.inf), dtype=np.float32)
    return np.array(found, dtype=np.float32)


def random_gaussians(n: int, seed: int = 0, spread: float = 0.6, log_scale: float = -2.5, dtype=torch.float64,
                     sh_k: int = 0):
    """n random Gaussians in front of an identity camera: (means, quats, scales, opacities,
    colours), colours RGB (n, 3) in [0, 1] or, with sh_k > 0, SH coefficients (n, sh_k, 3)."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g, dtype=dtype) * spread
    means[:, 2] += 3.0
    quats = torch.randn(n, 4, generator=g, dtype=dtype)
    scales = torch.exp(log_scale + 0.4 * torch.randn(n, 3, generator=g, dtype=dtype))
    opac = torch.rand(n, generator=g, dtype=dtype) * 0.95 + 0.02
    if sh_k:
        colors = torch.randn(n, sh_k, 3, generator=g, dtype=dtype) * 0.3
    else:
        colors = torch.rand(n, 3, generator=g, dtype=dtype)
    return means, quats, scales, opac, colors
