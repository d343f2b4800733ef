"""Quality of the streaming video model: the 44-render protocol of issue 18.

22 prompts x 2 seeds, 32 frames each, text-to-video with the buffer sampler. Per video, on the
frames the user sees (RGB uint8), the object is the set of bright pixels (the synthetic
backgrounds are dark), and:

- direction: the mean frame-to-frame centroid motion (on the torus: the data wraps around the
  frame edges) along the prompted direction is at least 0.25 px/frame (half the data's slowest
  speed) and larger than the motion across it,
- vanished frames: frames with fewer bright pixels than 1% of the frame (the data's smallest
  object covers about 4%),
- area CV: standard deviation over mean of the object's area over the 32 frames,
- seam jump ratio: the mean centroid jump across chunk boundaries over the mean jump inside
  chunks (pooled over the videos; undefined for c = 1, where every step crosses a boundary and
  no in-chunk pair exists),
- backwards steps (share of steps moving against the prompt) and the background level's jump
  across and inside chunks, for the record.

Targets (issue 18): direction >= 40/44, no vanished frames, area CV <= 0.15, seam jump <= 1.3x.
The same measures on the training data's own clips (`--data`) are the reference.

    python3 benchmarks/video_quality.py [--model DIR] [--layout N,c,s] [--label NAME]
    python3 benchmarks/video_quality.py --data            # the metrics on the data itself
    python3 benchmarks/video_quality.py --subset 4        # a quick look: 4 prompts x 1 seed

    python3 benchmarks/video_quality.py --seeds 2 3 4 5 6 7 8 9   # held-out seeds: the spread
    python3 benchmarks/video_quality.py --no-warmup ...            # show the start-up's frames (before issue 30)

    python3 benchmarks/video_quality.py --causal [--model DIR] [--sampling steps=1000,500 shift=3 ...]
    python3 benchmarks/video_quality.py --causal --prompts held-out --seeds 2 3 4 5   # held out

`--causal` renders with the causal chunk sampler (pipelines/video/causal_video.py) from a causal
checkpoint (the built-in `causal_tiny` by default), the seam measured at its chunk size;
`--prompts held-out` takes 22 other (colour, shape, direction) prompts, none of the protocol's
(`HELD_OUT_PROMPTS`), for a model tuned on the protocol's.

Each run is stored under its label in benchmarks/results/video_quality.json (other labels kept)
and printed as a table against the targets. One render of 32 frames takes a few seconds on one
CPU thread.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results" / "video_quality.json"

# The protocol: 22 (colour, shape, direction) prompts covering the 7 colours, 3 shapes and
# 4 directions of the training data, each rendered with both seeds.
PROMPTS: tuple[str, ...] = (
    "a red circle moving left", "a green square moving right", "a blue triangle moving up",
    "a yellow circle moving down", "a cyan square moving left", "a magenta triangle moving right",
    "a white circle moving up", "a red square moving down", "a green triangle moving left",
    "a blue circle moving right", "a yellow square moving up", "a cyan triangle moving down",
    "a magenta circle moving left", "a white square moving right", "a red triangle moving up",
    "a green circle moving down", "a blue square moving left", "a yellow triangle moving right",
    "a cyan circle moving up", "a magenta square moving down", "a white triangle moving left",
    "a red circle moving right",
)
SEEDS: tuple[int, ...] = (0, 1)


def _held_out_prompts(count: int = 22) -> tuple[str, ...]:
    """`count` prompts of the training vocabulary the protocol does not use: the other (colour,
    shape, direction) combinations, taken in turn so the colours, shapes and directions all come."""
    from itertools import product

    colours = ("red", "green", "blue", "yellow", "cyan", "magenta", "white")
    others = [f"a {c} {s} moving {d}" for d, c, s in product(("left", "right", "up", "down"), colours,
                                                             ("circle", "square", "triangle"))
              if f"a {c} {s} moving {d}" not in PROMPTS]
    step = len(others) / count
    return tuple(others[int(i * step)] for i in range(count))


HELD_OUT_PROMPTS = _held_out_prompts()
FRAMES = 32
TARGETS = {"direction": 40, "vanished_frames": 0, "area_cv": 0.15, "seam_ratio": 1.3}
DIRECTIONS = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0)}
MIN_SPEED = 0.25  # px/frame at 32x32 (scaled with the frame width)
VANISH_FRACTION = 0.01
BRIGHT = 100  # max channel above this is the object


@dataclass
class VideoMeasure:
    prompt: str
    seed: int
    direction_ok: bool
    along: float  # mean px/frame along the prompted direction (32x32 scale)
    across: float  # mean |px/frame| across it
    backwards: float  # share of steps against the prompt
    vanished: int  # frames without the object
    vanished_at: list[int]  # their indices (0 = the first frame out)
    area_cv: float
    boundary_jumps: list[float]  # centroid jumps (px) across chunk boundaries
    inner_jumps: list[float]  # centroid jumps inside chunks
    background_boundary: list[float]
    background_inner: list[float]


def prompt_direction(prompt: str) -> tuple[float, float]:
    for word, vec in DIRECTIONS.items():
        if prompt.endswith(word):
            return vec
    raise ValueError(f"no direction in {prompt!r}")


def torus_centroid(mask: np.ndarray) -> tuple[float, float]:
    """(x, y) of a bool (H, W) mask on the torus: the circular mean along each axis."""
    h, w = mask.shape
    ys, xs = np.nonzero(mask)
    ax = 2 * np.pi * (xs + 0.5) / w
    ay = 2 * np.pi * (ys + 0.5) / h
    x = (math.atan2(np.sin(ax).mean(), np.cos(ax).mean()) % (2 * np.pi)) * w / (2 * np.pi) - 0.5
    y = (math.atan2(np.sin(ay).mean(), np.cos(ay).mean()) % (2 * np.pi)) * h / (2 * np.pi) - 0.5
    return x, y


def wrap(d: float, size: int) -> float:
    """A displacement on a ring of `size`, in [-size / 2, size / 2)."""
    return (d + size / 2) % size - size / 2


def measure_video(frames: list[np.ndarray], prompt: str, seed: int, chunk_size: int) -> VideoMeasure:
    """frames: RGB uint8 (H, W, 3); chunk boundaries after every `chunk_size` frames."""
    x = np.stack(frames).astype(np.float32)  # (F, H, W, 3)
    f, h, w, _ = x.shape
    scale = 32.0 / w  # report motion at the 32x32 scale
    mask = x.max(axis=-1) > BRIGHT  # (F, H, W)
    area = mask.reshape(f, -1).sum(1).astype(np.float64)  # (F,)
    present = area >= VANISH_FRACTION * h * w
    background = np.array([x[i][~mask[i]].mean() if (~mask[i]).any() else 0.0 for i in range(f)])  # (F,)
    cents = [torus_centroid(mask[i]) if present[i] else None for i in range(f)]
    dx, dy = prompt_direction(prompt)
    along, across, bound, inner, bg_bound, bg_inner = [], [], [], [], [], []
    for i in range(f - 1):
        crosses = (i + 1) % chunk_size == 0
        (bg_bound if crosses else bg_inner).append(abs(background[i + 1] - background[i]))
        if cents[i] is None or cents[i + 1] is None:
            continue
        mx = wrap(cents[i + 1][0] - cents[i][0], w) * scale
        my = wrap(cents[i + 1][1] - cents[i][1], h) * scale
        along.append(mx * dx + my * dy)
        across.append(mx * -dy + my * dx)
        (bound if crosses else inner).append(math.hypot(mx, my))
    mean_along = float(np.mean(along)) if along else 0.0
    mean_across = abs(float(np.mean(across))) if across else 0.0
    return VideoMeasure(
        prompt=prompt, seed=seed,
        direction_ok=bool(along) and mean_along >= MIN_SPEED and mean_along > mean_across,
        along=mean_along, across=mean_across,
        backwards=float(np.mean(np.array(along) < 0)) if along else 1.0,
        vanished=int((~present).sum()), vanished_at=[int(i) for i in np.flatnonzero(~present)],
        area_cv=float(area.std() / area.mean()) if area.mean() > 0 else float("inf"),
        boundary_jumps=bound, inner_jumps=inner,
        background_boundary=[float(b) for b in bg_bound], background_inner=[float(b) for b in bg_inner])


def summarize(videos: list[VideoMeasure], chunk_size: int) -> dict:
    """Protocol figures over the videos (pooled jumps, mean of the per-video area CVs)."""
    bound = [j for v in videos for j in v.boundary_jumps]
    inner = [j for v in videos for j in v.inner_jumps]
    bg_b = [j for v in videos for j in v.background_boundary]
    bg_i = [j for v in videos for j in v.background_inner]
    ratio = float(np.mean(bound) / np.mean(inner)) if chunk_size > 1 and bound and inner else None
    per_video = [np.mean(v.boundary_jumps) / np.mean(v.inner_jumps)
                 for v in videos
                 if chunk_size > 1 and v.boundary_jumps and v.inner_jumps and np.mean(v.inner_jumps) > 0]
    by_dir: dict[str, list[int]] = {}
    for v in videos:
        name = v.prompt.rsplit(" ", 1)[-1]
        by_dir.setdefault(name, [0, 0])
        by_dir[name][0] += int(v.direction_ok)
        by_dir[name][1] += 1
    at: dict[int, int] = {}
    for v in videos:
        for i in v.vanished_at:
            at[i] = at.get(i, 0) + 1
    by_seed: dict[int, list[VideoMeasure]] = {}
    for v in videos:
        by_seed.setdefault(v.seed, []).append(v)
    return {
        "videos": len(videos),
        "vanished_at_frame": {str(i): at[i] for i in sorted(at)},
        "by_seed": {str(seed): {"direction": f"{sum(v.direction_ok for v in vs)}/{len(vs)}",
                                "vanished_frames": sum(v.vanished for v in vs),
                                "area_cv": round(float(np.mean([v.area_cv for v in vs])), 3)}
                    for seed, vs in sorted(by_seed.items())},
        "direction": sum(v.direction_ok for v in videos),
        "direction_by_prompt": {k: f"{a}/{b}" for k, (a, b) in by_dir.items()},
        "speed_along_px_per_frame": float(np.mean([v.along for v in videos])),
        "backwards_steps": float(np.mean([v.backwards for v in videos])),
        "vanished_frames": sum(v.vanished for v in videos),
        "videos_with_vanished_frames": sum(v.vanished > 0 for v in videos),
        "area_cv": float(np.mean([v.area_cv for v in videos])),
        "jump_boundary_px": float(np.mean(bound)) if bound else None,
        "jump_inner_px": float(np.mean(inner)) if inner else None,
        "seam_ratio": ratio,
        "videos_seam_ratio_over_1_3": int(sum(r > 1.3 for r in per_video)) if per_video else None,
        "background_jump_boundary": float(np.mean(bg_b)) if bg_b else None,
        "background_jump_inner": float(np.mean(bg_i)) if bg_i else None,
    }


def protocol(subset: int | None = None, seeds: tuple[int, ...] | None = None,
             prompts: tuple[str, ...] = PROMPTS) -> list[tuple[str, int]]:
    """(prompt, seed) pairs: every prompt with each of `seeds` (default the protocol's two: 44), or
    the first `subset` prompts with the first seed."""
    seeds = tuple(seeds) if seeds else SEEDS
    if subset:
        return [(p, seeds[0]) for p in prompts[:subset]]
    return [(p, s) for p in prompts for s in seeds]


def render_model(model, meta: dict, prompt: str, seed: int, layout: tuple[int, int, int],
                 frames: int = FRAMES, guidance: float | None = None, warmup: bool | None = None,
                 solver: str | None = None, clip_sample: bool | None = None) -> list[np.ndarray]:
    """Text-to-video frames of a StreamDiT checkpoint at its latent size (RGB uint8); `warmup`
    (None: the checkpoint's `sampling.warmup`, else on, as `build_stream`) drops the frames the
    start-up generation touched; `solver` (None: the checkpoint's `sampling.solver`, else euler) and
    `clip_sample` (None: the checkpoint's `sampling.clip_sample`, else off)."""
    from streamstudio.models.video.video_net import StreamDiTBackbone
    from streamstudio.pipelines.video.stream_video import StreamBufferConfig, StreamVideoConfig, VideoStream

    n, c, s = layout
    smp = meta["sampling"]
    cfg = StreamVideoConfig(StreamBufferConfig(num_chunks=n, chunk_size=c, micro_steps=s,
                                               ref_frames=smp.get("ref_frames", 0), seed=seed,
                                               warmup=bool(smp.get("warmup", True) if warmup is None else warmup),
                                               solver=solver or smp.get("solver", "euler"),
                                               clip_sample=bool(smp.get("clip_sample", False)
                                                                if clip_sample is None else clip_sample)),
                            height=smp["height"], width=smp["width"])
    guidance = smp.get("guidance", 1.0) if guidance is None else guidance
    stream = VideoStream(StreamDiTBackbone(model, guidance), cfg, prompt)
    with torch.inference_mode():
        return list(stream.frames(frames))


def causal_sampling(sampling: dict, seed: int, **overrides):
    """(CausalConfig, height, width) from a causal checkpoint's sampling defaults and `overrides`."""
    from dataclasses import fields

    from streamstudio.pipelines.video.causal_video import CausalConfig

    smp = {**sampling, **overrides}
    names = {f.name for f in fields(CausalConfig)} - {"seed"}
    values = {k: (tuple(float(s) for s in v) if k == "steps" else v) for k, v in smp.items() if k in names}
    return CausalConfig(**values, seed=seed), int(smp["height"]), int(smp["width"])


def render_causal(causal, prompt: str, seed: int, frames: int = FRAMES, **overrides) -> list[np.ndarray]:
    """Text-to-video frames (RGB uint8) of a causal checkpoint (`causal_checkpoint.CausalModel`) with
    its sampling defaults, `overrides` replacing some (steps, shift, window, ...)."""
    from streamstudio.models.video.causal_backbone import CausalWanBackbone
    from streamstudio.pipelines.video.causal_video import CausalStreamConfig, CausalVideoStream

    cfg, h, w = causal_sampling(causal.sampling, seed, **overrides)
    backbone = CausalWanBackbone(causal.model, causal.text_encoder)
    stream = CausalVideoStream(backbone, CausalStreamConfig(cfg, h, w, temporal=causal.temporal), prompt,
                               codec=causal.codec)
    with torch.inference_mode():
        return list(stream.frames(frames))


def parse_overrides(items: list[str] | None) -> dict:
    """KEY=VALUE sampling overrides: steps=1000,500 (a list), sink=0 (a number), warp=false."""
    out: dict = {}
    for item in items or []:
        key, _, value = item.partition("=")
        if key == "steps":
            out[key] = [float(v) for v in value.split(",")]
        elif value.lower() in ("true", "false"):
            out[key] = value.lower() == "true"
        elif value.lower() == "none":
            out[key] = None
        else:
            out[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    return out


def data_clip(prompt: str, seed: int, size: int = 32, frames: int = FRAMES) -> list[np.ndarray]:
    """The training data's own clip for `prompt` (random speed, size, position by `seed`)."""
    import random

    from streamstudio.models.video.video_data import random_spec, render_shape_clip

    words = prompt.split()  # "a COLOUR SHAPE moving DIRECTION"
    spec = random_spec(random.Random(seed), size, colour=words[1])
    spec.shape, spec.direction = words[2], words[4]
    clip = render_shape_clip(spec, frames, size)  # (F, 3, H, W) in [-1, 1]
    x = ((clip.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return list(x)


def render_distance(model_a, steps_a: int, model_b, steps_b: int, meta: dict, num_chunks: int, chunk_size: int,
                    pairs: list[tuple[str, int]], frames: int = 16) -> float:
    """Mean absolute difference (grey levels, 0-255) of the videos two models make with the same
    prompts, seeds (so the same noise per frame) and layout (N, c), at s = steps_a and steps_b."""
    diffs = []
    for prompt, seed in pairs:
        a = render_model(model_a, meta, prompt, seed, (num_chunks, chunk_size, steps_a), frames)
        b = render_model(model_b, meta, prompt, seed, (num_chunks, chunk_size, steps_b), frames)
        diffs.append(np.abs(np.stack(a).astype(np.float64) - np.stack(b).astype(np.float64)).mean())
    return float(np.mean(diffs))


def distillation_figures(teacher_dir: str, student_dir: str, teacher_steps: int,
                         pairs: list[tuple[str, int]], frames: int = 16) -> dict:
    """Video-level check of a distilled student (s = 1) against its teacher at s = teacher_steps,
    beside the teacher's own s = 1 videos, in the student's layout (N, c)."""
    from streamstudio.models.video.stream_dit import load_checkpoint

    teacher, _ = load_checkpoint(teacher_dir)
    student, meta = load_checkpoint(student_dir)
    n, c = meta["sampling"]["num_chunks"], meta["sampling"]["chunk_size"]
    return {"layout": f"N={n} c={c}", "teacher_steps": teacher_steps, "videos": len(pairs), "frames": frames,
            "student_s1_vs_teacher": render_distance(student, 1, teacher, teacher_steps, meta, n, c, pairs, frames),
            "teacher_s1_vs_teacher": render_distance(teacher, 1, teacher, teacher_steps, meta, n, c, pairs, frames)}


def table(label: str, result: dict) -> str:
    s = result["summary"]
    n = s["videos"]
    seam = "n/a (c = 1: no in-chunk steps)" if s["seam_ratio"] is None else (
        f"{s['seam_ratio']:.2f}x ({s['jump_boundary_px']:.2f} / {s['jump_inner_px']:.2f} px; "
        f"{s['videos_seam_ratio_over_1_3']}/{n} videos over 1.3)")
    rows = [
        ("direction", f"{s['direction']}/{n} ({', '.join(f'{k} {v}' for k, v in s['direction_by_prompt'].items())})",
         f">= {TARGETS['direction']}/44"),
        ("vanished frames", f"{s['vanished_frames']} of {n * FRAMES} ({s['videos_with_vanished_frames']} videos)", "0"),
        ("area CV", f"{s['area_cv']:.3f}", f"<= {TARGETS['area_cv']}"),
        ("seam jump", seam, f"<= {TARGETS['seam_ratio']}x"),
        ("speed along prompt", f"{s['speed_along_px_per_frame']:.2f} px/frame, {100 * s['backwards_steps']:.0f}% "
                               "steps backwards", "(data 0.5-2.0)"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{label}: {result['source']}, layout {result['layout']}, {n} videos x {FRAMES} frames, "
             f"{result['seconds']:.0f} s"]
    lines += [f"  {a:<{w0}}  {b:<{w1}}  target {c}" for a, b, c in rows]
    if len(s.get("by_seed", {})) > 1:  # the spread over seeds
        lines.append("  per seed: " + "; ".join(f"{k}: direction {v['direction']}, vanished {v['vanished_frames']}, "
                                                 f"area CV {v['area_cv']:.3f}" for k, v in s["by_seed"].items()))
    if s.get("vanished_at_frame"):
        lines.append("  vanished frames by index: " + ", ".join(f"{k}: {v}" for k, v in s["vanished_at_frame"].items()))
    return "\n".join(lines)


_MODELS: dict[str, tuple] = {}


def _measure_job(job: tuple) -> VideoMeasure:
    """One render of the protocol, measured (in a worker process: the model is loaded once there)."""
    from streamstudio.models.video.stream_dit import load_checkpoint

    folder, prompt, seed, layout, guidance, warmup, solver, clip, threads = job
    torch.set_num_threads(threads)
    if folder not in _MODELS:
        _MODELS[folder] = load_checkpoint(folder)
    model, meta = _MODELS[folder]
    frames = render_model(model, meta, prompt, seed, layout, guidance=guidance, warmup=warmup, solver=solver,
                          clip_sample=clip)
    return measure_video(frames, prompt, seed, layout[1])


def _measure_causal_job(job: tuple) -> VideoMeasure:
    """One causal render, measured (the model loaded once per process)."""
    from streamstudio.models.video.causal_checkpoint import load_causal_checkpoint

    folder, prompt, seed, overrides, threads = job
    torch.set_num_threads(threads)
    if folder not in _MODELS:
        _MODELS[folder] = (load_causal_checkpoint(folder),)
    causal = _MODELS[folder][0]
    frames = render_causal(causal, prompt, seed, **overrides)
    chunk = causal_sampling(causal.sampling, seed, **overrides)[0].chunk_frames
    return measure_video(frames, prompt, seed, chunk)


def run_causal(args, pairs: list[tuple[str, int]]) -> tuple[list[VideoMeasure], str, str, int]:
    """The causal model's renders: (measures, source, layout, chunk frames)."""
    from streamstudio.models.video.causal_checkpoint import BUILTIN_CAUSAL

    folder = args.model or str(BUILTIN_CAUSAL)
    overrides = parse_overrides(args.sampling)
    jobs = [(folder, p, s, overrides, args.threads) for p, s in pairs]
    if args.workers > 1:
        with Pool(args.workers) as pool:
            videos = pool.map(_measure_causal_job, jobs, chunksize=1)
    else:
        videos = [_measure_causal_job(j) for j in jobs]
    cfg = causal_sampling(_MODELS[folder][0].sampling if folder in _MODELS else
                          json.loads((Path(folder) / "config.json").read_text())["causal"]["sampling"], 0,
                          **overrides)[0]
    layout = (f"causal c={cfg.chunk_frames} steps={','.join(f'{s:g}' for s in cfg.steps)} shift={cfg.shift:g} "
              f"warp={cfg.warp} window={cfg.window} sink={cfg.sink}")
    return videos, folder, layout, cfg.chunk_frames


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--causal", action="store_true",
                        help="a causal checkpoint (--model; default the built-in causal_tiny) with the chunk sampler")
    parser.add_argument("--sampling", nargs="+", default=None, metavar="KEY=VALUE",
                        help="--causal: sampling overrides (steps=1000,750,500 shift=3 window=6 sink=0 warp=false)")
    parser.add_argument("--prompts", choices=("protocol", "held-out"), default="protocol",
                        help="the protocol's 22 prompts, or 22 others of the same vocabulary (HELD_OUT_PROMPTS)")
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the built-in model)")
    parser.add_argument("--layout", default=None, help="N,c,s (default: the checkpoint's sampling defaults)")
    parser.add_argument("--guidance", type=float, default=None,
                        help="classifier-free guidance (default: the checkpoint's, else 1)")
    parser.add_argument("--data", action="store_true", help="measure the training data's clips instead of a model")
    parser.add_argument("--subset", type=int, default=None, help="only the first K prompts, seed 0 (quick)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="seeds other than the protocol's 0 and 1 (held out: the model was not selected on "
                             "them); the table adds each seed's figures and where frames vanish")
    parser.add_argument("--no-warmup", action="store_true",
                        help="show the frames the start-up generation touched (the sampler before issue 30)")
    parser.add_argument("--solver", choices=("euler", "ab2", "heun"), default=None,
                        help="the buffer's solver (default: the checkpoint's, else euler)")
    parser.add_argument("--clip-sample", choices=("on", "off"), default=None,
                        help="clip each predicted clean frame to [-1, 1] (default: the checkpoint's)")
    parser.add_argument("--workers", type=int, default=1, help="render processes (each with --threads threads)")
    parser.add_argument("--label", default=None, help="name of this run in the JSON (default from the source)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pairs = protocol(args.subset, args.seeds, HELD_OUT_PROMPTS if args.prompts == "held-out" else PROMPTS)
    start = time.perf_counter()
    causal_layout = None
    if args.causal:
        videos, source, causal_layout, chunk = run_causal(args, pairs)
        layout, guidance, solver, clip = (0, chunk, 0), 1.0, "euler", False
    elif args.data:
        layout, source, guidance, solver, clip = (1, 1, 1), "training data (render_shape_clip)", 1.0, "euler", False
        videos = [measure_video(data_clip(p, s), p, s, chunk_size=1) for p, s in pairs]
    else:
        from streamstudio.models.video.stream_dit import BUILTIN_CHECKPOINT, load_checkpoint

        folder = args.model or str(BUILTIN_CHECKPOINT)
        model, meta = _MODELS.setdefault(folder, load_checkpoint(folder))  # workers fork with it loaded
        smp = meta["sampling"]
        layout = (tuple(int(v) for v in args.layout.split(",")) if args.layout
                  else (smp["num_chunks"], smp["chunk_size"], smp["micro_steps"]))
        source = folder
        guidance = smp.get("guidance", 1.0) if args.guidance is None else args.guidance
        warmup = False if args.no_warmup else None
        solver = args.solver or smp.get("solver", "euler")
        clip = smp.get("clip_sample", False) if args.clip_sample is None else args.clip_sample == "on"
        jobs = [(folder, p, s, layout, guidance, warmup, solver, clip, args.threads) for p, s in pairs]
        if args.workers > 1:
            with Pool(args.workers) as pool:
                videos = pool.map(_measure_job, jobs, chunksize=1)
        else:
            videos = [_measure_job(j) for j in jobs]
    seconds = time.perf_counter() - start
    label = args.label or ("data" if args.data else f"{Path(source).name} {causal_layout}" if causal_layout
                           else f"{Path(source).name} N={layout[0]} c={layout[1]} s={layout[2]}"
                                                    + (f" g={guidance:g}" if guidance != 1.0 else "")
                                                    + (f" {solver}" if solver != "euler" else "")
                                                    + (" clip" if clip else ""))
    if args.no_warmup and not args.label:
        label += " no warm-up"
    if args.subset:
        label += f" (subset {args.subset})"
    if args.seeds:
        label += " seeds " + ",".join(map(str, args.seeds))
    if args.prompts != "protocol":
        label += f" ({args.prompts} prompts)"
    result = {"source": source, "layout": causal_layout or "N={} c={} s={}".format(*layout)
              + ("" if args.data or guidance == 1.0 else f" guidance {guidance:g}")
              + ("" if args.data or solver == "euler" else f" solver {solver}")
              + (" clip_sample" if clip else ""), "seconds": seconds,
              "warmup": None if args.data else not args.no_warmup,
              "threads": args.threads, "summary": summarize(videos, layout[1]),
              "videos": [{"prompt": v.prompt, "seed": v.seed, "direction_ok": v.direction_ok,
                          "along": round(v.along, 3), "vanished": v.vanished, "area_cv": round(v.area_cv, 3)}
                         for v in videos]}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    stored = json.loads(out.read_text()) if out.is_file() else {}
    stored.setdefault("protocol", {"prompts": list(PROMPTS), "seeds": list(SEEDS), "frames": FRAMES,
                                   "targets": TARGETS})
    stored.setdefault("runs", {})[label] = result
    out.write_text(json.dumps(stored, indent=2))
    print(table(label, result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
