"""The SDXL family: what its UNet is conditioned on, and a tiny SDXL-architecture model.

An SDXL UNet (`addition_embed_type="text_time"`) takes, besides the text embeddings
(B, 77, D1 + D2) -- the penultimate hidden states of two CLIP text encoders side by side --
two extra rows per sample: the pooled, projected embedding of the second encoder
`text_embeds` (B, P) and `time_ids` (B, 6) = (original height, width, crop top, left,
target height, width), each turned into a Fourier embedding and added to the time embedding.
This module computes them as diffusers' StableDiffusionXLPipeline does (tests compare with it).

Models users load (`--model`): `stabilityai/sdxl-turbo` (one step, 512x512 native), any SDXL
diffusers folder or single file (`stabilityai/stable-diffusion-xl-base-1.0` with
`latent-consistency/lcm-lora-sdxl` fused automatically), `madebyollin/taesdxl` as the fast VAE
(`--taesd`), and `madebyollin/sdxl-vae-fp16-fix` for float16 (SDXL's own VAE overflows there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from diffusers.models.autoencoders.autoencoder_tiny import AutoencoderTiny
from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel
from transformers import CLIPTextModel, CLIPTextModelWithProjection

from streamstudio.models.hub import LCM_LORA_SDXL, TAESD_SDXL  # noqa: F401 (named here for SDXL callers)
from streamstudio.models.image import tiny

SDXL_TURBO = "stabilityai/sdxl-turbo"
VAE_FP16_FIX = "madebyollin/sdxl-vae-fp16-fix"
DEFAULT_SIZE = 1024  # SDXL's training size (sdxl-turbo's: 512)
TURBO_SIZE = 512
TINY_SDXL_NAME = "tiny-sdxl"


def is_sdxl_unet(unet: torch.nn.Module) -> bool:
    """An SDXL-style UNet: its added conditioning is the pooled text and the time ids."""
    config = getattr(unet, "config", None)
    return getattr(config, "addition_embed_type", None) == "text_time"


def default_size(name: str) -> int:
    """sdxl-turbo is trained at 512x512, other SDXL models at 1024x1024."""
    return TURBO_SIZE if "turbo" in name.lower() else DEFAULT_SIZE


@dataclass
class SDXLText:
    """One prompt's SDXL conditioning."""

    embeds: torch.Tensor  # (B, 77, D1 + D2) penultimate hidden states of both encoders, side by side
    pooled: torch.Tensor  # (B, P) the second encoder's projected pooled embedding


def encode_prompts(prompts: list[str], tokenizers, text_encoders, device: torch.device,
                   dtype: torch.dtype) -> SDXLText:
    """SDXL text conditioning of `prompts` (diffusers' StableDiffusionXLPipeline.encode_prompt
    without CFG: the same prompt to both encoders)."""
    hidden, pooled = [], None
    for tokenizer, encoder in zip(tokenizers, text_encoders):
        ids = tokenizer(prompts, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                        return_tensors="pt").input_ids  # (B, 77)
        with torch.no_grad():
            out = encoder(ids.to(device), output_hidden_states=True)
        if pooled is None and out[0].ndim == 2:  # CLIPTextModelWithProjection: text_embeds first
            pooled = out[0]  # (B, P)
        hidden.append(out.hidden_states[-2])  # (B, 77, D_i)
    if pooled is None:
        raise ValueError("neither text encoder gives a pooled projection; SDXL's second encoder is a "
                         "CLIPTextModelWithProjection")
    return SDXLText(torch.cat(hidden, dim=-1).to(dtype), pooled.to(dtype))


def zeros_like(text: SDXLText) -> SDXLText:
    """The unconditional conditioning of models with `force_zeros_for_empty_prompt` (all SDXL
    releases): zeros for an empty negative prompt."""
    return SDXLText(torch.zeros_like(text.embeds), torch.zeros_like(text.pooled))


def time_ids(height: int, width: int, rows: int, device: torch.device, dtype: torch.dtype,
             crop: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """(rows, 6): original size, crop corner and target size; the stream's frames are whole
    pictures at the output size, so original = target = (height, width)."""
    row = torch.tensor([height, width, crop[0], crop[1], height, width], device=device, dtype=dtype)
    return row.expand(rows, 6).contiguous()


# ------------------------------------------------------------------------- tiny SDXL model

TINY_TEXT_DIMS = (32, 32)  # hidden sizes of the two text encoders
TINY_POOLED_DIM = 32  # the second encoder's projection
TINY_TIME_DIM = 8  # addition_time_embed_dim

TINY_UNET_CONFIG = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(32, 64),
    layers_per_block=1,
    transformer_layers_per_block=(1, 2),
    attention_head_dim=(2, 4),
    use_linear_projection=True,
    cross_attention_dim=sum(TINY_TEXT_DIMS),
    addition_embed_type="text_time",
    addition_time_embed_dim=TINY_TIME_DIM,
    projection_class_embeddings_input_dim=6 * TINY_TIME_DIM + TINY_POOLED_DIM,
    norm_num_groups=8,
)


def tiny_sdxl_components(seed: int = 0, taesd: bool = False) -> dict:
    """A tiny SDXL-architecture model (random weights from `seed`): a UNet with text_time added
    conditioning, CLIPTextModel + CLIPTextModelWithProjection (the same tiny tokenizer for
    both), the tiny VAE with SDXL's latent scaling. Keys as `tiny.tiny_components`, plus
    text_encoder_2 and tokenizer_2."""
    # (diffusers' classes by their modules: its top-level names are dummies to a type checker)
    base = tiny._text_config()
    with torch.random.fork_rng(devices=[]):  # the constructors' own draws leave the caller's stream alone
        unet = UNet2DConditionModel(**TINY_UNET_CONFIG)
        vae = AutoencoderKL(**tiny.VAE_CONFIG, scaling_factor=0.13025, force_upcast=True)
        text_encoder = CLIPTextModel(type(base)(**{**base.to_dict(), "hidden_size": TINY_TEXT_DIMS[0]}))
        text_encoder_2 = CLIPTextModelWithProjection(type(base)(**{**base.to_dict(), "hidden_size": TINY_TEXT_DIMS[1],
                                                                   "projection_dim": TINY_POOLED_DIM}))
        tiny_vae = AutoencoderTiny(**tiny.TAESD_CONFIG, scaling_factor=1.0) if taesd else None
    for offset, module in enumerate((unet, vae, text_encoder, text_encoder_2, tiny_vae)):
        if module is not None:  # weights from `seed` alone, whatever other threads draw (tiny.redraw_parameters)
            std = (module.config.initializer_range if isinstance(module, (CLIPTextModel, CLIPTextModelWithProjection))
                   else None)  # the text encoders'
            tiny.redraw_parameters(module, seed + offset, std=std).eval().requires_grad_(False)
    return dict(unet=unet, vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                tokenizer=tiny.tiny_tokenizer(), tokenizer_2=tiny.tiny_tokenizer(),
                scheduler_config=dict(tiny.SCHEDULER_CONFIG), name=TINY_SDXL_NAME, taesd=tiny_vae)
