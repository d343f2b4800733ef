"""`streamstudio train-image`'s runner: the photographs fetched, or the built-in image model
trained (app/training/image.py) and optionally exported. Its parser is train_image.py."""

from __future__ import annotations

import dataclasses

import torch

from streamstudio.app.training.config import ImageTrainConfig
from streamstudio.app.training.image import ImageTrainer, export_checkpoint
from streamstudio.models.image.photo_data import fetch
from streamstudio.streaming.sinks import make_output_folder


def config_from_args(args) -> ImageTrainConfig:
    names = {f.name for f in dataclasses.fields(ImageTrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values["progress"] = not args.no_progress
    return ImageTrainConfig(**values)


def _summary(name: str, losses: list[float]) -> str:
    k = max(1, len(losses) // 10)
    return f"{name} {len(losses)} steps, loss {sum(losses[:k]) / k:.4f} -> {sum(losses[-k:]) / k:.4f}"


def run(args) -> int:
    if args.fetch_photos:
        print(f"the training photographs are in {fetch(args.fetch_photos)}")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config_from_args(args)
    make_output_folder(cfg.output, "checkpoint")  # a file there is said now, not after the first steps
    losses = ImageTrainer(cfg).train()
    done = [_summary(name, values) for name, values in losses.items() if values]
    if done:
        print(f"trained {'; '.join(done)}; checkpoint in {cfg.output}")
    else:
        print(f"nothing to do: {cfg.output} is already at the steps asked for")
    if args.export:
        print(f"exported the model to {export_checkpoint(cfg.output, args.export)}")
    return 0

