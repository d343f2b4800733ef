"""The StreamDiT network: window attention, configs, checkpoints, text encoder, the Wan adapter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from streamstudio.errors import StreamStudioError
from streamstudio.models.video.stream_dit import (BASE_VOCAB, StreamDiT, StreamDiTConfig, WindowSelfAttention,
                                            count_parameters, load_checkpoint, named_config, save_checkpoint, tokenize,
                                            window_attention_mask, window_shift)
from streamstudio.models.video.wan import HashTextEmbedder, WanBackbone
from streamstudio.pipelines.video.stream_video import StreamBufferConfig, StreamSampler


@pytest.mark.parametrize("shift", [(0, 0, 0), (1, 2, 2)])
def test_window_attention_equals_dense_attention_with_mask(shift):
    torch.manual_seed(0)
    grid, window, d = (4, 4, 8), (2, 4, 4), 16
    attn = WindowSelfAttention(d, heads=2).double()
    x = torch.randn(2, *grid, d, dtype=torch.float64)  # (B, F, H, W, D)
    out = attn(x, window, shift)
    flat = x.reshape(2, -1, d)
    q, k, v = attn.qkv(flat).view(2, flat.shape[1], 3, 2, d // 2).permute(2, 0, 3, 1, 4)
    mask = window_attention_mask(grid, window, shift)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    dense = attn.proj(dense.transpose(1, 2).reshape(flat.shape)).view_as(out)
    torch.testing.assert_close(out, dense, rtol=1e-10, atol=1e-10)
    # the mask is really local: a dense unmasked attention differs
    full = F.scaled_dot_product_attention(q, k, v)
    full = attn.proj(full.transpose(1, 2).reshape(flat.shape)).view_as(out)
    assert (full - out).abs().max() > 1e-4


def test_shift_is_half_a_window_on_odd_layers():
    assert window_shift((4, 8, 8), 0, True) == (0, 0, 0)
    assert window_shift((4, 8, 8), 1, True) == (2, 4, 4)
    assert window_shift((4, 8, 8), 1, False) == (0, 0, 0)
    # an axis the window spans whole is not shifted (Swin): the tiny model's 8x8 tokens
    assert window_shift((4, 8, 8), 1, True, grid=(8, 8, 8)) == (2, 0, 0)


def test_shifted_layer_never_attends_across_the_buffer_ends():
    """Perturb the newest frames' tokens; in a shifted layer the oldest frames' outputs stay
    the same (with the old unmasked wrap-around they would change), while the frames inside
    the newest frames' own shifted window do change."""
    torch.manual_seed(0)
    grid, window, d = (8, 2, 2), (4, 2, 2), 16
    shift = window_shift(window, 1, True, grid)
    assert shift == (2, 0, 0)
    attn = WindowSelfAttention(d, heads=2).double()
    x = torch.randn(1, *grid, d, dtype=torch.float64)  # (B, F, H, W, D), frame 0 oldest
    y = x.clone()
    y[:, 6:] += torch.randn_like(y[:, 6:])  # the two newest frames
    with torch.no_grad():
        a, b = attn(x, window, shift), attn(y, window, shift)
    change = (a - b).abs().amax(dim=(0, 2, 3, 4))  # (F,) per frame
    # shifted windows cut the frame axis at 2 and 6: {0, 1}, {2..5}, {6, 7}
    assert change[:6].max() == 0
    assert change[6:].min() > 1e-3
    # the first built-in checkpoint's wrap-around (shift_mask off, what configs without the key
    # load as): the newest frames do reach the oldest
    wrapped = WindowSelfAttention(d, heads=2, shift_mask=False).double()
    wrapped.load_state_dict(attn.state_dict())
    with torch.no_grad():
        assert (wrapped(x, window, shift) - wrapped(y, window, shift))[:, :2].abs().max() > 1e-3
    assert StreamDiTConfig.from_dict({}).shift_mask is False and StreamDiTConfig().shift_mask is True
    # the same perturbation of frames 4, 5 reaches frames 2..5 only
    z = x.clone()
    z[:, 4:6] += 1.0
    with torch.no_grad():
        change = (a - attn(z, window, shift)).abs().amax(dim=(0, 2, 3, 4))
    assert change[[0, 1, 6, 7]].max() == 0 and change[2:6].min() > 1e-3


def test_model_output_of_oldest_frames_ignores_a_newest_frame_beyond_the_windows():
    """In the whole network (2 layers: unshifted windows {0..3}, {4..7}, then shifted {0, 1},
    {2..5}, {6, 7}), frame 7 can reach frames 4..7 and through them 2..5, never frames 0, 1."""
    torch.manual_seed(0)
    model = StreamDiT(StreamDiTConfig(hidden_size=32, depth=2, num_heads=2, window=(4, 8, 8))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        text = model.encode_text("a red circle")
        x = torch.randn(1, 8, 3, 16, 16)  # (B, F, C, H, W)
        t = torch.linspace(1, 0, 8)[None]  # oldest frames nearly clean, newest pure noise
        y = x.clone()
        y[:, 7] = torch.randn_like(y[:, 7])
        change = (model(x, t, text) - model(y, t, text)).abs().amax(dim=(0, 2, 3, 4))  # (F,)
    assert change[:2].max() == 0
    assert change[2:].min() > 1e-6


def test_named_configs_sizes():
    tiny = StreamDiT(named_config("tiny"))
    assert 1_000_000 <= count_parameters(tiny) <= 2_000_000
    with torch.device("meta"):
        big = StreamDiT(named_config("4b"))
    assert 3.5e9 <= count_parameters(big) <= 4.5e9
    with pytest.raises(StreamStudioError):
        named_config("huge")


def test_forward_shapes_per_frame_time_and_text_matter():
    torch.manual_seed(0)
    model = StreamDiT(named_config("tiny")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        x = torch.randn(1, 8, 3, 32, 32)  # (B, F, C, H, W)
        t = torch.linspace(0, 0.9, 8)[None]
        red, blue = model.encode_text("a red circle"), model.encode_text("a blue circle")
        v = model(x, t, red)
        assert v.shape == x.shape
        t2 = t.clone()
        t2[0, 3] = 0.5
        assert not torch.allclose(model(x, t2, red), v)
        assert not torch.allclose(model(x, t, blue), v)
    with pytest.raises(StreamStudioError):
        model(torch.randn(1, 6, 3, 32, 32), torch.zeros(1, 6), red)  # 6 frames: not a multiple of window 4


def test_tokenizer_known_and_hashed_words():
    cfg = named_config("tiny").text
    ids = tokenize("A red Circle, zebra!", cfg)
    assert len(ids) == 4 and ids[3] >= len(BASE_VOCAB) and ids[1] < len(BASE_VOCAB)  # unknown word: hashed
    assert tokenize("red", cfg) == tokenize("RED", cfg)


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(1)
    model = StreamDiT(StreamDiTConfig(hidden_size=32, depth=2, num_heads=2))
    save_checkpoint(model, tmp_path / "ck", {"sampling": {"num_chunks": 4}})
    loaded, meta = load_checkpoint(tmp_path / "ck")
    assert meta["sampling"]["num_chunks"] == 4 and loaded.cfg == model.cfg
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(StreamStudioError, match="train-video"):
        load_checkpoint(tmp_path / "missing")


def tiny_wan():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                 out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2,
                                 rope_max_seq_len=32).eval()


def test_wan_adapter_per_frame_timesteps():
    wan = tiny_wan()
    backbone = WanBackbone(wan, HashTextEmbedder(16))
    text = backbone.encode_text("a red circle")
    x = torch.randn(1, 4, 4, 8, 8)  # (B, F, C, H, W)
    with torch.no_grad():
        same = backbone.velocity(x, torch.full((1, 4), 0.25), text)
        ref = wan(x.permute(0, 2, 1, 3, 4), timestep=torch.tensor([750.0]), encoder_hidden_states=text,
                  return_dict=False)[0]
        torch.testing.assert_close(same, -ref.permute(0, 2, 1, 3, 4), rtol=1e-4, atol=1e-5)
        mixed = backbone.velocity(x, torch.tensor([[0.25, 0.25, 0.9, 0.25]]), text)
    assert not torch.allclose(mixed[:, 2], same[:, 2], atol=1e-6)
    # and it drives the buffer sampler
    sampler = StreamSampler(backbone, StreamBufferConfig(num_chunks=2, chunk_size=2, micro_steps=1), (4, 8, 8), "red")
    sampler.start()
    out = [sampler.step() for _ in range(2)]
    assert all(o is not None and o.shape == (2, 4, 8, 8) and torch.isfinite(o).all() for o in out)


def test_4b_benchmark_feeds_512p_latents_of_an_8x_vae():
    """512p video through an 8x VAE of 16 channels is 64x64 latents per frame (16 frames): the
    benchmark feeds that shape, labels it so, and the 4B model runs it (on the meta device)."""
    import sys
    from pathlib import Path

    bench_dir = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    import stream_video as bench

    assert bench.LATENT_4B_512P == (1, 16, 16, 512 // 8, 512 // 8)
    assert "64x64 latents" in bench.LATENT_LABEL
    with torch.device("meta"):
        model = StreamDiT(named_config("4b"))
        out = model(torch.empty(*bench.LATENT_4B_512P), torch.rand(1, 16), model.encode_text("a red circle"))
    assert tuple(out.shape) == bench.LATENT_4B_512P
    assert bench.TOKENS_4B_512P == (16, 64 // model.cfg.patch_size, 64 // model.cfg.patch_size)
    if not torch.cuda.is_available():
        g = bench.gpu_4b(1)
        assert g["step_ms"] is None and g["paper_step_ms_h100"] == 482 and g["target_ms_h100"] == 350
        assert "missing" in bench.step_text(g) and "482" in bench.step_text(g)


def test_gpu_timer_of_the_video_benchmark_runs_with_a_faked_device(monkeypatch):
    """benchmarks/stream_video.cuda_median_ms (the 4B and Wan rows' timer) warms up once, then
    times each call synchronised; executed here with a faked synchronize."""
    import sys
    from pathlib import Path

    bench_dir = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    import stream_video as bench

    syncs, calls = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(1))
    ms = bench.cuda_median_ms(lambda: calls.append(torch.is_inference_mode_enabled()), 3)
    assert ms >= 0 and len(calls) == 4 and all(calls) and len(syncs) == 4


def test_builtin_frame_rate_runs_with_the_checkpoints_solver_and_euler_beside_it(monkeypatch):
    """benchmarks/stream_video.builtin_fps samples with the checkpoint's own solver (its label
    names it) and times Euler beside it when the checkpoint's is another."""
    import sys
    from pathlib import Path

    bench_dir = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    import stream_video as bench

    model, meta = bench.load_builtin()
    solvers = []
    real = bench.StreamBufferConfig
    monkeypatch.setattr(bench, "StreamBufferConfig", lambda **kw: solvers.append(kw["solver"]) or real(**kw))
    for solver in ("heun", "euler"):
        smp = {**meta["sampling"], "solver": solver}
        monkeypatch.setattr(bench, "load_builtin", lambda smp=smp: (model, {**meta, "sampling": smp}))
        solvers.clear()
        f = bench.builtin_fps(1)
        assert f["frames"] >= 1 and f["fps"] > 0
        assert solvers == ([solver, "euler"] if solver != "euler" else ["euler"])
        assert ("fps_euler" in f) == (solver != "euler") and (solver in f["buffer"]) == (solver != "euler")
