"""Measures of what an image pipeline kept and changed, on uint8 (H, W, 3) pictures: the
structure (Sobel edge correlation, SSIM, PSNR), the colour (redness, blueness, saturation) and
baselines to judge them by (a Gaussian blur, bicubic down and up). Used by the built-in model's
tests and `benchmarks/image_quality.py`.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter

LUMA = np.array([0.299, 0.587, 0.114])


def luma(img: np.ndarray) -> np.ndarray:
    """(H, W) luminance in [0, 1] (Rec. 601 weights)."""
    return img.astype(np.float64) @ LUMA / 255.0


def _block_means(y: np.ndarray, block: int) -> np.ndarray:
    h, w = (y.shape[0] // block) * block, (y.shape[1] // block) * block
    return y[:h, :w].reshape(h // block, block, w // block, block).mean((1, 3))


def sobel(y: np.ndarray) -> np.ndarray:
    """Gradient magnitude of a (H, W) image by the 3x3 Sobel operator, edges replicated."""
    p = np.pad(y, 1, mode="edge")
    gx = (p[:-2, 2:] + 2 * p[1:-1, 2:] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[1:-1, :-2] + p[2:, :-2])
    gy = (p[2:, :-2] + 2 * p[2:, 1:-1] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[:-2, 1:-1] + p[:-2, 2:])
    return np.hypot(gx, gy)


def edge_correlation(a: np.ndarray, b: np.ndarray, block: int = 1) -> float:
    """Pearson correlation of two pictures' Sobel edge maps (luminance; after means over
    block x block pixels when block > 1): 1 = the same edges, about 0 for unrelated pictures."""
    ya, yb = luma(a), luma(b)
    if block > 1:
        ya, yb = _block_means(ya, block), _block_means(yb, block)
    return float(np.corrcoef(sobel(ya).ravel(), sobel(yb).ravel())[0, 1])


def ssim(a: np.ndarray, b: np.ndarray, win: int = 8) -> float:
    """Mean SSIM of the luminance over non-overlapping win x win windows (constants of Wang et al.)."""
    x, y = luma(a), luma(b)
    h, w = (x.shape[0] // win) * win, (x.shape[1] // win) * win
    xs = x[:h, :w].reshape(h // win, win, w // win, win).transpose(0, 2, 1, 3).reshape(-1, win * win)
    ys = y[:h, :w].reshape(h // win, win, w // win, win).transpose(0, 2, 1, 3).reshape(-1, win * win)
    mx, my = xs.mean(1), ys.mean(1)
    vx, vy = xs.var(1), ys.var(1)
    cov = ((xs - mx[:, None]) * (ys - my[:, None])).mean(1)
    c1, c2 = 0.01**2, 0.03**2
    return float((((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))).mean())


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 pictures over all channels."""
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def redness(img: np.ndarray) -> float:
    f = img.astype(np.float64) / 255.0
    return float((f[..., 0] - (f[..., 1] + f[..., 2]) / 2).mean())


def blueness(img: np.ndarray) -> float:
    f = img.astype(np.float64) / 255.0
    return float((f[..., 2] - (f[..., 0] + f[..., 1]) / 2).mean())


def saturation(img: np.ndarray) -> float:
    """Mean of max - min over the channels (0 for a grey picture)."""
    f = img.astype(np.float64) / 255.0
    return float((f.max(-1) - f.min(-1)).mean())


def gaussian_blur(img: np.ndarray, sigma: float) -> np.ndarray:
    """The picture blurred by a Gaussian of `sigma` pixels (edges replicated), uint8."""
    pad = int(3 * sigma) + 1
    big = np.pad(img, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    out = np.asarray(Image.fromarray(big).filter(ImageFilter.GaussianBlur(sigma)))
    return out[pad:-pad, pad:-pad].copy()


def bicubic_down_up(img: np.ndarray, factor: int = 4) -> np.ndarray:
    """Bicubic down by `factor` and back up: the baseline an autoencoder of that compression beats."""
    h, w = img.shape[:2]
    small = Image.fromarray(img).resize((w // factor, h // factor), Image.Resampling.BICUBIC)
    return np.asarray(small.resize((w, h), Image.Resampling.BICUBIC)).copy()


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference in [0, 1] units."""
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean() / 255.0)
