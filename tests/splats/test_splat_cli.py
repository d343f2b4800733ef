"""`streamstudio splat` end to end on tiny renders, and the camera paths behind it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import recorded_runners

from streamstudio.app.cli import main
from streamstudio.errors import StreamStudioError
from streamstudio.models.splats.gaussians import GaussianScene
from streamstudio.pipelines.splats.splat_render import (Camera, SceneFit, SplatRenderConfig, camera_path, fitted_camera,
                                                        render_frame)


ASSETS = Path(__file__).resolve().parents[2] / "streamstudio" / "assets"


def one_gaussian(pos, rgb=(1.0, 0.0, 0.0)) -> GaussianScene:
    return GaussianScene(means=torch.tensor([pos], dtype=torch.float32), quats=torch.tensor([[1.0, 0, 0, 0]]),
                         log_scales=torch.full((1, 3), math.log(0.2)), opacity_logits=torch.tensor([3.0]),
                         sh=((torch.tensor([[rgb]]) - 0.5) / 0.28209479177387814))


def test_look_at_puts_target_at_centre_and_up_at_the_top():
    cfg = SplatRenderConfig(width=32, height=32)
    cam = Camera.look_at((0.0, -1.0, -4.0), (0.0, -1.0, 0.0), 32, 32)
    frame = render_frame(one_gaussian((0.0, -1.0, 0.0)), cam, cfg)
    ys, xs = np.nonzero(frame[..., 0] > 200)
    assert abs(xs.mean() - 15.5) < 0.5 and abs(ys.mean() - 15.5) < 0.5
    frame = render_frame(one_gaussian((0.0, -1.5, 0.0)), cam, cfg)  # world up is -y
    assert np.nonzero(frame[..., 0] > 200)[0].mean() < 12


@pytest.mark.parametrize("kind", ["orbit", "turntable", "fly"])
def test_paths_keep_the_scene_in_view(kind):
    fit = SceneFit(torch.tensor([1.0, 2.0, 3.0]), 2.0)
    cfg = SplatRenderConfig(width=48, height=32)
    cams = camera_path(kind, fit, cfg, 6)
    assert len(cams) == 6
    for cam in cams:
        p = cam.viewmat[:3, :3] @ fit.center + cam.viewmat[:3, 3]
        fx, fy, cx, cy = cam.intrinsics
        if kind == "fly":  # flies through the scene, the centre ahead of it
            assert p[2] > 0 and float((cam.position - fit.center).norm()) < fit.radius
        else:
            assert p[2] > 0 and 0 <= fx * p[0] / p[2] + cx <= 48 and 0 <= fy * p[1] / p[2] + cy <= 32
    positions = torch.stack([c.position for c in cams])
    assert float((positions[1:] - positions[:-1]).norm(dim=1).min()) > 1e-3  # the camera moves


def test_fitted_camera_sees_the_whole_bounding_sphere():
    fit = SceneFit(torch.zeros(3), 1.0)
    cfg = SplatRenderConfig(width=64, height=32, fov_y_deg=40)
    cam = fitted_camera(fit, cfg, azimuth_deg=30, elevation_deg=10)
    dist = float(cam.position.norm())
    half_x = math.atan(math.tan(math.radians(20)) * 2)
    assert dist * math.sin(math.radians(20)) >= 1.0 and dist < 4.0 / math.sin(math.radians(20))
    assert half_x > math.radians(20)


def test_cli_writes_an_h264_video(tmp_path, monkeypatch):
    runners = recorded_runners(monkeypatch)
    out = tmp_path / "orbit.mp4"
    assert main(["splat", "sample", "--frames", "3", "--size", "48x32", "--output", str(out)]) == 0
    metrics = runners[-1].metrics()  # the renders went through the one frame loop
    assert (metrics.frames_in, metrics.frames_processed, metrics.frames_out) == (3, 3, 3)
    av = pytest.importorskip("av", reason="PyAV is not installed (the GPU image has none)")

    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 3 and frames[0].shape == (32, 48, 3)
    assert frames[0].max() > 100 and frames[0].min() < 30  # the scene and the black background


def test_cli_writes_4d_frames_to_a_folder_that_change_with_time(tmp_path):
    out = tmp_path / "frames"
    assert main(["splat", "sample4d", "--path", "turntable", "--frames", "2", "--size", "40x40",
                 "--time-range", "0.1", "0.4", "--output", str(out), "--background", "#ffffff"]) == 0
    from PIL import Image

    files = sorted(out.glob("*.png"))
    assert [f.name for f in files] == ["frame_00000.png", "frame_00001.png"]
    a, b = (np.asarray(Image.open(f)) for f in files)
    assert a.shape == (40, 40, 3) and (a[0, 0] == 255).all() and np.abs(a.astype(int) - b).max() > 50


@pytest.mark.parametrize("argv, message, rc", [
    (["--size", "12"], "--size", 1), (["--background", "red"], "--background", 1),
    (["--frames", "0"], "argument --frames: must be in [1, 10000000], got 0", 2),  # a usage error, at parse time
])
def test_cli_bad_settings_fail_clearly(tmp_path, capsys, argv, message, rc):
    assert main(["splat", "sample", "--output", str(tmp_path / "x.mp4"), *argv]) == rc
    assert message in capsys.readouterr().err


def test_cli_bad_scene_file_fails_clearly(tmp_path, capsys):
    bad = tmp_path / "bad.ply"
    bad.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 5\nproperty float x\nend_header\n")
    assert main(["splat", str(bad), "--output", str(tmp_path / "x.mp4")]) == 1
    assert "bad.ply" in capsys.readouterr().err


@pytest.mark.slow  # loads diffusers and the tiny model: ~25 s on the shared CI machine
def test_cli_stylizes_through_the_image_pipeline(tmp_path):
    pytest.importorskip("streamstudio.pipelines.image.stream_diffusion")
    out = tmp_path / "styled"
    assert main(["splat", "sample", "--frames", "2", "--size", "32x32", "--output", str(out), "--prompt", "paint",
                 "--model", "tiny", "--device", "cpu", "--side-by-side"]) == 0
    from PIL import Image

    frames = [np.asarray(Image.open(f)) for f in sorted(out.glob("*.png"))]
    assert len(frames) == 2 and frames[0].shape == (32, 64, 3)
    assert np.abs(frames[0][:, :32].astype(int) - frames[0][:, 32:]).mean() > 5  # stylised differs from render


def test_render_config_rejects_bad_values():
    with pytest.raises(StreamStudioError):
        SplatRenderConfig(mode="normals").check()
    with pytest.raises(StreamStudioError):
        SplatRenderConfig(width=2).check()


# ---------------------------------------------------------------------------------------------- splat convert


def test_cli_convert_between_ply_and_compressed_ply(tmp_path, capsys):
    from streamstudio.models.splats.gaussians import load_scene

    packed, plain, again = tmp_path / "s.compressed.ply", tmp_path / "out" / "s.ply", tmp_path / "t.ply"
    assert main(["splat", "convert", "sample", str(packed)]) == 0
    assert "SuperSplat's compressed .ply" in capsys.readouterr().out
    assert packed.read_bytes().startswith(b"ply\n") and b"element chunk" in packed.read_bytes()[:300]
    assert main(["splat", "convert", str(packed), str(plain)]) == 0  # creates the folder
    assert b"element chunk" not in plain.read_bytes()[:600] and "3DGS .ply" in capsys.readouterr().out
    assert main(["splat", "convert", str(plain), str(again), "--compressed"]) == 0
    assert b"element chunk" in again.read_bytes()[:300]
    sample = load_scene(ASSETS / "sample_scene.ply")
    a, b = load_scene(plain), load_scene(again)
    assert len(a) == len(b) == len(sample) and a.sh_degree == sample.sh_degree
    # the compressed scene renders like the original
    cfg = SplatRenderConfig(width=48, height=48, impl="fast")
    cam = fitted_camera(SceneFit.of(sample), cfg, 30.0, 20.0)
    want, got = render_frame(sample, cam, cfg), render_frame(b, cam, cfg)
    assert np.abs(want.astype(int) - got).mean() < 1.5 and want.mean() > 5


def test_cli_convert_4d_keeps_time_in_ply_and_refuses_compressed(tmp_path, capsys):
    from streamstudio.models.splats.gaussians import load_scene

    assert main(["splat", "convert", "sample4d", str(tmp_path / "m.ply")]) == 0
    assert load_scene(tmp_path / "m.ply").is_4d
    assert main(["splat", "convert", "sample4d", str(tmp_path / "m.compressed.ply")]) == 1
    assert "3D scenes only" in capsys.readouterr().err and not (tmp_path / "m.compressed.ply").exists()


@pytest.mark.parametrize("argv, message", [
    (["convert", "sample", "x.sog"], "OUT must end in .ply"),
    (["convert", "sample", "x.splat", "--compressed"], "does not end in .ply"),
    (["convert", "sample"], "usage: streamstudio splat convert IN OUT"),
    (["convert", "missing.ply", "x.ply"], "no such file"),
    (["sample", "extra.ply", "--output", "x.mp4"], "unexpected arguments"),
    (["sample"], "--output is required"),
])
def test_cli_convert_bad_arguments_fail_clearly(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["splat", *argv]) == 1
    assert message in capsys.readouterr().err


def test_cli_convert_to_splat_warns_what_it_drops(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        assert main(["splat", "convert", "sample", str(tmp_path / "s.splat")]) == 0
    assert (tmp_path / "s.splat").stat().st_size % 32 == 0 and "degree-0 colour" in caplog.text


def test_cli_antialiased_flag_changes_the_render(tmp_path):
    from PIL import Image

    frames = {}
    for flag in ("--antialiased", "--no-antialiased"):
        out = tmp_path / flag.strip("-")
        assert main(["splat", "sample", "--frames", "1", "--size", "40x40", "--output", str(out), flag]) == 0
        frames[flag] = np.asarray(Image.open(next(out.glob("*.png")))).astype(int)
    default = tmp_path / "default"
    assert main(["splat", "sample", "--frames", "1", "--size", "40x40", "--output", str(default)]) == 0
    plain = np.asarray(Image.open(next(default.glob("*.png")))).astype(int)
    assert np.array_equal(plain, frames["--no-antialiased"])  # the sample's file does not say antialiased
    assert np.abs(frames["--antialiased"] - plain).max() > 3


def test_cli_prints_a_header_and_a_progress_bar_before_and_while_rendering(tmp_path, capsys):
    """It printed nothing for up to 47 s: the scene, its Gaussians, size, frames, device and
    rasteriser come first, then render's tqdm bar."""
    assert main(["splat", "sample", "--frames", "3", "--size", "32x24", "--output", str(tmp_path / "f")]) == 0
    err = capsys.readouterr().err
    header = err.splitlines()[0]
    assert header.startswith("splat: sample (5000 Gaussians") and "3 frame(s) at 32x24" in header, err
    assert "device cpu" in header and "renderer: " in err
    assert "3/3" in err and "frame" in err  # the progress bar's last state
