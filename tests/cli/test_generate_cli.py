"""`streamstudio generate` end to end with the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import recorded_runners
from PIL import Image

from streamstudio.app.cli import main


def test_txt2img(tmp_path, capsys, monkeypatch):
    runners = recorded_runners(monkeypatch)
    out = tmp_path / "out"
    rc = main(["generate", "--model", "tiny", "--prompt", "a cat", "--output", str(out),
               "--num-images", "3", "--steps", "2", "--width", "48", "--height", "32"])
    assert rc == 0
    files = sorted(out.glob("*.png"))
    assert len(files) == 3
    images = [np.asarray(Image.open(f)) for f in files]
    assert all(im.shape == (32, 48, 3) for im in images)
    assert not np.array_equal(images[0], images[1])
    assert "frame latency 1" in capsys.readouterr().out
    metrics = runners[-1].metrics()  # the images went through the one frame loop
    assert (metrics.frames_in, metrics.frames_processed, metrics.frames_out) == (3, 3, 3)


def test_img2img_folder_in_name_order(tmp_path, monkeypatch):
    runners = recorded_runners(monkeypatch)
    src = tmp_path / "in"
    src.mkdir()
    rng = np.random.default_rng(0)
    for name in ("b.png", "a.jpg", "c.png"):
        Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(src / name)
    Image.fromarray(rng.integers(0, 256, (20, 20), dtype=np.uint8)).save(src / "d.png")  # grayscale
    (src / "notes.txt").write_text("not an image")
    out = tmp_path / "out"
    rc = main(["generate", "--model", "tiny", "--prompt", "oil painting", "--input", str(src),
               "--output", str(out), "--steps", "3", "--width", "32", "--height", "32"])
    assert rc == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["a.png", "b.png", "c.png", "d.png"]
    assert (runners[-1].metrics().frames_in, runners[-1].metrics().frames_out) == (4, 4)  # one stream, one loop


def test_img2img_keeps_the_pictures_aspect(tmp_path, monkeypatch):
    """A 600x400 photo was squashed to the model's square; now the output takes the first
    picture's aspect with the model's side (tiny: 64x40, as render sizes a 3:2 clip), and a
    picture of another shape is cropped to it, not stretched (--fit pad: bars instead)."""
    runners = recorded_runners(monkeypatch)
    src = tmp_path / "in"
    src.mkdir()
    Image.new("RGB", (600, 400), (200, 30, 30)).save(src / "a_photo.png")
    Image.new("RGB", (300, 300), (30, 30, 200)).save(src / "b_square.png")
    out = tmp_path / "out"
    assert main(["generate", "--model", "tiny", "--input", str(src), "--output", str(out), "--steps", "1"]) == 0
    sizes = {p.name: Image.open(p).size for p in out.glob("*.png")}
    assert sizes == {"a_photo.png": (64, 40), "b_square.png": (64, 40)}
    fitted = runners[-1].processor.fit_frame(np.zeros((300, 300, 3), np.uint8))  # cropped to 64:40
    assert fitted.shape[1] == 300 and abs(fitted.shape[1] / fitted.shape[0] - 64 / 40) < 0.02


def test_clear_errors(tmp_path, capsys):
    assert main(["generate", "--model", "tiny", "--input", str(tmp_path / "missing"), "--output", str(tmp_path)]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny", "--output", str(tmp_path), "--width", "30"]) == 2  # a usage error
    assert "multiple of 8" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.png").write_text("not a png")
    assert main(["generate", "--model", "tiny", "--input", str(bad), "--output", str(tmp_path / "o")]) == 1
    assert "not a readable image" in capsys.readouterr().err
    assert main(["generate", "--model", str(tmp_path / "nowhere.safetensors"), "--output", str(tmp_path)]) == 1
    assert "hf download" in capsys.readouterr().err


@pytest.mark.parametrize("acceleration,serving,cfg,want_max", [
    ("tensorrt", False, "full", 4),  # one stream, full CFG, 2 steps: 2 * N * k = 4 rows
    ("tensorrt", False, "self", 2),  # N * k
    ("compile", False, "initialize", 3),  # N * k + k
    ("tensorrt", True, "self", 16),  # the web app: streams batched up to --max-batch-rows
    ("compile", True, "self", None),  # the web app compiles behind the executor: warmed up there
])
def test_accelerated_networks_get_the_batches_they_will_be_sent(monkeypatch, acceleration, serving, cfg, want_max):
    from streamstudio.app.cli import build_parser
    from streamstudio.app.cli.requests import image_request
    from streamstudio.app import streams
    from streamstudio.models.image import acceleration as acc

    seen = []
    monkeypatch.setattr(acc, "apply_acceleration", lambda comps, mode, plan=None: seen.append((mode, plan)) or comps)
    command = "serve" if serving else "generate"
    argv = [command, "--model", "tiny", "--steps", "2", "--cfg", cfg, "--guidance", "1.5",
            "--acceleration", acceleration] + ([] if serving else ["--output", "unused"])
    pipe = streams.build_pipeline(image_request(build_parser(argv).parse_args(argv)), "img2img", serving=serving)
    (mode, plan), = seen
    assert mode == acceleration and pipe.config.cfg_type == cfg
    if want_max is None:
        assert plan is None
        return
    assert max(plan.sizes["unet"]) == want_max and (plan.height, plan.width) == (64, 64)
