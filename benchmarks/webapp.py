"""Web app benchmark: loopback WebRTC latency and sustained output fps for 1, 2 and 4 concurrent
clients with the tiny model, and the server's resident memory before and after 2000 frames.

    python3 benchmarks/webapp.py            # full: 10 s per level, 2000 frames for memory
    python3 benchmarks/webapp.py --quick    # 4 s per level, 300 frames (said so in the output)

The server runs in its own process (`streamstudio serve --model tiny --latency-probe`), the
clients (aiortc) in this one. Latency is end to end: each client draws a frame counter into
its input; the server copies the counter of the input an output came from onto that output
(after the Stream Batch delay of N - 1 calls); the latency is the time from a frame leaving
the client to the first received frame that carries its counter (encode, network, waiting for
the shared model, inference, Stream Batch delay, decode). Inputs whose output was never made
(dropped because a newer frame arrived first) have no latency sample. Output fps: processed
frames per second (server count) and frames received per second (client).
Writes benchmarks/results/webapp.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import RESULTS, ROOT, write_json  # puts the package on sys.path

from streamstudio.streaming.probe import PROBE_BITS, draw_probe, read_probe

sys.path.insert(0, str(ROOT / "tests"))  # the test client lives with the tests
from studio_client import StudioClient  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, size: int, max_streams: int, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "streamstudio", "serve", "--model", "tiny", "--width", str(size),
           "--height", str(size), "--port", str(port), "--max-streams", str(max_streams), "--latency-probe",
           # every client connects at once from 127.0.0.1: the limits on streams not yet streaming
           # (2 a server and 2 an address by default) would refuse the third
           "--max-pending", str(max_streams), "--max-pending-per-source", str(max_streams)]
    with open(log_path, "wb") as log:  # a file, not a pipe nobody reads (a full pipe would stall the server)
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url + "/studio/status", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not start in time")


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


class ProbeClient:
    """A client that draws a frame counter into each input (the server runs --latency-probe and
    copies the counter of the input each output came from onto that output)."""

    def __init__(self, url: str, fps: float, width: int, height: int, seed: int):
        rng = np.random.default_rng(seed)
        self.base = rng.integers(40, 200, (height, width, 3)).astype(np.uint8)
        self.sent: dict[int, float] = {}  # counter -> send time
        self.seen: set[int] = set()
        self.latencies: list[float] = []
        self.client = StudioClient(url, self.make_frame, self.on_frame, fps=fps)

    def make_frame(self, i: int) -> np.ndarray:
        value = i % 2**PROBE_BITS
        self.sent[value] = time.perf_counter()
        self.seen.discard(value)
        return draw_probe(self.base.copy(), value)

    def on_frame(self, frame: np.ndarray, t: float) -> None:
        value = read_probe(frame)
        if value is None or value in self.seen or value not in self.sent:
            return
        self.seen.add(value)  # the first arrival of this input's output
        self.latencies.append(t - self.sent[value])


async def run_level(url: str, clients: int, seconds: float, args) -> dict:
    scs = [ProbeClient(url, args.fps, args.frame_width, args.frame_height, i) for i in range(clients)]
    await asyncio.gather(*(s.client.connect(settings={"prompt": f"scene {i}"}) for i, s in enumerate(scs)))
    await asyncio.sleep(args.warmup)
    for s in scs:
        s.latencies.clear()
    before = await asyncio.gather(*(s.client.stats() for s in scs))
    received0 = [s.client.received for s in scs]
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - t0
    after = await asyncio.gather(*(s.client.stats() for s in scs))
    received = [s.client.received - r for s, r in zip(scs, received0)]
    await asyncio.gather(*(s.client.close() for s in scs))
    processed = [(a["processed"] - b["processed"]) / elapsed for a, b in zip(after, before)]
    lat = sorted(x for s in scs for x in s.latencies)
    return {
        "clients": clients, "seconds": round(elapsed, 2),
        "latency_ms_median": round(1000 * statistics.median(lat), 1) if lat else None,
        "latency_ms_p90": round(1000 * lat[int(0.9 * (len(lat) - 1))], 1) if lat else None,
        "latency_samples": len(lat),
        "server_latency_ms": round(statistics.mean(a["latency_ms"] for a in after if a["latency_ms"]), 1),
        "processed_fps_per_client": round(statistics.mean(processed), 2),
        "processed_fps_total": round(sum(processed), 2),
        "received_fps_per_client": round(statistics.mean(r / elapsed for r in received), 2),
        "dropped_input_share": round(sum(a["dropped"] for a in after) / max(1, sum(a["frames_in"] for a in after)), 3),
    }


async def memory_run(url: str, pid: int, frames: int, args) -> dict:
    """RSS before and after `frames` processed frames, streams opening and closing in rounds."""
    rss_before = rss_mb(pid)
    done, rounds = 0, 0
    while done < frames:
        scs = [ProbeClient(url, args.fps, args.frame_width, args.frame_height, 10 + i) for i in range(2)]
        await asyncio.gather(*(s.client.connect(settings={"prompt": f"round {rounds}"}) for s in scs))
        await asyncio.sleep(min(6.0, max(2.0, (frames - done) / 20)))
        stats = await asyncio.gather(*(s.client.stats() for s in scs))
        await asyncio.gather(*(s.client.close() for s in scs))
        done += sum(st["processed"] for st in stats if st)
        rounds += 1
    await asyncio.sleep(3.0)  # let the server free the closed streams
    rss_after = rss_mb(pid)
    return {"frames": done, "rounds": rounds, "rss_before_mb": round(rss_before, 1),
            "rss_after_mb": round(rss_after, 1), "growth_mb": round(rss_after - rss_before, 1)}


def machine() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"device": "cuda" if gpu else "cpu", "gpu": gpu, "cpus": os.cpu_count(),
            "python": platform.python_version()}


def table(result: dict) -> str:
    lines = ["clients | latency median / p90 (ms) | server latency (ms) | processed fps / client | "
             "processed fps total | received fps / client",
             "---|---|---|---|---|---"]
    for r in result["levels"]:
        lines.append(f"{r['clients']} | {r['latency_ms_median']} / {r['latency_ms_p90']} | {r['server_latency_ms']} | "
                     f"{r['processed_fps_per_client']} | {r['processed_fps_total']} | {r['received_fps_per_client']}")
    m = result["memory"]
    lines.append(f"\nRSS of the server: {m['rss_before_mb']} MB before, {m['rss_after_mb']} MB after "
                 f"{m['frames']} frames ({m['rounds']} rounds of 2 streams opened and closed): "
                 f"{m['growth_mb']:+} MB" + (" [--quick: fewer frames than 2000]" if result["quick"] else ""))
    return "\n".join(lines)


async def main_async(args, url: str, pid: int) -> dict:
    levels = []
    for n in args.clients:
        levels.append(await run_level(url, n, args.seconds, args))
        print(f"  {n} client(s): {levels[-1]}", flush=True)
    memory = await memory_run(url, pid, args.frames, args)
    base = levels[0]["processed_fps_total"] or 1.0
    return {
        "benchmark": "webapp", "quick": args.quick, "model": "tiny", "size": args.size,
        "input": f"{args.frame_width}x{args.frame_height} at {args.fps} fps per client",
        "machine": machine(),
        "note": "On CPU (a shared machine) compare the ratios within this run; absolute figures only mean "
                "something from a GPU run.",
        "levels": levels,
        "ratios": {f"total_fps_{lv['clients']}_vs_1": round(lv["processed_fps_total"] / base, 2) for lv in levels},
        "memory": memory,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 s per level and 300 frames for memory")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--size", type=int, default=64, help="model output size (default 64)")
    p.add_argument("--fps", type=float, default=20.0, help="input fps per client (default 20)")
    p.add_argument("--frame-width", type=int, default=160)
    p.add_argument("--frame-height", type=int, default=120)
    p.add_argument("--output", default=str(RESULTS / "webapp.json"))
    args = p.parse_args(argv)
    args.seconds, args.frames, args.warmup = (4.0, 300, 2.0) if args.quick else (10.0, 2000, 3.0)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.gettempdir()) / f"streamstudio-webapp-bench-{port}.log"
    proc = start_server(port, args.size, max(args.clients), log_path)
    try:
        wait_ready(url, proc, log_path)
        print(f"server up on {url} (log: {log_path}); levels {args.clients}" + (" (--quick)" if args.quick else ""),
              flush=True)
        result = asyncio.run(main_async(args, url, proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    write_json(args.output, result)
    print(table(result))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
