"""Causal streaming video (issue 49): the chunk-by-chunk sampling of CausVid, Self-Forcing and
StreamDiffusionV2 over a block-causal network with a KV cache (`models/video/causal_backbone.py`).

A chunk of c latent frames is made in a few distilled steps at the checkpoint's own timesteps
(Self-Forcing: 1000, 750, 500, 250 warped through its flow shift 5; CausVid: 1000, 757, 522 with
shift 8), each step predicting the clean chunk x0 = x - sigma(t) * output and noising it again to
the next step's sigma with fresh noise; then one more call at the context timestep (0: the clean
chunk) writes the chunk's keys and values into the cache, where every later chunk reads them
(StreamDiffusionV2 skips that call and keeps the last step's). Sigma of a timestep is the
references' table: 1000 training sigmas linspace(1, 0, 1001)[:-1] through the shift
s' = shift s / (1 + (shift - 1) s), the entry nearest the timestep (their FlowMatchScheduler).

- The cache holds `window` frames: `sink` first frames never dropped, then the newest
  (models/video/causal_wan.py `KVCache`); memory per stream is fixed when it starts
  (`CausalSampler.cache_bytes`).
- Text changes mid-stream re-cache (LongLive's KV re-cache): the frames in the cache are run
  through the context call again under the new prompt, so what later chunks read agrees with it.
- Video-to-video (StreamDiffusionV2's): each input chunk's latents are noised to `strength`
  (sigma) and sampled from the first step whose timestep is 1000 * strength - 100 on (half the
  level below strength 0.2, where that would reach 0); with
  `motion_aware` the strength follows the input's motion (more motion, less noise):
  sigma <- 0.9 (strength - 0.1 m) + 0.1 sigma, m = the largest per-frame RMS change / 0.2, in [0, 1].

No I/O and no threads here; `CausalVideoStream` is the frame-in / frame-out API, as
`pipelines/video/stream_video.py`'s `VideoStream` is for the StreamDiT buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from streamstudio import kernels
from streamstudio.errors import StreamStudioError
from streamstudio.models.video.causal_backbone import CausalWanBackbone
from streamstudio.models.video.causal_wan import CausalText, KVCache
from streamstudio.models.video.video_net import PixelCodec, VideoCodec
from streamstudio.pipelines.video.stream_video import ChunkDecoder, StreamOutput, to_uint8

V2V_STEP_OFFSET = 100  # StreamDiffusionV2: the first step's timestep is 1000 * sigma - 100


@dataclass
class CausalConfig:
    chunk_frames: int = 3  # latent frames a chunk (the references' num_frame_per_block)
    first_chunk_frames: int | None = None  # the first chunk's (None: chunk_frames; StreamDiffusionV2: 2)
    steps: tuple[float, ...] = (1000.0, 750.0, 500.0, 250.0)  # the distilled timesteps (Wan's units)
    warp: bool = True  # map the steps through the shifted table (Self-Forcing's warp_denoising_step)
    shift: float = 5.0  # flow shift of the table (Self-Forcing 5, CausVid and StreamDiffusionV2 8)
    context_t: float | None = 0.0  # timestep of the call that caches a finished chunk (None: no call)
    window: int = 21  # latent frames the cache holds, the chunk being made included
    sink: int = 0  # first frames the cache never drops
    strength: float = 1.0  # video-to-video: the input's noise level (sigma); 1 = text-to-video
    motion_aware: bool = False  # video-to-video: the noise level follows the input's motion
    recache: bool = True  # a new prompt re-runs the cached frames under it
    # classifier-free guidance against the empty prompt (1 = none: the distilled checkpoints have it
    # built in); otherwise the cache holds two rows, the prompt's and the empty prompt's, and every
    # call runs both (a checkpoint trained with caption dropout: the built-in causal model)
    guidance: float = 1.0
    # the first chunk's guidance (None: `guidance`): the chunk made from the prompt alone, where the
    # object and its direction are settled; later chunks read it from the cache
    first_guidance: float | None = None
    seed: int = 0

    @property
    def guided(self) -> bool:
        """Whether any chunk is guided (the cache then holds the empty prompt's row too)."""
        return self.guidance != 1 or self.first_guidance not in (None, 1)

    def validate(self) -> None:
        if self.chunk_frames < 1:
            raise StreamStudioError(f"chunk_frames must be >= 1, got {self.chunk_frames}")
        if not self.steps or any(not 0 < s <= 1000 for s in self.steps):
            raise StreamStudioError(f"steps must be timesteps in (0, 1000], got {list(self.steps)}")
        if list(self.steps) != sorted(self.steps, reverse=True):
            raise StreamStudioError(f"steps must go down from noise to data, got {list(self.steps)}")
        if self.first_chunk_frames is not None and self.first_chunk_frames < 1:
            raise StreamStudioError(f"first_chunk_frames must be >= 1, got {self.first_chunk_frames}")
        if self.sink < 0 or self.window < self.sink + max(self.chunk_frames, self.first_chunk_frames or 0):
            raise StreamStudioError(f"the window ({self.window} frames) must hold the sink ({self.sink}) and a "
                                    f"chunk ({self.chunk_frames})")
        if not 0 < self.strength <= 1:
            raise StreamStudioError(f"strength must be in (0, 1], got {self.strength}")
        if self.guidance < 0 or (self.first_guidance is not None and self.first_guidance < 0):
            raise StreamStudioError(f"guidance must be >= 0 (1 = none), got {self.guidance} "
                                    f"(first chunk: {self.first_guidance})")


class FlowTable:
    """The references' FlowMatchScheduler(shift, sigma_min=0, extra_one_step=True) at 1000 steps:
    sigma and timestep of each training step, and the nearest entry of a timestep."""

    def __init__(self, shift: float):
        s = torch.linspace(1.0, 0.0, 1001)[:-1]  # float32, as theirs
        self.sigmas = shift * s / (1 + (shift - 1) * s)  # (1000,)
        self.timesteps = self.sigmas * 1000

    def warp(self, step: float) -> float:
        """A step of the checkpoint's list on the shifted table (Self-Forcing's warp_denoising_step)."""
        table = torch.cat([self.timesteps, torch.zeros(1)])
        return float(table[1000 - int(step)])

    def sigma(self, timestep: float) -> float:
        i = int(torch.argmin((self.timesteps.double() - float(timestep)).abs()))
        return float(self.sigmas[i])


def chunk_noise(seed: int, chunk: int, step: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The noise of one chunk at one step: a function of (seed, chunk, step) only."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + chunk) * 64 + step)
    return torch.randn(shape, generator=gen)


def denoise(call: Callable[[torch.Tensor, float], torch.Tensor], x: torch.Tensor, steps: list[float],
            table: FlowTable, noise: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """Chunk latents x (any leading shape) at steps[0] -> their clean latents: at each step the
    network's output `call(x, t)` (noise - data) gives x0 = x - sigma(t) output, noised again to the
    next step's sigma with `noise(step)`."""
    x0 = x
    for i, ts in enumerate(steps):
        out = call(x, ts)
        x0 = (x.double() - table.sigma(ts) * out.double()).to(x.dtype)
        if i + 1 < len(steps):
            sigma = table.sigma(steps[i + 1])
            x = ((1 - sigma) * x0 + sigma * noise(i + 1).to(x.device, x.dtype)).to(x.dtype)
    return x0


class CausalSampler:
    """Chunks one after another. `chunk()` makes the next text-to-video chunk, `chunk(latents)` the
    next video-to-video one; both return the clean latents (c, C, h, w)."""

    def __init__(self, backbone: CausalWanBackbone, cfg: CausalConfig, latent_shape: tuple[int, int, int],
                 prompt: str = "", noise_fn: Callable[[int, int], torch.Tensor] | None = None,
                 cache: KVCache | None = None):
        cfg.validate()
        self.backbone, self.cfg, self.shape = backbone, cfg, tuple(latent_shape)  # (C, h, w)
        self.device, self.dtype = backbone.device, backbone.dtype
        self.noise_fn = noise_fn or (lambda chunk, step: chunk_noise(cfg.seed, chunk, step,
                                                                     (self.frames_of(chunk), *self.shape)))
        self.table = FlowTable(cfg.shift)
        self.steps = [self.table.warp(s) if cfg.warp else float(s) for s in cfg.steps]
        # (a row of a `CausalBatch`'s cache when it batches this stream with others; two rows with guidance)
        rows = 2 if cfg.guided else 1
        self.cache = cache or backbone.new_cache(cfg.window, cfg.sink, self.shape[1], self.shape[2], batch=rows)
        self._empty = None if rows == 1 else backbone.encode_text("")
        self.text = self._condition(prompt)
        self.prompt = prompt
        self.kept: list[torch.Tensor] = []  # the clean latents of the cached frames (re-cache)
        self.chunks = 0  # chunks made
        self.calls = 0  # network calls
        self.sigma = cfg.strength  # video-to-video: the noise level now (motion-aware moves it)

    def frames_of(self, chunk: int) -> int:
        """Latent frames of chunk number `chunk` (the first may have its own count)."""
        if chunk == 0 and self.cfg.first_chunk_frames:
            return self.cfg.first_chunk_frames
        return self.cfg.chunk_frames

    @property
    def cache_bytes(self) -> int:
        """The stream's fixed memory for its past: the KV cache (and the kept latents, a small part)."""
        latent = int(np.prod(self.shape)) * torch.finfo(self.dtype).bits // 8
        return self.cache.nbytes + self.cfg.window * latent

    def _condition(self, prompt: str) -> CausalText:
        """The prompt's condition; with guidance, a batch of two: the prompt's and the empty prompt's."""
        text = self.backbone.encode_text(prompt)
        if self._empty is None:
            return text
        return CausalText(torch.cat([text.context, self._empty.context]))

    def _call(self, x: torch.Tensor, timestep: float, first_frame: int | None = None) -> torch.Tensor:
        """The network's output (noise - data) for the chunk x (c, C, h, w) at `timestep` (guided:
        empty + guidance (prompt - empty), each row over its own cache)."""
        rows = self.cache.k.shape[1]
        t = torch.full((rows, x.shape[0]), 1 - timestep / 1000, dtype=torch.float64)
        self.calls += 1
        x = x[None].to(self.device, self.dtype).expand(rows, *x.shape)
        out = -self.backbone.velocity(x, t, self.text, self.cache, first_frame)
        if rows == 1:
            return out[0]
        guidance = self.cfg.guidance
        if self.chunks == 0 and self.cfg.first_guidance is not None:
            guidance = self.cfg.first_guidance
        return out[1] + guidance * (out[0] - out[1])

    def _denoise(self, x: torch.Tensor, steps: list[float]) -> torch.Tensor:
        """The chunk x (c, C, h, w) at steps[0] -> its clean latents, a step at a time."""
        return denoise(self._call, x, steps, self.table, lambda step: self.noise_fn(self.chunks, step))

    def first_noise(self) -> torch.Tensor:
        """The next chunk's starting noise (c, C, h, w)."""
        return self.noise_fn(self.chunks, 0).to(self.device, self.dtype)

    def v2v_start(self, latents: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
        """Video-to-video: the input chunk noised to the current sigma, and the steps from 1000 sigma - 100
        (StreamDiffusionV2's); below sigma 0.2 the offset is half the level (1000 sigma / 2), so a low
        strength, or motion-aware strength brought low, still starts at a timestep above 0."""
        x = self.sigma * noise + (1 - self.sigma) * latents.to(self.device, self.dtype)
        level = int(1000 * self.sigma)
        first = float(level - min(V2V_STEP_OFFSET, level // 2))
        return x, [first] + [s for s in self.steps if s < first]

    def _reserve(self) -> None:
        c = self.frames_of(self.chunks)
        self.cache.rebase(self.backbone.model.rope, c)
        self.cache.reserve(c)

    def _finish(self, x0: torch.Tensor) -> None:
        c = x0.shape[0]
        if self.cfg.context_t is not None:
            self._call(x0, self.cfg.context_t)
        self.cache.commit(c)
        self.keep(x0)

    def keep(self, x0: torch.Tensor) -> None:
        """Keep a finished chunk's clean latents beside the cache (for a re-cache); the chunk counted."""
        self.kept.extend(x0.unbind(0))
        evicted = len(self.kept) - self.cache.frames  # (the cache drops its oldest frames after the sink)
        del self.kept[self.cfg.sink:self.cfg.sink + evicted]
        self.chunks += 1

    def chunk(self, latents: torch.Tensor | None = None) -> torch.Tensor:
        """The next chunk's clean latents (c, C, h, w); `latents` (c, C, h, w): video-to-video input."""
        self._reserve()
        noise = self.first_noise()
        if latents is None:
            if self.cfg.strength < 1:
                raise StreamStudioError("strength < 1 needs input frames (video-to-video)")
            x0 = self._denoise(noise, self.steps)
        else:
            x0 = self._denoise(*self.v2v_start(latents, noise))
        self._finish(x0)
        return x0

    def follow_motion(self, frames: torch.Tensor, previous: torch.Tensor | None) -> None:
        """Video-to-video with `motion_aware`: frames (n, 3, H, W) in [-1, 1], previous (3, H, W) the
        frame before them -> the noise level of the next chunk (StreamDiffusionV2's rule)."""
        if not self.cfg.motion_aware or previous is None:
            return
        seq = torch.cat([previous[None], frames]).float()
        change = ((seq[1:] - seq[:-1]) ** 2).mean(dim=(1, 2, 3)).sqrt()  # (n,) RMS change per frame
        m = float((change.max() / 0.2).clamp(0, 1))
        self.sigma = (self.cfg.strength - 0.1 * m) * 0.9 + self.sigma * 0.1

    def set_strength(self, strength: float) -> None:
        """Video-to-video: later chunks start from input noised to `strength` (motion-aware moves it from
        there); the cache is kept. A text-to-video stream has no input to noise."""
        if self.cfg.strength == 1:
            raise StreamStudioError("this stream is text-to-video (strength 1): its strength cannot change; "
                                    "start a video-to-video stream")
        if not 0 < strength < 1:
            raise StreamStudioError(f"a video-to-video stream's strength is in (0, 1), got {strength}")
        self.cfg = replace(self.cfg, strength=strength)
        self.sigma = strength

    def set_prompt(self, prompt: str) -> None:
        """Later chunks follow `prompt`; with `recache` the cached frames are re-run under it."""
        if prompt == self.prompt:
            return
        self.prompt, self.text = prompt, self._condition(prompt)
        if self.cfg.recache and self.cfg.context_t is not None and self.kept:
            self._recache()

    def _recache(self) -> None:
        """Rebuild the cache from the kept clean latents under the current text: the sink frames,
        then the window's, a chunk at a time at their own RoPE positions, each chunk reading the
        rebuilt frames before it (LongLive's KV re-cache)."""
        cache, c = self.cache, self.cfg.chunk_frames
        sink = min(cache.sink, cache.frames)
        positions = list(range(sink)) + list(range(cache.position - (cache.frames - sink), cache.position))
        i = 0
        while i < len(self.kept):
            n = min(c, sink - i) if i < sink else min(c, len(self.kept) - i)
            cache.place(i, n)
            self._call(torch.stack(self.kept[i:i + n]), float(self.cfg.context_t or 0.0), first_frame=positions[i])
            i += n


# ---------------------------------------------------------------------------- frame API


@dataclass
class CausalStreamConfig:
    sampler: CausalConfig
    height: int = 32  # latent frame size (pixels for a pixel-space model)
    width: int = 32
    out_height: int | None = None
    out_width: int | None = None
    temporal: int = 1  # video frames per latent frame after the first (Wan's VAE: 4)


class CausalVideoStream(StreamOutput):
    """Frame-in / frame-out over a `CausalSampler`, the same API as `VideoStream`: text-to-video
    `push(None)` or `frames(n)`; video-to-video `push(frame)` per input frame, then `flush()`.

    With a temporal codec (Wan's VAE packs 4 frames in a latent frame, the first one alone) a
    chunk of c latent frames is 1 + 4 (c - 1) video frames first and 4c after; frames are encoded
    and decoded as one continuing video (the codec's `stream()`)."""

    cfg: CausalStreamConfig

    def __init__(self, backbone: CausalWanBackbone, cfg: CausalStreamConfig, prompt: str,
                 codec: VideoCodec | None = None):
        self.cfg = cfg
        self.codec = codec or PixelCodec()
        shape = (backbone.latent_channels, cfg.height, cfg.width)
        self.sampler = CausalSampler(backbone, cfg.sampler, shape, prompt)
        self.decoder = ChunkDecoder(self.codec, overlap=0)
        self.pending: list[torch.Tensor] = []  # input images (1, 3, H, W) not yet in a chunk
        self.previous: torch.Tensor | None = None  # the last input image of the previous chunk
        self.pushed = self.sampled = self.emitted = 0
        self.mode: str | None = None

    @property
    def summary(self) -> str:
        """One line on the stream's layout (render prints it)."""
        c = self.cfg.sampler
        return (f"causal chunks of {c.chunk_frames} latent frame(s), {len(c.steps)} step(s), window {c.window} "
                f"(sink {c.sink}), cache {self.sampler.cache_bytes / 1e6:.1f} MB")

    @property
    def chunk_frames_out(self) -> int:
        """Video frames a chunk gives once streaming (the first may give fewer)."""
        return self.cfg.sampler.chunk_frames * self.cfg.temporal

    @property
    def chunk_input_frames(self) -> int:
        """Video frames the next chunk takes."""
        c, k = self.sampler.frames_of(self.sampler.chunks), self.cfg.temporal
        return c * k - (k - 1 if self.sampler.chunks == 0 else 0)

    def set_prompt(self, prompt: str) -> None:
        self.sampler.set_prompt(prompt)

    def set_strength(self, strength: float) -> None:
        """Video-to-video: the input's noise level from the next chunk on (`CausalSampler.set_strength`)."""
        self.sampler.set_strength(strength)

    def _set_mode(self, mode: str) -> None:
        if self.mode not in (None, mode):
            raise StreamStudioError(f"this stream is {self.mode}; start a new stream for {mode}")
        self.mode = mode

    def _emit(self, latents: torch.Tensor) -> list[np.ndarray]:
        self.sampled += latents.shape[0]
        frames = self.decoder.push(latents)
        out = to_uint8(frames, self.out_size) if frames.shape[0] else []
        self.emitted += len(out)
        return out

    def push(self, frame: np.ndarray | None = None) -> list[np.ndarray]:
        """None: text-to-video, one more chunk. A frame: video-to-video input; returns what finished."""
        if frame is None:
            self._set_mode("text-to-video")
            return self._emit(self.sampler.chunk())
        self._set_mode("video-to-video")
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise StreamStudioError(f"frames must be RGB uint8 HxWx3, got {frame.dtype} {frame.shape}")
        s = self.codec.spatial
        image = kernels.preprocess(torch.from_numpy(np.ascontiguousarray(frame[None])).to(self.sampler.device),
                                   self.cfg.height * s, self.cfg.width * s)  # (1, 3, H, W) in [-1, 1]
        self.pending.append(image)
        self.pushed += 1
        if len(self.pending) < self.chunk_input_frames:
            return []
        images = torch.cat(self.pending)  # (n, 3, H, W)
        self.pending = []
        self.sampler.follow_motion(images, self.previous)
        self.previous = images[-1]
        return self._emit(self.sampler.chunk(self.codec.encode(images)))

    def flush(self) -> list[np.ndarray]:
        """Video-to-video: finish the pushed frames (the last chunk padded with the last frame);
        returns no frame past the input."""
        if self.mode != "video-to-video" or not self.pending:
            return []
        last = self.pending[-1]
        while len(self.pending) < self.chunk_input_frames:
            self.pending.append(last)
        images = torch.cat(self.pending)
        self.pending = []
        out = self._emit(self.sampler.chunk(self.codec.encode(images)))
        extra = self.emitted - self.pushed
        if extra > 0:
            out = out[: len(out) - extra]
            self.emitted -= extra
        return out

