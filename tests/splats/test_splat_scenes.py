"""Gaussian scene files (.ply, .splat, the 4D .ply), bad files and 4D time slicing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.splats.gaussians import (SH_C0, GaussianScene, load_scene, save_scene, slice_4d)


def make_scene(n: int = 50, degree: int = 3, seed: int = 0, four_d: bool = False) -> GaussianScene:
    g = torch.Generator().manual_seed(seed)
    scene = GaussianScene(means=torch.randn(n, 3, generator=g), quats=torch.randn(n, 4, generator=g),
                          log_scales=torch.randn(n, 3, generator=g) - 3,
                          opacity_logits=torch.randn(n, generator=g),
                          sh=torch.randn(n, (degree + 1) ** 2, 3, generator=g))
    if four_d:
        scene.t_centers = torch.rand(n, generator=g)
        scene.t_log_scales = torch.randn(n, generator=g) * 0.3 - 2
        scene.quats_r = torch.randn(n, 4, generator=g)
    return scene


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_ply_round_trip_is_exact(tmp_path, degree):
    scene = make_scene(degree=degree)
    save_scene(scene, tmp_path / "s.ply")
    back = load_scene(tmp_path / "s.ply")
    assert back.sh_degree == degree and not back.is_4d
    for name in ("means", "quats", "log_scales", "opacity_logits", "sh"):
        assert torch.equal(getattr(back, name), getattr(scene, name)), name


def test_ply_layout_is_62_floats_channel_major(tmp_path):
    scene = make_scene(n=3)
    save_scene(scene, tmp_path / "s.ply")
    raw = (tmp_path / "s.ply").read_bytes()
    header, body = raw.split(b"end_header\n")
    names = [line.split()[-1].decode() for line in header.splitlines() if line.startswith(b"property")]
    assert (len(names) == 62 and names[6:9] == ["f_dc_0", "f_dc_1", "f_dc_2"]
            and names[-4:] == [f"rot_{i}" for i in range(4)])
    rows = np.frombuffer(body, dtype="<f4").reshape(3, 62)
    # f_rest_j = channel j // 15, coefficient 1 + j % 15
    assert rows[1, 9 + 15 + 4] == scene.sh[1, 1 + 4, 1].item()
    assert rows[2, 9 + 0] == scene.sh[2, 1, 0].item()


def test_4d_ply_round_trip_is_exact(tmp_path):
    scene = make_scene(degree=1, four_d=True)
    save_scene(scene, tmp_path / "s4.ply")
    back = load_scene(tmp_path / "s4.ply")
    assert back.is_4d
    for name in ("means", "quats", "t_centers", "t_log_scales", "quats_r", "sh"):
        assert torch.equal(getattr(back, name), getattr(scene, name)), name


def test_splat_round_trip_within_quantisation(tmp_path):
    scene = make_scene(n=200, degree=0)
    scene.sh = scene.sh.clamp(-1.7, 1.7)  # colours inside [0, 1] so uint8 can hold them
    save_scene(scene, tmp_path / "s.splat")
    assert (tmp_path / "s.splat").stat().st_size == 200 * 32
    back = load_scene(tmp_path / "s.splat")
    assert torch.equal(back.means, scene.means)
    assert torch.allclose(back.log_scales, scene.log_scales, atol=1e-5)
    rgb, rgb_back = 0.5 + SH_C0 * scene.sh[:, 0], 0.5 + SH_C0 * back.sh[:, 0]
    assert (rgb - rgb_back).abs().max() <= 0.5 / 255 + 1e-6
    o, o_back = torch.sigmoid(scene.opacity_logits), torch.sigmoid(back.opacity_logits)
    assert (o - o_back).abs().max() <= 0.5 / 255 + 1e-6
    q = torch.nn.functional.normalize(scene.quats, dim=-1)
    q_back = torch.nn.functional.normalize(back.quats, dim=-1)
    assert (q - q_back).abs().max() < 0.02  # 1/128 steps, renormalised


def write_ply(path, props: list[str], n: int, rows: np.ndarray | None = None, declared: int | None = None):
    header = ["ply", "format binary_little_endian 1.0", f"element vertex {declared or n}"]
    header += [f"property float {p}" for p in props] + ["end_header"]
    body = (rows if rows is not None else np.zeros((n, len(props)), np.float32)).astype("<f4").tobytes()
    path.write_bytes(("\n".join(header) + "\n").encode() + body)


PROPS = (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2", "opacity"]
         + [f"scale_{i}" for i in range(3)] + [f"rot_{i}" for i in range(4)])


def ok_rows(n):
    rows = np.zeros((n, len(PROPS)), np.float32)
    rows[:, PROPS.index("rot_0")] = 1
    return rows


def test_minimal_degree_zero_ply_loads(tmp_path):
    write_ply(tmp_path / "ok.ply", PROPS, 4, ok_rows(4))
    assert len(load_scene(tmp_path / "ok.ply")) == 4


@pytest.mark.parametrize("case, message", [
    ("truncated", "truncated"), ("missing", "missing PLY properties"), ("nan", "NaN or infinite"),
    ("inf", "NaN or infinite"), ("huge", "memory"), ("not_ply", "not a PLY"), ("ascii", "not supported"),
    ("rest", "f_rest"), ("splat_size", "multiple of 32"), ("suffix", "unknown scene format"),
    ("absent", "no such file"),
])
def test_bad_files_give_clear_errors(tmp_path, case, message):
    path = tmp_path / "bad.ply"
    if case == "truncated":
        write_ply(path, PROPS, 4, ok_rows(4)[:3], declared=4)
    elif case == "missing":
        write_ply(path, [p for p in PROPS if p != "opacity"], 4)
    elif case in ("nan", "inf"):
        rows = ok_rows(4)
        rows[2, 0] = np.nan if case == "nan" else np.inf
        write_ply(path, PROPS, 4, rows)
    elif case == "huge":
        write_ply(path, PROPS, 1, ok_rows(1), declared=10 ** 13)
    elif case == "not_ply":
        path.write_bytes(b"hello\nworld\n")
    elif case == "ascii":
        path.write_bytes(b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nend_header\n0\n")
    elif case == "rest":
        write_ply(path, PROPS + ["f_rest_0", "f_rest_1"], 2)
    elif case == "splat_size":
        path = tmp_path / "bad.splat"
        path.write_bytes(b"\0" * 33)
    elif case == "suffix":
        path = tmp_path / "bad.obj"
        path.write_bytes(b"v 0 0 0\n")
    else:
        path = tmp_path / "absent.ply"
    with pytest.raises(StreamStudioError, match=message):
        load_scene(path)


def test_max_gaussians_limit(tmp_path):
    write_ply(tmp_path / "ok.ply", PROPS, 4, ok_rows(4))
    with pytest.raises(StreamStudioError, match="limit"):
        load_scene(tmp_path / "ok.ply", max_gaussians=3)


def np_rot4(left_quat, right_quat):
    """4D rotation from left / right quaternions, written out independently (float64)."""
    a, b, c, d = left_quat / np.linalg.norm(left_quat)
    p, q, rr, s = right_quat / np.linalg.norm(right_quat)
    left = np.array([[a, -b, -c, -d], [b, a, -d, c], [c, d, a, -b], [d, -c, b, a]])
    right = np.array([[p, q, rr, s], [-q, p, -s, rr], [-rr, s, p, -q], [-s, -rr, q, p]])
    return left @ right


def test_4d_slicing_matches_the_conditional_gaussian_formula():
    scene = make_scene(n=30, degree=0, four_d=True, seed=5)
    scene.opacity_logits = torch.full((30,), 4.0)  # all kept near their time centre
    t = 0.4
    sliced = slice_4d(scene, t, min_weight=0.0)
    assert len(sliced) == 30 and sliced.covars is not None
    for i in range(30):
        rot = np_rot4(scene.quats[i].double().numpy(), scene.quats_r[i].double().numpy())
        assert np.allclose(rot @ rot.T, np.eye(4), atol=1e-6)
        s = np.exp(np.r_[scene.log_scales[i].double().numpy(), scene.t_log_scales[i].item()])
        cov = rot @ np.diag(s * s) @ rot.T
        mu = np.r_[scene.means[i].double().numpy(), scene.t_centers[i].item()]
        want_mean = mu[:3] + cov[:3, 3] / cov[3, 3] * (t - mu[3])
        want_cov = cov[:3, :3] - np.outer(cov[:3, 3], cov[3, :3]) / cov[3, 3]
        want_w = math.exp(-0.5 * (t - mu[3]) ** 2 / cov[3, 3])
        np.testing.assert_allclose(sliced.means[i].numpy(), want_mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(sliced.covars[i].numpy(), want_cov, rtol=1e-3, atol=1e-7)
        np.testing.assert_allclose(sliced.opacities()[i].item(), want_w / (1 + math.exp(-4.0)), rtol=1e-4)


def test_4d_slicing_culls_gaussians_far_in_time():
    scene = make_scene(n=2, degree=0, four_d=True)
    scene.t_centers = torch.tensor([0.0, 1.0])
    scene.t_log_scales = torch.full((2,), math.log(0.05))
    scene.opacity_logits = torch.zeros(2)
    scene.quats = scene.quats_r = torch.tensor([[1.0, 0, 0, 0]] * 2)  # no space-time mixing: var_t = 0.05^2
    sliced = slice_4d(scene, 0.02)
    assert len(sliced) == 1 and torch.allclose(sliced.opacity_scale, torch.tensor([math.exp(-0.5 * 0.16)]))


def test_sample_scenes_load():
    from streamstudio.assets.make_sample_scenes import SCENE_4D_FILE, SCENE_FILE
    static, dynamic = load_scene(SCENE_FILE), load_scene(SCENE_4D_FILE)
    assert 2000 <= len(static) <= 10000 and not static.is_4d
    assert dynamic.is_4d and dynamic.time_range[1] > dynamic.time_range[0]
    assert SCENE_FILE.stat().st_size < 1_100_000 and SCENE_4D_FILE.stat().st_size < 1_100_000
