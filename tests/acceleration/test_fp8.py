"""FP8 products (issue 45, `--fp8`; kernels/fp8.py, models/image/fp8.py): `torch._scaled_mm`
with row-wise scales (here the CPU's) equals the product of the dequantized operands; e4m3's
rounding stays within its 3 mantissa bits; the UNet's linear and 1x1 layers convert, the rest
stay; where FP8 cannot run (a GPU below capability 8.9, LoRAs, TensorRT) a clear error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from streamstudio.app.streams.image import load_components
from streamstudio.app.streams.requests import ImageRequest
from streamstudio.errors import StreamStudioError
from streamstudio.kernels import fp8 as kernels
from streamstudio.models.image import fp8


def test_rounding_stays_within_e4m3s_three_mantissa_bits():
    """e4m3: 3 stored mantissa bits, so a normal value rounds to within 2^-4 of itself (half a unit
    in the last place); below the smallest normal, 2^-6, the spacing is the subnormals' 2^-9."""
    torch.manual_seed(0)
    x = torch.randn(40, 64) * torch.logspace(-3, 2, 40)[:, None]  # rows of very different sizes
    x8, scale = kernels.quantize_rows(x)
    assert x8.dtype == torch.float8_e4m3fn and scale.shape == (40, 1)
    back = x8.float() * scale
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)  # (the subnormals' half spacing)
    assert bool(((back - x).abs() <= bound * 1.0001).all())
    assert torch.allclose(x.abs().amax(1, keepdim=True), back.abs().amax(1, keepdim=True), rtol=2.0**-4)


@pytest.mark.parametrize("rows", [77, 64, 1])
def test_scaled_mm_equals_the_dequantized_product(rows):
    torch.manual_seed(1)
    x, w, b = torch.randn(rows, 320), torch.randn(640, 320) * 0.05, torch.randn(640)
    x8, sx = kernels.quantize_rows(x)
    w8, sw = kernels.quantize_rows(w)
    fast = kernels.fp8_linear(x8, sx, w8, sw, b, torch.float32)  # (rows padded to 16 inside)
    ref = kernels.fp8_linear_reference(x8, sx, w8, sw, b, torch.float32)
    assert fast.shape == (rows, 640)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    full = x @ w.t() + b
    assert float((fast - full).norm() / full.norm()) < 0.05  # e4m3 on both operands: a few per cent
    # the GPU's way (the product in bfloat16, then the layer's dtype), here on the CPU
    gpu_way = kernels.fp8_linear(x8, sx, w8, sw, b, torch.float16, mm_dtype=torch.bfloat16)
    assert gpu_way.dtype == torch.float16
    torch.testing.assert_close(gpu_way.float(), ref, rtol=2.0**-7, atol=1e-2)


def test_a_transposed_input_reaches_the_product_row_major(monkeypatch):
    """cuBLASLt's FP8 GEMM takes its first operand row-major only (the H200 draw of 2026-11-28 failed
    with 'self must be row_major, got stride (1, 4096)' on diffusers' proj_in, whose input is a
    permuted view): the CPU's _scaled_mm takes any layout, so the GPU's rule is checked here."""
    real = torch._scaled_mm

    def cublaslt_rules(a, b, **kw):
        assert a.stride(1) == 1, f"self must be row_major, got stride {a.stride()}"
        assert b.stride(0) == 1, f"mat2 must be col_major, got stride {b.stride()}"
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", cublaslt_rules)
    torch.manual_seed(3)
    linear = nn.Linear(64, 32)
    x = torch.randn(1, 64, 48).transpose(1, 2)  # (1, 48, 64) with strides (3072, 1, 48): a permuted view
    layer = fp8.Float8Linear(linear)
    with torch.no_grad():
        got = layer(x)
        torch.testing.assert_close(got, fp8.fp8_reference(layer, x), rtol=1e-5, atol=1e-5)


def test_layers_convert_and_stay_close():
    torch.manual_seed(2)
    linear, conv = nn.Linear(64, 96), nn.Conv2d(32, 48, 1)
    x, img = torch.randn(2, 10, 64), torch.randn(2, 32, 5, 7)
    a, c = fp8.Float8Linear(linear), fp8.Float8Conv1x1(conv)
    with torch.no_grad():
        torch.testing.assert_close(a(x), fp8.fp8_reference(a, x), rtol=1e-5, atol=1e-5)
        for got, want in ((a(x), linear(x)), (c(img), conv(img))):
            assert got.shape == want.shape and float((got - want).norm() / want.norm()) < 0.05
    assert a.weight8.dtype == torch.float8_e4m3fn and a.weight8.element_size() == 1
    assert not fp8.convertible(nn.Linear(60, 64)) and not fp8.convertible(nn.Conv2d(32, 32, 3))
    assert not fp8.convertible(nn.Conv2d(32, 32, 1, stride=2)) and fp8.convertible(nn.Conv2d(32, 32, 1))


def test_the_unet_runs_in_fp8_close_to_float(tiny_components_factory):
    plain, comps = tiny_components_factory(), tiny_components_factory()
    fp8.apply_fp8(comps)
    kinds = [type(m) for m in comps.unet.modules()]
    assert fp8.Float8Linear in kinds or fp8.Float8Conv1x1 in kinds
    assert not any(fp8.convertible(m) for m in comps.unet.modules())  # every convertible layer converted
    assert any(isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3) for m in comps.unet.modules())  # the rest stay
    assert any("fp8:" in note for note in comps.notes)
    torch.manual_seed(3)
    latents = torch.randn(2, comps.unet.config.in_channels, 8, 8)
    text = torch.randn(2, 77, comps.unet.config.cross_attention_dim)
    t = torch.tensor([999, 500])
    with torch.no_grad():
        want = plain.unet(latents, t, encoder_hidden_states=text).sample
        got = comps.unet(latents, t, encoder_hidden_states=text).sample
    assert float((got - want).norm() / want.norm()) < 0.1


def test_where_fp8_cannot_run_it_says_so(monkeypatch, tiny_components_factory):
    """The GPU branch, on a faked device: capability 8.9+ runs, below is refused by name."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert kernels.supported(cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 3090")
    assert not kernels.supported(cuda) and not kernels.supported(torch.device("mps"))
    comps = tiny_components_factory()
    with pytest.raises(StreamStudioError, match="capability 8.9 .*RTX 3090 has \\(8, 6\\)"):
        fp8.check_fp8(cuda, comps)
    fp8.check_fp8(torch.device("cpu"), comps)
    comps.loras = SimpleNamespace(loras=["a LoRA"])
    with pytest.raises(StreamStudioError, match="LoRAs"):
        fp8.check_fp8(torch.device("cpu"), comps)
    monkeypatch.undo()
    with pytest.raises(StreamStudioError, match="--fp8 .*TensorRT"):
        load_components(ImageRequest(model="tiny", device="cpu", fp8=True, acceleration="tensorrt"))


def test_a_request_with_fp8_loads_the_unet_in_fp8():
    comps = load_components(ImageRequest(model="tiny", device="cpu", fp8=True))
    assert any(isinstance(m, fp8.Float8Linear) for m in comps.unet.modules())
