"""The splat renderer: projection, rasterisation (reference and fast) against independent maths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from streamstudio.kernels import splat_fast, splat_reference
from streamstudio.kernels.splat import rasterize_gaussians
from streamstudio.kernels.splat_reference import eval_sh, project_gaussians, quat_scale_to_covar
from helpers import random_gaussians


def np_rotation(q):
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def np_project(mean, quat, scale, view, fx, fy, cx, cy, w, h):
    """Independent float64 EWA projection of one Gaussian: (mean2d, conic, depth)."""
    rot_g = np_rotation(quat)
    sigma = rot_g @ np.diag(scale ** 2) @ rot_g.T
    wr, tr = view[:3, :3], view[:3, 3]
    x, y, z = wr @ mean + tr
    lx, ly = 1.3 * (w / 2) / fx, 1.3 * (h / 2) / fy
    tx, ty = min(max(x / z, -lx), lx) * z, min(max(y / z, -ly), ly) * z
    jac = np.array([[fx / z, 0, -fx * tx / z ** 2], [0, fy / z, -fy * ty / z ** 2]])
    cov = jac @ wr @ sigma @ wr.T @ jac.T + 0.3 * np.eye(2)
    inv = np.linalg.inv(cov)
    return np.array([fx * x / z + cx, fy * y / z + cy]), np.array([inv[0, 0], inv[0, 1], inv[1, 1]]), z


def test_projection_matches_independent_float64():
    means, quats, scales, opac, _ = random_gaussians(40, seed=1)
    view = torch.eye(4, dtype=torch.float64)
    view[:3, :3] = torch.from_numpy(np_rotation(np.array([0.9, 0.1, -0.2, 0.3])))
    view[:3, 3] = torch.tensor([0.1, -0.2, 0.5])
    intr = (70.0, 80.0, 33.0, 21.0)
    covars = quat_scale_to_covar(quats, scales)
    m2, conics, depths, radii, _ = project_gaussians(means, covars, opac, view, *intr, 64, 40)
    checked = 0
    for i in range(40):
        mean2d, conic, z = np_project(means[i].numpy(), quats[i].numpy(), scales[i].numpy(), view.numpy(),
                                      *intr, 64, 40)
        if z <= 0.01:
            continue
        checked += 1
        np.testing.assert_allclose(m2[i].numpy(), mean2d, rtol=1e-10, atol=1e-9)
        np.testing.assert_allclose(conics[i].numpy(), conic, rtol=1e-9, atol=1e-12)
        assert abs(float(depths[i]) - z) < 1e-12
    assert checked > 20


def naive_render(m2, conics, opac, colors, depths, w, h, bg):
    """Every Gaussian at every pixel, float64, the 3DGS blending rules; (H, W, 3) and (H, W) alpha."""
    order = np.argsort(depths, kind="stable")
    rgb, alpha_img = np.zeros((h, w, 3)), np.zeros((h, w))
    for v in range(h):
        for u in range(w):
            t, c = 1.0, np.zeros(3)
            for i in order:
                if depths[i] <= 0.01:
                    continue
                dx, dy = u + 0.5 - m2[i, 0], v + 0.5 - m2[i, 1]
                power = -0.5 * (conics[i, 0] * dx * dx + conics[i, 2] * dy * dy) - conics[i, 1] * dx * dy
                a = min(0.99, opac[i] * math.exp(power))
                if power > 0 or a < 1 / 255:
                    continue
                if t * (1 - a) < 1e-4:
                    break
                c += a * t * colors[i]
                t *= 1 - a
            rgb[v, u], alpha_img[v, u] = c + t * bg, 1 - t
    return rgb, alpha_img


@pytest.fixture(scope="module")
def naive_case():
    """A small image with both saturated (T < 1e-4 stop) and transparent pixels, rendered naively."""
    w, h = 37, 21  # not a multiple of any tile size
    means, quats, scales, opac, colors = random_gaussians(100, seed=2, spread=0.5, log_scale=-2.0)
    opac[:40] = 0.999
    intr = (40.0, 40.0, w / 2, h / 2)
    proj = project_gaussians(means, quat_scale_to_covar(quats, scales), opac, torch.eye(4, dtype=torch.float64),
                             *intr, w, h)
    m2, conics, depths, radii, _ = proj
    bg = np.array([0.2, 0.3, 0.4])
    want = naive_render(m2.numpy(), conics.numpy(), opac.numpy(), colors.numpy(), depths.numpy(), w, h, bg)
    assert want[1].max() > 0.999 and want[1].min() < 0.5  # the image has both regimes
    return (m2, conics, opac, colors, depths, radii, w, h, bg), want


@pytest.mark.parametrize("impl, tile", [("reference", None), ("fast", 4), ("fast", 8), ("fast", 16)])
def test_rasterizer_matches_naive_per_pixel(naive_case, impl, tile):
    (m2, conics, opac, colors, depths, radii, w, h, bg), (want_rgb, want_alpha) = naive_case
    if impl == "reference":
        rgb, _, alpha = splat_reference.rasterize_projected(m2, conics, opac, colors, depths, radii, w, h,
                                                            torch.tensor(bg))
    else:
        f = torch.float32
        rgb, _, alpha = splat_fast.rasterize_projected(m2.to(f), conics.to(f), opac.to(f), colors.to(f),
                                                       depths.to(f), radii.to(f), w, h, torch.tensor(bg, dtype=f),
                                                       tile=tile)
    np.testing.assert_allclose(rgb.double().numpy(), want_rgb, atol=1e-4)
    np.testing.assert_allclose(alpha.double().numpy(), want_alpha, atol=1e-4)


def test_fast_matches_reference_on_a_dense_scene():
    means, quats, scales, opac, _ = random_gaussians(1500, seed=3, dtype=torch.float32)
    sh = torch.randn(1500, 16, 3, generator=torch.Generator().manual_seed(4)) * 0.3
    view = torch.eye(4)
    intr = (60.0, 60.0, 40.0, 24.0)
    ref = rasterize_gaussians(means, quats, scales, opac, sh, view, intr, 80, 48, impl="reference")
    fast = rasterize_gaussians(means, quats, scales, opac, sh, view, intr, 80, 48, impl="fast")
    assert fast.impl == "fast" and ref.impl == "reference"
    assert float(ref.alpha.mean()) > 0.3
    for name in ("rgb", "alpha", "depth"):
        diff = (getattr(fast, name) - getattr(ref, name)).abs()
        assert float(diff.max()) < 2e-3, name
        assert float(diff.mean()) < 1e-5, name


def test_known_world_position_lands_at_expected_pixel():
    means = torch.tensor([[0.505, -0.255, 2.0]])  # u = 100 * 0.2525 + 32 = 57.25, v = -12.75 + 32 = 19.25
    out = rasterize_gaussians(means, torch.tensor([[1.0, 0, 0, 0]]), torch.full((1, 3), 0.004),
                              torch.tensor([0.9]), torch.ones(1, 3), torch.eye(4), (100.0, 100.0, 32.0, 32.0),
                              64, 64)
    v, u = divmod(int(out.alpha.argmax()), 64)
    assert (u, v) == (57, 19)
    assert abs(float(out.depth[19, 57] / out.alpha[19, 57]) - 2.0) < 1e-5
    assert float(out.alpha[19, 57]) > 0.5 and float(out.alpha[0, 0]) == 0.0


def test_gaussian_behind_camera_or_transparent_is_culled():
    means = torch.tensor([[0.0, 0.0, -2.0], [0.0, 0.0, 2.0]])
    out = rasterize_gaussians(means, torch.tensor([[1.0, 0, 0, 0]] * 2), torch.full((2, 3), 0.1),
                              torch.tensor([0.9, 0.001]), torch.ones(2, 3), torch.eye(4), (50.0, 50.0, 16.0, 16.0),
                              32, 32, background=torch.tensor([0.0, 1.0, 0.0]))
    assert out.n_visible == 0
    assert torch.equal(out.rgb, torch.tensor([0.0, 1.0, 0.0]).expand(32, 32, 3))


def test_sh_degree_zero_and_view_dependence():
    sh = torch.zeros(1, 16, 3)
    sh[0, 0] = torch.tensor([1.0, -1.0, 0.0])
    dirs = torch.tensor([[0.0, 0.0, 1.0]])
    want = (0.28209479177387814 * torch.tensor([1.0, -1.0, 0.0]) + 0.5).clamp_min(0)
    assert torch.allclose(eval_sh(sh, dirs, 0), want[None])
    sh[0, 2] = torch.tensor([1.0, 1.0, 1.0])  # the z-linear band: 0.4886 z
    assert torch.allclose(eval_sh(sh, dirs, 0), want[None])
    want1 = (0.28209479177387814 * torch.tensor([1.0, -1.0, 0.0]) + 0.4886025119029199 + 0.5).clamp_min(0)
    assert torch.allclose(eval_sh(sh, dirs, 1), want1[None])
    assert not torch.allclose(eval_sh(sh, -dirs, 1), eval_sh(sh, dirs, 1))


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError):
        rasterize_gaussians(torch.zeros(3, 2), None, None, torch.zeros(3), torch.zeros(3, 3), torch.eye(4),
                            (1.0, 1.0, 0.0, 0.0), 8, 8)
    with pytest.raises(ValueError):
        rasterize_gaussians(torch.zeros(1, 3), torch.zeros(1, 4), torch.ones(1, 3), torch.ones(1),
                            torch.zeros(1, 3), torch.eye(4), (1.0, 1.0, 0.0, 0.0), 8, 8, impl="magic")


@pytest.mark.slow  # torch.compile's first call takes 20-40 s here
def test_compiled_fast_path_matches_eager():
    means, quats, scales, opac, colors = random_gaussians(800, seed=6, dtype=torch.float32)
    args = (means, quats, scales, opac, colors, torch.eye(4), (60.0, 60.0, 32.0, 24.0), 64, 48)
    eager = rasterize_gaussians(*args, impl="fast")
    compiled = rasterize_gaussians(*args, impl="fast_compiled")
    assert compiled.impl == "fast_compiled"
    for name in ("rgb", "alpha", "depth"):
        assert float((getattr(compiled, name) - getattr(eager, name)).abs().max()) < 1e-4, name
