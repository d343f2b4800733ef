"""Training clips for the StreamDiT model: synthetic moving coloured shapes, or video files.

Clips are float tensors (F, 3, H, W) in [-1, 1] with a caption. The synthetic generator draws
one shape (circle, square or triangle) of one colour moving in one direction over a dark
background, captioned like "a red circle moving left"; motion wraps around the frame edges, so
an endless stream stays inside the training distribution.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from streamstudio.errors import StreamStudioError

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 210, 50),
    "blue": (40, 70, 240),
    "yellow": (240, 220, 30),
    "cyan": (30, 220, 230),
    "magenta": (230, 40, 220),
    "white": (245, 245, 245),
}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".webm", ".avi", ".gif")


@dataclass
class ShapeSpec:
    colour: str
    shape: str
    direction: str
    speed: float  # pixels per frame
    radius: float  # pixels
    x: float  # centre at frame 0
    y: float
    background: float  # grey level in [0, 1]

    @property
    def caption(self) -> str:
        return f"a {self.colour} {self.shape} moving {self.direction}"


def random_spec(rng: random.Random, size: int, colour: str | None = None) -> ShapeSpec:
    return ShapeSpec(
        colour=colour or rng.choice(list(COLOURS)),
        shape=rng.choice(SHAPES),
        direction=rng.choice(list(DIRECTIONS)),
        speed=rng.uniform(0.5, 2.0) * size / 32,
        radius=rng.uniform(0.17, 0.28) * size,
        x=rng.uniform(0, size),
        y=rng.uniform(0, size),
        background=rng.uniform(0.0, 0.15),
    )


def render_shape_batch(specs: list[ShapeSpec], frames: int, size: int, start: int = 0) -> torch.Tensor:
    """The clips of `specs` from frame `start`: (B, frames, 3, size, size) in [-1, 1], each shape's
    anti-aliased coverage over its background, centres wrapped around the frame (a torus). One
    batch in a few ops: a GPU run's 256 clips drawn one by one took about half a second on a busy
    2-core CPU."""
    def column(values) -> torch.Tensor:  # (B, 1, 1, 1)
        return torch.tensor(values, dtype=torch.float32)[:, None, None, None]

    dx = column([DIRECTIONS[s.direction][0] for s in specs])
    dy = column([DIRECTIONS[s.direction][1] for s in specs])
    speed, r = column([s.speed for s in specs]), column([s.radius for s in specs])
    f = torch.arange(start, start + frames, dtype=torch.float32)[None, :, None, None]  # (1, F, 1, 1)
    cx = column([s.x for s in specs]) + dx * speed * f  # (B, F, 1, 1)
    cy = column([s.y for s in specs]) + dy * speed * f
    grid = torch.arange(size, dtype=torch.float32) + 0.5
    # wrapped distances to the centre (the plane is a torus)
    ddx = torch.remainder(grid[None, None, None, :] - cx + size / 2, size) - size / 2  # (B, F, 1, W)
    ddy = torch.remainder(grid[None, None, :, None] - cy + size / 2, size) - size / 2  # (B, F, H, 1)
    kind = torch.tensor([SHAPES.index(s.shape) for s in specs])[:, None, None, None]  # (B, 1, 1, 1)
    inside = torch.where(kind == 0, r - torch.sqrt(ddx**2 + ddy**2),
                         torch.where(kind == 1, 0.8 * r - torch.maximum(ddx.abs(), ddy.abs()),
                                     torch.minimum(r * 0.8 - ddy, (ddy + 0.8 * r) * 0.55 - ddx.abs())))
    alpha = (inside.clamp(-0.5, 0.5) + 0.5)[:, :, None]  # (B, F, 1, H, W)
    colour = torch.tensor([COLOURS[s.colour] for s in specs], dtype=torch.float32) / 255.0  # (B, 3)
    background = torch.tensor([s.background for s in specs])[:, None, None, None, None]
    img = background * (1 - alpha) + colour[:, None, :, None, None] * alpha  # (B, F, 3, H, W)
    return img * 2 - 1


def render_shape_clip(spec: ShapeSpec, frames: int, size: int, start: int = 0) -> torch.Tensor:
    """The clip of `spec` from frame `start`: (frames, 3, size, size) in [-1, 1]."""
    return render_shape_batch([spec], frames, size, start)[0]


def synthetic_batch(seed: int, batch: int, frames: int, size: int) -> tuple[torch.Tensor, list[str]]:
    """A deterministic batch for `seed`: (B, F, 3, size, size) in [-1, 1] and B captions."""
    rng = random.Random(seed)
    specs = [random_spec(rng, size) for _ in range(batch)]
    return render_shape_batch(specs, frames, size), [s.caption for s in specs]


def read_video(path: str | Path, size: int, max_frames: int | None = None) -> torch.Tensor:
    """Decode a video file with PyAV: (F, 3, size, size) in [-1, 1] (centre square crop)."""
    import av

    try:
        container = av.open(str(path))
    except Exception as exc:  # PyAV raises several types for unreadable files
        raise StreamStudioError(f"cannot read video {path}: {exc}; give a readable video file") from exc
    out = []
    with container:
        for frame in container.decode(video=0):
            out.append(frame.to_ndarray(format="rgb24"))
            if max_frames and len(out) >= max_frames:
                break
    if not out:
        raise StreamStudioError(f"video {path} has no frames; give a video with at least one frame")
    return frames_to_tensor(np.stack(out), size)


def frames_to_tensor(frames: np.ndarray, size: int) -> torch.Tensor:
    """uint8 (F, H, W, 3) -> (F, 3, size, size) in [-1, 1], centre square crop then resize."""
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float()  # (F, 3, H, W)
    h, w = x.shape[-2:]
    s = min(h, w)
    x = x[:, :, (h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=s > size)
    return x / 127.5 - 1


class VideoFolder:
    """Clips from the videos of a folder; caption from `<stem>.txt` beside a video, else its name."""

    def __init__(self, folder: str | Path, size: int, max_frames_per_video: int = 512):
        folder = Path(folder)
        files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES) if folder.is_dir() else []
        if not files:
            raise StreamStudioError(f"no video files ({', '.join(VIDEO_SUFFIXES)}) in {folder}; "
                                    "give a folder of videos or use --data synthetic")
        self.videos = [read_video(p, size, max_frames_per_video) for p in files]
        self.captions = [self._caption(p) for p in files]

    @staticmethod
    def _caption(path: Path) -> str:
        txt = path.with_suffix(".txt")
        return txt.read_text().strip() if txt.is_file() else path.stem.replace("_", " ").replace("-", " ")

    def batch(self, seed: int, batch: int, frames: int) -> tuple[torch.Tensor, list[str]]:
        """(B, F, 3, size, size) random clips (short videos loop) and their captions."""
        rng = random.Random(seed)
        clips, caps = [], []
        for _ in range(batch):
            i = rng.randrange(len(self.videos))
            video = self.videos[i]
            start = rng.randrange(max(1, len(video) - frames + 1))
            idx = (torch.arange(frames) + start) % len(video)
            clips.append(video[idx])
            caps.append(self.captions[i])
        return torch.stack(clips), caps


def dominant_colour(frames: np.ndarray | list[np.ndarray], threshold: int = 100) -> str:
    """The palette colour nearest to the mean of the bright pixels of uint8 RGB frames
    (the synthetic background is dark); "none" when no pixel is bright."""
    x = np.asarray(frames, dtype=np.float32).reshape(-1, 3)  # (pixels, 3)
    bright = x[x.max(axis=1) > threshold]
    if len(bright) == 0:
        return "none"
    names = list(COLOURS)
    palette = np.array([COLOURS[n] for n in names], dtype=np.float32)  # (colours, 3)
    # classify each bright pixel, then vote
    nearest = ((bright[:, None, :] - palette[None]) ** 2).sum(-1).argmin(1)
    return names[int(np.bincount(nearest, minlength=len(names)).argmax())]
