"""Photographs for the built-in image model's training: the list, where they come from, and
random crops of them drawn as a pure function of a seed.

The photographs are the desktop backgrounds of Debian packages (`DATA_LIST`,
`app/training/image_photos.tsv`: path, package, licence, split). `fetch(root)` downloads the
packages with apt-get and unpacks them under `root` (no root rights needed: `apt-get download`
and `dpkg-deb -x`); only the trained weights ship, never a photograph.

`PhotoSet(root)` loads the listed photos of one split once, each resized so its shorter side
is `short_side` pixels (a cache file in the root keeps the resized set for later runs), and
`crops(seed, batch, size)` cuts (batch, 3, size, size) crops in [0, 1]: a random square of
side between `size` and the photo's shorter side, resized to `size`, flipped, with a little
brightness, contrast and saturation jitter.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from tqdm.auto import tqdm

from streamstudio.errors import StreamStudioError

log = logging.getLogger(__name__)

DATA_LIST = Path(__file__).resolve().parents[2] / "app" / "training" / "image_photos.tsv"
SPLITS = ("train", "tune")


@dataclass(frozen=True)
class PhotoEntry:
    path: str  # inside the unpacked packages, e.g. usr/share/backgrounds/mate/nature/Dune.jpg
    package: str
    licence: str
    split: str


def entries(split: str | None = None, data_list: Path | None = None) -> list[PhotoEntry]:
    """The listed photographs (of one split, or all) of `data_list` (default DATA_LIST)."""
    data_list = Path(data_list or DATA_LIST)
    out = []
    for line in data_list.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        path, package, licence, kind = line.split("\t")
        if kind not in SPLITS:
            raise ValueError(f"{data_list}: split {kind!r} of {path} is not one of {SPLITS}")
        if split is None or kind == split:
            out.append(PhotoEntry(path, package, licence, kind))
    return out


def packages(data_list: Path | None = None) -> list[str]:
    return sorted({e.package for e in entries(None, data_list)})


def fetch(root: str | Path, data_list: Path | None = None) -> Path:
    """Download the listed Debian packages (apt-get download) and unpack them under `root`."""
    root = Path(root)
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise StreamStudioError("fetching the training photographs needs apt-get and dpkg-deb (a Debian or "
                                "Ubuntu machine); or unpack the packages " + ", ".join(packages(data_list))
                                + f" under {root} by hand")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="streamstudio-photos-") as tmp:
        for package in packages(data_list):
            done = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, text=True)
            if done.returncode:
                raise StreamStudioError(f"apt-get download {package} failed: {done.stderr.strip()[-300:]}")
        for deb in sorted(Path(tmp).glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    missing = [e.path for e in entries(None, data_list) if not (root / e.path).is_file()]
    if missing:
        raise StreamStudioError(f"{len(missing)} listed photographs are not in the packages (first: {missing[0]})")
    return root


def _load(path: Path, short_side: int) -> np.ndarray:
    with Image.open(path) as im:
        im = im.convert("RGB")
        scale = short_side / min(im.size)
        size = (max(short_side, round(im.size[0] * scale)), max(short_side, round(im.size[1] * scale)))
        im = im.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
        return np.asarray(im, dtype=np.uint8).copy()  # (H, W, 3)


class PhotoSet:
    """The listed photographs of one split, loaded from `root` (the unpacked packages)."""

    def __init__(self, root: str | Path, split: str = "train", short_side: int = 384,
                 data_list: Path | None = None, progress: bool = False):
        self.root = Path(root)
        self.entries = entries(split, data_list)
        if not self.entries:
            raise StreamStudioError(f"{data_list or DATA_LIST} lists no {split!r} photographs")
        missing = [e.path for e in self.entries if not (self.root / e.path).is_file()]
        if missing:
            raise StreamStudioError(f"{len(missing)} of the training photographs are not under {self.root} "
                                    f"(first: {missing[0]}); fetch them with: streamstudio train-image "
                                    f"--fetch-photos {self.root}")
        key = hashlib.sha256(f"{short_side}|{split}|".encode() + "\n".join(e.path for e in self.entries).encode())
        cache = self.root / f".streamstudio-photos-{key.hexdigest()[:16]}.npz"
        if cache.is_file():
            with np.load(cache) as data:
                self.images = [data[f"i{k}"] for k in range(len(self.entries))]
        else:
            self.images = [_load(self.root / e.path, short_side)
                           for e in tqdm(self.entries, desc="loading photographs", disable=not progress)]
            tmp = cache.with_suffix(".tmp.npz")
            np.savez(tmp, **{f"i{k}": im for k, im in enumerate(self.images)})
            tmp.replace(cache)
        self.short_side = short_side

    def __len__(self) -> int:
        return len(self.images)

    def crops(self, seed: int, batch: int, size: int) -> torch.Tensor:
        """(batch, 3, size, size) crops in [0, 1], a pure function of the seed."""
        gen = torch.Generator().manual_seed(seed)
        out = torch.empty(batch, 3, size, size)
        for b in range(batch):
            img = self.images[int(torch.randint(len(self.images), (1,), generator=gen))]
            h, w = img.shape[:2]
            top = min(h, w)
            side = int(round(size * (top / size) ** float(torch.rand((), generator=gen)))) if top > size else top
            y0 = int(torch.randint(h - side + 1, (1,), generator=gen))
            x0 = int(torch.randint(w - side + 1, (1,), generator=gen))
            crop = torch.from_numpy(img[y0:y0 + side, x0:x0 + side]).permute(2, 0, 1).float()[None] / 255
            if side != size:
                crop = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
            crop = crop[0]
            if float(torch.rand((), generator=gen)) < 0.5:
                crop = crop.flip(-1)
            out[b] = _jitter(gen, crop)
        return out


def _jitter(gen: torch.Generator, img: torch.Tensor) -> torch.Tensor:
    """Mild brightness, contrast and saturation changes (no hue turns: photographs keep their colours)."""
    def u(lo, hi):
        return lo + (hi - lo) * float(torch.rand((), generator=gen))

    y = (img * torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)).sum(0, keepdim=True)
    img = y + (img - y) * u(0.7, 1.25)
    img = (img - 0.5) * u(0.8, 1.2) + 0.5 + u(-0.08, 0.08)
    return img.clamp(0, 1)


HELD_OUT = (("astronaut", "astronaut.png"), ("coffee", "coffee.png"), ("cat", "chelsea.png"),
            ("rocket", "rocket.jpg"), ("motorcycle", "motorcycle_left.png"))
# scikit-image's other bundled photographs, measured once on the shipped model and never used to
# choose anything: grey ones (camera, coins, moon, a clock), textures (brick, grass, gravel),
# a horse's silhouette, telescope and microscope images
MORE_HELD_OUT = (("camera", "camera.png"), ("coins", "coins.png"), ("moon", "moon.png"),
                 ("clock", "clock_motion.png"), ("brick", "brick.png"), ("grass", "grass.png"),
                 ("gravel", "gravel.png"), ("horse", "horse.png"), ("hubble", "hubble_deep_field.jpg"),
                 ("retina", "retina.jpg"), ("ihc", "ihc.png"))


def held_out(size: int = 256, more: bool = False) -> dict[str, np.ndarray]:
    """The judging photographs nobody here trained or tuned on: scikit-image's bundled
    astronaut, coffee, chelsea (a cat), rocket and motorcycle (left view), or with more=True its
    other bundled pictures (MORE_HELD_OUT), each centre-cropped to a square and resized to size x
    size (uint8 HxWx3; grey ones as RGB). Needs scikit-image installed (the test extra has it);
    the files are read with PIL, not through scikit-image's readers."""
    try:
        import skimage.data
    except ImportError as e:  # pragma: no cover - the test extra installs it
        raise StreamStudioError("the held-out photographs are scikit-image's: pip install scikit-image") from e
    folder = Path(skimage.data.__file__).parent
    out = {}
    for name, file in MORE_HELD_OUT if more else HELD_OUT:
        with Image.open(folder / file) as im:
            im = im.convert("RGB")
            side = min(im.size)
            left, top = (im.size[0] - side) // 2, (im.size[1] - side) // 2
            im = im.crop((left, top, left + side, top + side)).resize((size, size), Image.Resampling.LANCZOS)
            out[name] = np.asarray(im, dtype=np.uint8).copy()
    return out
