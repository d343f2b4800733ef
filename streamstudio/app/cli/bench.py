"""`streamstudio bench`: how fast the image pipeline runs here, with these settings.

    streamstudio bench --model stabilityai/sd-turbo --taesd               # one stream, 512x512
    streamstudio bench --model stabilityai/sd-turbo --taesd --acceleration compile
    streamstudio bench --model tiny --streams 4                           # 4 live streams, one model
    streamstudio bench --model tiny --streams 4 --no-stream-batching      # ... taking turns

One stream: after --warmup frames, --frames calls of the pipeline (img2img on random frames,
or txt2img with --txt2img) are timed one by one, the GPU synchronized after each; it prints
frames per second and the median and 90th percentile time per frame. Several streams: K
web-app sessions over the one loaded model, each fed its next frame as soon as its last one
came out, for --seconds; it prints the total and the slowest stream's frames per second and
how many streams one network call served (cross-stream batching, as `serve` runs). --json
writes the figures with the device, model and settings. The repository's benchmarks/ folder
holds the benchmarks that compare paths against each other.
"""

from __future__ import annotations

import argparse

from streamstudio.app.settings import add_pipeline_arguments, number
from streamstudio.errors import StreamStudioError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("benchmark")
    g.add_argument("--frames", type=number(int, 1, 10**7), default=100, help="timed frames, one stream (default 100)")
    g.add_argument("--warmup", type=number(int, 0, 10**6), default=10,
                   help="untimed frames first (default 10; compile needs more)")
    g.add_argument("--txt2img", action="store_true", help="time txt2img instead of img2img")
    g.add_argument("--streams", type=number(int, 1, 1024), default=1, help="live streams over one model (default 1)")
    g.add_argument("--seconds", type=number(float, 0, 86400, low_open=True), default=10.0,
                   help="timed seconds with --streams > 1 (default 10)")
    g.add_argument("--no-stream-batching", action="store_true",
                   help="with --streams: take turns, as serve does with it")
    g.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    add_pipeline_arguments(p)
    return p


def check(args) -> None:
    if args.streams > 1 and args.txt2img:
        raise StreamStudioError("--streams runs img2img live streams (no --txt2img)")


