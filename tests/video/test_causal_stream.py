"""The causal video pipeline's stream (issue 49): bounded memory, RoPE rebasing, prompt re-cache,
StreamDiffusionV2's motion-aware strength, the frame API with a pixel and a temporal codec, the
checkpoint loaders and `render --pipeline video` over a causal checkpoint."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from streamstudio.app.streams.video import build_stream, load_video_model
from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.video import causal_checkpoint as cc
from streamstudio.models.video.causal_backbone import CausalWanBackbone
from streamstudio.models.video.causal_wan import WAN_1_3B_CONFIG, CausalWan, CausalWanConfig, KVCache, rope_tables
from streamstudio.pipelines.video.causal_batch import CausalBatch
from streamstudio.pipelines.video.causal_video import (CausalConfig, CausalSampler, CausalStreamConfig,
                                                       CausalVideoStream, FlowTable)

TINY = CausalWanConfig(dim=32, ffn_dim=64, freq_dim=16, text_dim=8, text_len=8, in_dim=3, out_dim=3, num_heads=2,
                       num_layers=2, patch_size=(1, 4, 4))


def text(prompt: str) -> torch.Tensor:
    return torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(len(prompt) * 7919 + ord((prompt or " ")[0])))


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    return CausalWanBackbone(CausalWan(TINY).eval(), text)


def sampler(backbone, **kw) -> CausalSampler:
    cfg = dict(chunk_frames=2, window=8, sink=2, steps=(1000.0, 500.0), shift=3.0)
    return CausalSampler(backbone, CausalConfig(**{**cfg, **kw}), (3, 16, 16), "a red circle")


def test_memory_stays_fixed_and_the_window_rolls(backbone):
    s = sampler(backbone)
    k, v, nbytes = s.cache.k, s.cache.v, s.cache_bytes
    for _ in range(12):
        s.chunk()
    assert s.cache.k is k and s.cache.v is v and s.cache_bytes == nbytes  # nothing grew or was reallocated
    assert s.cache.frames == 8 and s.cache.dropped == 24 - 8 and len(s.kept) == 8
    assert s.cache.position == 24


def test_rope_rebase_keeps_relative_positions(backbone):
    """Without sink frames, renumbering the window (past a short RoPE table) changes no relative
    position: the chunks equal those made with Wan's full table."""
    long_run = sampler(backbone, sink=0)
    short = CausalWanBackbone(CausalWan(TINY).eval(), text)
    short.model.load_state_dict(backbone.model.state_dict())
    short.model.rope = tuple(t[:14] for t in rope_tables(TINY.head_dim))  # 14 positions: rebases from chunk 7 on
    short_run = CausalSampler(short, CausalConfig(chunk_frames=2, window=8, sink=0, steps=(1000.0, 500.0),
                                                  shift=3.0), (3, 16, 16), "a red circle")
    for i in range(12):
        a, b = long_run.chunk(), short_run.chunk()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"chunk {i}")
    assert short_run.cache.position < 14 < long_run.cache.position


def test_rebase_turns_the_window_keys_back():
    """A key rotated at position p, turned back by the gap g, is the key rotated at p - g (time pairs)."""
    tables = rope_tables(12)
    cache = KVCache(torch.zeros(1, 1, 6, 1, 12), torch.zeros(1, 1, 6, 1, 12), window=6, sink=1, frame_tokens=1,
                    frames=3, position=1000)
    raw = torch.randn(12, dtype=torch.float64)
    z = torch.view_as_complex(raw.reshape(6, 2))
    pairs = tables[0].shape[1]
    for slot, pos in ((1, 998), (2, 999)):
        rot = z.clone()
        rot[:pairs] = rot[:pairs] * tables[0][pos]
        cache.k[0, 0, slot, 0] = torch.view_as_real(rot).flatten().float()
    cache.rebase(tables, 30)  # 1000 + 30 > 1024: the window (998, 999) follows the sink (0): 1, 2
    assert cache.position == 3
    for slot, pos in ((1, 1), (2, 2)):
        want = z.clone()
        want[:pairs] = want[:pairs] * tables[0][pos]
        torch.testing.assert_close(cache.k[0, 0, slot, 0], torch.view_as_real(want).flatten().float(),
                                   rtol=1e-5, atol=1e-5)


def test_a_new_prompt_recaches_the_kept_frames(backbone):
    """After a prompt change the cache holds the kept frames' keys under the new prompt, as the
    model computes them chunk by chunk on a fresh cache."""
    s = sampler(backbone, window=12)
    for _ in range(3):
        s.chunk()
    before = s.cache.k.clone()
    s.set_prompt("a blue square")
    assert not torch.equal(before, s.cache.k)
    fresh = backbone.new_cache(12, 2, 16, 16)
    new_text = backbone.encode_text("a blue square")
    for i in range(0, 6, 2):
        fresh.reserve(2)
        t = torch.zeros(1, 2, dtype=torch.float64)  # timestep 0: the clean frames
        backbone.model(torch.stack(s.kept[i:i + 2])[None], t, new_text, fresh)
        fresh.commit(2)
    torch.testing.assert_close(s.cache.k[:, :, :6 * 16], fresh.k[:, :, :6 * 16], rtol=1e-5, atol=1e-5)
    assert s.cache.position == 6 and s.cache.frames == 6


def test_motion_aware_strength_follows_streamdiffusionv2(backbone):
    """sigma <- 0.9 (strength - 0.1 m) + 0.1 sigma, m = max per-frame RMS change / 0.2 in [0, 1]."""
    s = sampler(backbone, strength=0.8, motion_aware=True)
    prev = torch.zeros(3, 4, 4)
    s.follow_motion(torch.full((2, 3, 4, 4), 0.1), prev)  # RMS change 0.1, then 0: m = 0.5
    assert s.sigma == pytest.approx(0.9 * (0.8 - 0.05) + 0.1 * 0.8)
    s.follow_motion(torch.full((2, 3, 4, 4), 0.1), torch.full((3, 4, 4), 0.1))  # still: m = 0
    assert s.sigma == pytest.approx(0.9 * 0.8 + 0.1 * 0.755)
    s.follow_motion(torch.ones(1, 3, 4, 4), -torch.ones(3, 4, 4))  # RMS 2: m clamps at 1
    assert s.sigma == pytest.approx(0.9 * 0.7 + 0.1 * 0.7955)


def test_video_to_video_starts_at_strength(backbone):
    """The input noised to sigma = strength; the first step 1000 sigma - 100, then the steps below it."""
    s = sampler(backbone, strength=0.6, steps=(1000.0, 750.0, 500.0, 250.0), warp=False)
    seen = []
    real = s._call
    s._call = lambda x, ts, first_frame=None: (seen.append(ts), real(x, ts, first_frame))[1]
    s.chunk(torch.zeros(2, 3, 16, 16))
    assert seen == [500.0, 250.0, 0.0]  # 600 - 100, the steps below it, the context call
    for strength, first in ((0.2, 100.0), (0.12, 60.0), (0.05, 25.0)):  # below 0.2: half the level, never 0
        s = sampler(backbone, strength=strength, steps=(1000.0, 750.0, 500.0, 250.0), warp=False)
        seen = []
        real = s._call
        s._call = lambda x, ts, first_frame=None: (seen.append(ts), real(x, ts, first_frame))[1]
        s.chunk(torch.zeros(2, 3, 16, 16))
        assert seen == [first, 0.0]


def test_strength_changes_from_the_next_chunk_and_keeps_the_cache(backbone):
    """`set_strength`: the next chunk starts at the new level's step (StreamDiffusionV2's 1000 sigma -
    100), the frames already cached stay; text-to-video and levels outside (0, 1) are refused."""
    s = sampler(backbone, strength=0.6, steps=(1000.0, 750.0, 500.0, 250.0), warp=False)
    s.chunk(torch.zeros(2, 3, 16, 16))
    cached = (s.cache.frames, s.cache.k.clone())
    s.set_strength(0.9)
    assert (s.cache.frames, s.sigma) == (cached[0], 0.9) and torch.equal(s.cache.k, cached[1])
    seen = []
    real = s._call
    s._call = lambda x, ts, first_frame=None: (seen.append(ts), real(x, ts, first_frame))[1]
    s.chunk(torch.zeros(2, 3, 16, 16))
    assert seen == [800.0, 750.0, 500.0, 250.0, 0.0]  # 900 - 100, the steps below it, the context call
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(StreamStudioError, match=r"in \(0, 1\)"):
            s.set_strength(bad)
    with pytest.raises(StreamStudioError, match="text-to-video"):
        sampler(backbone).set_strength(0.5)


def test_flow_table_is_the_references():
    """Self-Forcing's warped list at shift 5: 1000 -> 1000, 750 -> 937.5, 500 -> 833.3, 250 -> 625.0
    (sigma' = 5s / (1 + 4s) at s = 0.75, 0.5, 0.25); the sigma of a timestep is the nearest entry's."""
    table = FlowTable(5.0)
    assert [round(table.warp(s), 1) for s in (1000, 750, 500, 250)] == [1000.0, 937.5, 833.3, 625.0]
    assert table.sigma(937.5) == pytest.approx(0.9375, abs=1e-6)
    assert table.sigma(757.0) == pytest.approx(FlowTable(5.0).sigmas[int(torch.argmin((table.timesteps - 757).abs()))])


def test_frame_api_text_and_video(backbone):
    cfg = CausalStreamConfig(CausalConfig(chunk_frames=2, window=8, sink=2, steps=(1000.0, 500.0)), height=16,
                             width=16, out_height=32, out_width=32)
    t2v = CausalVideoStream(backbone, cfg, "a red circle")
    frames = list(t2v.frames(5))
    assert len(frames) == 5 and frames[0].shape == (32, 32, 3) and frames[0].dtype == np.uint8
    with pytest.raises(StreamStudioError, match="text-to-video"):
        t2v.push(np.zeros((16, 16, 3), np.uint8))
    v2v_cfg = CausalStreamConfig(CausalConfig(chunk_frames=2, window=8, sink=2, steps=(1000.0, 500.0),
                                              strength=0.6), height=16, width=16)
    v2v = CausalVideoStream(backbone, v2v_cfg, "a red circle")
    out = []
    for i in range(7):
        out += v2v.push(np.full((16, 16, 3), 20 * i, np.uint8))
    assert len(out) == 6
    out += v2v.flush()
    assert len(out) == 7  # the last chunk padded, the padding dropped


def test_temporal_codec_chunks():
    """With Wan's VAE (4 frames a latent frame, the first alone) a chunk of 2 latent frames takes
    1 + 4 frames first, then 8, and gives as many back."""
    from diffusers import AutoencoderKLWan

    from streamstudio.models.video.wan import WanCodec

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    model = CausalWan(CausalWanConfig(dim=32, ffn_dim=64, freq_dim=16, text_dim=8, text_len=8, in_dim=4, out_dim=4,
                                      num_heads=2, num_layers=1)).eval()
    cfg = CausalStreamConfig(CausalConfig(chunk_frames=2, window=6, sink=0, steps=(1000.0, 500.0), strength=0.7),
                             height=4, width=4, temporal=4)
    stream = CausalVideoStream(CausalWanBackbone(model, text), cfg, "x", codec=WanCodec(vae).stream())
    outs = [len(stream.push(np.full((32, 32, 3), i, np.uint8))) for i in range(13)]
    assert outs[4] == 5 and outs[12] == 8 and sum(outs) == 13


def test_released_layouts_and_sizes(tmp_path):
    """Self-Forcing / CausVid / StreamDiffusionV2 wrap the generator's weights in "generator_ema" or
    "generator", keys "model."-prefixed (their WanDiffusionWrapper), FSDP's prefixes sometimes too."""
    model = CausalWan(TINY)
    plain = model.state_dict()
    wrapped = {"generator_ema": {f"model._fsdp_wrapped_module.{k}": v for k, v in plain.items()}, "step": 5}
    got = cc.generator_state(wrapped)
    assert got.keys() == plain.keys()
    cc.load_weights(CausalWan(TINY), got, "test")
    with pytest.raises(StreamStudioError, match="do not fit"):
        cc.load_weights(CausalWan(TINY), {**got, "extra.weight": torch.zeros(1)}, "test")
    with pytest.raises(StreamStudioError, match="no generator weights"):
        cc.generator_state({"optimizer": {"lr": 1.0}})
    assert cc.family_of("ckpts/wan_causal_dmd_v2v/model.pt") == "streamdiffusionv2"
    assert cc.family_of("CausVid/autoregressive_checkpoint/model.pt") == "causvid"
    assert cc.family_of("checkpoints/self_forcing_dmd.pt") == "self_forcing"


def test_the_1_3b_layout_matches_diffusers_wan():
    """Wan 2.1 1.3B's transformer, counted in diffusers' own implementation: as many parameters as
    ours in Wan's original layout (config_for picks it from the weights' shapes)."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        ours = CausalWan(WAN_1_3B_CONFIG)
        theirs = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                                       in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960,
                                       num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    assert cc.config_for(ours.state_dict()) == WAN_1_3B_CONFIG


def test_hub_generator_offline_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(cc.hub, "cached_file", lambda repo, name: None)
    with pytest.raises(ModelNotFoundError, match="hf download gdhe17/Self-Forcing|huggingface-cli download"):
        cc.resolve_generator("gdhe17/Self-Forcing")


def test_build_stream_and_render_over_a_causal_checkpoint(tmp_path):
    torch.manual_seed(0)
    folder = cc.save_causal_checkpoint(tmp_path / "ckpt", CausalWan(TINY), {"kind": "hash", "dim": 8, "length": 4},
                                       {"chunk_frames": 2, "steps": [1000, 500], "shift": 3.0, "window": 6,
                                        "sink": 2, "height": 16, "width": 16})
    model, meta = load_video_model(str(folder), "cpu")
    stream = build_stream(model, meta, "a red circle", width=64, height=32)
    assert isinstance(stream, CausalVideoStream) and stream.out_size == (32, 64)
    assert (stream.cfg.height, stream.cfg.width) == (8, 16)  # the trained long side, the aspect's other
    with pytest.raises(StreamStudioError, match="StreamDiT buffer's"):
        build_stream(model, meta, "x", num_chunks=3)
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "streamstudio", "render", "--pipeline", "video", "--model",
                          str(folder), "--prompt", "a red circle", "--frames", "5", "--output", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "causal chunks of 2" in run.stdout and len(list(out.glob("*.png"))) == 5


def test_a_guidance_asked_for_replaces_the_checkpoints_first_chunk_guidance_too(tmp_path):
    """A checkpoint's sampling.first_guidance reaches its streams; a --video-guidance asked for sets
    every chunk's, the first one's included."""
    folder = cc.save_causal_checkpoint(tmp_path / "ckpt", CausalWan(TINY), {"kind": "hash", "dim": 8, "length": 4},
                                       {"chunk_frames": 2, "steps": [1000, 500], "window": 6, "height": 16,
                                        "width": 16, "guidance": 3.0, "first_guidance": 5.0})
    model, meta = load_video_model(str(folder), "cpu")
    own = build_stream(model, meta, "a red circle").sampler.cfg
    assert (own.guidance, own.first_guidance) == (3.0, 5.0)
    asked = build_stream(model, meta, "a red circle", guidance=2.0).sampler.cfg
    assert (asked.guidance, asked.first_guidance) == (2.0, None)


def test_the_video_tab_runs_a_causal_model(tmp_path):
    """The Video tab's Model choice: serve --video-model's causal checkpoint generates frames
    there as the built-in StreamDiT does, and the webcam stream runs video-to-video over it."""
    from streamstudio.app.web import video_tab

    torch.manual_seed(0)
    folder = cc.save_causal_checkpoint(tmp_path / "ckpt", CausalWan(TINY), {"kind": "hash", "dim": 8, "length": 4},
                                       {"chunk_frames": 2, "steps": [1000, 500], "window": 6, "sink": 2,
                                        "height": 16, "width": 16})
    assert (str(folder), str(folder)) in video_tab.model_choices(str(folder))
    session = video_tab.VideoSession()
    video_tab.choose_model(session, str(folder))
    made = list(video_tab.generate(session, "a red circle", max_frames=3))
    assert len(made) == 3 and made[-1][0].shape == (video_tab.DISPLAY_SIDE, video_tab.DISPLAY_SIDE, 3)
    frame = np.zeros((48, 48, 3), np.uint8)
    for _ in range(4):
        video_tab.webcam_frame(session, frame, "a blue square", {"strength": 0.6})
    assert session.v2v is not None and session.v2v.wait(1, timeout=60)
    session.close()


def test_the_gpu_benchmark_runs_its_layouts(monkeypatch):
    """benchmarks/causal_video.py's GPU part, on the CPU with a tiny config: both layouts time
    chunks once the window filled, and report calls, fps and cache size."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import causal_video
    finally:
        sys.path.pop(0)
    tiny = CausalWanConfig(dim=32, ffn_dim=64, freq_dim=16, text_dim=8, text_len=4, in_dim=16, out_dim=16,
                           num_heads=2, num_layers=1)
    out = causal_video.gpu_figures(2, device="cpu", config=tiny, latent=(16, 4, 4))
    assert out["batch"]["streams"] == 2 and out["batch"]["speedup"] > 0
    assert out["self_forcing_t2v"]["calls_per_chunk"] == 5 and out["streamdiffusionv2_v2v"]["calls_per_chunk"] == 4
    assert all(out[k]["fps"] > 0 and out[k]["ms_per_chunk"] > 0 and "cache_mb" in out[k] for k in causal_video.LAYOUTS)


def test_a_stream_batch_equals_its_streams_made_alone(backbone):
    """Three streams (own prompts and seeds) in one batch, every step one network call over all of
    them: each stream's chunks equal the same stream made alone, through the window's rolling and a
    prompt change (a re-cache of its own row only)."""
    cfg = CausalConfig(chunk_frames=2, window=6, sink=2, steps=(1000.0, 500.0), shift=3.0, seed=5)
    prompts = ["a red circle", "a blue square moving up", "green"]
    batch = CausalBatch(backbone, cfg, (3, 16, 16), prompts, seeds=[5, 6, 7])
    alone = [CausalSampler(backbone, CausalConfig(**{**cfg.__dict__, "seed": seed}), (3, 16, 16), p)
             for p, seed in zip(prompts, [5, 6, 7])]
    for k in range(6):
        if k == 3:
            batch.streams[1].set_prompt("a yellow star")
            alone[1].set_prompt("a yellow star")
        got = batch.chunks()
        for i, s in enumerate(alone):
            torch.testing.assert_close(got[i], s.chunk(), rtol=1e-4, atol=1e-4, msg=f"chunk {k} stream {i}")
    assert batch.calls == 6 * 3 and batch.cache.k.shape[1] == 3  # 2 steps + the cache call a chunk, for all
    v2v = CausalBatch(backbone, CausalConfig(chunk_frames=2, window=6, sink=2, steps=(1000.0, 500.0), strength=0.7),
                      (3, 16, 16), ["a", "b"])
    inputs = [torch.zeros(2, 3, 16, 16), torch.ones(2, 3, 16, 16) * 0.5]
    v2v.streams[1].sigma = 0.5  # another first step: made one stream at a time, still right
    out = v2v.chunks(inputs)
    assert out.shape == (2, 2, 3, 16, 16) and v2v.streams[1].chunks == 1


def test_the_first_chunk_takes_a_guidance_of_its_own(backbone):
    """`first_guidance` guides the chunk made from the prompt alone, `guidance` the chunks after it:
    the first chunk is a stream's at the first guidance, the second differs from both plain ones."""
    base = dict(chunk_frames=2, window=6, sink=0, steps=(1000.0, 500.0), shift=3.0)

    def stream(**kw) -> CausalSampler:
        return CausalSampler(backbone, CausalConfig(**base, **kw), (3, 16, 16), "a red circle moving up")

    mixed, first_only, rest_only = stream(first_guidance=4.0, guidance=2.0), stream(guidance=4.0), stream(guidance=2.0)
    torch.testing.assert_close(mixed.chunk(), first_only.chunk(), rtol=1e-5, atol=1e-5)
    rest_only.chunk()
    second = mixed.chunk()
    assert not torch.allclose(second, first_only.chunk(), atol=1e-4)  # (guidance 2 after the first chunk)
    assert not torch.allclose(second, rest_only.chunk(), atol=1e-4)  # (it read a chunk made at 4)
    empty_first = stream(first_guidance=0.0)  # guidance 0 is the empty prompt's stream alone
    assert empty_first.cache.k.shape[1] == 2
    empty = CausalSampler(backbone, CausalConfig(**base), (3, 16, 16), "")
    torch.testing.assert_close(empty_first.chunk(), empty.chunk(), rtol=1e-5, atol=1e-5)
    assert stream(first_guidance=1.0).cache.k.shape[1] == 1  # (1 everywhere: no empty row)
    with pytest.raises(StreamStudioError, match="guidance must be >= 0"):
        stream(first_guidance=-1.0)


def test_guidance_runs_the_empty_prompt_on_its_own_cache_row(backbone):
    """Guidance g: empty + g (prompt - empty), the two on rows of their own. At g = 0 the stream is
    the empty prompt's alone, chunk for chunk, through the window's rolling: its row never reads the
    prompt's (a shared or mixed cache would)."""
    base = dict(chunk_frames=2, window=6, sink=2, steps=(1000.0, 500.0), shift=3.0)
    guided = CausalSampler(backbone, CausalConfig(**base, guidance=0.0), (3, 16, 16), "a red circle moving up")
    empty = CausalSampler(backbone, CausalConfig(**base), (3, 16, 16), "")
    assert guided.cache.k.shape[1] == 2 and empty.cache.k.shape[1] == 1
    for k in range(5):
        torch.testing.assert_close(guided.chunk(), empty.chunk(), rtol=1e-5, atol=1e-5, msg=f"chunk {k}")
    strong = CausalSampler(backbone, CausalConfig(**base, guidance=3.0), (3, 16, 16), "a red circle moving up")
    plain = CausalSampler(backbone, CausalConfig(**base), (3, 16, 16), "a red circle moving up")
    assert not torch.allclose(strong.chunk(), plain.chunk())
    strong.set_prompt("a blue square")  # (re-caches both rows)
    assert strong.chunk().shape == (2, 3, 16, 16)
    with pytest.raises(StreamStudioError, match="unguided"):
        CausalBatch(backbone, CausalConfig(**base, guidance=2.0), (3, 16, 16), ["a", "b"])
