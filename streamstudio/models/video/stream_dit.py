"""The StreamDiT-style video transformer (arXiv 2507.03745), built from the paper.

An adaLN DiT over a buffer of video latents (F, H, W):

- 2D patch embedding per frame (temporal patch 1, so every frame keeps its own timestep),
- a time embedding per frame that, with the pooled text embedding, drives each block's
  scale, shift and gate (adaLN-Zero, as DiT),
- window self-attention over (Fw, Hw, Ww) windows of tokens, the windows shifted cyclically
  by half a window on alternate layers (Swin-style: the wrapped part is masked, so no token
  attends across the ends of an axis, and an axis the window spans whole is not shifted),
  computed with `scaled_dot_product_attention` on window-partitioned tokens (a per-window mask),
- text cross-attention to the tokens of a small self-contained text encoder (a fixed word
  vocabulary plus hashed buckets, one tiny transformer layer; no hub downloads).

Flow matching convention: t = 0 is noise, t = 1 is data; the network predicts the velocity
dx/dt = x1 - x0 given x_t and a timestep per frame.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file
from safetensors.torch import save_file

from streamstudio import ASSETS
from streamstudio.errors import ModelNotFoundError, StreamStudioError

# Words the built-in text encoder knows by name; any other word goes to a hashed bucket.
BASE_VOCAB = (
    "<pad> a an the of and with on in to is moving moves going goes slowly quickly fast slow "
    "left right up down circle square triangle ball box shape dot "
    "red green blue yellow cyan magenta purple orange white pink gray grey black "
    "small big large tiny background dark bright video frame"
).split()


@dataclass
class TextEncoderConfig:
    """A small text encoder over a fixed vocabulary written here (see BASE_VOCAB)."""

    dim: int = 64  # width of the text tokens
    hash_buckets: int = 64  # unknown words are hashed into this many extra embeddings
    max_tokens: int = 16  # longer prompts are truncated
    layers: int = 1  # transformer encoder layers over the word embeddings
    heads: int = 4


@dataclass
class StreamDiTConfig:
    """Shape of a StreamDiT network. `window` is (Fw, Hw, Ww) in tokens."""

    in_channels: int = 3  # latent channels (3 = RGB pixels for the tiny model)
    patch_size: int = 4  # spatial patch; temporal patch is 1
    hidden_size: int = 128
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0
    window: tuple[int, int, int] = (4, 8, 8)
    shift_windows: bool = True  # shift by half a window on odd layers
    # mask the wrapped part of the shift (Swin); False: the cyclic wrap-around of the first
    # built-in checkpoint, trained that way (the oldest frames attend to the newest)
    shift_mask: bool = True
    temporal_position: bool = True  # add a sin-cos position along the buffer's frame axis
    text: TextEncoderConfig = field(default_factory=TextEncoderConfig)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StreamDiTConfig":
        data = dict(data)
        text = TextEncoderConfig(**data.pop("text", {}))
        data["window"] = tuple(data.get("window", (4, 8, 8)))
        data.setdefault("shift_mask", False)  # checkpoints written before the mask was trained wrapping
        return cls(text=text, **data)


NAMED_CONFIGS: dict[str, StreamDiTConfig] = {
    # ~1.3M parameters: tests and the built-in model (32x32 RGB pixels as latents, 8x8 tokens)
    "tiny": StreamDiTConfig(),
    # ~30M: a small latent model (e.g. a 4- or 16-channel VAE latent)
    "small": StreamDiTConfig(in_channels=16, patch_size=2, hidden_size=384, depth=12, num_heads=6,
                             window=(4, 16, 16), text=TextEncoderConfig(dim=256, hash_buckets=4096,
                                                                       max_tokens=64, layers=2)),
    # ~0.6B
    "base": StreamDiTConfig(in_channels=16, patch_size=2, hidden_size=1024, depth=24, num_heads=16,
                            window=(4, 16, 16), text=TextEncoderConfig(dim=1024, hash_buckets=32768,
                                                                      max_tokens=128, layers=4)),
    # ~4B, the paper's scale (defined and timed, not trained here)
    "4b": StreamDiTConfig(in_channels=16, patch_size=2, hidden_size=2560, depth=28, num_heads=20,
                          window=(4, 16, 16), text=TextEncoderConfig(dim=2048, hash_buckets=32768,
                                                                    max_tokens=256, layers=4,
                                                                    heads=16)),
}


def named_config(name: str) -> StreamDiTConfig:
    if name not in NAMED_CONFIGS:
        raise StreamStudioError(f"unknown StreamDiT config {name!r}; use one of {', '.join(NAMED_CONFIGS)}")
    return replace(NAMED_CONFIGS[name])


# ---------------------------------------------------------------------------- text encoder


def tokenize(prompt: str, cfg: TextEncoderConfig) -> list[int]:
    """Lower-cased words -> ids: known words by vocabulary index, others by a stable hash."""
    ids = []
    for word in re.findall(r"[a-z0-9]+", prompt.lower())[: cfg.max_tokens]:
        if word in _VOCAB_INDEX:
            ids.append(_VOCAB_INDEX[word])
        else:
            ids.append(len(BASE_VOCAB) + zlib.crc32(word.encode()) % cfg.hash_buckets)
    return ids


_VOCAB_INDEX = {w: i for i, w in enumerate(BASE_VOCAB)}


@dataclass
class TextCondition:
    """An encoded batch of prompts."""

    tokens: torch.Tensor  # (B, L, D) text tokens for cross-attention
    mask: torch.Tensor  # (B, L) bool, True where a token is real
    pooled: torch.Tensor  # (B, D) pooled embedding added to the time embedding


class VideoNetwork(Protocol):
    """A StreamDiT network as its callers use it: the model itself, compiled, or on a TensorRT
    engine (models/video/video_engine.py's `VideoEngine`)."""

    def __call__(self, x: torch.Tensor, t: torch.Tensor, text: TextCondition) -> torch.Tensor: ...

    def encode_text(self, prompts: list[str] | str) -> TextCondition: ...


class TinyTextEncoder(nn.Module):
    """Word embeddings + learned positions + a small transformer; outputs width `out_dim`."""

    def __init__(self, cfg: TextEncoderConfig, out_dim: int):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(len(BASE_VOCAB) + cfg.hash_buckets, cfg.dim, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(cfg.max_tokens + 1, cfg.dim))
        self.cls = nn.Parameter(torch.zeros(cfg.dim))
        layer = nn.TransformerEncoderLayer(cfg.dim, cfg.heads, 2 * cfg.dim, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.to_tokens = nn.Linear(cfg.dim, out_dim)
        self.to_pooled = nn.Linear(cfg.dim, out_dim)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, prompts: list[str]) -> TextCondition:
        ids = [tokenize(p, self.cfg) for p in prompts]
        length = 1 + max(len(i) for i in ids)
        device = self.pos.device
        tok = torch.zeros(len(ids), length, dtype=torch.long, device=device)  # (B, L)
        for row, seq in enumerate(ids):
            tok[row, 1 : 1 + len(seq)] = torch.tensor(seq, dtype=torch.long, device=device)
        mask = tok != 0  # (B, L)
        mask[:, 0] = True  # the summary token is always there
        h = self.embed(tok)  # (B, L, dim)
        h[:, 0] = self.cls
        h = h + self.pos[:length]
        h = self.layers(h, src_key_padding_mask=~mask)  # (B, L, dim)
        return TextCondition(self.to_tokens(h), mask, self.to_pooled(h[:, 0]))


# ---------------------------------------------------------------------------- window attention


def window_partition(x: torch.Tensor, window: tuple[int, int, int]) -> torch.Tensor:
    """(B, F, H, W, D) -> (B * nWindows, Fw * Hw * Ww, D)."""
    b, f, h, w, d = x.shape
    fw, hw, ww = window
    x = x.view(b, f // fw, fw, h // hw, hw, w // ww, ww, d)
    x = x.permute(0, 1, 3, 5, 2, 4, 6, 7)  # (B, nF, nH, nW, Fw, Hw, Ww, D)
    return x.reshape(-1, fw * hw * ww, d)


def window_merge(x: torch.Tensor, window: tuple[int, int, int], shape: tuple[int, int, int, int]) -> torch.Tensor:
    """(B * nWindows, Fw * Hw * Ww, D) -> (B, F, H, W, D); inverse of window_partition."""
    b, f, h, w = shape
    fw, hw, ww = window
    d = x.shape[-1]
    x = x.view(b, f // fw, h // hw, w // ww, fw, hw, ww, d)
    x = x.permute(0, 1, 4, 2, 5, 3, 6, 7)  # (B, nF, Fw, nH, Hw, nW, Ww, D)
    return x.reshape(b, f, h, w, d)


def effective_window(window: tuple[int, int, int], grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """Windows are clipped to the grid; the grid must then be a multiple of the window."""
    eff = _three(min(wi, gi) for wi, gi in zip(window, grid))
    for name, wi, gi in zip(("frames", "height", "width"), eff, grid):
        if gi % wi:
            raise StreamStudioError(
                f"latent {name} of {gi} tokens is not a multiple of the attention window {wi}; "
                f"use a frame count / size that is a multiple of {wi}")
    return eff


def window_shift(window: tuple[int, int, int], layer: int, enabled: bool,
                 grid: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """Half a window on odd layers (0 on even layers or when shifting is off). As in Swin, an
    axis whose window already spans the whole `grid` is not shifted (one window either way)."""
    if not enabled or layer % 2 == 0:
        return (0, 0, 0)
    if grid is None:
        return _three(w // 2 for w in window)
    return _three(0 if w >= g else w // 2 for w, g in zip(window, grid))


def _three(values: Iterable[int]) -> tuple[int, int, int]:
    """(frames, height, width) of a window, a shift or a grid."""
    f, h, w = values
    return f, h, w


def shifted_window_mask(grid: tuple[int, int, int], window: tuple[int, int, int],
                        shift: tuple[int, int, int], device: torch.device | None = None) -> torch.Tensor | None:
    """Swin's mask for the cyclic shift: (nWindows, n, n) bool, True where two tokens of a window
    may attend, i.e. both came from the same side of the wrap (no token attends across the
    ends of an axis: the oldest frames never see the newest). None when nothing is shifted.

    In the rolled grid each axis splits into [0, g - w), [g - w, g - s) and [g - s, g); the last
    window holds tokens of the latter two regions, which are far apart before the roll."""
    if not any(shift):
        return None
    labels = torch.zeros(grid, dtype=torch.long, device=device)  # (F, H, W) region id per rolled token
    for axis, (g, w, s) in enumerate(zip(grid, window, shift)):
        if not s:
            continue
        region = torch.zeros(g, dtype=torch.long, device=device)
        region[g - w : g - s] = 1
        region[g - s :] = 2
        view = [1, 1, 1]
        view[axis] = g
        labels = labels * 3 + region.view(view)
    win = window_partition(labels[None, ..., None], window)[..., 0]  # (nWindows, n)
    return win[:, :, None] == win[:, None, :]  # (nWindows, n, n)


class WindowSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, shift_mask: bool = True):
        super().__init__()
        self.heads, self.shift_mask = heads, shift_mask
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, window: tuple[int, int, int], shift: tuple[int, int, int]) -> torch.Tensor:
        """x: (B, F, H, W, D) -> (B, F, H, W, D), attention inside each (shifted) window."""
        b, f, h, w, d = x.shape
        mask = shifted_window_mask((f, h, w), window, shift, x.device) if self.shift_mask else None  # (nW, n, n)
        if any(shift):
            x = torch.roll(x, shifts=tuple(-s for s in shift), dims=(1, 2, 3))
        win = window_partition(x, window)  # (B*nW, n, D)
        qkv = self.qkv(win).view(win.shape[0], win.shape[1], 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B*nW, heads, n, hd)
        if mask is not None:  # wrapped tokens of the last windows are kept apart (Swin)
            nw, n = mask.shape[0], mask.shape[1]
            q, k, v = (a.reshape(b, nw, self.heads, n, -1) for a in (q, k, v))  # (B, nW, heads, n, hd)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, :, None])
            out = out.reshape(b * nw, self.heads, n, -1)  # (B*nW, heads, n, hd)
        else:
            out = F.scaled_dot_product_attention(q, k, v)  # (B*nW, heads, n, hd)
        out = self.proj(out.transpose(1, 2).reshape(win.shape))  # (B*nW, n, D)
        out = window_merge(out, window, (b, f, h, w))  # (B, F, H, W, D)
        if any(shift):
            out = torch.roll(out, shifts=shift, dims=(1, 2, 3))
        return out


def window_attention_mask(grid: tuple[int, int, int], window: tuple[int, int, int],
                          shift: tuple[int, int, int]) -> torch.Tensor:
    """The dense (N, N) bool mask equivalent to shifted-window attention on a flattened grid.

    Built without any roll: shifting by s cuts each axis at s, s + w, s + 2w, ..., so a token's
    window along an axis is floor((p - s) / w) (the first s positions form a window of their own,
    as do the last ones): what zero-padding the grid by w - s before and s after would give."""
    coords = torch.stack(torch.meshgrid(*[torch.arange(g) for g in grid], indexing="ij"), -1)  # (F, H, W, 3)
    coords = coords.reshape(-1, 3)
    win_id = torch.div(coords - torch.tensor(shift), torch.tensor(window), rounding_mode="floor")  # (N, 3)
    return (win_id[:, None, :] == win_id[None, :, :]).all(-1)  # (N, N)


class CrossAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: (B, N, D), text: (B, L, D), mask: (B, L) -> (B, N, D)."""
        b, n, d = x.shape
        hd = d // self.heads
        q = self.q(x).view(b, n, self.heads, hd).transpose(1, 2)  # (B, h, N, hd)
        k, v = self.kv(text).view(b, -1, 2, self.heads, hd).permute(2, 0, 3, 1, 4)  # (B, h, L, hd)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


# ---------------------------------------------------------------------------- blocks


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x: (B, F, H, W, D); shift, scale: (B, F, D) per frame."""
    return x * (1 + scale[:, :, None, None]) + shift[:, :, None, None]


class StreamDiTBlock(nn.Module):
    def __init__(self, cfg: StreamDiTConfig):
        super().__init__()
        d = cfg.hidden_size
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.attn = WindowSelfAttention(d, cfg.num_heads, cfg.shift_mask)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.cross = CrossAttention(d, cfg.num_heads)
        self.norm3 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        hidden = int(d * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, d))
        ada = nn.Linear(d, 6 * d)
        self.ada = nn.Sequential(nn.SiLU(), ada)
        nn.init.zeros_(ada.weight)
        nn.init.zeros_(ada.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor, text: TextCondition,
                window: tuple[int, int, int], shift: tuple[int, int, int]) -> torch.Tensor:
        """x: (B, F, H, W, D), c: (B, F, D) per-frame conditioning."""
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(c).chunk(6, dim=-1)  # each (B, F, D)
        x = x + g1[:, :, None, None] * self.attn(modulate(self.norm1(x), sh1, sc1), window, shift)
        b, f, h, w, d = x.shape
        flat = x.reshape(b, f * h * w, d)
        flat = flat + self.cross(self.norm2(flat), text.tokens, text.mask)
        x = flat.view(b, f, h, w, d)
        return x + g2[:, :, None, None] * self.mlp(modulate(self.norm3(x), sh2, sc2))


def timestep_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """t: (...) in [0, 1] -> (..., dim) sinusoidal features."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = (t.float() * scale)[..., None] * freqs  # (..., half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def sincos_positions(grid: tuple[int, int, int], dim: int, device: torch.device,
                     temporal: bool = True) -> torch.Tensor:
    """Fixed 3D sin-cos positions (F, H, W, dim): a third of the channels per axis (the frame
    axis' third is zero when `temporal` is off, which makes frames position-independent)."""
    parts = []
    axis_dim = (dim // 6) * 2
    for axis, size in enumerate(grid):
        if axis == 0 and not temporal:
            parts.append(torch.zeros(*grid, axis_dim, device=device))
            continue
        emb = timestep_embedding(torch.arange(size, device=device, dtype=torch.float32), axis_dim, scale=1.0)
        view = [1, 1, 1, axis_dim]
        view[axis] = size
        parts.append(emb.view(view).expand(*grid, axis_dim))
    pos = torch.cat(parts, dim=-1)
    return F.pad(pos, (0, dim - pos.shape[-1]))  # (F, H, W, dim)


class StreamDiT(nn.Module):
    """Velocity network v(x_t, t_per_frame, text) over a buffer of latent frames."""

    def __init__(self, cfg: StreamDiTConfig):
        super().__init__()
        self.cfg = cfg
        d, p, c = cfg.hidden_size, cfg.patch_size, cfg.in_channels
        self.patch = nn.Conv2d(c, d, kernel_size=p, stride=p)
        self.time_mlp = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        self.text = TinyTextEncoder(cfg.text, d)
        self.blocks = nn.ModuleList(StreamDiTBlock(cfg) for _ in range(cfg.depth))
        self.final_norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        final_ada = nn.Linear(d, 2 * d)
        self.final_ada = nn.Sequential(nn.SiLU(), final_ada)
        self.final = nn.Linear(d, p * p * c)
        for m in (final_ada, self.final):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def encode_text(self, prompts: list[str] | str) -> TextCondition:
        return self.text([prompts] if isinstance(prompts, str) else list(prompts))

    def forward(self, x: torch.Tensor, t: torch.Tensor, text: TextCondition) -> torch.Tensor:
        """x: (B, F, C, H, W) latents, t: (B, F) in [0, 1] -> velocity (B, F, C, H, W)."""
        b, f, c, H, W = x.shape
        p = self.cfg.patch_size
        if H % p or W % p:
            raise StreamStudioError(f"frame size {H}x{W} is not a multiple of the patch size {p}")
        tok = self.patch(x.reshape(b * f, c, H, W))  # (B*F, D, h, w)
        h, w = tok.shape[-2:]
        tok = tok.view(b, f, -1, h, w).permute(0, 1, 3, 4, 2)  # (B, F, h, w, D)
        pos = sincos_positions((f, h, w), tok.shape[-1], x.device, self.cfg.temporal_position)
        tok = tok + pos.to(tok.dtype)
        cond = self.time_mlp(timestep_embedding(t, 256).to(tok.dtype))  # (B, F, D)
        cond = cond + text.pooled[:, None, :]
        window = effective_window(self.cfg.window, (f, h, w))
        for i, block in enumerate(self.blocks):
            tok = block(tok, cond, text, window, window_shift(window, i, self.cfg.shift_windows, (f, h, w)))
        shift, scale = self.final_ada(cond).chunk(2, dim=-1)  # (B, F, D)
        out = self.final(modulate(self.final_norm(tok), shift, scale))  # (B, F, h, w, p*p*C)
        out = out.view(b, f, h, w, p, p, c).permute(0, 1, 6, 2, 4, 3, 5)  # (B, F, C, h, p, w, p)
        return out.reshape(b, f, c, H, W)


def guided_velocity(model: VideoNetwork, x: torch.Tensor, t: torch.Tensor, text: TextCondition,
                    empty: TextCondition | None, guidance: float) -> torch.Tensor:
    """Classifier-free guidance: v(empty) + guidance * (v(text) - v(empty)).

    `empty` encodes the empty prompt "" (the unconditional velocity that training with `cond_drop`
    teaches); guidance 1 is the plain conditional velocity, one call. Two calls otherwise, so any
    wrapper of the network (compiled, a TensorRT engine of batch 1) runs it unchanged.
    x: (B, F, C, H, W), t: (B, F), text and empty of batch B."""
    v_text = model(x, t, text)
    if guidance == 1.0:
        return v_text
    assert empty is not None  # (guidance other than 1 needs the empty prompt's encoding)
    v_empty = model(x, t, empty)
    return v_empty + guidance * (v_text - v_empty)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------- checkpoints


def save_checkpoint(model: StreamDiT, folder: str | Path, extra: dict | None = None) -> Path:
    """Write `model.safetensors` and `config.json` (model config + `extra`, e.g. sampling defaults)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    meta = {"model": model.cfg.to_dict(), **(extra or {})}
    (folder / "config.json").write_text(json.dumps(meta, indent=2))
    return folder


def read_checkpoint_config(folder: str | Path) -> dict:
    folder = Path(folder)
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise ModelNotFoundError(
            f"no StreamDiT checkpoint in {folder}: expected model.safetensors and config.json; "
            "train one with `streamstudio train-video --output DIR` or leave --model out for the built-in model")
    return json.loads((folder / "config.json").read_text())


def load_checkpoint(folder: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[StreamDiT, dict]:
    """(model in eval mode, the checkpoint's config.json as a dict)."""
    meta = read_checkpoint_config(folder)
    model = StreamDiT(StreamDiTConfig.from_dict(meta["model"]))
    model.load_state_dict(load_file(str(Path(folder) / "model.safetensors")))
    return model.to(device=device, dtype=dtype).eval(), meta


BUILTIN_CHECKPOINT = ASSETS / "stream_dit_tiny"


def load_builtin(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> tuple[StreamDiT, dict]:
    """The tiny model trained on synthetic coloured shapes that ships with the package."""
    return load_checkpoint(BUILTIN_CHECKPOINT, device, dtype)
