"""Benchmark of the StreamDiffusion pipeline: Stream Batch, RCFG, overhead, similarity filter,
and the cost of the add-ons (1 and 2 ControlNets, a LoRA fused and unfused, the SDXL UNet).

Runs the tiny model and a full-size sd-turbo UNet architecture (SD 2.1 config, random
weights: they cost the same time as real ones) with TAESD. Prints a table and writes
benchmarks/results/stream_diffusion.json. Every figure is a ratio measured within this run,
except frames per second, which mean something only on a GPU.

    python benchmarks/stream_diffusion.py [--quick] [--device cuda] [--part all|core|addons]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import RESULTS, bench_device, synchronizer, table, timed, utc_now, write_json  # sys.path set by common

from streamstudio.app.cli.bench_run import device_name
from streamstudio.models.image.components import SDComponents
from streamstudio.models.image.loading import load_components
from streamstudio.models.image.tiny import SCHEDULER_CONFIG, tiny_tokenizer
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusion, StreamDiffusionConfig


SD_TURBO_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=1024,
    attention_head_dim=(5, 10, 20, 20), use_linear_projection=True,
)


def _fast_random_init(module: torch.nn.Module) -> torch.nn.Module:
    """Random weights without the slow default initialisers (speed is all that is measured)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02, generator=gen)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()
    return module.eval().requires_grad_(False)


def sd_turbo_architecture(device, dtype) -> SDComponents:
    """sd-turbo's UNet (865M parameters), TAESD, a one-layer 1024-wide text encoder
    (the text encoder runs only when the prompt changes, never per frame)."""
    from diffusers import AutoencoderTiny, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tok = tiny_tokenizer()
    with torch.device("meta"):
        unet = UNet2DConditionModel(**SD_TURBO_UNET)
    unet = _fast_random_init(unet.to_empty(device="cpu"))
    vae = _fast_random_init(AutoencoderTiny())
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(tok), hidden_size=1024, intermediate_size=1024,
                                        num_hidden_layers=1, num_attention_heads=16, max_position_embeddings=77,
                                        bos_token_id=len(tok) - 2, eos_token_id=len(tok) - 1,
                                        pad_token_id=len(tok) - 1))
    comps = SDComponents(unet, vae, _fast_random_init(text), tok, dict(SCHEDULER_CONFIG), "sd-turbo-arch",
                         step_type="turbo")
    return comps.to(device, dtype)


class NetworkTimer:
    """Wall time spent inside the networks (UNet, VAE encode and decode) of one pipeline."""

    def __init__(self, pipe: StreamDiffusion):
        self.seconds = 0.0
        self.device = pipe.device
        net = pipe.net  # the image seam: every UNet and VAE call
        net.eps, net.encode, net.decode = self._wrap(net.eps), self._wrap(net.encode), self._wrap(net.decode)

    def _wrap(self, fn):
        def timed_call(*args, **kwargs):
            out, seconds = timed(lambda: fn(*args, **kwargs), synchronizer(self.device))
            self.seconds += seconds
            return out

        return timed_call


class Timed:
    """One pipeline configuration, timed per frame in rounds (the best round counts)."""

    def __init__(self, comps: SDComponents, frames: list[np.ndarray], **config):
        self.pipe = StreamDiffusion(comps, StreamDiffusionConfig(**config), prompt="a photo")
        self.frames = frames
        for f in frames[:1] * 3:  # warm-up: priming, and the first calls at each batch shape
            self.pipe(f)
        self.timer = NetworkTimer(self.pipe)
        self.best_total = self.best_net = float("inf")

    def round(self) -> None:
        net_before = self.timer.seconds
        _, seconds = timed(lambda: [self.pipe(f) for f in self.frames], synchronizer(self.pipe.device))
        total = seconds / len(self.frames)
        if total < self.best_total:
            self.best_total = total
            self.best_net = (self.timer.seconds - net_before) / len(self.frames)


SDXL_UNET = dict(  # stabilityai/stable-diffusion-xl-base-1.0's UNet (2.6B parameters)
    sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(320, 640, 1280), transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
    cross_attention_dim=2048, use_linear_projection=True, addition_embed_type="text_time",
    addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816,
)


def sdxl_architecture(big: SDComponents, device, dtype) -> SDComponents:
    """SDXL's UNet (random weights) with the tiny SDXL model's text encoders widened to SDXL's
    widths (768 + 1280, pooled 1280; they run only when the prompt changes) and TAESD."""
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    with torch.device("meta"):
        unet = UNet2DConditionModel(**SDXL_UNET)
    unet = _fast_random_init(unet.to_empty(device="cpu"))
    tok = big.tokenizer
    base = dict(vocab_size=len(tok), intermediate_size=512, num_hidden_layers=1, num_attention_heads=8,
                max_position_embeddings=77, bos_token_id=len(tok) - 2, eos_token_id=len(tok) - 1,
                pad_token_id=len(tok) - 1)
    text = _fast_random_init(CLIPTextModel(CLIPTextConfig(hidden_size=768, **base)))
    text_2 = _fast_random_init(CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=1280, projection_dim=1280,
                                                                          **base)))
    comps = SDComponents(unet, big.vae, text, tok, dict(SCHEDULER_CONFIG), "sdxl-arch", step_type="turbo",
                         text_encoder_2=text_2, tokenizer_2=tok)
    return comps.to(device, dtype)


def addon_variants(comps: SDComponents, folder: str) -> dict[str, SDComponents]:
    """The model with each add-on: 1 and 2 ControlNets (made from its UNet, canny and soft-edge
    preprocessors), a rank-16 LoRA on the attention projections fused and unfused (copies of the
    UNet and text encoder, so every variant runs side by side)."""
    from diffusers import ControlNetModel

    from streamstudio.models.image.lora import LoraSet, save_random_lora

    param = next(comps.unet.parameters())
    nets = [_fast_random_init(ControlNetModel.from_unet(comps.unet)).to(param.device, param.dtype) for _ in range(2)]
    out = {"controlnet_1": dataclasses.replace(comps, controlnets=nets[:1], control_defaults=[("canny", 1.0)]),
           "controlnet_2": dataclasses.replace(comps, controlnets=nets,
                                               control_defaults=[("canny", 1.0), ("softedge", 1.0)])}
    path, _, _ = save_random_lora(comps, folder, rank=16)
    for fuse in (True, False):
        variant = dataclasses.replace(comps, unet=copy.deepcopy(comps.unet),
                                      text_encoder=copy.deepcopy(comps.text_encoder))
        variant.loras = LoraSet(variant, fuse=fuse)
        variant.loras.add(str(path))
        out["lora_fused" if fuse else "lora_unfused"] = variant
    return out


def measure_addons(comps: SDComponents, size: int, frames: int, rounds: int, sdxl: SDComponents | None = None) -> dict:
    """Seconds per frame (1 step, img2img) of the plain model and of each add-on, in the same
    rounds; the costs are ratios to the plain frame (target on a GPU: one ControlNet <= 1.5x,
    a fused LoRA ~1.0x)."""
    base = dict(width=size, height=size, strength=0.9, seed=1, steps=1, cfg_type="none")
    data = make_frames(frames, size)
    with tempfile.TemporaryDirectory() as folder:
        variants = {"plain": comps, **addon_variants(comps, folder)}
        if sdxl is not None:
            variants["sdxl_arch"] = sdxl
        runs = {name: Timed(c, data, **base) for name, c in variants.items()}
        for _ in range(rounds):
            for run in runs.values():
                run.round()
    plain = runs["plain"].best_total
    out = {"size": size, "frames": frames, "rounds": rounds,
           "seconds_per_frame": {name: run.best_total for name, run in runs.items()}}
    out.update({f"{name}_cost": run.best_total / plain for name, run in runs.items() if name != "plain"})
    return out


def make_frames(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def measure(comps: SDComponents, size: int, frames: int, steps: int, full: bool, rounds: int) -> dict:
    """Rounds interleave the configurations so that machine noise hits all of them alike."""
    base = dict(width=size, height=size, strength=0.9, seed=1)
    data = make_frames(frames, size)
    runs = {"one_step": Timed(comps, data, steps=1, cfg_type="none", **base)}
    if full:
        runs["batch"] = Timed(comps, data, steps=steps, cfg_type="none", **base)
        runs["sequential"] = Timed(comps, data, steps=steps, cfg_type="none", use_denoising_batch=False, **base)
        runs["self"] = Timed(comps, data, steps=steps, cfg_type="self", guidance_scale=1.5, **base)
        runs["full"] = Timed(comps, data, steps=steps, cfg_type="full", guidance_scale=1.5, **base)
    for _ in range(rounds):
        for run in runs.values():
            run.round()
    one = runs["one_step"]
    out = {"size": size, "frames": frames, "rounds": rounds, "seconds_per_frame_1step": one.best_total,
           "overhead_ratio": one.best_total / one.best_net}
    if full:
        out["steps"] = steps
        out["stream_batch_speedup"] = runs["sequential"].best_total / runs["batch"].best_total
        out["rcfg_self_speedup"] = runs["full"].best_total / runs["self"].best_total
        out["seconds_per_frame"] = {k: v.best_total for k, v in runs.items()}
    return out


def ssf_static_rate(comps: SDComponents, frames: int = 110) -> float:
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=64, height=64, steps=2, similarity_filter=True,
                                                        similarity_threshold=0.98, max_skip_frame=10))
    frame = make_frames(1, 64)[0]
    for _ in range(frames):
        pipe(frame)
    return pipe.stats.skipped / pipe.stats.frames_in


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a few frames, 256x256 for the full-size model (< 60 s on CPU)")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help=f"JSON output (default {RESULTS / 'stream_diffusion.json'})")
    parser.add_argument("--part", choices=("all", "core", "addons"), default="all",
                        help="core: the Stream Batch and RCFG ratios, the overhead and the similarity filter; "
                             "addons: the add-ons' costs; all: both (the GPU session runs them in its two calls)")
    args = parser.parse_args(argv)
    device = bench_device(args.device, cpu_threads=None)
    torch.set_num_threads(args.threads)
    dtype = torch.float16 if device.type == "cuda" else torch.float32

    name = RESULTS / ("stream_diffusion_quick.json" if args.quick else "stream_diffusion.json")
    name = Path(args.out) if args.out else name

    def save() -> None:  # after each measurement: a run killed at its time limit keeps what it measured
        write_json(name, results)

    tiny = load_components("tiny", device=device, dtype=dtype)
    results: dict = {"device": device_name(device), "date": utc_now(), "quick": args.quick, "threads": args.threads,
                     "part": args.part}
    big = sd_turbo_architecture(device, dtype)
    size = 512 if device.type == "cuda" else (128 if args.quick else 256)
    frames = 1 if device.type != "cuda" else 30
    if args.part in ("all", "core"):
        measure_core(results, tiny, big, size, frames, args.quick, device, save)
    if args.part in ("all", "addons"):
        measure_all_addons(results, tiny, big, size, frames, args.quick, device, dtype, save)
    print_table(results)
    save()
    print(f"wrote {name}")


def measure_core(results: dict, tiny, big, size: int, frames: int, quick: bool, device, save) -> None:
    """The Stream Batch and RCFG ratios (on the full-size architecture where it ran in full), the
    pipeline's overhead and the similarity filter's skip rate, into `results`."""
    results["tiny"] = measure(tiny, 64, 8, 4, full=True, rounds=3 if quick else 10)
    save()
    results["ssf_skip_rate_static"] = ssf_static_rate(tiny)
    save()
    results["sd_turbo_arch"] = measure(big, size, frames, 4, full=not quick or device.type == "cuda",
                                       rounds=2 if device.type != "cuda" else 3)
    if device.type == "cuda":
        results["sd_turbo_arch"]["fps_1step_512"] = 1.0 / results["sd_turbo_arch"]["seconds_per_frame_1step"]
    main_model = results["sd_turbo_arch"] if "stream_batch_speedup" in results["sd_turbo_arch"] else results["tiny"]
    results["stream_batch_speedup"] = main_model["stream_batch_speedup"]
    results["rcfg_self_speedup"] = main_model["rcfg_self_speedup"]
    results["overhead_ratio"] = results["sd_turbo_arch"]["overhead_ratio"]
    results["speedups_measured_on"] = "sd_turbo_arch" if main_model is results["sd_turbo_arch"] else "tiny"
    save()


def measure_all_addons(results: dict, tiny, big, size: int, frames: int, quick: bool, device, dtype, save) -> None:
    """The add-ons' costs: on the tiny model always; on the full-size architectures (and SDXL's
    2.6B UNet) on a GPU, or on the CPU without --quick (minutes a frame for SDXL there)."""
    results["addons_tiny"] = measure_addons(tiny, 64, 8, rounds=3 if quick else 10)
    save()
    if device.type == "cuda" or not quick:
        sdxl = sdxl_architecture(big, device, dtype)
        results["addons"] = measure_addons(big, size, frames, rounds=2 if device.type != "cuda" else 3, sdxl=sdxl)
        del sdxl
    addons = results.get("addons", results["addons_tiny"])
    results["addons_measured_on"] = "sd_turbo_arch" if "addons" in results else "tiny"
    for key in ("controlnet_1_cost", "controlnet_2_cost", "lora_fused_cost", "lora_unfused_cost", "sdxl_arch_cost"):
        if key in addons:
            results[key] = addons[key]
    save()


def print_table(r: dict) -> None:
    rows = []
    if "stream_batch_speedup" in r:
        rows += [
            ("stream_batch_speedup", r["stream_batch_speedup"], ">= 1.4 where batching pays (GPU)",
             r["speedups_measured_on"]),
            ("rcfg_self_speedup", r["rcfg_self_speedup"], ">= 1.8", r["speedups_measured_on"]),
            ("overhead_ratio", r["overhead_ratio"], "<= 1.10 (full-size arch)", "sd_turbo_arch"),
            ("ssf_skip_rate_static", r["ssf_skip_rate_static"], "10/11 = 0.909 at max_skip_frame 10", "tiny"),
            ("tiny overhead_ratio", r["tiny"]["overhead_ratio"], "(tiny nets: overhead dominates)", "tiny"),
        ]
    if "controlnet_1_cost" in r:
        rows += [
            ("controlnet_1_cost", r["controlnet_1_cost"], "<= 1.5 (GPU, one ControlNet)", r["addons_measured_on"]),
            ("controlnet_2_cost", r["controlnet_2_cost"], "(two ControlNets)", r["addons_measured_on"]),
            ("lora_fused_cost", r["lora_fused_cost"], "~1.0 (fused: the plain weights)", r["addons_measured_on"]),
            ("lora_unfused_cost", r["lora_unfused_cost"], "(low-rank products per call)", r["addons_measured_on"]),
        ]
    if "sdxl_arch_cost" in r:
        rows.append(("sdxl_arch_cost", r["sdxl_arch_cost"], "(SDXL UNet / sd-turbo UNet, same size)", "sdxl_arch"))
    columns = [("figure", "figure", "<28"), ("value", "value", ">8.3f"), ("target", "target", "<38"),
               ("model", "model", "<13")]
    print(table(columns, [dict(zip(("figure", "value", "target", "model"), row)) for row in rows]))
    big = r.get("sd_turbo_arch")
    if big:
        print(f"sd-turbo arch {big['size']}x{big['size']}: {big['seconds_per_frame_1step']:.3f} s/frame at 1 step "
              f"on {r['device']}")


if __name__ == "__main__":
    main()
