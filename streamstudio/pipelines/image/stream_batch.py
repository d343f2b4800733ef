"""The Stream Batch sampler of the image pipeline: schedule coefficients, per-slot noise, the
buffer and its priming, and one denoising step with residual CFG (the maths is in
`pipelines/image/stream_diffusion.py`'s docstring).

The buffer holds N slots (one per denoising step), each of k frames (frame_buffer_size). With
Stream Batch one call advances every slot by one step: a new group of frames enters slot 0 and
the group in the last slot leaves denoised. Sequential mode (or N = 1) runs a group's N steps
back to back. Each group carries an integer id through the buffer, and `advance` says which id
leaves: `PRIMED` (-1) for the first N - 1 calls, whose slots the first group's own trajectory
filled, and for every filler group the caller puts in with that id (flush).

Per-frame condition fields (`FrameFields`: ControlNet images, computed once per input group)
travel with their group through the slots: a slot holding an older group's latents gets that
group's fields, the primed slots the first group's, a filler the fields it was given.

The scheduler's arithmetic stays the scheduler's (diffusers' LCMScheduler): `Schedule.lcm` only
asks it for the timesteps, alphas_cumprod and the LCM boundary scalings of the chosen steps.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from streamstudio import kernels
from streamstudio.kernels.reference import CFG_FULL, CFG_INITIALIZE
from streamstudio.models.image import feature_bank
from streamstudio.models.image.image_net import ImageCond, ImageNet

if TYPE_CHECKING:  # (by its module: diffusers' top-level names are dummies to a type checker)
    from diffusers.schedulers.scheduling_lcm import LCMScheduler


PRIMED = -1  # the id of a group that is no input's: a primed slot, or a filler
FrameFields = dict[str, Any]  # ImageCond fields of one group's k frames: name -> (k, ...) tensor or tuple of them


def join_fields(parts: Sequence[FrameFields | None]) -> FrameFields | None:
    """The fields of several groups, rows in order (None when the groups have none)."""
    if not parts or parts[0] is None:
        return None
    groups = [p for p in parts if p is not None]  # (a stream's groups all have fields, or none has)
    out: FrameFields = {}
    for name, value in parts[0].items():
        if isinstance(value, tuple):
            out[name] = tuple(torch.cat([p[name][i] for p in groups]) for i in range(len(value)))
        else:
            out[name] = torch.cat([p[name] for p in groups])
    return out


def with_fields(cond: ImageCond, fields: FrameFields | None, rows: slice = slice(None)) -> ImageCond:
    """`cond` (already of the right rows) with the per-row fields of `rows` set."""
    if fields is None:
        return cond
    changes: FrameFields = {name: tuple(v[rows] for v in value) if isinstance(value, tuple) else value[rows]
                            for name, value in fields.items()}
    return dataclasses.replace(cond, **changes)


@dataclass(frozen=True)
class Schedule:
    """The N denoising steps of one stream."""

    timesteps: torch.Tensor  # (N,) long
    coef: torch.Tensor  # (N, 6) float32: alpha, beta, c_skip, c_out, alpha_next, beta_next (1, 1 after the last)

    @property
    def steps(self) -> int:
        return self.timesteps.shape[0]

    @staticmethod
    def lcm(scheduler: LCMScheduler, t_index: Sequence[int], step_type: str, device: torch.device) -> "Schedule":
        """Steps `t_index` of the scheduler's timesteps. step_type "lcm": the LCM boundary
        scalings (c_skip, c_out); "turbo": x0 = F (c_skip 0, c_out 1)."""
        timesteps = scheduler.timesteps[list(t_index)].to(torch.long)  # (N,)
        abar = scheduler.alphas_cumprod[timesteps].to(torch.float64)  # (N,)
        alpha, beta = abar.sqrt(), (1 - abar).sqrt()
        if step_type == "lcm":
            scal = [scheduler.get_scalings_for_boundary_condition_discrete(t) for t in timesteps]
            c_skip = torch.tensor([float(s[0]) for s in scal], dtype=torch.float64)
            c_out = torch.tensor([float(s[1]) for s in scal], dtype=torch.float64)
        else:
            c_skip, c_out = torch.zeros_like(alpha), torch.ones_like(alpha)
        one = torch.ones(1, dtype=torch.float64)
        coef = torch.stack([alpha, beta, c_skip, c_out, torch.cat([alpha[1:], one]), torch.cat([beta[1:], one])], 1)
        return Schedule(timesteps.to(device), coef.to(device, torch.float32))


@dataclass(frozen=True)
class Guidance:
    """What one call is guided by."""

    text: ImageCond  # the prompt's condition, one row
    negative: ImageCond  # the negative prompt's, one row
    cfg: int  # CFG_NONE, CFG_SELF, CFG_INITIALIZE or CFG_FULL (kernels.reference)
    scale: float
    delta: float


class StreamBatchSampler:
    """Groups of k frames' latents in, x0 latents out, through the N-step buffer."""

    def __init__(self, net: ImageNet, schedule: Schedule, *, frames: int, stream_batch: bool,
                 latent_shape: tuple[int, int, int], seed: int, v_prediction: bool = False):
        self.net, self.schedule, self.k = net, schedule, frames
        self.stream_batch = stream_batch and schedule.steps > 1
        self.latent_shape, self.v_prediction = latent_shape, v_prediction
        self.device, self.dtype = net.device, net.dtype
        self.bank: feature_bank.FeatureBank | None = None  # the stream's own feature bank (None: off)
        self.unet_rows = 0  # UNet batch rows evaluated
        n, k = schedule.steps, frames
        self._coef = schedule.coef.repeat_interleave(k, 0)  # (N*k, 6)
        self._t_rows = schedule.timesteps.repeat_interleave(k)  # (N*k,)
        self._levels = [j for j in range(n) for _ in range(k)]  # each row's step
        self.reseed(seed)
        self.reset()

    # ------------------------------------------------------------------ state
    def reseed(self, seed: int) -> None:
        """New per-slot noise (and txt2img noise) from `seed`; the buffer stays."""
        n, k = self.schedule.steps, self.k
        gen = torch.Generator("cpu").manual_seed(seed)
        # (N*k, 4, h, w)
        self._noise = torch.randn((n * k, *self.latent_shape), generator=gen).to(self.device, self.dtype)
        self._noise_next = torch.roll(self._noise, -k, dims=0)  # row of slot j gets slot j+1's noise
        # txt2img draws each frame's noise on the device, from a generator there (no upload per frame)
        self._txt_gen = torch.Generator(self.device).manual_seed(seed + 1)

    def reset(self) -> None:
        """Empty the buffer (the next group primes it again) and the feature bank."""
        self._buffer: torch.Tensor | None = None  # (N-1)*k latents at levels 1..N-1
        self._stock: torch.Tensor | None = None  # their residual-CFG stock noise
        self._ids: deque[int] = deque()  # the ids of the buffer's groups, newest first
        self._fields: deque[FrameFields | None] = deque()  # the buffer's groups' frame fields, newest first
        self._bank_frame = 0  # the bank's index of the group now entering
        if self.bank is not None:
            self.bank.clear()  # features at the old schedule's levels (or of another clip) are stale

    @property
    def in_flight(self) -> list[int]:
        """Ids of the input groups in the buffer, oldest first (fillers and primed slots left out)."""
        return [i for i in reversed(self._ids) if i != PRIMED]

    # ------------------------------------------------------------------ one call
    def first_level(self, x0_in: torch.Tensor | None) -> torch.Tensor:
        """A group's latents at level 0: img2img noises the input (k, 4, h, w), txt2img (None) draws noise."""
        if x0_in is None:
            return torch.randn((self.k, *self.latent_shape), generator=self._txt_gen, device=self.device,
                               dtype=self.dtype)
        alpha, beta = self.schedule.coef[0, 0].to(self.dtype), self.schedule.coef[0, 1].to(self.dtype)
        return alpha * x0_in + beta * self._noise[:self.k]

    @torch.inference_mode()
    def advance(self, x0_in: torch.Tensor | None, group: int, guidance: Guidance,
                fields: FrameFields | None = None) -> tuple[torch.Tensor, int]:
        """Put group `group` (its x0 latents (k, 4, h, w), None for txt2img, and its frame
        fields) in; returns the x0 latents (k, 4, h, w) of the group that leaves and that group's id."""
        self._bank_frame = self.bank.next_frame() if self.bank is not None else 0
        x_first = self.first_level(x0_in)
        if not self.stream_batch:
            out, _, _ = self._trajectory(x_first, self.schedule.steps - 1, guidance, fields=fields)
            return out, group
        if self._buffer is None:
            self._prime(x_first, guidance, fields)
        out = self._batch_call(x_first, guidance, fields)
        self._ids.appendleft(group)
        return out, self._ids.pop()

    def _batch_call(self, x_first: torch.Tensor, guidance: Guidance, fields: FrameFields | None) -> torch.Tensor:
        """Every slot advances one step; returns the last slot's x0."""
        k = self.k
        assert self._buffer is not None and self._stock is not None  # (primed by `advance`)
        x = torch.cat([x_first, self._buffer])  # (N*k, 4, h, w)
        stock = torch.cat([self._noise[:k], self._stock])
        slots = [(j, self._bank_frame - j) for j in self._levels]  # slot j holds the group that came j calls ago
        rows = join_fields([fields, *self._fields])  # each slot's own group's fields
        x0, x_next, stock_next = self._step(x, stock, self._coef, self._t_rows, self._noise_next, guidance,
                                            first_rows=k, slots=slots, fields=rows)
        # in place: the buffer keeps its storage from call to call, so a captured CUDA graph of the
        # whole frame (pipelines/image/frame_graph.py) reads and writes the same memory on every replay
        self._buffer.copy_(x_next[:-k])
        self._stock.copy_(stock_next[:-k])
        self._fields.appendleft(fields)
        self._fields.pop()
        return x0[-k:]

    def _prime(self, x_first: torch.Tensor, guidance: Guidance, fields: FrameFields | None = None) -> None:
        """Fill slots 1..N-1 with the first group's own trajectory (no empty-buffer frames)."""
        n = self.schedule.steps
        # without the bank: the primed slots are group 0 again, and the bank starts with the first call
        _, xs, stocks = self._trajectory(x_first, n - 2, guidance, bank=False, fields=fields)
        self._buffer, self._stock = torch.cat(xs), torch.cat(stocks)  # slots 1..N-1
        self._ids = deque([PRIMED] * (n - 1))
        self._fields = deque([fields] * (n - 1))

    def _trajectory(self, x: torch.Tensor, last: int, guidance: Guidance,
                    bank: bool = True, fields: FrameFields | None = None) -> tuple[torch.Tensor, list, list]:
        """Sequential denoising of one group through steps 0..last (bank: with the feature bank
        when it is on). Returns the x0 of step `last` and the (x, stock) states entering steps
        1..last+1."""
        k, n, s = self.k, self.schedule.steps, self.schedule
        stock = self._noise[:k]
        xs, stocks = [], []
        for j in range(last + 1):
            coef = s.coef[j:j + 1].expand(k, -1)  # (k, 6)
            t = s.timesteps[j:j + 1].expand(k)  # (k,)
            noise_next = self._noise[((j + 1) % n) * k:((j + 1) % n + 1) * k]
            x0, x, stock = self._step(x, stock, coef, t, noise_next, guidance, first_rows=k if j == 0 else 0,
                                      slots=[(j, self._bank_frame)] * k if bank else None, fields=fields)
            xs.append(x)
            stocks.append(stock)
        return x0, xs, stocks

    def _step(self, x: torch.Tensor, stock: torch.Tensor, coef: torch.Tensor, t: torch.Tensor, noise_next: torch.Tensor,
              guidance: Guidance, first_rows: int, slots: Sequence[tuple[int, int]] | None = None,
              fields: FrameFields | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        eps_text, eps_uncond, uncond_first = self._predict_eps(x, t, coef, guidance, first_rows, slots, fields)
        if uncond_first is not None:
            stock = torch.cat([uncond_first, stock[first_rows:]])
        return kernels.stream_step(x, eps_text, eps_uncond, stock, noise_next, coef, guidance.scale, guidance.delta,
                                   guidance.cfg)

    # ------------------------------------------------------------------ the network
    def _predict_eps(self, x: torch.Tensor, t: torch.Tensor, coef: torch.Tensor, guidance: Guidance,
                     first_rows: int, slots: Sequence[tuple[int, int]] | None = None,
                     fields: FrameFields | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Noise predictions for rows x (B, 4, h, w) at timesteps t (B,).

        Returns (eps_text, eps_uncond or None, stock override for the first rows or None).
        `first_rows` > 0 asks for the unconditional pass of the first rows ("initialize").
        `slots`: (denoising step, group index) of each row, for the feature bank (None: no
        bank). A row's bank key is (branch, step, frame of the group): each slot reads the
        features of earlier groups at its own step, never those of a newer one; a row writes
        when its group's index is due (`FeatureBank.writes`), and a primed slot (index < 0, a
        copy of group 0) neither reads nor writes.
        """
        b, cfg = x.shape[0], guidance.cfg
        text = with_fields(guidance.text.expand(b), fields)  # (B rows), each with its group's frame fields
        bank = self.bank if slots is not None else None
        rows = None if bank is None or slots is None else [(step, frame, r % self.k)
                                                           for r, (step, frame) in enumerate(slots)]

        def eps(x_, t_, cond, branches):  # branches: the bank branch of each row's block of rows
            self.unet_rows += x_.shape[0]
            if rows is None or bank is None:
                return self.net.eps(x_, t_, cond)
            keyed = [(branch, *row) for branch, n in branches for row in rows[:n]]
            keys = tuple(None if frame < 0 else (branch, step, i) for branch, step, frame, i in keyed)
            writes = tuple(bank.writes(frame) for _, _, frame, _ in keyed)
            return self.net.eps(x_, t_, cond, [(0, feature_bank.BankRows(bank, keys, writes))])

        if cfg == CFG_FULL:
            out = eps(torch.cat([x, x]), torch.cat([t, t]),
                      ImageCond.cat([with_fields(guidance.negative.expand(b), fields), text]),
                      [("u", b), ("c", b)])
            eps_uncond, eps_text = out.chunk(2)
            return self._to_eps(eps_text, x, coef), self._to_eps(eps_uncond, x, coef), None
        if cfg == CFG_INITIALIZE and first_rows:
            n = first_rows
            out = eps(torch.cat([x[:n], x]), torch.cat([t[:n], t]),
                      ImageCond.cat([with_fields(guidance.negative.expand(n), fields, slice(0, n)), text]),
                      [("u", n), ("c", b)])
            return self._to_eps(out[n:], x, coef), None, self._to_eps(out[:n], x[:n], coef[:n])
        return self._to_eps(eps(x, t, text, [("c", b)]), x, coef), None, None

    def _to_eps(self, out: torch.Tensor, x: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        if not self.v_prediction:
            return out
        alpha, beta = coef[:, 0].view(-1, 1, 1, 1), coef[:, 1].view(-1, 1, 1, 1)
        return (alpha * out + beta * x).to(out.dtype)  # eps = alpha * v + beta * x_t
