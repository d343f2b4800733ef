"""Procedurally generated training images and prompt looks for the built-in image model.

Everything here is drawn from a seeded `torch.Generator`, so a batch is a pure function of
its seed (a resumed training run draws exactly what the stopped one would have drawn).

Images: gradients, shapes, stripes and checkerboards, multi-octave noise fields, text,
camera-like test patterns (colour bars, grids, rings) and simple faces and hands, layered
through soft masks, then augmented with crops, flips, colour jitter, blur and sensor noise.
(B, 3, S, S) float32 in [0, 1].

Prompts: `random_prompt` draws a prompt from a small vocabulary (colours, gradings, styles,
subjects, filler words) together with the look it names; `apply_look` renders that look on
images in pixel space: the denoiser's target is the look applied to its input.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from PIL import ImageFont

# ---------------------------------------------------------------------------------------------
# Vocabulary: what a prompt can name
# ---------------------------------------------------------------------------------------------

COLOURS = {
    "red": (1.0, 0.12, 0.1), "green": (0.15, 0.9, 0.2), "blue": (0.15, 0.3, 1.0),
    "yellow": (1.0, 0.92, 0.15), "orange": (1.0, 0.55, 0.1), "purple": (0.6, 0.2, 0.9),
    "pink": (1.0, 0.45, 0.75), "cyan": (0.1, 0.9, 0.95), "magenta": (0.95, 0.15, 0.85),
    "golden": (1.0, 0.78, 0.3), "gold": (1.0, 0.78, 0.3), "teal": (0.1, 0.6, 0.6),
    "brown": (0.6, 0.38, 0.2), "silver": (0.8, 0.82, 0.88),
}
# grading and style words -> the look's name
GRADES = {
    "warm": "warm", "cold": "cold", "cool": "cold", "sepia": "sepia", "vintage": "sepia",
    "black and white": "gray", "grayscale": "gray", "greyscale": "gray", "monochrome": "gray",
    "negative": "negative", "inverted": "negative", "bright": "bright", "dark": "dark",
    "vivid": "vivid", "saturated": "vivid", "faded": "faded", "high contrast": "contrast",
}
STYLES = {
    "posterized": "posterize", "poster": "posterize", "pencil sketch": "sketch", "sketch": "sketch",
    "pencil drawing": "sketch", "pixel art": "pixel", "pixelated": "pixel", "8-bit": "pixel",
    "oil painting": "oil", "painting": "oil", "blurry": "blur", "soft focus": "blur",
    "watercolor": "watercolor", "watercolour": "watercolor",
}
SUBJECTS = ("cat", "dog", "person", "face", "hand", "city", "street", "forest", "mountain", "car", "house",
            "room", "portrait", "landscape", "flower", "sky", "sea", "man", "woman", "robot", "tree", "bird")
FILLERS = ("a", "an", "the", "of", "in", "with", "photo", "picture", "image", "style", "and", "tone",
           "toned", "colors", "colours", "look", "shot", "scene", "very", "filter", "effect", "graded",
           "detailed", "high", "quality", "camera", "webcam", "video", "art", "my", "on", "at", "by")
TEMPLATES = ("{x}", "{x}", "a {x} photo", "{x} style", "a photo of a {s}, {x}", "{s} in {x}", "{x} {s}",
             "{x} picture of a {s}", "a {s}, {x} style", "{x} image", "{x} filter", "{x} look")
IDENTITY = ("", "", "a photo", "a photo of a {s}", "{s}", "a picture", "webcam video", "high quality photo of a {s}")


def vocabulary() -> list[str]:
    """Every word a prompt of the training distribution uses (the tokenizer's whole words)."""
    words: set[str] = set()
    for phrase in (*COLOURS, *GRADES, *STYLES, *SUBJECTS, *FILLERS):
        words.update(phrase.split())
    words.update(w for t in TEMPLATES + IDENTITY for w in t.replace(",", " ").split() if "{" not in w)
    words.update(("colour", "color", "tint", "tinted", "toning", "grade", "look", "and"))
    return sorted(words)


@dataclass(frozen=True)
class Look:
    """What a prompt asks for: a style, a grading and a colour (each may be None)."""

    style: str | None = None
    grade: str | None = None
    colour: tuple[float, float, float] | None = None

    @property
    def is_identity(self) -> bool:
        return self.style is None and self.grade is None and self.colour is None


def parse_prompt(prompt: str) -> Look:
    """The look a prompt names, by the same vocabulary (used by tests and evaluation)."""
    text = " " + " ".join(prompt.lower().replace(",", " ").split()) + " "
    style = next((v for k, v in sorted(STYLES.items(), key=lambda kv: -len(kv[0])) if f" {k} " in text), None)
    grade = next((v for k, v in sorted(GRADES.items(), key=lambda kv: -len(kv[0])) if f" {k} " in text), None)
    colour = next((v for k, v in COLOURS.items() if f" {k} " in text), None)
    return Look(style, grade, colour)


def _pick(gen: torch.Generator, items):
    items = list(items)
    return items[int(torch.randint(len(items), (1,), generator=gen))]


DEFAULT_STYLE_SHARE = 0.38  # of prompts naming a style (alone 0.28, with a colour 0.10)


def _mix(style_share: float) -> tuple[float, float, float, float]:
    """Upper bounds of u for (nothing, style, grading, colour); style + colour above the last.
    A style is named with share `style_share` (0.72 of them alone); grading and colour split
    the rest after the 12% of plain prompts evenly, as in the default mix."""
    if style_share == DEFAULT_STYLE_SHARE:
        return 0.12, 0.40, 0.66, 0.90  # the shipped model's mix, drawn exactly as it was
    if not 0.0 <= style_share <= 0.88:
        raise ValueError(f"style share must be within 0..0.88, got {style_share}")
    rest = (0.88 - style_share) / 2
    return 0.12, 0.12 + 0.72 * style_share, 0.12 + 0.72 * style_share + rest, 0.12 + 0.72 * style_share + 2 * rest


def random_prompt(gen: torch.Generator, style_share: float = DEFAULT_STYLE_SHARE,
                  subjects: tuple[str, ...] = SUBJECTS) -> tuple[str, Look]:
    """A prompt and its look: a style, a grading, a colour, style + colour, or nothing; the
    subject word (when the template has one) is drawn from `subjects`."""
    plain, style, grade, colour = _mix(style_share)
    u = float(torch.rand((), generator=gen))
    subject = _pick(gen, subjects)
    if u < plain:
        return _pick(gen, IDENTITY).format(s=subject).strip(), Look()
    if u < style:
        word = _pick(gen, STYLES)
        look = Look(style=STYLES[word])
    elif u < grade:
        word = _pick(gen, GRADES)
        look = Look(grade=GRADES[word])
    elif u < colour:
        word = _pick(gen, COLOURS)
        look = Look(colour=COLOURS[word])
    else:
        sw, cw = _pick(gen, STYLES), _pick(gen, COLOURS)
        word = f"{cw} {sw}"
        look = Look(style=STYLES[sw], colour=COLOURS[cw])
    return _pick(gen, TEMPLATES).format(x=word, s=subject), look


# ---------------------------------------------------------------------------------------------
# Looks, in pixel space: (B, 3, H, W) in [0, 1] -> the same
# ---------------------------------------------------------------------------------------------

LUMA = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
SEPIA = torch.tensor([[0.393, 0.769, 0.189], [0.349, 0.686, 0.168], [0.272, 0.534, 0.131]])


def luminance(x: torch.Tensor) -> torch.Tensor:
    return (x * LUMA.to(x)).sum(1, keepdim=True)  # (B, 1, H, W)


def _box_blur(x: torch.Tensor, k: int) -> torch.Tensor:
    return F.avg_pool2d(F.pad(x, (k // 2,) * 4, mode="replicate"), k, stride=1)


def _quantize(x: torch.Tensor, levels: int) -> torch.Tensor:
    return (x * (levels - 1)).round() / (levels - 1)


def _saturate(x: torch.Tensor, amount: float) -> torch.Tensor:
    y = luminance(x)
    return (y + (x - y) * amount).clamp(0, 1)


def apply_style(x: torch.Tensor, style: str) -> torch.Tensor:
    if style == "posterize":
        return _quantize(x, 4)
    if style == "sketch":
        y = _box_blur(luminance(x), 3)
        gx = y[..., :, 2:] - y[..., :, :-2]
        gy = y[..., 2:, :] - y[..., :-2, :]
        g = torch.sqrt(F.pad(gx, (1, 1, 0, 0)) ** 2 + F.pad(gy, (0, 0, 1, 1)) ** 2)
        paper = 0.97 - 0.12 * (1 - y)  # light shading where the input is dark
        return (paper - 3.0 * g).clamp(0, 1).expand(-1, 3, -1, -1)
    if style == "pixel":
        h, w = x.shape[-2:]
        small = F.avg_pool2d(x, 8, ceil_mode=True)
        return F.interpolate(_quantize(_saturate(small, 1.3), 6), scale_factor=8, mode="nearest")[..., :h, :w]
    if style == "oil":
        return _quantize(_saturate(_box_blur(x, 5), 1.25), 6)
    if style == "blur":
        return _box_blur(_box_blur(x, 5), 5)
    if style == "watercolor":  # soft washes of lighter colour on white paper, darker at the edges
        wash = _saturate(_box_blur(_box_blur(x, 3), 3), 1.2)
        y = luminance(wash)
        gx = F.pad(y[..., :, 2:] - y[..., :, :-2], (1, 1, 0, 0))
        gy = F.pad(y[..., 2:, :] - y[..., :-2, :], (0, 0, 1, 1))
        return (0.3 + 0.75 * _quantize(wash, 8) - 1.5 * torch.sqrt(gx ** 2 + gy ** 2)).clamp(0, 1)
    raise ValueError(f"unknown style {style!r}")


def apply_grade(x: torch.Tensor, grade: str) -> torch.Tensor:
    if grade == "warm":
        return (x * torch.tensor([1.18, 1.04, 0.78]).view(1, 3, 1, 1).to(x)
                + torch.tensor([0.06, 0.02, 0.0]).view(1, 3, 1, 1).to(x)).clamp(0, 1)
    if grade == "cold":
        return (x * torch.tensor([0.78, 0.98, 1.18]).view(1, 3, 1, 1).to(x)
                + torch.tensor([0.0, 0.02, 0.07]).view(1, 3, 1, 1).to(x)).clamp(0, 1)
    if grade == "sepia":
        return torch.einsum("ij,bjhw->bihw", SEPIA.to(x), x).clamp(0, 1)
    if grade == "gray":
        return luminance(x).expand(-1, 3, -1, -1)
    if grade == "negative":
        return 1.0 - x
    if grade == "bright":
        return (x * 0.7 + 0.35).clamp(0, 1)
    if grade == "dark":
        return x * 0.45
    if grade == "vivid":
        return _saturate(x, 1.8)
    if grade == "faded":
        return 0.25 + 0.55 * _saturate(x, 0.5)
    if grade == "contrast":
        return ((x - 0.5) * 1.7 + 0.5).clamp(0, 1)
    raise ValueError(f"unknown grade {grade!r}")


def apply_colour(x: torch.Tensor, colour: tuple[float, float, float]) -> torch.Tensor:
    """A strong tint: the image's luminance in the colour, with a little of the original."""
    c = torch.tensor(colour).view(1, 3, 1, 1).to(x)
    return (0.3 * x + 0.7 * (1.35 * luminance(x)).clamp(0, 1) * c).clamp(0, 1)


def apply_look(x: torch.Tensor, look: Look) -> torch.Tensor:
    if look.style:
        x = apply_style(x, look.style)
    if look.grade:
        x = apply_grade(x, look.grade)
    if look.colour:
        x = apply_colour(x, look.colour)
    return x


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------

def _rand(gen, *shape) -> torch.Tensor:
    return torch.rand(shape, generator=gen)


def _uniform(gen, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=gen))


def _colour(gen) -> torch.Tensor:
    return _rand(gen, 3).view(3, 1, 1)


def _grid(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    v = (torch.arange(s, dtype=torch.float32) + 0.5) / s * 2 - 1
    return v.view(s, 1).expand(s, s), v.view(1, s).expand(s, s)  # yy, xx in [-1, 1]


def _soft(d: torch.Tensor, s: int, width: float = 1.0) -> torch.Tensor:
    """Coverage of a signed distance (negative inside) with an edge of `width` pixels."""
    return (0.5 - d * s / (2 * width)).clamp(0, 1)


def gradient(gen, s):
    yy, xx = _grid(s)
    a = _uniform(gen, 0, 2 * math.pi)
    if float(torch.rand((), generator=gen)) < 0.6:
        t = (xx * math.cos(a) + yy * math.sin(a)) * 0.5 + 0.5
    else:
        cx, cy = _uniform(gen, -1, 1), _uniform(gen, -1, 1)
        t = (((xx - cx) ** 2 + (yy - cy) ** 2).sqrt() / _uniform(gen, 0.5, 2)).clamp(0, 1)
    c0, c1 = _colour(gen), _colour(gen)
    return c0 + (c1 - c0) * t


def _shape_mask(gen, s, yy, xx):
    kind = int(torch.randint(5, (1,), generator=gen))
    cx, cy, r = _uniform(gen, -0.9, 0.9), _uniform(gen, -0.9, 0.9), _uniform(gen, 0.08, 0.6)
    if kind == 0:  # ellipse
        e = _uniform(gen, 0.4, 1.0)
        d = ((xx - cx) ** 2 + ((yy - cy) / e) ** 2).sqrt() - r
    elif kind == 1:  # rotated rectangle
        a = _uniform(gen, 0, math.pi)
        u = (xx - cx) * math.cos(a) + (yy - cy) * math.sin(a)
        v = -(xx - cx) * math.sin(a) + (yy - cy) * math.cos(a)
        d = torch.maximum(u.abs() - r, v.abs() - r * _uniform(gen, 0.2, 1.0))
    elif kind == 2:  # triangle: three half-planes
        a0 = _uniform(gen, 0, 2 * math.pi)
        d = torch.full_like(xx, -1e9)
        for k in range(3):
            a = a0 + k * 2 * math.pi / 3
            d = torch.maximum(d, (xx - cx) * math.cos(a) + (yy - cy) * math.sin(a) - r * 0.5)
    elif kind == 3:  # ring
        d = (((xx - cx) ** 2 + (yy - cy) ** 2).sqrt() - r).abs() - r * _uniform(gen, 0.1, 0.35)
    else:  # thick line
        a = _uniform(gen, 0, math.pi)
        d = ((xx - cx) * math.sin(a) - (yy - cy) * math.cos(a)).abs() - _uniform(gen, 0.01, 0.08)
    return _soft(d, s, _uniform(gen, 0.7, 2.0))


def shapes(gen, s):
    yy, xx = _grid(s)
    img = gradient(gen, s) if float(torch.rand((), generator=gen)) < 0.5 else _colour(gen).expand(3, s, s)
    for _ in range(int(torch.randint(1, 8, (1,), generator=gen))):
        m = _shape_mask(gen, s, yy, xx)
        img = img * (1 - m) + _colour(gen) * m
    return img


def stripes(gen, s):
    yy, xx = _grid(s)
    kind = int(torch.randint(3, (1,), generator=gen))
    f = _uniform(gen, 2, 24)
    a = _uniform(gen, 0, math.pi)
    u = xx * math.cos(a) + yy * math.sin(a)
    if kind == 0:
        t = torch.sin(u * f * math.pi) * 0.5 + 0.5
    elif kind == 1:
        t = (torch.sin(u * f * math.pi) > 0).float()
    else:
        v = -xx * math.sin(a) + yy * math.cos(a)
        t = ((torch.floor((u + 2) * f / 2) + torch.floor((v + 2) * f / 2)) % 2).float()
    c0, c1 = _colour(gen), _colour(gen)
    return c0 + (c1 - c0) * t


def noise_field(gen, s):
    out = torch.zeros(3, s, s)
    base = int(torch.randint(2, 6, (1,), generator=gen))
    amp, total = 1.0, 0.0
    for octave in range(int(torch.randint(2, 6, (1,), generator=gen))):
        n = min(s, base * 2**octave)
        grid = torch.randn(1, 3, n, n, generator=gen)
        out += amp * F.interpolate(grid, size=(s, s), mode="bicubic", align_corners=False)[0]
        total += amp
        amp *= _uniform(gen, 0.35, 0.7)
    out = out / total
    if float(torch.rand((), generator=gen)) < 0.5:  # a colour ramp over one channel
        t = torch.sigmoid(out[:1] * 2.5)
        c0, c1 = _colour(gen), _colour(gen)
        return c0 + (c1 - c0) * t
    return torch.sigmoid(out * 2.0)


@lru_cache(maxsize=8)
def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def text_image(gen, s):
    bg = (_colour(gen).flatten() * 255).round().byte().tolist()
    img = Image.new("RGB", (s, s), tuple(bg))
    draw = ImageDraw.Draw(img)
    chars = string.ascii_letters + string.digits + "  .,!?"
    for _ in range(int(torch.randint(1, 5, (1,), generator=gen))):
        size = int(torch.randint(max(8, s // 12), max(10, s // 3), (1,), generator=gen))
        n = int(torch.randint(2, 12, (1,), generator=gen))
        text = "".join(chars[int(i)] for i in torch.randint(len(chars), (n,), generator=gen))
        fg = tuple((_colour(gen).flatten() * 255).round().byte().tolist())
        xy = (int(torch.randint(-s // 4, s, (1,), generator=gen)), int(torch.randint(-s // 8, s, (1,), generator=gen)))
        draw.text(xy, text, fill=fg, font=_font(size))
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255


def test_pattern(gen, s):
    yy, xx = _grid(s)
    kind = int(torch.randint(3, (1,), generator=gen))
    if kind == 0:  # colour bars over a grey ramp
        return colour_bars(s, _uniform(gen, 0.2, 0.7))
    if kind == 1:  # grid lines over a flat field
        f = _uniform(gen, 3, 12)
        line = torch.minimum((torch.frac((xx + 1) * f / 2) - 0.5).abs(), (torch.frac((yy + 1) * f / 2) - 0.5).abs())
        m = _soft(0.5 - line - _uniform(gen, 0.02, 0.08), s, 1.0)
        return _colour(gen) * (1 - m) + _colour(gen) * m
    r = (xx ** 2 + yy ** 2).sqrt()  # concentric rings and a cross
    t = (torch.sin(r * _uniform(gen, 8, 40)) > 0).float()
    cross = ((xx.abs() < 0.02) | (yy.abs() < 0.02)).float()
    return (_colour(gen) * t + _colour(gen) * (1 - t)) * (1 - cross) + cross


def colour_bars(s: int, ramp_from: float = 0.4) -> torch.Tensor:
    """SMPTE-like colour bars over a grey ramp (the ramp below y = ramp_from, in [-1, 1])."""
    yy, xx = _grid(s)
    bars = torch.tensor([[.75, .75, .75], [.75, .75, 0], [0, .75, .75], [0, .75, 0],
                         [.75, 0, .75], [.75, 0, 0], [0, 0, .75]])
    idx = ((xx + 1) / 2 * 7).long().clamp(0, 6)
    img = bars[idx].permute(2, 0, 1).clone()
    low = yy > ramp_from
    img[:, low] = ((xx[low] + 1) / 2).expand(3, -1)
    return img


SKIN = torch.tensor([[0.96, 0.8, 0.69], [0.87, 0.67, 0.52], [0.72, 0.5, 0.36], [0.55, 0.36, 0.24], [0.36, 0.23, 0.15]])


def face_or_hand(gen, s, kind: str | None = None):
    yy, xx = _grid(s)
    img = gradient(gen, s) if float(torch.rand((), generator=gen)) < 0.5 else shapes(gen, s) * 0.6 + 0.2
    skin = SKIN[int(torch.randint(len(SKIN), (1,), generator=gen))].view(3, 1, 1) * _uniform(gen, 0.85, 1.1)
    cx, cy, r = _uniform(gen, -0.3, 0.3), _uniform(gen, -0.2, 0.3), _uniform(gen, 0.3, 0.6)

    def put(mask, colour):
        nonlocal img
        img = img * (1 - mask) + colour * mask

    def ell(x0, y0, rx, ry):
        return _soft(((((xx - x0) / rx) ** 2 + ((yy - y0) / ry) ** 2).sqrt() - 1) * min(rx, ry), s)

    face = float(torch.rand((), generator=gen)) < 0.6
    if kind == "face" or (face and kind is None):  # a face
        put(ell(cx, cy - r * 0.35, r * 1.05, r * 0.9), _colour(gen) * 0.5)  # hair
        put(ell(cx, cy, r * 0.8, r), skin)
        for side in (-1, 1):
            ex, ey = cx + side * r * 0.35, cy - r * 0.15
            put(ell(ex, ey, r * 0.16, r * 0.09), torch.ones(3, 1, 1) * 0.95)
            put(ell(ex, ey, r * 0.07, r * 0.07), _colour(gen) * 0.4)
            put(ell(ex, ey - r * 0.2, r * 0.18, r * 0.03), skin * 0.4)  # brow
        put(ell(cx, cy + r * 0.1, r * 0.06, r * 0.15), skin * 0.8)  # nose
        put(ell(cx, cy + r * 0.5, r * 0.3, r * 0.07), torch.tensor([0.7, 0.25, 0.25]).view(3, 1, 1))
    else:  # a hand: a palm and five fingers
        put(ell(cx, cy + r * 0.3, r * 0.55, r * 0.6), skin)
        for k in range(5):
            a = -math.pi / 2 + (k - 2) * 0.35 + (0.5 if k == 0 else 0)
            length = r * (0.7 if k in (0, 4) else 0.95)
            fx, fy = cx + math.cos(a) * (r * 0.5 + length / 2), cy + r * 0.3 + math.sin(a) * (r * 0.5 + length / 2)
            u = (xx - fx) * math.cos(a) + (yy - fy) * math.sin(a)
            v = -(xx - fx) * math.sin(a) + (yy - fy) * math.cos(a)
            d = ((u.abs() - length / 2).clamp_min(0) ** 2 + v ** 2).sqrt() - r * 0.11
            put(_soft(d, s), skin * _uniform(gen, 0.9, 1.05))
    return img.clamp(0, 1)


GENERATORS = (gradient, shapes, stripes, noise_field, text_image, test_pattern, face_or_hand)
WEIGHTS = torch.tensor([1.0, 3.0, 1.0, 1.5, 1.2, 1.0, 1.5])


def _one(gen, s) -> torch.Tensor:
    return GENERATORS[int(torch.multinomial(WEIGHTS, 1, generator=gen))](gen, s)


def _jitter(gen, img: torch.Tensor) -> torch.Tensor:
    """Colour jitter: brightness, contrast, saturation and a hue rotation about the grey axis."""
    a = _uniform(gen, 0, 2 * math.pi) if float(torch.rand((), generator=gen)) < 0.5 else 0.0
    k = torch.ones(3) / math.sqrt(3)
    kx = torch.tensor([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    rot = torch.eye(3) + math.sin(a) * kx + (1 - math.cos(a)) * kx @ kx
    img = torch.einsum("ij,jhw->ihw", rot, img)
    y = (img * LUMA[0]).sum(0, keepdim=True)
    img = y + (img - y) * _uniform(gen, 0.3, 1.4)
    img = (img - 0.5) * _uniform(gen, 0.7, 1.3) + 0.5 + _uniform(gen, -0.15, 0.15)
    return img.clamp(0, 1)


def random_images(seed: int, batch: int, size: int) -> torch.Tensor:
    """(batch, 3, size, size) procedural images in [0, 1], a pure function of the seed."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(batch, 3, size, size)
    for b in range(batch):
        big = int(size * _uniform(gen, 1.0, 1.6))
        img = _one(gen, big)
        if float(torch.rand((), generator=gen)) < 0.45:  # a second layer through a shape's mask
            yy, xx = _grid(big)
            m = _shape_mask(gen, big, yy, xx)
            if float(torch.rand((), generator=gen)) < 0.5:
                m = 1 - m
            img = img * (1 - m) + _one(gen, big) * m
        if big > size:  # a random crop, sometimes shrunk to fit instead
            if float(torch.rand((), generator=gen)) < 0.3:
                img = F.interpolate(img[None], size=(size, size), mode="bilinear", antialias=True,
                                    align_corners=False)[0]
            else:
                y0, x0 = (int(torch.randint(big - size + 1, (1,), generator=gen)) for _ in range(2))
                img = img[:, y0:y0 + size, x0:x0 + size]
        if float(torch.rand((), generator=gen)) < 0.5:
            img = img.flip(-1)
        if float(torch.rand((), generator=gen)) < 0.3:
            img = img.flip(-2)
        img = _jitter(gen, img)
        if float(torch.rand((), generator=gen)) < 0.15:
            img = _box_blur(img[None], 3)[0]
        if float(torch.rand((), generator=gen)) < 0.3:  # sensor noise
            img = (img + torch.randn(img.shape, generator=gen) * _uniform(gen, 0.005, 0.04)).clamp(0, 1)
        out[b] = img
    return out


def styled_batch(seed: int, batch: int, size: int,
                 style_share: float = DEFAULT_STYLE_SHARE) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(inputs, targets, prompts): procedural images, the looks their prompts name, the prompts."""
    images = random_images(seed, batch, size)
    targets, prompts = styled(images, seed, style_share)
    return images, targets, prompts


def styled(images: torch.Tensor, seed: int, style_share: float = DEFAULT_STYLE_SHARE,
           subjects: tuple[str, ...] = SUBJECTS) -> tuple[torch.Tensor, list[str]]:
    """(targets, prompts) for any images (B, 3, H, W) in [0, 1]: a prompt per image drawn from
    the vocabulary (a pure function of the seed) and its look applied to the image."""
    gen = torch.Generator().manual_seed(seed + 7_777_777)
    prompts, targets = [], torch.empty_like(images)
    for b in range(images.shape[0]):
        prompt, look = random_prompt(gen, style_share, subjects)
        prompts.append(prompt)
        targets[b] = apply_look(images[b:b + 1], look)[0]
    return targets, prompts


LANDSCAPE_WORDS = ("landscape", "mountain", "sea", "sky")  # prompts over `landscapes` images name these


def landscape(gen, s):
    """A landscape's layout: a sky (blue, or a sunset's orange over purple) over a ground of
    grass, sand or sea at a horizon around the middle, sometimes a mountain range and a sun."""
    yy, xx = _grid(s)
    horizon = _uniform(gen, -0.2, 0.35)  # y in [-1, 1], down is +
    t = ((yy + 1) / (horizon + 1)).clamp(0, 1)
    if float(torch.rand((), generator=gen)) < 0.7:  # a day sky: deep blue above, pale at the horizon
        top, low = torch.tensor([0.15, 0.35, 0.8]), torch.tensor([0.65, 0.8, 0.95])
    else:  # a sunset
        top, low = torch.tensor([0.3, 0.15, 0.45]), torch.tensor([1.0, 0.6, 0.25])
    img = top.view(3, 1, 1) + (low - top).view(3, 1, 1) * t
    if float(torch.rand((), generator=gen)) < 0.4:  # the sun
        cx, cy, r = _uniform(gen, -0.8, 0.8), _uniform(gen, -0.9, horizon - 0.2), _uniform(gen, 0.05, 0.15)
        m = _soft(((xx - cx) ** 2 + (yy - cy) ** 2).sqrt() - r, s, 1.5)
        img = img * (1 - m) + torch.tensor([1.0, 0.95, 0.7]).view(3, 1, 1) * m
    if float(torch.rand((), generator=gen)) < 0.5:  # a mountain range: a jagged ridge above the horizon
        ridge = torch.zeros(s)
        for k in range(1, 5):
            ridge += _uniform(gen, 0.02, 0.12) / k * torch.sin(xx[0] * math.pi * k * _uniform(gen, 0.5, 2)
                                                               + _uniform(gen, 0, 6))
        ridge = horizon - _uniform(gen, 0.1, 0.35) + ridge
        m = _soft(ridge.view(1, s) - yy, s, 1.5)
        shade = torch.tensor([0.3, 0.32, 0.4]) * _uniform(gen, 0.6, 1.3)
        img = img * (1 - m) + shade.view(3, 1, 1) * m
    ground = _pick(gen, ([0.25, 0.55, 0.2], [0.8, 0.7, 0.45], [0.1, 0.3, 0.55], [0.35, 0.45, 0.2]))
    depth = ((yy - horizon) / (1 - horizon)).clamp(0, 1)
    ground = torch.tensor(ground).view(3, 1, 1) * (0.75 + 0.35 * depth)
    ground = ground + 0.05 * ((_rand(gen, 1, s // 4 + 1, s // 4 + 1) - 0.5)
                              .repeat_interleave(4, 1).repeat_interleave(4, 2)[:, :s, :s])
    m = _soft(horizon - yy, s, 1.0)
    return (img * (1 - m) + ground * m).clamp(0, 1)


def landscapes(seed: int, batch: int, size: int) -> torch.Tensor:
    """(batch, 3, size, size) landscape layouts in [0, 1], a pure function of the seed."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.stack([landscape(gen, size) for _ in range(batch)])
    return out.flip(-1) if float(torch.rand((), generator=gen)) < 0.5 else out


def test_card(size: int = 256) -> np.ndarray:
    """A fixed camera-like test card (uint8 HxWx3): colour bars over a grey ramp, a face and a
    hand in circles, two shapes and a line of text; the structure the tests check img2img keeps."""
    yy, xx = _grid(size)
    img = colour_bars(size, 0.3)
    half = size // 2
    hy, hx = _grid(half)
    disc = _soft((hx ** 2 + hy ** 2).sqrt() - 0.95, half)
    for kind, seed, x0 in (("face", 3, size // 32), ("hand", 4, size // 2 - size // 32)):
        sub = face_or_hand(torch.Generator().manual_seed(seed), half, kind)
        region = img[:, size // 32:size // 32 + half, x0:x0 + half]
        img[:, size // 32:size // 32 + half, x0:x0 + half] = region * (1 - disc) + sub * disc
    gen = torch.Generator().manual_seed(1234)
    for _ in range(2):
        mm = _shape_mask(gen, size, yy, xx)
        img = img * (1 - mm) + _colour(gen) * mm
    band = Image.new("RGB", (size, size // 6), (240, 240, 240))
    ImageDraw.Draw(band).text((size // 20, size // 40), "StreamStudio 0123", fill=(20, 20, 20),
                              font=_font(max(8, size // 10)))
    img[:, size - size // 6:] = torch.from_numpy(np.asarray(band).copy()).permute(2, 0, 1).float() / 255
    return (img.clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
