"""IP-Adapter: a reference image as a prompt.

`--ip-adapter ID_OR_PATH[:scale]` names the adapter: the hub repo `h94/IP-Adapter` (its
`models/ip-adapter_sd15.safetensors` for SD 1.5, `sdxl_models/ip-adapter_sdxl.safetensors`
for SDXL, each with the CLIP image encoder in `image_encoder/` beside it), a file in it
(`h94/IP-Adapter/models/ip-adapter-plus_sd15.safetensors`), or a local `.safetensors` file
with its `image_encoder/` folder beside it. diffusers' loader installs the adapter's
cross-attention processors (decoupled cross-attention on the image tokens) and its image
projection in the UNet; the UNet then takes `added_cond_kwargs["image_embeds"]`.

The reference image's CLIP embedding is computed once per reference change (`embed`, cached
by the picture's content), not per frame: each stream's cond carries its own (1, 1, D) embedding
to every call (`ImageCond.image_embeds`).

The scale is per row (`ImageCond.ip_scale`, (B, 1)), so streams with different scales and
references share one batched UNet call and each row gets what it gets alone. diffusers'
processors hold one scale per adapter; `install_row_scales` turns the installed processors and
the image projection into `RowScaledIPAdapterProcessor` / `RowScaledProjection` (the same
modules and weights, another class): the UNet takes `added_cond_kwargs["image_embeds"] =
[embeds, ip_scale]`, the projection hands the scale on beside the image tokens, and each
processor adds `ip_scale[row] * attention(image tokens)` where diffusers adds `scale *
attention(image tokens)` (the same operations: at a uniform scale the outputs are equal, tested
against diffusers' processor). Without the scale rows the processors are diffusers' own, at
their uniform scale (`set_scale`: the default streams start from).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
import numpy as np
from diffusers.models.attention_processor import IPAdapterAttnProcessor2_0
from diffusers.models.embeddings import MultiIPAdapterImageProjection

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.image.feature_bank import attention_input, attention_output
from streamstudio.models.image.lora import check_scale, split_scale
from streamstudio.models.hub import hub_repo_source, quiet_hub

IP_ADAPTER_REPO = "h94/IP-Adapter"
DEFAULT_FILES = {False: ("models", "ip-adapter_sd15.safetensors"), True: ("sdxl_models", "ip-adapter_sdxl.safetensors")}
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's image normalisation
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
EMBED_CACHE = 16  # reference embeddings kept (each a few KB): streams going back to a picture reuse it


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
            raise StreamStudioError(f"IP-Adapter folder {source!r} must hold one .safetensors file, "
                                    f"it holds {len(files)}")
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
        if not Path(where).is_dir():  # a hub repo: the cache, or the hub at once, or one line
            local_files_only = hub_repo_source(
                where, Path(subfolder, weight).as_posix(), f"IP-Adapter {spec.source!r}", local_files_only,
                "or give a local .safetensors file with an image_encoder/ folder beside it")
        self._pipe = _pipeline(comps)

        try:
            with quiet_hub():
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
        install_row_scales(comps.unet)
        self.scale = 0.0
        self.set_scale(spec.scale)
        self.embeds: torch.Tensor | None = None  # (1, 1, D): the default reference, streams start from it
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()  # picture fingerprint -> (1, 1, D)
        self.encodes = 0  # image-encoder runs: one per new reference picture

    def identity(self) -> str:
        return self.source  # the scale and the reference are per row: not part of what the network is

    def set_scale(self, scale: float) -> None:
        """The default scale: what new streams start from, and the processors' own (diffusers')
        scale for calls without per-row scales."""
        self.scale = check_scale(scale)
        self._pipe.set_ip_adapter_scale(self.scale)

    def embed(self, image: torch.Tensor) -> torch.Tensor:
        """The CLIP embedding (1, 1, D) of a reference image (3, H, W) or (1, 3, H, W) in [0, 1];
        computed once per picture (the last EMBED_CACHE pictures are kept, by content)."""
        image = image if image.ndim == 4 else image[None]
        cpu = image.detach().to("cpu", torch.float32).contiguous()
        key = hashlib.sha256(repr(tuple(cpu.shape)).encode() + cpu.numpy().tobytes()).hexdigest()
        embeds = self._cache.get(key)
        if embeds is not None:
            self._cache.move_to_end(key)
            return embeds
        enc = self.image_encoder
        param = next(enc.parameters())
        pixels = clip_pixels(image.to(device=param.device, dtype=torch.float32), enc.config.image_size)
        with torch.no_grad():
            embeds = enc(pixels.to(param.dtype)).image_embeds[:, None]  # (1, 1, D)
        self.encodes += 1
        self._cache[key] = embeds
        while len(self._cache) > EMBED_CACHE:
            self._cache.popitem(last=False)
        return embeds

    def set_reference(self, image: torch.Tensor) -> torch.Tensor:
        """The default reference (streams built from now on start with it; each stream changes
        its own with `StreamDiffusion.set_reference`). Returns its embedding (1, 1, D)."""
        self.embeds = self.embed(image)
        return self.embeds

    def zeros(self, rows: int = 1) -> torch.Tensor:
        """The embedding of no reference (what the unconditional rows of CFG take): (rows, 1, D)."""
        dim = self.image_encoder.config.projection_dim
        param = next(self.image_encoder.parameters())
        return torch.zeros(rows, 1, dim, device=param.device, dtype=param.dtype)

    def scale_rows(self, scale: float, rows: int = 1) -> torch.Tensor:
        """A condition's per-row scales (rows, 1), float32 on the UNet's device (`ImageCond.ip_scale`)."""
        device = next(self.image_encoder.parameters()).device
        return torch.full((rows, 1), check_scale(scale), device=device, dtype=torch.float32)

    def remove(self) -> None:
        """Take the adapter out of the UNet: the plain model again."""
        self._pipe.unload_ip_adapter()


# ---------------------------------------------------------------------------------------------
# Per-row scales in diffusers' IP-Adapter processors
# ---------------------------------------------------------------------------------------------

def _diffusers_classes():
    return IPAdapterAttnProcessor2_0, MultiIPAdapterImageProjection


def install_row_scales(unet) -> None:
    """Make the IP-Adapter that diffusers installed in `unet` take per-row scales: its processors
    become `RowScaledIPAdapterProcessor` and its image projection `RowScaledProjection` (a class
    change of the same modules: weights, state-dict keys and diffusers' unload stay as they are)."""
    processor_cls, projection_cls = _diffusers_classes()
    processors = unet.attn_processors
    for processor in processors.values():
        if type(processor) is processor_cls:
            processor.__class__ = row_scaled_processor_class()
    if not any(isinstance(p, row_scaled_processor_class()) for p in processors.values()):
        raise StreamStudioError("the IP-Adapter's attention processors are not diffusers' IPAdapterAttnProcessor2_0")
    projection = getattr(unet, "encoder_hid_proj", None)
    if type(projection) is projection_cls:
        projection.__class__ = row_scaled_projection_class()
    elif not isinstance(projection, row_scaled_projection_class()):
        raise StreamStudioError(f"the UNet's image projection is {type(projection).__name__}, not diffusers' "
                                "MultiIPAdapterImageProjection")


_CLASSES: dict[str, type] = {}


def row_scaled_projection_class() -> type:
    """diffusers' MultiIPAdapterImageProjection that also takes the per-row scales: image_embeds
    [embeds..., scales (B, n)] -> [image tokens..., scales]."""
    if "projection" not in _CLASSES:
        class RowScaledProjection(MultiIPAdapterImageProjection):
            def forward(self, image_embeds):
                if isinstance(image_embeds, (list, tuple)) and len(image_embeds) == self.num_ip_adapters + 1:
                    *embeds, scales = image_embeds
                    return [*super().forward(list(embeds)), scales]
                return super().forward(image_embeds)

        _CLASSES["projection"] = RowScaledProjection
    return _CLASSES["projection"]


def row_scaled_processor_class() -> type:
    """diffusers' IPAdapterAttnProcessor2_0 whose image attention is scaled row by row when the
    image tokens come with per-row scales (`RowScaledProjection`); without them, diffusers' own."""
    if "processor" not in _CLASSES:
        class RowScaledIPAdapterProcessor(IPAdapterAttnProcessor2_0):
            def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None,
                         scale: float = 1.0, ip_adapter_masks=None):
                if (isinstance(encoder_hidden_states, tuple) and len(encoder_hidden_states[1]) == len(self.scale) + 1
                        and ip_adapter_masks is None):
                    text, (*ip_states, scales) = encoder_hidden_states
                    return _row_scaled_attention(self, attn, hidden_states, text, ip_states, scales, attention_mask,
                                                 temb)
                return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, temb, scale,
                                        ip_adapter_masks)

        _CLASSES["processor"] = RowScaledIPAdapterProcessor
    return _CLASSES["processor"]


def _row_scaled_attention(proc, attn, hidden_states, text, ip_states, scales, attention_mask, temb):
    """diffusers' IPAdapterAttnProcessor2_0 (no masks) with `scales[:, i]` (B,) in place of the
    processor's scale of adapter i: the same operations in the same order."""
    residual = hidden_states
    hidden_states, _, shape = attention_input(attn, hidden_states, temb)  # (B, T, C)
    batch_size, sequence_length, _ = text.shape
    if attention_mask is not None:
        attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
    query = attn.to_q(hidden_states)
    if attn.norm_cross:
        text = attn.norm_encoder_hidden_states(text)
    key, value = attn.to_k(text), attn.to_v(text)
    head_dim = key.shape[-1] // attn.heads
    query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    hidden_states = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                                   is_causal=False)
    hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim).to(query.dtype)
    for i, (ip_state, to_k_ip, to_v_ip) in enumerate(zip(ip_states, proc.to_k_ip, proc.to_v_ip)):
        ip_key = to_k_ip(ip_state).view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        ip_value = to_v_ip(ip_state).view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        ip_hidden = F.scaled_dot_product_attention(query, ip_key, ip_value, attn_mask=None, dropout_p=0.0,
                                                   is_causal=False)
        ip_hidden = ip_hidden.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim).to(query.dtype)
        row_scale = scales[:, i].to(ip_hidden.dtype).view(batch_size, 1, 1)  # (B, 1, 1)
        hidden_states = hidden_states + row_scale * ip_hidden
    return attention_output(attn, hidden_states, residual, shape)


def clip_pixels(images: torch.Tensor, size: int) -> torch.Tensor:
    """CLIP's preprocessing, equal to transformers' CLIPImageProcessor with CLIP's settings
    (shortest_edge and crop `size`, bicubic, do_convert_rgb; its PIL backend: transformers 4's
    CLIPImageProcessor, transformers 5's CLIPImageProcessorPil, which is what CLIPImageProcessor
    is without torchvision) on the picture as 8 bits: the short side resized to `size` and the
    long one to int(size * long / short) with PIL's bicubic filter on uint8 (what
    `image_transforms.resize` does: it converts a uint8 array to a PIL image), a centre crop to
    size x size, / 255 and CLIP's mean and std. (B, 3, H, W) in [0, 1] -> (B, 3, size, size) float32
    on the images' device. The resize runs on the CPU (PIL; a reference picture is resized once,
    `IPAdapter.embed`); a picture already at its resized size is not resized (nor quantised),
    the rest is torch on the images' device."""
    h, w = images.shape[-2:]
    new = clip_resize_size(h, w, size)
    if new != (h, w):
        images = pil_resize(images, new, "bicubic")  # (B, 3, new_h, new_w) float32 in [0, 1], steps of 1/255
        h, w = new
    top, left = (h - size) // 2, (w - size) // 2  # transformers' center_crop
    images = images[..., top:top + size, left:left + size].float()
    mean = torch.tensor(CLIP_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=images.device).view(1, 3, 1, 1)
    return (images - mean) / std


def clip_resize_size(h: int, w: int, size: int) -> tuple[int, int]:
    """(height, width) after CLIPImageProcessor's shortest-edge resize (transformers'
    get_resize_output_image_size: the long side truncated, not rounded)."""
    if w <= h:
        return int(size * h / w), size
    return size, int(size * w / h)


def pil_resize(images: torch.Tensor, size: tuple[int, int], resample: str = "bicubic") -> torch.Tensor:
    """(B, 3, H, W) in [0, 1] -> (B, 3, *size) float32 in [0, 1] on the same device: each picture
    rounded to uint8 and resized by PIL (`resample`: a PIL.Image.Resampling name), as
    transformers' and diffusers' image processors resize pictures; values in steps of 1/255."""
    filt = Image.Resampling[resample.upper()]
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to("cpu", torch.uint8)  # (B, 3, H, W)
    out = [np.asarray(Image.fromarray(p.permute(1, 2, 0).numpy()).resize((size[1], size[0]), resample=filt))
           for p in pixels]  # PIL takes (width, height)
    resized = torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2)  # (B, 3, h, w) uint8
    return (resized.double() / 255).float().to(images.device)  # transformers' rescale: float64, then float32


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
