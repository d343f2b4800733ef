"""Stream Batch for causal streams (issue 49): several streams of one causal model, each with its
own prompt, seed and input, made chunk by chunk in step, every denoising step (and the cache call)
one network call over all of them, as StreamDiffusion batches its streams' steps.

The streams share one `KVCache` with a row each (`KVCache.row`: the same storage): rows evict and
rebase together, since streams made in step have the same frames at the same positions. Each
stream stays a `CausalSampler` over its row, so a prompt change re-caches its own row alone, and
its noise is its own (its seed), so a batched stream's chunks equal the same stream made alone
(tests/video/test_causal_stream.py). Streams whose first step differs (video-to-video at other
strengths, motion-aware strengths that moved apart) run their steps one stream at a time.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.video.causal_backbone import CausalWanBackbone
from streamstudio.models.video.causal_wan import CausalText
from streamstudio.pipelines.video.causal_video import CausalConfig, CausalSampler, denoise


class CausalBatch:
    """`chunks(inputs)` makes the next chunk of every stream: (n, c, C, h, w) clean latents."""

    def __init__(self, backbone: CausalWanBackbone, cfg: CausalConfig, latent_shape: tuple[int, int, int],
                 prompts: list[str], seeds: list[int] | None = None):
        if not prompts:
            raise StreamStudioError("a stream batch needs at least one stream")
        seeds = list(range(cfg.seed, cfg.seed + len(prompts))) if seeds is None else seeds
        if len(seeds) != len(prompts):
            raise StreamStudioError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if cfg.guided:
            raise StreamStudioError("a stream batch runs unguided streams (guidance 1): a guided stream's cache "
                                    "has two rows of its own")
        self.backbone, self.cfg = backbone, cfg
        self.cache = backbone.new_cache(cfg.window, cfg.sink, latent_shape[1], latent_shape[2], batch=len(prompts))
        self.streams = [CausalSampler(backbone, replace(cfg, seed=seed), latent_shape, prompt, cache=self.cache.row(i))
                        for i, (prompt, seed) in enumerate(zip(prompts, seeds))]
        self._text: tuple[tuple[int, ...], CausalText] | None = None
        self.calls = 0

    def __len__(self) -> int:
        return len(self.streams)

    def text(self) -> CausalText:
        """The streams' conditions as one batch (made again when a stream's prompt changed)."""
        ids = tuple(id(s.text) for s in self.streams)
        if self._text is None or self._text[0] != ids:
            self._text = (ids, CausalText(torch.cat([s.text.context for s in self.streams])))
        return self._text[1]

    def _call(self, x: torch.Tensor, timestep: float) -> torch.Tensor:
        """Every stream's chunk x (n, c, C, h, w) at `timestep` -> the network's outputs."""
        t = torch.full(x.shape[:2], 1 - timestep / 1000, dtype=torch.float64)
        self.calls += 1
        return -self.backbone.velocity(x, t, self.text(), self.cache)

    def _sync(self) -> None:
        for s in self.streams:
            s.cache.copy_counters(self.cache)

    def chunks(self, inputs: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The next chunk of every stream; `inputs`: each stream's input latents (c, C, h, w)
        (video-to-video), None for text-to-video."""
        if inputs is not None and len(inputs) != len(self.streams):
            raise StreamStudioError(f"{len(self.streams)} streams but {len(inputs)} inputs")
        c = self.streams[0].frames_of(self.streams[0].chunks)
        self.cache.rebase(self.backbone.model.rope, c)
        self.cache.reserve(c)
        self._sync()
        noise = [s.first_noise() for s in self.streams]
        if inputs is None:
            if self.cfg.strength < 1:
                raise StreamStudioError("strength < 1 needs input frames (video-to-video)")
            starts = [(n, s.steps) for n, s in zip(noise, self.streams)]
        else:
            starts = [s.v2v_start(x, n) for s, x, n in zip(self.streams, inputs, noise)]
        if all(steps == starts[0][1] for _, steps in starts):
            x0 = denoise(self._call, torch.stack([x for x, _ in starts]), starts[0][1], self.streams[0].table,
                         lambda step: torch.stack([s.noise_fn(s.chunks, step) for s in self.streams]))
        else:  # (their first steps differ: one stream at a time, each on its row)
            x0 = torch.stack([s._denoise(x, steps) for s, (x, steps) in zip(self.streams, starts)])
        if self.cfg.context_t is not None:
            self._call(x0, self.cfg.context_t)
        self.cache.commit(c)
        self._sync()
        for s, row in zip(self.streams, x0):
            s.keep(row)
        return x0
