"""Stochastic similarity filter (StreamDiffusion, arXiv 2312.12491, section 3.4).

A frame whose cosine similarity S to the last *processed* input is high is skipped with
probability p = max(0, 1 - (1 - S) / (1 - threshold)); a skipped frame costs no network call
and repeats the last output. After `max_skip_frame` skips in a row the next frame is forced
through, so a static scene still refreshes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from streamstudio import kernels


def skip_probability(similarity: float, threshold: float) -> float:
    """p = max(0, 1 - (1 - S) / (1 - threshold)); threshold 1 never skips."""
    if threshold >= 1.0:
        return 0.0
    return max(0.0, 1.0 - (1.0 - similarity) / (1.0 - threshold))


@dataclass
class SimilarityFilterConfig:
    threshold: float = 0.98
    max_skip_frame: int = 10
    seed: int = 0


class SimilarityFilter:
    """Decides per input frame whether to skip it; keeps the last processed input."""

    def __init__(self, config: SimilarityFilterConfig | None = None):
        self.config = config or SimilarityFilterConfig()
        self._rng = random.Random(self.config.seed)
        self._last: torch.Tensor | None = None
        self.skip_run = 0  # skips in a row
        self.skipped = 0
        self.processed = 0
        self.last_similarity: float | None = None

    def reset(self) -> None:
        """As a new filter: no last input, and its random draws start again from the seed (a
        reused pipeline's next stream skips exactly the frames a fresh one would)."""
        self._last = None
        self.skip_run = 0
        self._rng = random.Random(self.config.seed)

    def should_skip(self, x: torch.Tensor) -> bool:
        """True when `x` should be skipped; otherwise `x` becomes the last processed input.

        Reading the similarity makes the host wait for the device, so a frame that must be
        processed anyway (max_skip_frame skips in a row) does not compute it."""
        if self._last is not None and self._last.shape == x.shape and self.skip_run < self.config.max_skip_frame:
            sim = float(kernels.cosine_similarity(x, self._last))
            self.last_similarity = sim
            p = skip_probability(sim, self.config.threshold)
            if self._rng.random() < p:
                self.skip_run += 1
                self.skipped += 1
                return True
        self._last = x.detach().clone()
        self.skip_run = 0
        self.processed += 1
        return False

    @property
    def skip_rate(self) -> float:
        total = self.skipped + self.processed
        return self.skipped / total if total else 0.0
