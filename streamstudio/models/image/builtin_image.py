"""The built-in image model's networks: a fast pixel-shuffle autoencoder, a small UNet, a small
CLIP text encoder and a word-level tokenizer, built from configs (trained by
`app/training/image.py`, shipped in `assets/image_builtin/`, loaded by `models/image/loading.py`).

The autoencoder never convolves at full resolution: the encoder starts with a 2x2
space-to-depth (PixelUnshuffle) and the decoder ends with depth-to-space (PixelShuffle), so
256x256 costs a few milliseconds on one CPU core. The shipped model's latents are 1/4 of the
image with 32 channels (trained from scratch at 8, then widened by `widen_latents` to 16 and to
32, trained on after each), each image's latents scaled to mean square 1 (`power_norm`), so the
noise the pipeline adds at a strength is the noise training saw; the older design (1/8, 4
channels, as Stable Diffusion's) still loads from its config. The UNet and text encoder are
diffusers / transformers classes with tiny configs, so the pipeline, the feature bank and the
exporters treat them as any SD model's.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers import UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel
from transformers import CLIPTokenizer

from streamstudio.models.image.image_data import vocabulary
from streamstudio.models.image.tiny import _bytes_to_unicode

BUILTIN_NAME = "builtin"
TEXT_DIM = 64
MAX_TOKENS = 32  # the tokenizer's model_max_length and the text encoder's positions

LATENT_CHANNELS = 8  # a new model's (train-image's stage 1); the shipped one is widened to 16 (its config.json)
# Latents at 1/4 of the image, 8 channels. The UNet's levels run at 1/4, 1/8 and 1/16 of the
# image; self- and cross-attention only at the last (256 tokens at 256x256), and the prompt
# also reaches every level through the time embedding (addition_embed_type "text": pooled text
# added to it), so a look can change every pixel without attention over 4096 tokens.
UNET_CONFIG = dict(
    sample_size=64,
    in_channels=LATENT_CHANNELS,
    out_channels=LATENT_CHANNELS,
    down_block_types=("DownBlock2D", "DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
    block_out_channels=(16, 32, 64),
    layers_per_block=1,
    cross_attention_dim=TEXT_DIM,
    attention_head_dim=8,
    norm_num_groups=8,
    addition_embed_type="text",
    addition_embed_type_num_heads=4,
)
# channels: the decoder's width at 1/2 of the image; block_out_channels: 3 levels (latents at
# 1/4), the encoder's and the decoder's widths at 1/4 last; power_norm: unit mean-square latents
VAE_CONFIG = dict(channels=16, latent_channels=LATENT_CHANNELS, scaling_factor=1.0, block_out_channels=(16, 32, 48),
                  power_norm=True)
SPECIALS = ("<|startoftext|>", "<|endoftext|>")


class _Res(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(torch.relu(self.conv1(x)))


class _Encoded:
    def __init__(self, latents):
        self.latents = latents


class _Decoded:
    def __init__(self, sample):
        self.sample = sample


# (diffusers' ConfigMixin types config_name as None, ModelMixin as str: every diffusers model inherits both)
class PixelShuffleAutoencoder(ModelMixin, ConfigMixin):  # type: ignore[misc]
    """Images (B, 3, H, W) in [-1, 1] <-> latents (B, C, H/f, W/f), f = 2 ** (len(block_out_channels)
    - 1): 8 (4 channels, as Stable Diffusion's) or 4 (the photographic model: more channels, less
    compression); H, W multiples of f.

    `encode(x).latents` and `decode(z).sample`, as diffusers' AutoencoderTiny (the pipeline
    scales latents by `config.scaling_factor`, set after training so they have unit variance).
    """


    @register_to_config
    def __init__(self, channels: int = 32, latent_channels: int = 4, scaling_factor: float = 1.0,
                 block_out_channels: tuple = (32, 32, 64, 64), power_norm: bool = False):
        super().__init__()
        c = channels
        factor = 2 ** (len(block_out_channels) - 1)
        if factor == 8:
            self.encoder = nn.Sequential(
                nn.PixelUnshuffle(2),  # (B, 12, H/2, W/2)
                nn.Conv2d(12, c, 3, padding=1), nn.ReLU(),
                nn.Conv2d(c, c, 3, stride=2, padding=1), nn.ReLU(),  # H/4
                _Res(c), nn.ReLU(),
                nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU(),  # H/8
                _Res(2 * c), nn.ReLU(), _Res(2 * c), nn.ReLU(),
                nn.Conv2d(2 * c, latent_channels, 3, padding=1),
            )
            self.decoder = nn.Sequential(
                nn.Conv2d(latent_channels, 2 * c, 3, padding=1), nn.ReLU(),
                _Res(2 * c), nn.ReLU(), _Res(2 * c), nn.ReLU(),
                nn.Upsample(scale_factor=2, mode="nearest"),  # H/4
                nn.Conv2d(2 * c, c, 3, padding=1), nn.ReLU(),
                _Res(c), nn.ReLU(),
                nn.Upsample(scale_factor=2, mode="nearest"),  # H/2
                nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
                nn.Conv2d(c, 12, 3, padding=1),
                nn.PixelShuffle(2),  # (B, 3, H, W)
            )
        elif factor == 4:
            enc, wide = block_out_channels[-2], block_out_channels[-1]
            self.encoder = nn.Sequential(
                nn.PixelUnshuffle(4),  # (B, 48, H/4, W/4): every pixel of a 4x4 block, no convolution at H
                nn.Conv2d(48, enc, 3, padding=1), nn.ReLU(),
                _Res(enc), nn.ReLU(),
                nn.Conv2d(enc, latent_channels, 3, padding=1),  # (B, C, H/4, W/4)
            )
            self.decoder = nn.Sequential(
                nn.Conv2d(latent_channels, wide, 3, padding=1), nn.ReLU(),
                _Res(wide), nn.ReLU(), _Res(wide), nn.ReLU(),
                nn.PixelShuffle(2),  # (B, wide / 4, H/2, W/2)
                nn.Conv2d(wide // 4, c, 3, padding=1), nn.ReLU(),
                _Res(c), nn.ReLU(),
                nn.Conv2d(c, 12, 3, padding=1),
                nn.PixelShuffle(2),  # (B, 3, H, W)
            )
        else:
            raise ValueError(f"block_out_channels {block_out_channels}: 3 (4x latents) or 4 (8x) blocks")

    def encode(self, x: torch.Tensor, return_dict: bool = True):
        z = self.encoder(x)  # (B, C, H/f, W/f), unscaled
        if self.config["power_norm"]:  # each image's latents to mean square 1 (deep JSCC's power constraint)
            z = z * torch.rsqrt(z.pow(2).mean(dim=(1, 2, 3), keepdim=True) + 1e-6)
        return _Encoded(z) if return_dict else (z,)

    def decode(self, z: torch.Tensor, return_dict: bool = True, **_):
        x = self.decoder(z)  # (B, 3, H, W) in about [-1, 1]
        return _Decoded(x) if return_dict else (x,)

    def forward(self, x):
        return self.decode(self.encode(x).latents).sample


# ---------------------------------------------------------------------------------------------
# Tokenizer: whole words from a vocabulary, single characters for anything else
# ---------------------------------------------------------------------------------------------

def _bpe(word: tuple[str, ...], ranks: dict[tuple[str, str], int]) -> tuple[str, ...]:
    """CLIP's BPE merge loop (transformers' CLIPTokenizer.bpe) on one word's symbols."""
    while len(word) > 1:
        pairs = {(a, b) for a, b in zip(word, word[1:])}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        out, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                out.append(word[i] + word[i + 1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = tuple(out)
    return word


def build_tokenizer_files(words: list[str]) -> dict[str, str]:
    """vocab.json and merges.txt of a CLIP BPE tokenizer in which every word of `words` is one
    token (merges are added until CLIP's merge loop turns each word into one symbol) and any
    other text falls back to single characters."""
    chars = list(_bytes_to_unicode().values())
    merges: list[tuple[str, str]] = []
    ranks: dict[tuple[str, str], int] = {}
    for w in words:
        w = w.lower()
        symbols = tuple(w[:-1]) + (w[-1] + "</w>",)
        while True:
            symbols = _bpe(symbols, ranks)
            if len(symbols) == 1:
                break
            pair = (symbols[0], symbols[1])  # join left to right; new merges rank last
            ranks[pair] = len(merges)
            merges.append(pair)
    tokens = chars + [c + "</w>" for c in chars]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
    tokens += list(SPECIALS)
    vocab = {t: i for i, t in enumerate(tokens)}
    return {"vocab.json": json.dumps(vocab), "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)}


def make_tokenizer(files: dict[str, str]):
    with tempfile.TemporaryDirectory(prefix="streamstudio-builtin-tok-") as folder:  # read in __init__
        for name, text in files.items():
            Path(folder, Path(name).name).write_text(text, encoding="utf-8")
        return CLIPTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"),
                             model_max_length=MAX_TOKENS, pad_token="<|endoftext|>")


def text_config(vocab_size: int, vocab: dict[str, int]) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=TEXT_DIM, intermediate_size=2 * TEXT_DIM, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=MAX_TOKENS, bos_token_id=vocab["<|startoftext|>"],
                eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"])


def build(config: dict | None = None, seed: int = 0) -> dict:
    """Fresh (untrained) networks from a config dict (the checkpoint's config.json, or the
    defaults for `words`): unet, vae, text_encoder, tokenizer, tokenizer_files, config."""
    if config is None:
        files = build_tokenizer_files(vocabulary())
        vocab = json.loads(files["vocab.json"])
        config = dict(unet=UNET_CONFIG, vae=VAE_CONFIG, text_encoder=text_config(len(vocab), vocab),
                      tokenizer=files)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(seed)
        unet = UNet2DConditionModel(**config["unet"])
        vae = PixelShuffleAutoencoder(**{k: v for k, v in config["vae"].items() if not k.startswith("_")})
        text_encoder = CLIPTextModel(CLIPTextConfig(**config["text_encoder"]))
    return dict(unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=make_tokenizer(config["tokenizer"]),
                config=config)


def state_dict(parts: dict) -> dict[str, torch.Tensor]:
    """All weights in one flat dict, keys prefixed unet. / vae. / text_encoder."""
    out = {}
    for prefix in ("unet", "vae", "text_encoder"):
        for k, v in parts[prefix].state_dict().items():
            if "position_ids" not in k:
                out[f"{prefix}.{k}"] = v.detach().to("cpu", torch.float32).contiguous()
    return out


def load_state(parts: dict, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    for prefix in ("unet", "vae", "text_encoder"):
        sub = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
        if not sub and not strict:
            continue
        missing, unexpected = parts[prefix].load_state_dict(sub, strict=False)
        missing = [k for k in missing if "position_ids" not in k]
        if missing or unexpected:
            raise ValueError(f"the {prefix} weights do not match their config "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")


def widen_latents(config: dict, state: dict[str, torch.Tensor], channels: int,
                  weights: bool = True) -> tuple[dict, dict]:
    """(config, state) of the same model with `channels` latent channels, a whole multiple k of
    its own C, each old channel repeated k times (a repetition code): the encoder's last
    convolution and the UNet's conv_out repeat their outputs, the decoder's first convolution and
    the UNet's conv_in split their input weights evenly over the copies. With power_norm the
    latents' mean square stays 1, so each of the C*k channels carries the power one of C did: the
    pipeline's noise, independent per channel, averages out k-fold over the copies (k times the
    signal-to-noise ratio the C-channel model saw), which further training then spends on more
    than repetition. The UNet and decoder see the old latents plus less noise: the start of a
    fine-tune, not the same outputs. weights=False: only the config (state returned as given)."""
    old = config["vae"]["latent_channels"]
    if channels % old or channels < old:
        raise ValueError(f"latent channels {channels}: a whole multiple of the model's {old}")
    if len(config["vae"]["block_out_channels"]) != 3:
        raise ValueError("widening needs the 4x-latent autoencoder (3 blocks)")
    k = channels // old
    config = json.loads(json.dumps(config))
    config["vae"]["latent_channels"] = config["unet"]["in_channels"] = config["unet"]["out_channels"] = channels
    if not weights:
        return config, state
    state = dict(state)
    enc_last = "vae.encoder.5"  # Conv2d(enc, C): PixelUnshuffle, Conv, ReLU, _Res, ReLU, Conv
    for key in (f"{enc_last}.weight", f"{enc_last}.bias", "unet.conv_out.weight", "unet.conv_out.bias"):
        state[key] = state[key].repeat(k, *([1] * (state[key].dim() - 1)))  # outputs: c, then its copies
    for key in ("vae.decoder.0.weight", "unet.conv_in.weight"):
        state[key] = state[key].repeat(1, k, 1, 1) / k  # inputs: the k copies share the weight
    return config, state
