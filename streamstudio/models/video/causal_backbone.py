"""The causal Wan network behind the video seam (`models/video/video_net.py`), with its cache.

    encode_text(prompt)              -> the condition (a `CausalText`: cross-attention keys cached on it)
    new_cache(window, sink, h, w)    -> an empty `KVCache` for one stream
    velocity(x, t, text, cache)      x (1, F, C, h, w) one chunk, t (1, F) in [0, 1] (0 noise, 1 data)
                                     -> dx/dt (1, F, C, h, w); writes the chunk's keys to the cache

Wan's conventions, as `models/video/wan.py`'s WanBackbone: the timestep is (1 - t) * 1000, the
output is noise - data, so dx/dt is minus the output. The distilled causal checkpoints run
without classifier-free guidance (it is distilled in).
"""

from __future__ import annotations

from typing import Callable

import torch

from streamstudio.models.video.causal_wan import CausalText, CausalWan, KVCache


class CausalWanBackbone:
    """A `CausalWan` and a text encoder (prompt -> (1, L, text_dim) embeddings)."""

    def __init__(self, model: CausalWan, text_encoder: Callable[[str], torch.Tensor]):
        self.model, self.text_encoder = model, text_encoder
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype

    @property
    def latent_channels(self) -> int:
        return self.model.cfg.in_dim

    def encode_text(self, prompt: str) -> CausalText:
        with torch.no_grad():
            return self.model.embed_text(self.text_encoder(prompt))

    def new_cache(self, window: int, sink: int, height: int, width: int, batch: int = 1) -> KVCache:
        return self.model.new_cache(batch, window, sink, height, width)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, text: CausalText, cache: KVCache | None,
                 first_frame: int | None = None) -> torch.Tensor:
        """`first_frame`: the chunk's RoPE position (None: the cache's next)."""
        timestep = (1 - t.to(torch.float64)) * 1000  # (1, F) Wan's units
        with torch.no_grad():
            out = self.model(x.to(self.dtype), timestep.to(x.device), text, cache, first_frame)
        return -out
