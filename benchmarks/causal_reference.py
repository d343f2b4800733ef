"""Record the reference causal video implementations' outputs on a tiny random-weight model (issue 49).

Runs guandeh17/Self-Forcing's own `CausalInferencePipeline` and `CausalWanModel` (a checkout given
with --self-forcing; `fetch` it, nothing of it is copied into the package) on CPU with a tiny
configuration and shared random weights, and writes what tests/video/test_causal_reference.py
compares StreamStudio's causal pipeline against: the weights (Wan's original layout, as the
released checkpoints), the text embeddings, every noise sample the reference drew, and its
chunk outputs. Cases: Self-Forcing text-to-video with global attention (its default), with a
rolling window and sink frames over enough chunks that the cache rolls, and with CausVid's
schedule; tianweiy/CausVid's own `InferencePipeline` (a checkout given with --causvid); and
chenfengxu714/StreamDiffusionV2's video-to-video, `prepare` then `inference_wo_batch` chunk by
chunk with a noise level per chunk (--streamdiffusionv2).

Only the reference's CUDA-only pieces are replaced, at their boundary: flash attention by PyTorch's
scaled-dot-product attention in float32 (the reference's own fallback casts to bfloat16), the
text encoder and the VAE by identities (the fixture holds the embeddings and compares latents),
and its KV-cache allocation, hard-wired to the 1.3B model's 12 heads of 128, sized for the tiny one.

    python benchmarks/causal_reference.py --self-forcing /path/to/Self-Forcing --causvid /path/to/CausVid \
        --streamdiffusionv2 /path/to/StreamDiffusionV2 --out tests/video/fixtures/causal_reference.pt
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

TINY = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=16, in_dim=4, dim=48, ffn_dim=96, freq_dim=32,
            text_dim=24, out_dim=4, num_heads=4, num_layers=3, qk_norm=True, cross_attn_norm=True, eps=1e-6)
LATENT = (4, 8, 8)  # (C, h, w): 16 tokens a frame
CASES = {
    # name: (local_attn_size, sink_size, chunk frames, chunks, steps, warp, shift)
    "global": (-1, 0, 3, 4, [1000, 750, 500, 250], True, 5.0),  # Self-Forcing's config
    "rolling": (9, 3, 3, 7, [1000, 750, 500, 250], True, 5.0),  # cache rolls from the 4th chunk on
    "causvid_steps": (-1, 0, 3, 3, [1000, 757, 522], False, 8.0),  # CausVid's steps and shift, unwarped
}
SDV2_CASE = "streamdiffusionv2_v2v"  # chenfengxu714/StreamDiffusionV2's own video-to-video
CAUSVID_CASE = "causvid"  # tianweiy/CausVid's own pipeline and model: global attention, shift 8, unwarped


def sdpa32(q, k, v, *args, **kwargs):
    """(B, L, N, D) attention in float32 (flash attention's layout)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                         v.transpose(1, 2).float())
    return out.transpose(1, 2).type_as(q)


def tiny_net(causal_model, **kwargs):
    """A reference's CausalWanModel in the tiny configuration with random weights everywhere (Wan
    zero-initialises its head: a real test needs it random), handed out by its `from_pretrained`."""
    net = causal_model.CausalWanModel(**TINY, **kwargs).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    causal_model.CausalWanModel.from_pretrained = classmethod(lambda cls, *a, **k: net)
    return net


def import_reference(root: Path):
    """Self-Forcing's modules without its package __init__s (they import every model and CUDA)."""
    sys.path.insert(0, str(root))
    for name in ["wan", "wan.modules", "pipeline", "utils", "demo_utils"]:
        module = types.ModuleType(name)
        module.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = module
    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0  # (demo_utils/memory.py names a GPU at import)
    try:
        import pipeline.causal_inference as inference
        import utils.wan_wrapper as wrapper
        import wan.modules.causal_model as causal_model
        import wan.modules.model as model
    finally:
        torch.cuda.current_device = current
    model.flash_attention = sdpa32
    causal_model.attention = sdpa32
    return inference, wrapper, causal_model


def run_case(refs, name: str, seed: int) -> dict:
    inference, wrapper, causal_model = refs
    local, sink, c, chunks, steps, warp, shift = CASES[name]
    torch.manual_seed(seed)
    net = tiny_net(causal_model, local_attn_size=local, sink_size=sink)
    generator = wrapper.WanDiffusionWrapper(timestep_shift=shift, is_causal=True, local_attn_size=local,
                                            sink_size=sink)
    embeds = torch.randn(1, 11, TINY["text_dim"])  # a prompt of 11 tokens

    class Text(torch.nn.Module):
        def forward(self, text_prompts):
            return {"prompt_embeds": embeds}

    class Decoder(torch.nn.Module):
        def decode_to_pixel(self, latent, use_cache=False):
            return latent

    frame_tokens = (LATENT[1] // 2) * (LATENT[2] // 2)
    heads, head_dim = TINY["num_heads"], TINY["dim"] // TINY["num_heads"]

    class Pipeline(inference.CausalInferencePipeline):
        def _initialize_kv_cache(self, batch_size, dtype, device):
            size = self.local_attn_size * self.frame_seq_length if self.local_attn_size != -1 else 32760
            self.kv_cache1 = [{"k": torch.zeros([batch_size, size, heads, head_dim], dtype=dtype),
                               "v": torch.zeros([batch_size, size, heads, head_dim], dtype=dtype),
                               "global_end_index": torch.tensor([0]), "local_end_index": torch.tensor([0])}
                              for _ in range(self.num_transformer_blocks)]

        def _initialize_crossattn_cache(self, batch_size, dtype, device):
            self.crossattn_cache = [{"k": None, "v": None, "is_init": False}
                                    for _ in range(self.num_transformer_blocks)]

    args = types.SimpleNamespace(denoising_step_list=steps, warp_denoising_step=warp, num_frame_per_block=c,
                                 independent_first_frame=False, context_noise=0)
    pipe = Pipeline(args, "cpu", generator=generator, text_encoder=Text(), vae=Decoder())
    pipe.num_transformer_blocks, pipe.frame_seq_length = TINY["num_layers"], frame_tokens
    noise = torch.randn(1, chunks * c, *LATENT)
    drawn: list[torch.Tensor] = []
    randn_like = torch.randn_like

    def record(x, *a, **k):
        out = randn_like(x, *a, **k)
        drawn.append(out.clone())
        return out

    torch.randn_like = record
    try:
        with torch.no_grad():
            _, latents = pipe.inference(noise, ["prompt"], return_latents=True)
    finally:
        torch.randn_like = randn_like
    return {"config": dict(TINY), "local_attn_size": local, "sink_size": sink, "chunk_frames": c, "steps": steps,
            "warp": warp, "shift": shift, "state_dict": {k: v.clone() for k, v in net.state_dict().items()},
            "prompt_embeds": embeds, "noise": noise[0], "step_noise": [d[0] if d.dim() == 5 else d for d in drawn],
            "latents": latents[0]}


def import_causvid(root: Path):
    """CausVid's pipeline and model; `causvid.models` (its wrapper registry, which imports SDXL and
    every model) is replaced by a module that hands out the tiny generator and identity codecs."""
    sys.path.insert(0, str(root))
    for name in ["causvid", "causvid.models", "causvid.models.wan", "causvid.models.wan.wan_base",
                 "causvid.models.wan.wan_base.modules"]:
        module = types.ModuleType(name)
        module.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = module
    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0  # (its t5.py names a GPU at import)
    try:
        import causvid.models.wan.causal_model as causal_model
        import causvid.models.wan.wan_base.modules.model as model
        import causvid.models.wan.wan_wrapper as wrapper
    finally:
        torch.cuda.current_device = current

    model.flash_attention = sdpa32
    causal_model.attention = sdpa32
    return sys.modules["causvid.models"], wrapper, causal_model, model


def run_causvid(refs, seed: int) -> dict:
    registry, wrapper, causal_model, model = refs
    c, chunks, steps = 3, 4, [1000, 757, 522, 0]  # configs/wan_causal_dmd.yaml's list (the 0 is dropped)
    torch.manual_seed(seed)
    net = tiny_net(causal_model)
    model.WanModel.from_pretrained = classmethod(lambda cls, *a, **k: torch.nn.Linear(1, 1))
    embeds = torch.randn(1, 11, TINY["text_dim"])
    registry.get_diffusion_wrapper = lambda model_name: wrapper.CausalWanDiffusionWrapper
    registry.get_text_encoder_wrapper = lambda model_name: (lambda: (lambda text_prompts: {"prompt_embeds": embeds}))
    registry.get_vae_wrapper = lambda model_name: (lambda: types.SimpleNamespace(decode_to_pixel=lambda x: x))
    sys.modules.pop("causvid.models.wan.causal_inference", None)
    import causvid.models.wan.causal_inference as inference

    frame_tokens = (LATENT[1] // 2) * (LATENT[2] // 2)
    heads, head_dim = TINY["num_heads"], TINY["dim"] // TINY["num_heads"]

    class Pipeline(inference.InferencePipeline):
        def _initialize_kv_cache(self, batch_size, dtype, device):
            self.kv_cache1 = [{"k": torch.zeros([batch_size, 32760, heads, head_dim], dtype=dtype),
                               "v": torch.zeros([batch_size, 32760, heads, head_dim], dtype=dtype)}
                              for _ in range(self.num_transformer_blocks)]

        def _initialize_crossattn_cache(self, batch_size, dtype, device):
            self.crossattn_cache = [{"k": None, "v": None, "is_init": False}
                                    for _ in range(self.num_transformer_blocks)]

    args = types.SimpleNamespace(model_name="causal_wan", denoising_step_list=steps, warp_denoising_step=False,
                                 num_frame_per_block=c)
    pipe = Pipeline(args, "cpu")
    pipe.num_transformer_blocks, pipe.frame_seq_length = TINY["num_layers"], frame_tokens
    noise = torch.randn(1, chunks * c, *LATENT)
    drawn: list[torch.Tensor] = []
    randn_like, ones = torch.randn_like, torch.ones

    def record(x, *a, **k):
        out = randn_like(x, *a, **k)
        drawn.append(out.clone())
        return out

    def ones_here(*a, **k):  # (its add_noise names device="cuda")
        k.pop("device", None)
        return ones(*a, **k)

    torch.randn_like, torch.ones = record, ones_here
    try:
        with torch.no_grad():
            _, latents = pipe.inference(noise, ["prompt"], return_latents=True)
    finally:
        torch.randn_like, torch.ones = randn_like, ones
    return {"config": dict(TINY), "local_attn_size": -1, "sink_size": 0, "chunk_frames": c, "steps": steps[:-1],
            "warp": False, "shift": 8.0, "state_dict": {k: v.clone() for k, v in net.state_dict().items()},
            "prompt_embeds": embeds, "noise": noise[0], "step_noise": [d for d in drawn], "latents": latents[0]}


def import_sdv2(root: Path):
    """StreamDiffusionV2's streaming pipeline and model; its `models` registry replaced by a module
    that hands out the tiny generator and identity codecs."""
    sys.path.insert(0, str(root))
    for name in ["models", "models.wan", "models.wan.wan_base", "models.wan.wan_base.modules"]:
        module = types.ModuleType(name)
        module.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = module
    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0
    try:
        import models.wan.causal_model as causal_model
        import models.wan.wan_base.modules.model as model
        import models.wan.wan_wrapper as wrapper
    finally:
        torch.cuda.current_device = current
    model.flash_attention = sdpa32
    return sys.modules["models"], wrapper, causal_model, model


SDV2_NOISE_SCALES = [0.8, 0.8, 0.75, 0.7, 0.72, 0.8, 0.78, 0.74, 0.7, 0.76]  # one a chunk (motion-aware's output)


def run_sdv2(refs, seed: int) -> dict:
    """Video-to-video as StreamDiffusionV2's SingleGPU pipeline runs it without Stream Batch
    (`prepare` for the first chunk of 2 latent frames, `inference_wo_batch` for every later chunk
    of 1), window 6 with 3 sink frames, its v2v steps, a noise level per chunk: enough chunks that
    its ring-buffer cache evicts several times."""
    registry, wrapper, causal_model, model = refs
    steps = [700, 500, 400, 200, 0]  # configs/wan_causal_dmd_v2v.yaml
    torch.manual_seed(seed)
    net = tiny_net(causal_model)
    model.WanModel.from_pretrained = classmethod(lambda cls, *a, **k: torch.nn.Linear(1, 1))
    embeds = torch.randn(1, 11, TINY["text_dim"])
    registry.get_diffusion_wrapper = lambda model_name: wrapper.CausalWanDiffusionWrapper
    registry.get_text_encoder_wrapper = lambda model_name: (
        lambda model_type=None: (lambda text_prompts: {"prompt_embeds": embeds}))
    registry.get_vae_wrapper = lambda model_name: (lambda model_type=None: None)
    sys.modules.pop("models.wan.causal_stream_inference", None)
    sys.modules["models.wan.taehv_wrapper"] = types.SimpleNamespace(TAEHVWanVAEWrapper=None)
    import models.wan.causal_stream_inference as inference

    heads, head_dim, layers = TINY["num_heads"], TINY["dim"] // TINY["num_heads"], TINY["num_layers"]

    class Pipeline(inference.CausalStreamInferencePipeline):
        def _initialize_kv_cache(self, batch_size, dtype, device):
            self.kv_cache1 = []
            for i in range(self.num_transformer_blocks):
                self.generator.model.blocks[i].self_attn.sink_size = self.num_sink_tokens
                self.generator.model.blocks[i].self_attn.adapt_sink_thr = self.adapt_sink_threshold
                self.kv_cache1.append({
                    "k": torch.zeros([batch_size, self.kv_cache_length, heads, head_dim], dtype=dtype),
                    "v": torch.zeros([batch_size, self.kv_cache_length, heads, head_dim], dtype=dtype),
                    "global_end_index": torch.tensor([0], dtype=torch.long),
                    "local_end_index": torch.tensor([0], dtype=torch.long),
                    "total_steps": len(self.denoising_step_list), "current_step": len(self.denoising_step_list)})

    latent_h, latent_w = LATENT[1], LATENT[2]
    args = types.SimpleNamespace(model_type="T2V-1.3B", model_name="causal_wan", generator_name="causal_wan",
                                 denoising_step_list=steps, t2v=False, warp_denoising_step=False,
                                 height=latent_h * 8, width=latent_w * 8, num_kv_cache=6, num_sink_tokens=3,
                                 adapt_sink_threshold=-1, num_frame_per_block=1)
    pipe = Pipeline(args, torch.device("cpu"))
    pipe.num_transformer_blocks, pipe.num_heads = layers, heads
    frame_tokens = pipe.frame_seq_length
    chunks = len(SDV2_NOISE_SCALES)
    latents = torch.randn(1, chunks + 1, *LATENT)  # the input video's latents: 2 frames, then 1 a chunk
    first_noise: list[torch.Tensor] = []
    drawn: list[torch.Tensor] = []
    outputs = []
    randn_like = torch.randn_like

    def record(x, *a, **k):
        out = randn_like(x, *a, **k)
        drawn.append(out.clone())
        return out

    with torch.no_grad():
        for k, scale in enumerate(SDV2_NOISE_SCALES):
            part = latents[:, :2] if k == 0 else latents[:, k + 1:k + 2]
            noise = torch.randn_like(part)
            first_noise.append(noise[0])
            noisy = noise * scale + part * (1 - scale)
            torch.randn_like = record
            try:
                if k == 0:
                    out = pipe.prepare(["prompt"], torch.device("cpu"), torch.float32, noise=noisy, current_start=0,
                                       current_end=2 * frame_tokens, batch_denoise=False)
                else:
                    start = (k + 1) * frame_tokens
                    out = pipe.inference_wo_batch(noisy, start, start + frame_tokens, int(1000 * scale) - 100)
            finally:
                torch.randn_like = randn_like
            outputs.append(out[0])
    return {"config": dict(TINY), "state_dict": {k: v.clone() for k, v in net.state_dict().items()},
            "prompt_embeds": embeds, "input_latents": latents[0], "noise_scales": SDV2_NOISE_SCALES,
            "noise": first_noise, "step_noise": [d[0] if d.dim() == 5 else d for d in drawn],
            "latents": torch.cat(outputs), "steps": steps[:-1], "window": 6, "sink": 3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self-forcing", type=Path, required=True, help="a checkout of guandeh17/Self-Forcing")
    ap.add_argument("--causvid", type=Path, help="a checkout of tianweiy/CausVid (its case is skipped without)")
    ap.add_argument("--streamdiffusionv2", type=Path,
                    help="a checkout of chenfengxu714/StreamDiffusionV2 (its video-to-video case is skipped without)")
    ap.add_argument("--out", type=Path, default=Path("tests/video/fixtures/causal_reference.pt"))
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    refs = import_reference(args.self_forcing.resolve())
    cases = {name: run_case(refs, name, args.seed + i) for i, name in enumerate(CASES)}
    if args.causvid:
        cases[CAUSVID_CASE] = run_causvid(import_causvid(args.causvid.resolve()), args.seed + len(CASES))
    if args.streamdiffusionv2:
        cases[SDV2_CASE] = run_sdv2(import_sdv2(args.streamdiffusionv2.resolve()), args.seed + len(CASES) + 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(cases, args.out)
    for name, case in cases.items():
        print(f"{name}: {tuple(case['latents'].shape)} latents, {len(case['step_noise'])} step noises, "
              f"std {float(case['latents'].std()):.3f}")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
