"""`streamstudio bench`'s runner: the image pipeline timed frame by frame (one stream), or K web-app
sessions over one model fed as fast as they answer (several streams); its parser and check are in
bench.py. benchmarks/ imports `device_name`, `time_one_stream` and `closed_loop` from here."""

from __future__ import annotations

import json
import platform
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from streamstudio.app import streams
from streamstudio.app.cli.requests import batching_config, image_request
from streamstudio.app.web.sessions import ServerModel, SessionManager
from streamstudio.errors import StreamStudioError


def random_frames(width: int, height: int, count: int = 4, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


def time_one_stream(pipe, frames: int, warmup: int, txt2img: bool, progress: bool = True) -> dict:
    """Seconds per pipeline call, the device synchronized after each call."""
    inputs = [None] if txt2img else random_frames(pipe.config.width, pipe.config.height)
    sync = torch.cuda.synchronize if pipe.device.type == "cuda" else (lambda: None)
    for i in range(warmup):
        pipe(inputs[i % len(inputs)])
    sync()
    times = []
    for i in tqdm(range(frames), desc="bench", unit="frame", disable=not progress):
        start = time.perf_counter()
        pipe(inputs[i % len(inputs)])
        sync()
        times.append(time.perf_counter() - start)
    times.sort()
    return {"frames": frames, "fps": frames / sum(times), "ms_median": 1e3 * statistics.median(times),
            "ms_p90": 1e3 * times[min(len(times) - 1, int(0.9 * len(times)))]}


def closed_loop(manager, streams: int, width: int, height: int, warmup_s: float, seconds: float) -> dict:
    """`streams` sessions of `manager`, each fed its next frame as soon as its last output came
    out; frames per second over `seconds` after `warmup_s`."""
    sessions = [manager.open(f"bench-{streams}-{i}-{time.monotonic_ns()}") for i in range(streams)]
    frames = random_frames(width, height)
    stop = threading.Event()
    failures: list[str] = []

    def feed(session):
        done = session.processed
        while not stop.is_set():
            session.submit(frames[done % len(frames)])
            while session.processed == done and not stop.is_set():
                if session.error:
                    failures.append(session.error)
                    return
                time.sleep(0.0005)
            done = session.processed

    threads = [threading.Thread(target=feed, args=(s,), daemon=True) for s in sessions]
    for t in threads:
        t.start()
    time.sleep(warmup_s)
    counts0, stats0 = [s.processed for s in sessions], dict(manager.model.batching_stats() or {})
    t0 = time.perf_counter()
    time.sleep(seconds)
    counts, elapsed = [s.processed for s in sessions], time.perf_counter() - t0
    stats = manager.model.batching_stats() or {}
    stop.set()
    for t in threads:
        t.join(30)
    for s in sessions:
        manager.close(s.sid)
    if failures:
        raise StreamStudioError(f"a stream failed during the benchmark: {failures[0]}")
    per_stream = [(c - c0) / elapsed for c, c0 in zip(counts, counts0)]
    calls = stats.get("calls", 0) - stats0.get("calls", 0)
    requests = stats.get("requests", 0) - stats0.get("requests", 0)
    return {"streams": streams, "total_fps": sum(per_stream), "per_stream_fps": per_stream,
            "requests_per_call": requests / calls if calls else None}


def device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def run(args) -> int:
    # several streams run as the web app runs them: behind the batching executor
    pipe = streams.build_pipeline(image_request(args), "txt2img" if args.txt2img else "img2img",
                                  serving=args.streams > 1)
    cfg = pipe.config
    setting = (f"{pipe.comps.name}, {cfg.width}x{cfg.height}, {pipe.n_steps} step(s), {cfg.cfg_type} CFG, "
               f"{str(pipe.dtype).replace('torch.', '')}, acceleration {args.acceleration}")
    print(f"bench: {setting} on {device_name(pipe.device)}")
    result = {"device": device_name(pipe.device), "setting": setting,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.streams == 1:
        r = time_one_stream(pipe, args.frames, args.warmup, args.txt2img)
        print(f"{'txt2img' if args.txt2img else 'img2img'}: {r['fps']:.2f} fps (frames / wall time), "
              f"median {r['ms_median']:.2f} ms per frame (p90 {r['ms_p90']:.2f} ms) over {r['frames']} frames")
    else:
        r = _bench_streams(args, pipe)
        rpc = f"{r['requests_per_call']:.2f}" if r["requests_per_call"] else "-"
        print(f"{r['streams']} streams ({r['mode']}): {r['total_fps']:.2f} fps in all, "
              f"{min(r['per_stream_fps']):.2f} fps the slowest stream, {rpc} streams per network call")
    result.update(r)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return 0


def _bench_streams(args, pipe) -> dict:
    model = ServerModel(pipe.comps, pipe.config, prompt=args.prompt, negative_prompt=args.negative_prompt,
                        batching=batching_config(args))
    manager = SessionManager(model, max_streams=args.streams, idle_timeout=max(60.0, 3 * args.seconds),
                             owns_model=True)
    try:
        warmup_s = max(1.0, min(10.0, args.seconds / 2))
        r = closed_loop(manager, args.streams, pipe.config.width, pipe.config.height, warmup_s, args.seconds)
    finally:
        manager.shutdown()
    return {**r, "mode": "taking turns" if model.executor is None else "batched"}

