"""Export specs of the image networks, and the image seam on their engines (the video network's:
`models/video/video_engine.py`).

The three calls of the image seam (`models/image/image_net.py`) are exported as they are, so
an engine computes exactly what the eager call does (the VAE's scaling included):

    unet          (sample (B, 4, h, w), timestep (B,), one input per ImageCond tensor) -> latent (B, 4, h, w)
    vae_encoder   images (B, 3, H, W) in [-1, 1] -> latents (B, 4, H/8, W/8), scaled
    vae_decoder   latents (B, 4, h, w), scaled -> images (B, 3, H, W)

The condition's inputs are named after its fields (`cond_feeds`): the spec and `EngineImageNet`
feed them by the same names. `height`/`width` of the image specs are pixels. With ControlNets
the UNet's graph holds them too (their images `control_i` (B, 3, H, W) at pixel size and their
scales `control_scale` (B, n) are inputs); with an IP-Adapter its image embedding
`image_embeds` (B, 1, D) and its per-row scale `ip_scale` (B, 1) are inputs (a live scale
or reference change needs no new engine).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from streamstudio.errors import StreamStudioError
from streamstudio.kernels.tensorrt.export import ExportSpec, random_normal, random_uniform
from streamstudio.kernels.tensorrt.runtime import TRTEngine
from streamstudio.models.image.image_net import (DiffusersImageNet, ImageCond, ImageNet, Layout, WrappedImageNet,
                                                 broadcast, check_bank)

if TYPE_CHECKING:  # (by its module: diffusers' top-level names are dummies to a type checker)
    from diffusers.models.attention_processor import IPAdapterAttnProcessor2_0

IMAGE_PARTS = ("unet", "vae_encoder", "vae_decoder")


IP_SCALE = "ip_scale"  # the UNet engine's input of the IP-Adapter's per-row scale, (B, 1): ImageCond.ip_scale


def ip_processors(unet: nn.Module) -> list[IPAdapterAttnProcessor2_0]:
    """The UNet's IP-Adapter attention processors (they hold to_k_ip), in a fixed order; []
    without an adapter."""
    procs = getattr(unet, "attn_processors", None) or {}
    return [p for _, p in sorted(procs.items()) if hasattr(p, "to_k_ip")]


def ip_scale(unet: nn.Module) -> float | None:
    """The scale the UNet's IP-Adapter processors apply to a call without per-row scales (the
    adapter's default, `IPAdapter.set_scale`), or None without an adapter."""
    procs = ip_processors(unet)
    if not procs:
        return None
    scale = procs[0].scale
    return float(scale[0] if isinstance(scale, (list, tuple)) else scale)


def cond_feeds(cond: ImageCond) -> dict[str, torch.Tensor]:
    """The condition's tensors by input name: a field's own name, or name_i for a tuple's i-th."""
    layout, tensors = cond.flatten()
    names = [n for name, count in layout for n in ([name] if count < 0 else [f"{name}_{i}" for i in range(count)])]
    return dict(zip(names, tensors))


# ---------------------------------------------------------------------------------------------
# Image: the seam's calls as tensors-in, tensor-out modules
# ---------------------------------------------------------------------------------------------

class EpsExport(nn.Module):
    """The UNet call with its ControlNets (and an IP-Adapter, which lives in the UNet): sample,
    timestep and the condition's tensors in, the prediction out."""

    def __init__(self, net: DiffusersImageNet, layout: Layout):
        super().__init__()
        self.unet = net.unet  # registered: its weights are the graph's (an IP-Adapter's too: it is in the UNet)
        self.controlnets = nn.ModuleList(net.controlnets)  # and the ControlNets' (their residuals are in the call)
        self.net, self.layout = net, layout

    def forward(self, sample, timestep, *cond):  # (B, 4, h, w), (B,), ImageCond's tensors
        return self.net.eps(sample, timestep, ImageCond.unflatten(self.layout, cond))


class EncodeExport(nn.Module):
    def __init__(self, net: DiffusersImageNet):
        super().__init__()
        self.vae, self.net = net.vae, net

    def forward(self, images):  # (B, 3, H, W) in [-1, 1] -> (B, 4, H/8, W/8), scaled
        return self.net.encode(images)


class DecodeExport(nn.Module):
    def __init__(self, net: DiffusersImageNet):
        super().__init__()
        self.vae, self.net = net.vae, net

    def forward(self, latents):  # (B, 4, h, w), scaled -> (B, 3, 8h, 8w)
        return self.net.decode(latents)


def text_dim(unet: nn.Module, default: int = 768) -> int:
    """The width of the text embeddings a diffusers UNet takes (its cross-attention dim)."""
    dim = getattr(unet.config, "cross_attention_dim", None) or default
    return int(dim[0] if isinstance(dim, (list, tuple)) else dim)


def eps_spec(net: DiffusersImageNet, text_len: int = 77, cond: Callable | None = None) -> ExportSpec:
    """The UNet call's spec. `cond(b, h, w, device, dtype)`: a condition of b rows with every
    field the model takes at h x w pixels (`SDComponents.example_cond`: SDXL's pooled text and
    time ids, ControlNet images and scales, IP-Adapter's embedding); None: text only. The
    engine's identity (its cache key) covers the ControlNets' weights with the UNet's."""
    channels, scale, width = net.latent_channels, net.latent_scale, text_dim(net.unet)

    with_ip = bool(ip_processors(net.unet))

    def example_cond(b, h, w, device, dtype, gen) -> ImageCond:
        if cond is None:
            return ImageCond(text=random_normal((b, text_len, width), device, dtype, gen))
        example = cond(b, h, w, device, dtype).map(lambda t: random_normal(tuple(t.shape), device, t.dtype, gen))
        if with_ip and example.image_embeds is not None:  # the IP-Adapter's scale, per row: an input, never a constant
            example = dataclasses.replace(example,
                                          ip_scale=random_uniform((b, 1), 0.0, 1.5, device, torch.float32, gen))
        return example

    def make(b, h, w, device, dtype, gen):
        return {"sample": random_normal((b, channels, h // scale, w // scale), device, dtype, gen),
                "timestep": random_uniform((b,), 0.0, 999.0, device, torch.float32, gen),
                **cond_feeds(example_cond(b, h, w, device, dtype, gen))}

    meta = torch.device("meta")
    layout = example_cond(1, 8 * scale, 8 * scale, meta, torch.float32, None).flatten()[0]
    names = list(make(1, 8 * scale, 8 * scale, meta, torch.float32, None))
    latent_axes = {0: "batch", 2: "latent_height", 3: "latent_width"}
    image_axes = {0: "batch", 2: "height", 3: "width"}  # the ControlNets' images are pixels
    axes = {name: {0: "batch"} for name in names} | {"sample": latent_axes, "latent": latent_axes} | \
        {name: image_axes for name in names if name.startswith("control_") and name != "control_scale"}
    source = nn.ModuleList([net.unet, *net.controlnets]) if net.controlnets else net.unet
    return ExportSpec("unet", EpsExport(net, layout).eval(), source, names, ["latent"], axes, make)


def vae_encoder_spec(net: DiffusersImageNet) -> ExportSpec:
    def make(b, h, w, device, dtype, gen):
        return {"images": random_uniform((b, 3, h, w), -1.0, 1.0, device, dtype, gen)}

    axes = {"images": {0: "batch", 2: "height", 3: "width"},
            "latents": {0: "batch", 2: "latent_height", 3: "latent_width"}}
    return ExportSpec("vae_encoder", EncodeExport(net).eval(), net.vae, ["images"], ["latents"], axes, make)


def vae_decoder_spec(net: DiffusersImageNet) -> ExportSpec:
    channels = int(getattr(net.vae.config, "latent_channels", 4))
    scale = net.latent_scale

    def make(b, h, w, device, dtype, gen):
        return {"latents": random_normal((b, channels, h // scale, w // scale), device, dtype, gen)}

    axes = {"latents": {0: "batch", 2: "latent_height", 3: "latent_width"},
            "images": {0: "batch", 2: "height", 3: "width"}}
    return ExportSpec("vae_decoder", DecodeExport(net).eval(), net.vae, ["latents"], ["images"], axes, make)


def image_specs(comps, parts: tuple[str, ...] = IMAGE_PARTS) -> list[ExportSpec]:
    """Export specs of an SDComponents' image networks (UNet, VAE encoder, VAE decoder)."""
    net = comps.net.eager
    text_len = int(getattr(comps.tokenizer, "model_max_length", 77))
    makers = {"unet": lambda: eps_spec(net, text_len, comps.example_cond), "vae_encoder": lambda: vae_encoder_spec(net),
              "vae_decoder": lambda: vae_decoder_spec(net)}
    unknown = [p for p in parts if p not in makers]
    if unknown:
        raise StreamStudioError(f"unknown network(s) {unknown}; choose from {', '.join(makers)}")
    return [makers[p]() for p in parts]


class EngineImageNet(WrappedImageNet):
    """The image seam on TensorRT engines exported from it; a call without an engine (None)
    stays on `inner`. Engines take no feature bank (no attention layers to extend).

    The UNet engine is fed every input its spec declares: sample, timestep, each field of the
    condition by name (SDXL's text_embeds and time_ids, control_i and control_scale of the
    ControlNets, IP-Adapter's image_embeds and per-row ip_scale: for a call without it, such as
    a warm-up's, the adapter's default scale, as the eager call uses); a condition
    missing an input the engine takes, or carrying a field it was built without, is an error
    that says so (never a silently wrong frame).

    LoRAs: the engine holds the weights. `watch()` says which weights the UNet has now (the
    LoRA set's version); when it moves, the UNet engine is rebuilt for the new weights by
    `rebuild()` before the next call (an engine of the same weights from the cache is loaded
    instead: removing a LoRA finds the base engine again). Engines are not built refittable,
    so there is no refit."""

    fixed_shapes = True

    def __init__(self, inner: ImageNet, unet: TRTEngine | None = None, encoder: TRTEngine | None = None,
                 decoder: TRTEngine | None = None, *, rebuild: Callable[[], TRTEngine | None] | None = None,
                 watch: Callable[[], object] | None = None):
        super().__init__(inner)
        self.unet_engine, self.encoder_engine, self.decoder_engine = unet, encoder, decoder
        self.rebuild, self.watch = rebuild, watch
        self._weights = watch() if watch is not None else None  # what the UNet engine was built from
        self.rebuilds = 0
        self._scales: dict = {}  # (rows, device, scale) -> (B, 1) IP-Adapter default scale, made once

    @property
    def takes_bank(self) -> bool:
        return self.unet_engine is None and self.inner.takes_bank

    def _current_unet_engine(self):
        """The UNet engine for the weights the UNet has now (rebuilt when a LoRA changed them)."""
        if self.watch is not None and self.unet_engine is not None:
            weights = self.watch()
            if weights != self._weights:
                if self.rebuild is None:
                    raise StreamStudioError("the UNet's weights changed (a LoRA?) and its TensorRT engine cannot be "
                                            "rebuilt here; use --acceleration none or compile to change LoRAs live")
                self.unet_engine = self.rebuild()
                self._weights = weights
                self.rebuilds += 1
        return self.unet_engine

    def _ip_scale(self, rows: int, device: torch.device) -> torch.Tensor:
        scale = ip_scale(self.eager.unet)
        key = (rows, str(device), scale)
        if key not in self._scales:
            if len(self._scales) > 64:
                self._scales.clear()
            self._scales[key] = torch.full((rows, 1), 0.0 if scale is None else scale, device=device)  # (B, 1)
        return self._scales[key]

    def unet_feeds(self, engine, x: torch.Tensor, t: torch.Tensor, cond: ImageCond) -> dict[str, torch.Tensor]:
        """Every input of the UNet engine by name; a condition that does not match the engine's
        inputs raises StreamStudioError naming what is missing or extra."""
        feeds = {"sample": x, "timestep": t, **cond_feeds(cond)}
        names = list(getattr(engine, "input_names", None) or feeds)
        if IP_SCALE in names and IP_SCALE not in feeds:
            feeds[IP_SCALE] = self._ip_scale(x.shape[0], x.device)
        missing = [n for n in names if n not in feeds]
        extra = [n for n in feeds if n not in names]
        if missing or extra:
            raise StreamStudioError(
                f"the TensorRT UNet engine takes inputs {names}, but the call has {list(feeds)} (missing {missing}, "
                f"not taken {extra}): the engine was built for other add-ons (ControlNets, IP-Adapter, SDXL); "
                "build it again with the model's add-ons (streamstudio build-engines with the same flags)")
        return feeds

    def eps(self, x, t, cond, bank=None):
        if bank:
            check_bank(self)
        engine = self._current_unet_engine()
        if engine is None:
            return self.inner.eps(x, t, cond, bank)
        t, cond = broadcast(x.shape[0], t, cond, x.device)  # (B,), B rows
        return engine(**self.unet_feeds(engine, x, t, cond))["latent"].to(x.dtype)  # (B, 4, h, w)

    def encode(self, images):
        if self.encoder_engine is None:
            return self.inner.encode(images)
        return self.encoder_engine(images=images)["latents"].to(images.dtype)  # (B, 4, H/8, W/8)

    def decode(self, latents):
        if self.decoder_engine is None:
            return self.inner.decode(latents)
        return self.decoder_engine(latents=latents)["images"].to(latents.dtype)  # (B, 3, H, W)
