"""A long causal stream keeps its memory flat (issue 49): 10,000 frames of the built-in causal model.

The KV cache is allocated once for `window` frames (sink frames, then a rolling window) and the
RoPE positions are renumbered past the table's end (1024 frames; `KVCache.rebase`), so nothing a
stream holds grows with its length. This runs one text-to-video stream for `--frames` frames and
prints the process's resident memory (RSS) at the start and every `--every` frames, the cache's
bytes and RoPE position, and the share of frames that show their object (the synthetic
backgrounds are dark: at least 1% of the frame brighter than 100), then writes JSON.

    python3 benchmarks/causal_long_run.py [--frames 10000] [--model DIR] [--rope-positions 64]

`--rope-positions N` shortens the RoPE table to N frames so the rebase happens every few chunks
(the fast test does this over a few hundred frames). One thread, a few minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results" / "causal_long_run.json"
PROMPT = "a cyan circle moving right"


def rss_mb() -> float:
    """The process's resident memory now (MB): /proc's VmRSS, else the peak (getrusage)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def short_rope(model, positions: int | None):
    """The model's temporal RoPE table cut to `positions` frames for the block (None: as it is)."""
    saved = model.rope
    if positions:
        model.rope = (saved[0][:positions], saved[1], saved[2])
    try:
        yield
    finally:
        model.rope = saved


def object_shown(frame: np.ndarray) -> bool:
    return bool((frame.max(-1) > 100).sum() >= 0.01 * frame.shape[0] * frame.shape[1])


def long_run(causal, frames: int, prompt: str = PROMPT, seed: int = 0, rope_positions: int | None = None,
             every: int = 1000, keep_frames: int = 0, verbose: bool = False) -> dict:
    """One text-to-video stream of `frames` frames: memory, cache and object figures (and the first
    `keep_frames` frames under "frames")."""
    from streamstudio.models.video.causal_backbone import CausalWanBackbone
    from streamstudio.pipelines.video.causal_video import CausalConfig, CausalStreamConfig, CausalVideoStream

    smp = dict(causal.sampling)
    names = set(CausalConfig.__dataclass_fields__) - {"seed"}
    cfg = CausalConfig(**{k: (tuple(v) if k == "steps" else v) for k, v in smp.items() if k in names}, seed=seed)
    backbone = CausalWanBackbone(causal.model, causal.text_encoder)
    kept: list[np.ndarray] = []
    marks: list[dict] = []
    shown = 0
    with short_rope(causal.model, rope_positions), torch.inference_mode():
        stream = CausalVideoStream(backbone, CausalStreamConfig(cfg, int(smp["height"]), int(smp["width"])), prompt,
                                   codec=causal.codec)
        cache = stream.sampler.cache
        shapes = (tuple(cache.k.shape), tuple(cache.v.shape))
        start = time.perf_counter()
        highest = 0
        for i, frame in enumerate(stream.frames(frames)):
            if i % every == 0:
                marks.append({"frame": i, "rss_mb": round(rss_mb(), 1), "position": cache.position})
                if verbose:
                    print(f"frame {i:>6}: RSS {marks[-1]['rss_mb']:8.1f} MB, RoPE position {cache.position}",
                          flush=True)
            highest = max(highest, cache.position)
            shown += object_shown(frame)
            if i < keep_frames:
                kept.append(frame)
        marks.append({"frame": frames, "rss_mb": round(rss_mb(), 1), "position": cache.position})
        seconds = time.perf_counter() - start
        same_cache = shapes == (tuple(cache.k.shape), tuple(cache.v.shape))
    return {"frames": frames, "prompt": prompt, "seed": seed, "rope_positions": rope_positions or 1024,
            "seconds": round(seconds, 1), "marks": marks,
            "rss_growth_mb": round(marks[-1]["rss_mb"] - marks[0]["rss_mb"], 1),
            "cache_bytes": stream.sampler.cache_bytes, "cache_shape_unchanged": same_cache,
            "highest_position": highest, "kept_latents": len(stream.sampler.kept),
            "object_shown": shown / frames, "frames_kept": kept}


def main(argv=None) -> int:
    from streamstudio.models.video.causal_checkpoint import BUILTIN_CAUSAL, load_causal_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=10_000)
    parser.add_argument("--model", default=str(BUILTIN_CAUSAL))
    parser.add_argument("--rope-positions", type=int, default=None, help="cut the RoPE table (default: 1024)")
    parser.add_argument("--every", type=int, default=1000, help="frames between memory readings")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = long_run(load_causal_checkpoint(args.model), args.frames, rope_positions=args.rope_positions,
                      every=args.every, verbose=True)
    result.pop("frames_kept")
    print(f"{args.frames} frames in {result['seconds']:.0f} s: RSS {result['marks'][0]['rss_mb']:.1f} -> "
          f"{result['marks'][-1]['rss_mb']:.1f} MB ({result['rss_growth_mb']:+.1f}), cache {result['cache_bytes']} "
          f"bytes (shape unchanged: {result['cache_shape_unchanged']}), highest position "
          f"{result['highest_position']}, object shown in {100 * result['object_shown']:.1f}% of the frames")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
