"""A tiny, deterministic Stable-Diffusion-shaped model built from configs, offline.

Same component types as a real SD checkpoint (UNet2DConditionModel, AutoencoderKL with four
blocks so latents are 1/8 of the image, CLIPTextModel, CLIPTokenizer, LCM scheduler config),
with random weights from a fixed seed. It is the model of the tests and the built-in demo
model when no real weights are available. The tokenizer's vocab.json and merges.txt are
written by this module (a byte-level BPE with single-character tokens).
"""

from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import torch
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from diffusers.models.autoencoders.autoencoder_tiny import AutoencoderTiny
from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

TINY_NAME = "tiny"
TINY_SEED = 0
TINY_TEXT_DIM = 32

UNET_CONFIG = dict(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    block_out_channels=(32, 64),
    layers_per_block=1,
    cross_attention_dim=TINY_TEXT_DIM,
    attention_head_dim=8,
    norm_num_groups=8,
)

VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(16, 16, 32, 32),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=8,
    sample_size=64,
)

TAESD_CONFIG = dict(
    encoder_block_out_channels=(16, 16, 16, 16),
    decoder_block_out_channels=(16, 16, 16, 16),
    num_encoder_blocks=(1, 1, 1, 1),
    num_decoder_blocks=(1, 1, 1, 1),
    latent_channels=4,
)

# The default Stable Diffusion noise schedule; the pipeline builds its LCM scheduler from it.
SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    prediction_type="epsilon",
    timestep_spacing="leading",
    steps_offset=1,
    set_alpha_to_one=False,
)


def _text_config():
    vocab = _vocab()
    return CLIPTextConfig(
        vocab_size=len(vocab),
        hidden_size=TINY_TEXT_DIM,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / CLIP's reversible byte -> printable unicode map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _vocab() -> dict[str, int]:
    chars = list(_bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(tokens)}


def write_tokenizer_files(folder: str | os.PathLike) -> Path:
    """Write vocab.json and merges.txt of the tiny tokenizer into `folder` and return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(_vocab()), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return folder


@lru_cache(maxsize=1)
def _tokenizer_dir() -> str:
    return str(write_tokenizer_files(tempfile.mkdtemp(prefix="streamstudio-tiny-tok-")))


def tiny_tokenizer():
    folder = _tokenizer_dir()
    return CLIPTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"),
                         model_max_length=77, pad_token="<|endoftext|>")


def redraw_parameters(module: torch.nn.Module, seed: int, select=lambda name: True,
                      std: float | None = None) -> torch.nn.Module:
    """Give every randomly initialised parameter of `module` (those `select(name)` picks) values
    drawn from a private generator seeded with `seed`: uniform in +-1/sqrt(fan_in) (torch's
    default for linear and conv layers), fan_in the size of one output row (of the tensor itself
    for a vector), or normal with `std` when given (transformers' `initializer_range`). Constant
    parameters (norm scales of 1, zero biases) are kept.

    Module constructors draw from torch's one global generator, which every thread shares: a
    thread drawing noise while a model is built (a running stream, a second replica loading)
    changes the weights even right after `torch.manual_seed`. Redrawing makes the weights a
    function of `seed` alone."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not select(name) or p.numel() < 2 or bool((p == p.flatten()[0]).all()):
                continue
            if std is not None:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).mul_(std).to(p.dtype))
                continue
            fan_in = p[0].numel() if p.dim() >= 2 else p.numel()
            bound = fan_in ** -0.5
            p.copy_((torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1).mul_(bound).to(p.dtype))
    return module


def tiny_components(seed: int = TINY_SEED, taesd: bool = False) -> dict:
    """Build the tiny model's components (fresh modules, identical weights for a given seed).

    Returns a dict with unet, vae, text_encoder, tokenizer, scheduler_config, name,
    and `taesd` (an AutoencoderTiny) when asked for.
    """
    # (diffusers' classes by their modules: its top-level names are dummies to a type checker)
    with torch.random.fork_rng(devices=[]):  # the constructors' own draws leave the caller's stream alone
        unet = UNet2DConditionModel(**UNET_CONFIG)
        vae = AutoencoderKL(**VAE_CONFIG)
        text_encoder = CLIPTextModel(_text_config())
        tiny_vae = AutoencoderTiny(**TAESD_CONFIG) if taesd else None
    for offset, module in enumerate((unet, vae, text_encoder, tiny_vae)):
        if module is not None:  # weights from `seed` alone, whatever other threads draw
            std = module.config.initializer_range if isinstance(module, CLIPTextModel) else None  # the text encoder
            redraw_parameters(module, seed + offset, std=std).eval().requires_grad_(False)
    return dict(unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=tiny_tokenizer(),
                scheduler_config=dict(SCHEDULER_CONFIG), name=TINY_NAME, taesd=tiny_vae)
