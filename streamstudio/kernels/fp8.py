"""FP8 matrix products (issue 45): float8 e4m3 operands with one scale per row, as the UNet's
linear and 1x1 layers run them on Hopper (`models/image/fp8.py`).

`quantize_rows(x)` gives each row of x its own scale, amax / 448 (448 is e4m3's largest finite
value), and the row divided by it in float8_e4m3fn. `fp8_linear(x8, sx, w8, sw, bias)` is
`(x8 * sx) @ (w8 * sw).T + bias`: `torch._scaled_mm` with row-wise scales (cuBLASLt's FP8 GEMM
on a GPU of compute capability 8.9 or more, Ada and Hopper; torch's own on the CPU), whose
operands need both sides a multiple of 16 (and, on a GPU, the first row-major), so rows are
padded with zeros to one and cut off after; on a GPU the product comes out in bfloat16
(row-wise scaling's output there).
`fp8_linear_reference` computes the same product from the dequantized operands in float32: the
kernel accumulates in float32 too, so the two differ by rounding only (tests compare them).
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
ALIGN = 16  # _scaled_mm: every side of both operands a multiple of this
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9) and Hopper (9.0)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (x8 (M, K) float8_e4m3fn, scale (M, 1) float32): x ~= x8 * scale, row by row."""
    amax = x.detach().abs().amax(dim=1, keepdim=True).float()  # (M, 1)
    scale = torch.clamp(amax, min=1e-12) / E4M3_MAX
    x8 = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return x8, scale


def supported(device: torch.device) -> bool:
    """Whether `torch._scaled_mm` runs FP8 on `device`: the CPU, or a GPU of capability 8.9+."""
    if device.type == "cpu":
        return True
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


def fp8_linear(x8: torch.Tensor, sx: torch.Tensor, w8: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None,
               out_dtype: torch.dtype, mm_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x8 (M, K), sx (M, 1), w8 (N, K), sw (N, 1), bias (N,) or None -> (M, N) in `out_dtype`.
    `mm_dtype`: the product's own output dtype (None: bfloat16 on a GPU, where cuBLASLt's row-wise
    scaled FP8 GEMM gives bfloat16 only; `out_dtype` on the CPU), cast to `out_dtype` after."""
    if mm_dtype is None:
        mm_dtype = torch.bfloat16 if x8.is_cuda else out_dtype
    m = x8.shape[0]
    pad = -m % ALIGN
    if pad:  # (rows of zeros, scale 1: cut off below)
        x8 = torch.cat([x8, x8.new_zeros(pad, x8.shape[1])])
        sx = torch.cat([sx, sx.new_ones(pad, 1)])
    # cuBLASLt takes the first operand row-major only: a layer's input can be a transposed view
    # (diffusers' Transformer2DModel permutes (B, C, HW) to (B, HW, C) before proj_in), and the
    # quantized copy keeps its strides
    x8 = x8.contiguous()
    out = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(), bias=None, out_dtype=mm_dtype)  # (M + pad, N)
    out = out[:m].to(out_dtype)
    return out if bias is None else out + bias.to(out_dtype)


def fp8_linear_reference(x8: torch.Tensor, sx: torch.Tensor, w8: torch.Tensor, sw: torch.Tensor,
                         bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """`fp8_linear` from the dequantized operands, in float32."""
    out = (x8.float() * sx) @ (w8.float() * sw).t()  # (M, N)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
