"""Wan 2.1 made block-causal, with a KV cache: the network of CausVid, Self-Forcing and
StreamDiffusionV2 (issue 49), in Wan's original parameter layout so their released weights load
by name (`patch_embedding`, `text_embedding.0`, `blocks.N.self_attn.q`, `head.head`, ...).

A video is made chunk by chunk (a few latent frames each). A chunk's tokens attend to each other
and to the keys and values of the frames before it, kept in a `KVCache`: sink frames (the first
ones, never dropped) and a rolling window of the newest. Every call for a chunk writes the chunk's
keys and values into its slots (the last call, on the clean chunk, leaves what later chunks see)
and `KVCache.commit` makes them part of the past. Facts from the reference code
(guandeh17/Self-Forcing `wan/modules/causal_model.py`, tianweiy/CausVid):

- one timestep per frame: the time embedding and the six modulation vectors are per frame,
  applied to that frame's tokens;
- 3-D RoPE on queries and keys (complex rotation of (d - 4 (d // 6)) / 2 temporal, (d // 6) height
  and (d // 6) width pairs, d the head size, theta 10000), temporal positions = the frame's
  index in the video; keys are cached already rotated;
- eviction: before a chunk of n frames is written, the oldest non-sink frames leave so the sink,
  the rest of the window and the chunk fit in `window` frames;
- the text's cross-attention keys and values are computed once per prompt (kept on the text).

The positions are absolute until they would pass the RoPE table (1024 frames, as Wan's); then the
window's cached keys are turned back (a rotation by minus the gap) so the window follows the
sink frames: relative positions inside the window are unchanged, and a stream can run for ever
(`KVCache.rebase`). The references cannot go past 1024 frames at all.

Training uses teacher forcing, as CausVid and Self-Forcing do: one call on the sequence [clean
frames; noisy frames], both halves at the same RoPE positions, under `teacher_forcing_mask`: clean
chunk j attends to clean chunks <= j, noisy chunk j to the clean chunks before it and to itself,
so each noisy chunk sees what the cached path shows it when the clean chunks were committed at
t = 0 (`CausalWan.teacher_forcing`; a window and sink frames as the cache keeps them).

The velocity seam (`models/video/video_net.py`) is `CausalWanBackbone` in `causal_backbone.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

ROPE_POSITIONS = 1024  # Wan's RoPE table length (rope_params(1024, ...))


@dataclass
class CausalWanConfig:
    """Wan 2.1's transformer hyper-parameters (the 1.3B model's by default)."""

    dim: int = 1536
    ffn_dim: int = 8960
    freq_dim: int = 256
    text_dim: int = 4096
    text_len: int = 512
    in_dim: int = 16
    out_dim: int = 16
    num_heads: int = 12
    num_layers: int = 30
    patch_size: tuple[int, int, int] = (1, 2, 2)
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @classmethod
    def from_dict(cls, d: dict) -> CausalWanConfig:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "patch_size" in known:
            known["patch_size"] = tuple(known["patch_size"])
        return cls(**known)


WAN_1_3B_CONFIG = CausalWanConfig()
WAN_14B_CONFIG = CausalWanConfig(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40)


# ------------------------------------------------------------------------------ RoPE and time


def rope_table(positions: int, dim: int, theta: float = 10000.0) -> torch.Tensor:
    """(positions, dim / 2) complex128 e^{i p theta^(-2j/dim)}."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv)
    return torch.polar(torch.ones_like(angles), angles)


def rope_tables(head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Wan's three tables (time, height, width) for a head of `head_dim`."""
    d = head_dim
    return (rope_table(ROPE_POSITIONS, d - 4 * (d // 6)), rope_table(ROPE_POSITIONS, 2 * (d // 6)),
            rope_table(ROPE_POSITIONS, 2 * (d // 6)))


def rope_rotations(tables, first_frame: int, f: int, h: int, w: int) -> torch.Tensor:
    """(f * h * w, 1, head_dim / 2) complex128 rotations of frames first_frame .. first_frame + f - 1."""
    time, height, width = tables
    if first_frame + f > time.shape[0]:
        raise ValueError(f"RoPE position {first_frame + f} past the table ({time.shape[0]}); rebase the cache")
    rot = torch.cat([time[first_frame:first_frame + f].view(f, 1, 1, -1).expand(f, h, w, -1),
                     height[:h].view(1, h, 1, -1).expand(f, h, w, -1),
                     width[:w].view(1, 1, w, -1).expand(f, h, w, -1)], dim=-1)
    return rot.reshape(f * h * w, 1, -1)


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x (B, S, H, D) real, rotated pairwise by rot (S, 1, D / 2) complex, in float64 as Wan does."""
    b, s, n, d = x.shape
    z = torch.view_as_complex(x.to(torch.float64).reshape(b, s, n, d // 2, 2))
    return torch.view_as_real(z * rot).flatten(3).type_as(x)


def timestep_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """(N,) timesteps in Wan's units (0 .. 1000) -> (N, dim) float64 [cos, sin]."""
    half = dim // 2
    pos = t.to(torch.float64)
    freqs = torch.pow(10000, -torch.arange(half, dtype=torch.float64, device=t.device).div(half))
    angles = torch.outer(pos, freqs)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


def teacher_forcing_mask(frames: int, chunk: int, frame_tokens: int, window: int | None = None,
                         sink: int = 0) -> torch.Tensor:
    """(2 S, 2 S) bool, True where a query may attend, S = frames * frame_tokens: the sequence is
    [clean frames; noisy frames]. A chunk (clean or noisy) attends to itself and to the clean frames
    before it that a `KVCache` of `window` frames (None: all) with `sink` sink frames keeps when it
    is made: the sink, then the newest window - sink - chunk frames."""
    if frames % chunk:
        raise ValueError(f"{frames} frames are not whole chunks of {chunk}")
    f = torch.arange(frames)
    start = (f // chunk) * chunk  # (F,) first frame of each frame's chunk
    rest = frames if window is None else window - sink - chunk  # non-sink frames kept before a chunk
    if rest < 0:
        raise ValueError(f"a chunk of {chunk} frames and {sink} sink frames do not fit a window of {window}")
    q, k = start[:, None], f[None, :]  # (F, 1) query chunk starts, (1, F) key frames
    past = (k < q) & ((k < sink) | (k >= q - rest))  # (F, F) clean frames before the chunk, as cached
    same = start[:, None] == start[None, :]  # (F, F) the chunk itself
    frame_mask = torch.cat([torch.cat([past | same, torch.zeros_like(past)], 1),  # clean queries
                            torch.cat([past, same], 1)])  # noisy queries
    return frame_mask.repeat_interleave(frame_tokens, 0).repeat_interleave(frame_tokens, 1)  # (2S, 2S)


# ------------------------------------------------------------------------------ the cache


@dataclass
class KVCache:
    """One stream's past: per layer, keys (rotated) and values of `frames` frames, sink first.

    k, v: (layers, B, window * frame_tokens, heads, head_dim). `position` is the RoPE position the
    next chunk starts at. `reserve(n)` makes room for a chunk of n frames and gives its token slots;
    the model writes them on every call for that chunk; `commit(n)` makes the chunk part of the past.
    """

    k: torch.Tensor
    v: torch.Tensor
    window: int  # frames the cache holds, the chunk being made included
    sink: int  # first frames never dropped
    frame_tokens: int
    frames: int = 0
    position: int = 0
    slots: tuple[int, int] = (0, 0)  # the chunk's token range, set by reserve
    dropped: int = 0  # frames evicted so far

    @classmethod
    def empty(cls, cfg: CausalWanConfig, batch: int, window: int, sink: int, frame_tokens: int,
              device: torch.device | str, dtype: torch.dtype) -> KVCache:
        shape = (cfg.num_layers, batch, window * frame_tokens, cfg.num_heads, cfg.head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype),
                   window, sink, frame_tokens)

    def row(self, i: int) -> KVCache:
        """Stream i of a batched cache: a cache over the same storage (row i), the same counters."""
        return KVCache(self.k[:, i:i + 1], self.v[:, i:i + 1], self.window, self.sink, self.frame_tokens, self.frames,
                       self.position, self.slots, self.dropped)

    def copy_counters(self, other: KVCache) -> None:
        self.frames, self.position, self.slots, self.dropped = other.frames, other.position, other.slots, other.dropped

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def reserve(self, n: int) -> tuple[int, int]:
        """Room for a chunk of n frames (evicting the oldest non-sink frames); its token slots."""
        if n + self.sink > self.window:
            raise ValueError(f"a chunk of {n} frames and {self.sink} sink frames do not fit a window of {self.window}")
        over = self.frames + n - self.window
        if over > 0:
            t, s = self.frame_tokens, self.sink * self.frame_tokens
            keep = (self.frames - self.sink - over) * t
            src = slice(s + over * t, s + over * t + keep)
            self.k[:, :, s:s + keep] = self.k[:, :, src].clone()
            self.v[:, :, s:s + keep] = self.v[:, :, src].clone()
            self.frames -= over
            self.dropped += over
        start = self.frames * self.frame_tokens
        self.slots = (start, start + n * self.frame_tokens)
        return self.slots

    def place(self, first: int, n: int) -> None:
        """Point the slots at cached frames first .. first + n - 1 (re-caching them): a call reads
        the frames up to them, the ones after them out of sight."""
        if first + n > self.frames:
            raise ValueError(f"frames {first}..{first + n - 1} are not in the cache ({self.frames})")
        self.slots = (first * self.frame_tokens, (first + n) * self.frame_tokens)

    def commit(self, n: int) -> None:
        self.frames += n
        self.position += n

    def rebase(self, tables, n: int) -> None:
        """Before a chunk of n frames whose RoPE positions would pass the table: renumber the window's
        frames to follow the sink (rotate their cached keys back by the gap)."""
        if self.position + n <= tables[0].shape[0]:
            return
        first_window = self.position - (self.frames - self.sink)  # the oldest window frame's position
        gap = first_window - self.sink
        if gap <= 0:
            raise ValueError("the RoPE table is too short for this window")
        back = tables[0][gap].conj()  # (time_pairs,) complex: a rotation by -gap
        s = self.sink * self.frame_tokens
        end = self.frames * self.frame_tokens
        keys = self.k[:, :, s:end]  # (L, B, S, H, D)
        pairs = back.shape[0]
        z = torch.view_as_complex(keys.to(torch.float64).reshape(*keys.shape[:-1], -1, 2))
        z[..., :pairs] = z[..., :pairs] * back.to(z.device)
        self.k[:, :, s:end] = torch.view_as_real(z).flatten(-2).to(self.k.dtype)
        self.position -= gap


@dataclass
class CausalText:
    """A prompt's embeddings (B, text_len, dim) after `text_embedding`, and each layer's
    cross-attention keys and values, computed on first use (the references' crossattn_cache)."""

    context: torch.Tensor
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


# ------------------------------------------------------------------------------ layers


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LayerNorm(nn.LayerNorm):
    def __init__(self, dim: int, eps: float, affine: bool = False):
        super().__init__(dim, eps=eps, elementwise_affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).type_as(x)


class Attention(nn.Module):
    """q, k, v, o projections with RMS-normed queries and keys (Wan's self and cross attention)."""

    def __init__(self, dim: int, heads: int, qk_norm: bool, eps: float):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q = RMSNorm(dim, eps) if qk_norm else nn.Identity()
        self.norm_k = RMSNorm(dim, eps) if qk_norm else nn.Identity()

    def split(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, dim) -> (B, S, H, D)
        return x.unflatten(-1, (self.heads, -1))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, Sq, H, D), k and v (B, Sk, H, D), mask (Sq, Sk) bool or None -> o((B, Sq, dim))."""
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.o(out.transpose(1, 2).flatten(2))


class SelfAttention(Attention):
    def forward(self, x: torch.Tensor, rot: torch.Tensor, layer: int, cache: KVCache | None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, S, dim) of the chunk; with a cache its keys and values go to the cache's slots and
        the chunk attends to every cached frame and to itself. Without one, `mask` (S, S) bool (None:
        every token attends to every other) is the training's teacher-forcing mask."""
        q = apply_rope(self.split(self.norm_q(self.q(x))), rot)  # (B, S, H, D)
        k = apply_rope(self.split(self.norm_k(self.k(x))), rot)
        v = self.split(self.v(x))
        if cache is None:
            return self.attend(q, k, v, mask)
        if mask is not None:
            raise ValueError("a mask is for the training's teacher forcing, without a cache")
        start, end = cache.slots
        cache.k[layer, :, start:end] = k
        cache.v[layer, :, start:end] = v
        return self.attend(q, cache.k[layer, :, :end], cache.v[layer, :, :end])


class CrossAttention(Attention):
    def forward(self, x: torch.Tensor, text: CausalText, layer: int) -> torch.Tensor:
        q = self.split(self.norm_q(self.q(x)))
        if layer not in text.kv:
            text.kv[layer] = (self.split(self.norm_k(self.k(text.context))), self.split(self.v(text.context)))
        k, v = text.kv[layer]
        return self.attend(q, k, v)


class Block(nn.Module):
    """Self-attention, cross-attention, feed-forward; adaLN modulation per frame."""

    def __init__(self, cfg: CausalWanConfig):
        super().__init__()
        dim = cfg.dim
        self.norm1 = LayerNorm(dim, cfg.eps)
        self.self_attn = SelfAttention(dim, cfg.num_heads, cfg.qk_norm, cfg.eps)
        self.norm3 = LayerNorm(dim, cfg.eps, affine=True) if cfg.cross_attn_norm else nn.Identity()
        self.cross_attn = CrossAttention(dim, cfg.num_heads, cfg.qk_norm, cfg.eps)
        self.norm2 = LayerNorm(dim, cfg.eps)
        self.ffn = nn.Sequential(nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor, rot: torch.Tensor, text: CausalText, layer: int,
                cache: KVCache | None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, F*T, dim), e (B, F, 6, dim) -> (B, F*T, dim)."""
        f = e.shape[1]
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation.unsqueeze(1) + e).unbind(2)  # (B, F, dim)

        def per_frame(y: torch.Tensor) -> torch.Tensor:  # (B, F*T, dim) -> (B, F, T, dim)
            return y.unflatten(1, (f, -1))

        h = (per_frame(self.norm1(x)) * (1 + scale1[:, :, None]) + shift1[:, :, None]).flatten(1, 2)
        y = self.self_attn(h, rot, layer, cache, mask)
        x = x + (per_frame(y) * gate1[:, :, None]).flatten(1, 2)
        x = x + self.cross_attn(self.norm3(x), text, layer)
        h = (per_frame(self.norm2(x)) * (1 + scale2[:, :, None]) + shift2[:, :, None]).flatten(1, 2)
        return x + (per_frame(self.ffn(h)) * gate2[:, :, None]).flatten(1, 2)


class Head(nn.Module):
    def __init__(self, cfg: CausalWanConfig):
        super().__init__()
        self.norm = LayerNorm(cfg.dim, cfg.eps)
        self.head = nn.Linear(cfg.dim, math.prod(cfg.patch_size) * cfg.out_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, cfg.dim) / cfg.dim ** 0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """x (B, F*T, dim), e (B, F, dim) -> (B, F, T, patch * out)."""
        shift, scale = (self.modulation.unsqueeze(1) + e[:, :, None]).unbind(2)  # (B, F, dim)
        x = self.norm(x).unflatten(1, (e.shape[1], -1))  # (B, F, T, dim)
        return self.head(x * (1 + scale[:, :, None]) + shift[:, :, None])


# ------------------------------------------------------------------------------ the model


class CausalWan(nn.Module):
    """model(x, t, text, cache) -> Wan's output (noise - data) for a chunk.

    x (B, F, C, H, W) latents of one chunk, t (B, F) timesteps in Wan's units (1000 = noise),
    text from `embed_text`. Without a cache the frames attend to each other only (one chunk alone).
    """

    def __init__(self, cfg: CausalWanConfig):
        super().__init__()
        self.cfg = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, dim), nn.GELU(approximate="tanh"),
                                            nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.head = Head(cfg)
        self.rope = rope_tables(cfg.head_dim)  # (not buffers: they stay complex128 on every .to())

    def frame_tokens(self, h: int, w: int) -> int:
        """Tokens of one latent frame of h x w."""
        return (h // self.cfg.patch_size[1]) * (w // self.cfg.patch_size[2])

    def embed_text(self, embeddings: torch.Tensor) -> CausalText:
        """(B, L, text_dim) encoder output, L <= text_len -> the condition (zero-padded to text_len)."""
        b, n, d = embeddings.shape
        n = min(n, self.cfg.text_len)
        p = next(self.parameters())
        padded = torch.zeros(b, self.cfg.text_len, d, device=p.device, dtype=p.dtype)
        padded[:, :n] = embeddings[:, :n].to(p.device, p.dtype)
        return CausalText(self.text_embedding(padded))  # (B, text_len, dim)

    def new_cache(self, batch: int, window: int, sink: int, height: int, width: int) -> KVCache:
        """An empty cache for latents of height x width: `window` frames, the first `sink` kept."""
        p = next(self.parameters())
        return KVCache.empty(self.cfg, batch, window, sink, self.frame_tokens(height, width), p.device, p.dtype)

    def forward(self, x: torch.Tensor, t: torch.Tensor, text: CausalText, cache: KVCache | None = None,
                first_frame: int | None = None) -> torch.Tensor:
        b, f = x.shape[:2]
        gh, gw = x.shape[-2] // self.cfg.patch_size[1], x.shape[-1] // self.cfg.patch_size[2]
        start = (cache.position if cache is not None else 0) if first_frame is None else first_frame
        rot = rope_rotations(self.rope, start, f, gh, gw).to(x.device)  # (F*h*w, 1, D / 2)
        return self._run(x, t, text, cache, rot)

    def teacher_forcing(self, clean: torch.Tensor, noisy: torch.Tensor, t: torch.Tensor, text: CausalText,
                        chunk: int, window: int | None = None, sink: int = 0) -> torch.Tensor:
        """Training's one call for a whole clip: clean and noisy (B, F, C, H, W) the same frames,
        t (B, F) the noisy frames' timesteps (per chunk) -> the output (B, F, C, H, W) for the noisy
        frames, each chunk seeing the clean frames before it (`teacher_forcing_mask`) as the cached
        path does when the clean chunks were committed at t = 0."""
        b, f = clean.shape[:2]
        gh, gw = clean.shape[-2] // self.cfg.patch_size[1], clean.shape[-1] // self.cfg.patch_size[2]
        rot = rope_rotations(self.rope, 0, f, gh, gw).to(clean.device)  # (F*h*w, 1, D / 2)
        mask = teacher_forcing_mask(f, chunk, gh * gw, window, sink).to(clean.device)  # (2S, 2S)
        x = torch.cat([clean, noisy], dim=1)  # (B, 2F, C, H, W)
        tt = torch.cat([torch.zeros_like(t), t], dim=1)  # (B, 2F)
        return self._run(x, tt, text, None, torch.cat([rot, rot]), mask)[:, f:]

    def _run(self, x: torch.Tensor, t: torch.Tensor, text: CausalText, cache: KVCache | None, rot: torch.Tensor,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        b, f, c, hh, ww = x.shape
        pt, ph, pw = self.cfg.patch_size
        tokens = self.patch_embedding(x.permute(0, 2, 1, 3, 4))  # (B, dim, F, h, w)
        gh, gw = tokens.shape[-2:]
        tokens = tokens.flatten(2).transpose(1, 2)  # (B, F*h*w, dim)
        emb = self.time_embedding(timestep_embedding(self.cfg.freq_dim, t.flatten()).type_as(tokens))  # (B*F, dim)
        e6 = self.time_projection(emb).unflatten(1, (6, self.cfg.dim)).unflatten(0, (b, f))  # (B, F, 6, dim)
        for i, block in enumerate(self.blocks):
            tokens = block(tokens, e6, rot, text, i, cache, mask)
        out = self.head(tokens, emb.unflatten(0, (b, f)))  # (B, F, h*w, pt*ph*pw*C)
        out = out.view(b, f, gh, gw, pt, ph, pw, -1)
        out = torch.einsum("bfhwpqrc->bfpchqwr", out).reshape(b, f * pt, -1, gh * ph, gw * pw)
        return out  # (B, F, C, H, W)
