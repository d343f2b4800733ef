"""IP-Adapter: a reference image as a prompt.

`--ip-adapter ID_OR_PATH[:scale]` names the adapter: the hub repo `h94/IP-Adapter` (its
`models/ip-adapter_sd15.safetensors` for SD 1.5, `sdxl_models/ip-adapter_sdxl.safetensors`
for SDXL, each with the CLIP image encoder in `image_encoder/` beside it), a file in it
(`h94/IP-Adapter/models/ip-adapter-plus_sd15.safetensors`), or a local `.safetensors` file
with its `image_encoder/` folder beside it. diffusers' loader installs the adapter's
cross-attention processors (decoupled cross-attention on the image tokens) and its image
projection in the UNet; the UNet then takes `added_cond_kwargs["image_embeds"]`.

The reference image's CLIP embedding is computed once per reference change (`set_reference`),
not per frame: the stream's cond carries the cached (1, 1, D) embedding to every call. The
scale is the processors' (one per model, changeable live); rows of different scales cannot
share one call, so cross-stream batching keys on it (`identity`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.lora import check_scale, split_scale

IP_ADAPTER_REPO = "h94/IP-Adapter"
DEFAULT_FILES = {False: ("models", "ip-adapter_sd15.safetensors"), True: ("sdxl_models", "ip-adapter_sdxl.safetensors")}
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's image normalisation
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class IPAdapterSpec:
    source: str
    scale: float = 1.0


def parse_ip_adapter(text: str) -> IPAdapterSpec:
    return IPAdapterSpec(*split_scale(text, "--ip-adapter", "ID_OR_PATH[:scale]"))


def locate(source: str, is_sdxl: bool) -> tuple[str, str, str]:
    """(repo or folder, subfolder, weight file) of an adapter named by `source`."""
    path = Path(os.path.expanduser(source))
    if path.is_file():
        if path.suffix != ".safetensors":
            raise StreamStudioError(f"IP-Adapter {source!r} is not a .safetensors file (nothing is unpickled)")
        return str(path.parent), "", path.name
    if path.is_dir():
        files = sorted(f.name for f in path.glob("*.safetensors"))
        if len(files) != 1:
            raise StreamStudioError(f"IP-Adapter folder {source!r} must hold one .safetensors file, it holds {len(files)}")
        return str(path), "", files[0]
    parts = source.split("/")
    if len(parts) > 2 and parts[-1].endswith(".safetensors"):  # a file in a hub repo
        return "/".join(parts[:2]), "/".join(parts[2:-1]), parts[-1]
    subfolder, weight = DEFAULT_FILES[is_sdxl]
    return source, subfolder, weight


class IPAdapter:
    """One IP-Adapter installed in a model's UNet, with its image encoder and the cached
    embedding of the current reference image."""

    def __init__(self, comps, spec: IPAdapterSpec | str, local_files_only: bool | None = None):
        spec = parse_ip_adapter(spec) if isinstance(spec, str) else spec
        if local_files_only is None:
            local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        self.comps, self.source = comps, spec.source
        where, subfolder, weight = locate(spec.source, comps.is_sdxl)
        self._pipe = _pipeline(comps)
        try:
            self._pipe.load_ip_adapter(where, subfolder=subfolder, weight_name=weight,
                                       local_files_only=local_files_only or Path(where).is_dir())
        except Exception as exc:  # hub, file and key errors: all mean "cannot load this adapter"
            raise ModelNotFoundError(
                f"IP-Adapter {spec.source!r} could not be loaded ({_first_line(exc)}); fetch it once with "
                f"`hf download {where}` (it needs {Path(subfolder, weight).as_posix()} and "
                f"{Path(subfolder, 'image_encoder').as_posix()}/), or give a local .safetensors file with an "
                "image_encoder/ folder beside it") from exc
        self.image_encoder = self._pipe.image_encoder.eval().requires_grad_(False)
        unet_param = next(comps.unet.parameters())
        self.image_encoder.to(device=unet_param.device, dtype=unet_param.dtype)
        self.scale = 0.0
        self.set_scale(spec.scale)
        self.embeds: torch.Tensor | None = None  # (1, 1, D) of the current reference
        self._reference: torch.Tensor | None = None
        self.encodes = 0  # image-encoder runs: one per reference change

    def identity(self) -> str:
        return f"{self.source}*{self.scale:g}"

    def set_scale(self, scale: float) -> None:
        self.scale = check_scale(scale)
        self._pipe.set_ip_adapter_scale(self.scale)

    def set_reference(self, image: torch.Tensor) -> torch.Tensor:
        """The reference image (3, H, W) or (1, 3, H, W) in [0, 1]: its embedding, computed only
        when the image differs from the last one. Returns (1, 1, D)."""
        image = image if image.ndim == 4 else image[None]
        if self._reference is not None and self._reference.shape == image.shape and torch.equal(self._reference, image):
            return self.embeds
        enc = self.image_encoder
        param = next(enc.parameters())
        pixels = clip_pixels(image.to(device=param.device, dtype=torch.float32), enc.config.image_size)
        with torch.no_grad():
            self.embeds = enc(pixels.to(param.dtype)).image_embeds[:, None]  # (1, 1, D)
        self._reference = image.detach().clone()
        self.encodes += 1
        return self.embeds

    def zeros(self, rows: int = 1) -> torch.Tensor:
        """The embedding of no reference (what the unconditional rows of CFG take): (rows, 1, D)."""
        dim = self.image_encoder.config.projection_dim
        param = next(self.image_encoder.parameters())
        return torch.zeros(rows, 1, dim, device=param.device, dtype=param.dtype)

    def remove(self) -> None:
        """Take the adapter out of the UNet: the plain model again."""
        self._pipe.unload_ip_adapter()


def clip_pixels(images: torch.Tensor, size: int) -> torch.Tensor:
    """CLIP's preprocessing in torch: the short side resized to `size` (bicubic, antialiased),
    centre crop to size x size, CLIP normalisation. (B, 3, H, W) in [0, 1] -> (B, 3, size, size)."""
    h, w = images.shape[-2:]
    if min(h, w) != size:
        scale = size / min(h, w)
        images = F.interpolate(images, size=(max(size, round(h * scale)), max(size, round(w * scale))), mode="bicubic",
                               antialias=True, align_corners=False).clamp(0, 1)
        h, w = images.shape[-2:]
    top, left = (h - size) // 2, (w - size) // 2
    images = images[..., top:top + size, left:left + size]
    mean = torch.tensor(CLIP_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=images.device).view(1, 3, 1, 1)
    return (images - mean) / std


def _pipeline(comps):
    """A diffusers pipeline around the components' own modules: its IP-Adapter loader."""
    from diffusers import LCMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    scheduler = LCMScheduler.from_config(comps.scheduler_config)
    if comps.is_sdxl:
        return StableDiffusionXLPipeline(vae=None, text_encoder=comps.text_encoder, text_encoder_2=comps.text_encoder_2,
                                         tokenizer=comps.tokenizer, tokenizer_2=comps.tokenizer_2, unet=comps.unet,
                                         scheduler=scheduler, image_encoder=None, feature_extractor=None)
    return StableDiffusionPipeline(vae=None, text_encoder=comps.text_encoder, tokenizer=comps.tokenizer,
                                   unet=comps.unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   image_encoder=None, requires_safety_checker=False)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
