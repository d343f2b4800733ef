"""What the trainers' loops share (image, StreamDiT, causal): the learning-rate schedule (a linear
warm-up, then a cosine down to a share of the base rate) and the video trainers' step loop (set
the rate, loss, backward, clip, step, save every few steps, stop at a wall-time limit)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from tqdm.auto import tqdm

log = logging.getLogger(__name__)


def cosine_lr(base: float, step: int, total: int, warmup: int, min_ratio: float) -> float:
    """The rate of step `step` (0-based) of `total`: base (step + 1) / warmup over the first `warmup`
    steps, then a half cosine from base down to min_ratio base at `total`, flat after it."""
    if step < warmup:
        return base * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass
class Schedule:
    """The loop's settings (each trainer's config gives them)."""

    steps: int  # the step to stop at
    lr: float
    warmup: int
    min_lr_ratio: float
    grad_clip: float  # 0: none
    save_every: int
    max_minutes: float  # 0: no limit
    progress: bool
    desc: str

    @classmethod
    def of(cls, cfg, desc: str, progress: bool | None = None) -> Schedule:
        """A trainer config's schedule (VideoTrainConfig, CausalTrainConfig: the fields above);
        `progress` None: the config's."""
        return cls(cfg.steps, cfg.lr, cfg.warmup, cfg.min_lr_ratio, cfg.grad_clip, cfg.save_every, cfg.max_minutes,
                   cfg.progress if progress is None else progress, desc)


class Stepper:
    """What `run_steps` drives: a model's optimizer, its step counter and its save; `backward` and
    `clip` are torch's (an accelerate trainer gives its own)."""

    step: int
    opt: torch.optim.Optimizer

    def save(self, seconds: float = 0.0) -> None:
        raise NotImplementedError

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip(self, params: Iterable[torch.Tensor], max_norm: float) -> None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)


def run_steps(trainer: Stepper, sched: Schedule, params: Iterable[torch.Tensor],
              loss_at: Callable[[int], torch.Tensor]) -> list[float]:
    """Train from `trainer.step` to `sched.steps` with `loss_at(step)`, saving every `save_every`
    steps, at the end, and when `max_minutes` of wall time are up (then it stops); the losses."""
    params = list(params)
    losses: list[float] = []
    bar = tqdm(total=sched.steps, initial=trainer.step, disable=not sched.progress, desc=sched.desc)
    start = time.time()
    while trainer.step < sched.steps:
        if sched.max_minutes and time.time() - start > 60 * sched.max_minutes:
            log.info("stopping at step %d: --max-minutes %.1f reached", trainer.step, sched.max_minutes)
            trainer.save(time.time() - start)
            break
        for group in trainer.opt.param_groups:
            group["lr"] = cosine_lr(sched.lr, trainer.step, sched.steps, sched.warmup, sched.min_lr_ratio)
        loss = loss_at(trainer.step)
        trainer.backward(loss)
        if sched.grad_clip:
            trainer.clip(params, sched.grad_clip)
        trainer.opt.step()
        trainer.opt.zero_grad(set_to_none=True)
        trainer.step += 1
        losses.append(float(loss.detach()))
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if trainer.step % sched.save_every == 0 or trainer.step == sched.steps:
            recent = losses[-sched.save_every:]
            log.info("step %d: loss %.4f (mean of the last %d)", trainer.step, sum(recent) / len(recent), len(recent))
            trainer.save(time.time() - start)
    bar.close()
    return losses
