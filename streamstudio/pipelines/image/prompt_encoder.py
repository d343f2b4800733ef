"""Prompts to the UNet's condition: the text encoder, a cache of the prompts seen, and blends
of several weighted prompts (linear, or spherical per token); and one stream's prompts
(`StreamPrompts`: its prompt and negative prompt as the conditions its UNet calls take)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.image import sdxl
from streamstudio.models.image.image_net import ImageCond
from streamstudio.pipelines.image.addons import StreamAddOns

if TYPE_CHECKING:  # (transformers loads with the model)
    from transformers import PreTrainedTokenizerBase

    from streamstudio.pipelines.image.stream_diffusion import StreamStats

log = logging.getLogger(__name__)

PromptSpec = str | Sequence[tuple[str, float]]
CACHE_SIZE = 64  # prompts kept; the cache is emptied when it grows past this


class PromptEncoder:
    """A prompt, or [(prompt, weight), ...], -> an `ImageCond` of one row. The text encoder
    runs only for prompts it has not seen (`encodes` counts its runs)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, text_encoder: torch.nn.Module, device: torch.device,
                 dtype: torch.dtype, tokenizer_2: PreTrainedTokenizerBase | None = None,
                 text_encoder_2: torch.nn.Module | None = None):
        self.tokenizer, self.text_encoder = tokenizer, text_encoder
        self.tokenizer_2, self.text_encoder_2 = tokenizer_2, text_encoder_2  # SDXL's second encoder (pooled text)
        self.device, self.dtype = device, dtype
        self.encodes = 0
        self._cache: dict[str, ImageCond] = {}

    def encode(self, prompt: str) -> ImageCond:
        if not isinstance(prompt, str):
            raise StreamStudioError(f"a prompt must be a string, got {type(prompt).__name__}")
        if prompt in self._cache:
            return self._cache[prompt]
        tok = self.tokenizer
        max_len = tok.model_max_length
        n_tokens = len(tok(prompt, truncation=False)["input_ids"])
        if n_tokens > max_len:
            msg = f"prompt is {n_tokens} tokens; the text encoder takes {max_len}, so it was truncated"
            warnings.warn(msg, stacklevel=3)
            log.warning(msg)
        if self.text_encoder_2 is not None:  # SDXL: both encoders' penultimate states and the pooled text
            with torch.inference_mode():
                xl = sdxl.encode_prompts([prompt], [tok, self.tokenizer_2], [self.text_encoder, self.text_encoder_2],
                                         self.device, self.dtype)
            cond = ImageCond(text=xl.embeds, text_embeds=xl.pooled)  # (1, 77, D1 + D2), (1, P)
        else:
            ids = tok(prompt, padding="max_length", max_length=max_len, truncation=True, return_tensors="pt").input_ids
            with torch.inference_mode():
                embeds = self.text_encoder(ids.to(self.device))[0].to(self.dtype)  # (1, L, D)
            cond = ImageCond(text=embeds)
        self.encodes += 1
        if len(self._cache) > CACHE_SIZE:
            self._cache.clear()
        self._cache[prompt] = cond
        return cond

    def negative(self, prompt: str) -> ImageCond:
        """The unconditional condition: an empty negative prompt is zeros for SDXL (as diffusers'
        pipeline does for SDXL's force_zeros_for_empty_prompt), the encoded prompt otherwise."""
        if self.text_encoder_2 is not None and prompt == "":
            return self.encode(prompt).map(torch.zeros_like)
        return self.encode(prompt)

    def clear(self) -> None:
        """Forget the encoded prompts (the text encoders changed: a LoRA with text weights)."""
        self._cache.clear()

    def blend(self, spec: PromptSpec, mode: str = "linear") -> ImageCond:
        """A prompt's condition, or the weighted blend of several (weights need not sum to 1),
        linear or (mode "slerp") spherical, field by field."""
        if isinstance(spec, str):
            return self.encode(spec)
        try:
            pairs = [(p, float(w)) for p, w in spec]
        except (TypeError, ValueError) as exc:
            raise StreamStudioError("a prompt is a string or a list of (prompt, weight) pairs") from exc
        if not pairs or any(w < 0 for _, w in pairs) or sum(w for _, w in pairs) <= 0:
            raise StreamStudioError("a prompt blend needs at least one prompt and non-negative weights "
                                    "with a positive sum")
        conds = [self.encode(p) for p, _ in pairs]
        weights = [w for _, w in pairs]
        layout = conds[0].flatten()[0]
        fields = zip(*(c.flatten()[1] for c in conds))  # each field's tensors, one per prompt
        return ImageCond.unflatten(layout, [_blend(list(parts), weights, mode) for parts in fields])


class StreamPrompts:
    """One stream's prompt (or blend) and negative prompt, encoded by `encoder` (again when a LoRA
    changed what the text encoders compute), and the conditions of its UNet calls: the prompt's
    with the stream's own add-on fields (`StreamAddOns.cond_fields`). `stats.text_encodes`
    follows the encoder's runs."""

    def __init__(self, encoder: PromptEncoder, addons: StreamAddOns, stats: StreamStats, prompt: PromptSpec,
                 negative_prompt: str, blend: str):
        self.encoder, self.addons, self.stats = encoder, addons, stats
        self.set_negative(negative_prompt)
        self.set_prompt(prompt, blend)

    def _encoded(self, encode: Callable[..., ImageCond], *args: object) -> ImageCond:
        cond = encode(*args)
        self.stats.text_encodes = self.encoder.encodes
        return cond

    def set_prompt(self, spec: PromptSpec, blend: str) -> None:
        """The prompt, or [(prompt, weight), ...] blended by `blend` (linear or slerp)."""
        self.spec = spec
        self.text = self._encoded(self.encoder.blend, spec, blend)

    def set_negative(self, prompt: str) -> None:
        self.negative_prompt = prompt
        self.negative = self._encoded(self.encoder.negative, prompt)

    def refresh(self, blend: str) -> None:
        """Encode the prompts again when a LoRA changed what the text encoders compute."""
        if self.addons.text_changed():
            self.encoder.clear()
            self.set_negative(self.negative_prompt)
            self.set_prompt(self.spec, blend)

    def cond(self, negative: bool) -> ImageCond:
        """The prompt's (negative: the negative prompt's) condition with the stream's add-on fields."""
        cond = self.negative if negative else self.text
        extra = self.addons.cond_fields(negative)
        return replace(cond, **extra) if extra else cond


def _blend(parts: list[torch.Tensor], weights: list[float], mode: str) -> torch.Tensor:
    if mode == "linear":
        total = sum(weights)
        blended = sum(w / total * e for w, e in zip(weights, parts))
        assert isinstance(blended, torch.Tensor)  # (parts is not empty)
        return blended
    out, acc = parts[0], weights[0]
    for e, w in zip(parts[1:], weights[1:]):  # slerp towards each next prompt by its share so far
        if acc + w > 0:
            out = slerp(out, e, w / (acc + w))
        acc += w
    return out


def slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation of token embeddings (..., D), per token; linear when parallel."""
    a32, b32 = a.float(), b.float()
    an = a32 / a32.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    bn = b32 / b32.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    dot = (an * bn).sum(-1, keepdim=True).clamp(-1.0, 1.0)
    omega = torch.arccos(dot)
    so = torch.sin(omega)
    linear = so.abs() < 1e-4
    safe = torch.where(linear, torch.ones_like(so), so)
    wa = torch.where(linear, 1.0 - t, torch.sin((1.0 - t) * omega) / safe)
    wb = torch.where(linear, torch.full_like(so, t), torch.sin(t * omega) / safe)
    return (wa * a32 + wb * b32).to(a.dtype)
