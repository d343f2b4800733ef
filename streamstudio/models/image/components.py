"""One image model's loaded networks (`SDComponents`: UNet, VAE, text encoders, tokenizers,
scheduler config, add-ons) and what the pipeline must know of them; made by `models/image/loading.py`,
put on a device by `to` (`tune_for_device`: channels_last and cuDNN autotune on a GPU)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from streamstudio.models.image import sdxl
from streamstudio.models.image.image_net import DiffusersImageNet, ImageNet, latent_scale
from streamstudio.models.image.image_net import ImageCond

if TYPE_CHECKING:  # (the add-ons, diffusers and transformers load with the model, not with this module;
    #                 diffusers' classes by their modules' paths: its lazy top-level names are opaque to mypy)
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
    from diffusers.models.autoencoders.autoencoder_tiny import AutoencoderTiny
    from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    from streamstudio.models.image.builtin_image import PixelShuffleAutoencoder
    from streamstudio.models.image.ip_adapter import IPAdapter
    from streamstudio.models.image.lora import LoraSet


@dataclass
class SDComponents:
    """The networks of one Stable Diffusion model and what the pipeline must know of it."""

    unet: UNet2DConditionModel
    vae: AutoencoderKL | AutoencoderTiny | PixelShuffleAutoencoder  # AutoencoderTiny: the fast VAE
    text_encoder: CLIPTextModel
    tokenizer: CLIPTokenizer
    scheduler_config: dict
    name: str
    step_type: str = "lcm"  # "lcm" (c_skip, c_out) or "turbo" (x0 = F)
    is_demo: bool = False  # a built-in model (builtin, or tiny with random weights), not a real one
    notes: list[str] = field(default_factory=list)
    default_size: int | None = None  # the side the model is made for (builtin 256, tiny 64; None: 512)
    text_encoder_2: CLIPTextModelWithProjection | None = None  # SDXL: the pooled text
    tokenizer_2: CLIPTokenizer | None = None  # SDXL: the second encoder's tokenizer
    vae_upcast: bool = False  # keep the VAE in float32 (SDXL's own VAE overflows in float16)
    loras: LoraSet | None = None  # the users' LoRAs on these networks, changeable live
    # ControlNetModels (models/image/controlnet.py), in --controlnet order
    controlnets: list = field(default_factory=list)
    control_defaults: list = field(default_factory=list)  # per ControlNet: (preprocessor, scale) new streams start at
    ip_adapter: IPAdapter | None = None  # installed in the UNet, or None
    network: ImageNet | None = None  # an accelerated or batched variant of the seam (None: eager)

    @property
    def is_sdxl(self) -> bool:
        """An SDXL-family model: two text encoders, pooled text and time ids (models/image/sdxl.py)."""
        return sdxl.is_sdxl_unet(self.unet)

    @property
    def net(self) -> ImageNet:
        """The seam every UNet and VAE call goes through (`models/image/image_net.py`): `network`, or
        the eager diffusers adapter of `unet` and `vae`."""
        return self.network if self.network is not None else DiffusersImageNet(self.unet, self.vae, self.controlnets)

    @property
    def prediction_type(self) -> str:
        return self.scheduler_config.get("prediction_type", "epsilon")

    @property
    def vae_scale_factor(self) -> int:
        return latent_scale(self.vae)

    def addon_lines(self) -> list[str]:
        """What is plugged into the model, one line each (the UI lists them): the LoRAs with their
        scales, the ControlNets with the preprocessors and scales streams start from, the IP-Adapter."""
        lines = [f"LoRA `{source}` × {scale:g}" for source, scale in (self.loras.listing() if self.loras else [])]
        defaults = self.control_defaults or [("canny", 1.0)] * len(self.controlnets)
        for net, (kind, scale) in zip(self.controlnets, defaults):
            name = getattr(net.config, "_name_or_path", "") or type(net).__name__
            lines.append(f"ControlNet `{name}` ({kind}) × {scale:g}")
        if self.ip_adapter is not None:
            lines.append(f"IP-Adapter `{self.ip_adapter.source}` × {self.ip_adapter.scale:g}")
        return lines

    def example_cond(self, rows: int, height: int, width: int, device: torch.device, dtype: torch.dtype):
        """A condition of `rows` rows (zeros) with every field this model's UNet call takes: the
        text embeddings, SDXL's pooled text and time ids, the ControlNets' images and scales,
        IP-Adapter's image embedding and per-row scale (what warm-ups and exports feed the seam)."""
        def zeros(*shape, kind=dtype):
            return torch.zeros((rows, *shape), device=device, dtype=kind)

        tokens = int(getattr(self.tokenizer, "model_max_length", 77))
        dim = getattr(getattr(self.unet, "config", None), "cross_attention_dim", None) \
            or self.text_encoder.config.hidden_size  # the built-in UNet: its text encoder's width
        fields = {"text": zeros(tokens, int(dim[0] if isinstance(dim, (list, tuple)) else dim))}  # (B, L, D)
        if self.is_sdxl:
            pooled = self.text_encoder_2.config.projection_dim if self.text_encoder_2 is not None else None
            assert pooled is not None  # (SDXL's second text encoder projects the pooled text)
            fields["text_embeds"] = zeros(int(pooled))  # (B, P)
            fields["time_ids"] = zeros(6)  # (B, 6)
        if self.controlnets:
            fields["control"] = tuple(zeros(3, height, width) for _ in self.controlnets)  # n x (B, 3, H, W)
            fields["control_scale"] = zeros(len(self.controlnets), kind=torch.float32)  # (B, n)
        if self.ip_adapter is not None:
            fields["image_embeds"] = zeros(1, int(self.ip_adapter.image_encoder.config.projection_dim))  # (B, 1, D)
            fields["ip_scale"] = zeros(1, kind=torch.float32)  # (B, 1): the per-row scale
        return ImageCond(**fields)

    def to(self, device: torch.device, dtype: torch.dtype) -> "SDComponents":
        # (as torch modules: diffusers' and transformers' `to` wrap nn.Module.to in ways their stubs garble)
        modules: tuple[torch.nn.Module | None, ...] = (self.unet, self.vae, self.text_encoder, self.text_encoder_2)
        for module in modules:
            if module is None:
                continue
            want = torch.float32 if module is self.vae and self.vae_upcast else dtype
            if next(module.parameters()).dtype != want:
                module.to(dtype=want)
            module.to(device=device)
        tune_for_device(self, torch.device(device))
        return self


def tune_for_device(comps: "SDComponents", device: torch.device) -> None:
    """On a GPU: the UNet and the VAE in channels_last (cuDNN's fast NHWC convolutions; the
    inputs stay NCHW, convolutions convert them) and cudnn.benchmark on (the streams' shapes
    are fixed, so the autotuned algorithm is chosen once per shape). Nothing on the CPU."""
    if device.type != "cuda":
        return
    torch.backends.cudnn.benchmark = True
    modules: tuple[torch.nn.Module, ...] = (comps.unet, comps.vae)  # (as in SDComponents.to)
    for module in modules:
        module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # (torch's stubs lack it)
