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
    # gsplat's _persp_proj: the image's edges (from cx, cy) plus 0.3 x the half-FOV tangent
    lx_pos, lx_neg = (w - cx) / fx + 0.15 * w / fx, cx / fx + 0.15 * w / fx
    ly_pos, ly_neg = (h - cy) / fy + 0.15 * h / fy, cy / fy + 0.15 * h / fy
    tx, ty = min(max(x / z, -lx_neg), lx_pos) * z, min(max(y / z, -ly_neg), ly_pos) * z
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


OFF_W, OFF_H = 64, 48
OFF_INTR = (32.0, 30.0, OFF_W / 4, OFF_H / 4)  # fx, fy, cx = W/4, cy = H/4: the far edges at x/z = 1.5, y/z = 1.2


def ewa_alpha_image(mean, sigma, opacity, fx, fy, cx, cy, w, h, lim_x=None, antialiased=False):
    """The exact EWA footprint of one Gaussian in camera space (identity view), written out:
    cov2d = J Sigma J^T + 0.3 I with J the perspective Jacobian at x/z, y/z clamped to
    [-cx/fx - 0.15 W/fx, (W - cx)/fx + 0.15 W/fx] (and the same in y), alpha = min(0.99, o e^-q/2)
    at pixel centres, dropped below 1/255. (H, W) float64. `lim_x` (neg, pos) overrides the x limits."""
    x, y, z = mean
    lx_neg, lx_pos = lim_x or ((cx + 0.15 * w) / fx, (w - cx + 0.15 * w) / fx)
    tx = float(np.clip(x / z, -lx_neg, lx_pos)) * z
    ty = float(np.clip(y / z, -(cy + 0.15 * h) / fy, (h - cy + 0.15 * h) / fy)) * z
    jac = np.array([[fx / z, 0.0, -fx * tx / z ** 2], [0.0, fy / z, -fy * ty / z ** 2]])
    raw = jac @ sigma @ jac.T
    cov = raw + 0.3 * np.eye(2)
    if antialiased:  # gsplat: o * sqrt(det(S) / det(S + 0.3 I))
        opacity = opacity * math.sqrt(max(0.0, np.linalg.det(raw) / np.linalg.det(cov)))
    inv = np.linalg.inv(cov)
    mu = np.array([fx * x / z + cx, fy * y / z + cy])
    us, vs = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    d = np.stack([us - mu[0], vs - mu[1]], -1)  # (H, W, 2)
    q = np.einsum("hwi,ij,hwj->hw", d, inv, d)
    alpha = np.minimum(0.99, opacity * np.exp(-0.5 * q))
    return np.where(alpha >= 1 / 255, alpha, 0.0)


# (camera-space mean, what it checks): x/z = 1.4 lies inside the image (u = 60.8 of 64) but beyond
# the old centred limit 1.3 x (W/2)/fx = 1.3; x/z = 2.1 is off the image and clamped at 1.8;
# y/z = 1.3 near the bottom edge (cy = H/4), x/z = -0.9 beyond the left edge plus 0.3 tan (-0.8)
OFF_CENTRE_MEANS = [((1.4 * 2.0, 0.1, 2.0), "inside, beyond the centred limit"),
                    ((2.1 * 2.0, 0.3, 2.0), "right of the image, clamped at the far edge + 0.15 W/fx"),
                    ((0.2 * 2.5, 1.3 * 2.5, 2.5), "near the bottom edge"),
                    ((-0.9 * 1.5, -0.1, 1.5), "left of the image, clamped at the near edge + 0.15 W/fx")]


@pytest.mark.parametrize("impl", ["reference", "fast", "cpp", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("mean, what", OFF_CENTRE_MEANS)
def test_off_centre_principal_point_matches_exact_ewa_footprint(impl, mean, what):
    """cx = W/4, cy = H/4: the Jacobian's clamp follows the image's actual edges (gsplat), so a
    Gaussian near the far edge keeps its footprint (with a centred clamp its alpha is off by ~0.07)."""
    if impl == "cpp":
        from streamstudio.kernels import splat_cpu
        if splat_cpu.load() is None:
            pytest.skip("the C++ renderer did not build")
    quat = np.array([0.8, 0.3, -0.4, 0.2])
    scale = np.array([0.35, 0.12, 0.5])
    rot = np_rotation(quat)
    sigma = rot @ np.diag(scale ** 2) @ rot.T
    want = ewa_alpha_image(np.array(mean), sigma, 0.9, *OFF_INTR, OFF_W, OFF_H)
    assert want.max() > 0.2, what  # the footprint reaches into the image
    if impl == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    dtype = torch.float64 if impl == "reference" else torch.float32
    dev = "cuda" if impl == "cuda" else "cpu"  # (the CUDA path projects in torch on the GPU, then blends in the kernel)
    out = rasterize_gaussians(torch.tensor([mean], dtype=dtype, device=dev),
                              torch.tensor(quat[None], dtype=dtype, device=dev),
                              torch.tensor(scale[None], dtype=dtype, device=dev),
                              torch.tensor([0.9], dtype=dtype, device=dev), torch.ones(1, 3, dtype=dtype, device=dev),
                              torch.eye(4, dtype=dtype, device=dev), OFF_INTR, OFF_W, OFF_H, impl=impl)
    tol = 1e-9 if impl == "reference" else 2e-5
    np.testing.assert_allclose(out.alpha.double().cpu().numpy(), want, atol=tol, err_msg=what)
    if what.startswith("inside"):  # the centred clamp of before (+-1.3 (W/2)/fx) gives a visibly different footprint
        centred = 1.3 * (OFF_W / 2) / OFF_INTR[0]
        wrong = ewa_alpha_image(np.array(mean), sigma, 0.9, *OFF_INTR, OFF_W, OFF_H, lim_x=(centred, centred))
        assert np.abs(wrong - want).max() > 0.03


@pytest.mark.parametrize("impl", ["reference", "fast", "cpp", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("scale", [(0.35, 0.12, 0.5), (0.004, 0.002, 0.01)])  # wide, and smaller than a pixel
def test_antialiased_mode_matches_the_compensated_ewa_footprint(impl, scale):
    if impl == "cpp":
        from streamstudio.kernels import splat_cpu
        if splat_cpu.load() is None:
            pytest.skip("the C++ renderer did not build")
    if impl == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    mean, quat, scale = np.array([0.3, -0.2, 2.0]), np.array([0.8, 0.3, -0.4, 0.2]), np.array(scale)
    rot = np_rotation(quat)
    sigma = rot @ np.diag(scale ** 2) @ rot.T
    dtype = torch.float64 if impl == "reference" else torch.float32
    dev = "cuda" if impl == "cuda" else "cpu"
    args = [torch.tensor(v[None], dtype=dtype, device=dev) for v in (mean, quat, scale)]
    plain_want = ewa_alpha_image(mean, sigma, 0.9, *OFF_INTR, OFF_W, OFF_H)
    want = ewa_alpha_image(mean, sigma, 0.9, *OFF_INTR, OFF_W, OFF_H, antialiased=True)
    for flag, expected in ((True, want), (False, plain_want)):
        out = rasterize_gaussians(*args, torch.tensor([0.9], dtype=dtype, device=dev),
                                  torch.ones(1, 3, dtype=dtype, device=dev), torch.eye(4, dtype=dtype, device=dev),
                                  OFF_INTR, OFF_W, OFF_H, impl=impl, antialiased=flag)
        np.testing.assert_allclose(out.alpha.double().cpu().numpy(), expected,
                                   atol=1e-9 if impl == "reference" else 2e-5)
    assert np.abs(want - plain_want).max() > 0.01  # the mode changes the picture (a lot for the small one)


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
    # gsplat's depth modes: "D" accumulated (sum w z = alpha x 2 for one Gaussian), "ED" expected (/ alpha)
    assert abs(float(out.depth[19, 57]) - 2.0 * float(out.alpha[19, 57])) < 1e-5
    assert abs(float(out.expected_depth[19, 57]) - 2.0) < 1e-5 and float(out.expected_depth[0, 0]) == 0.0
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
