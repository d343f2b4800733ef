"""The one seam every image-network call goes through.

An `ImageNet` has three calls, all on its own device and dtype:

    eps(x, t, cond)   x (B, 4, h, w) latents, t (B,) timesteps (or one for all rows), cond an
                      `ImageCond` of B rows (or 1, broadcast) -> the UNet's prediction (B, 4, h, w):
                      the noise, or v for v-prediction models (the sampler converts; the seam is
                      the network, not the scheduler)
    encode(images)    (B, 3, H, W) in [-1, 1] -> (B, 4, H/8, W/8) latents, scaled as the UNet takes them
    decode(latents)   (B, 4, h, w) scaled latents -> (B, 3, 8h, 8w) images in about [-1, 1]

`DiffusersImageNet` is the one adapter of diffusers' modules (UNet2DConditionModel with
AutoencoderKL, AutoencoderTiny or the built-in autoencoder): it alone knows diffusers' call
signatures and output classes, the VAE's scaling factor and the timestep broadcast. The other
variants wrap an ImageNet and call it (or an engine exported from it) through the same three
calls: compiled (`models/image/acceleration.CompiledImageNet`), TensorRT
(`models/image/export_specs.EngineImageNet`) and batched across streams (`models/image/batching.BatchedImageNet`).

The feature bank (`models/image/feature_bank.py`) rides along as `eps(..., bank=segments)`: the rows'
bank keys, which only the eager diffusers UNet can serve (its self-attention processors). A
variant that cannot (a TensorRT engine) says so with `takes_bank = False`.

Adding a conditioning field (SDXL's pooled text and time ids, ControlNet residuals, IP-Adapter
image embeddings): add it to `ImageCond` as `name: torch.Tensor | None = None` (or a tuple of
tensors, e.g. ControlNet's residuals), every tensor with the batch first, and pass it to the
UNet in `DiffusersImageNet.unet_kwargs`. Batching across streams (cat, slice, pad), contiguity
for compiled graphs and the engines' inputs (named after the field) follow from `flatten`;
the export spec (`models/image/export_specs.eps_spec`) needs a maker of an example input for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from streamstudio.errors import StreamStudioError
from streamstudio.models.image import feature_bank
from streamstudio.models.image import controlnet

Layout = tuple[tuple[str, int], ...]  # (field, -1 for one tensor or n for a tuple of n) per field that is set


@dataclass(frozen=True)
class ImageCond:
    """What the UNet is conditioned on, row by row: every field is a tensor with the batch
    first (B, ...), a tuple of such tensors, or None (not given)."""

    text: torch.Tensor  # (B, L, D) text embeddings
    text_embeds: torch.Tensor | None = None  # SDXL: (B, P) pooled text of the second encoder
    time_ids: torch.Tensor | None = None  # SDXL: (B, 6) original size, crop corner, target size
    image_embeds: torch.Tensor | None = None  # IP-Adapter: (B, 1, D) the reference image's CLIP embedding
    control: tuple[torch.Tensor, ...] | None = None  # ControlNets: one (B, 3, H, W) image in [0, 1] per net
    control_scale: torch.Tensor | None = None  # ControlNets: (B, n_nets) conditioning scales
    ip_scale: torch.Tensor | None = None  # IP-Adapter: (B, 1) float32 scale per row (with image_embeds)

    @property
    def rows(self) -> int:
        return self.text.shape[0]

    def flatten(self) -> tuple[Layout, tuple[torch.Tensor, ...]]:
        """(layout, tensors): the fields that are set, in field order, as one flat tuple."""
        layout: list[tuple[str, int]] = []
        tensors: list[torch.Tensor] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            many = isinstance(value, (tuple, list))
            layout.append((f.name, len(value) if many else -1))
            tensors.extend(value if many else [value])
        return tuple(layout), tuple(tensors)

    @classmethod
    def unflatten(cls, layout: Layout, tensors: Sequence[torch.Tensor]) -> "ImageCond":
        fields: dict[str, Any] = {}  # name -> a tensor or a tuple of them
        i = 0
        for name, n in layout:
            fields[name] = tensors[i] if n < 0 else tuple(tensors[i:i + n])
            i += 1 if n < 0 else n
        return cls(**fields)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "ImageCond":
        """The same fields with fn applied to every tensor."""
        layout, tensors = self.flatten()
        return self.unflatten(layout, [fn(t) for t in tensors])

    def expand(self, rows: int) -> "ImageCond":
        """Fields of one row broadcast to `rows` rows (views); fields of `rows` rows as they are."""
        if self.rows == rows:
            return self
        if self.rows != 1:
            raise StreamStudioError(f"a condition of {self.rows} rows cannot serve {rows}")
        return self.map(lambda t: t.expand(rows, *t.shape[1:]))

    def __getitem__(self, rows: slice) -> "ImageCond":
        return self.map(lambda t: t[rows])

    @staticmethod
    def cat(conds: Sequence["ImageCond"]) -> "ImageCond":
        """Rows of several conditions, in order (all with the same fields set)."""
        layouts = {c.flatten()[0] for c in conds}
        if len(layouts) != 1:
            raise StreamStudioError(f"conditions with different fields cannot be joined: {sorted(layouts)}")
        flat = [c.flatten()[1] for c in conds]
        return type(conds[0]).unflatten(layouts.pop(), [torch.cat(parts) for parts in zip(*flat)])


BankSegments = Sequence[tuple[int, feature_bank.BankRows]]  # (first row, that stream's bank rows)


def broadcast(rows: int, t: torch.Tensor | float, cond: ImageCond,
              device: torch.device) -> tuple[torch.Tensor, ImageCond]:
    """The timesteps as (rows,) on `device` and the condition with `rows` rows (views)."""
    t = torch.as_tensor(t, device=device).reshape(-1)
    return (t.expand(rows) if t.numel() == 1 else t), cond.expand(rows)  # (B,), B rows


def net_config(net: nn.Module) -> Any:
    """A diffusers network's config, read by attribute (diffusers' FrozenDict; a test's stand-in
    namespace): torch types a module's attributes as tensors or modules, diffusers as a dict."""
    return getattr(net, "config")


def latent_scale(vae: nn.Module) -> int:
    """Pixels per latent: 2 ** (VAE blocks - 1) (8 for SD's VAE and TAESD)."""
    config = getattr(vae, "config", None)
    blocks = getattr(config, "block_out_channels", None) or getattr(config, "encoder_block_out_channels", None)
    return 2 ** (len(blocks) - 1) if blocks else 8


class ImageNet:
    """The interface (see the module docstring). Variants keep the eager adapter underneath
    (`eager`) for what they cannot run themselves."""

    @property
    def fixed_shapes(self) -> bool:
        """Compiled graphs and engines: send only the batch sizes planned for."""
        return False

    @property
    def takes_bank(self) -> bool:
        """eps(..., bank=...) works."""
        return True

    @property
    def eager(self) -> "DiffusersImageNet":
        raise NotImplementedError

    # the device, dtype, latent channels and pixels per latent of the eager network underneath
    device = property(lambda self: self.eager.device)
    dtype = property(lambda self: self.eager.dtype)
    latent_channels = property(lambda self: self.eager.latent_channels)
    latent_scale = property(lambda self: self.eager.latent_scale)

    def eps(self, x: torch.Tensor, t: torch.Tensor | float, cond: ImageCond,
            bank: BankSegments | None = None) -> torch.Tensor:
        raise NotImplementedError

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class DiffusersImageNet(ImageNet):
    """The seam over diffusers' UNet and VAE, eager."""

    def __init__(self, unet: nn.Module, vae: nn.Module, controlnets: Sequence[nn.Module] = ()):
        self.unet, self.vae = unet, vae
        self.controlnets = tuple(controlnets)  # their residuals join the UNet's when the cond has control images
        self.scaling_factor = float(getattr(vae.config, "scaling_factor", 1.0))  # TAESD: 1

    @property
    def eager(self) -> "DiffusersImageNet":
        return self

    @property
    def takes_bank(self) -> bool:
        return hasattr(self.unet, "attn_processors")  # the bank replaces self-attention processors

    @property
    def device(self) -> torch.device:
        return next(self.unet.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.unet.parameters()).dtype

    @property
    def latent_channels(self) -> int:
        return int(net_config(self.unet).in_channels)

    @property
    def latent_scale(self) -> int:
        return latent_scale(self.vae)

    def unet_kwargs(self, x: torch.Tensor, t: torch.Tensor, cond: ImageCond) -> dict:
        """The condition as diffusers' UNet2DConditionModel takes it: SDXL's pooled text and
        time ids and IP-Adapter's image embedding as added conditioning, the ControlNets'
        summed residuals (models/image/controlnet.py) for their skip connections."""
        added: dict[str, Any] = {}
        if cond.text_embeds is not None:
            added.update(text_embeds=cond.text_embeds, time_ids=cond.time_ids)
        kwargs: dict[str, Any] = {"encoder_hidden_states": cond.text}
        if cond.control is not None:
            if len(cond.control) != len(self.controlnets):
                raise StreamStudioError(f"{len(cond.control)} control images for {len(self.controlnets)} ControlNets")
            assert cond.control_scale is not None  # (control images come with their scales)
            down, mid = controlnet.residuals(self.controlnets, x, t, cond.text, cond.control, cond.control_scale,
                                             added or None)
            kwargs.update(down_block_additional_residuals=down, mid_block_additional_residual=mid)
        if cond.image_embeds is not None:  # per-row scales ride along (models/image/ip_adapter.RowScaledProjection)
            added["image_embeds"] = [cond.image_embeds] + ([] if cond.ip_scale is None else [cond.ip_scale])
        if added:
            kwargs["added_cond_kwargs"] = added
        return kwargs

    def eps(self, x, t, cond, bank=None):
        t, cond = broadcast(x.shape[0], t, cond, x.device)  # (B,), B rows
        if not bank:
            return self.unet(x, t, **self.unet_kwargs(x, t, cond), return_dict=False)[0]  # (B, 4, h, w)
        check_bank(self)
        with feature_bank.attending(self.unet, bank):
            return self.unet(x, t, **self.unet_kwargs(x, t, cond), return_dict=False)[0]

    def encode(self, images):
        out = self.vae.encode(images.to(self._vae_dtype()))  # a VAE kept in float32 (SDXL's) takes float32
        latents = out.latents if hasattr(out, "latents") else out.latent_dist.mean  # TAESD / KL: its mean
        return (latents * self.scaling_factor).to(images.dtype)  # (B, 4, H/8, W/8)

    def decode(self, latents):
        images = self.vae.decode((latents / self.scaling_factor).to(self._vae_dtype())).sample
        return images.to(latents.dtype)  # (B, 3, H, W)

    def _vae_dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype


def check_bank(net: ImageNet) -> None:
    """Raise when `net` cannot serve the feature bank (a TensorRT engine, a UNet without
    self-attention layers)."""
    if not net.takes_bank:
        raise StreamStudioError(
            f"the feature bank needs the torch UNet (its self-attention layers), which {type(net).__name__} does "
            "not run (a TensorRT engine?): use --temporal feedback, or --acceleration none/compile")


class WrappedImageNet(ImageNet):
    """A variant over another ImageNet (`inner`): what it does not run itself, inner does."""

    def __init__(self, inner: ImageNet):
        self.inner = inner

    @property
    def eager(self) -> DiffusersImageNet:
        return self.inner.eager

    @property
    def takes_bank(self) -> bool:
        return self.inner.takes_bank

    def eps(self, x, t, cond, bank=None):
        return self.inner.eps(x, t, cond, bank)

    def encode(self, images):
        return self.inner.encode(images)

    def decode(self, latents):
        return self.inner.decode(latents)
