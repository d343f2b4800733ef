"""StreamV2V's feature bank (arXiv 2405.15757) as a diffusers attention processor.

A bank keeps, for each self-attention layer (`attn1`) of the UNet and each batch row *key*,
the keys, values and outputs of that layer in earlier UNet calls, at most `size` entries, first
in first out. While a bank call is active, each self-attention layer

- attends to the bank as well ("extended self-attention"): the row's keys and values are its
  own, then its bank entries' (`K = [k; K_1; ...; K_m]`, the same for V), and
- fuses its output with the nearest bank outputs ("feature fusion", only in the low-resolution
  layers `mid_block`, `up_blocks.0`, `up_blocks.1`, as the reference does): each token's
  output h takes its most cosine-similar bank output o*; where the similarity is at least
  `threshold`, h <- (1 - fusion) * h + fusion * o*,

and then appends this call's own keys, values and outputs (the output before fusion) to the
row's bank when the row is marked for writing. That is the reference implementation's
`CachedSTXFormersAttnProcessor` (deque of `max_frames` entries, written every `interval`-th
call, fusion strength 0.8 and threshold 0.98 by default) without its token merging.

Rows and keys. The reference keeps one bank tensor per batch row position: with Stream Batch,
row j (the frame at denoising step j) attends to what row j held in earlier calls, i.e. older
frames at the same noise level. Here each row names its key (the pipeline uses
(branch, step, frame of the group), branch "c" for the prompt's rows and "u" for the
unconditional rows of full / initialize CFG), which is the same rule, and holds however the
rows are laid out in a call (sequential steps, Stream Batch, CFG on or off, several streams in
one batch).

Many streams share one UNet: the bank is the stream's own (`FeatureBank`), and the processor
reads the rows of the current call from a context (`attending`), a list of row segments each
naming its bank, so one batched UNet call can serve several streams with their own banks.
`attending` puts the bank processors on the UNet's `attn1` layers only for the
duration of a bank call and puts the previous processors back afterwards: calls without a bank
run the original processors untouched (bit-exact), and compiled graphs or TensorRT engines of
the same UNet never see the bank code. Bank calls reach it through the image seam,
`models/image/image_net.ImageNet.eps(..., bank=segments)`. The UNet's calls must be serialized (one
executor thread, or the model lock), as they are everywhere in StreamStudio.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # (diffusers loads with the model)
    from diffusers.models.attention_processor import Attention

FUSION_LAYERS = ("mid_block", "up_blocks.0", "up_blocks.1")  # the reference's feature-injection layers



def attention_input(attn, hidden_states: torch.Tensor, temb) -> tuple[torch.Tensor, int, tuple | None]:
    """The opening of diffusers' attention processors (AttnProcessor2_0, IPAdapterAttnProcessor2_0):
    spatial norm, a (B, C, h, w) input flattened to (B, h*w, C), group norm. Returns the tokens,
    the input's ndim and its 4D shape (None for a 3D input)."""
    if attn.spatial_norm is not None:
        hidden_states = attn.spatial_norm(hidden_states, temb)
    input_ndim, shape = hidden_states.ndim, None
    if input_ndim == 4:
        shape = tuple(hidden_states.shape)
        b, c, h, w = shape
        hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)
    if attn.group_norm is not None:
        hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
    return hidden_states, input_ndim, shape


def attention_output(attn, out: torch.Tensor, residual: torch.Tensor, shape: tuple | None) -> torch.Tensor:
    """The close of diffusers' attention processors: output projection and dropout, back to the
    input's 4D `shape`, the residual, the output rescale."""
    out = attn.to_out[1](attn.to_out[0](out))
    if shape is not None:
        out = out.transpose(-1, -2).reshape(shape)
    if attn.residual_connection:
        out = out + residual
    return out / attn.rescale_output_factor


class FeatureBank:
    """One stream's bank: per (layer, row key), up to `size` past entries of (keys, values,
    outputs), each (T, C), kept concatenated along the tokens (m * T, C)."""

    def __init__(self, size: int = 2, interval: int = 1, threshold: float = 0.98, fusion: float = 0.8):
        self.size, self.interval, self.threshold, self.fusion = size, interval, threshold, fusion
        self._store: dict[tuple[str, Hashable], tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = {}
        self._frames = 0

    def configure(self, size: int, interval: int, threshold: float, fusion: float) -> None:
        """Change the settings; a smaller size drops the oldest entries now."""
        self.interval, self.threshold, self.fusion = interval, threshold, fusion
        if size < self.size:
            for name, (k, v, o, m) in list(self._store.items()):
                if size == 0:
                    del self._store[name]
                elif m > size:
                    t = k.shape[0] // m
                    drop = (m - size) * t
                    self._store[name] = (k[drop:].clone(), v[drop:].clone(), o[drop:].clone(), size)
        self.size = size

    def clear(self) -> None:
        self._store.clear()
        self._frames = 0

    def next_frame(self) -> int:
        """Count a frame (or group of frames) entering the stream; returns its index (0, 1, ...)."""
        self._frames += 1
        return self._frames - 1

    def writes(self, frame: int) -> bool:
        """Whether frame `frame`'s features go into the bank: every `interval`-th frame, the
        first one included (the update rule)."""
        return frame >= 0 and frame % max(1, self.interval) == 0

    @property
    def entries(self) -> int:
        """Entries of the fullest (layer, key) (0: empty)."""
        return max((m for *_, m in self._store.values()), default=0)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes + o.nbytes for k, v, o, _ in self._store.values())

    def get(self, layer: str, key: Hashable):
        """(keys, values, outputs, m) with tensors (m * T, C), or None when empty."""
        return self._store.get((layer, key))

    def put(self, layer: str, key: Hashable, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> None:
        """Append one entry (each (T, C)); the oldest goes when the bank is full."""
        if self.size <= 0:
            return
        old = self._store.get((layer, key))
        if old is None or old[0].shape[1:] != k.shape[1:] or old[0].shape[0] % k.shape[0]:
            self._store[(layer, key)] = (k.clone(), v.clone(), o.clone(), 1)
            return
        ko, vo, oo, m = old
        t = k.shape[0]
        if m >= self.size:
            drop = (m - self.size + 1) * t
            ko, vo, oo, m = ko[drop:], vo[drop:], oo[drop:], self.size - 1
        self._store[(layer, key)] = (torch.cat([ko, k]), torch.cat([vo, v]), torch.cat([oo, o]), m + 1)


@dataclass(frozen=True)
class BankRows:
    """What one stream's UNet call asks of its bank: a key per batch row (None: that row uses
    no bank) and, per row, whether its features are written into the bank after it read it."""

    bank: FeatureBank
    keys: tuple[Hashable | None, ...]
    writes: tuple[bool, ...]

    @property
    def rows(self) -> int:
        return len(self.keys)


# (start row, BankRows) segments of the batch of the UNet call now running on this thread
_ATTENDING: contextvars.ContextVar[tuple[tuple[int, BankRows], ...] | None] = contextvars.ContextVar(
    "streamstudio_feature_bank_attending", default=None)
def self_attention_layers(unet: torch.nn.Module) -> list[tuple[str, Attention]]:
    """(name, Attention) of every self-attention layer (`attn1`) of a diffusers UNet."""
    from diffusers.models.attention_processor import Attention

    return [(name, module) for name, module in unet.named_modules() if name.endswith("attn1")
            and isinstance(module, Attention)]


_install_lock = threading.Lock()


@contextlib.contextmanager
def attending(unet: torch.nn.Module, segments: Sequence[tuple[int, BankRows]]):
    """Run the block with the bank processors on `unet`'s attn1 layers (the diffusers UNet)
    and `segments` ((start row, BankRows), ...) as this thread's bank call."""
    token = _ATTENDING.set(tuple(segments))
    layers = self_attention_layers(unet)
    with _install_lock:
        saved = [(module, module.processor) for _, module in layers]
        for name, module in layers:
            if not isinstance(module.processor, BankAttnProcessor):  # (diffusers' type names its own
                # processor classes; it takes any processor object, as its docs say)
                module.set_processor(BankAttnProcessor(name, module.processor))  # type: ignore[arg-type]
    try:
        yield
    finally:
        with _install_lock:
            for module, processor in saved:
                module.set_processor(processor)
        _ATTENDING.reset(token)


class BankAttnProcessor:
    """Extended self-attention over the current call's banks, and feature fusion; without a
    bank call on this thread (or for a layout it does not handle) it is `base`."""

    def __init__(self, name: str, base):
        self.name, self.base = name, base
        self.fuses = name.startswith(FUSION_LAYERS)

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None, *args, **kwargs):
        segments = _ATTENDING.get()
        if segments is None or encoder_hidden_states is not None or attention_mask is not None:
            return self.base(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        return self._bank_attention(attn, hidden_states, temb, segments)

    def _row_plan(self, segments, batch: int):
        """Per row: (BankRows, key, write) or None."""
        plan: list[tuple[BankRows, Hashable, bool] | None] = [None] * batch
        for start, rows in segments:
            for i, (key, write) in enumerate(zip(rows.keys, rows.writes)):
                if key is not None and start + i < batch:
                    plan[start + i] = (rows, key, write)
        return plan

    def _bank_attention(self, attn, hidden_states: torch.Tensor, temb, segments) -> torch.Tensor:
        # the steps of diffusers' AttnProcessor2_0, with the keys and values extended per row
        residual = hidden_states
        hidden_states, input_ndim, shape = attention_input(attn, hidden_states, temb)  # (B, T, C)
        batch = hidden_states.shape[0]
        query = attn.to_q(hidden_states)  # (B, T, C')
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)
        inner = key.shape[-1]
        head_dim = inner // attn.heads

        plan = self._row_plan(segments, batch)
        found = [None if p is None else p[0].bank.get(self.name, p[1]) for p in plan]
        entries = {r: entry for r, entry in enumerate(found) if entry is not None}  # rows with bank entries
        groups: dict[int, list[int]] = {}  # bank entries m -> rows
        for r, entry in enumerate(found):
            groups.setdefault(0 if entry is None else entry[3], []).append(r)

        def heads(x: torch.Tensor) -> torch.Tensor:  # (b, n, C') -> (b, H, n, d)
            return x.view(x.shape[0], -1, attn.heads, head_dim).transpose(1, 2)

        def attend(q, k, v):
            q, k, v = heads(q), heads(k), heads(v)
            if attn.norm_q is not None:
                q = attn.norm_q(q)
            if attn.norm_k is not None:
                k = attn.norm_k(k)
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)  # (b, H, T, d)
            return out.transpose(1, 2).reshape(q.shape[0], -1, attn.heads * head_dim).to(q.dtype)  # (b, T, C')

        if len(groups) == 1:
            (m, rows), = groups.items()
            if m == 0:
                out = attend(query, key, value)
            else:
                kb = torch.stack([entries[r][0] for r in rows])  # (B, m*T, C')
                vb = torch.stack([entries[r][1] for r in rows])
                out = attend(query, torch.cat([key, kb], 1), torch.cat([value, vb], 1))  # keys (B, (1+m)T, C')
        else:
            out = torch.empty_like(query)
            for m, rows in groups.items():
                idx = torch.tensor(rows, device=query.device)
                q, k, v = query[idx], key[idx], value[idx]
                if m:
                    k = torch.cat([k, torch.stack([entries[r][0] for r in rows])], 1)
                    v = torch.cat([v, torch.stack([entries[r][1] for r in rows])], 1)
                out[idx] = attend(q, k, v)

        out = attention_output(attn, out, residual, shape)  # (B, T, C) (or (B, C, h, w))
        own = out  # what goes into the bank: the output before fusion

        if self.fuses:
            out = self._fuse(out, plan, found, input_ndim)
        for r, p in enumerate(plan):
            if p is not None and p[2]:
                o = own[r] if input_ndim == 3 else own[r].flatten(1).transpose(0, 1)
                p[0].bank.put(self.name, p[1], key[r], value[r], o)
        return out

    def _fuse(self, out: torch.Tensor, plan, found, input_ndim: int) -> torch.Tensor:
        fused = None
        for r, (p, entry) in enumerate(zip(plan, found)):
            if p is None or entry is None or p[0].bank.fusion <= 0:
                continue
            bank = p[0].bank
            h = out[r] if input_ndim == 3 else out[r].flatten(1).transpose(0, 1)  # (T, C)
            ob = entry[2]  # (m*T, C)
            sim = F.normalize(h.float(), dim=-1) @ F.normalize(ob.float(), dim=-1).T  # (T, m*T)
            best, index = sim.max(dim=-1)  # (T,)
            nearest = torch.where((best >= bank.threshold)[:, None], ob[index], h)  # (T, C)
            row = (1 - bank.fusion) * h + bank.fusion * nearest
            if fused is None:
                fused = out.clone()
            fused[r] = row if input_ndim == 3 else row.transpose(0, 1).reshape(out[r].shape)
        return out if fused is None else fused
