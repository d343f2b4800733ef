"""The arguments every training run takes (`train-image`, `train-video`): its seed, how often it
saves, resuming, the device, a wall-time limit, CPU threads and the progress bar."""

from __future__ import annotations

import argparse

from streamstudio.app.settings import number


def add_run_arguments(p: argparse.ArgumentParser, seed: int, save_every: int) -> None:
    """`p` takes the run's arguments, with the trainer's default `seed` and `save_every`."""
    p.add_argument("--seed", type=number(int, 0, 2**63 - 1), default=seed)
    p.add_argument("--save-every", type=number(int, 1, 10**8), default=save_every)
    p.add_argument("--resume", action="store_true", help="continue the run saved in --output")
    p.add_argument("--cpu", action="store_true", help="train on CPU even when a GPU is present")
    p.add_argument("--max-minutes", type=number(float, 0, 10**7), default=0.0,
                   help="stop and save after this wall time (0: no limit)")
    p.add_argument("--threads", type=number(int, 0, 1024), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
