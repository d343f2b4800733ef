"""FP8 for the UNet (issue 45, `--fp8`): its linear layers and 1x1 convolutions run as float8
e4m3 products with one scale per row (kernels/fp8.py), weights quantized once per output
channel, activations per token at each call (dynamic), accumulated in float32, the output in the
layer's own dtype. Everything else (3x3 convolutions, norms, attention's softmax) is untouched.

A layer is converted when both its sides are multiples of 16 (FP8 GEMMs need them); the rest stay
as they are. The weights' float8 copies replace the originals (half the memory of float16 for
those layers). FP8 products need a GPU of compute capability 8.9 or more (Ada, Hopper); the CPU
runs them too (torch's `_scaled_mm`), slowly, for checking. benchmarks/frame_path.py reports the
numeric difference and, on a GPU, the speed.
"""

from __future__ import annotations

import torch
from torch import nn

from streamstudio.errors import StreamStudioError
from streamstudio.kernels import fp8 as kernels

ALIGN = kernels.ALIGN


class Float8Linear(nn.Module):
    """An nn.Linear's product in FP8: weight (N, K) as float8 with a scale per output row."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w8, sw = kernels.quantize_rows(linear.weight.detach())
        self.weight8: torch.Tensor
        self.weight_scale: torch.Tensor
        self.register_buffer("weight8", w8)  # (N, K) float8_e4m3fn
        self.register_buffer("weight_scale", sw)  # (N, 1) float32
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (M, K)
        x8, sx = kernels.quantize_rows(rows)
        out = kernels.fp8_linear(x8, sx, self.weight8, self.weight_scale, self.bias, x.dtype)  # (M, N)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 per-row"


class Float8Conv1x1(Float8Linear):
    """A 1x1 convolution (stride 1, no padding, one group) as the same product over every pixel."""

    def __init__(self, conv: nn.Conv2d):
        linear = nn.Linear(conv.in_channels, conv.out_channels, bias=conv.bias is not None)
        linear.weight.data = conv.weight.detach().reshape(conv.out_channels, conv.in_channels)
        if conv.bias is not None:
            linear.bias.data = conv.bias.detach()
        super().__init__(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, N, H, W), channels_last in memory
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def is_1x1(module: nn.Module) -> bool:
    return (isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1) and module.stride == (1, 1)
            and module.padding in ((0, 0), "valid") and module.groups == 1 and module.dilation == (1, 1))


def convertible(module: nn.Module) -> bool:
    """A linear layer or 1x1 convolution whose sides FP8 GEMMs take (multiples of 16)."""
    if isinstance(module, nn.Linear) and type(module) is nn.Linear:
        sides = (module.in_features, module.out_features)
    elif type(module) is nn.Conv2d and is_1x1(module):
        sides = (module.in_channels, module.out_channels)
    else:
        return False
    return all(s % ALIGN == 0 for s in sides)


def to_fp8(model: nn.Module) -> int:
    """Replace, in place, every convertible layer of `model` by its FP8 form; the count converted."""
    targets = [(name, module) for name, module in model.named_modules() if convertible(module)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        new = Float8Linear(module) if isinstance(module, nn.Linear) else Float8Conv1x1(module)
        setattr(parent, child, new.to(next(module.parameters()).device))
    return len(targets)


def apply_fp8(comps):
    """`comps` (SDComponents) with the UNet's linear and 1x1 layers in FP8; a note says how many."""
    device = next(comps.unet.parameters()).device
    check_fp8(device, comps)
    converted = to_fp8(comps.unet)
    comps.notes.append(f"fp8: {converted} UNet linear and 1x1 layers as float8 e4m3 products"
                       + (" (on the CPU: for checking, slower than float32)" if device.type == "cpu" else ""))
    return comps


def check_fp8(device: torch.device, comps) -> None:
    """A clear error where FP8 cannot run or cannot stay right: a GPU below capability 8.9, LoRAs
    (fused into the weights, and changed live)."""
    if not kernels.supported(device):
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        capability = f" has {torch.cuda.get_device_capability(device)}" if device.type == "cuda" else " has none"
        raise StreamStudioError("--fp8 needs a GPU of compute capability 8.9 or more (Ada, Hopper); "
                                f"{name}{capability}")
    if comps.loras is not None and comps.loras.loras:
        raise StreamStudioError("--fp8 quantizes the UNet's weights once; LoRAs fuse into them and change live: not "
                                "both yet (leave --lora or --fp8 out)")


def fp8_reference(module: Float8Linear, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` through `kernels.fp8_linear_reference` (tests)."""
    rows = x.reshape(-1, module.in_features)
    x8, sx = kernels.quantize_rows(rows)
    out = kernels.fp8_linear_reference(x8, sx, module.weight8, module.weight_scale, module.bias, x.dtype)
    return out.reshape(*x.shape[:-1], module.out_features)

