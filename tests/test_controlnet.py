"""ControlNets (models/controlnet.py): tiny ControlNets made from the tiny UNets, checked against
diffusers' own MultiControlNetModel."""

from __future__ import annotations

import pytest
import torch

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models import controlnet, sdxl
from streamstudio.models.controlnet import ControlNetSpec, load_controlnet, parse_controlnet


def tiny_controlnet(unet, seed=0):
    """ControlNetModel.from_unet with random zero convolutions (a trained net's are not zero)."""
    from diffusers import ControlNetModel

    net = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(8, 8, 8, 8))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in list(net.controlnet_down_blocks) + [net.controlnet_mid_block, net.controlnet_cond_embedding.conv_out]:
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return net.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def sd(request):
    from streamstudio.models.loading import load_components

    comps = load_components("tiny")
    return comps, [tiny_controlnet(comps.unet, 0), tiny_controlnet(comps.unet, 1)]


def call(unet, x, t, text, res=None, added=None):
    kw = {} if res is None else dict(down_block_additional_residuals=res[0], mid_block_additional_residual=res[1])
    with torch.no_grad():
        return unet(x, t, encoder_hidden_states=text, added_cond_kwargs=added, **kw).sample


def inputs(rows=2, size=64, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 4, size // 8, size // 8, generator=g)  # (B, 4, h, w)
    t = torch.tensor([900, 300, 500, 100][:rows])
    text = torch.randn(rows, 7, dim, generator=g)  # (B, L, D)
    images = [torch.rand(rows, 3, size, size, generator=g) for _ in range(2)]  # control images in [0, 1]
    return x, t, text, images


def test_parse_controlnet():
    assert parse_controlnet("lllyasviel/control_v11p_sd15_canny") == ControlNetSpec("lllyasviel/control_v11p_sd15_canny")
    assert parse_controlnet("./nets/depth:0.6") == ControlNetSpec("./nets/depth", 0.6)
    with pytest.raises(StreamStudioError, match="--controlnet"):
        parse_controlnet(":0.5")


def test_scale_zero_is_the_plain_unet_and_scale_changes_the_output(sd):
    comps, nets = sd
    x, t, text, images = inputs()
    plain = call(comps.unet, x, t, text)
    zero = controlnet.residuals(nets[:1], x, t, text, images[:1], torch.zeros(2, 1))
    assert torch.equal(call(comps.unet, x, t, text, zero), plain)
    one = controlnet.residuals(nets[:1], x, t, text, images[:1], torch.ones(2, 1))
    assert (call(comps.unet, x, t, text, one) - plain).abs().max() > 1e-2


def test_per_row_scales_and_two_nets_equal_diffusers_multicontrolnet(sd):
    from diffusers.models import MultiControlNetModel

    comps, nets = sd
    x, t, text, images = inputs()
    scales = torch.tensor([[0.5, 1.2], [1.0, 0.0]])  # (B, n): each row its own scales
    ours = call(comps.unet, x, t, text, controlnet.residuals(nets, x, t, text, images, scales))
    multi = MultiControlNetModel(nets)
    for row in range(2):
        sl = slice(row, row + 1)
        with torch.no_grad():
            d, m = multi(x[sl], t[sl], text[sl], [im[sl] for im in images], scales[row].tolist(), return_dict=False)
        ref = call(comps.unet, x[sl], t[sl], text[sl], (d, m))
        torch.testing.assert_close(ours[sl], ref, atol=1e-5, rtol=1e-4)


def test_sdxl_controlnet_takes_the_added_conditioning():
    from streamstudio.models.loading import load_components

    comps = load_components("tiny-sdxl")
    net = tiny_controlnet(comps.unet)
    x, t, text, images = inputs(dim=64)
    added = dict(text_embeds=torch.randn(2, 32), time_ids=sdxl.time_ids(64, 64, 2, torch.device("cpu"), torch.float32))
    plain = call(comps.unet, x, t, text, added=added)
    res = controlnet.residuals([net], x, t, text, images[:1], torch.full((2, 1), 0.8), added)
    assert (call(comps.unet, x, t, text, res, added) - plain).abs().max() > 1e-2
    with pytest.raises(StreamStudioError, match="does not fit"):
        controlnet.check_fits(tiny_controlnet(load_components("tiny").unet), comps.unet)
    controlnet.check_fits(net, comps.unet)


def test_load_controlnet_from_folder_and_clear_errors(sd, tmp_path):
    comps, nets = sd
    nets[0].save_pretrained(tmp_path / "canny")
    loaded = load_controlnet(str(tmp_path / "canny"))
    sa, sb = nets[0].state_dict(), loaded.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(ModelNotFoundError, match="hf download"):
        load_controlnet("lllyasviel/control_v11p_sd15_canny", local_files_only=True)
    (tmp_path / "net.ckpt").write_bytes(b"\0" * 8)
    with pytest.raises(StreamStudioError, match="not a .safetensors"):
        load_controlnet(str(tmp_path / "net.ckpt"))
    with pytest.raises(StreamStudioError, match="as many control images"):
        controlnet.residuals(nets, *inputs()[:3], inputs()[3][:1], torch.ones(2, 2))
