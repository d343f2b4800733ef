"""TAEHV: madebyollin's tiny autoencoder for Wan 2.1 latents (`taew2_1`), as a video codec (issue 49).

Real-time causal video (StreamDiffusionV2, Daydream Scope, Self-Forcing's demo) decodes Wan 2.1
latents with TAEHV instead of the Wan VAE: about 1/30 of the compute, at a little less quality.
The architecture is written here from github.com/madebyollin/taehv (MIT); its published weights
(`taew2_1.pth` in the repository's root, `safetensors/taew2_1.safetensors`) load by their own
names (the reference module's `state_dict()` keys: `encoder.N...`, `decoder.N...`, the index of
the block in its `nn.Sequential`, so ours are sequentials with the same blocks at the same places).

The network is 2D convolutions applied frame by frame, tied in time by three kinds of block:

- `MemBlock(x, past)`: a residual conv block that sees the frame and the previous frame's input
  to the same block (zeros before the first frame): causal in time, one frame of memory.
- `TPool(stride)` (encoder): `stride` consecutive frames concatenated on channels, one 1x1 conv.
- `TGrow(stride)` (decoder): one 1x1 conv, its channels split into `stride` consecutive frames.

Wan 2.1's layout (`taew2_1`): the encoder pools time by 2 twice (4 frames a latent frame) and
halves space three times (8 pixels a latent pixel); the decoder grows time by 2 twice and doubles
space three times. Conventions (the reference's, and how StreamDiffusionV2 calls it):

- Latents are the diffusion model's own, Wan's *normalised* latents ((vae latents - mean) / std):
  TAEHV applies no scale or shift (its README), so `WanCodec`'s latents go in as they are.
- Pixels are [0, 1] in TAEHV, [-1, 1] at the seam (`models/video/video_net.py`): converted here.
- Encoding: latent frame i comes from input frames 4i..4i+3 (a video is padded at its end with its
  last frame to a multiple of 4), so 1 + 4k frames give 1 + k latent frames, as Wan's VAE.
- Decoding: each latent frame gives 4 frames and the very first 3 of a video are dropped, so n
  latent frames give 1 + 4 (n - 1) frames, as Wan's VAE: latent frame 0 is frame 0, latent frame
  i >= 1 frames 4i - 3..4i.

`TAEHVCodec` is the seam's codec (one clip a call); `TAEHVStreamCodec` (`codec.stream()`) keeps the
network's memory between calls: `decode` continues the previous chunk's video frame by frame, so
chunk after chunk equals decoding all the chunks at once (the first chunk of c latent frames gives
1 + 4 (c - 1) frames, every later one 4c, as `wan.WanStreamCodec`). Its `encode` takes the first
chunk's 1 + 4 (c - 1) frames, then 4c, and gives c latent frames each time; the encoder looks 3
frames ahead (latent frame i is made from frames up to 4i + 3), so each call's last latent frame is
made with the call's last frame repeated (as the reference pads a video's end), and every other
equals encoding the whole video at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from streamstudio.errors import ModelNotFoundError, StreamStudioError

TAEHV_REPO = "https://github.com/madebyollin/taehv"
TAEHV_FILES = ("taew2_1.pth", "safetensors/taew2_1.safetensors")  # Wan 2.1's weights in that repository
TAEHV_HINT = (f"TAEHV's Wan 2.1 weights are a file in the GitHub repository {TAEHV_REPO} (MIT), not on the Hugging "
              f"Face hub: download {TAEHV_REPO}/raw/main/taew2_1.pth (or safetensors/taew2_1.safetensors) on a "
              "machine with network access and pass its path with --taehv FILE")
TIME_STRIDE, SPACE_STRIDE = 4, 8  # frames a latent frame, pixels a latent pixel (before the patch)


def conv(n_in: int, n_out: int, stride: int = 1, bias: bool = True) -> nn.Conv2d:
    """The 3x3 'same' convolution every TAEHV stage is built of."""
    return nn.Conv2d(n_in, n_out, 3, stride=stride, padding=1, bias=bias)


class Clamp(nn.Module):
    """Soft clamp of the latents to (-3, 3) before decoding."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """relu(convs(cat(x, past)) + skip(x)): x and past (T, C, H, W), past[t] = the input of frame t - 1."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.conv = nn.Sequential(conv(n_in * 2, n_out), nn.ReLU(), conv(n_out, n_out), nn.ReLU(), conv(n_out, n_out))
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class TPool(nn.Module):
    """(T, C, H, W) -> (T / stride, C, H, W): `stride` consecutive frames side by side on channels, a 1x1 conv."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f * stride, n_f, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, c, h, w = x.shape
        return self.conv(x.reshape(t // self.stride, self.stride * c, h, w))


class TGrow(nn.Module):
    """(T, C, H, W) -> (T * stride, C, H, W): a 1x1 conv to stride * C channels, split into consecutive frames."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f, n_f * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, c, h, w = x.shape
        return self.conv(x).reshape(t * self.stride, c, h, w)


def run_blocks(blocks: nn.Sequential, x: torch.Tensor, state: Sequence[torch.Tensor | None]
               ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Run `blocks` over the frames x (T, C, H, W), all frames of a block at once, continuing the
    video `state` holds; returns (output frames, the state after them). A fresh video's state is
    [None] * len(blocks). Per block the state is: a MemBlock's last input frame (1, C, H, W), the
    next frame's past; a TPool's input frames not yet pooled (fewer than its stride). The given
    state is not changed, so a caller can run frames ahead and drop what they did (`encode`)."""
    new = list(state)
    for i, block in enumerate(blocks):
        if isinstance(block, MemBlock):
            if x.shape[0] == 0:
                continue
            last = new[i]
            first = torch.zeros_like(x[:1]) if last is None else last
            past = torch.cat([first, x[:-1]])  # (T, C, H, W): frame t's past is frame t - 1's input
            new[i] = x[-1:]
            x = block(x, past)
        elif isinstance(block, TPool):
            held = new[i]
            if held is not None:
                x = torch.cat([held, x])
            n = x.shape[0] - x.shape[0] % block.stride
            new[i] = x[n:] if n < x.shape[0] else None
            x = block(x[:n])  # (n / stride, C, H, W)
        else:
            x = block(x)
    return x, new


class TAEHV(nn.Module):
    """The network of `taew2_1` (and `taehv`: Hunyuan Video 1's has the same layout): encoder and
    decoder sequentials whose indices are the published state dict's. `patch` > 1 and other
    latent widths are the layouts of other TAEHV files (pixel-unshuffled input)."""

    def __init__(self, latent_channels: int = 16, patch: int = 1):
        super().__init__()
        self.latent_channels, self.patch = latent_channels, patch
        rgb = 3 * patch * patch
        self.encoder = nn.Sequential(  # (T, 3p², H, W) -> (T / 4, C, H / 8, W / 8)
            conv(rgb, 64), nn.ReLU(),
            TPool(64, 2), conv(64, 64, stride=2, bias=False), MemBlock(64, 64), MemBlock(64, 64), MemBlock(64, 64),
            TPool(64, 2), conv(64, 64, stride=2, bias=False), MemBlock(64, 64), MemBlock(64, 64), MemBlock(64, 64),
            TPool(64, 1), conv(64, 64, stride=2, bias=False), MemBlock(64, 64), MemBlock(64, 64), MemBlock(64, 64),
            conv(64, latent_channels),
        )
        n = (256, 128, 64, 64)
        self.decoder = nn.Sequential(  # (T, C, h, w) -> (4T, 3p², 8h, 8w); the caller trims the first 3
            Clamp(), conv(latent_channels, n[0]), nn.ReLU(),
            MemBlock(n[0], n[0]), MemBlock(n[0], n[0]), MemBlock(n[0], n[0]), nn.Upsample(scale_factor=2),
            TGrow(n[0], 1), conv(n[0], n[1], bias=False),  # (T, 128, 2h, 2w)
            MemBlock(n[1], n[1]), MemBlock(n[1], n[1]), MemBlock(n[1], n[1]), nn.Upsample(scale_factor=2),
            TGrow(n[1], 2), conv(n[1], n[2], bias=False),  # (2T, 64, 4h, 4w)
            MemBlock(n[2], n[2]), MemBlock(n[2], n[2]), MemBlock(n[2], n[2]), nn.Upsample(scale_factor=2),
            TGrow(n[2], 2), conv(n[2], n[3], bias=False),  # (4T, 64, 8h, 8w)
            nn.ReLU(), conv(n[3], rgb),
        )


# ------------------------------------------------------------------------------ weights


def read_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A TAEHV weight file's state dict: `.safetensors`, else a torch file (`.pth`)."""
    path = Path(os.path.expanduser(path))
    if not path.is_file():
        raise ModelNotFoundError(f"no TAEHV weight file at {path}. {TAEHV_HINT}")
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise StreamStudioError(f"{path} could not be read as TAEHV weights ({exc}). {TAEHV_HINT}") from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise StreamStudioError(f"{path} holds no state dict of tensors. {TAEHV_HINT}")
    return state


def model_for(state: dict[str, torch.Tensor], source: str = "the weights") -> TAEHV:
    """The TAEHV whose layout `state` is (its latent channels and patch read off the first and
    last convs), with the weights loaded by name; a clear error for a file of another layout."""
    if "decoder.1.weight" not in state or "encoder.0.weight" not in state:
        raise StreamStudioError(f"{source} are not TAEHV weights (no encoder.0 / decoder.1 convs; the `_super` "
                                f"decoders are another layout). {TAEHV_HINT}")
    channels = int(state["decoder.1.weight"].shape[1])
    patch = int(round((state["encoder.0.weight"].shape[1] // 3) ** 0.5))
    model = TAEHV(channels, patch)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise StreamStudioError(f"{source} do not fit TAEHV's Wan 2.1 layout: {str(exc)[:300]}") from exc
    return model


def random_state(shapes: dict[str, Sequence[int]], seed: int = 0, gain: float = 1.0) -> dict[str, torch.Tensor]:
    """Seeded random weights for the given (key, shape)s in their order (tests, the reference
    fixture): normal weights of variance gain / fan-in (1: the decoder's output about in [-1, 1]),
    small normal biases; the same on every machine."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in shapes.items():
        w = torch.randn(tuple(shape), generator=gen)
        fan_in = int(torch.tensor(shape[1:]).prod()) if len(shape) > 1 else 0
        out[key] = w * (gain / fan_in) ** 0.5 if fan_in else w * 0.05
    return out


# ------------------------------------------------------------------------------ codec


def default_dtype(device: torch.device | str) -> torch.dtype:
    """float16 on a GPU (as StreamDiffusionV2 runs it), float32 on the CPU."""
    return torch.float16 if torch.device(device).type == "cuda" else torch.float32


class TAEHVCodec:
    """Frames <-> normalised Wan 2.1 latents through TAEHV (the VideoCodec protocol): `encode`
    takes F frames to ceil(F / 4) latent frames (1 + 4k -> 1 + k), `decode` n latent frames to
    1 + 4 (n - 1) frames; `stream()` decodes chunk after chunk as one video."""

    temporal = TIME_STRIDE  # frames per latent frame (after the first)

    def __init__(self, model: TAEHV, device: torch.device | str = "cpu", dtype: torch.dtype | None = None):
        self.device = torch.device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.model = model.to(self.device, self.dtype).eval().requires_grad_(False)
        self.channels, self.patch = model.latent_channels, model.patch
        self.spatial = SPACE_STRIDE * model.patch  # pixels per latent pixel

    def pixel_frames(self, latent_frames: int) -> int:
        """The frames n latent frames decode to as one video: 1 + 4 (n - 1)."""
        return 1 + self.temporal * (latent_frames - 1) if latent_frames > 0 else 0

    def latent_frames(self, frames: int) -> int:
        return -(-frames // self.temporal)

    def pixels_in(self, images: torch.Tensor) -> torch.Tensor:
        """(F, 3, H, W) in [-1, 1] -> the encoder's input (F, 3p², H / p, W / p) in [0, 1]."""
        _, _, h, w = images.shape
        if h % self.spatial or w % self.spatial:
            raise StreamStudioError(f"TAEHV encodes frames whose sides are multiples of {self.spatial}; got {w}x{h}")
        x = images.to(self.device, self.dtype) * 0.5 + 0.5
        return F.pixel_unshuffle(x, self.patch) if self.patch > 1 else x

    def pixels_out(self, x: torch.Tensor) -> torch.Tensor:
        """The decoder's output (F, 3p², H / p, W / p) -> float frames (F, 3, H, W) in [-1, 1]."""
        x = F.pixel_shuffle(x, self.patch) if self.patch > 1 else x
        return x.float().clamp(0, 1) * 2 - 1

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """(F, 3, H, W) in [-1, 1] -> normalised latents (ceil(F / 4), C, H / 8, W / 8): the video
        padded at its end with its last frame to a multiple of 4 frames, as the reference."""
        x = self.pixels_in(images)
        pad = -x.shape[0] % self.temporal
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)]) if pad else x
        z, _ = run_blocks(self.model.encoder, x, [None] * len(self.model.encoder))
        return z.float()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents (n, C, h, w) of one clip -> frames (1 + 4 (n - 1), 3, 8h, 8w) in [-1, 1]."""
        x, _ = run_blocks(self.model.decoder, latents.to(self.device, self.dtype), [None] * len(self.model.decoder))
        return self.pixels_out(x[self.temporal - 1:])  # the first 3 of 4n frames are dropped

    def stream(self) -> "TAEHVStreamCodec":
        return TAEHVStreamCodec(self)


class TAEHVStreamCodec:
    """A TAEHVCodec whose `decode` and `encode` continue the video of their earlier calls (the
    MemBlocks' last frames and the TPools' unpooled frames kept between calls). Decoding: the first
    call's first latent frame gives 1 frame, every other 4, equal to decoding all the calls' latents
    at once. Encoding: c latent frames a call (the first call's 1 + 4 (c - 1) frames, then 4c); a
    call's last latent frame is made with its last frame repeated into the frames it needs ahead
    (dropped from the state), and is made again from the real frames at the next call's start:
    chunk k's latents equal the reference's encoding of every frame up to chunk k's last, its last
    c latent frames. `reset()` starts a new video."""

    def __init__(self, codec: TAEHVCodec):
        self.codec = codec
        self.spatial, self.temporal = codec.spatial, codec.temporal
        self.reset()

    def reset(self) -> None:
        model = self.codec.model
        self._dec: list[torch.Tensor | None] = [None] * len(model.decoder)
        self._enc: list[torch.Tensor | None] = [None] * len(model.encoder)
        self.decoded = 0  # latent frames decoded since the start
        self.encoded = 0  # frames encoded since the start

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The next n latent frames (n, C, h, w) -> their frames (4n, 3, H, W); the very first
        call's first latent frame gives 1 frame (the first call: 1 + 4 (n - 1))."""
        x, self._dec = run_blocks(self.codec.model.decoder, latents.to(self.codec.device, self.codec.dtype), self._dec)
        if self.decoded == 0:
            x = x[self.temporal - 1:]  # the video's first 3 frames
        self.decoded += latents.shape[0]
        return self.codec.pixels_out(x)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """The next frames (F, 3, H, W) in [-1, 1] -> normalised latents: one per group of 4 frames
        the call completes, the group the last call padded (made again) left out, and one more
        for a group the call leaves incomplete (padded with its last frame)."""
        x, k = self.codec.pixels_in(images), self.temporal
        complete, given = self.encoded // k, -(-self.encoded // k)  # groups complete / given a latent before
        z, self._enc = run_blocks(self.codec.model.encoder, x, self._enc)  # the groups the call completes
        z = z[given - complete:]  # less the one the last call padded: already given
        self.encoded += x.shape[0]
        if self.encoded % k and -(-self.encoded // k) > given:  # a new incomplete group: padded with the last
            # frame, the state left as the real frames left it
            extra, _ = run_blocks(self.codec.model.encoder, x[-1:].expand(-self.encoded % k, -1, -1, -1), self._enc)
            z = torch.cat([z, extra])
        return z.float()


def load_taehv(path: str | os.PathLike, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None) -> TAEHVCodec:
    """A TAEHV weight file (`taew2_1.pth` or `.safetensors`) as a codec on `device` in `dtype`
    (None: float16 on a GPU, float32 on the CPU)."""
    return TAEHVCodec(model_for(read_state(path), str(path)), device, dtype)
