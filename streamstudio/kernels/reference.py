"""Pure-torch references for every fused op (any device, any float dtype).

The fused CUDA kernels in `csrc/` must agree with these; the public functions in
`streamstudio.kernels` pick the kernel when it is built and the tensors are on a GPU,
and these otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CFG_NONE, CFG_SELF, CFG_INITIALIZE, CFG_FULL = 0, 1, 2, 3
CFG_CODES = {"none": CFG_NONE, "self": CFG_SELF, "initialize": CFG_INITIALIZE, "full": CFG_FULL}


def preprocess(
    frame: torch.Tensor, height: int, width: int, dtype: torch.dtype = torch.float32, bgr: bool = False
) -> torch.Tensor:
    """uint8 frame(s) (H, W, C) or (B, H, W, C), RGB or BGR -> (B, 3, height, width) in [-1, 1].

    C is 3, or 4: RGBA, composited on black first (c * (a / 255) in float32, no rounding).

    Resizing is bilinear with antialiasing when shrinking (half-pixel centres, as OpenCV).
    Precisely, per axis with s = in / out and r = max(s, 1): output i has centre
    c = s * (i + 0.5), taps j in [trunc(c - r + 0.5), trunc(c + r + 0.5)) clipped to the image,
    weights max(0, 1 - |j + 0.5 - c| / r) normalized to sum 1, applied separably in float32,
    then x / 127.5 - 1 and the cast to `dtype`. (With s <= 1 on both axes this is plain
    half-pixel bilinear with edge clamping, which F.interpolate computes for antialias=False.)
    The CUDA kernel computes this same filter; tests check both against a numpy version.
    """
    if frame.dim() == 3:
        frame = frame.unsqueeze(0)  # (1, H, W, 3)
    x = frame.permute(0, 3, 1, 2).float()  # (B, C, H, W) in [0, 255]
    if x.shape[1] == 4:
        x = x[:, :3] * (x[:, 3:4] / 255.0)  # composite on black, (B, 3, H, W)
    elif x.shape[1] != 3:
        raise ValueError(f"preprocess takes 3 or 4 channels, got {x.shape[1]}")
    if bgr:
        x = x.flip(1)
    if x.shape[-2:] != (height, width):
        shrink = x.shape[-2] > height or x.shape[-1] > width
        x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=shrink)
    return (x / 127.5 - 1.0).to(dtype)  # (B, 3, height, width)


def postprocess(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) in [-1, 1] -> uint8 (B, H, W, 3), clamped and rounded to nearest."""
    x = (images.float() + 1.0) * 127.5
    return x.clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of two tensors seen as flat vectors, as a float32 scalar tensor."""
    a = a.reshape(-1).float()
    b = b.reshape(-1).float()
    denom = (a.norm() * b.norm()).clamp_min(1e-12)
    return (a @ b) / denom


def stream_step(
    x_t: torch.Tensor,
    eps_text: torch.Tensor,
    eps_uncond: torch.Tensor | None,
    stock: torch.Tensor,
    noise_next: torch.Tensor,
    coef: torch.Tensor,
    guidance_scale: float,
    delta: float,
    cfg: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Stream Batch step for every row of the buffer.

    x_t, eps_text, stock, noise_next: (B, C, h, w); eps_uncond: (B, C, h, w) for full CFG.
    coef: (B, 6) per row: alpha, beta (sqrt of abar and of 1 - abar at the row's t),
    c_skip, c_out (the LCM boundary scalings; 0 and 1 give sd-turbo's x0 = F), and
    alpha_next, beta_next of the row's next level (1, 1 for the last slot).
    Returns x0 (the denoised prediction), x_next (x0 re-noised with noise_next to the
    next level) and stock_next (the residual-CFG stock noise the next level uses):

        eps        = delta * stock + guidance * (eps_text - delta * stock)   (self / initialize)
        step(z)    = c_out * (z - beta * eps) / alpha + c_skip * z
        x0         = step(x_t)
        x_next     = alpha_next * x0 + beta_next * noise_next
        stock_next = noise_next + alpha_next / beta_next * step(beta * stock)

    as StreamDiffusion's `unet_step` (`scaled_noise = beta_prod_t_sqrt * stock_noise`); for
    none / full, stock_next is stock.
    """
    c = coef.to(torch.float32).view(-1, 6, 1, 1, 1)
    alpha, beta, c_skip, c_out, alpha_next, beta_next = c.unbind(1)  # each (B, 1, 1, 1)
    x = x_t.float()
    text = eps_text.float()
    if cfg == CFG_FULL:
        if eps_uncond is None:
            raise ValueError("full CFG needs eps_uncond")
        uncond = eps_uncond.float()
    elif cfg in (CFG_SELF, CFG_INITIALIZE):
        uncond = delta * stock.float()
    if cfg == CFG_NONE:
        eps = text
    else:
        eps = uncond + guidance_scale * (text - uncond)
    x0 = c_out * ((x - beta * eps) / alpha) + c_skip * x
    x_next = alpha_next * x0 + beta_next * noise_next.float()
    if cfg in (CFG_SELF, CFG_INITIALIZE):
        # The reference implementation's unet_step: scaled_noise = beta * stock_noise goes through
        # the same step; the virtual residual noise comes from the stock, not from x_t.
        scaled = beta * stock.float()
        delta_x = c_out * ((scaled - beta * eps) / alpha) + c_skip * scaled
        stock_next = noise_next.float() + alpha_next / beta_next * delta_x
    else:
        stock_next = stock.float()
    dtype = x_t.dtype
    return x0.to(dtype), x_next.to(dtype), stock_next.to(dtype)
