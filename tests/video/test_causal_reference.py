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
