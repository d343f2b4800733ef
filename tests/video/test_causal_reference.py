"""The causal video pipeline equals the references' own code (issue 49): chunk outputs with shared
random weights on a tiny configuration, text-to-video: Self-Forcing with global attention, with a
rolling window and sink frames over enough chunks that the cache rolls, and with CausVid's
schedule; CausVid's own pipeline.

tests/video/fixtures/causal_reference.pt was written by benchmarks/causal_reference.py, which ran
guandeh17/Self-Forcing's CausalInferencePipeline and CausalWanModel and tianweiy/CausVid's
InferencePipeline and CausalWanModel on CPU (float32 attention);
its weights are in Wan's original layout, so loading them here by name also checks the layout.
"""

from pathlib import Path

import pytest
import torch

from streamstudio.models.video.causal_backbone import CausalWanBackbone
from streamstudio.models.video.causal_wan import CausalWan, CausalWanConfig
from streamstudio.pipelines.video.causal_video import CausalConfig, CausalSampler

FIXTURE = Path(__file__).parent / "fixtures" / "causal_reference.pt"


@pytest.fixture(scope="module")
def cases():
    return torch.load(FIXTURE, weights_only=False)


def run_ours(case: dict) -> torch.Tensor:
    model = CausalWan(CausalWanConfig.from_dict(case["config"])).eval()
    missing, unexpected = model.load_state_dict(case["state_dict"], strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    backbone = CausalWanBackbone(model, lambda prompt: case["prompt_embeds"])
    c, steps = case["chunk_frames"], case["steps"]
    window = case["local_attn_size"] if case["local_attn_size"] != -1 else case["latents"].shape[0]
    cfg = CausalConfig(chunk_frames=c, steps=tuple(steps), warp=case["warp"], shift=case["shift"], window=window,
                       sink=case["sink_size"])
    per_chunk = len(steps) - 1  # the reference draws a noise for every step after the first

    def noise(chunk: int, step: int) -> torch.Tensor:
        if step == 0:
            return case["noise"][chunk * c:(chunk + 1) * c]
        return case["step_noise"][chunk * per_chunk + step - 1]

    sampler = CausalSampler(backbone, cfg, tuple(case["latents"].shape[1:]), "prompt", noise_fn=noise)
    chunks = case["latents"].shape[0] // c
    return torch.cat([sampler.chunk() for _ in range(chunks)])


@pytest.mark.parametrize("name", ["global", "rolling", "causvid_steps", "causvid"])
def test_chunks_equal_the_reference(cases, name):
    case = cases[name]
    ours = run_ours(case)
    ref = case["latents"]
    assert ours.shape == ref.shape
    err = (ours - ref).abs().max() / ref.abs().max()
    assert err < 1e-4, f"{name}: max relative error {float(err):.2e}"
    per_chunk = (ours - ref).abs().flatten(1).amax(1)
    assert bool((per_chunk < 1e-4 * ref.abs().max()).all()), per_chunk


def test_the_rolling_case_rolls(cases):
    case = cases["rolling"]
    frames = case["latents"].shape[0]
    assert frames > case["local_attn_size"] + case["chunk_frames"]  # chunks made after the window filled


def test_video_to_video_equals_streamdiffusionv2(cases):
    """StreamDiffusionV2's own video-to-video (its SingleGPU pipeline without Stream Batch): the
    input latents noised to each chunk's level, the first step 1000 * level - 100, no cache call
    (the last step's keys stay), a first chunk of 2 latent frames and 1 after, window 6 with 3 sink
    frames: equal until its cache is full. From the chunk that fills it on, its ring buffer writes a
    chunk's later steps into another slot than its first (the slot moves on after the first call of
    a chunk, models/wan/causal_model.py's `current_step` count-down), so its window holds a chunk's
    first-step keys beside its last and loses a frame early; ours keeps Self-Forcing's window (the
    chunk's slots rewritten by every call, the oldest non-sink frame out): docs/video.md."""
    case = cases["streamdiffusionv2_v2v"]
    model = CausalWan(CausalWanConfig.from_dict(case["config"])).eval()
    model.load_state_dict(case["state_dict"])
    backbone = CausalWanBackbone(model, lambda prompt: case["prompt_embeds"])
    cfg = CausalConfig(chunk_frames=1, first_chunk_frames=2, steps=tuple(float(s) for s in case["steps"]), warp=False,
                       shift=8.0, context_t=None, window=case["window"], sink=case["sink"], strength=0.8)
    per_chunk = len(case["steps"]) - 1

    def noise(chunk: int, step: int) -> torch.Tensor:
        return case["noise"][chunk] if step == 0 else case["step_noise"][chunk * per_chunk + step - 1]

    sampler = CausalSampler(backbone, cfg, tuple(case["latents"].shape[1:]), "prompt", noise_fn=noise)
    inputs, ref = case["input_latents"], case["latents"]
    made = 0
    for k, scale in enumerate(case["noise_scales"]):
        if made + (2 if k == 0 else 1) >= case["window"]:
            break  # (the chunk that fills its cache: see above)
        sampler.sigma = scale
        out = sampler.chunk(inputs[:2] if k == 0 else inputs[k + 1:k + 2])
        want = ref[made:made + out.shape[0]]
        err = (out - want).abs().max() / want.abs().max()
        assert err < 1e-4, f"chunk {k}: max relative error {float(err):.2e}"
        made += out.shape[0]
    assert made == 5 and len({round(s, 2) for s in case["noise_scales"][:4]}) == 3  # levels that changed
