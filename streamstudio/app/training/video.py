"""Training of the StreamDiT model: buffered flow matching and multistep distillation.

Built on accelerate, so the same loop runs on CPU and, through `accelerate launch`, on several
GPUs (each process draws its own data; gradients are averaged by accelerate).

Buffered flow matching with mixed partitioning (StreamDiT, arXiv 2507.03745): a training clip
is a buffer of K clean reference frames followed by B = N * c frames. For each sample a chunk
size c is drawn from 1, 2, 4, ... up to B; chunk j (0 = oldest) gets one level t drawn from its
segment [(N-1-j)/N, (N-j)/N), so the buffer looks like the sampler's at some moment (c = B is
plain uniform generation). x_t = (1 - t) * noise + t * data, the target velocity is
data - noise (t = 0 noise, t = 1 data).

Distillation (mode "distill"), as the paper does it: "sampling distillation is performed in each
segment of a chosen partitioning scheme". The scheme is the layout (N, c) the student will be
sampled with (`sampling`), nothing else: every training buffer is one the student's sampler
(s = 1, levels k / N) actually runs, either a streaming call (chunk j at level N - 1 - j) or, with
probability `distill_startup_share`, a start-up call of its uniform generation (every frame at
the same level k < N - 1). The student's one Euler step of 1 / N must match the teacher's s
micro-steps over the same segment, taken as the teacher's sampler takes them (every frame moves
together, the whole buffer in context).

Every batch and noise sample is seeded by (seed, step, process), so a resumed run continues
exactly where the stopped one would have been.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file
from accelerate import Accelerator

from streamstudio.errors import StreamStudioError
from streamstudio.models.video.stream_dit import (StreamDiT, StreamDiTConfig, guided_velocity, load_checkpoint,
                                            named_config, read_checkpoint_config, save_checkpoint)
from streamstudio.app.training.config import VideoTrainConfig  # noqa: F401 (re-exported)
from streamstudio.app.training.loop import Schedule, Stepper, run_steps
from streamstudio.models.video.video_data import VideoFolder, synthetic_batch

log = logging.getLogger(__name__)


def partition_levels(gen: torch.Generator, batch: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixed partitioning: ((B, frames) levels in [0, 1), (B,) chunk sizes), oldest frame first."""
    sizes = [2**i for i in range(int(math.log2(frames)) + 1) if frames % 2**i == 0]
    pick = torch.randint(len(sizes), (batch,), generator=gen)
    chunk = torch.tensor([sizes[i] for i in pick.tolist()])  # (B,)
    u = torch.rand(batch, frames, generator=gen)  # (B, frames) one draw per frame, shared per chunk
    t = torch.empty(batch, frames)
    for b in range(batch):
        c = int(chunk[b])
        n = frames // c
        j = torch.arange(frames) // c  # chunk index per frame
        uc = u[b].view(n, c)[:, 0].repeat_interleave(c)  # one draw per chunk
        t[b] = (n - 1 - j + uc) / n
    return t, chunk


def distill_levels(gen: torch.Generator, batch: int, num_chunks: int, chunk_size: int,
                   startup_share: float) -> torch.Tensor:
    """(B, N*c) student level indices (time k / N) of buffers the s = 1 sampler runs, oldest first.

    A streaming call has chunk j at level N - 1 - j; a start-up call (uniform generation) has every
    frame at one level k in 0 .. N - 2 (probability `startup_share`, none when N = 1)."""
    n, c = num_chunks, chunk_size
    stream = (n - 1 - torch.arange(n * c) // c).expand(batch, n * c)  # (B, N*c)
    startup = torch.rand(batch, generator=gen) < startup_share  # (B,)
    k = torch.randint(max(1, n - 1), (batch,), generator=gen)  # (B,)
    if n == 1:
        return stream.clone()
    return torch.where(startup[:, None], k[:, None].expand(batch, n * c), stream)


def teacher_target(teacher, x_a: torch.Tensor, t_a: torch.Tensor, dt: torch.Tensor, steps: int,
                   text) -> torch.Tensor:
    """The teacher's average velocity over each frame's segment: (x after `steps` Euler steps of
    dt / steps, all frames moving together - x_a) / dt. x_a: (B, F, C, H, W), t_a, dt: (B, F);
    frames with dt = 0 (reference frames) stay put and get a zero target."""
    x, t = x_a, t_a
    h = dt / steps  # (B, F)
    for _ in range(steps):
        x = x + h[..., None, None, None] * teacher(x, t, text)
        t = t + h
    return (x - x_a) / dt.clamp_min(1e-8)[..., None, None, None]  # (B, F, C, H, W)


def _guided(model, x: torch.Tensor, t: torch.Tensor, text, *, empty, guidance: float) -> torch.Tensor:
    return guided_velocity(model, x, t, text, empty, guidance)


@dataclass
class FlowDraw:
    """Everything random in one flow-matching step, on the CPU: clean clips (B, F, C, H, W), the
    captions (some dropped to ""), the levels (B, F) and the noise (B, F, C, H, W); `fade` (B, F):
    how much of each frame's content the network's input keeps (1 everywhere without
    --context-fade; see `context_fade`)."""

    clips: torch.Tensor
    captions: list[str]
    levels: torch.Tensor
    noise: torch.Tensor
    fade: torch.Tensor | None = None


def context_fade(gen: torch.Generator, chunk: torch.Tensor, frames: int, share: float) -> torch.Tensor:
    """(B, frames) fade factors, oldest frame first: with probability `share` a sample (with more
    than one chunk) fades its m oldest chunks (m uniform in 1 .. N-1) by one factor a ~ U(0, 1),
    the rest keep 1. A faded frame is shown as its median colour + a (frame - median) and is left
    out of the loss, so the newer frames learn to draw the caption's content when the frames
    ahead of them in the buffer have lost it: the sampler's own failure (an object that fades
    from frame to frame, or a buffer that never drew it), which the clean clips never show."""
    batch = chunk.shape[0]
    pick = torch.rand(batch, generator=gen) < share  # (B,)
    u = torch.rand(batch, generator=gen)  # (B,) how many chunks
    a = torch.rand(batch, generator=gen)  # (B,) fade factor
    n = frames // chunk  # (B,) chunks per sample
    m = 1 + (u * (n - 1)).long()  # (B,) 1 .. n-1 faded chunks
    faded = (pick & (n > 1))[:, None] & (torch.arange(frames)[None] < (m * chunk)[:, None])  # (B, frames)
    return torch.where(faded, a[:, None], 1.0)


def draw_clips(cfg: VideoTrainConfig, data, step: int, process: int) -> tuple[torch.Tensor, list[str], torch.Generator]:
    """Step `step`'s clips (B, K + buffer, C, H, W) and captions, and the generator the rest of its
    randomness is drawn from: all seeded by (seed, step, process)."""
    seed = (cfg.seed * 1_000_003 + step) * 64 + process
    frames = cfg.ref_frames + cfg.buffer_frames
    if data is None:
        clips, caps = synthetic_batch(seed, cfg.batch_size, frames, cfg.size)
    else:
        clips, caps = data.batch(seed, cfg.batch_size, frames)
    return clips, caps, torch.Generator().manual_seed(seed)


def draw_flow(cfg: VideoTrainConfig, data, step: int, process: int) -> FlowDraw:
    """Step `step`'s FlowDraw: each caption replaced by the empty prompt with probability
    `cond_drop` (the unconditional branch classifier-free guidance needs), then the levels
    (reference frames at 1, clean, then the partitioned buffer), then the noise."""
    clips, caps, gen = draw_clips(cfg, data, step, process)
    if cfg.cond_drop:
        drop = torch.rand(len(caps), generator=gen) < cfg.cond_drop
        caps = ["" if d else c for c, d in zip(caps, drop.tolist())]
    t, chunk = partition_levels(gen, cfg.batch_size, cfg.buffer_frames)
    levels = torch.cat([torch.ones(cfg.batch_size, cfg.ref_frames), t], dim=1)  # (B, F)
    noise = torch.randn(clips.shape, generator=gen)
    fade = None
    if cfg.context_fade:  # drawn after the noise, so runs without it draw what they drew before
        fade = torch.cat([torch.ones(cfg.batch_size, cfg.ref_frames),
                          context_fade(gen, chunk, cfg.buffer_frames, cfg.context_fade)], dim=1)  # (B, F)
    return FlowDraw(clips, caps, levels, noise, fade)


class _FlowSteps(torch.utils.data.Dataset):
    """Steps start, start + 1, ... up to the run's last: drawn in order here, or by --workers
    processes ahead (a DataLoader over it)."""

    def __init__(self, cfg: VideoTrainConfig, data, start: int, process: int):
        self.cfg, self.data, self.start, self.process = cfg, data, start, process

    def __len__(self) -> int:
        return max(0, self.cfg.steps - self.start)

    def __getitem__(self, i: int) -> FlowDraw:
        return draw_flow(self.cfg, self.data, self.start + i, self.process)

    def __iter__(self):  # drawn in the loop's own process (no --workers)
        return (self[i] for i in range(len(self)))


class VideoTrainer(Stepper):
    """`VideoTrainer(cfg).train()` -> list of losses (one per step run)."""

    def __init__(self, cfg: VideoTrainConfig):
        if cfg.mode not in ("flow", "distill"):
            raise StreamStudioError(f"unknown training mode {cfg.mode!r}; use flow or distill")
        if cfg.buffer_frames < 1 or cfg.buffer_frames & (cfg.buffer_frames - 1):
            raise StreamStudioError(f"--buffer-frames must be a power of two, got {cfg.buffer_frames}")
        if not 0.0 <= cfg.cond_drop < 1.0:
            raise StreamStudioError(f"--cond-drop is a share in [0, 1), got {cfg.cond_drop}")
        if not 0.0 <= cfg.context_fade <= 1.0 or (cfg.context_fade and cfg.mode != "flow"):
            raise StreamStudioError(f"--context-fade is a share in [0, 1] for --mode flow, got {cfg.context_fade}")
        if cfg.mode == "distill" and cfg.sampling["num_chunks"] * cfg.sampling["chunk_size"] != cfg.buffer_frames:
            raise StreamStudioError(f"distillation learns the layout it will sample: --num-chunks x chunk size "
                                    f"must be --buffer-frames {cfg.buffer_frames}")
        self.cfg = cfg
        self.acc = Accelerator(cpu=cfg.cpu)
        self.out = Path(cfg.output)
        self.step = 0
        self.teacher = self._load_teacher() if cfg.mode == "distill" else None
        model = self._initial_model()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        if cfg.resume:
            self._resume(model, opt)
        self.model, self.opt = self.acc.prepare(model, opt)
        self.data = None if cfg.data == "synthetic" else VideoFolder(cfg.data, cfg.size)

    # ------------------------------------------------------------------ setup
    def _load_teacher(self) -> StreamDiT:
        if not self.cfg.teacher:
            raise StreamStudioError("distill mode needs --teacher DIR (a checkpoint trained with mode flow)")
        teacher, _ = load_checkpoint(self.cfg.teacher, device=self.acc.device)
        return teacher.requires_grad_(False)

    def _initial_model(self) -> StreamDiT:
        if self.teacher is not None:  # the student starts as the teacher
            model = StreamDiT(self.teacher.cfg)
            model.load_state_dict(self.teacher.state_dict())
            return model
        if self.cfg.init and not self.cfg.resume:  # the checkpoint's architecture, trained with the window mask
            cfg = StreamDiTConfig.from_dict(read_checkpoint_config(self.cfg.init)["model"])
            if self.cfg.init_shift_mask:
                cfg = replace(cfg, shift_mask=True)
            model = StreamDiT(cfg)
            model.load_state_dict(load_file(str(Path(self.cfg.init) / "model.safetensors")))
            return model
        torch.manual_seed(self.cfg.seed)
        return StreamDiT(named_config(self.cfg.model))

    def _resume(self, model: StreamDiT, opt: torch.optim.Optimizer) -> None:
        state_file = self.out / "trainer_state.json"
        if not state_file.is_file():
            raise StreamStudioError(f"nothing to resume in {self.out}: no trainer_state.json; "
                                    "run without --resume to start a new run")
        model.load_state_dict(load_file(str(self.out / "model.safetensors")))
        opt.load_state_dict(torch.load(self.out / "optimizer.pt", weights_only=True))
        self.step = json.loads(state_file.read_text())["step"]

    # ------------------------------------------------------------------ data and losses
    def _batch(self, step: int) -> tuple[torch.Tensor, list[str], torch.Generator]:
        clips, caps, gen = draw_clips(self.cfg, self.data, step, self.acc.process_index)
        return clips.to(self.acc.device), caps, gen

    def _flow_draws(self):
        """(step, FlowDraw) from self.step on: drawn here, or by --workers processes ahead of the loop."""
        steps = _FlowSteps(self.cfg, self.data, self.step, self.acc.process_index)
        if self.cfg.workers:
            steps = torch.utils.data.DataLoader(steps, batch_size=None, num_workers=self.cfg.workers,
                                                prefetch_factor=4)
        yield from enumerate(steps, start=self.step)

    def flow_loss(self, draw: FlowDraw) -> torch.Tensor:
        """Buffered flow-matching loss of one draw (reference frames and faded frames excluded)."""
        dev = self.acc.device
        x1, t, noise = draw.clips.to(dev), draw.levels.to(dev), draw.noise.to(dev)  # (B, F, C, H, W), (B, F)
        caps = draw.captions
        tt = t[:, :, None, None, None]
        shown = x1
        if draw.fade is not None:
            a = draw.fade.to(dev)[:, :, None, None, None]  # (B, F, 1, 1, 1)
            median = x1.flatten(3).median(dim=3).values[..., None, None]  # (B, F, C, 1, 1)
            shown = median + a * (x1 - median)
        xt = (1 - tt) * noise + tt * shown
        model = self.acc.unwrap_model(self.model)
        v = self.model(xt, t, model.encode_text(caps))  # (B, F, C, H, W)
        k = self.cfg.ref_frames
        err = (v[:, k:] - (x1 - noise)[:, k:]).pow(2)  # (B, F-K, C, H, W)
        if draw.fade is None:
            return err.mean()
        keep = (draw.fade[:, k:] == 1).to(dev, err.dtype)  # (B, F-K) frames shown as they are (a faded one's a < 1)
        return (err.mean(dim=(2, 3, 4)) * keep).sum() / keep.sum()

    def distill_loss(self, x1: torch.Tensor, caps: list[str], gen: torch.Generator) -> torch.Tensor:
        """Student's one step per segment of the sampled layout vs the teacher's `teacher_steps`."""
        cfg = self.cfg
        n, c = cfg.sampling["num_chunks"], cfg.sampling["chunk_size"]
        k = distill_levels(gen, cfg.batch_size, n, c, cfg.distill_startup_share)  # (B, N*c)
        ref = torch.ones(cfg.batch_size, cfg.ref_frames)
        t_a = torch.cat([ref, k / n], 1).to(x1.device)  # (B, F) segment starts, references clean
        dt = torch.cat([torch.zeros_like(ref), torch.full(k.shape, 1 / n)], 1).to(x1.device)  # (B, F)
        noise = torch.randn(x1.shape, generator=gen).to(x1.device)
        x_a = (1 - t_a)[..., None, None, None] * noise + t_a[..., None, None, None] * x1
        assert self.teacher is not None  # (distillation loads its teacher)
        with torch.no_grad():
            text, empty = self.teacher.encode_text(caps), self.teacher.encode_text([""] * len(caps))
            teacher = partial(_guided, self.teacher, empty=empty, guidance=cfg.teacher_guidance)
            target = teacher_target(teacher, x_a, t_a, dt, cfg.teacher_steps, text)
        model = self.acc.unwrap_model(self.model)
        v = self.model(x_a, t_a, model.encode_text(caps))
        kr = cfg.ref_frames
        return (v[:, kr:] - target[:, kr:]).pow(2).mean()

    # ------------------------------------------------------------------ loop
    def train(self) -> list[float]:
        cfg = self.cfg
        self.model.train()
        sched = Schedule.of(cfg, f"train-video ({cfg.mode})", progress=cfg.progress and self.acc.is_main_process)
        if cfg.mode == "distill":
            return run_steps(self, sched, self.model.parameters(), lambda step: self.distill_loss(*self._batch(step)))
        draws = self._flow_draws()

        def flow_loss_at(step: int) -> torch.Tensor:
            drawn, draw = next(draws)
            assert drawn == step, (drawn, step)  # the loader follows the loop's steps
            return self.flow_loss(draw)

        return run_steps(self, sched, self.model.parameters(), flow_loss_at)

    def backward(self, loss: torch.Tensor) -> None:
        self.acc.backward(loss)

    def clip(self, params, max_norm: float) -> None:
        self.acc.clip_grad_norm_(params, max_norm)

    def save(self, seconds: float = 0.0) -> None:
        self.acc.wait_for_everyone()
        if not self.acc.is_main_process:
            return
        model = self.acc.unwrap_model(self.model)
        train = {k: v for k, v in asdict(self.cfg).items() if k not in ("sampling",)}
        extra = {"sampling": {**self.cfg.sampling, "height": self.cfg.size, "width": self.cfg.size,
                              "ref_frames": self.cfg.ref_frames},
                 "train": train}
        save_checkpoint(model, self.out, extra)
        torch.save(self.opt.state_dict(), self.out / "optimizer.pt")
        (self.out / "trainer_state.json").write_text(json.dumps({"step": self.step, "seconds": round(seconds, 1)}))
        log.info("saved step %d to %s", self.step, self.out)
