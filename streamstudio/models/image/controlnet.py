"""ControlNets: loading them, and their residuals for one UNet call.

`--controlnet ID_OR_PATH[:scale]` (repeatable) names a diffusers ControlNetModel (a hub id
such as `lllyasviel/control_v11p_sd15_canny`, `thibaud/controlnet-sd21-canny-diffusers`,
`diffusers/controlnet-canny-sdxl-1.0-small`, or a local folder). Each net runs on its own
control image (the preprocessed input frame, `pipelines/image/control.py`) and its residuals, times
its conditioning scale, are summed over the nets and added to the UNet's skip connections
(what diffusers' MultiControlNetModel does).

Scales are per row, `(B, n_nets)`: rows of different streams (cross-stream batching) or of
the same stream after a live change carry their own scale, and a scale of 0 gives exactly the
UNet without that net. Control images are per row too, `n_nets` tensors (B, 3, H, W) in
[0, 1]: a Stream Batch slot holding an older frame carries that frame's control image.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import ControlNetModel

from streamstudio.errors import ModelNotFoundError, StreamStudioError
from streamstudio.models.image.lora import check_scale, split_scale
from streamstudio.models.hub import hub_repo_source, quiet_hub

Residuals = tuple[tuple[torch.Tensor, ...], torch.Tensor]  # (down-block residuals, mid-block residual)


@dataclass(frozen=True)
class ControlNetSpec:
    """One ControlNet a user asked for."""

    source: str  # a hub id or a diffusers folder
    scale: float = 1.0  # conditioning scale


def parse_controlnet(text: str) -> ControlNetSpec:
    """`ID_OR_PATH[:scale]` -> ControlNetSpec."""
    source, scale = split_scale(text, "--controlnet", "ID_OR_PATH[:scale]")
    return ControlNetSpec(source, scale)


def load_controlnet(source: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    local_files_only: bool | None = None):
    """A diffusers ControlNetModel from a hub id, a folder, or one .safetensors file (original
    layout, through diffusers' single-file loader)."""
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    path = Path(os.path.expanduser(source))
    if not path.exists() and source.count("/") == 1:  # a hub id: the cache, or the hub at once, or one line
        local_files_only = hub_repo_source(source, "config.json", f"ControlNet {source!r}", local_files_only,
                                           "or pass --controlnet a local diffusers folder or .safetensors file")
    try:
        with quiet_hub():
            net = _load(ControlNetModel, source, path, dtype, local_files_only)
    except StreamStudioError:
        raise
    except Exception as exc:  # hub, file and config errors: all mean "cannot load this ControlNet"
        raise ModelNotFoundError(
            f"ControlNet {source!r} could not be loaded ({_first_line(exc)}); fetch it once with "
            f"`hf download {source}` on a machine with network access, or pass a local diffusers folder") from exc
    return net.to(device=device).eval().requires_grad_(False)


def _load(model_class, source: str, path: Path, dtype: torch.dtype, local_files_only: bool):
    if path.is_file():
        if path.suffix != ".safetensors":
            raise StreamStudioError(f"ControlNet {source!r} is not a .safetensors file or a diffusers folder")
        return model_class.from_single_file(str(path), local_files_only=local_files_only, torch_dtype=dtype)
    return model_class.from_pretrained(str(path) if path.is_dir() else source, torch_dtype=dtype,
                                       local_files_only=local_files_only or path.is_dir())


def check_fits(net, unet) -> None:
    """A ControlNet made for another model family (SD 1.5 vs SDXL vs 2.1) is refused."""
    for key in ("cross_attention_dim", "block_out_channels", "addition_embed_type"):
        a, b = getattr(net.config, key, None), getattr(unet.config, key, None)
        if key == "block_out_channels":  # (a list in one config, a tuple in another)
            a, b = (None if a is None else tuple(a)), (None if b is None else tuple(b))
        if a != b:
            raise StreamStudioError(f"this ControlNet does not fit the model ({key}: ControlNet {a}, model {b}); "
                                    "use a ControlNet made for the model's family (SD 1.5, SD 2.1 or SDXL)")


def residuals(nets, x: torch.Tensor, t: torch.Tensor, text: torch.Tensor, images, scales: torch.Tensor,
              added_cond_kwargs: dict | None = None) -> Residuals:
    """The summed residuals of `nets` for one UNet call.

    x (B, 4, h, w) latents, t (B,) timesteps, text (B, L, D), images: one (B, 3, 8h, 8w) tensor
    in [0, 1] per net, scales (B, n_nets) conditioning scales, added_cond_kwargs SDXL's
    text_embeds (B, P) and time_ids (B, 6) (None for SD).
    """
    if len(images) != len(nets) or scales.shape != (x.shape[0], len(nets)):
        raise StreamStudioError(f"{len(nets)} ControlNets need as many control images and (B, {len(nets)}) scales, "
                                f"got {len(images)} images and scales {tuple(scales.shape)}")
    down, mid = None, None
    for i, net in enumerate(nets):
        scale = scales[:, i].to(x.dtype).view(-1, 1, 1, 1)  # (B, 1, 1, 1): each row its own scale
        d, m = net(x, t, encoder_hidden_states=text, controlnet_cond=images[i].to(x.dtype), conditioning_scale=scale,
                   added_cond_kwargs=added_cond_kwargs, return_dict=False)
        if down is None:
            down, mid = list(d), m
        else:
            down = [a + b for a, b in zip(down, d)]
            mid = mid + m
    assert down is not None and mid is not None  # (nets is not empty)
    return tuple(down), mid


def scales_tensor(scales: list[float], rows: int, device: torch.device) -> torch.Tensor:
    """(rows, n) float32 conditioning scales, the same for every row."""
    return (torch.tensor([check_scale(s) for s in scales], dtype=torch.float32, device=device)
            .expand(rows, -1).contiguous())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
