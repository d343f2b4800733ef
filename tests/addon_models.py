"""The tiny add-on models the tests build offline (ControlNets, IP-Adapters, LoRAs) and a
ControlNet stream of them; several folders' tests share them (imported as `addon_models`; pytest
puts tests/ on the path)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from streamstudio.models.image.lora import save_random_lora

SIZE = 32  # the ControlNet streams' side
EMBED_DIM = 32  # the tiny IP-Adapter's image embedding


def tiny_controlnet(unet, seed=0):
    """ControlNetModel.from_unet with random zero convolutions (a trained net's are not zero), the
    control image's embedding strong enough that its content shows in the output."""
    from diffusers import ControlNetModel

    net = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(8, 8, 8, 8))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in list(net.controlnet_down_blocks) + [net.controlnet_mid_block]:
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        for p in net.controlnet_cond_embedding.conv_out.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 2.0)
    return net.eval().requires_grad_(False)


def write_tiny_ip_adapter(unet, folder, seed=0):
    """ip-adapter.safetensors (image_proj.* and ip_adapter.* keys, as h94/IP-Adapter's files) and
    image_encoder/ (a tiny CLIPVisionModelWithProjection) in `folder`; returns the file."""
    from diffusers.models.attention_processor import IPAdapterAttnProcessor
    from diffusers.models.embeddings import ImageProjection
    from safetensors.torch import save_file
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(seed)
    tensors, key_id = {}, 1
    cross = unet.config.cross_attention_dim
    for name in unet.attn_processors:  # the adapter numbers the cross-attention layers 1, 3, 5, ...
        if not name.endswith("attn1.processor"):
            if name.startswith("mid_block"):
                hidden = unet.config.block_out_channels[-1]
            elif name.startswith("up_blocks"):
                hidden = list(reversed(unet.config.block_out_channels))[int(name[len("up_blocks.")])]
            else:
                hidden = unet.config.block_out_channels[int(name[len("down_blocks.")])]
            sd = IPAdapterAttnProcessor(hidden_size=hidden, cross_attention_dim=cross, scale=1.0).state_dict()
            tensors[f"ip_adapter.{key_id}.to_k_ip.weight"] = sd["to_k_ip.0.weight"]
            tensors[f"ip_adapter.{key_id}.to_v_ip.weight"] = sd["to_v_ip.0.weight"]
            key_id += 2
    proj = ImageProjection(cross_attention_dim=cross, image_embed_dim=EMBED_DIM, num_image_text_embeds=4).state_dict()
    tensors.update({"image_proj.proj.weight": proj["image_embeds.weight"],
                    "image_proj.proj.bias": proj["image_embeds.bias"],
                    "image_proj.norm.weight": proj["norm.weight"], "image_proj.norm.bias": proj["norm.bias"]})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ip-adapter_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
        patch_size=8, projection_dim=EMBED_DIM))
    encoder.save_pretrained(folder / "image_encoder")
    return path


def reference_image(seed=0):
    return torch.from_numpy(np.random.default_rng(seed).random((3, 32, 32), dtype=np.float32))


def make_lora(base, folder, seed=0, rank=4, alpha=8, text=False, file_name=None):
    """A random LoRA (diffusers/peft layout, .safetensors) for `base`'s UNet (and text encoder),
    and the peft-wrapped copies it was made from, as the reference."""
    _, unet, text_encoder = save_random_lora(base, folder, rank=rank, alpha=alpha, seed=seed, text=text,
                                             file_name=file_name)
    return unet, text_encoder


def stream_frames(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for _ in range(n)]


def make_pipe(comps, nets, scales=None, preprocessor="none", **kw):
    from streamstudio.pipelines.image.control import ControlInputs, ControlUnit, Preprocessor
    from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig

    with_nets = dataclasses.replace(comps, controlnets=list(nets))
    control = ControlInputs([ControlUnit(Preprocessor(preprocessor), s) for s in (scales or [1.0] * len(nets))]) \
        if nets else None
    kw = {"width": SIZE, "height": SIZE, "steps": 3, "strength": 0.7, **kw}
    return StreamDiffusion(with_nets, StreamDiffusionConfig(**kw), prompt="a red fox", negative_prompt="blurry",
                           control=control)
