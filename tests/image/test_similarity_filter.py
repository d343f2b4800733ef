"""The stochastic similarity filter against its formula."""

from __future__ import annotations

import math

import pytest
import torch

from streamstudio.pipelines.image.similarity_filter import SimilarityFilter, SimilarityFilterConfig, skip_probability


def pair_with_similarity(s: float, dim: int = 4096, seed: int = 0):
    """Two vectors whose cosine similarity is exactly s."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(dim, generator=g)
    a /= a.norm()
    r = torch.randn(dim, generator=g)
    r -= (r @ a) * a
    r /= r.norm()
    return a, s * a + math.sqrt(1 - s * s) * r


def test_formula():
    assert skip_probability(1.0, 0.98) == 1.0
    assert skip_probability(0.98, 0.98) == 0.0
    assert skip_probability(0.5, 0.98) == 0.0
    assert skip_probability(0.99, 0.98) == pytest.approx(0.5)
    assert skip_probability(0.995, 0.9) == pytest.approx(1 - 0.005 / 0.1)


@pytest.mark.parametrize("s,threshold", [(0.99, 0.98), (0.97, 0.9), (0.999, 0.99)])
def test_skip_rate_matches_formula(s, threshold):
    a, b = pair_with_similarity(s)
    p = skip_probability(s, threshold)
    trials, skips = 3000, 0
    for trial in range(trials):  # a new filter (seed) per trial: each trial's one draw is its own
        flt = SimilarityFilter(SimilarityFilterConfig(threshold=threshold, max_skip_frame=10**9, seed=trial))
        assert not flt.should_skip(a)  # the first frame is always processed
        skips += flt.should_skip(b)
    bound = 4 * math.sqrt(p * (1 - p) / trials) + 1e-9
    assert abs(skips / trials - p) <= bound, (skips / trials, p)
    assert flt.last_similarity == pytest.approx(s, abs=1e-5)


def test_very_different_frames_never_skipped():
    a, b = pair_with_similarity(0.5)
    flt = SimilarityFilter(SimilarityFilterConfig(threshold=0.9, max_skip_frame=10**9))
    results = [flt.should_skip(x) for _ in range(200) for x in (a, b)]
    assert not any(results)


def test_max_skip_frame_forces_processing():
    x = torch.ones(64)
    flt = SimilarityFilter(SimilarityFilterConfig(threshold=0.9, max_skip_frame=3))
    pattern = [flt.should_skip(x) for _ in range(9)]
    # identical frames have p = 1: three skips, then one forced through
    assert pattern == [False, True, True, True, False, True, True, True, False]
    assert flt.skip_rate == pytest.approx(6 / 9)


def test_a_forced_frame_reads_no_similarity(monkeypatch):
    """After max_skip_frame skips the next frame is processed whatever its similarity, so the
    filter does not compute (and wait for) it."""
    from streamstudio import kernels
    from streamstudio.pipelines.image.similarity_filter import SimilarityFilter, SimilarityFilterConfig

    calls = []
    real = kernels.cosine_similarity
    monkeypatch.setattr(kernels, "cosine_similarity", lambda a, b: calls.append(1) or real(a, b))
    filt = SimilarityFilter(SimilarityFilterConfig(threshold=0.5, max_skip_frame=2, seed=0))
    x = torch.ones(1, 3, 4, 4)
    decisions = [filt.should_skip(x) for _ in range(7)]
    assert decisions == [False, True, True, False, True, True, False]  # identical frames: p = 1
    assert len(calls) == 4  # frames 1, 2, 4, 5; not the first nor the forced ones


def test_reset_is_a_new_filter():
    """After reset() the filter skips exactly what a fresh one with its seed skips: a pipeline
    reused for the next file of a batch matches a render of that file alone."""
    a, b = pair_with_similarity(0.99)
    frames = [a, b] * 40  # random decisions: p = 0.5 for b after a processed a

    def decisions(flt):
        return [flt.should_skip(x) for x in frames]

    config = SimilarityFilterConfig(threshold=0.98, max_skip_frame=10**9, seed=5)
    used = SimilarityFilter(config)
    first = decisions(used)
    assert any(first) and not all(first[1:])  # the draws decided: some skipped, some not
    used.reset()
    assert decisions(used) == first == decisions(SimilarityFilter(config))
