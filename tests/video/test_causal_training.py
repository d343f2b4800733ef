"""Teacher forcing (issue 49): the training's one call over [clean frames; noisy frames] gives each
noisy chunk what the cached path gives it when the chunks are made one after another, the clean
chunks committed at t = 0."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from streamstudio.app.training.causal import CausalTrainer, draw, text_batch
from streamstudio.app.training.config import CausalTrainConfig
from streamstudio.errors import StreamStudioError
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


TRAIN = ["train-video", "--causal", "--dim", "24", "--layers", "1", "--heads", "2", "--size", "16",
         "--clip-frames", "4", "--chunk-frames", "2", "--batch-size", "2", "--warmup", "10", "--cpu", "--no-progress",
         "--sample-steps", "1000,500", "--context-noise", "0.1"]


def test_cli_trains_a_causal_checkpoint_that_resumes_exactly_and_renders(tmp_path, capsys):
    """`train-video --causal` writes a project causal checkpoint; 2 steps then --resume to 3 give the
    weights of 3 steps in one run (batches, levels and noise seeded by step); the checkpoint loads
    and streams with its stored sampling."""
    from safetensors.torch import load_file

    from streamstudio.app.cli import main
    from streamstudio.models.video.causal_checkpoint import load_causal_checkpoint
    from streamstudio.pipelines.video.causal_video import CausalConfig, CausalStreamConfig, CausalVideoStream
    from streamstudio.models.video.causal_backbone import CausalWanBackbone

    a, b = tmp_path / "a", tmp_path / "b"
    assert main(TRAIN + ["--output", str(a), "--steps", "3"]) == 0
    assert "trained 3 steps" in capsys.readouterr().out
    assert main(TRAIN + ["--output", str(b), "--steps", "2"]) == 0
    assert main(TRAIN + ["--output", str(b), "--steps", "3", "--resume"]) == 0
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    causal = load_causal_checkpoint(a)
    smp = causal.sampling
    assert smp["steps"] == [1000.0, 500.0] and smp["chunk_frames"] == 2 and smp["window"] == 4
    assert (smp["height"], smp["width"]) == (16, 16)
    cfg = CausalConfig(chunk_frames=2, steps=tuple(smp["steps"]), warp=smp["warp"], shift=smp["shift"], window=4)
    stream = CausalVideoStream(CausalWanBackbone(causal.model, causal.text_encoder), CausalStreamConfig(cfg, 16, 16),
                               "a red circle moving left")
    frames = list(stream.frames(5))
    assert len(frames) == 5 and frames[0].shape == (16, 16, 3)
    assert main(TRAIN + ["--output", str(a), "--clip-frames", "5"]) == 1  # not whole chunks: a clear error
    assert main(TRAIN + ["--output", str(tmp_path / "c"), "--steps", "1", "--resume"]) == 1  # nothing to resume


def test_caption_dropout_and_a_fine_tune_from_another_run(tmp_path):
    """--cond-drop empties a share of the captions (drawn after everything else: a run without it
    draws the same clips, levels and noise); --init starts from another run's weights, refused for
    another shape."""
    cfg = CausalTrainConfig(output=str(tmp_path / "a"), dim=32, ffn_dim=64, layers=1, heads=2, patch=8, steps=2,
                            batch_size=16, frames=4, chunk_frames=2, cpu=True, progress=False, save_every=2)
    plain = draw(cfg, None, 3)
    dropped = draw(replace(cfg, cond_drop=0.5), None, 3)
    for a, b in zip(plain[:1] + plain[2:], dropped[:1] + dropped[2:]):
        assert torch.equal(a, b)
    empty = [c for c in dropped[1] if c == ""]
    assert 2 <= len(empty) <= 14 and all(c == p for c, p in zip(dropped[1], plain[1]) if c)
    CausalTrainer(cfg).train()
    tuned = CausalTrainer(replace(cfg, output=str(tmp_path / "b"), init=str(tmp_path / "a")))
    saved = load_file(str(tmp_path / "a" / "model.safetensors"))
    assert all(torch.equal(tuned.model.state_dict()[k], v) for k, v in saved.items()) and tuned.step == 0
    with pytest.raises(StreamStudioError, match="another shape"):
        CausalTrainer(replace(cfg, output=str(tmp_path / "d"), dim=64, ffn_dim=128, init=str(tmp_path / "a")))


@pytest.mark.parametrize("first, sink", [(0, 0), (4, 0), (0, 2)])
def test_first_chunks_add_first_chunks_made_with_no_past(tmp_path, first, sink):
    """--first-chunks n adds n clips of their own a step, trained as a stream's first chunk (made
    by the model alone, nothing before it; --first-chunk-frames long, one noise level): the loss is
    the mean over every frame made. The first chunk's length is the checkpoint's sampling default.
    With --sink the main clips keep sink frames; a first chunk has none (it has no past)."""
    cfg = CausalTrainConfig(output=str(tmp_path / "a"), dim=32, ffn_dim=64, layers=1, heads=2, patch=8, steps=1,
                            batch_size=3, frames=4, chunk_frames=2, cpu=True, progress=False, context_noise=0.1,
                            window=4 if sink else 0, sink=sink)
    trainer = CausalTrainer(replace(cfg, first_chunks=5, first_chunk_frames=first))
    model, n = trainer.model.eval(), first or 2
    with torch.no_grad():
        plain, mixed = trainer.clip_loss(cfg, 7), trainer.loss(7)
        clips, caps, sigma, noise, _ = draw(replace(cfg, batch_size=5, frames=n, chunk_frames=n,
                                                    seed=cfg.seed + 10**9), None, 7)
        assert torch.equal(sigma, sigma[:, :1].expand(-1, n))
        assert not torch.equal(clips[:3, :2], draw(cfg, None, 7)[0][:, :2])  # not the main clips' starts
        noisy = (1 - sigma[:, :, None, None, None]) * clips + sigma[:, :, None, None, None] * noise
        # a first chunk, without a cache: its frames attend to each other and to nothing before them
        out = model(noisy, sigma * 1000, model.embed_text(text_batch(trainer.text, caps, cfg.text_len)))
        loss = (out - (noise - clips)).pow(2).mean()
    assert torch.allclose(mixed, (plain * 12 + loss * 5 * n) / (12 + 5 * n), atol=1e-5)
    assert trainer.sampling().get("first_chunk_frames") == (first or None)
    with pytest.raises(StreamStudioError, match="--first-chunks"):
        CausalTrainer(replace(cfg, first_chunk_frames=4))


def test_self_context_reads_the_models_own_chunks(tmp_path, monkeypatch):
    """--self-context p: a share p of the clips read the model's own frames, each chunk noised to the
    sampler's last step's level and predicted back. A model that predicts perfectly (velocity =
    noise - data) gives back the data's frames; one that predicts nothing leaves the noise there."""
    cfg = CausalTrainConfig(output=str(tmp_path / "a"), dim=32, ffn_dim=64, layers=1, heads=2, patch=8, steps=1,
                            batch_size=32, frames=4, chunk_frames=2, cpu=True, progress=False, self_context=0.5)
    trainer = CausalTrainer(cfg)
    clips, caps, _, _, context = draw(cfg, None, 3)
    text = trainer.model.embed_text(text_batch(trainer.text, caps, cfg.text_len))
    s = cfg.sampling["steps"][-1] / 1000
    monkeypatch.setattr(trainer.model, "teacher_forcing",
                        lambda clean, noisy, t, *a: (noisy - clean) / (t / 1000)[:, :, None, None, None])
    np.testing.assert_allclose(trainer.own_context(cfg, 3, context, text), context, atol=1e-5)
    monkeypatch.setattr(trainer.model, "teacher_forcing", lambda clean, noisy, t, *a: torch.zeros_like(noisy))
    own = trainer.own_context(cfg, 3, context, text)
    changed = (own != context).flatten(1).any(1)  # (B,)
    assert 8 <= int(changed.sum()) <= 24  # about half the clips
    residual = (own[changed] - (1 - s) * context[changed]) / s  # the noise left in: about unit variance
    assert 0.8 < float(residual[own[changed].abs() < 1].std()) < 1.2


def test_self_rollout_reads_the_models_own_earlier_chunks(tmp_path, monkeypatch):
    """--self-rollout: the chosen clips' chunks made one after another, chunk j reading the model's own
    chunks before it. A fake model whose clean estimate of chunk j is its past chunk j - 1 plus 0.5
    (chunk 0: -0.5) gives, rolled out, chunks -0.5 and 0 (read from its own -0.5); the one-step
    way gives chunk 1 = the data's chunk 0 + 0.5. The last chunk, read by no noisy chunk, stays the
    data's, and the clips not chosen keep the data's frames."""
    cfg = CausalTrainConfig(output=str(tmp_path / "a"), dim=32, ffn_dim=64, layers=1, heads=2, patch=8, steps=1,
                            batch_size=32, frames=6, chunk_frames=2, cpu=True, progress=False, self_context=0.5,
                            self_rollout=True)
    trainer = CausalTrainer(cfg)
    clips, caps, _, _, context = draw(cfg, None, 3)
    text = trainer.model.embed_text(text_batch(trainer.text, caps, cfg.text_len))
    calls = []

    def shifted(clean, noisy, t, *a):  # x0 of chunk j: clean chunk j - 1 + 0.5; v = (noisy - x0) / s
        calls.append(clean.shape[0])
        x0 = torch.full_like(noisy, -0.5)
        x0[:, 2:] = clean[:, :-2] + 0.5
        return (noisy - x0) / (t / 1000)[:, :, None, None, None]

    monkeypatch.setattr(trainer.model, "teacher_forcing", shifted)
    own = trainer.own_context(cfg, 3, context, text)
    changed = (own != context).flatten(1).any(1)  # (B,)
    assert 8 <= int(changed.sum()) <= 24 and calls == [int(changed.sum())] * 2  # a pass a chunk read
    np.testing.assert_allclose(own[changed][:, :2], -0.5, atol=1e-5)
    np.testing.assert_allclose(own[changed][:, 2:4], 0.0, atol=1e-5)
    np.testing.assert_allclose(own[:, 4:], context[:, 4:])
    np.testing.assert_allclose(own[~changed], context[~changed])
    one_step = trainer.own_context(replace(cfg, self_rollout=False), 3, context, text)
    np.testing.assert_allclose(one_step[changed][:, 2:4], (context[changed][:, :2] + 0.5).clamp(-1, 1), atol=1e-5)
    calls.clear()  # a batch that chooses no clip reads the data's frames, with no pass made
    np.testing.assert_allclose(trainer.own_context(replace(cfg, self_context=1e-9), 3, context, text), context)
    assert calls == []
    with pytest.raises(StreamStudioError, match="--self-context"):
        CausalTrainer(replace(cfg, self_context=0.0))


@pytest.mark.parametrize("rollout", [False, True])
def test_every_weight_learns_with_self_context(tmp_path, rollout):
    """The passes that make the model's own chunks run without a gradient: they must not leave the
    prompt's cross-attention keys and values, cached on the text, to the training call after them
    (the text's path then learnt nothing: the shipped model's fine-tune ran so)."""
    cfg = CausalTrainConfig(output=str(tmp_path / "a"), dim=32, ffn_dim=64, layers=1, heads=2, patch=8, steps=1,
                            batch_size=4, frames=4, chunk_frames=2, cpu=True, progress=False, self_context=1.0,
                            self_rollout=rollout)
    trainer = CausalTrainer(cfg)
    trainer.loss(2).backward()
    silent = [n for n, p in trainer.model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert silent == []


@pytest.mark.parametrize("min_ratio", [0.1, 0.0])
def test_the_trainers_learning_rate_is_warm_up_then_torchs_cosine_annealing(min_ratio):
    """`training.loop.cosine_lr` (every trainer's schedule): a linear warm-up to the base rate, then
    what torch's CosineAnnealingLR (SGDR without restarts) gives from there down to min_ratio x base."""
    from streamstudio.app.training.loop import cosine_lr

    base, warmup, total = 1e-3, 10, 110
    assert [cosine_lr(base, s, total, warmup, min_ratio) for s in range(warmup)] == \
        pytest.approx([base * (s + 1) / warmup for s in range(warmup)])
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup, eta_min=min_ratio * base)
    for s in range(warmup, total + 1):
        assert cosine_lr(base, s, total, warmup, min_ratio) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9), s
        opt.step()
        sched.step()
    assert cosine_lr(base, total + 50, total, warmup, min_ratio) == pytest.approx(min_ratio * base)  # flat after
