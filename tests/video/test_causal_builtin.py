"""The built-in causal video model (issue 49, streamstudio/assets/causal_tiny) and long causal
streams: the model keeps its object and its direction on seeds and prompts it was not tuned on,
and a stream's memory stays flat however long it runs (the KV cache is fixed; the RoPE positions
are renumbered past the table's end)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from streamstudio.models.video.causal_backbone import CausalWanBackbone
from streamstudio.models.video.causal_checkpoint import BUILTIN_CAUSAL, load_causal_checkpoint
from streamstudio.models.video.causal_wan import CausalWan, CausalWanConfig
from streamstudio.models.video.wan import HashTextEmbedder
from streamstudio.pipelines.video.causal_video import CausalConfig, CausalSampler

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import causal_long_run as long_run  # noqa: E402
import video_quality as vq  # noqa: E402

# Held-out renders (benchmarks/video_quality.py --causal --prompts held-out --seeds 11 12): prompts
# of the held-out list and seeds the sampling was not tuned on (it was tuned on the protocol's
# prompts with seeds 0 and 1).
HELD_OUT_CASES = (("a yellow triangle moving left", 11), ("a red square moving up", 12))


@pytest.fixture(scope="module")
def builtin():
    return load_causal_checkpoint(BUILTIN_CAUSAL)


def test_builtin_causal_is_small_and_says_how_it_samples(builtin):
    # (4.9M parameters in fp16: the package's largest asset, a few times the image model's)
    assert (BUILTIN_CAUSAL / "model.safetensors").stat().st_size < 10 * 2**20
    cfg = vq.causal_sampling(builtin.sampling, 0)[0]
    cfg.validate()
    assert (builtin.sampling["height"], builtin.sampling["width"]) == (32, 32)
    assert all(p not in vq.PROMPTS for p, _ in HELD_OUT_CASES) and all(s not in vq.SEEDS for _, s in HELD_OUT_CASES)


@pytest.mark.xfail(strict=True, reason="issue 49, not met yet: the built-in causal model (256 wide, fine-tuned "
                   "reading its own chunks, 8 steps at guidance 8) keeps the prompted direction in 41/44 held-out "
                   "renders and its object in 1407 of 1408 frames; the frame it loses is this test's first case (a "
                   "yellow triangle moving left, seed 11, frame 4) (docs/video.md, 'The built-in causal model')")
def test_builtin_causal_keeps_its_object_and_direction_on_held_out_seeds(builtin):
    chunk = builtin.sampling["chunk_frames"]
    for prompt, seed in HELD_OUT_CASES:
        v = vq.measure_video(vq.render_causal(builtin, prompt, seed, frames=24), prompt, seed, chunk)
        assert v.direction_ok and v.vanished == 0, v


def tiny_sampler(rope_positions: int | None, sink: int = 0) -> CausalSampler:
    """A random-weight tiny causal model's sampler (chunks of 2, a window of 6 frames, `sink` of them
    sink frames), its temporal RoPE table cut to `rope_positions` frames."""
    torch.manual_seed(0)
    cfg = CausalWanConfig(dim=24, ffn_dim=48, freq_dim=16, text_dim=8, text_len=4, in_dim=3, out_dim=3, num_heads=2,
                          num_layers=1, patch_size=(1, 4, 4))
    model = CausalWan(cfg).eval()
    if rope_positions:
        model.rope = (model.rope[0][:rope_positions], model.rope[1], model.rope[2])
    backbone = CausalWanBackbone(model, HashTextEmbedder(8, 4))
    return CausalSampler(backbone, CausalConfig(chunk_frames=2, steps=(1000.0, 500.0), window=6, sink=sink),
                         (3, 8, 8), "a red circle moving left")


def test_a_stream_past_the_rope_table_makes_what_a_longer_table_makes():
    """200 frames with a 16-frame RoPE table (renumbered every few chunks) equal the same stream
    with Wan's 1024-frame table (positions 0 .. 199): without sink frames every position the
    attention sees is relative to the window. With sink frames too, the cache and the kept latents
    never grow and the positions stay inside the table."""
    short, full, sink = tiny_sampler(16), tiny_sampler(None), tiny_sampler(16, sink=2)
    shape = sink.cache.k.shape
    a, b, highest = [], [], 0
    with torch.inference_mode():
        for _ in range(100):
            a.append(short.chunk())
            b.append(full.chunk())
            sink.chunk()
            highest = max(highest, short.cache.position, sink.cache.position)
            assert sink.cache.k.shape == shape and len(sink.kept) <= 6 and len(short.kept) <= 6
    assert highest <= 16 and full.cache.position == 200 and short.cache.dropped == full.cache.dropped == 194
    assert sink.cache.dropped == 194 and sink.cache.frames == 6
    torch.testing.assert_close(torch.cat(a), torch.cat(b), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # 10,000 frames of the built-in model: a few minutes on one CPU thread
def test_ten_thousand_frames_keep_memory_flat(builtin):
    r = long_run.long_run(builtin, 10_000, every=1000)
    assert r["cache_shape_unchanged"] and r["kept_latents"] <= builtin.sampling["window"]
    assert r["highest_position"] <= 1024 and r["marks"][-1]["position"] <= 1024
    after_start = [m["rss_mb"] for m in r["marks"][1:]]  # after the first 1000 frames: no growth
    assert max(after_start) - min(after_start) < 20, r["marks"]
