"""Frames between the host and the image seam: uint8 frames up to the device and back, and the
VAE's encode and decode of one stream (`pipelines/image/stream_diffusion.py` holds one).

A frame's one host-device sync is the download of its output (a frame the similarity filter
skips: the read of its similarity). On a GPU, frames go up through a pinned staging buffer (an
asynchronous DMA) and come down through another. Every frame ends in that sync, so the staging
buffer's last upload has finished by the time the next frame refills it.
"""

from __future__ import annotations

import numpy as np
import torch

from streamstudio import kernels
from streamstudio.models.image.image_net import ImageNet


class FrameIO:
    """Host <-> device transfers and the VAE for one stream on `net`'s device and dtype."""

    def __init__(self, net: ImageNet):
        self.net = net
        self.device, self.dtype = net.device, net.dtype
        self._host_buffers: dict[str, torch.Tensor] = {}  # pinned staging buffers (GPU only)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """(k, 3, H, W) in [-1, 1] -> (k, 4, H/8, W/8) scaled latents."""
        return self.net.encode(images.to(self.device, self.dtype))

    def decode(self, latents: torch.Tensor) -> list[np.ndarray]:
        images = self.net.decode(latents)  # (k, 3, H, W)
        return list(self.download(kernels.postprocess(images)))  # k x (H, W, 3) uint8

    def upload(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 (k, H, W, C) on the host -> the same on the device."""
        if self.device.type != "cuda":
            return frames.to(self.device)
        staging = self._pinned("up", frames.shape)
        staging.copy_(frames)
        return staging.to(self.device, non_blocking=True)

    def download(self, frames: torch.Tensor) -> np.ndarray:
        """uint8 (k, H, W, 3) on the device -> numpy on the host (the frame's one sync)."""
        if self.device.type != "cuda":
            return frames.numpy()
        host = self._pinned("down", frames.shape)
        host.copy_(frames, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return host.numpy().copy()  # the pinned buffer is reused by the next frame

    def _pinned(self, name: str, shape: torch.Size) -> torch.Tensor:
        buf = self._host_buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
            self._host_buffers[name] = buf
        return buf
