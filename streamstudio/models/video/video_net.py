"""The one seam every video-network call goes through: the video side of
`models/image/image_net.py`, in the same words.

A video network is a backbone and a codec, on their own device and dtype:

    velocity(x, t, text)  x (1, F, C, h, w) latents, t (1, F) one time per frame in [0, 1] (flow
                          matching: 0 noise, 1 data), text from `encode_text` -> dx/dt (1, F, C, h, w)
    encode_text(prompt)   a prompt -> the condition `velocity` takes
    encode(images)        (F, 3, H, W) in [-1, 1] -> (F', C, h, w) latents (a temporal VAE packs frames:
                          F' <= F)
    decode(latents)       (F', C, h, w) -> (F, 3, H, W) images in about [-1, 1]

As for images (`ImageNet.encode` / `decode`), pixels become [-1, 1] floats once, in the pipeline
(`kernels.preprocess`, fused on a GPU), and uint8 again once (`kernels.postprocess`); a codec only
says how many pixels one latent pixel covers (`spatial`), so the pipeline knows the size to
convert to. Implementations: `PixelCodec` and `StreamDiTBackbone` here (the project's StreamDiT),
`WanBackbone` and `WanCodec` in `models/video/wan.py` (diffusers' Wan 2.1).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from streamstudio.models.video.stream_dit import TextCondition, VideoNetwork, guided_velocity


class VideoBackbone(Protocol):
    """Anything that gives a velocity from (latents, per-frame times, text)."""

    def encode_text(self, prompt: str) -> Any: ...

    def velocity(self, x: torch.Tensor, t: torch.Tensor, text: Any) -> torch.Tensor:
        """x: (1, F, C, h, w), t: (1, F) in [0, 1] -> velocity dx/dt (1, F, C, h, w)."""
        ...


class VideoCodec(Protocol):
    """Images <-> latents. `decode` may look at several frames (temporal decoders)."""

    spatial: int  # pixels per latent pixel along each side

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """(F, 3, H, W) in [-1, 1] -> latents (F', C, H / spatial, W / spatial)."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents (F', C, h, w) -> float images (F, 3, H, W) in [-1, 1]."""
        ...


class PixelCodec:
    """Pixels as latents (the tiny and built-in StreamDiT models): the [-1, 1] images themselves."""

    spatial = 1

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return images

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return latents.float()


class StreamDiTBackbone:
    """The project's StreamDiT model behind the backbone protocol (batch of one prompt), with
    classifier-free guidance against the empty prompt when `guidance` is not 1 (two network calls
    per step; a checkpoint distilled with `--teacher-guidance` has it built in and needs none)."""

    def __init__(self, model: VideoNetwork, guidance: float = 1.0):
        self.model, self.guidance = model, float(guidance)
        self._empty: TextCondition | None = None

    def encode_text(self, prompt: str) -> Any:
        if self.guidance != 1.0 and self._empty is None:
            self._empty = self.model.encode_text([""])
        return self.model.encode_text([prompt])

    def velocity(self, x: torch.Tensor, t: torch.Tensor, text: Any) -> torch.Tensor:
        return guided_velocity(self.model, x, t, text, self._empty, self.guidance)
