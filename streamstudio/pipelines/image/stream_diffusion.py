"""StreamDiffusion (arXiv 2312.12491) on diffusers components.

Three parts, as the video pipeline: the Stream Batch sampler (`pipelines/image/stream_batch.py`:
schedule coefficients, noise, buffer and priming, one step with residual CFG), the prompt
encoder (`pipelines/image/prompt_encoder.py`: encoding, cache, blends, and the stream's prompts as its
UNet calls' conditions), and here the frame API (`StreamDiffusionConfig`, `StreamDiffusion`:
frames in and out, the similarity filter, temporal consistency, run-time settings), which moves
frames between host and device and through the VAE with `pipelines/image/frame_io.py`. Every network
call goes through the image seam (`models/image/image_net.py`); the LCM arithmetic is the
scheduler's (diffusers' LCMScheduler).

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
- feature bank ("bank", StreamV2V, arXiv 2405.15757; `models/image/feature_bank.py`): the UNet's
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

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from diffusers import LCMScheduler

from streamstudio import kernels
from streamstudio.errors import StreamStudioError
from streamstudio.frames import ImagesLike, to_frames
from streamstudio.kernels.reference import CFG_CODES, CFG_NONE
from streamstudio.models.image import feature_bank
from streamstudio.models.image.image_net import ImageNet, check_bank
from streamstudio.models.image.components import SDComponents
from streamstudio.pipelines.image.addons import ADDON_SETTINGS, StreamAddOns
from streamstudio.pipelines.image.control import ControlInputs
from streamstudio.pipelines.live_settings import check_config, defaults
from streamstudio.pipelines.image.frame_io import FrameIO
from streamstudio.pipelines.image.prompt_encoder import PromptEncoder, PromptSpec, StreamPrompts
from streamstudio.pipelines.image.similarity_filter import SimilarityFilter, SimilarityFilterConfig
from streamstudio.pipelines.image.stream_batch import PRIMED, Guidance, Schedule, StreamBatchSampler


_TABLE = defaults()  # the live settings' defaults (pipelines/live_settings.py), declared there once


@dataclass
class StreamDiffusionConfig:
    """Settings of one stream. Everything but the size and buffer size can change at run time.
    A live setting's default is the settings table's (the CLI's and the Live tab's too)."""

    width: int = 512
    height: int = 512
    mode: str = "img2img"  # or "txt2img"
    steps: int = 1  # N, used when t_index_list is None
    strength: float = _TABLE["strength"]  # img2img: how far from the input (1.0 = pure noise start)
    t_index_list: list[int] | None = None  # indices into the 50-step LCM schedule
    num_inference_steps: int = 50
    frame_buffer_size: int = 1
    use_denoising_batch: bool = True  # Stream Batch; False = sequential denoising
    cfg_type: str = _TABLE["cfg_type"]  # none | self | initialize | full
    guidance_scale: float = _TABLE["guidance_scale"]
    delta: float = _TABLE["delta"]
    seed: int = _TABLE["seed"]
    step_type: str = "auto"  # auto (from the model) | lcm | turbo
    similarity_filter: bool = _TABLE["similarity_filter"]
    similarity_threshold: float = _TABLE["similarity_threshold"]
    max_skip_frame: int = _TABLE["max_skip_frame"]
    prompt_blend: str = "linear"  # linear | slerp
    # temporal consistency (see the module docstring): off | feedback | bank | both. Latent feedback:
    # the previous output's share of the next input latent. Feature bank: past entries kept per layer
    # and denoising step (0: no bank), a frame's features going in every bank_interval-th frame (FIFO);
    # feature fusion from a cosine similarity of bank_threshold (a token takes its nearest bank
    # feature), at strength bank_fusion (0: extended self-attention only).
    temporal: str = _TABLE["temporal"]
    feedback_weight: float = _TABLE["feedback_weight"]
    bank_size: int = _TABLE["bank_size"]
    bank_interval: int = _TABLE["bank_interval"]
    bank_threshold: float = _TABLE["bank_threshold"]
    bank_fusion: float = _TABLE["bank_fusion"]

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
            raise StreamStudioError(f"t_index_list must be increasing indices in [0, {self.num_inference_steps}), "
                                    f"got {idx}")
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

    @property
    def effective_cfg(self) -> int:
        """CFG only does something above guidance 1 (as the reference implementation)."""
        if self.guidance_scale <= 1.0:
            return CFG_NONE
        return CFG_CODES[self.cfg_type]


def _bank_for(c: StreamDiffusionConfig, net: ImageNet,
              bank: feature_bank.FeatureBank | None) -> feature_bank.FeatureBank | None:
    """The feature bank after a settings change: made, `bank` changed, or dropped (None)."""
    if not c.uses_bank:
        return None  # frees its memory; turning it on again starts empty
    check_bank(net)  # a TensorRT engine cannot take a bank: say so now
    if bank is None:
        return feature_bank.FeatureBank(c.bank_size, c.bank_interval, c.bank_threshold, c.bank_fusion)
    bank.configure(c.bank_size, c.bank_interval, c.bank_threshold, c.bank_fusion)
    return bank


@dataclass
class StreamStats:
    calls: int = 0  # network steps (one Stream Batch call, or one whole sequential frame)
    unet_samples: int = 0  # UNet batch rows evaluated
    frames_in: int = 0
    skipped: int = 0  # frames skipped by the similarity filter
    text_encodes: int = 0


class StreamDiffusion:
    """A stream of frames through Stable Diffusion with Stream Batch and residual CFG: the
    frame API over the stream's prompts (`prompts`, `pipelines/image/prompt_encoder.py`), its frame
    transfers and VAE (`io`, `pipelines/image/frame_io.py`) and a Stream Batch sampler (`sampler`,
    `pipelines/image/stream_batch.py`; its `bank`, the feature bank, None when off). Input frames get
    integer ids in arrival order; the sampler says whose output leaves, so `push`/`flush` hand
    outputs back in input order."""

    def __init__(self, components: SDComponents, config: StreamDiffusionConfig | None = None,
                 prompt: PromptSpec = "", negative_prompt: str = "", control: ControlInputs | None = None):
        self.comps = components
        self.config = (config or StreamDiffusionConfig()).validate()
        self.net = components.net  # the image seam: every UNet and VAE call goes through it
        self.device, self.dtype = self.net.device, self.net.dtype
        self.stats = StreamStats()
        self.io = FrameIO(self.net)  # frames up and down, the VAE
        c = self.config  # the add-ons' state of this stream (ControlNets, IP-Adapter, LoRA text version)
        self.addons = StreamAddOns(components, c.mode, c.height, c.width, c.frame_buffer_size, self.device,
                                   self.dtype, control)
        self._fields: dict | None = None  # the last input group's frame fields (ControlNet images)
        self.scheduler = LCMScheduler.from_config(components.scheduler_config)
        self.scheduler.set_timesteps(self.config.num_inference_steps)
        encoder = PromptEncoder(components.tokenizer, components.text_encoder, self.device, self.dtype,
                                components.tokenizer_2, components.text_encoder_2)
        self.prompts = StreamPrompts(encoder, self.addons, self.stats, prompt, negative_prompt, c.prompt_blend)
        self._filter = SimilarityFilter(SimilarityFilterConfig(self.config.similarity_threshold,
                                                               self.config.max_skip_frame, self.config.seed))
        self.sampler: StreamBatchSampler  # (made by _make_sampler)
        self._make_sampler(bank=None)

    # ------------------------------------------------------------------ run-time settings
    @property
    def n_steps(self) -> int:
        """The steps in use (`config.resolved_t_index_list()`: indices into the LCM schedule)."""
        return len(self.config.resolved_t_index_list())

    @property
    def latency_frames(self) -> int:
        """Calls between a frame entering and its output leaving (Stream Batch: N - 1)."""
        return self.n_steps - 1 if self.config.use_denoising_batch else 0

    @property
    def step_type(self) -> str:
        return self.comps.step_type if self.config.step_type == "auto" else self.config.step_type

    @property
    def skip_rate(self) -> float:
        return self._filter.skip_rate

    def set_prompt(self, prompt: PromptSpec, blend: str | None = None) -> None:
        """A prompt, or [(prompt, weight), ...] blended linearly or by slerp. Only the text
        encoder reruns (and only for prompts it has not seen)."""
        if blend is not None:
            self.config = replace(self.config, prompt_blend=blend).validate()
        self.prompts.set_prompt(prompt, self.config.prompt_blend)

    def set_negative_prompt(self, negative_prompt: str) -> None:
        self.prompts.set_negative(negative_prompt)

    def update(self, **changes: Any) -> None:
        """Change settings at run time: guidance_scale, delta, cfg_type, strength, steps,
        t_index_list, seed, similarity_filter, similarity_threshold, max_skip_frame,
        prompt_blend, temporal, feedback_weight, bank_size, bank_interval, bank_threshold,
        bank_fusion; and the model's add-ons: control_scales (one per ControlNet), ip_adapter_scale,
        lora_scales ({name or source: scale}). Size and frame_buffer_size need a new stream."""
        addons = {k: changes.pop(k) for k in ADDON_SETTINGS if k in changes}
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
        if (new.resolved_t_index_list() != old.resolved_t_index_list()
                or new.use_denoising_batch != old.use_denoising_batch):
            self._make_sampler(self.sampler.bank)
        elif new.seed != old.seed:
            self.sampler.reseed(new.seed)
        if new.prompt_blend != old.prompt_blend:
            self.prompts.set_prompt(self.prompts.spec, new.prompt_blend)
        self._filter.config = SimilarityFilterConfig(new.similarity_threshold, new.max_skip_frame, new.seed)
        self.sampler.bank = _bank_for(new, self.net, self.sampler.bank)
        self.addons.update(**addons)
        self.prompts.refresh(new.prompt_blend)  # a LoRA scale that changed the text encoders: the prompts again, now

    def _make_sampler(self, bank: feature_bank.FeatureBank | None) -> None:
        """A sampler for the config's steps (its buffer starts empty), with the feature bank `bank`
        (the old sampler's) changed to the config's."""
        c, scale = self.config, self.net.latent_scale
        schedule = Schedule.lcm(self.scheduler, c.resolved_t_index_list(), self.step_type, self.device)
        self.sampler = StreamBatchSampler(
            self.net, schedule, frames=c.frame_buffer_size, stream_batch=c.use_denoising_batch,
            latent_shape=(self.net.latent_channels, c.height // scale, c.width // scale), seed=c.seed,
            v_prediction=self.comps.prediction_type == "v_prediction")
        self.sampler.bank = _bank_for(c, self.net, bank)
        self.reset()

    def reset(self) -> None:
        """Empty the buffer and the feature bank; the next frame primes the buffer again."""
        self.sampler.reset()
        self._next_id = 0  # the id the next input frame (group) gets
        self._waiting: deque[int] = deque()  # frame-aligned mode: ids of the processed inputs not yet out
        self._copies: dict[int, int] = {}  # id -> inputs after it that the filter skipped (they get its output)
        self._last_out: list[np.ndarray] | None = None
        self._last_x0_in: torch.Tensor | None = None
        self._last_out_latent: torch.Tensor | None = None  # latent feedback: the last output's x0
        self._filter.reset()

    # ------------------------------------------------------------------ frames in and out
    def _advance(self, x0_in: torch.Tensor | None, group: int) -> tuple[torch.Tensor, int]:
        """One sampler call; returns the x0 latents that leave and their group's id."""
        self.stats.calls += 1
        before = self.sampler.unet_rows
        self.prompts.refresh(self.config.prompt_blend)
        guidance = Guidance(self.prompts.cond(False), self.prompts.cond(True),
                            self.config.effective_cfg, self.config.guidance_scale, self.config.delta)
        out, group = self.sampler.advance(x0_in, group, guidance, self._fields)
        self.stats.unet_samples += self.sampler.unet_rows - before
        self._last_out_latent = out  # latent feedback: blended into the next input
        return out, group

    def filter_input(self, image: ImagesLike) -> torch.Tensor:
        """`image` preprocessed as the pipeline takes it in: (k, 3, H, W) in [-1, 1], what the
        similarity filter compares (a replay of the filter over earlier frames feeds it this)."""
        frames = to_frames(image, self.config.frame_buffer_size)  # (k, H, W, 3) uint8
        return kernels.preprocess(self.io.upload(frames), self.config.height, self.config.width, self.dtype)

    def resume_filter(self, state: SimilarityFilter) -> None:
        """Continue from a similarity filter replayed elsewhere: a segment of a longer file
        starts with the filter where the whole-file run has it (app/batch/segments.py)."""
        self._filter = state

    def _input_latents(self, image: ImagesLike | None) -> tuple[torch.Tensor | None, bool]:
        """Convert the input; returns (latents or None for txt2img, skipped by the filter)."""
        if self.config.mode == "txt2img":
            if image is not None:
                raise StreamStudioError("this stream is txt2img; it takes no input image")
            self.addons.check_ready()
            self._fields = self.addons.picture
            return None, False
        if image is None:
            raise StreamStudioError("this stream is img2img; give it an image")
        x = self.filter_input(image)
        self.stats.frames_in += x.shape[0]
        if self.config.similarity_filter and self._last_out is not None and self._filter.should_skip(x):
            self.stats.skipped += x.shape[0]
            return None, True
        if self.config.similarity_filter and self._last_out is None:
            self._filter.should_skip(x)  # records the first processed input
        with torch.inference_mode():
            self._fields = self.addons.frame_fields(x)  # once per input group; the group's slots reuse them
            latents = self.io.encode(x)
            self._last_x0_in = latents
            if self.config.uses_feedback and self._last_out_latent is not None:
                w = self.config.feedback_weight  # latent feedback: the last output's x0 pulls the input towards it
                latents = (1.0 - w) * latents + w * self._last_out_latent.to(latents.dtype)
        return latents, False

    def __call__(self, image: ImagesLike | None = None) -> np.ndarray | list[np.ndarray]:
        """Live mode: put a frame in (None for txt2img) and get the latest output frame
        (a list of k frames when frame_buffer_size k > 1)."""
        latents, skipped = self._input_latents(image)
        if not skipped:
            out, _ = self._advance(latents, PRIMED)  # live outputs are not matched to inputs
            with torch.inference_mode():
                self._last_out = self.io.decode(out)
        last = self._last_out
        assert last is not None  # (the filter skips a frame only after an output)
        return last[0] if len(last) == 1 else list(last)

    def push(self, image: ImagesLike | None = None) -> list[np.ndarray]:
        """Frame-aligned mode: put a frame in; get the outputs of the inputs that finished,
        in input order (none for the first N-1 calls; see `flush`)."""
        latents, skipped = self._input_latents(image)
        if skipped:
            if not self._waiting:  # every earlier input is out: this one is a copy of the last output
                assert self._last_out is not None  # (the filter skips a frame only after an output)
                return [f.copy() for f in self._last_out]
            self._copies[self._waiting[-1]] = self._copies.get(self._waiting[-1], 0) + 1
            return []
        group, self._next_id = self._next_id, self._next_id + 1
        self._waiting.append(group)
        out, done = self._advance(latents, group)
        return self._emit(out, done) if done != PRIMED else []

    def flush(self) -> list[np.ndarray]:
        """Push out every frame still in the buffer (feeding the last input again), then reset."""
        results: list[np.ndarray] = []
        while self.sampler.in_flight:
            x_in = self._last_x0_in if self.config.mode == "img2img" else None
            out, done = self._advance(x_in, PRIMED)  # a filler: its own output is never emitted
            if done != PRIMED:
                results += self._emit(out, done)
        self.reset()
        return results

    def _emit(self, out: torch.Tensor, group: int) -> list[np.ndarray]:
        """The outputs of input `group` (and of the skipped inputs after it), decoded."""
        with torch.inference_mode():
            self._last_out = self.io.decode(out)
        assert self._waiting and self._waiting[0] == group, "frame order out of step"
        self._waiting.popleft()
        copies = self._copies.pop(group, 0)
        return list(self._last_out) + [f.copy() for _ in range(copies) for f in self._last_out]

    def generate(self, count: int) -> list[np.ndarray]:
        """txt2img: `count` new images (frame-aligned, flushed at the end)."""
        images: list[np.ndarray] = []
        calls = math.ceil(count / self.config.frame_buffer_size)
        for _ in range(calls):
            images += self.push(None)
        images += self.flush()
        return images[:count]
