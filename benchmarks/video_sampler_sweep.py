"""Sampler variants of the built-in video model on the issue-30 tuning split (docs/video.md,
"Sampler variants and fine-tunes tried against the weak prompt").

The tuning split: the 22 protocol prompts on seeds 12, 18, 21, 25 (88 renders; the split the
shipped guidance was chosen on) and the model's weak prompt, "a white triangle moving left", on
seeds 40-69 (30 renders; never used for anything else). Each variant is one `--spec`:

    g:G               classifier-free guidance G against the empty prompt (g:3 is the shipped sampler)
    hi:H,lo:L,tau:T   guidance H on frames at t < T (the noisy levels, where the object is decided), L after
    shift:S           the flow-matching timestep shift S (StreamBufferConfig.shift: more levels near noise)
    apg:1             adaptive projected guidance (Sadat et al. 2024): the guidance term without its part
                      along the predicted clean frame x + (1 - t) v_text
    ag:A              autoguidance (Karras et al. 2024) added to CFG: + A (v_text - v_weak), v_weak from
                      `--weak DIR` (an earlier, less trained checkpoint of the same model)
    agp:A             autoguidance alone: v_weak + A (v_text - v_weak)
    s:S               micro-steps per chunk (the shipped 2)
    ab2:1 / heun:1    the buffer's second-order solvers (StreamBufferConfig.solver)
    clip:1            clip each predicted clean frame to [-1, 1] (StreamBufferConfig.clip_sample)

    python3 benchmarks/video_sampler_sweep.py --spec g:3 --spec shift:1.5,g:3 --workers 2

Figures go to benchmarks/results/video_sampler_sweep.json (one entry per spec and model) and a
table row is printed per spec: direction, vanished frames (videos) and area CV on each part.
"""

from __future__ import annotations

import argparse
import json
import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import video_quality as vq  # noqa: E402

from streamstudio.models.video.video_net import StreamDiTBackbone  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "video_sampler_sweep.json"
TUNE_SEEDS = (12, 18, 21, 25)
WEAK_PROMPT = "a white triangle moving left"
WEAK_SEEDS = tuple(range(40, 70))


SPEC_KEYS = ("g", "hi", "lo", "tau", "shift", "apg", "ag", "agp", "s", "ab2", "heun", "clip")


def parse_spec(spec: str) -> dict[str, float]:
    """"g:3,shift:1.5" -> {"g": 3.0, "shift": 1.5, ...} with the defaults filled in."""
    d = {k: float(v) for k, v in (part.split(":") for part in spec.split(","))}
    unknown = sorted(set(d) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"{spec}: unknown key(s) {unknown}; known: {', '.join(SPEC_KEYS)}")
    d.setdefault("g", 1.0)
    d.setdefault("hi", d["g"])
    d.setdefault("lo", d["g"])
    d.setdefault("tau", 0.0)
    if d.get("ab2") and d.get("heun"):
        raise ValueError(f"{spec}: one solver at a time (ab2 or heun)")
    return d


def solver(spec: dict[str, float]) -> str:
    return "ab2" if spec.get("ab2") else "heun" if spec.get("heun") else "euler"


class VariantBackbone(StreamDiTBackbone):
    """StreamDiTBackbone with one of the spec's guidance variants (g alone: the shipped sampler)."""

    def __init__(self, model: torch.nn.Module, spec: dict[str, float], weak: torch.nn.Module | None = None):
        super().__init__(model, guidance=2.0)  # any scale != 1 makes encode_text encode "" too
        self.spec, self.weak = spec, weak

    def encode_text(self, prompt: str):
        """The prompt for this model; the weak model encodes it with its own text encoder."""
        self._weak_text = self.weak.encode_text([prompt]) if self.weak is not None else None
        return super().encode_text(prompt)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, text) -> torch.Tensor:
        sp = self.spec
        v_text = self.model(x, t, text)  # x (1, F, C, h, w), t (1, F)
        if sp.get("agp"):
            v_weak = self.weak(x, t, self._weak_text)
            return v_weak + sp["agp"] * (v_text - v_weak)
        v_empty = self.model(x, t, self._empty)
        g = torch.where(t < sp["tau"], sp["hi"], sp["lo"]).to(x.dtype)[..., None, None, None]  # (1, F, 1, 1, 1)
        d = v_text - v_empty
        if sp.get("apg"):
            x0 = x + (1 - t).to(x.dtype)[..., None, None, None] * v_text  # predicted clean frames
            dims = (2, 3, 4)
            par = (d * x0).sum(dims, keepdim=True) / (x0 * x0).sum(dims, keepdim=True).clamp_min(1e-8) * x0
            return v_text + (g - 1) * (d - par)
        v = v_empty + g * d
        if sp.get("ag"):
            v = v + sp["ag"] * (v_text - self.weak(x, t, self._weak_text))
        return v


def render(model, spec: dict[str, float], prompt: str, seed: int, weak=None) -> list[np.ndarray]:
    """The built-in layout (N=8, c=1, warm-up) with the spec's guidance, shift, micro-steps (2) and solver."""
    from streamstudio.pipelines.video.stream_video import StreamBufferConfig, StreamVideoConfig, VideoStream

    buffer = StreamBufferConfig(num_chunks=8, chunk_size=1, micro_steps=int(spec.get("s", 2)), seed=seed,
                                shift=spec.get("shift", 1.0), warmup=True, solver=solver(spec),
                                clip_sample=bool(spec.get("clip")))
    stream = VideoStream(VariantBackbone(model, spec, weak), StreamVideoConfig(buffer, height=32, width=32), prompt)
    with torch.inference_mode():
        return list(stream.frames(vq.FRAMES))


_LOADED: dict[str, torch.nn.Module] = {}


def _load(folder: str) -> torch.nn.Module:
    from streamstudio.models.video.stream_dit import load_checkpoint

    if folder not in _LOADED:
        _LOADED[folder] = load_checkpoint(folder)[0]
    return _LOADED[folder]


def _job(args: tuple[str, str | None, str, str, int]) -> dict:
    model_dir, weak_dir, spec, prompt, seed = args
    torch.set_num_threads(1)
    sp = parse_spec(spec)
    weak = _load(weak_dir) if (sp.get("ag") or sp.get("agp")) else None
    m = vq.measure_video(render(_load(model_dir), sp, prompt, seed, weak), prompt, seed, 1)
    return {"prompt": prompt, "seed": seed, "vanished": m.vanished, "vanished_at": m.vanished_at,
            "area_cv": m.area_cv, "direction_ok": m.direction_ok}


def split_figures(videos: list[dict]) -> dict:
    return {"videos": len(videos), "direction": sum(v["direction_ok"] for v in videos),
            "vanished_frames": sum(v["vanished"] for v in videos),
            "videos_with_vanished_frames": sum(v["vanished"] > 0 for v in videos),
            "area_cv": round(float(np.mean([v["area_cv"] for v in videos])), 3)}


def main(argv=None) -> int:
    from streamstudio.models.video.stream_dit import BUILTIN_CHECKPOINT

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", action="append", required=True, help="a sampler variant (see above); repeatable")
    p.add_argument("--model", default=str(BUILTIN_CHECKPOINT), help="checkpoint folder (default: the built-in model)")
    p.add_argument("--weak", default=None, help="the weaker checkpoint autoguidance (ag, agp) guides against")
    p.add_argument("--workers", type=int, default=2, help="render processes (one thread each)")
    p.add_argument("--label", default=None, help="name of the model in the JSON (default: its folder)")
    p.add_argument("--output", default=str(RESULTS))
    p.add_argument("--part", choices=("both", "prompts", "weak"), default="both",
                   help="render the 88 renders of every prompt, the weak prompt's 30, or both (a screen)")
    args = p.parse_args(argv)
    stored = json.loads(Path(args.output).read_text()) if Path(args.output).exists() else {}
    stored.setdefault("split", {"prompts_x_seeds": list(TUNE_SEEDS), "weak_prompt": WEAK_PROMPT,
                                "weak_seeds": [WEAK_SEEDS[0], WEAK_SEEDS[-1]]})
    print("| spec | 22 prompts x 4 seeds: direction | vanished (videos) | area CV "
          "| weak prompt x 30 seeds: direction | vanished (videos) | area CV |")
    for spec in args.spec:
        try:  # a typo fails before any render
            sp = parse_spec(spec)
        except ValueError as e:
            p.error(str(e))
        if (sp.get("ag") or sp.get("agp")) and not args.weak:
            p.error(f"{spec}: autoguidance needs --weak DIR")
        parts_jobs = {"prompts": [(args.model, args.weak, spec, prompt, s)
                                  for s in TUNE_SEEDS for prompt in vq.PROMPTS],
                      "weak_prompt": [(args.model, args.weak, spec, WEAK_PROMPT, s) for s in WEAK_SEEDS]}
        if args.part != "both":
            parts_jobs = {k: v for k, v in parts_jobs.items() if k.startswith(args.part)}
        jobs = [j for part in parts_jobs.values() for j in part]
        with Pool(args.workers) as pool:
            videos = pool.map(_job, jobs, chunksize=1)
        parts, at = {}, 0
        for name, part in parts_jobs.items():
            parts[name] = split_figures(videos[at:at + len(part)])
            at += len(part)
        cells = []
        for name in ("prompts", "weak_prompt"):
            f = parts.get(name)
            cells += (["-"] * 3 if f is None else
                      [f"{f['direction']}/{f['videos']}",
                       f"{f['vanished_frames']} ({f['videos_with_vanished_frames']})",
                       f"{f['area_cv']:.3f}"])
        print(f"| {spec} | " + " | ".join(cells) + " |", flush=True)
        label = args.label or Path(args.model).name
        key = f"{label} {spec}" + ("" if args.part == "both" else f" [{args.part} only]")
        stored.setdefault("runs", {})[key] = {**parts, "videos": videos}
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(stored, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
