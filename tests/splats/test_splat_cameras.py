"""Orthographic and equidistant-fisheye cameras: the projection and its Jacobian against the maps
written out here (the fisheye Jacobian by finite differences of r = f theta), a Gaussian at the
expected pixel, and every implementation (reference, fast, C++) agreeing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers import random_gaussians
from streamstudio.app.cli import main
from streamstudio.errors import StreamStudioError
from streamstudio.kernels import splat_cpu
from streamstudio.kernels.splat import rasterize_gaussians
from streamstudio.kernels.splat_reference import project_gaussians, quat_scale_to_covar
from streamstudio.pipelines.splats.splat_render import Camera, SceneFit, SplatRenderConfig, fitted_camera

FX, FY, CX, CY, W, H = 40.0, 44.0, 33.0, 29.0, 64, 56


def equidistant(p: np.ndarray) -> np.ndarray:
    """The equidistant fisheye map of a camera-space point: the angle from the axis theta, the
    pixel at radius f theta in the point's azimuth."""
    x, y, z = p
    r = math.hypot(x, y)
    theta = math.atan2(r, z)
    return np.array([FX * theta * x / r + CX, FY * theta * y / r + CY])


def orthographic(p: np.ndarray) -> np.ndarray:
    return np.array([FX * p[0] + CX, FY * p[1] + CY])


def numeric_jacobian(fn, p: np.ndarray, h: float = 1e-6) -> np.ndarray:
    return np.stack([(fn(p + h * e) - fn(p - h * e)) / (2 * h) for e in np.eye(3)], 1)  # (2, 3)


@pytest.mark.parametrize("model, fn", [("ortho", orthographic), ("fisheye", equidistant)])
def test_projection_and_covariance_follow_the_map(model, fn):
    means, quats, scales, opac, _ = random_gaussians(40, seed=3, spread=1.5, log_scale=-1.5)
    covars = quat_scale_to_covar(quats, scales)
    view = torch.eye(4, dtype=torch.float64)
    view[:3, :3] = torch.tensor([[0.96, 0.0, 0.28], [0.0, 1.0, 0.0], [-0.28, 0.0, 0.96]], dtype=torch.float64)
    view[:3, 3] = torch.tensor([0.2, -0.1, 0.5], dtype=torch.float64)
    means2d, _, depths, _, cov2d = project_gaussians(means, covars, opac, view, FX, FY, CX, CY, W, H,
                                                     camera_model=model)
    rot = view[:3, :3].numpy()
    checked = 0
    for i in range(len(means)):
        p = rot @ means[i].numpy() + view[:3, 3].numpy()
        assert depths[i] == pytest.approx(p[2])
        if p[2] <= 0.01:  # culled (behind the near plane)
            continue
        checked += 1
        np.testing.assert_allclose(means2d[i].numpy(), fn(p), rtol=0, atol=1e-5)
        jac = numeric_jacobian(fn, p)
        want = jac @ rot @ covars[i].numpy() @ rot.T @ jac.T + 0.3 * np.eye(2)
        got = np.array([[cov2d[i, 0], cov2d[i, 1]], [cov2d[i, 1], cov2d[i, 2]]])
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert checked > 30


def dot(pos, scale=0.02, dtype=torch.float64):
    return dict(means=torch.tensor([pos], dtype=dtype), quats=torch.tensor([[1.0, 0, 0, 0]], dtype=dtype),
                scales=torch.full((1, 3), scale, dtype=dtype), opacities=torch.tensor([0.9], dtype=dtype),
                colors=torch.tensor([[1.0, 1.0, 1.0]], dtype=dtype))


def centroid(img: torch.Tensor) -> tuple[float, float]:
    w = img[..., 0].double()
    v, u = torch.meshgrid(torch.arange(img.shape[0]), torch.arange(img.shape[1]), indexing="ij")
    return float((w * (u + 0.5)).sum() / w.sum()), float((w * (v + 0.5)).sum() / w.sum())


@pytest.mark.parametrize("impl", ["reference", "fast", "cpp"])
@pytest.mark.parametrize("model, fn, point", [
    ("ortho", orthographic, (0.4, -0.3, 7.0)),
    ("fisheye", equidistant, (-0.9, 0.5, 1.0)),  # 46 degrees off the axis: a pinhole of that f puts it at u = -3
])
def test_a_gaussian_lands_where_the_map_says(impl, model, fn, point):
    out = rasterize_gaussians(**dot(point), viewmat=torch.eye(4, dtype=torch.float64),
                              intrinsics=(FX, FY, CX, CY), width=W, height=H, impl=impl, camera_model=model)
    u, v = centroid(out.rgb)
    want = fn(np.array(point))
    assert abs(u - want[0]) < 0.05 and abs(v - want[1]) < 0.05, ((u, v), want)


def test_ortho_has_no_perspective():
    """Two Gaussians at the same x, y and different depths fall on the same pixel, at the same size."""
    near = rasterize_gaussians(**dot((0.3, 0.2, 2.0), 0.05), viewmat=torch.eye(4, dtype=torch.float64),
                               intrinsics=(FX, FY, CX, CY), width=W, height=H, camera_model="ortho")
    far = rasterize_gaussians(**dot((0.3, 0.2, 20.0), 0.05), viewmat=torch.eye(4, dtype=torch.float64),
                              intrinsics=(FX, FY, CX, CY), width=W, height=H, camera_model="ortho")
    torch.testing.assert_close(near.rgb, far.rgb, atol=1e-6, rtol=0)


@pytest.mark.parametrize("model", ["ortho", "fisheye"])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_cpp_and_fast_match_the_reference(model, dtype, tol):
    if splat_cpu.load() is None:
        pytest.skip(f"C++ renderer not built: {splat_cpu.failure_reason()}")
    means, quats, scales, opac, colors = random_gaussians(300, seed=7, spread=1.2, dtype=dtype, sh_k=9)
    args = dict(means=means, quats=quats, scales=scales, opacities=opac, colors=colors,
                viewmat=torch.eye(4, dtype=dtype), intrinsics=(FX if model == "fisheye" else 30.0, FY,
                                                              CX, CY), width=W, height=H,
                background=torch.tensor([0.1, 0.2, 0.3]), camera_model=model)
    ref = rasterize_gaussians(**args, impl="reference")
    assert float(ref.alpha.max()) > 0.5
    for impl, t in (("cpp", tol), ("fast", 1e-4)):
        got = rasterize_gaussians(**args, impl=impl)
        assert got.n_visible == ref.n_visible
        for name in ("rgb", "depth", "alpha"):
            diff = float((getattr(got, name) - getattr(ref, name)).abs().max())
            assert diff < t, f"{impl} {name}: {diff}"


def test_camera_intrinsics_per_model():
    view = torch.eye(4)
    assert Camera(view, 64, 48, 90.0).intrinsics[0] == pytest.approx(24.0)  # H/2 / tan(45)
    assert Camera(view, 64, 48, 90.0, model="fisheye").intrinsics[0] == pytest.approx(24 / (math.pi / 4))
    assert Camera(view, 64, 48, 90.0, model="ortho", ortho_height=4.0).intrinsics[:2] == (12.0, 12.0)
    fit = SceneFit(torch.zeros(3), 1.0)
    persp = fitted_camera(fit, SplatRenderConfig(width=64, height=48))
    ortho = fitted_camera(fit, SplatRenderConfig(width=64, height=48, camera="ortho"))
    # ortho spans at the scene centre what the perspective view spans there
    depth = float(persp.viewmat[2, 3])
    assert ortho.model == "ortho" and ortho.ortho_height == pytest.approx(2 * depth * math.tan(math.radians(25)))
    assert fitted_camera(fit, SplatRenderConfig(camera="ortho", ortho_height=3.0)).ortho_height == 3.0


def test_config_checks_the_camera():
    SplatRenderConfig(camera="fisheye", fov_y_deg=180).check()
    with pytest.raises(StreamStudioError, match="camera"):
        SplatRenderConfig(camera="panorama").check()
    with pytest.raises(StreamStudioError, match="field of view"):
        SplatRenderConfig(camera="perspective", fov_y_deg=175).check()
    with pytest.raises(StreamStudioError, match="orthographic"):
        SplatRenderConfig(camera="ortho", ortho_height=-1).check()


def test_cli_camera_models(tmp_path):
    frames = {}
    for model in ("perspective", "ortho", "fisheye"):
        out = tmp_path / model
        assert main(["splat", "sample", "--frames", "1", "--size", "48x32", "--camera", model,
                     *(["--fov", "150"] if model == "fisheye" else []), "--output", str(out)]) == 0
        from PIL import Image
        frames[model] = np.asarray(Image.open(next(out.glob("*.png"))))
        assert frames[model].max() > 50
    assert not np.array_equal(frames["perspective"], frames["ortho"])
    assert not np.array_equal(frames["perspective"], frames["fisheye"])
