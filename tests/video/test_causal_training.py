"""Teacher forcing (issue 49): the training's one call over [clean frames; noisy frames] gives each
noisy chunk what the cached path gives it when the chunks are made one after another, the clean
chunks committed at t = 0."""

from __future__ import annotations

import pytest
import torch

from streamstudio.models.video.causal_wan import CausalWan, CausalWanConfig, teacher_forcing_mask

TINY = CausalWanConfig(dim=32, ffn_dim=64, freq_dim=32, text_dim=16, text_len=4, in_dim=3, out_dim=3, num_heads=2,
                       num_layers=2, patch_size=(1, 4, 4))


def cached_outputs(model: CausalWan, clean: torch.Tensor, noisy: torch.Tensor, t: torch.Tensor, text, chunk: int,
                   window: int, sink: int) -> torch.Tensor:
    """The noisy chunks through the KV cache one after another, each clean chunk committed at t = 0."""
    b, f, _, h, w = clean.shape
    cache = model.new_cache(b, window, sink, h, w)
    outs = []
    for i in range(0, f, chunk):
        cache.rebase(model.rope, chunk)
        cache.reserve(chunk)
        outs.append(model(noisy[:, i:i + chunk], t[:, i:i + chunk], text, cache))
        model(clean[:, i:i + chunk], torch.zeros_like(t[:, i:i + chunk]), text, cache)
        cache.commit(chunk)
    return torch.cat(outs, dim=1)


def test_the_mask_by_hand():
    m = teacher_forcing_mask(frames=4, chunk=2, frame_tokens=1)  # [clean 0 1 2 3; noisy 0 1 2 3]
    want = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0],
                         [1, 1, 0, 0, 0, 0, 0, 0],
                         [1, 1, 1, 1, 0, 0, 0, 0],
                         [1, 1, 1, 1, 0, 0, 0, 0],
                         [0, 0, 0, 0, 1, 1, 0, 0],
                         [0, 0, 0, 0, 1, 1, 0, 0],
                         [1, 1, 0, 0, 0, 0, 1, 1],
                         [1, 1, 0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, want)
    assert teacher_forcing_mask(4, 2, 3).shape == (24, 24)
    with pytest.raises(ValueError):
        teacher_forcing_mask(5, 2, 1)


@pytest.mark.parametrize("window, sink", [(None, 0), (4, 0), (6, 2)])
def test_teacher_forcing_equals_the_cached_path(window, sink):
    torch.manual_seed(0)
    model = CausalWan(TINY).eval()
    b, f, chunk = 2, 8, 2
    clean = torch.randn(b, f, 3, 16, 16)
    noisy = torch.randn(b, f, 3, 16, 16)
    t = (torch.rand(b, f // chunk) * 1000).repeat_interleave(chunk, dim=1)  # (B, F) one timestep a chunk
    with torch.no_grad():
        text = model.embed_text(torch.randn(b, 3, TINY.text_dim))
        forced = model.teacher_forcing(clean, noisy, t, text, chunk, window, sink)
        cached = cached_outputs(model, clean, noisy, t, text, chunk, window or f, sink)
    assert forced.shape == (b, f, 3, 16, 16)
    torch.testing.assert_close(forced, cached, rtol=1e-4, atol=1e-5)
    if window is not None:  # the window matters: all the past would give other outputs
        full = model.teacher_forcing(clean, noisy, t, text, chunk)
        assert not torch.allclose(full[:, -chunk:], cached[:, -chunk:], atol=1e-4)
