"""The training photographs (models/image/photo_data.py): the shipped list, loading a photo
set from unpacked packages, seeded crops, the cache, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from streamstudio.errors import StreamStudioError
from streamstudio.models.image import photo_data


def test_the_shipped_list_names_packages_licences_and_a_tune_split():
    every = photo_data.entries()
    assert len(every) >= 60
    assert {e.split for e in every} == {"train", "tune"} and len(photo_data.entries("tune")) >= 3
    assert all(e.path.startswith("usr/share/") and e.package and e.licence for e in every)
    assert len({e.path for e in every}) == len(every)
    assert "mate-backgrounds" in photo_data.packages()


def _photo_root(tmp_path, sizes=((300, 200), (180, 260), (400, 400))):
    root = tmp_path / "root"
    lines = ["# test list"]
    for k, (w, h) in enumerate(sizes):
        path = f"usr/share/backgrounds/p{k}.png"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(k)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / path)
        lines.append(f"{path}\tpkg{k}\tGPL-2+\t{'tune' if k == 2 else 'train'}")
    data_list = tmp_path / "photos.tsv"
    data_list.write_text("\n".join(lines) + "\n")
    return root, data_list


def test_photo_set_loads_resizes_and_cuts_seeded_crops(tmp_path):
    root, data_list = _photo_root(tmp_path)
    photos = photo_data.PhotoSet(root, "train", short_side=96, data_list=data_list)
    assert len(photos) == 2 and [min(i.shape[:2]) for i in photos.images] == [96, 96]
    assert photos.images[0].shape[:2] == (96, 144)  # the aspect kept: 300x200 -> 144x96
    a, b = photos.crops(7, 5, 48), photos.crops(7, 5, 48)
    assert a.shape == (5, 3, 48, 48) and torch.equal(a, b)
    assert 0 <= float(a.min()) and float(a.max()) <= 1
    assert not torch.equal(a, photos.crops(8, 5, 48))
    assert len(list(root.glob(".streamstudio-photos-*.npz"))) == 1  # the cache, used by the next load
    again = photo_data.PhotoSet(root, "train", short_side=96, data_list=data_list)
    assert all(np.array_equal(x, y) for x, y in zip(photos.images, again.images))
    assert len(photo_data.PhotoSet(root, "tune", short_side=96, data_list=data_list)) == 1


def test_missing_photographs_say_how_to_fetch_them(tmp_path):
    root, data_list = _photo_root(tmp_path)
    (root / "usr/share/backgrounds/p1.png").unlink()
    with pytest.raises(StreamStudioError, match="--fetch-photos"):
        photo_data.PhotoSet(root, "train", data_list=data_list)
    bad = tmp_path / "bad.tsv"
    bad.write_text("usr/share/x.png\tpkg\tGPL\tvalidation\n")
    with pytest.raises(ValueError, match="split"):
        photo_data.entries(data_list=bad)


def test_fetch_without_apt_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(photo_data.shutil, "which", lambda name: None)
    with pytest.raises(StreamStudioError, match="apt-get"):
        photo_data.fetch(tmp_path / "photos")


def test_held_out_photographs_are_scikit_images():
    held = photo_data.held_out(64)
    assert set(held) == {"astronaut", "coffee", "cat", "rocket", "motorcycle"}
    assert all(img.shape == (64, 64, 3) and img.dtype == np.uint8 for img in held.values())
    assert len({img.tobytes() for img in held.values()}) == 5


def test_more_held_out_pictures_are_scikit_images_others():
    more = photo_data.held_out(32, more=True)
    assert set(more) == {name for name, _ in photo_data.MORE_HELD_OUT} and len(more) == 11
    assert all(img.shape == (32, 32, 3) and img.dtype == np.uint8 for img in more.values())
    camera = more["camera"].astype(int)  # a grey photograph comes as three equal channels
    assert (camera[..., 0] == camera[..., 1]).all() and camera.std() > 20
    files = {file for _, file in photo_data.HELD_OUT}
    assert not files & {file for _, file in photo_data.MORE_HELD_OUT}
