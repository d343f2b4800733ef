"""StreamDiT buffer sampler (arXiv 2507.03745): streaming text-to-video and video-to-video.

The buffer holds K clean reference frames and N chunks of c latent frames (B = K + N*c).
Chunk j (0 = oldest) sits at levels (N-1-j)*s ... (N-j)*s - 1 of T = s*N noise levels
t_0 < t_1 < ... < t_T = 1 (flow matching: t = 0 noise, t = 1 data). Every call runs the
backbone once over the whole buffer with one timestep per frame and moves every frame one
level up with an Euler step of its own size t_{k+1} - t_k (`solver`: or a second-order step,
Adams-Bashforth on the frame's velocity one level below, or Heun with a second network call).
After every s calls the oldest chunk is at t = 1: its c frames leave (and become the reference
frames), and c new frames enter at level 0. Each frame keeps the noise sample it entered with
(drawn per frame id).

- Text-to-video starts as in the paper: one uniform-noise generation of N*c frames, whose
  states at levels (N-1-j)*s fill chunk j. With `warmup` (on for the built-in model) the frames
  that generation touched, the first (N-1)*c, are made and dropped before any frame is shown: the
  first frame shown entered the buffer as noise and went through every level in the streaming
  buffer, beside older frames, as every later one does (issue 30: a small model's uniform
  generation, every frame at one noise level with no formed frame to follow, loses its object
  in some frames, and a frame keeps what it became there). It costs (N-1)*s buffer calls once,
  as many as the start-up itself.
- Video-to-video (SDEdit): levels span [t_start, 1] with t_start = 1 - strength, and an input
  frame enters as (1 - t_start) * noise + t_start * encode(frame); the first N*c input frames
  start the buffer through the same uniform generation.
- `set_prompt` changes the text of every later call (the change flows through the buffer).
- Chunks are decoded as they leave, with an overlap of decoded frames cross-faded between
  consecutive chunks so a temporal decoder shows no seam.

No I/O and no threads here; `VideoStream` is the frame-in / frame-out API (RGB uint8 HxWx3),
the one place pixels become [-1, 1] images and back. The backbone and the codec are the video
seam (`models/video/video_net.py`: velocity, encode_text, encode, decode).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from streamstudio import kernels
from streamstudio.errors import StreamStudioError
from streamstudio.models.video.video_net import PixelCodec, VideoBackbone, VideoCodec
from streamstudio.pipelines.live_settings import VIDEO_SETTINGS, check_config


@dataclass
class StreamBufferConfig:
    num_chunks: int = 4  # N
    chunk_size: int = 2  # c
    micro_steps: int = 2  # s
    ref_frames: int = 0  # K
    strength: float = 1.0  # 1 = text-to-video from pure noise; < 1 = SDEdit video-to-video (the table's 0.6)
    shift: float = 1.0  # timestep shift (> 1 spends more levels near noise)
    seed: int = 0
    # how a frame moves one level: "euler" (the paper's), "ab2" (second-order Adams-Bashforth on the
    # frame's velocity of its previous level: no more network calls), "heun" (second order, two
    # buffer calls a level)
    solver: str = "euler"
    # clip each velocity's predicted clean frame x + (1 - t) v to [-range, range] (diffusers'
    # `clip_sample`): for a pixel-space model, whose data lie in [-1, 1]; off for latents
    clip_sample: bool = False
    clip_sample_range: float = 1.0
    # text-to-video: drop the (N-1)*c frames the start-up's uniform generation touched ((N-1)*s
    # more calls before the first frame); off here (the paper's start), on in `build_stream` for
    # StreamDiT checkpoints (their `sampling.warmup`, default on)
    warmup: bool = False

    @property
    def warmup_frames(self) -> int:
        """Frames a text-to-video start makes and drops: those with a part made by the start-up."""
        return (self.num_chunks - 1) * self.chunk_size if self.warmup else 0

    @property
    def levels(self) -> int:  # T
        return self.num_chunks * self.micro_steps

    @property
    def frames(self) -> int:  # N * c
        return self.num_chunks * self.chunk_size

    def validate(self) -> None:
        check_config(self, VIDEO_SETTINGS)  # strength, num_chunks, chunk_size, micro_steps, solver: the table's
        if self.ref_frames < 0:
            raise StreamStudioError(f"ref_frames must be >= 0, got {self.ref_frames}")
        if self.clip_sample_range <= 0:
            raise StreamStudioError(f"clip_sample_range must be > 0, got {self.clip_sample_range}")


def level_times(cfg: StreamBufferConfig) -> torch.Tensor:
    """(T + 1,) float64 times t_0 < ... < t_T = 1, from t_0 = 1 - strength."""
    u = torch.linspace(0.0, 1.0, cfg.levels + 1, dtype=torch.float64)
    sigma = 1 - u
    sigma = cfg.shift * sigma / (1 + (cfg.shift - 1) * sigma)  # the usual flow-matching shift
    t_start = 1.0 - cfg.strength
    return t_start + (1 - t_start) * (1 - sigma)


def frame_noise(seed: int, frame_id: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The noise sample of one frame: a function of (seed, frame id) only."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + frame_id)
    return torch.randn(shape, generator=gen)


class StreamSampler:
    """The moving buffer, on latents. Call `start`, then `step` repeatedly.

    `ids[i]` and `levels[i]` name the frame in buffer row i (references first) and its level.
    """

    def __init__(self, backbone: VideoBackbone, cfg: StreamBufferConfig, latent_shape: tuple[int, int, int],
                 prompt: str = "", noise_fn: Callable[[int], torch.Tensor] | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        cfg.validate()
        self.backbone, self.cfg, self.shape = backbone, cfg, tuple(latent_shape)  # shape (C, h, w)
        self.device, self.dtype = torch.device(device), dtype
        self.noise_fn = noise_fn or (lambda i: frame_noise(cfg.seed, i, self.shape))
        self.times = level_times(cfg)  # (T + 1,)
        self.set_prompt(prompt)
        self.x = torch.empty(0, *self.shape, device=self.device, dtype=dtype)  # (n, C, h, w)
        self.levels = torch.empty(0, dtype=torch.long)  # (n,)
        # ab2: each row's velocity one level below its own (every frame moves one level a call, so a
        # frame above level 0 always has one; rows at level 0 are not read); None for the others
        self.v_prev: torch.Tensor | None = None
        self.ids: list[int] = []
        self.noise: dict[int, torch.Tensor] = {}  # each buffered frame's own noise sample
        self.refs = torch.empty(0, *self.shape, device=self.device, dtype=dtype)  # (k <= K, C, h, w)
        self.next_id = 0
        self.calls = 0  # buffer calls since start (startup and warm-up calls not counted)
        self.startup_calls = 0  # calls of the start-up (uniform generation, then any warm-up)
        self.started = False

    # ------------------------------------------------------------------ text
    def set_prompt(self, prompt: str) -> None:
        self.prompt = prompt
        with torch.no_grad():
            self.text = self.backbone.encode_text(prompt)

    # ------------------------------------------------------------------ entering frames
    def _enter(self, clean: torch.Tensor | None, count: int) -> tuple[torch.Tensor, list[int]]:
        """`count` new frames at level 0: their noise, mixed with `clean` (count, C, h, w) for SDEdit."""
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        noise = torch.stack([self.noise_fn(i) for i in ids]).to(self.device, self.dtype)  # (count, C, h, w)
        for i, n in zip(ids, noise):
            self.noise[i] = n
        t0 = float(self.times[0])
        if clean is None:
            if t0 > 0:
                raise StreamStudioError("strength < 1 needs input frames (video-to-video); "
                                        "use strength 1 for text-to-video")
            return noise, ids
        return (1 - t0) * noise + t0 * clean.to(self.device, self.dtype), ids

    # ------------------------------------------------------------------ network call
    def _velocity(self, x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
        """x: (n, C, h, w) at `levels` (n,), reference frames prepended -> velocity (n, C, h, w).
        The references join once all K of them are out: a model trained with K sees K, never the
        1 .. K-1 of the first rotations (a temporal window may not even divide N*c + 1 .. N*c + K - 1)."""
        refs = self.refs if self.refs.shape[0] == self.cfg.ref_frames else self.refs[:0]
        k = refs.shape[0]
        full = torch.cat([refs, x], dim=0)[None]  # (1, k + n, C, h, w)
        t = torch.cat([torch.ones(k, dtype=torch.float64), self.times[levels]])[None]  # (1, k + n)
        with torch.no_grad():
            v = self.backbone.velocity(full, t.to(self.device, self.dtype), self.text)[0, k:]  # (n, C, h, w)
        if self.cfg.clip_sample:
            v = self._clip(x, self.times[levels], v)
        return v

    def _clip(self, x: torch.Tensor, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The velocity toward the predicted clean frame x + (1 - t) v clipped to the data range;
        frames at t = 1 (Heun's second call at the last level) are clean already and kept."""
        r = self.cfg.clip_sample_range
        rest = (1 - t).to(self.device, self.dtype)[:, None, None, None]  # (n, 1, 1, 1)
        x0 = (x + rest * v).clamp(-r, r)
        return torch.where(rest > 0, (x0 - x) / rest.clamp_min(1e-12), v)

    def _level_step(self, x: torch.Tensor, levels: torch.Tensor,
                    v_prev: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every frame of x (n, C, h, w) from its level to the next (per-frame step size) with the
        config's solver; returns the new frames and the velocity at `levels` (the next call's
        history). v_prev (n, C, h, w): each frame's velocity one level below (None: none yet).
        - euler: x + dt v.
        - ab2: variable-step Adams-Bashforth, x + dt ((1 + a) v - a v_prev) with a = dt / (2 dt_prev),
          for a frame above level 0; Euler for its first step.
        - heun: the trapezoid x + dt (v + v') / 2, v' at the Euler guess and the next level."""
        dt = (self.times[levels + 1] - self.times[levels]).to(self.device, self.dtype)[:, None, None, None]
        v = self._velocity(x, levels)
        solver = self.cfg.solver
        if solver == "heun":
            return x + dt * (v + self._velocity(x + dt * v, levels + 1)) / 2, v
        if solver == "ab2" and v_prev is not None:
            prev = (levels - 1).clamp_min(0)
            dt_prev = (self.times[levels] - self.times[prev]).clamp_min(1e-12).to(self.device, self.dtype)
            has = (levels > 0).to(self.device)  # (n,) frames that made a step before this one
            a = torch.where(has, dt[:, 0, 0, 0] / (2 * dt_prev), 0.0)[:, None, None, None]
            return x + dt * (v + a * (v - v_prev)), v
        return x + dt * v, v

    # ------------------------------------------------------------------ start and step
    def start(self, clean: torch.Tensor | None = None) -> None:
        """Fill the buffer by one uniform generation of N*c frames (clean: (N*c, C, h, w) for SDEdit);
        text-to-video with `cfg.warmup` then runs the buffer until those frames' chunks that the
        generation touched have left, dropping them (`warmup_frames`)."""
        cfg = self.cfg
        n, c, s = cfg.num_chunks, cfg.chunk_size, cfg.micro_steps
        u, self.ids = self._enter(clean, cfg.frames)  # (N*c, C, h, w)
        u_v = None  # the uniform generation's velocity one level below
        self.x = torch.empty_like(u)
        self.levels = torch.empty(cfg.frames, dtype=torch.long)
        self.v_prev = torch.zeros_like(u)
        for k in range((n - 1) * s + 1):
            for j in range(n):
                if (n - 1 - j) * s == k:  # chunk j takes the uniform state (and its history) at its level
                    rows = slice(j * c, (j + 1) * c)
                    self.x[rows], self.levels[rows] = u[rows], k
                    if u_v is not None:
                        self.v_prev[rows] = u_v[rows]
            if k < (n - 1) * s:
                level = torch.full((cfg.frames,), k, dtype=torch.long)
                u, u_v = self._level_step(u, level, u_v)
                self.startup_calls += 1
        self.started = True
        if clean is None and cfg.warmup:
            for _ in range(cfg.warmup_frames // c):  # chunks 0 .. N-2 leave, unseen
                done = None
                while done is None:
                    done = self.step()
            self.startup_calls += self.calls
            self.calls = 0

    def step(self, clean_next: torch.Tensor | None = None) -> torch.Tensor | None:
        """One call. Every s calls returns the finished chunk (c, C, h, w) and admits c new
        frames (clean_next: their clean latents (c, C, h, w) for video-to-video)."""
        if not self.started:
            raise StreamStudioError("the stream sampler was not started; call start() first")
        self.x, self.v_prev = self._level_step(self.x, self.levels, self.v_prev)
        self.levels = self.levels + 1
        self.calls += 1
        if self.calls % self.cfg.micro_steps:
            return None
        return self._rotate(clean_next)

    def _rotate(self, clean_next: torch.Tensor | None) -> torch.Tensor:
        c = self.cfg.chunk_size
        assert bool((self.levels[:c] == self.cfg.levels).all()), "oldest chunk is not finished"
        done = self.x[:c]  # (c, C, h, w) at t = 1
        for i in self.ids[:c]:
            self.noise.pop(i, None)
        new, new_ids = self._enter(clean_next, c)
        self.x = torch.cat([self.x[c:], new])
        self.levels = torch.cat([self.levels[c:], torch.zeros(c, dtype=torch.long)])
        if self.cfg.solver == "ab2":  # the new rows' history is never read (level 0); others keep none
            assert self.v_prev is not None  # (set by every level step before a chunk finishes)
            self.v_prev = torch.cat([self.v_prev[c:], torch.zeros_like(self.v_prev[:c])])
        else:
            self.v_prev = None
        self.ids = self.ids[c:] + new_ids
        k = self.cfg.ref_frames
        self.refs = torch.cat([self.refs, done])[-k:] if k else self.refs
        return done


# ---------------------------------------------------------------------------- decoding


def to_uint8(frames: torch.Tensor, size: tuple[int, int] | None = None) -> list[np.ndarray]:
    """(F, 3, H, W) in [-1, 1] -> list of RGB uint8 (H', W', 3), resized to `size` = (H', W')."""
    x = frames.float()
    if size and tuple(x.shape[-2:]) != tuple(size):
        mode = "nearest" if size[0] >= x.shape[-2] and size[0] % x.shape[-2] == 0 else "bilinear"
        x = F.interpolate(x, size=size, mode=mode, **({} if mode == "nearest" else {"align_corners": False}))
    return list(kernels.postprocess(x).cpu().numpy())  # (F, H', W', 3): the image pipeline's conversion


class ChunkDecoder:
    """Decodes chunks as they leave; `overlap` frames of context from the previous chunk are
    decoded again with the new chunk and their two decodings cross-faded, so the output has no
    seam at chunk boundaries (the last `overlap` frames wait for the next chunk or `flush`)."""

    def __init__(self, codec: VideoCodec, overlap: int = 1):
        self.codec, self.overlap = codec, overlap
        self.tail_latents: torch.Tensor | None = None  # (o, C, h, w) latents of the held frames
        self.tail_frames: torch.Tensor | None = None  # (o, 3, H, W) their first decoding

    def push(self, latents: torch.Tensor) -> torch.Tensor:
        """latents (c, C, h, w) -> the decoded frames ready to show (F', 3, H, W)."""
        o = self.overlap
        if self.tail_latents is None or o == 0:
            decoded = self.codec.decode(latents)
            ready = decoded
        else:
            decoded = self.codec.decode(torch.cat([self.tail_latents, latents]))  # (o + c, 3, H, W)
            w = torch.arange(1, o + 1, dtype=decoded.dtype, device=decoded.device) / (o + 1)  # old -> new
            assert self.tail_frames is not None  # (held with tail_latents)
            blended = (1 - w)[:, None, None, None] * self.tail_frames + w[:, None, None, None] * decoded[:o]
            ready = torch.cat([blended, decoded[o:]])
        if o == 0:
            return ready
        keep = min(o, latents.shape[0])
        self.tail_latents = latents[-keep:]
        self.tail_frames = ready[-keep:]
        return ready[:-keep]

    def flush(self) -> torch.Tensor | None:
        out, self.tail_latents, self.tail_frames = self.tail_frames, None, None
        return out


# ---------------------------------------------------------------------------- frame API


@dataclass
class StreamVideoConfig:
    buffer: StreamBufferConfig
    height: int = 32  # latent frame size the backbone works at (pixels for the tiny model)
    width: int = 32
    out_height: int | None = None  # size of the frames handed out (None: latent size)
    out_width: int | None = None
    decode_overlap: int = 1


class SizedConfig(Protocol):
    out_height: int | None
    out_width: int | None


class StreamOutput:
    """What VideoStream and CausalVideoStream share: `out_size` from the config's out_height and
    out_width, and `frames(n)` over the stream's `push`."""

    cfg: SizedConfig

    def push(self, frame: np.ndarray | None = None) -> list[np.ndarray]:
        raise NotImplementedError

    def frames(self, n: int) -> Iterator[np.ndarray]:
        """Text-to-video: yield n frames as they are made."""
        given = 0
        while given < n:
            for frame in self.push(None)[: n - given]:
                yield frame
                given += 1

    @property
    def out_size(self) -> tuple[int, int] | None:
        """(height, width) of the frames handed out; None: the latent size."""
        if self.cfg.out_height and self.cfg.out_width:
            return (self.cfg.out_height, self.cfg.out_width)
        return None


class VideoStream(StreamOutput):
    """Frame-in / frame-out streaming. Text-to-video: `push(None)` or `frames(n)`;
    video-to-video: `push(frame)` per input frame, then `flush()`. Frames are RGB uint8 HxWx3."""

    cfg: StreamVideoConfig

    def __init__(self, backbone: VideoBackbone, cfg: StreamVideoConfig, prompt: str,
                 codec: VideoCodec | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, latent_channels: int = 3):
        self.cfg = cfg
        self.codec = codec or PixelCodec()
        shape = (latent_channels, cfg.height, cfg.width)
        self.sampler = StreamSampler(backbone, cfg.buffer, shape, prompt, device=device, dtype=dtype)
        self.decoder = ChunkDecoder(self.codec, cfg.decode_overlap)
        self.pending: deque[torch.Tensor] = deque()  # encoded input frames not yet in the buffer
        self.pushed = 0  # input frames (video-to-video)
        self.sampled = 0  # frames that left the sampler
        self.emitted = 0  # frames handed out
        self._last_clean: torch.Tensor | None = None
        self.mode: str | None = None

    @property
    def chunk_frames_out(self) -> int:
        """Frames a chunk gives (pixel codecs; a temporal codec's chunk gives more)."""
        return self.cfg.buffer.chunk_size

    @property
    def summary(self) -> str:
        """One line on the stream's layout (render prints it)."""
        b = self.cfg.buffer
        return f"buffer {b.num_chunks} chunks x {b.chunk_size} frames, {b.micro_steps} micro-step(s) ({b.solver})"

    def set_prompt(self, prompt: str) -> None:
        self.sampler.set_prompt(prompt)

    def _set_mode(self, mode: str) -> None:
        if self.mode not in (None, mode):
            raise StreamStudioError(f"this stream is {self.mode}; start a new stream for {mode}")
        self.mode = mode

    def _images(self, frame: np.ndarray) -> torch.Tensor:
        """RGB uint8 (H, W, 3) -> (1, 3, H', W') in [-1, 1] at the codec's pixel size (the latent
        size times `codec.spatial`), on the stream's device: the pixels' one conversion."""
        s = self.codec.spatial
        frames = torch.from_numpy(np.ascontiguousarray(frame[None]))  # (1, H, W, 3) uint8
        return kernels.preprocess(frames.to(self.sampler.device), self.cfg.height * s, self.cfg.width * s)

    def _emit(self, latents: torch.Tensor) -> list[np.ndarray]:
        self.sampled += latents.shape[0]
        frames = self.decoder.push(latents)
        out = to_uint8(frames, self.out_size) if frames.shape[0] else []
        self.emitted += len(out)
        return out

    def _chunk(self, clean_next: torch.Tensor | None) -> torch.Tensor:
        """Run s calls; the last one returns the finished chunk."""
        done = None
        while done is None:
            done = self.sampler.step(clean_next)
        return done

    def push(self, frame: np.ndarray | None = None) -> list[np.ndarray]:
        """None: text-to-video, one more chunk. A frame: video-to-video input; returns what finished."""
        if frame is None:
            self._set_mode("text-to-video")
            if not self.sampler.started:
                self.sampler.start()
            return self._emit(self._chunk(None))
        self._set_mode("video-to-video")
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise StreamStudioError(f"frames must be RGB uint8 HxWx3, got {frame.dtype} {frame.shape}")
        self._last_clean = self.codec.encode(self._images(frame))[0]  # (C, h, w)
        self.pending.append(self._last_clean)
        self.pushed += 1
        return self._advance()

    def _advance(self) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        b = self.cfg.buffer
        if not self.sampler.started:
            if len(self.pending) < b.frames:
                return out
            self.sampler.start(torch.stack([self.pending.popleft() for _ in range(b.frames)]))
        while len(self.pending) >= b.chunk_size:
            clean = torch.stack([self.pending.popleft() for _ in range(b.chunk_size)])
            out += self._emit(self._chunk(clean))
        return out

    def flush(self) -> list[np.ndarray]:
        """Video-to-video: finish every pushed frame (the input is padded with its last frame);
        both modes: hand out the frames the decoder held back. Returns no frame past the input."""
        out: list[np.ndarray] = []
        if self.mode == "video-to-video":
            while self.sampled < self.pushed:
                assert self._last_clean is not None  # (a frame was pushed)
                self.pending.append(self._last_clean)
                out += self._advance()
        tail = self.decoder.flush()
        if tail is not None:
            out += to_uint8(tail, self.out_size)
            self.emitted += tail.shape[0]
        if self.mode == "video-to-video":
            extra = self.emitted - self.pushed
            out = out[: len(out) - extra] if extra > 0 else out
            self.emitted = min(self.emitted, self.pushed)
        return out

