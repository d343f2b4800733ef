"""ControlNet preprocessors: the control image of an input frame, in plain torch.

Every preprocessor takes frames as a float tensor (B, 3, H, W) in [0, 1] on any device and
returns the control image (B, 3, H, W) in [0, 1] on that device (what diffusers' ControlNets
take), so they run on the GPU where the pipeline runs. No OpenCV, no threads, no I/O.

- `canny`: OpenCV's Canny (cv2.Canny with aperture 3 and the L1 gradient, the annotator
  ControlNet's canny models were trained with) on the frame quantised to 0..255: an optional
  Gaussian blur, a 3x3 Sobel with replicated borders per colour channel (the channel with the
  largest |dx| + |dy| wins, as OpenCV does for colour images), non-maximum suppression along
  the gradient's sector (OpenCV's tan 22.5 / tan 67.5 sectors in its 15-bit fixed point),
  and hysteresis: the 8-connected chains of candidates above `low` that hold a pixel above
  `high`. White edges on black.
- `depth`: a user-supplied depth model (`depth_model`: any callable frames -> (B, 1, h, w)
  relative inverse depth, e.g. `transformers_depth_model("depth-anything/Depth-Anything-V2-Small-hf")`),
  or offline a classical fallback: a ground-plane prior (lower in the picture is nearer)
  raised where the picture is sharp (detail is where the camera focuses, usually the subject),
  smoothed. Near is bright, as MiDaS and Depth Anything maps are. A heuristic, not a
  measurement: plug in a model for real depth.
- `lineart`: dark lines as white on black (a difference of Gaussians: where the picture is
  darker than its blurred surround).
- `softedge`: soft edges as white on black (the Sobel magnitude of the blurred picture,
  normalised per frame, with a soft tone curve), what HED / PiDiNet soft-edge models take.
- `none`: the frame itself.

A control picture given as a picture (txt2img's) is brought to the stream's size first as
diffusers' ControlNet pipelines bring a control image to theirs (`fit_picture`: PIL's Lanczos
on the 8-bit RGB picture, / 255), then preprocessed (`ControlInputs.picture_images`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from PIL import Image
import numpy as np
from transformers import AutoModelForDepthEstimation

from streamstudio.errors import StreamStudioError
from streamstudio.frames import ImagesLike, to_rgb

PREPROCESSORS = ("canny", "depth", "lineart", "softedge", "none")
LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601, OpenCV's RGB2GRAY weights

# OpenCV's Canny sector bounds in 15-bit fixed point: round(tan(22.5 deg) * 2^15); tan(67.5) = tan(22.5) + 2
TG22 = 13573
TG67 = TG22 + (2 << 15)

DepthModel = Callable[[torch.Tensor], torch.Tensor]  # (B, 3, H, W) in [0, 1] -> (B, 1, h, w) relative inverse depth


@dataclass
class ControlConfig:
    """Settings of one preprocessor."""

    kind: str = "canny"  # canny | depth | lineart | softedge | none
    low_threshold: float = 100.0  # canny: candidates need |dx| + |dy| above this (0..255 image scale)
    high_threshold: float = 200.0  # canny: a chain needs one pixel above this
    blur_sigma: float = 0.0  # canny: Gaussian blur before the Sobel (0: none, as ControlNet's annotator)
    line_sigma: float = 1.5  # lineart: the surround's blur, in pixels
    soft_sigma: float = 1.0  # softedge and depth detail: blur before the gradient, in pixels

    def validate(self) -> "ControlConfig":
        if self.kind not in PREPROCESSORS:
            raise StreamStudioError(f"unknown control preprocessor {self.kind!r}; use one of "
                                    f"{', '.join(PREPROCESSORS)} (option --control-preprocessor)")
        if not 0 <= self.low_threshold <= 2040 or not 0 <= self.high_threshold <= 2040:
            raise StreamStudioError("canny thresholds must be in [0, 2040] (|dx| + |dy| of a 0..255 image), "
                                    f"got {self.low_threshold:g} and {self.high_threshold:g}")
        for name in ("blur_sigma", "line_sigma", "soft_sigma"):
            if not 0 <= getattr(self, name) <= 20:
                raise StreamStudioError(f"{name} must be in [0, 20] pixels, got {getattr(self, name):g}")
        return self


class Preprocessor:
    """One preprocessor with its settings: `pre(frames)` gives the control images."""

    def __init__(self, config: ControlConfig | str = "canny", depth_model: DepthModel | None = None):
        self.config = (ControlConfig(config) if isinstance(config, str) else config).validate()
        self.depth_model = depth_model

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        return preprocess(frames, self.config, self.depth_model)


def preprocess(frames: torch.Tensor, config: ControlConfig, depth_model: DepthModel | None = None) -> torch.Tensor:
    """frames (B, 3, H, W) in [0, 1] -> control images (B, 3, H, W) in [0, 1], same device and dtype."""
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise StreamStudioError(f"control preprocessors take frames (B, 3, H, W), got {tuple(frames.shape)}")
    kind = config.kind
    if kind == "none":
        return frames.clamp(0, 1)
    x = frames.float()
    if kind == "canny":
        out = canny(x, config.low_threshold, config.high_threshold, config.blur_sigma)
    elif kind == "depth":
        out = depth(x, depth_model, config.soft_sigma)
    elif kind == "lineart":
        out = lineart(x, config.line_sigma)
    elif kind == "softedge":
        out = soft_edge(x, config.soft_sigma)
    else:
        raise StreamStudioError(f"unknown control preprocessor {kind!r}; use one of {', '.join(PREPROCESSORS)}")
    return out.expand(-1, 3, -1, -1).to(frames.dtype).contiguous()  # (B, 3, H, W)


# ------------------------------------------------------------------------------------ helpers

def gaussian_kernel1d(sigma: float, size: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """OpenCV's getGaussianKernel for sigma > 0: size = round(6 sigma + 1) | 1 (for 8-bit images
    OpenCV takes round(3 sigma * 2 + 1) | 1), normalised to sum 1."""
    if size is None:
        size = int(round(sigma * 6 + 1)) | 1
    r = torch.arange(size, dtype=torch.float64, device=device) - (size - 1) / 2
    k = torch.exp(-(r ** 2) / (2 * sigma * sigma))
    return (k / k.sum()).float()  # (size,)


def blur(x: torch.Tensor, sigma: float, size: int | None = None) -> torch.Tensor:
    """Separable Gaussian blur with reflected borders (OpenCV's BORDER_REFLECT_101). x (B, C, H, W)."""
    if sigma <= 0:
        return x
    k = gaussian_kernel1d(sigma, size, x.device)
    r = k.numel() // 2
    c = x.shape[1]
    pad_mode = "reflect" if min(x.shape[-2:]) > r else "replicate"
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode=pad_mode), k.view(1, 1, 1, -1).expand(c, 1, 1, -1).contiguous(), groups=c)
    x = F.conv2d(F.pad(x, (0, 0, r, r), mode=pad_mode), k.view(1, 1, -1, 1).expand(c, 1, -1, 1).contiguous(), groups=c)
    return x


def sobel(x: torch.Tensor, border: str = "replicate") -> tuple[torch.Tensor, torch.Tensor]:
    """3x3 Sobel derivatives of every channel (OpenCV's kernels, as a correlation). x (B, C, H, W)."""
    c = x.shape[1]
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], device=x.device, dtype=x.dtype)
    xp = F.pad(x, (1, 1, 1, 1), mode=border)
    dx = F.conv2d(xp, kx.view(1, 1, 3, 3).expand(c, 1, 3, 3).contiguous(), groups=c)  # (B, C, H, W)
    dy = F.conv2d(xp, kx.t().reshape(1, 1, 3, 3).expand(c, 1, 3, 3).contiguous(), groups=c)
    return dx, dy


def gray(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) RGB -> (B, 1, H, W) luma."""
    w = torch.tensor(LUMA, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def normalise(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each frame scaled to [0, 1] (a flat frame gives 0). x (B, 1, H, W)."""
    lo = x.amin(dim=(1, 2, 3), keepdim=True)
    hi = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x - lo) / (hi - lo).clamp_min(eps)


# -------------------------------------------------------------------------------------- canny

def canny(frames: torch.Tensor, low: float = 100.0, high: float = 200.0, blur_sigma: float = 0.0) -> torch.Tensor:
    """Canny edges of frames (B, 3, H, W) in [0, 1] -> (B, 1, H, W) with 1.0 on edges, else 0."""
    if low > high:
        low, high = high, low  # as OpenCV
    img = torch.round(frames.clamp(0, 1) * 255.0)  # the 8-bit picture OpenCV sees
    if blur_sigma > 0:
        img = torch.round(blur(img, blur_sigma)).clamp(0, 255)
    dx, dy = sobel(img)  # (B, C, H, W), whole numbers
    mag = dx.abs() + dy.abs()
    best = mag.argmax(dim=1, keepdim=True)  # the first channel of largest magnitude
    dx, dy, mag = (t.gather(1, best) for t in (dx, dy, mag))  # (B, 1, H, W)
    dx, dy, mag = dx.to(torch.int64), dy.to(torch.int64), mag.to(torch.int64)

    # neighbours of each pixel's magnitude, zero outside the picture
    mp = F.pad(mag, (1, 1, 1, 1))  # (B, 1, H+2, W+2)
    h, w = mag.shape[-2:]

    def at(oy: int, ox: int) -> torch.Tensor:
        return mp[..., 1 + oy:1 + oy + h, 1 + ox:1 + ox + w]

    ax, ay = dx.abs(), dy.abs() << 15
    tg22x = ax * TG22
    horizontal = ay < tg22x
    vertical = ay > ax * TG67
    same_sign = (dx ^ dy) >= 0  # s = +1: the diagonal from top-left to bottom-right
    keep_h = (mag > at(0, -1)) & (mag >= at(0, 1))
    keep_v = (mag > at(-1, 0)) & (mag >= at(1, 0))
    keep_d = torch.where(same_sign, (mag > at(-1, -1)) & (mag > at(1, 1)), (mag > at(-1, 1)) & (mag > at(1, -1)))
    peak = torch.where(horizontal, keep_h, torch.where(vertical, keep_v, keep_d))
    candidate = peak & (mag > low)
    edges = candidate & (mag > high)
    return hysteresis(edges, candidate).to(frames.dtype)


def hysteresis(strong: torch.Tensor, candidate: torch.Tensor, check_every: int | None = None) -> torch.Tensor:
    """The candidates 8-connected (through candidates) to a strong pixel. (B, 1, H, W) bool.

    The edges grow one pixel a step until a step adds nothing. Whether the last step added
    anything is read every `check_every` steps (a host sync on a GPU): 64 there, so a frame
    usually costs one sync (chains longer than 64 pixels a few); 4 on the CPU, where a step
    costs more than a check."""
    if check_every is None:
        check_every = 64 if strong.device.type == "cuda" else 4
    edges = strong & candidate
    cand = candidate.float()
    while True:
        for _ in range(check_every):
            before = edges
            edges = (F.max_pool2d(edges.float(), 3, stride=1, padding=1) * cand) > 0
        if torch.equal(edges, before):  # the last step added nothing: a fixed point
            return edges


# -------------------------------------------------------------------------------------- depth

def depth(frames: torch.Tensor, depth_model: DepthModel | None = None, sigma: float = 1.0) -> torch.Tensor:
    """Relative inverse depth (near = 1) of frames (B, 3, H, W) -> (B, 1, H, W) in [0, 1]."""
    h, w = frames.shape[-2:]
    if depth_model is not None:
        with torch.no_grad():
            d = depth_model(frames)
        if d.ndim == 3:
            d = d[:, None]
        if d.ndim != 4 or d.shape[0] != frames.shape[0] or d.shape[1] != 1:
            raise StreamStudioError(f"the depth model must return (B, 1, h, w) or (B, h, w) for {frames.shape[0]} "
                                    f"frames, got {tuple(d.shape)}")
        d = F.interpolate(d.float(), size=(h, w), mode="bilinear", align_corners=False)
        return normalise(d, eps=torch.finfo(torch.float32).tiny)  # a model's scale is its own: any range
    return classical_depth(frames, sigma)


def classical_depth(frames: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """Offline fallback: ground-plane prior (rows lower in the picture are nearer) raised where
    the picture is sharp, smoothed over a large window. (B, 3, H, W) -> (B, 1, H, W) in [0, 1]."""
    b, _, h, w = frames.shape
    g = blur(gray(frames), sigma)
    dx, dy = sobel(g)
    detail = torch.sqrt(dx * dx + dy * dy)  # (B, 1, H, W)
    spread = max(1.0, min(h, w) / 16)  # sharp regions count as a whole, not as their edges only
    detail = normalise(blur(detail, spread, int(round(spread * 6 + 1)) | 1))
    ground = torch.linspace(0.0, 1.0, h, device=frames.device).view(1, 1, h, 1).expand(b, 1, h, w)
    return normalise(0.5 * ground + detail)


def transformers_depth_model(name_or_path: str, device: torch.device | str = "cpu",
                             local_files_only: bool = False, side: int | None = None) -> DepthModel:
    """A depth model from transformers (`AutoModelForDepthEstimation`: Depth Anything, DPT, ...)
    as a preprocessor's `depth_model`: frames (B, 3, H, W) in [0, 1] -> (B, 1, h, w).

    Frames are resized to `side` (default: the model's training size, its backbone's for Depth
    Anything: 518, a multiple of its 14-pixel patches) and normalised with ImageNet's mean and
    std, as its image processor does."""
    try:
        model = AutoModelForDepthEstimation.from_pretrained(name_or_path, local_files_only=local_files_only)
    except (OSError, ValueError) as exc:
        from streamstudio.errors import ModelNotFoundError

        raise ModelNotFoundError(f"depth model {name_or_path!r} could not be loaded ({str(exc).splitlines()[0]}); "
                                 f"run `hf download {name_or_path}` with network access, pass a local folder, or "
                                 "use the offline depth fallback (no depth model)") from exc
    model = model.to(device).eval().requires_grad_(False)
    if side is None:
        backbone = getattr(model.config, "backbone_config", None)
        side = int(getattr(model.config, "image_size", None) or getattr(backbone, "image_size", None) or 518)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
    dtype = next(model.parameters()).dtype

    def run(frames: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(frames.float(), size=(side, side), mode="bicubic", align_corners=False).clamp(0, 1)
        out = model(pixel_values=((x - mean) / std).to(dtype)).predicted_depth  # (B, h, w)
        return out[:, None].float()

    run.side = side  # type: ignore[attr-defined]  # (a function attribute: the side the depth model runs at)
    return run


# ------------------------------------------------------------------------- lineart, soft edge

def lineart(frames: torch.Tensor, sigma: float = 1.5) -> torch.Tensor:
    """Dark lines as white on black: how much darker each pixel is than its blurred surround
    (a difference of Gaussians), scaled so a one-pixel black line on white gives 1. (B, 1, H, W) in [0, 1]."""
    g = gray(frames)
    darker = (blur(g, sigma) - g).clamp_min(0)  # (B, 1, H, W)
    # on a black line on white the surround is 1 - k(0) (the line's own weight in the 1-D kernel)
    gain = 1.0 / (1.0 - float(gaussian_kernel1d(sigma).max())) if sigma > 0 else 1.0
    return ((1.0 - torch.exp(-4.0 * darker * gain)) / (1.0 - math.exp(-4.0))).clamp(0, 1)


def soft_edge(frames: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """Soft edges as white on black: the Sobel magnitude of the blurred luma, normalised per
    frame, with a soft tone curve (sqrt) so faint edges stay visible. (B, 1, H, W) in [0, 1]."""
    g = blur(gray(frames), sigma)
    dx, dy = sobel(g)
    return torch.sqrt(normalise(torch.sqrt(dx * dx + dy * dy)))


# --------------------------------------------------------------------- a stream's control inputs

@dataclass
class ControlUnit:
    """One ControlNet's input in a stream: its preprocessor and conditioning scale."""

    preprocessor: Preprocessor
    scale: float = 1.0


class ControlInputs:
    """The control inputs of one stream, one unit per ControlNet of the model (in the model's
    order). `images` runs every preprocessor once on a group of input frames; the stream keeps
    the result with those frames (a Stream Batch slot holding an older frame gets that frame's
    control images); `scales` gives the per-row conditioning scales of a call."""

    def __init__(self, units: list[ControlUnit]):
        self.units = list(units)
        self.runs = 0  # preprocessor passes over a group of frames
        self._scales: tuple[tuple, torch.Tensor] | None = None  # (key, tensor): made again only on a change

    def __len__(self) -> int:
        return len(self.units)

    def images(self, frames: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """frames (k, 3, H, W) in [0, 1] -> one (k, 3, H, W) control image batch per net."""
        self.runs += 1
        return tuple(unit.preprocessor(frames) for unit in self.units)

    def picture_images(self, pictures: ImagesLike, height: int, width: int,
                       device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
        """txt2img's control picture(s) (one, or a list of k; HxWx3 uint8 RGB or anything
        `frames.to_rgb` takes) -> one (k, 3, height, width) control image batch per net, on
        `device`: fitted to the size as diffusers' ControlNet pipelines fit a control image
        (`fit_picture`: PIL's Lanczos), then each net's preprocessor."""
        return self.images(fit_picture(pictures, height, width).to(device))

    def set_scale(self, index: int, scale: float) -> None:
        if not 0 <= index < len(self.units):
            raise StreamStudioError(f"there is no ControlNet {index}; the model has {len(self.units)} (0-based)")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not -10 <= scale <= 10:
            raise StreamStudioError(f"a ControlNet conditioning scale must be a number in [-10, 10], got {scale!r}")
        self.units[index].scale = float(scale)

    def scales(self, rows: int, device: torch.device) -> torch.Tensor:
        """(rows, n_nets) float32: every row at the current scales. Kept on the device until a
        scale changes (an upload per call would be a host sync per frame on a GPU)."""
        key = (rows, str(device), tuple(u.scale for u in self.units))
        if self._scales is None or self._scales[0] != key:
            values = torch.tensor(key[2], dtype=torch.float32, device=device)
            self._scales = (key, values.expand(rows, -1).contiguous())
        return self._scales[1]


def fit_picture(pictures: ImagesLike, height: int, width: int) -> torch.Tensor:
    """Control picture(s) at the stream's size, as diffusers' ControlNet pipelines bring a
    control picture to (height, width) (`prepare_image`: `VaeImageProcessor(do_convert_rgb=True,
    do_normalize=False).preprocess(PIL image, height, width)`): PIL's Lanczos resize of the 8-bit
    RGB picture, stretched to the size (no crop), then / 255 in float32. A picture already at the
    size is taken as it is (PIL's resize copies it). One picture or a list, anything
    `frames.to_rgb` takes (transparency composited on black first, as every input of the stream)
    -> (k, 3, height, width) float32 in [0, 1] on the CPU."""
    items = list(pictures) if isinstance(pictures, (list, tuple)) else [pictures]
    if not items:
        raise StreamStudioError("no control picture given")
    out = []
    for item in items:
        rgb = to_rgb(item)  # (H, W, 3) uint8
        if rgb.shape[:2] != (height, width):
            rgb = np.asarray(Image.fromarray(rgb).resize((width, height), resample=Image.Resampling.LANCZOS))
        out.append(torch.from_numpy(np.array(rgb)))  # a writable copy
    return torch.stack(out).permute(0, 3, 1, 2).float() / 255.0  # (k, 3, height, width), diffusers' pil_to_numpy
