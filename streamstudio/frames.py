"""Frames at the package's edges: one converter to RGB uint8 (H, W, 3), one fit to a size,
one colour parser. Importable by every layer (numpy only; PIL and torch inputs are
recognised without importing either).

The conversion rule, everywhere:
- (H, W) and (H, W, 1) are grey: the value is repeated into R, G and B.
- (H, W, 4) is RGBA, composited on black: each colour becomes round(c * a / 255).
- uint8 is taken as is, uint16 scaled to 0..255 (round(v / 257)), floats must be finite and
  in [0, 1] (round(v * 255)); anything else is an error, never clipped silently.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Union

import numpy as np

from streamstudio.errors import StreamStudioError

if TYPE_CHECKING:
    import torch
    from PIL import Image

# A picture the converters take: a numpy array, a torch tensor or a PIL image (told apart by duck
# typing, so neither torch nor PIL is imported here)
ImageLike = Union[np.ndarray, "torch.Tensor", "Image.Image"]
ImagesLike = Union[ImageLike, list[ImageLike], tuple[ImageLike, ...]]  # one, or a call's frames

FIT_MODES = ("crop", "pad")  # how a frame of another aspect ratio meets a size


def to_pixels(image: ImageLike) -> np.ndarray:
    """Any supported image -> contiguous uint8 (H, W, 3) RGB or (H, W, 4) RGBA (alpha kept, for
    a consumer that composites it itself). Takes numpy arrays, PIL images and torch tensors."""
    image = _as_array(image)
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise StreamStudioError(f"expected an image of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), "
                                f"got {image.shape}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise StreamStudioError(f"the image is empty (shape {image.shape})")
    image = _as_uint8(image)
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image)


def to_frames(image: ImagesLike, count: int = 1) -> torch.Tensor:
    """Any supported image(s) -> uint8 (count, H, W, 3) RGB, or (count, H, W, 4) RGBA when one
    of them has alpha (the preprocess kernel composites it on black). Each image goes through
    the one frame converter (`to_pixels`); `image` is one image or a list
    of `count` of them."""
    import torch  # (this module is numpy-only otherwise)

    items = list(image) if isinstance(image, (list, tuple)) else [image]
    if len(items) != count:
        raise StreamStudioError(f"expected {count} frame(s) per call (frame_buffer_size), got {len(items)}")
    frames = [to_pixels(item) for item in items]
    if len({f.shape[2] for f in frames}) > 1:  # RGB beside RGBA: opaque alpha for the RGB ones
        frames = [f if f.shape[2] == 4 else np.dstack([f, np.full(f.shape[:2], 255, np.uint8)]) for f in frames]
    if len({f.shape for f in frames}) > 1:
        raise StreamStudioError("all frames of one call must have the same size")
    return torch.from_numpy(np.stack(frames))


def to_rgb(image: ImageLike) -> np.ndarray:
    """Any supported image -> contiguous uint8 (H, W, 3) RGB, alpha composited on black."""
    image = to_pixels(image)
    if image.shape[2] == 3:
        return image
    rgb, alpha = image[:, :, :3].astype(np.uint32), image[:, :, 3:].astype(np.uint32)
    # floor((c a + 127) / 255) == round(c a / 255): c a / 255 is never exactly half-way
    return np.ascontiguousarray(((rgb * alpha + 127) // 255).astype(np.uint8))


def _as_array(image) -> np.ndarray:
    if hasattr(image, "getbands") and hasattr(image, "convert"):  # a PIL image
        has_alpha = "A" in image.getbands() or "transparency" in getattr(image, "info", {})
        return np.asarray(image.convert("RGBA" if has_alpha else "RGB"))
    if hasattr(image, "detach") and hasattr(image, "numpy"):  # a torch tensor
        return image.detach().cpu().numpy()
    if not isinstance(image, np.ndarray):
        raise StreamStudioError(f"expected an image (numpy array, PIL image or tensor), got {type(image).__name__}")
    return image


def _as_uint8(image: np.ndarray) -> np.ndarray:
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.uint16:
        return ((image.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if not np.issubdtype(image.dtype, np.floating):
        raise StreamStudioError(f"expected uint8 pixels (or uint16, or floats in [0, 1]), got {image.dtype}")
    if not np.isfinite(image).all() or image.min() < 0.0 or image.max() > 1.0:
        raise StreamStudioError("float images must be finite and in [0, 1]")
    return (image * 255.0).round().astype(np.uint8)


def even_size(width: int, height: int) -> tuple[int, int]:
    """The size rounded up to even sides (what yuv420p video encoders need)."""
    return width + width % 2, height + height % 2


def fit_aspect(frame: np.ndarray, width: int, height: int, mode: str = "crop") -> np.ndarray:
    """(H, W, C) -> the aspect ratio width:height without resampling: "crop" cuts the longer
    side's ends (centred), "pad" adds black bars to the shorter side (centred; the whole
    picture kept). A frame already of that aspect comes back as is."""
    if mode not in FIT_MODES:
        raise StreamStudioError(f"fit must be one of {', '.join(FIT_MODES)}, got {mode!r}")
    h, w = frame.shape[:2]
    too_wide = w * height > h * width
    if mode == "pad":
        if too_wide:  # bars above and below
            new_h = max(h, round(w * height / width))
            top = (new_h - h) // 2
            pad = ((top, new_h - h - top), (0, 0))
        else:  # bars left and right
            new_w = max(w, round(h * width / height))
            left = (new_w - w) // 2
            pad = ((0, 0), (left, new_w - w - left))
        if pad == ((0, 0), (0, 0)):
            return frame
        return np.pad(frame, (*pad, *[(0, 0)] * (frame.ndim - 2)), mode="constant")
    if too_wide:
        new_w = max(1, round(h * width / height))
        x0 = (w - new_w) // 2
        return frame[:, x0:x0 + new_w]
    new_h = max(1, round(w * height / width))
    y0 = (h - new_h) // 2
    return frame[y0:y0 + new_h]


def fit(frame: np.ndarray, width: int, height: int, mode: str = "crop") -> np.ndarray:
    """RGB uint8 (H, W, 3) -> exactly (height, width, 3). Within a pixel of the size (an odd
    side meeting an even-sized encoder) it is cut or padded by repeating the edge pixels;
    otherwise it is brought to the aspect ratio (`fit_aspect`, `mode`) and resized."""
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise StreamStudioError(f"expected an RGB uint8 (H, W, 3) frame, got {frame.dtype} {frame.shape}")
    h, w = frame.shape[:2]
    if abs(h - height) > 1 or abs(w - width) > 1:
        import cv2

        frame = fit_aspect(frame, width, height, mode)
        shrink = frame.shape[1] > width
        return cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    frame = frame[:height, :width]
    if h < height or w < width:
        frame = np.pad(frame, ((0, height - frame.shape[0]), (0, width - frame.shape[1]), (0, 0)), mode="edge")
    return np.ascontiguousarray(frame)


def parse_color(value: str | None, name: str = "colour") -> tuple[float, float, float]:
    """A colour as people and colour pickers write it -> RGB in 0..1: '#rrggbb', '#rgb',
    'rgb(r, g, b)' / 'rgba(r, g, b, a)' with r, g, b in 0..255, or 'R,G,B' in 0..1.
    None or empty is black. `name` (a flag or a field) starts the error message."""
    text = (value or "#000000").strip().lower()
    m = re.fullmatch(r"#([0-9a-f]{6}|[0-9a-f]{3})", text)
    if m:
        digits = m.group(1) if len(m.group(1)) == 6 else "".join(c * 2 for c in m.group(1))
        r, g, b = (int(digits[i:i + 2], 16) / 255 for i in (0, 2, 4))
        return r, g, b
    m = re.fullmatch(r"rgba?\(([^)]*)\)", text)
    parts, scale = (m.group(1), 255.0) if m else (text, 1.0)
    try:
        values = [float(p) / scale for p in parts.split(",")]
    except ValueError:
        values = []
    if m and len(values) == 4:
        values = values[:3]  # rgba(): the alpha is not a colour
    if len(values) == 3 and all(0.0 <= v <= 1.0 for v in values):
        r, g, b = values
        return r, g, b
    raise StreamStudioError(f"{name} {value!r} is not a colour; give #rrggbb, #rgb, rgb(r, g, b) with 0..255 "
                            f"or R,G,B with 0..1")
