"""Benchmark of the StreamDiT-style streaming video pipeline.

- buffer overhead: time of one sampler call (`StreamSampler.step`) over the raw network forward
  on the same buffer (target <= 1.10),
- window against full self-attention at the 4B model's token count at 512p (16 frames of
  32 x 32 tokens: 64 x 64 latents of an 8x VAE, patch 2) for one attention layer of small width
  (CPU time),
- frames per second of the built-in tiny model on CPU (text-to-video, after the start-up),
- the 4B config's time per step on 16 frames of 512p video: 16 x 64 x 64 latents of 16 channels
  (an 8x VAE), 16 x 32 x 32 tokens after patch 2; only with a GPU (missing otherwise). Anchor:
  the paper's 482 ms per step on one H100; target <= 350 ms with window attention, SDPA
  (flash) kernels and bf16.
- Wan 2.1 T2V 1.3B's transformer (its real config, random weights, bf16) behind the Wan backbone:
  one buffer call of the StreamDiT layout N=4, c=2 (8 latent frames, one timestep each) at
  480x832 = 60x104 latents of Wan's 8x VAE (8 x 30 x 52 = 12,480 tokens), 512 text tokens of 4096;
  only with a GPU (missing otherwise).

    python3 benchmarks/stream_video.py [--quick] [--threads N]
    python3 benchmarks/stream_video.py --gpu-only     # on a GPU machine: the 4B step time alone
    python3 benchmarks/stream_video.py --wan-only     # on a GPU machine: the Wan 2.1 1.3B buffer call alone

Prints a table and writes benchmarks/results/stream_video.json. Ratios are measured in one run;
absolute CPU figures are only indicative (shared, noisy machines).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from streamstudio.models.video.stream_dit import (StreamDiT, WindowSelfAttention, count_parameters, load_builtin,
                                            named_config)
from streamstudio.models.video.video_net import StreamDiTBackbone
from streamstudio.pipelines.video.stream_video import StreamBufferConfig, StreamSampler, StreamVideoConfig, VideoStream

RESULTS = Path(__file__).resolve().parent / "results" / "stream_video.json"
PAPER_STEP_MS_H100 = 482  # StreamDiT (arXiv 2507.03745), 4B model, 512p, one H100
TARGET_STEP_MS_H100 = 350
# 512p with an 8x VAE: 16 frames x 16 channels x 64 x 64 latents (B, F, C, H, W); 16 x 32 x 32 tokens at patch 2
LATENT_4B_512P = (1, 16, 16, 64, 64)
LATENT_LABEL = "16 frames x 16 ch x 64x64 latents (512p, 8x VAE; 16x32x32 tokens)"
TOKENS_4B_512P = (16, 32, 32)
# Wan 2.1 T2V 1.3B's transformer config, from diffusers' scripts/convert_wan_to_diffusers.py
# ("Wan-T2V-1.3B"), which wrote Wan-AI/Wan2.1-T2V-1.3B-Diffusers/transformer/config.json (the
# Wan2.1 repo's wan/configs/wan_t2v_1_3B.py: dim 1536 = 12 heads x 128, ffn 8960, 30 layers);
# rope_max_seq_len is diffusers' default (1024).
WAN21_1_3B_CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                         out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
                         cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
# one buffer of N=4 chunks of c=2 latent frames at 480x832: (B, F, C, H, W) latents of the 8x, 16-channel VAE
WAN_1_3B_LATENT = (1, 8, 16, 480 // 8, 832 // 8)
WAN_LABEL = "8 latent frames (N=4 c=2) x 16 ch x 60x104 latents (480x832; 8x30x52 tokens)"
WAN_TEXT_SHAPE = (1, 512, 4096)  # UMT5-XXL embeddings of WanPipeline's 512 tokens


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def buffer_overhead(repeats: int) -> dict:
    """Sampler call vs the raw forward, interleaved so both see the same machine load."""
    model, meta = load_builtin()
    backbone = StreamDiTBackbone(model)
    cfg = StreamBufferConfig(num_chunks=4, chunk_size=2, micro_steps=2)
    sampler = StreamSampler(backbone, cfg, (3, 32, 32), "a red circle moving left")
    sampler.start()
    x = torch.randn(1, cfg.frames, 3, 32, 32)
    t = torch.rand(1, cfg.frames)
    text = sampler.text
    step_times, fwd_times = [], []
    with torch.inference_mode():
        for _ in range(2):  # warm-up
            sampler.step()
            model(x, t, text)
        for _ in range(repeats):
            step_times += timed(sampler.step, 1)
            fwd_times += timed(lambda: model(x, t, text), 1)
    step, fwd = statistics.median(step_times), statistics.median(fwd_times)
    return {"buffer_frames": cfg.frames, "frame": "32x32", "step_ms": 1e3 * step, "forward_ms": 1e3 * fwd,
            "ratio": step / fwd, "target": 1.10}


def attention_compare(grid: tuple[int, int, int], window: tuple[int, int, int], dim: int, heads: int,
                      repeats: int) -> dict:
    torch.manual_seed(0)
    attn = WindowSelfAttention(dim, heads).eval()
    x = torch.randn(1, *grid, dim)  # (1, F, H, W, D)
    n = x[0, ..., 0].numel()

    def full():
        flat = x.reshape(1, n, dim)
        q, k, v = attn.qkv(flat).view(1, n, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
        return attn.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, n, dim))

    with torch.inference_mode():
        win = statistics.median(timed(lambda: attn(x, window, (0, 0, 0)), repeats))
        dense = statistics.median(timed(full, max(1, repeats // 2)))
    return {"tokens": f"{grid[0]}x{grid[1]}x{grid[2]}", "n_tokens": n, "window": "x".join(map(str, window)),
            "dim": dim, "heads": heads, "window_ms": 1e3 * win, "full_ms": 1e3 * dense, "speedup": dense / win}


def builtin_fps(frames: int) -> dict:
    """The built-in model's text-to-video frames/s with its own sampling (solver included), and
    with the Euler solver beside it when its own is another (the same run: a ratio)."""
    model, meta = load_builtin()
    s = meta["sampling"]
    guidance = s.get("guidance", 1.0)  # the checkpoint's own: two network calls per step when guided
    solver = s.get("solver", "euler")

    def fps(solver: str) -> tuple[int, float]:
        cfg = StreamVideoConfig(StreamBufferConfig(num_chunks=s["num_chunks"], chunk_size=s["chunk_size"],
                                                   micro_steps=s["micro_steps"], solver=solver,
                                                   clip_sample=bool(s.get("clip_sample", False))),
                                out_height=32, out_width=32)
        stream = VideoStream(StreamDiTBackbone(model, guidance), cfg, "a blue square moving up")
        with torch.inference_mode():
            stream.push(None)  # start-up (uniform generation) and first chunk
            start = time.perf_counter()
            made = 0
            while made < frames:
                made += len(stream.push(None))
            return made, time.perf_counter() - start

    made, seconds = fps(solver)
    out = {"frames": made, "seconds": seconds, "fps": made / seconds, "threads": torch.get_num_threads(),
           "buffer": f"N={s['num_chunks']} c={s['chunk_size']} s={s['micro_steps']} guidance {guidance:g}"
                     + (f" {solver}" if solver != "euler" else ""), "frame": "32x32"}
    if solver != "euler":
        made_e, seconds_e = fps("euler")
        out["fps_euler"] = made_e / seconds_e
    return out


def gpu_4b(repeats: int, config: str = "4b", latent: tuple[int, ...] = LATENT_4B_512P) -> dict:
    """The 4B model's step time on the GPU (config and latent shape: for the CPU test of this path)."""
    anchor = {"latent": LATENT_LABEL, "latent_shape": list(latent), "paper_step_ms_h100": PAPER_STEP_MS_H100,
              "target_ms_h100": TARGET_STEP_MS_H100}
    if not torch.cuda.is_available():
        with torch.device("meta"):
            params = count_parameters(StreamDiT(named_config(config)))
        return {"params": params, "step_ms": None, **anchor,
                "note": "missing: no GPU in this session (the 4B step at 512p needs one)"}
    with torch.device("cuda"):  # initialised on the GPU: 4B parameters' random init on the CPU takes minutes
        model = StreamDiT(named_config(config)).to(torch.bfloat16).eval()
    x = torch.randn(*latent, device="cuda", dtype=torch.bfloat16)  # (B, F, C, H, W): 16x64x64 latents
    t = torch.rand(latent[0], latent[1], device="cuda")  # (B, F): one level per frame
    text = model.encode_text("a red circle moving left")
    ms = cuda_median_ms(lambda: model(x, t, text), repeats)
    return {"params": count_parameters(model), "step_ms": ms, **anchor, "device": torch.cuda.get_device_name()}


def cuda_median_ms(fn, repeats: int) -> float:
    """Median milliseconds of `fn()` on the GPU in inference mode, after one warm-up call."""
    def call():
        fn()
        torch.cuda.synchronize()

    with torch.inference_mode():
        call()
        return 1e3 * statistics.median(timed(call, repeats))


def gpu_wan(repeats: int) -> dict:
    """One buffer call of the Wan 2.1 1.3B transformer (random weights, bf16) through WanBackbone,
    one timestep per latent frame; on the GPU only (missing otherwise)."""
    from diffusers import WanTransformer3DModel

    from streamstudio.models.video.wan import WanBackbone

    anchor = {"latent": WAN_LABEL, "latent_shape": list(WAN_1_3B_LATENT), "config": "Wan2.1-T2V-1.3B (random weights)"}
    if not torch.cuda.is_available():
        with torch.device("meta"):
            params = count_parameters(WanTransformer3DModel(**WAN21_1_3B_CONFIG))
        return {"params": params, "step_ms": None, **anchor,
                "note": "missing: no GPU in this session (the Wan 2.1 1.3B buffer call at 480x832 needs one)"}
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(**WAN21_1_3B_CONFIG).to("cuda", torch.bfloat16).eval()
    text = torch.randn(*WAN_TEXT_SHAPE, device="cuda", dtype=torch.bfloat16)
    backbone = WanBackbone(transformer, lambda prompt: text)
    x = torch.randn(*WAN_1_3B_LATENT, device="cuda", dtype=torch.bfloat16)  # (B, F, C, H, W)
    t = torch.linspace(0.05, 0.95, WAN_1_3B_LATENT[1], device="cuda")[None]  # (B, F): one level per frame
    ms = cuda_median_ms(lambda: backbone.velocity(x, t, text), repeats)
    latent_frames = WAN_1_3B_LATENT[1]
    return {"params": count_parameters(transformer), "step_ms": ms, **anchor, "device": torch.cuda.get_device_name(),
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30,
            # s = 2 calls per chunk of c = 2 latent frames, 4 frames each (after the first chunk);
            # guidance (WanPipeline's 5) doubles the batch
            "fps_guidance_1": 4 * 2 / (2 * ms / 1e3), "latent_frames": latent_frames}


def wan_text(g: dict) -> str:
    if g["step_ms"] is None:
        return "missing (no GPU)"
    return (f"{g['step_ms']:.0f} ms on {g.get('device', 'GPU')} ({g['peak_gb']:.1f} GB peak; "
            f"{g['fps_guidance_1']:.1f} frames/s from the transformer at s=2, no guidance, VAE not counted)")


def step_text(g: dict) -> str:
    anchor = f"paper: {PAPER_STEP_MS_H100} ms on one H100; target <= {TARGET_STEP_MS_H100} ms"
    if g["step_ms"] is None:
        return f"missing (no GPU; {anchor})"
    return f"{g['step_ms']:.0f} ms on {g.get('device', 'GPU')} ({anchor})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and a smaller attention grid (< 60 s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--output", default=str(RESULTS))
    parser.add_argument("--gpu-only", action="store_true", help="only the 4B step time (on a GPU machine)")
    parser.add_argument("--wan-only", action="store_true", help="only the Wan 2.1 1.3B buffer call (on a GPU machine)")
    args = parser.parse_args(argv)
    if args.wan_only:
        w = gpu_wan(10)
        print(f"Wan 2.1 1.3B buffer call, {WAN_LABEL}:", wan_text(w), f"{w['params'] / 1e9:.2f}B parameters")
        return 0 if w["step_ms"] is not None else 1
    if args.gpu_only:
        g = gpu_4b(10)
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"gpu_4b": g, "torch": torch.__version__}, indent=2))
        print(f"4B step, {LATENT_LABEL}:", step_text(g), f"{g['params'] / 1e9:.2f}B parameters")
        print(f"wrote {out}")
        return 0 if g["step_ms"] is not None else 1
    torch.set_num_threads(args.threads)
    reps = 5 if args.quick else 20
    grid = (8, 32, 32) if args.quick else TOKENS_4B_512P
    results = {
        "quick": args.quick,
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                    "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
        "buffer_overhead": buffer_overhead(reps),
        "attention": attention_compare(grid, (4, 16, 16), dim=32, heads=2, repeats=3 if args.quick else 3),
        "builtin_fps_cpu": builtin_fps(16 if args.quick else 64),
        "gpu_4b": gpu_4b(10),
        "gpu_wan_1_3b": gpu_wan(10),
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    b, a, f, g, w = (results[k] for k in ("buffer_overhead", "attention", "builtin_fps_cpu", "gpu_4b", "gpu_wan_1_3b"))
    rows = [
        ("buffer step / raw forward",
         f"{b['ratio']:.3f} (target <= 1.10; {b['step_ms']:.1f} / {b['forward_ms']:.1f} ms)"),
        (f"full / window attention, {a['tokens']} tokens",
         f"{a['speedup']:.1f}x ({a['full_ms']:.0f} / {a['window_ms']:.0f} ms, "
         f"window {a['window']}, dim {a['dim']})"),
        ("built-in model, CPU", f"{f['fps']:.1f} fps ({f['threads']} thread(s), {f['buffer']}, {f['frame']})"
         + (f"; {f['fps_euler']:.1f} with the Euler solver" if "fps_euler" in f else "")),
        (f"4B step, {LATENT_LABEL}", step_text(g)),
        (f"Wan 2.1 1.3B buffer call, {WAN_LABEL}", wan_text(w)),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
