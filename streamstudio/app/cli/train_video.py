"""`streamstudio train-video`: train the StreamDiT video model (flow matching or distillation),
or with `--causal` the causal (KV-cached, chunk by chunk) video model with teacher forcing.

Runs on CPU as is and on several GPUs through `accelerate launch -m streamstudio train-video ...`
(the StreamDiT model; the causal one trains on one device).
"""

from __future__ import annotations

import argparse

from streamstudio.app.cli.train_args import add_run_arguments
from streamstudio.app.settings import number
from streamstudio.errors import StreamStudioError
from streamstudio.app.training.config import CausalTrainConfig, VideoTrainConfig

DEFAULTS = VideoTrainConfig()
CAUSAL = CausalTrainConfig()


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train-video", description=__doc__.splitlines()[0])
    p.add_argument("--output", default=DEFAULTS.output, help="checkpoint folder (model.safetensors + config.json)")
    p.add_argument("--model", default=DEFAULTS.model, help="named model config: tiny, small, base, 4b")
    p.add_argument("--data", default=DEFAULTS.data, help="'synthetic' (moving coloured shapes) or a folder of videos")
    p.add_argument("--mode", choices=("flow", "distill"), default=DEFAULTS.mode,
                   help="buffered flow matching, or multistep distillation of --teacher to one step per chunk")
    p.add_argument("--teacher", default=None, help="teacher checkpoint folder (distill mode)")
    p.add_argument("--teacher-steps", type=number(int, 1, 64), default=DEFAULTS.teacher_steps,
                   help="teacher micro-steps per chunk")
    p.add_argument("--init", default=None,
                   help="start from the weights of this checkpoint folder (its architecture; new optimizer)")
    p.add_argument("--init-keep-shift", dest="init_shift_mask", action="store_false",
                   help="with --init: keep the checkpoint's window shift (default: turn the masked shift on)")
    p.add_argument("--cond-drop", type=number(float, 0, 1), default=DEFAULTS.cond_drop,
                   help="flow mode: share of captions replaced by the empty prompt, so the model learns the "
                        "unconditional velocity classifier-free guidance needs (e.g. 0.1)")
    p.add_argument("--context-fade", type=number(float, 0, 1), default=DEFAULTS.context_fade,
                   help="flow mode: share of buffers whose oldest chunks are shown faded toward their median "
                        "colour and left out of the loss, so newer frames learn to redraw what the older "
                        "ones lost (e.g. 0.3)")
    p.add_argument("--teacher-guidance", type=number(float, 0, 30), default=DEFAULTS.teacher_guidance,
                   help="distill mode: the teacher's classifier-free guidance scale, distilled into the student")
    p.add_argument("--distill-startup-share", type=number(float, 0, 1), default=DEFAULTS.distill_startup_share,
                   help="distill mode: share of buffers from the sampler's start-up (uniform generation)")
    p.add_argument("--steps", type=number(int, 1, 10**8), default=DEFAULTS.steps)
    p.add_argument("--batch-size", type=number(int, 1, 4096), default=DEFAULTS.batch_size)
    p.add_argument("--buffer-frames", type=number(int, 1, 1024), default=DEFAULTS.buffer_frames,
                   help="B = N*c frames (power of 2)")
    p.add_argument("--ref-frames", type=number(int, 0, 64), default=DEFAULTS.ref_frames,
                   help="K clean reference frames")
    p.add_argument("--size", type=number(int, 8, 4096), default=DEFAULTS.size, help="frame side in pixels")
    p.add_argument("--lr", type=number(float, 0, 1, low_open=True), default=DEFAULTS.lr)
    p.add_argument("--warmup", type=number(int, 0, 10**8), default=DEFAULTS.warmup)
    add_run_arguments(p, DEFAULTS.seed, DEFAULTS.save_every)
    p.add_argument("--workers", type=number(int, 0, 256), default=DEFAULTS.workers,
                   help="flow mode: processes that draw the batches ahead of the training loop (on a GPU the "
                        "synthetic clips and noise, drawn on one CPU core, are what it waits for; 0: none)")
    p.add_argument("--num-chunks", type=number(int, 1, 64), default=4,
                   help="sampling default stored with the checkpoint: N")
    p.add_argument("--micro-steps", type=number(int, 1, 64), default=None,
                   help="sampling default stored with the checkpoint: s (default 2, 1 in distill mode)")
    add_causal_arguments(p)
    return p


def add_causal_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("causal model (--causal; --output, --data, --steps, --batch-size, --size, --lr, "
                             "--warmup, --seed, --save-every, --resume, --init, --cond-drop, --cpu, --max-minutes, "
                             "--threads and --no-progress apply too)")
    g.add_argument("--causal", action="store_true",
                   help="train the causal video model (block-causal Wan, flow matching with teacher forcing)")
    g.add_argument("--dim", type=number(int, 12, 8192), default=CAUSAL.dim, help="hidden size")
    g.add_argument("--layers", type=number(int, 1, 128), default=CAUSAL.layers, help="transformer blocks")
    g.add_argument("--heads", type=number(int, 1, 128), default=CAUSAL.heads, help="attention heads")
    g.add_argument("--patch", type=number(int, 1, 64), default=CAUSAL.patch, help="pixels a token's side")
    g.add_argument("--clip-frames", type=number(int, 1, 1024), default=CAUSAL.frames,
                   help="frames of a training clip (whole chunks)")
    g.add_argument("--chunk-frames", type=number(int, 1, 64), default=CAUSAL.chunk_frames,
                   help="frames a chunk (made together, one noise level in training)")
    g.add_argument("--window", type=number(int, 0, 4096), default=CAUSAL.window,
                   help="frames the attention (and the sampler's KV cache) holds, the chunk included (0: the clip)")
    g.add_argument("--sink", type=number(int, 0, 4096), default=CAUSAL.sink, help="first frames never dropped")
    g.add_argument("--context-noise", type=number(float, 0, 1), default=CAUSAL.context_noise,
                   help="the clean frames the chunks read carry noise up to this sigma (still labelled clean), so "
                        "the model keeps to frames that are its own, not the data's (e.g. 0.1)")
    g.add_argument("--first-chunks", type=number(int, 0, 4096), default=CAUSAL.first_chunks,
                   help="more clips a step trained as a stream's first chunk alone: the chunk made from the "
                        "prompt with no past to read, where the object and its direction are settled (e.g. 12)")
    g.add_argument("--first-chunk-frames", type=number(int, 0, 1024), default=CAUSAL.first_chunk_frames,
                   help="frames of those first chunks, stored as the sampler's first chunk (0: --chunk-frames; "
                        "a longer first chunk shows the motion the prompt asks for over more frames)")
    g.add_argument("--self-context", type=number(float, 0, 1), default=CAUSAL.self_context,
                   help="share of the clips whose past frames are the model's own: its prediction of each clean "
                        "chunk from the sampler's last step's noise level, as a stream reads the chunks it made "
                        "(no gradient through it; e.g. 0.5)")
    g.add_argument("--self-rollout", action="store_true",
                   help="with --self-context: make those chunks one after another, each reading the model's own "
                        "chunks before it (its errors carried on, as in a stream) instead of the data's")
    g.add_argument("--sample-steps", default=",".join(f"{s:g}" for s in CAUSAL.sampling["steps"]),
                   help="sampling default stored with the checkpoint: the timesteps of a chunk, noise first "
                        "(Wan's units, 1000 = noise), comma-separated")
    g.add_argument("--sample-shift", type=number(float, 0, 100, low_open=True), default=CAUSAL.sampling["shift"],
                   help="sampling default stored with the checkpoint: the flow shift of the timestep table")


def check(args) -> None:
    """The causal run's shape (the StreamDiT run checks its own when it starts)."""
    if not args.causal:
        return
    if args.clip_frames % args.chunk_frames:
        raise StreamStudioError(f"--clip-frames {args.clip_frames} must be whole chunks of --chunk-frames "
                                f"{args.chunk_frames}")
    if args.window and args.window < args.sink + args.chunk_frames:
        raise StreamStudioError(f"--window {args.window} must hold --sink {args.sink} and a chunk "
                                f"({args.chunk_frames})")
    try:
        steps = [float(s) for s in args.sample_steps.split(",")]
    except ValueError:
        raise StreamStudioError(f"--sample-steps takes comma-separated timesteps, got {args.sample_steps!r}") from None
    if not steps or any(not 0 < s <= 1000 for s in steps) or steps != sorted(steps, reverse=True):
        raise StreamStudioError(f"--sample-steps must go down from noise within (0, 1000], got {args.sample_steps}")


