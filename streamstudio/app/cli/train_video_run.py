"""`streamstudio train-video`'s runner: the StreamDiT video model trained (app/training/video.py),
or with --causal the causal one (app/training/causal.py). Its parser is train_video.py."""

from __future__ import annotations

import dataclasses

import torch

from streamstudio.app.cli.train_video import DEFAULTS
from streamstudio.app.training.causal import CausalTrainer
from streamstudio.app.training.config import CausalTrainConfig, VideoTrainConfig
from streamstudio.app.training.video import VideoTrainer
from streamstudio.errors import StreamStudioError
from streamstudio.streaming.sinks import make_output_folder


def config_from_args(args) -> VideoTrainConfig:
    if args.num_chunks < 1 or args.buffer_frames % args.num_chunks:
        raise StreamStudioError(f"--num-chunks {args.num_chunks} must divide --buffer-frames {args.buffer_frames}")
    names = {f.name for f in dataclasses.fields(VideoTrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values["progress"] = not args.no_progress
    micro = args.micro_steps or (1 if args.mode == "distill" else 2)
    values["sampling"] = {"num_chunks": args.num_chunks, "chunk_size": args.buffer_frames // args.num_chunks,
                          "micro_steps": micro}
    return VideoTrainConfig(**values)


def causal_config_from_args(args) -> CausalTrainConfig:
    """The causal run's config: its own flags, and the shared ones (--output's default is its own)."""
    default = CausalTrainConfig()
    return CausalTrainConfig(
        output=default.output if args.output == DEFAULTS.output else args.output, data=args.data, dim=args.dim,
        ffn_dim=4 * args.dim, layers=args.layers, heads=args.heads, patch=args.patch, steps=args.steps,
        batch_size=args.batch_size, frames=args.clip_frames, chunk_frames=args.chunk_frames, window=args.window,
        sink=args.sink, context_noise=args.context_noise, first_chunks=args.first_chunks,
        first_chunk_frames=args.first_chunk_frames, self_context=args.self_context,
        self_rollout=args.self_rollout,
        cond_drop=args.cond_drop, init=args.init or "", size=args.size, lr=args.lr, warmup=args.warmup,
        seed=args.seed, save_every=args.save_every,
        resume=args.resume, cpu=args.cpu, max_minutes=args.max_minutes, progress=not args.no_progress,
        sampling={**default.sampling, "steps": [float(s) for s in args.sample_steps.split(",")],
                  "shift": args.sample_shift})


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg: VideoTrainConfig | CausalTrainConfig = causal_config_from_args(args) if args.causal else config_from_args(args)
    make_output_folder(cfg.output, "checkpoint")  # a file there is said now, not after the first steps
    losses = CausalTrainer(cfg).train() if isinstance(cfg, CausalTrainConfig) else VideoTrainer(cfg).train()
    if losses:
        k = max(1, len(losses) // 10)
        print(f"trained {len(losses)} steps: loss {sum(losses[:k]) / k:.4f} -> {sum(losses[-k:]) / k:.4f}; "
              f"checkpoint in {cfg.output}")
    else:
        print(f"nothing to do: {cfg.output} is already at step {cfg.steps}")
    return 0

