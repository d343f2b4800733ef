"""Benchmark of the causal video pipeline (issue 49): ms per chunk and frames per second.

- GPU (missing otherwise): Wan 2.1 1.3B's causal transformer (its real config, random weights,
  bfloat16) at 480x832 (60x104 latents of Wan's 8x VAE, 1560 tokens a latent frame), chunks of 3
  latent frames (12 video frames after the first chunk), the cache's window of 21 latent frames
  with 3 sink frames, 512 text tokens: Self-Forcing's schedule (4 steps + the context call) and
  StreamDiffusionV2's video-to-video (chunks of 1 latent frame, 4 steps, no context call, window
  6). Timed after the window has filled (the cache rolls every chunk). VAE decoding not counted.
  Anchor: StreamDiffusionV2's published 64.52 fps with 1.3B on 4 H100s (arXiv 2511.07399, no
  TensorRT), 16.1 fps per GPU.
- Stream Batch: n streams made in step, one network call a step for all of them
  (`pipelines/video/causal_batch.py`), against the same n streams one after another: the ratio of
  their frame rates (GPU: the 1.3B model, 2 streams in Self-Forcing's layout; CPU: the tiny model,
  4 streams).
- CPU: the tiny causal model's frames per second (the built-in one when installed, else a tiny
  random model of the same shape), text-to-video, after a warm-up.

    python3 benchmarks/causal_video.py [--gpu-only] [--out FILE]

Prints a table and writes JSON. Absolute CPU figures are only indicative (shared machines).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from streamstudio.models.video.causal_backbone import CausalWanBackbone
from streamstudio.models.video.causal_checkpoint import BUILTIN_CAUSAL, is_causal_folder, load_causal_checkpoint
from streamstudio.models.video.causal_wan import WAN_1_3B_CONFIG, CausalWan, CausalWanConfig
from streamstudio.pipelines.video.causal_batch import CausalBatch
from streamstudio.pipelines.video.causal_video import CausalConfig, CausalSampler

RESULTS = Path(__file__).resolve().parent / "results" / "causal_video.json"
SDV2_FPS_4_H100 = 64.52  # StreamDiffusionV2, 1.3B, 4 H100s
SDV2_FPS_PER_GPU = SDV2_FPS_4_H100 / 4
LATENT_480P = (16, 60, 104)  # (C, h, w) at 480x832
LAYOUTS = {  # name: (CausalConfig fields, video frames a chunk once streaming)
    "self_forcing_t2v": (dict(chunk_frames=3, steps=(1000.0, 750.0, 500.0, 250.0), warp=True, shift=5.0,
                              window=21, sink=3), 12),
    "streamdiffusionv2_v2v": (dict(chunk_frames=1, steps=(700.0, 500.0, 400.0, 200.0), warp=False, shift=8.0,
                                   window=6, sink=3, context_t=None, strength=0.8), 4),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_chunks(sampler: CausalSampler, chunks: int, v2v: bool) -> list[float]:
    """Seconds per chunk over `chunks` chunks."""
    latents = torch.randn(sampler.cfg.chunk_frames, *sampler.shape) if v2v else None
    times = []
    for _ in range(chunks):
        start = time.perf_counter()
        sampler.chunk(latents)
        sync(sampler.device)
        times.append(time.perf_counter() - start)
    return times


def batch_ratio(backbone: CausalWanBackbone, fields: dict, latent: tuple[int, int, int], n: int, chunks: int) -> dict:
    """n streams batched against the same n one after another: seconds a round and the speed-up."""
    cfg = CausalConfig(**fields)
    alone = [CausalSampler(backbone, cfg, latent, f"stream {i}") for i in range(n)]
    batch = CausalBatch(backbone, cfg, latent, [f"stream {i}" for i in range(n)])
    fill = -(-cfg.window // cfg.chunk_frames) + 1
    for _ in range(fill):  # (both past the window's filling)
        batch.chunks()
        for s in alone:
            s.chunk()
    sync(backbone.device)
    start = time.perf_counter()
    for _ in range(chunks):
        for s in alone:
            s.chunk()
    sync(backbone.device)
    one_by_one = (time.perf_counter() - start) / chunks
    start = time.perf_counter()
    for _ in range(chunks):
        batch.chunks()
    sync(backbone.device)
    batched = (time.perf_counter() - start) / chunks
    return {"streams": n, "one_by_one_ms": round(one_by_one * 1e3, 1), "batched_ms": round(batched * 1e3, 1),
            "speedup": round(one_by_one / batched, 2)}


def gpu_figures(rounds: int, device: str = "cuda", config: CausalWanConfig = WAN_1_3B_CONFIG,
                latent: tuple[int, int, int] = LATENT_480P) -> dict:
    """The figures of `config` at `latent` on `device` (tests run it with a tiny config on the CPU)."""
    dev = torch.device(device)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    with torch.device(dev):
        model = CausalWan(config).to(dtype).eval()
    text = torch.randn(1, config.text_len, config.text_dim, device=dev, dtype=dtype)
    backbone = CausalWanBackbone(model, lambda prompt: text)
    name_of = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    out: dict = {"device": name_of, "shape": f"{latent[1]}x{latent[2]} latents, "
                 f"{model.frame_tokens(latent[1], latent[2])} tokens/frame"}
    for name, (fields, frames) in LAYOUTS.items():
        sampler = CausalSampler(backbone, CausalConfig(**fields), latent, "x")
        fill = -(-sampler.cfg.window // sampler.cfg.chunk_frames) + 1  # chunks until the cache rolls
        time_chunks(sampler, fill, "strength" in fields)
        times = time_chunks(sampler, rounds, "strength" in fields)
        ms = statistics.median(times) * 1e3
        out[name] = {"ms_per_chunk": round(ms, 1), "fps": round(frames / (ms / 1e3), 1),
                     "calls_per_chunk": len(fields["steps"]) + (0 if fields.get("context_t", 0.0) is None else 1),
                     "cache_mb": round(sampler.cache_bytes / 1e6, 1),
                     "peak_gb": round(torch.cuda.max_memory_allocated(dev) / 1e9, 2) if dev.type == "cuda" else None}
    out["anchor_fps_per_gpu"] = round(SDV2_FPS_PER_GPU, 1)
    out["batch"] = batch_ratio(backbone, LAYOUTS["self_forcing_t2v"][0], latent, 2, max(2, rounds // 3))
    return out


def cpu_figures(seconds: float) -> dict:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if is_causal_folder(BUILTIN_CAUSAL):
        loaded = load_causal_checkpoint(BUILTIN_CAUSAL)
        model, text, s = loaded.model, loaded.text_encoder, loaded.sampling
        name = "built-in causal"
    else:
        torch.manual_seed(0)
        cfg = CausalWanConfig(dim=128, ffn_dim=512, freq_dim=64, text_dim=64, text_len=16, in_dim=3, out_dim=3,
                              num_heads=4, num_layers=4, patch_size=(1, 4, 4))
        model, s, name = CausalWan(cfg).eval(), {"height": 32, "width": 32}, "tiny random (no built-in installed)"

        def text(prompt):
            return torch.randn(1, 4, cfg.text_dim)
    fields = {k: (tuple(v) if k == "steps" else v) for k, v in s.items() if k in CausalConfig.__dataclass_fields__}
    sampler = CausalSampler(CausalWanBackbone(model, text), CausalConfig(**fields),
                            (model.cfg.in_dim, int(s["height"]), int(s["width"])), "a red circle moving left")
    time_chunks(sampler, 3, False)
    unguided = {**fields, "guidance": 1.0, "first_guidance": None}  # (a batch runs unguided streams)
    batch = batch_ratio(sampler.backbone, unguided, sampler.shape, 4, 3)
    made, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        time_chunks(sampler, 1, False)
        made += sampler.cfg.chunk_frames
    elapsed = time.perf_counter() - start
    return {"model": name, "fps": round(made / elapsed, 1), "threads": torch.get_num_threads(), "batch": batch,
            "cpu": platform.processor() or platform.machine()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu-only", action="store_true", help="only the GPU figures")
    ap.add_argument("--rounds", type=int, default=10, help="chunks timed per layout on the GPU")
    ap.add_argument("--seconds", type=float, default=10.0, help="CPU: seconds of text-to-video timed")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    result: dict = {}
    if torch.cuda.is_available():
        result["gpu"] = gpu_figures(args.rounds)
    else:
        result["gpu"] = {"missing": "no CUDA GPU on this machine"}
    if not args.gpu_only:
        result["cpu"] = cpu_figures(args.seconds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    gpu = result["gpu"]
    print("causal video")
    if "missing" in gpu:
        print(f"  1.3B at 480x832 on a GPU: missing ({gpu['missing']})")
    else:
        for name in LAYOUTS:
            g = gpu[name]
            print(f"  {name}: {g['ms_per_chunk']} ms a chunk, {g['fps']} fps ({g['calls_per_chunk']} calls), cache "
                  f"{g['cache_mb']} MB, against StreamDiffusionV2's {gpu['anchor_fps_per_gpu']} fps per H100")
        b = gpu["batch"]
        print(f"  {b['streams']} streams batched: {b['speedup']}x the frame rate of one after another")
    if "cpu" in result:
        c = result["cpu"]
        print(f"  CPU, {c['model']}: {c['fps']} fps on {c['threads']} thread(s); {c['batch']['streams']} streams "
              f"batched: {c['batch']['speedup']}x one after another")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
