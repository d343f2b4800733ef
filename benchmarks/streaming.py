"""Streaming: runner overhead, encode throughput per sink, live end-to-end latency.

    python benchmarks/streaming.py            # full
    python benchmarks/streaming.py --quick    # fewer frames (< 30 s on 2 CPU cores)

1. Runner overhead: 512x512 frames from memory through the three-thread runner with an
   identity processor into a null sink (offline mode, every frame), against the same work in
   one plain loop; overhead per frame = (runner - loop) / frames. Target: < 2 ms per frame.
2. Encode throughput: frames per second each sink takes at 512x512 (mp4/H.264, mkv, webm/VP9,
   HLS, PNG sequence).
3. Live latency: a 64x64 pattern paced at 20 fps through the tiny image model in live mode:
   capture-to-output latency percentiles, output fps, drops.

Results go to benchmarks/results/streaming.json with the machine and date. The absolute
figures are this machine's (CPU); the overhead is a difference measured in one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile

import numpy as np

from common import RESULTS, table, timed, utc_now, write_json  # puts the package on sys.path

from streamstudio.streaming.processor import IdentityProcessor
from streamstudio.streaming.runner import Runner, RunnerConfig
from streamstudio.streaming.sinks import NullSink, open_sink
from streamstudio.streaming.sources import ArraySource, PatternSource

OVERHEAD_TARGET_MS = 2.0


def frames_512(n: int) -> list[np.ndarray]:
    src = PatternSource(512, 512, fps=30, count=n, realtime=False)
    return [f.image for f in src.frames()]


def plain_loop(src, proc, sink) -> None:
    """What the runner does, as a bare loop: read, process, write."""
    for f in src.frames():
        for out in proc.push(f.image):
            sink.write(out, f.pts)


def runner_overhead(n: int, repeats: int) -> dict:
    frames = frames_512(n)
    proc = IdentityProcessor()
    loop_times, runner_times = [], []
    for _ in range(repeats):
        sink = NullSink("null", 512, 512, 30)
        src = ArraySource(frames, fps=30)
        loop_times.append(timed(lambda: plain_loop(src, proc, sink))[1])
        src, sink = ArraySource(frames, fps=30), NullSink("null", 512, 512, 30)
        metrics, seconds = timed(Runner(src, proc, sink, RunnerConfig(live=False)).run)
        runner_times.append(seconds)
        assert metrics.frames_out == n
    loop, runner = min(loop_times), min(runner_times)
    overhead = (runner - loop) / n * 1000
    return {"frames": n, "size": "512x512", "loop_ms_per_frame": loop / n * 1000,
            "runner_ms_per_frame": runner / n * 1000, "overhead_ms_per_frame": overhead,
            "target_ms": OVERHEAD_TARGET_MS, "meets_target": overhead < OVERHEAD_TARGET_MS}


def write_all(spec: str, frames: list[np.ndarray]) -> None:
    with open_sink(spec, 512, 512, 30) as sink:
        for i, frame in enumerate(frames):
            sink.write(frame, i / 30)


def encode_throughput(n: int) -> dict:
    frames = frames_512(n)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        specs = {"mp4 (H.264)": f"{tmp}/o.mp4", "mkv (H.264)": f"{tmp}/o.mkv", "webm (VP9)": f"{tmp}/o.webm",
                 "HLS (H.264)": f"hls:{tmp}/hls", "PNG sequence": f"{tmp}/png"}
        for name, spec in specs.items():
            _, elapsed = timed(lambda: write_all(spec, frames))
            results[name] = {"frames": n, "fps": n / elapsed, "ms_per_frame": elapsed / n * 1000}
    return results


def live_latency(n: int) -> dict:
    import torch

    from streamstudio.models.image.loading import load_components
    from streamstudio.pipelines.image.stream_diffusion import (
        StreamDiffusion,
        StreamDiffusionConfig,
    )

    comps = load_components("tiny", device="cpu", dtype=torch.float32)
    pipe = StreamDiffusion(comps, StreamDiffusionConfig(width=64, height=64, steps=2, guidance_scale=1.0),
                           prompt="a red circle")
    pipe(np.zeros((64, 64, 3), np.uint8))  # warm up
    src = PatternSource(64, 64, fps=20, count=n, realtime=True)
    metrics = Runner(src, pipe, NullSink("null", 64, 64, 20), RunnerConfig(live=True)).run()
    return {"frames_in": metrics.frames_in, "frames_out": metrics.frames_out, "dropped": metrics.dropped,
            "input_fps": metrics.input_fps, "output_fps": metrics.output_fps,
            "process_ms": metrics.latency_ms["process"], "end_to_end_ms": metrics.latency_ms["end_to_end"],
            "model": "tiny", "size": "64x64", "steps": 2, "source_fps": 20}


def print_table(result: dict) -> None:
    o = result["runner_overhead"]
    print(f"\nrunner overhead, identity, {o['size']}, {o['frames']} frames")
    print(f"  plain loop     {o['loop_ms_per_frame']:8.3f} ms/frame")
    print(f"  runner         {o['runner_ms_per_frame']:8.3f} ms/frame")
    print(f"  overhead       {o['overhead_ms_per_frame']:8.3f} ms/frame   (target < {o['target_ms']} ms: "
          f"{'met' if o['meets_target'] else 'NOT met'})")
    print("\nencode throughput at 512x512")
    rows = [{"sink": name, **r} for name, r in result["encode"].items()]
    print(table([("sink", "sink", "<16"), ("fps", "fps", ">9.1f"), ("ms/frame", "ms_per_frame", ">11.2f")], rows))
    lat = result["live_latency"]
    e2e, proc = lat["end_to_end_ms"], lat["process_ms"]
    print(f"\nlive, tiny model {lat['size']}, {lat['steps']} steps, pattern at {lat['source_fps']} fps")
    print(f"  in {lat['input_fps']:.1f} fps, out {lat['output_fps']:.1f} fps, dropped {lat['dropped']}")
    print(f"  processing  p50 {proc['p50']:7.1f} ms  p90 {proc['p90']:7.1f} ms")
    print(f"  end to end  p50 {e2e['p50']:7.1f} ms  p90 {e2e['p90']:7.1f} ms  p99 {e2e['p99']:7.1f} ms")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames")
    default = RESULTS / "streaming.json"
    parser.add_argument("--output", default=str(default), help=f"JSON path (default {default})")
    args = parser.parse_args(argv)
    n_over, reps, n_enc, n_live = (150, 2, 30, 40) if args.quick else (500, 3, 120, 120)
    result = {
        "date": utc_now(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "quick": args.quick,
        "runner_overhead": runner_overhead(n_over, reps),
        "encode": encode_throughput(n_enc),
        "live_latency": live_latency(n_live),
    }
    print_table(result)
    print(f"\nwrote {write_json(args.output, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
