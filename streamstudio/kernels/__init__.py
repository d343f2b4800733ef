"""Fast compute. Each op is one public function: the fused CUDA kernel (`csrc/stream_ops.cu`)
when it is built and the tensors are on a GPU, the pure-torch reference in `reference.py`
otherwise. The extension builds on the first call with CUDA tensors (see `cuda_build`); when
it cannot be built, one warning is printed and the reference runs from then on.

Kernel and reference compute the same formulas in float32; see each reference docstring.
Tensors that need gradients always take the reference (the kernels have no backward).
"""

from __future__ import annotations

from types import ModuleType

import torch

from streamstudio.kernels import cuda_build, reference
from streamstudio.kernels.reference import CFG_CODES, CFG_FULL, CFG_INITIALIZE, CFG_NONE, CFG_SELF

EXTENSION = "stream_ops"
SOURCES = ("stream_ops.cu", "stream_ops.cpp")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_COSINE_MAX_BLOCKS = 1024


def _ops(*tensors: torch.Tensor) -> ModuleType | None:
    """The extension when every tensor is on a CUDA device (and needs no grad), else None."""
    if not tensors or not all(t.is_cuda for t in tensors):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return cuda_build.load_extension(EXTENSION, SOURCES)


def fused_available() -> bool:
    """True when the CUDA extension is (or can be) built here and a GPU is visible."""
    if cuda_build.unavailable_reason() is not None:
        return False
    return cuda_build.load_extension(EXTENSION, SOURCES) is not None


def preprocess(frame: torch.Tensor, height: int, width: int, dtype: torch.dtype = torch.float32,
               bgr: bool = False) -> torch.Tensor:
    """uint8 (H, W, C) or (B, H, W, C), C = 3 or 4 (RGBA, composited on black) -> (B, 3, height,
    width) in [-1, 1]."""
    ops = _ops(frame)
    if ops is None or frame.dtype != torch.uint8 or dtype not in FLOAT_DTYPES or frame.shape[-1] not in (3, 4):
        return reference.preprocess(frame, height, width, dtype, bgr)
    frames = (frame.unsqueeze(0) if frame.dim() == 3 else frame).contiguous()  # (B, H, W, C)
    out = torch.empty((frames.shape[0], 3, height, width), device=frame.device, dtype=dtype)
    ops.preprocess(frames, out, bool(bgr))
    return out  # (B, 3, height, width)


def postprocess(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) in [-1, 1] -> uint8 (B, H, W, 3)."""
    ops = _ops(images)
    if ops is None or images.dtype not in FLOAT_DTYPES or images.dim() != 4 or images.shape[1] != 3:
        return reference.postprocess(images)
    images = images.contiguous()
    b, _, h, w = images.shape
    out = torch.empty((b, h, w, 3), device=images.device, dtype=torch.uint8)
    ops.postprocess(images, out)
    return out  # (B, H, W, 3)


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of two same-shaped tensors, flattened; float32 scalar."""
    ops = _ops(a, b)
    if ops is None or a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES or a.numel() != b.numel() \
            or a.device != b.device:
        return reference.cosine_similarity(a, b)
    partial = torch.empty(3 * _COSINE_MAX_BLOCKS, device=a.device, dtype=torch.float32)
    out = torch.empty(1, device=a.device, dtype=torch.float32)
    ops.cosine_similarity(a.contiguous(), b.contiguous(), partial, out)
    return out[0]  # ()


def stream_step(x_t, eps_text, eps_uncond, stock, noise_next, coef, guidance_scale, delta, cfg):
    """The Stream Batch step (RCFG combination, x0, re-noise, stock update); see reference.

    For cfg none / full, stock_next is `stock` in x_t's dtype (the same tensor when the dtype
    already matches, as the reference for float32).
    """
    used = [x_t, eps_text, stock, noise_next, coef] + ([eps_uncond] if cfg == CFG_FULL else [])
    ops = _ops(*used)
    if ops is None or x_t.dtype not in FLOAT_DTYPES or x_t.dim() < 1 or cfg not in CFG_CODES.values():
        return reference.stream_step(x_t, eps_text, eps_uncond, stock, noise_next, coef,
                                     guidance_scale, delta, cfg)
    dtype = x_t.dtype

    def like(t: torch.Tensor) -> torch.Tensor:  # same dtype and layout as x_t
        return t.to(dtype).contiguous().view(x_t.shape)

    x = x_t.contiguous()  # (B, C, h, w)
    text, noise, stock_in = like(eps_text), like(noise_next), like(stock)
    uncond = like(eps_uncond) if cfg == CFG_FULL else x
    coef32 = coef.to(torch.float32).contiguous().view(x.shape[0], 6)  # (B, 6)
    x0, x_next = torch.empty_like(x), torch.empty_like(x)
    uses_stock = cfg in (CFG_SELF, CFG_INITIALIZE)
    stock_next = torch.empty_like(x) if uses_stock else stock_in
    ops.stream_step(x, text, uncond, stock_in if uses_stock else x, noise, coef32, x0, x_next,
                    stock_next if uses_stock else x0, float(guidance_scale), float(delta), int(cfg))
    return x0, x_next, stock_next


__all__ = ["preprocess", "postprocess", "cosine_similarity", "stream_step", "fused_available", "CFG_CODES",
           "CFG_NONE", "CFG_SELF", "CFG_INITIALIZE", "CFG_FULL", "reference", "cuda_build"]
