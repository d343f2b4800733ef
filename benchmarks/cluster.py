"""Batch rendering on Ray (app/batch/cluster.py): 1 against 2 workers here, and a paper model of N GPUs.

    python benchmarks/cluster.py            # full
    python benchmarks/cluster.py --quick    # fewer, shorter clips

1. Measured here: the same clips (tiny model, CPU, one thread per worker) rendered by a local
   Ray with one worker, then with two. Wall time includes starting the workers and loading the
   model; the steady rate is the workers' frames over their busy seconds, summed. On a machine
   with 2 cores shared with other work the ratio is at most 2x.
2. Measured here, per 512x512 frame: what a segment's part costs (raw-frame write on the worker,
   read and H.264 encode at the stitch), its bytes on shared storage, and the H.264 decode time
   a segment spends on the frames before its warm-up (workers decode from the file's start).
3. A paper model of N GPUs rendering a two-hour film in --segment-frames segments: per-GPU fps
   from the GPU benchmark results (benchmarks/results/kernels.json, `img2img` fps) when a GPU
   session has written them, else the StreamDiffusion paper's 91 fps (sd-turbo img2img, one RTX
   4090); overlap frames per segment (warm-up N + tail N - 1, N denoising steps); decode of the
   skipped frames (today) or none (with a seek); the stitch, which follows the segments, at the
   per-frame costs measured here (they scale with the CPU: this machine's 2 shared cores are slow).

Results go to benchmarks/results/cluster.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamstudio.app import cli  # noqa: E402
from streamstudio.app.batch import cluster
from streamstudio.app.cli.requests import batch_request  # noqa: E402
from streamstudio.streaming.sinks import open_sink  # noqa: E402
from streamstudio.streaming.sources import open_source  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "cluster.json"
PAPER_FPS = 91.0  # StreamDiffusion (arXiv 2312.12491): img2img, sd-turbo, 1 step, TensorRT, TAESD, 512x512, RTX 4090
TINY = ["--model", "tiny", "--device", "cpu", "--threads", "1", "--steps", "4", "--prompt", "a cat", "--width", "128",
        "--height", "96"]


def make_clips(folder: Path, count: int, frames: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with open_sink(str(folder / f"clip{i}.mp4"), 128, 96, 24) as sink:
            for k in range(frames):
                sink.write(textured(96, 128, seed=i * 1000 + k), k / 24)


def textured(h: int, w: int, seed: int) -> np.ndarray:
    """A frame with smooth shapes and fine grain (compresses like a rendered picture, not a flat pattern)."""
    rng = np.random.default_rng(seed)
    coarse = rng.random((h // 16 + 1, w // 16 + 1, 3))
    smooth = np.kron(coarse, np.ones((16, 16, 1)))[:h, :w]
    return np.clip(smooth * 200 + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def workers_throughput(folder: Path, out: Path, workers: int) -> dict:
    board = {}
    argv = ["render", "--input", str(folder), "--output", str(out), "--workers", str(workers), *TINY]
    args = cli.build_parser(argv).parse_args(argv)
    t0 = time.perf_counter()
    rc = cluster.run_batch(batch_request(args), on_progress=lambda snap: board.update(snap))
    wall = time.perf_counter() - t0
    assert rc == 0
    frames = sum(w["frames"] for w in board.values())
    steady = sum(w["frames"] / w["busy"] for w in board.values() if w["busy"] > 0)
    return {"workers": workers, "frames": frames, "wall_s": wall, "wall_fps": frames / wall, "steady_fps": steady}


def part_costs(frames: int) -> dict:
    """Per 512x512 frame: a part's write and read (segments.PartSink / read_part), H.264 encode
    (the stitch's sink) and decode (the frames a segment skips), and the bytes of each."""
    from streamstudio.app.batch.segments import PartSink, read_part

    images = [textured(512, 512, seed=k) for k in range(frames)]
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp, "part")
        t0 = time.perf_counter()
        sink = PartSink(part, 512, 512, 24)
        for k, image in enumerate(images):
            sink.write(image, k / 24)
        sink.finish()
        write = (time.perf_counter() - t0) / frames
        part_bytes = sum(p.stat().st_size for p in part.glob("*.npy")) / frames
        t0 = time.perf_counter()
        read = [frame for frame, _ in read_part(part)]
        read_s = (time.perf_counter() - t0) / frames
        t0 = time.perf_counter()
        with open_sink(f"{tmp}/out.mp4", 512, 512, 24) as out:
            for k, image in enumerate(read):
                out.write(image, k / 24)
        encode = (time.perf_counter() - t0) / frames
        video_bytes = Path(tmp, "out.mp4").stat().st_size / frames
        t0 = time.perf_counter()
        with open_source(f"{tmp}/out.mp4", realtime=False) as source:
            decoded = sum(1 for _ in source.frames())
        decode = (time.perf_counter() - t0) / decoded
    return {"size": "512x512", "frames": frames, "part_write_ms": write * 1e3, "part_read_ms": read_s * 1e3,
            "h264_encode_ms": encode * 1e3, "h264_decode_ms": decode * 1e3, "part_bytes_per_frame": part_bytes,
            "h264_bytes_per_frame": video_bytes}


def gpu_fps() -> tuple[float, str]:
    path = RESULTS.parent / "kernels.json"
    if path.is_file():
        data = json.loads(path.read_text())
        fps = data.get("img2img", {}).get("fps") if isinstance(data.get("img2img"), dict) else None
        if data.get("device", "cpu") != "cpu" and fps:
            return float(fps), f"benchmarks/results/kernels.json img2img ({data.get('device')})"
    return PAPER_FPS, "StreamDiffusion paper: 91 fps img2img, sd-turbo 1 step, TensorRT, RTX 4090 (no GPU result here)"


def schedule(n: int, film: int, segment: int, fps: float, overlap: int, decode_s: float, stitch_s: float,
             seek: bool) -> float:
    """Seconds until a film of `film` frames, cut into `segment`-frame segments, is rendered by `n`
    GPUs (each takes the next segment in order) and stitched (one process, in order, following
    the segments). A segment first decodes the frames before it (`decode_s` each) unless `seek`."""
    starts = list(range(0, film, segment))
    free = [0.0] * n  # when each GPU is next free
    done = []
    for start in starts:
        frames = min(segment, film - start)
        gpu = min(range(n), key=free.__getitem__)
        work = (0.0 if seek else start * decode_s) + (frames + (overlap if len(starts) > 1 else 0)) / fps
        free[gpu] += work
        done.append((free[gpu], frames))
    t = 0.0
    for finished, frames in done:  # the stitch takes each part once it is done and the one before is stitched
        t = max(t, finished) + frames * stitch_s
    return t


def paper_model(costs: dict, fps: float, film: int, steps: int, segment: int,
                gpus=(1, 2, 4, 8, 16, 32)) -> list[dict]:
    """Seconds for N GPUs to render one film at `fps` per GPU, against one GPU rendering it
    locally (encoding as it goes: the slower of the two). Overlap per segment: warm-up N + tail
    N - 1 frames (N denoising steps, no similarity filter). Two ways to cut it:

    - today: one segment per GPU (the default, `--segment-frames` unset), each decoding the
      frames before it (workers decode from the file's start);
    - with a seek (not in VideoFileSource yet): `segment`-frame segments in order, no skipped
      decode, the stitch following the rendering."""
    decode = costs["h264_decode_ms"] / 1e3
    stitch = (costs["part_read_ms"] + costs["h264_encode_ms"]) / 1e3
    overlap = steps + (steps - 1)
    local = max(film / fps, film * costs["h264_encode_ms"] / 1e3)
    rows = []
    for n in gpus:
        today = local if n == 1 else schedule(n, film, math.ceil(film / n), fps, overlap, decode, stitch, seek=False)
        seek = local if n == 1 else schedule(n, film, segment, fps, overlap, decode, stitch, seek=True)
        rows.append({"gpus": n, "render_only_s": film / (n * fps), "today_s": today, "with_seek_s": seek,
                     "speedup_today": local / today, "speedup_with_seek": local / seek,
                     "overlap_cost": n * overlap / film if n > 1 else 0.0})
    return rows


FILM = 2 * 3600 * 24  # a two-hour film at 24 fps
SEEK_SEGMENT = 3000  # segment frames in the model with a seek (100 s at 30 fps)


CPU_SCALES = (1, 10)  # the CPU costs as measured here, and a tenth of them (a GPU server's free cores)


def model_of(costs: dict) -> dict:
    """The paper model at this machine's CPU costs and, as a sensitivity, at a tenth of them."""
    fps, source = gpu_fps()
    models = {}
    for scale in CPU_SCALES:
        scaled = {k: (v / scale if k.endswith("_ms") else v) for k, v in costs.items()}
        models[f"cpu_costs_over_{scale}"] = {
            "stitch_ceiling_fps": 1e3 / (scaled["part_read_ms"] + scaled["h264_encode_ms"]),
            "rows": paper_model(scaled, fps, FILM, steps=1, segment=SEEK_SEGMENT)}
    return {"per_gpu_fps": fps, "per_gpu_fps_from": source, "film_frames": FILM, "steps": 1,
            "segment_frames_with_seek": SEEK_SEGMENT,
            "many_files": "N times one GPU: each worker encodes its own outputs, nothing is stitched", **models}


def print_model(costs: dict, model: dict) -> None:
    print(f"per 512x512 frame: part write {costs['part_write_ms']:.2f} ms, read {costs['part_read_ms']:.2f} ms, "
          f"H.264 encode {costs['h264_encode_ms']:.1f} ms, decode {costs['h264_decode_ms']:.2f} ms; part "
          f"{costs['part_bytes_per_frame'] / 1e3:.0f} kB, H.264 {costs['h264_bytes_per_frame'] / 1e3:.1f} kB")
    print(f"paper model: a {model['film_frames']}-frame film, {model['per_gpu_fps']:g} fps per GPU "
          f"({model['per_gpu_fps_from']})")
    for scale in CPU_SCALES:
        m = model[f"cpu_costs_over_{scale}"]
        print(f"CPU costs {'as here' if scale == 1 else f'/ {scale}'}: the stitch caps a film at "
              f"{m['stitch_ceiling_fps']:.0f} fps")
        print(f"{'GPUs':>5} {'render only s':>14} {'today s':>9} {'speedup':>8} {'with seek s':>12} {'speedup':>8}")
        for r in m["rows"]:
            print(f"{r['gpus']:>5} {r['render_only_s']:>14.0f} {r['today_s']:>9.0f} {r['speedup_today']:>8.2f} "
                  f"{r['with_seek_s']:>12.0f} {r['speedup_with_seek']:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model-only", action="store_true",
                        help="only the paper model, again, from the per-frame costs in benchmarks/results/cluster.json")
    opts = parser.parse_args()
    if opts.model_only:
        result = json.loads(RESULTS.read_text())
        result["paper_model"] = model_of(result["per_frame"])
    else:
        import ray

        from streamstudio.app.ray_connect import connect_ray

        clips, frames = (4, 24) if opts.quick else (6, 48)
        t0 = time.perf_counter()
        connect_ray(None, num_cpus=2)  # a local Ray on 127.0.0.1 only
        ray_start = time.perf_counter() - t0
        try:
            with tempfile.TemporaryDirectory() as tmp:
                make_clips(Path(tmp, "in"), clips, frames)
                runs = [workers_throughput(Path(tmp, "in"), Path(tmp, f"out{w}"), w) for w in (1, 2)]
        finally:
            ray.shutdown()
        costs = part_costs(24 if opts.quick else 96)
        result = {
            "date": dt.date.today().isoformat(), "machine": platform.node(), "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg()[0], "quick": opts.quick, "ray_start_s": ray_start,
            "here": {"clips": clips, "frames_per_clip": frames, "size": "128x96", "model": "tiny, 4 steps",
                     "runs": runs, "wall_ratio_2_over_1": runs[1]["wall_fps"] / runs[0]["wall_fps"],
                     "steady_ratio_2_over_1": runs[1]["steady_fps"] / runs[0]["steady_fps"]},
            "per_frame": costs, "paper_model": model_of(costs),
        }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    here = result["here"]
    print(f"Ray start {result['ray_start_s']:.1f} s; load average {result.get('load_average', 0):.1f} on "
          f"{result['cpu_count']} cores")
    print(f"{'workers':>8} {'frames':>7} {'wall s':>8} {'wall fps':>9} {'steady fps':>11}")
    for r in here["runs"]:
        print(f"{r['workers']:>8} {r['frames']:>7} {r['wall_s']:>8.1f} {r['wall_fps']:>9.2f} {r['steady_fps']:>11.2f}")
    print(f"2 workers / 1: wall {here['wall_ratio_2_over_1']:.2f}x, steady {here['steady_ratio_2_over_1']:.2f}x")
    print_model(result["per_frame"], result["paper_model"])
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
