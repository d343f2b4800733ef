"""Several live streams on one model: cross-stream batching against taking turns.

K web-app sessions (1, 2 and 4) each run a closed loop (a new frame as soon as the last one
came out) for a fixed time over one shared model, first taking turns under the model lock
(`serve --no-stream-batching`), then with their UNet and VAE calls batched by the executor
(the default). Reported: total frames per second over all streams, the ratio batched / turns
at each K, and how many streams' calls one network call served on average.

    python3 benchmarks/multistream.py            # CPU: tiny model, 64x64; GPU: sd-turbo arch, 512x512, fp16, TAESD
    python3 benchmarks/multistream.py --quick    # shorter windows

Writes benchmarks/results/multistream.json (device name and date inside).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import RESULTS, bench_device, utc_now, write_json  # puts the package on sys.path

from streamstudio.models.image.batching import BatchingConfig
from streamstudio.app.cli.bench_run import closed_loop, device_name
from streamstudio.app.web.sessions import ServerModel, SessionManager
from streamstudio.pipelines.image.stream_diffusion import StreamDiffusionConfig


def components(device: torch.device):
    if device.type == "cuda":
        from stream_diffusion import sd_turbo_architecture

        return sd_turbo_architecture(device, torch.float16), 512, "sd-turbo arch, TAESD, 512x512, 1 step, fp16"
    from streamstudio.models.image.loading import load_components

    comps = load_components("tiny", device=device, dtype=torch.float32, taesd=True)
    return comps, 64, "tiny model, TAESD, 64x64, 1 step, fp32 (CPU)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", default=str(RESULTS / "multistream.json"))
    args = parser.parse_args(argv)
    device = bench_device(args.device)
    warmup, window = (2.0, 4.0) if args.quick else (4.0, 10.0)
    comps, size, name = components(device)
    config = StreamDiffusionConfig(width=size, height=size, steps=1, strength=0.5, cfg_type="none",
                                   guidance_scale=1.0, step_type="turbo")
    managers = {mode: SessionManager(ServerModel(comps, config, prompt="a photo",
                                                 batching=BatchingConfig() if mode == "batched" else None),
                                     max_streams=max(args.streams), idle_timeout=600, owns_model=True)
                for mode in ("turns", "batched")}
    rows = []
    out = Path(args.out)

    def save() -> dict:  # after each row: a run killed at its time limit keeps what it measured
        ratios = {}
        for k in args.streams:
            turns = next((r for r in rows if r["mode"] == "turns" and r["streams"] == k), None)
            batched = next((r for r in rows if r["mode"] == "batched" and r["streams"] == k), None)
            if turns and batched:
                ratios[str(k)] = batched["total_fps"] / turns["total_fps"] if turns["total_fps"] else None
        result = {"benchmark": "multistream", "model": name, "device": device_name(device),
                  "date": utc_now(), "quick": args.quick,
                  "window_s": window, "rows": rows, "batched_over_turns": ratios}
        write_json(out, result, indent=1)
        return ratios

    try:
        for manager in managers.values():  # first frames are slow (allocator, kernels): not timed
            closed_loop(manager, 1, size, size, warmup, 1.0)
        for k in args.streams:  # both modes at each K, one after the other (the machine's load drifts)
            for mode, manager in managers.items():
                row = {"mode": mode, **closed_loop(manager, k, size, size, warmup, window)}
                rows.append(row)
                save()
                rpc = f"{row['requests_per_call']:.2f}" if row["requests_per_call"] else "-"
                print(f"{mode:8s} {k} stream(s): {row['total_fps']:8.2f} fps in all, "
                      f"{min(row['per_stream_fps']):7.2f} fps the slowest stream, {rpc} streams per network call")
    finally:
        for manager in managers.values():
            manager.shutdown()
    ratios = save()
    for k, ratio in ratios.items():
        print(f"{k} stream(s): batched / turns = {ratio:.2f}x total fps")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
