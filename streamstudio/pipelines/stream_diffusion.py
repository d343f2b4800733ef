"""StreamDiffusion (arXiv 2312.12491) on diffusers components.

The buffer holds N slots (one per denoising step in `t_index_list`), each of
`frame_buffer_size` frames. With Stream Batch, one UNet call advances every slot by one
step: a new frame enters slot 0, every slot moves to the next level, and the frame in the
last slot comes out denoised. Sequential mode runs the N steps of one frame back to back.
Both compute exactly the same per-frame trajectory given the same noise:

    x_0      = alpha_0 * x0_in + beta_0 * noise_0            (img2img; txt2img: x_0 ~ N(0, I))
    eps_j    = RCFG(UNet(x_j, t_j, text), stock_j)
    x0_j     = c_out_j * (x_j - beta_j * eps_j) / alpha_j + c_skip_j * x_j   (turbo: c_out=1, c_skip=0)
    x_{j+1}  = alpha_{j+1} * x0_j + beta_{j+1} * noise_{j+1}
    stock_0  = noise_0 (self) or eps_uncond(x_0) (initialize)
    step_j(eps, z) = c_out_j * (z - beta_j * eps) / alpha_j + c_skip_j * z    (so x0_j = step_j(eps_j, x_j))
    stock_{j+1} = noise_{j+1} + alpha_{j+1} / beta_{j+1} * step_j(eps_j, beta_j * stock_j)

`noise_j` is the fixed noise of slot j (the paper's per-slot noise; the reference
implementation's `init_noise`). The stock update is the reference implementation's
(`unet_step`: `scaled_noise = beta_prod_t_sqrt * stock_noise` goes through the step): the
scaled stock, not the image latent x_j, is stepped. Residual CFG uses `delta * stock_j` as the unconditional
noise ("self", "initialize"), so UNet passes per frame are N (none), N (self), N + 1
(initialize) and 2N (full).

Latency: with Stream Batch and N steps, the output of input frame k leaves at call
k + N - 1. The buffer is primed from the first frame (its own trajectory fills the slots), so
the first N outputs all show frame 0 and no output is ever an empty-buffer frame. `push()`
and `flush()` give frame-aligned output (one output per input, in order); `__call__` gives
the latest output for live use.

Temporal consistency (`temporal`, for live video-to-video; off by default):

- latent feedback ("feedback"): the input latent becomes
  `(1 - feedback_weight) * encode(frame) + feedback_weight * x0_last`, x0_last the latent of the
  last output (with Stream Batch, the frame that left last). Costs nothing measurable.
- feature bank ("bank", StreamV2V, arXiv 2405.15757; `models/feature_bank.py`): the UNet's
  self-attention layers also attend to the keys and values of earlier frames' passes kept in
  this stream's own bank (extended self-attention), and the low-resolution layers fuse each
  token with its nearest bank feature when their cosine similarity is at least
  `bank_threshold` (feature fusion, strength `bank_fusion`). The bank keeps `bank_size` entries
  per layer and row key (FIFO), written every `bank_interval`-th frame.
- "both": the two together.

Stream Batch and the bank: a row's bank key is (branch, denoising step, frame of the group),
as the reference implementation's row-wise bank (row j of its Stream Batch call attends to what
row j held in earlier calls). At call c the slot at step j holds frame c - j and reads the bank
of step j, which holds the features of frames c - j - 1, c - j - 2, ... at that same step: each
slot uses the features of frames older than its own, at its own noise level, never those of the
newer frames in the lower slots of the same call (a shared bank would hand a slot's frame
features of up to N - 1 frames in its future, at other noise levels). The unconditional rows of
full and initialize CFG have their own keys (branch "u"). A frame's features go into the bank
when its index is a multiple of `bank_interval`, at every step, in whichever call computes that
step; the primed slots (copies of frame 0 in the first N - 1 calls) neither read nor write it.
So Stream Batch with the bank computes what sequential denoising with the bank computes, frame
by frame (tested). Changing the steps or strength (the schedule), `reset` and `flush` empty
the bank.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import deque
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from streamstudio import kernels
from streamstudio.errors import StreamStudioError
from streamstudio.kernels.reference import CFG_CODES, CFG_FULL, CFG_INITIALIZE, CFG_NONE
from streamstudio.models import feature_bank
from streamstudio.models.image_net import ImageCond, check_bank
from streamstudio.models.loading import SDComponents
from streamstudio.pipelines.live_settings import check_config
from streamstudio.pipelines.similarity_filter import SimilarityFilter, SimilarityFilterConfig

log = logging.getLogger(__name__)

PromptSpec = str | Sequence[tuple[str, float]]


@dataclass
class StreamDiffusionConfig:
    """Settings of one stream. Everything but the size and buffer size can change at run time."""

    width: int = 512
    height: int = 512
    mode: str = "img2img"  # or "txt2img"
    steps: int = 1  # N, used when t_index_list is None
    strength: float = 0.5  # img2img: how far from the input (1.0 = pure noise start)
    t_index_list: list[int] | None = None  # indices into the 50-step LCM schedule
    num_inference_steps: int = 50
    frame_buffer_size: int = 1
    use_denoising_batch: bool = True  # Stream Batch; False = sequential denoising
    cfg_type: str = "self"  # none | self | initialize | full
    guidance_scale: float = 1.2
    delta: float = 1.0
    seed: int = 0
    step_type: str = "auto"  # auto (from the model) | lcm | turbo
    similarity_filter: bool = False
    similarity_threshold: float = 0.98
    max_skip_frame: int = 10
    prompt_blend: str = "linear"  # linear | slerp
    # temporal consistency (see the module docstring): off | feedback | bank | both
    temporal: str = "off"
    feedback_weight: float = 0.3  # latent feedback: the previous output's share of the next input latent
    bank_size: int = 2  # feature bank: past entries kept per layer and denoising step (0: no bank)
    bank_interval: int = 1  # feature bank: a frame's features go in every bank_interval-th frame (FIFO)
    bank_threshold: float = 0.98  # feature fusion: cosine similarity from which a token takes its nearest bank feature
    bank_fusion: float = 0.8  # feature fusion strength (0: extended self-attention only)

    def validate(self) -> "StreamDiffusionConfig":
        for name in ("width", "height"):
            value = getattr(self, name)
            if value < 8 or value % 8:
                raise StreamStudioError(f"{name} must be a positive multiple of 8, got {value}")
        if self.mode not in ("img2img", "txt2img"):
            raise StreamStudioError(f"mode must be img2img or txt2img, got {self.mode!r}")
        if self.step_type not in ("auto", "lcm", "turbo"):
            raise StreamStudioError(f"step_type must be auto, lcm or turbo, got {self.step_type!r}")
        if self.frame_buffer_size < 1:
            raise StreamStudioError("frame_buffer_size must be at least 1")
        if self.t_index_list is None and not 1 <= self.steps <= self.num_inference_steps:
            raise StreamStudioError(f"steps must be between 1 and {self.num_inference_steps}, got {self.steps}")
        check_config(self)  # the live settings' types, ranges and choices (pipelines/live_settings.py)
        if self.prompt_blend not in ("linear", "slerp"):
            raise StreamStudioError(f"prompt_blend must be linear or slerp, got {self.prompt_blend!r}")
        idx = self.resolved_t_index_list()
        if not idx or any(b <= a for a, b in zip(idx, idx[1:])) or idx[0] < 0 or idx[-1] >= self.num_inference_steps:
            raise StreamStudioError(f"t_index_list must be increasing indices in [0, {self.num_inference_steps}), got {idx}")
        return self

    def resolved_t_index_list(self) -> list[int]:
        """The explicit list, or N indices from strength: the first at (1 - strength) * T,
        the rest evenly spaced towards the end of the schedule (txt2img starts at 0)."""
        if self.t_index_list is not None:
            return [int(i) for i in self.t_index_list]
        total, n = self.num_inference_steps, self.steps
        strength = 1.0 if self.mode == "txt2img" else self.strength
        first = min(total - n, int(round((1.0 - strength) * total)))
        return [first + int(round(j * (total - first) / n)) for j in range(n)]

    @property
    def uses_bank(self) -> bool:
        return self.temporal in ("bank", "both") and self.bank_size > 0

    @property
    def uses_feedback(self) -> bool:
        return self.temporal in ("feedback", "both") and self.feedback_weight > 0 and self.mode == "img2img"


@dataclass
class StreamStats:
    calls: int = 0  # network steps (one Stream Batch call, or one whole sequential frame)
    unet_samples: int = 0  # UNet batch rows evaluated
    frames_in: int = 0
    skipped: int = 0  # frames skipped by the similarity filter
    text_encodes: int = 0


class StreamDiffusion:
    """A stream of frames through Stable Diffusion with Stream Batch and residual CFG."""

    def __init__(self, components: SDComponents, config: StreamDiffusionConfig | None = None,
                 prompt: PromptSpec = "", negative_prompt: str = ""):
        self.comps = components
        self.config = (config or StreamDiffusionConfig()).validate()
        self.net = components.net  # the image seam: every UNet and VAE call goes through it
        self.device, self.dtype = self.net.device, self.net.dtype
        self.stats = StreamStats()
        self._host_buffers: dict[str, torch.Tensor] = {}  # pinned staging buffers (GPU only)
        self._embed_cache: dict[str, torch.Tensor] = {}
        from diffusers import LCMScheduler

        self.scheduler = LCMScheduler.from_config(components.scheduler_config)
        self.scheduler.set_timesteps(self.config.num_inference_steps)
        self._negative = self._encode_text(negative_prompt)
        self._prompt_spec: PromptSpec = prompt
        self._text = self._blend(prompt)
        self._filter = SimilarityFilter(SimilarityFilterConfig(self.config.similarity_threshold,
                                                               self.config.max_skip_frame, self.config.seed))
        self._bank: feature_bank.FeatureBank | None = None  # this stream's own feature bank
        self._bank_frame = 0  # the bank's index of the frame (group) now entering
        self._configure_temporal()
        self._make_schedule()

    # ------------------------------------------------------------------ run-time settings
    @property
    def n_steps(self) -> int:
        return len(self._t_index)

    @property
    def latency_frames(self) -> int:
        """Calls between a frame entering and its output leaving (Stream Batch: N - 1)."""
        return self.n_steps - 1 if self.config.use_denoising_batch else 0

    @property
    def step_type(self) -> str:
        return self.comps.step_type if self.config.step_type == "auto" else self.config.step_type

    @property
    def effective_cfg(self) -> int:
        """CFG only does something above guidance 1 (as the reference implementation)."""
        if self.config.guidance_scale <= 1.0:
            return CFG_NONE
        return CFG_CODES[self.config.cfg_type]

    @property
    def skip_rate(self) -> float:
        return self._filter.skip_rate

    def set_prompt(self, prompt: PromptSpec, blend: str | None = None) -> None:
        """A prompt, or [(prompt, weight), ...] blended linearly or by slerp. Only the text
        encoder reruns (and only for prompts it has not seen)."""
        if blend is not None:
            self.config = replace(self.config, prompt_blend=blend).validate()
        self._prompt_spec = prompt
        self._text = self._blend(prompt)

    def set_negative_prompt(self, negative_prompt: str) -> None:
        self._negative = self._encode_text(negative_prompt)

    def update(self, **changes) -> None:
        """Change settings at run time: guidance_scale, delta, cfg_type, strength, steps,
        t_index_list, seed, similarity_filter, similarity_threshold, max_skip_frame,
        prompt_blend, temporal, feedback_weight, bank_size, bank_interval, bank_threshold,
        bank_fusion. Size and frame_buffer_size need a new stream."""
        unknown = set(changes) - set(StreamDiffusionConfig.__dataclass_fields__)
        if unknown:
            raise StreamStudioError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        fixed = {"width", "height", "frame_buffer_size", "num_inference_steps", "mode"} & set(changes)
        if fixed:
            raise StreamStudioError(f"{', '.join(sorted(fixed))} cannot change on a running stream; start a new one")
        if "strength" in changes or "steps" in changes:
            changes.setdefault("t_index_list", None)
        old = self.config
        new = replace(old, **changes).validate()
        if new.uses_bank and not old.uses_bank:
            check_bank(self.net)  # raises for a network without self-attention layers; nothing changed
        self.config = new
        if self.config.resolved_t_index_list() != old.resolved_t_index_list():
            self._make_schedule()
        if self.config.seed != old.seed:
            self._make_noise()
        if self.config.prompt_blend != old.prompt_blend:
            self._text = self._blend(self._prompt_spec)
        self._filter.config = SimilarityFilterConfig(self.config.similarity_threshold, self.config.max_skip_frame,
                                                     self.config.seed)
        self._configure_temporal()

    def _configure_temporal(self) -> None:
        """Make, change or drop the feature bank after a settings change."""
        c = self.config
        if not c.uses_bank:
            self._bank = None  # frees its memory; turning it on again starts empty
            return
        check_bank(self.net)  # a TensorRT engine cannot take a bank: say so now
        if self._bank is None:
            self._bank = feature_bank.FeatureBank(c.bank_size, c.bank_interval, c.bank_threshold, c.bank_fusion)
        else:
            self._bank.configure(c.bank_size, c.bank_interval, c.bank_threshold, c.bank_fusion)

    @property
    def bank(self) -> feature_bank.FeatureBank | None:
        """This stream's feature bank (None when the bank is off)."""
        return self._bank

    def reset(self) -> None:
        """Empty the buffer; the next frame primes it again."""
        self._buffer = None  # (N-1)*k latents at levels 1..N-1
        self._stock = None  # their residual-CFG stock noise
        self._inflight: deque[str] = deque()  # tags of the buffer's slots, newest first
        self._order: deque[str] = deque()  # frame-aligned mode: "R" processed, "C" skipped copy
        self._last_out: list[np.ndarray] | None = None
        self._last_x0_in: torch.Tensor | None = None
        self._last_out_latent: torch.Tensor | None = None  # latent feedback: the last output's x0
        if getattr(self, "_bank", None) is not None:
            self._bank.clear()  # features at the old schedule's levels (or of another clip) are stale
        self._filter.reset()

    # ------------------------------------------------------------------ text
    def _encode_text(self, prompt: str) -> torch.Tensor:
        if not isinstance(prompt, str):
            raise StreamStudioError(f"a prompt must be a string, got {type(prompt).__name__}")
        if prompt in self._embed_cache:
            return self._embed_cache[prompt]
        tok = self.comps.tokenizer
        max_len = tok.model_max_length
        n_tokens = len(tok(prompt, truncation=False)["input_ids"])
        if n_tokens > max_len:
            msg = f"prompt is {n_tokens} tokens; the text encoder takes {max_len}, so it was truncated"
            warnings.warn(msg, stacklevel=3)
            log.warning(msg)
        ids = tok(prompt, padding="max_length", max_length=max_len, truncation=True, return_tensors="pt").input_ids
        with torch.inference_mode():
            embeds = self.comps.text_encoder(ids.to(self.device))[0].to(self.dtype)  # (1, L, D)
        self.stats.text_encodes += 1
        if len(self._embed_cache) > 64:
            self._embed_cache.clear()
        self._embed_cache[prompt] = embeds
        return embeds

    def _blend(self, spec: PromptSpec) -> torch.Tensor:
        if isinstance(spec, str):
            return self._encode_text(spec)
        try:
            pairs = [(p, float(w)) for p, w in spec]
        except (TypeError, ValueError) as exc:
            raise StreamStudioError("a prompt is a string or a list of (prompt, weight) pairs") from exc
        if not pairs or any(w < 0 for _, w in pairs) or sum(w for _, w in pairs) <= 0:
            raise StreamStudioError("a prompt blend needs at least one prompt and non-negative weights with a positive sum")
        embeds = [self._encode_text(p) for p, _ in pairs]
        weights = [w for _, w in pairs]
        if self.config.prompt_blend == "linear":
            total = sum(weights)
            return sum(w / total * e for w, e in zip(weights, embeds))
        out, acc = embeds[0], weights[0]
        for e, w in zip(embeds[1:], weights[1:]):
            if acc + w > 0:
                out = slerp(out, e, w / (acc + w))
            acc += w
        return out

    # ------------------------------------------------------------------ schedule and noise
    def _make_schedule(self) -> None:
        fbs = self.config.frame_buffer_size
        self._t_index = self.config.resolved_t_index_list()
        timesteps = self.scheduler.timesteps[self._t_index].to(torch.long)  # (N,)
        abar = self.scheduler.alphas_cumprod[timesteps].to(torch.float64)  # (N,)
        alpha, beta = abar.sqrt(), (1 - abar).sqrt()
        if self.step_type == "lcm":
            scal = [self.scheduler.get_scalings_for_boundary_condition_discrete(t) for t in timesteps]
            c_skip = torch.tensor([float(s[0]) for s in scal], dtype=torch.float64)
            c_out = torch.tensor([float(s[1]) for s in scal], dtype=torch.float64)
        else:  # sd-turbo: x0 = F
            c_skip, c_out = torch.zeros_like(alpha), torch.ones_like(alpha)
        one = torch.ones(1, dtype=torch.float64)
        coef = torch.stack([alpha, beta, c_skip, c_out, torch.cat([alpha[1:], one]), torch.cat([beta[1:], one])], 1)
        self._timesteps = timesteps.to(self.device)  # (N,)
        self._coef_slots = coef.to(self.device, torch.float32)  # (N, 6)
        self._coef = self._coef_slots.repeat_interleave(fbs, 0)  # (N*k, 6)
        self._t_rows = self._timesteps.repeat_interleave(fbs)  # (N*k,)
        self._levels = [j for j in range(len(self._t_index)) for _ in range(fbs)]  # each row's step
        self._make_noise()
        self.reset()

    def _make_noise(self) -> None:
        k, n = self.config.frame_buffer_size, len(self.config.resolved_t_index_list())
        h, w = self.config.height // self.net.latent_scale, self.config.width // self.net.latent_scale
        self._latent_shape = (self.net.latent_channels, h, w)
        gen = torch.Generator("cpu").manual_seed(self.config.seed)
        self._noise = torch.randn((n * k, *self._latent_shape), generator=gen).to(self.device, self.dtype)  # (N*k, 4, h, w)
        self._noise_next = torch.roll(self._noise, -k, dims=0)  # row of slot j gets slot j+1's noise
        # txt2img draws each frame's noise on the device, from a generator there (no upload per frame)
        self._txt_gen = torch.Generator(self.device).manual_seed(self.config.seed + 1)

    # ------------------------------------------------------------------ networks
    def _unet(self, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, bank_rows=None) -> torch.Tensor:
        """The UNet over rows x; `bank_rows` (feature_bank.BankRows: a key and a write flag per
        row) when the feature bank is on (None: a plain call)."""
        self.stats.unet_samples += x.shape[0]
        return self.net.eps(x, t, ImageCond(text=text), None if bank_rows is None else [(0, bank_rows)])

    def _predict_eps(self, x: torch.Tensor, t: torch.Tensor, coef: torch.Tensor, cfg: int, first_rows: int,
                     slots: Sequence[tuple[int, int]] | None = None):
        """UNet noise predictions for rows x (B, 4, h, w) at timesteps t (B,).

        Returns (eps_text, eps_uncond or None, stock override for the first rows or None).
        `first_rows` > 0 asks for the unconditional pass of the first rows ("initialize").
        `slots`: (denoising step, frame index) of each row, for the feature bank (None: no
        bank). A row's bank key is (branch, step, frame of the group): each slot reads the
        features of earlier frames at its own step, never those of a newer frame (see the
        module docstring); a row writes when its frame's index is due (`FeatureBank.writes`),
        and a primed slot (frame index < 0, a copy of frame 0) neither reads nor writes.
        """
        b = x.shape[0]
        text = self._text.expand(b, -1, -1)
        uncond_first = None
        eps_uncond = None
        k = self.config.frame_buffer_size
        bank = self._bank if slots is not None else None
        cond = None if bank is None else [("c", step, frame, r % k) for r, (step, frame) in enumerate(slots)]

        def uncond(rows: int):
            return [("u", step, frame, r % k) for r, (step, frame) in enumerate(slots[:rows])]

        def unet(x_, t_, text_, rows):  # without a bank: the plain three-argument call
            if rows is None:
                return self._unet(x_, t_, text_)
            keys = tuple(None if frame < 0 else (branch, step, i) for branch, step, frame, i in rows)
            writes = tuple(bank.writes(frame) for _, _, frame, _ in rows)
            return self._unet(x_, t_, text_, feature_bank.BankRows(bank, keys, writes))

        if cfg == CFG_FULL:
            out = unet(torch.cat([x, x]), torch.cat([t, t]),
                       torch.cat([self._negative.expand(b, -1, -1), text]),
                       None if cond is None else uncond(b) + cond)
            eps_uncond, eps_text = out.chunk(2)
            eps_uncond = self._to_eps(eps_uncond, x, coef)
        elif cfg == CFG_INITIALIZE and first_rows:
            n = first_rows
            out = unet(torch.cat([x[:n], x]), torch.cat([t[:n], t]),
                       torch.cat([self._negative.expand(n, -1, -1), text]),
                       None if cond is None else uncond(n) + cond)
            uncond_first, eps_text = self._to_eps(out[:n], x[:n], coef[:n]), out[n:]
        else:
            eps_text = unet(x, t, text, cond)
        return self._to_eps(eps_text, x, coef), eps_uncond, uncond_first

    def _to_eps(self, out: torch.Tensor, x: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        if self.comps.prediction_type != "v_prediction":
            return out
        alpha, beta = coef[:, 0].view(-1, 1, 1, 1), coef[:, 1].view(-1, 1, 1, 1)
        return (alpha * out + beta * x).to(out.dtype)  # eps = alpha * v + beta * x_t

    def _encode(self, images: torch.Tensor) -> torch.Tensor:
        """(k, 3, H, W) in [-1, 1] -> (k, 4, H/8, W/8) scaled latents."""
        return self.net.encode(images.to(self.device, self.dtype))

    def _decode(self, latents: torch.Tensor) -> list[np.ndarray]:
        images = self.net.decode(latents)  # (k, 3, H, W)
        return list(self._download(kernels.postprocess(images)))  # k x (H, W, 3) uint8

    # ------------------------------------------------------------------ host <-> device
    # A frame's one host-device sync is the download of its output (a frame the similarity
    # filter skips: the read of its similarity). On a GPU, frames go up through a pinned staging
    # buffer (an asynchronous DMA) and come down through another. Every frame ends in that sync,
    # so the staging buffer's last upload has finished by the time the next frame refills it.
    def _upload(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 (k, H, W, C) on the host -> the same on the device."""
        if self.device.type != "cuda":
            return frames.to(self.device)
        staging = self._pinned("up", frames.shape)
        staging.copy_(frames)
        return staging.to(self.device, non_blocking=True)

    def _download(self, frames: torch.Tensor) -> np.ndarray:
        """uint8 (k, H, W, 3) on the device -> numpy on the host (the frame's one sync)."""
        if self.device.type != "cuda":
            return frames.numpy()
        host = self._pinned("down", frames.shape)
        host.copy_(frames, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return host.numpy().copy()  # the pinned buffer is reused by the next frame

    def _pinned(self, name: str, shape: torch.Size) -> torch.Tensor:
        buf = self._host_buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
            self._host_buffers[name] = buf
        return buf

    # ------------------------------------------------------------------ denoising
    def _first_level(self, x0_in: torch.Tensor | None) -> torch.Tensor:
        """The frame's latents at level 0: img2img noises the input, txt2img draws noise."""
        k = self.config.frame_buffer_size
        if x0_in is None:
            return torch.randn((k, *self._latent_shape), generator=self._txt_gen, device=self.device,
                               dtype=self.dtype)
        alpha, beta = self._coef_slots[0, 0].to(self.dtype), self._coef_slots[0, 1].to(self.dtype)
        return alpha * x0_in + beta * self._noise[:k]

    def _step(self, x, stock, coef, t, noise_next, first_rows, slots=None):
        cfg = self.effective_cfg
        eps_text, eps_uncond, uncond_first = self._predict_eps(x, t, coef, cfg, first_rows, slots)
        if uncond_first is not None:
            stock = torch.cat([uncond_first, stock[first_rows:]])
        return kernels.stream_step(x, eps_text, eps_uncond, stock, noise_next, coef,
                                   self.config.guidance_scale, self.config.delta, cfg)

    def _trajectory(self, x: torch.Tensor, last: int, bank: bool = True) -> tuple[torch.Tensor, list, list]:
        """Sequential denoising of one group of k frames through steps 0..last (bank: with the
        feature bank when it is on). Returns the x0 of step `last` and the (x, stock) states
        entering steps 1..last+1."""
        k, n = self.config.frame_buffer_size, self.n_steps
        stock = self._noise[:k]
        xs, stocks = [], []
        for j in range(last + 1):
            coef = self._coef_slots[j:j + 1].expand(k, -1)
            t = self._timesteps[j:j + 1].expand(k)
            noise_next = self._noise[((j + 1) % n) * k:((j + 1) % n + 1) * k]
            x0, x, stock = self._step(x, stock, coef, t, noise_next, first_rows=k if j == 0 else 0,
                                      slots=[(j, self._bank_frame)] * k if bank else None)
            xs.append(x)
            stocks.append(stock)
        return x0, xs, stocks

    def _batch_call(self, x_first: torch.Tensor) -> torch.Tensor:
        """One Stream Batch call: every slot advances one step; returns the last slot's x0."""
        k = self.config.frame_buffer_size
        if self._buffer is None:
            self._prime(x_first)
        x = torch.cat([x_first, self._buffer])  # (N*k, 4, h, w)
        stock = torch.cat([self._noise[:k], self._stock])
        slots = [(j, self._bank_frame - j) for j in self._levels]  # slot j holds the frame that came j calls ago
        x0, x_next, stock_next = self._step(x, stock, self._coef, self._t_rows, self._noise_next, first_rows=k,
                                            slots=slots)
        self._buffer, self._stock = x_next[:-k], stock_next[:-k]
        return x0[-k:]

    def _prime(self, x_first: torch.Tensor) -> None:
        """Fill slots 1..N-1 with the first frame's own trajectory (no empty-buffer frames)."""
        n = self.n_steps
        # without the bank: the primed slots are frame 0 again, and the bank starts with the first call
        _, xs, stocks = self._trajectory(x_first, n - 2, bank=False)
        self._buffer = torch.cat(xs)  # slots 1..N-1
        self._stock = torch.cat(stocks)
        self._inflight = deque("P" * (n - 1))

    @torch.inference_mode()
    def _advance(self, x0_in: torch.Tensor | None, tag: str) -> tuple[torch.Tensor, str]:
        """Put one group of frames in; returns the group that comes out and its tag."""
        self.stats.calls += 1
        self._bank_frame = self._bank.next_frame() if self._bank is not None else 0
        x_first = self._first_level(x0_in)
        if not self.config.use_denoising_batch or self.n_steps == 1:
            out, _, _ = self._trajectory(x_first, self.n_steps - 1)
        else:
            out = self._batch_call(x_first)
            self._inflight.appendleft(tag)
            tag = self._inflight.pop()
        self._last_out_latent = out  # latent feedback: blended into the next input
        return out, tag

    # ------------------------------------------------------------------ frames in and out
    def _input_latents(self, image) -> tuple[torch.Tensor | None, bool]:
        """Convert the input; returns (latents or None for txt2img, skipped by the filter)."""
        if self.config.mode == "txt2img":
            if image is not None:
                raise StreamStudioError("this stream is txt2img; it takes no input image")
            return None, False
        if image is None:
            raise StreamStudioError("this stream is img2img; give it an image")
        frames = to_frames(image, self.config.frame_buffer_size)  # (k, H, W, 3) uint8
        x = kernels.preprocess(self._upload(frames), self.config.height, self.config.width, self.dtype)
        self.stats.frames_in += x.shape[0]
        if self.config.similarity_filter and self._last_out is not None and self._filter.should_skip(x):
            self.stats.skipped += x.shape[0]
            return None, True
        if self.config.similarity_filter and self._last_out is None:
            self._filter.should_skip(x)  # records the first processed input
        with torch.inference_mode():
            latents = self._encode(x)
            self._last_x0_in = latents
            if self.config.uses_feedback and self._last_out_latent is not None:
                w = self.config.feedback_weight  # latent feedback: the last output's x0 pulls the input towards it
                latents = (1.0 - w) * latents + w * self._last_out_latent.to(latents.dtype)
        return latents, False

    def __call__(self, image=None) -> np.ndarray | list[np.ndarray]:
        """Live mode: put a frame in (None for txt2img) and get the latest output frame
        (a list of k frames when frame_buffer_size k > 1)."""
        latents, skipped = self._input_latents(image)
        if not skipped:
            out, _ = self._advance(latents, "L")
            with torch.inference_mode():
                self._last_out = self._decode(out)
        return self._last_out[0] if len(self._last_out) == 1 else list(self._last_out)

    def push(self, image=None) -> list[np.ndarray]:
        """Frame-aligned mode: put a frame in; get the outputs of the inputs that finished,
        in input order (none for the first N-1 calls; see `flush`)."""
        latents, skipped = self._input_latents(image)
        if skipped:
            if not self._order:
                return [f.copy() for f in self._last_out]
            self._order.append("C")
            return []
        self._order.append("R")
        out, tag = self._advance(latents, "R")
        return self._emit(out) if tag == "R" else []

    def flush(self) -> list[np.ndarray]:
        """Push out every frame still in the buffer (feeding the last input again), then reset."""
        results: list[np.ndarray] = []
        while "R" in self._inflight:
            x_in = self._last_x0_in if self.config.mode == "img2img" else None
            out, tag = self._advance(x_in, "D")
            if tag == "R":
                results += self._emit(out)
        while self._order:  # copies after the last processed frame
            self._order.popleft()
            results += [f.copy() for f in self._last_out]
        self.reset()
        return results

    def _emit(self, out: torch.Tensor) -> list[np.ndarray]:
        with torch.inference_mode():
            self._last_out = self._decode(out)
        assert self._order and self._order[0] == "R", "frame order out of step"
        self._order.popleft()
        results = list(self._last_out)
        while self._order and self._order[0] == "C":
            self._order.popleft()
            results += [f.copy() for f in self._last_out]
        return results

    def generate(self, count: int) -> list[np.ndarray]:
        """txt2img: `count` new images (frame-aligned, flushed at the end)."""
        images: list[np.ndarray] = []
        calls = math.ceil(count / self.config.frame_buffer_size)
        for _ in range(calls):
            images += self.push(None)
        images += self.flush()
        return images[:count]


def slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation of token embeddings (..., D), per token; linear when parallel."""
    a32, b32 = a.float(), b.float()
    an = a32 / a32.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    bn = b32 / b32.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    dot = (an * bn).sum(-1, keepdim=True).clamp(-1.0, 1.0)
    omega = torch.arccos(dot)
    so = torch.sin(omega)
    linear = so.abs() < 1e-4
    safe = torch.where(linear, torch.ones_like(so), so)
    wa = torch.where(linear, 1.0 - t, torch.sin((1.0 - t) * omega) / safe)
    wb = torch.where(linear, torch.full_like(so, t), torch.sin(t * omega) / safe)
    return (wa * a32 + wb * b32).to(a.dtype)


def to_frames(image, count: int = 1) -> torch.Tensor:
    """Any supported image(s) -> uint8 (count, H, W, 3) RGB, or (count, H, W, 4) RGBA when one
    of them has alpha (the preprocess kernel composites it on black).

    Takes numpy arrays (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) of uint8 or floats in [0, 1],
    PIL images, uint8 torch tensors (H, W, C), or a list of `count` of these.
    """
    items = list(image) if isinstance(image, (list, tuple)) else [image]
    if len(items) != count:
        raise StreamStudioError(f"expected {count} frame(s) per call (frame_buffer_size), got {len(items)}")
    frames = [_one_frame(item) for item in items]
    if len({f.shape[2] for f in frames}) > 1:  # RGB beside RGBA: opaque alpha for the RGB ones
        frames = [f if f.shape[2] == 4 else np.dstack([f, np.full(f.shape[:2], 255, np.uint8)]) for f in frames]
    if len({f.shape for f in frames}) > 1:
        raise StreamStudioError("all frames of one call must have the same size")
    return torch.from_numpy(np.stack(frames))


def _one_frame(image) -> np.ndarray:
    try:
        from PIL import Image

        if isinstance(image, Image.Image):
            image = np.asarray(image.convert("RGBA" if "A" in image.getbands() else "RGB"))
    except ImportError:  # pragma: no cover
        pass
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu().numpy()
    if not isinstance(image, np.ndarray):
        raise StreamStudioError(f"expected an image (numpy array, PIL image or tensor), got {type(image).__name__}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise StreamStudioError(f"expected an image of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got {image.shape}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise StreamStudioError(f"the image is empty (shape {image.shape})")
    if image.dtype != np.uint8:
        if not np.issubdtype(image.dtype, np.floating):
            raise StreamStudioError(f"expected uint8 pixels (or floats in [0, 1]), got {image.dtype}")
        if not np.isfinite(image).all() or image.min() < 0.0 or image.max() > 1.0:
            raise StreamStudioError("float images must be finite and in [0, 1]")
        image = (image * 255.0).round().astype(np.uint8)
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image)  # RGBA stays: the preprocess kernel composites it on black
