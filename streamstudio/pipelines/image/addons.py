"""One stream's own state for its model's add-ons (ControlNets, IP-Adapter, LoRAs, SDXL's size),
kept beside the frame API (`StreamDiffusion.addons`) instead of inside it.

The networks are the model's and shared by every stream on it; what is the stream's own is here:
the ControlNets' preprocessors, scales and (txt2img) control picture, the IP-Adapter reference
embedding and scale (per row, so streams batched together keep theirs), and the LoRA text version
the stream's prompts were encoded at. `cond_fields` gives the `ImageCond` fields of one call;
`frame_fields` the ControlNet images of an input group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from streamstudio.errors import StreamStudioError
from streamstudio.frames import ImageLike, ImagesLike, to_frames
from streamstudio.models.image import sdxl
from streamstudio.models.image.components import SDComponents
from streamstudio.pipelines.image.control import ControlInputs, ControlUnit, Preprocessor

if TYPE_CHECKING:
    from streamstudio.models.image.ip_adapter import IPAdapter

ADDON_SETTINGS = ("control_scales", "ip_adapter_scale", "lora_scales")  # update()'s keys for the model's add-ons


class StreamAddOns:
    """The add-on state of one stream of `mode` ("img2img" or "txt2img") at height x width, with
    frame groups of `frames`, on `device`/`dtype`."""

    def __init__(self, comps: SDComponents, mode: str, height: int, width: int, frames: int,
                 device: torch.device, dtype: torch.dtype, control: ControlInputs | None = None):
        self.comps, self.mode, self.size, self.frames = comps, mode, (height, width), frames
        self.device, self.dtype = device, dtype
        nets = len(comps.controlnets)
        if control is None and nets:  # each stream its own inputs, from the model's defaults (the CLI's)
            defaults = comps.control_defaults or [("canny", 1.0)] * nets
            control = ControlInputs([ControlUnit(Preprocessor(kind), scale) for kind, scale in defaults])
        if control is not None and len(control) != nets:
            raise StreamStudioError(f"{len(control)} control preprocessors for the model's {nets} ControlNets; give "
                                    "one --control-preprocessor per --controlnet")
        self.control = control  # ControlNets' inputs: preprocessors (once per input group) and scales
        self.picture: dict | None = None  # txt2img: the control picture's frame fields
        self._time_ids: torch.Tensor | None = None  # SDXL: (1, 6) of the stream's size
        ip = comps.ip_adapter  # IP-Adapter: this stream's own reference embedding and scale (per row)
        self._ip_embeds = None if ip is None else ip.embeds  # (1, 1, D), from the model's default reference
        self._ip_scale = None if ip is None else ip.scale_rows(ip.scale)  # (1, 1) float32 on the device
        self._ip_scale_value = None if ip is None else ip.scale  # the same as a number (stats read it: no sync)
        self.text_version = self.lora_text_version()

    # ------------------------------------------------------------------ ControlNets
    def set_control_image(self, image: ImagesLike) -> None:
        """txt2img with ControlNets: the picture (HxWx3 uint8 RGB) every frame is controlled by,
        fitted to the stream's size as diffusers' ControlNet pipelines fit a control image (PIL's
        Lanczos, `control.fit_picture`) and preprocessed once, here."""
        if self.control is None:
            raise StreamStudioError("this model has no ControlNet (--controlnet)")
        if self.mode != "txt2img":
            raise StreamStudioError("an img2img stream takes its control images from its input frames")
        frames = to_frames(image, self.frames)  # (k, H, W, 3 or 4) uint8
        with torch.inference_mode():  # n x (k, 3, H, W) in [0, 1]
            self.picture = {"control": self.control.picture_images(list(frames), *self.size, self.device)}

    def set_control_scale(self, index: int, scale: float) -> None:
        """ControlNet `index`'s conditioning scale, from the next call on (0: as without it)."""
        if self.control is None:
            raise StreamStudioError("this model has no ControlNet (--controlnet)")
        self.control.set_scale(index, scale)

    def frame_fields(self, images: torch.Tensor) -> dict | None:
        """img2img: an input group's ControlNet images from its frames (k, 3, H, W) in [-1, 1]
        (once per group; the group's slots reuse them); None without ControlNets."""
        if self.control is None:
            return None
        return {"control": self.control.images((images.float() + 1) / 2)}  # n x (k, 3, H, W) in [0, 1]

    def check_ready(self) -> None:
        if self.mode == "txt2img" and self.control is not None and self.picture is None:
            raise StreamStudioError("a txt2img stream with ControlNets needs a control picture (set_control_image, "
                                    "--control-image); img2img takes the input frames'")

    # ------------------------------------------------------------------ IP-Adapter
    def set_reference(self, image: ImageLike) -> None:
        """This stream's IP-Adapter reference image (HxWx3 uint8 RGB, or (3, H, W) float in
        [0, 1]); its embedding is computed here, once per picture (`IPAdapter.embed`), not per
        frame. Other streams on the model keep theirs; the first reference given on a model is
        also the one streams built later start from (serve's --ip-image)."""
        ip = self._ip_adapter()
        if isinstance(image, torch.Tensor) and image.dtype.is_floating_point:
            embeds = ip.embed(image.to(self.device))
        else:
            frames = to_frames(image)  # (1, H, W, 3) uint8
            embeds = ip.embed(frames[0, ..., :3].permute(2, 0, 1).to(self.device).float() / 255.0)
        if ip.embeds is None:
            ip.embeds = embeds
        self._ip_embeds = embeds

    def set_reference_embeds(self, embeds: torch.Tensor | None) -> None:
        """This stream's reference as an embedding made by `IPAdapter.embed` (1, 1, D); None: no
        reference (the zero embedding)."""
        self._ip_adapter()
        self._ip_embeds = embeds

    def set_ip_adapter_scale(self, scale: float) -> None:
        """This stream's IP-Adapter scale (its rows' own: other streams keep theirs)."""
        self._ip_scale = self._ip_adapter().scale_rows(scale)
        self._ip_scale_value = float(scale)

    @property
    def ip_adapter_scale(self) -> float | None:
        return self._ip_scale_value

    def _ip_adapter(self) -> IPAdapter:
        if self.comps.ip_adapter is None:
            raise StreamStudioError("this model has no IP-Adapter (--ip-adapter)")
        return self.comps.ip_adapter

    # ------------------------------------------------------------------ LoRAs
    def set_lora_scale(self, name_or_source: str, scale: float) -> None:
        """A loaded LoRA's scale (models/image/lora.py: unfused, rescaled, fused again); the
        stream encodes its prompts again on its next call when the LoRA changes the text encoders."""
        if self.comps.loras is None:
            raise StreamStudioError("no LoRA is loaded (--lora)")
        self.comps.loras.set_scale(name_or_source, scale)

    def lora_text_version(self) -> int:
        return self.comps.loras.text_version if self.comps.loras is not None else 0

    def text_changed(self) -> bool:
        """True once after a LoRA changed what the text encoders compute (for any stream on the model)."""
        if self.lora_text_version() == self.text_version:
            return False
        self.text_version = self.lora_text_version()
        return True

    # ------------------------------------------------------------------ run-time settings
    def update(self, control_scales: list[float] | tuple[float, ...] | dict[int | str, float] | None = None,
               ip_adapter_scale: float | None = None, lora_scales: dict[str, float] | None = None) -> None:
        """`StreamDiffusion.update`'s add-on keys (ADDON_SETTINGS). `control_scales`: one scale per
        ControlNet, or {index: scale} for some of them (a modulated net's; indices as JSON's strings too)."""
        if control_scales is not None:
            n = 0 if self.control is None else len(self.control)
            if isinstance(control_scales, dict):
                scales = {int(i): s for i, s in control_scales.items()}
                if not all(0 <= i < n for i in scales):
                    raise StreamStudioError(f"control_scales names ControlNet(s) {sorted(scales)}; this model has {n}")
            elif len(control_scales) != n:
                raise StreamStudioError(f"control_scales needs one scale per ControlNet ({n}), got {control_scales!r}")
            else:
                scales = dict(enumerate(control_scales))
            for i, scale in scales.items():
                self.set_control_scale(i, scale)
        if ip_adapter_scale is not None:
            self.set_ip_adapter_scale(ip_adapter_scale)
        for name, scale in (lora_scales or {}).items():
            self.set_lora_scale(name, scale)

    def cond_fields(self, negative: bool) -> dict:
        """The stream's own `ImageCond` fields of one call: SDXL's time ids, the ControlNet
        scales, IP-Adapter's reference embedding (zeros for the unconditional rows) and scale."""
        extra: dict[str, torch.Tensor | None] = {}
        if self.comps.is_sdxl:  # the stream's size is fixed: made once (an upload per call would sync)
            if self._time_ids is None:
                self._time_ids = sdxl.time_ids(*self.size, 1, self.device, self.dtype)
            extra["time_ids"] = self._time_ids
        if self.control is not None:
            extra["control_scale"] = self.control.scales(1, self.device)
        ip = self.comps.ip_adapter
        if ip is not None:  # the stream's own reference and scale (the unconditional rows: no reference)
            extra["image_embeds"] = ip.zeros(1) if negative or self._ip_embeds is None else self._ip_embeds
            extra["ip_scale"] = self._ip_scale
        return extra
