"""Decode time of TAEHV against the Wan 2.1 VAE, chunk after chunk as a causal stream decodes (issue 49).

Both codecs with random weights in their real layouts (diffusers' `AutoencoderKLWan()` defaults:
Wan 2.1's VAE; TAEHV's taew2_1 layout), their stream forms (`codec.stream()`), the first chunk
decoded as warm-up and the fastest of the next `--reps` chunks timed (a chunk of c latent frames:
4c frames). Prints one line a codec: seconds a chunk and milliseconds a frame.

    python benchmarks/taehv_speed.py --height 16 --width 26 --chunk 1 --threads 2   # CPU, 128x208
    python benchmarks/taehv_speed.py --height 60 --width 104 --chunk 3 --device cuda  # 480x832
"""

from __future__ import annotations

import argparse
import time

import torch
from diffusers import AutoencoderKLWan

from streamstudio.models.video.taehv import TAEHV, TAEHVCodec, model_for, random_state
from streamstudio.models.video.wan import WanCodec


def time_codec(codec, latents: torch.Tensor, chunk: int, reps: int) -> tuple[float, int]:
    """(fastest seconds of a later chunk, its frames)."""
    stream = codec.stream()
    times, frames = [], 0
    with torch.inference_mode():
        stream.decode(latents[:chunk])  # the first chunk: warm-up
        for i in range(1, reps + 1):
            if latents.is_cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            frames = stream.decode(latents[i * chunk:(i + 1) * chunk]).shape[0]
            if latents.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return min(times), frames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--height", type=int, default=16, help="latent height (pixels / 8)")
    ap.add_argument("--width", type=int, default=26, help="latent width (pixels / 8)")
    ap.add_argument("--chunk", type=int, default=1, help="latent frames a chunk")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--skip-wan", action="store_true", help="time TAEHV only")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    latents = torch.randn((args.reps + 1) * args.chunk, 16, args.height, args.width, device=device)
    torch.manual_seed(0)
    keys = {k: tuple(v.shape) for k, v in TAEHV().state_dict().items()}
    codecs = {"taehv": TAEHVCodec(model_for(random_state(keys)), device)}
    if not args.skip_wan:
        codecs["wan"] = WanCodec(AutoencoderKLWan().to(device))
    size = f"{args.height * 8}x{args.width * 8}"
    for name, codec in codecs.items():
        seconds, frames = time_codec(codec, latents, args.chunk, args.reps)
        print(f"{name}: a chunk of {args.chunk} latent frame(s) -> {frames} frames of {size} on {device} in "
              f"{seconds:.3f} s ({seconds / frames * 1e3:.1f} ms a frame)", flush=True)


if __name__ == "__main__":
    main()
