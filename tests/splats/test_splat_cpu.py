"""The C++ CPU splat renderer (`kernels/csrc/splat_cpu.cpp`): it builds, matches the pure-torch
reference to 1e-4 (RGB, depth, alpha) and, when it cannot be built, `impl="auto"` warns once and
runs the vectorised torch path."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

from streamstudio.kernels import cuda_build, splat_cpu
from streamstudio.kernels.splat import pick_impl, rasterize_gaussians
from streamstudio.kernels.splat_reference import quat_scale_to_covar
from helpers import random_gaussians

ASSETS = Path(__file__).resolve().parents[2] / "streamstudio" / "assets"


@pytest.fixture(scope="session")
def cpp_module():
    """Build (or load from torch's extension cache) once per session; the build must work here."""
    module = splat_cpu.load()
    assert module is not None, f"the C++ CPU splat renderer did not build: {splat_cpu.failure_reason()}"
    return module


def scene(n: int, seed: int, dtype=torch.float64, spread: float = 0.6, log_scale: float = -2.5, sh_k: int = 16):
    return random_gaussians(n, seed, spread, log_scale, dtype, sh_k)


def view_matrix(dtype, angle: float = 0.3):
    c, s = math.cos(angle), math.sin(angle)
    view = torch.eye(4, dtype=dtype)
    view[:3, :3] = torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=dtype)
    view[:3, 3] = torch.tensor([0.1, -0.05, 0.2], dtype=dtype)
    return view


def assert_matches_reference(args: dict, tol: float = 1e-4):
    ref = rasterize_gaussians(**args, impl="reference")
    cpp = rasterize_gaussians(**args, impl="cpp")
    assert cpp.impl == "cpp" and ref.impl == "reference"
    assert cpp.n_visible == ref.n_visible
    for name in ("rgb", "depth", "alpha"):
        got, want = getattr(cpp, name), getattr(ref, name)
        assert got.shape == want.shape and got.dtype == torch.float32, name
        diff = float((got - want).abs().max())
        assert diff < tol, f"{name}: max |cpp - reference| = {diff}"
    return ref


CASES = [  # (n, seed, width, height, dtype, sh_k, sh_degree, background)
    (300, 0, 64, 48, torch.float64, 16, None, (0.1, 0.2, 0.3)),
    (400, 1, 37, 53, torch.float64, 9, 1, None),  # odd size, SH degree 1 of 2
    (250, 2, 100, 17, torch.float32, 16, 3, (1.0, 0.0, 0.5)),
    (500, 3, 33, 31, torch.float32, 4, None, None),
    (300, 4, 1, 1, torch.float64, 1, 0, (0.5, 0.5, 0.5)),  # one pixel, SH degree 0
    (350, 5, 17, 16, torch.float32, 0, None, (0.2, 0.2, 0.2)),  # plain RGB colours
]


@pytest.mark.parametrize("n, seed, width, height, dtype, sh_k, sh_degree, background", CASES)
def test_cpp_matches_reference_on_random_scenes(cpp_module, n, seed, width, height, dtype, sh_k, sh_degree,
                                                background):
    means, quats, scales, opac, colors = scene(n, seed, dtype, sh_k=sh_k)
    args = dict(means=means, quats=quats, scales=scales, opacities=opac, colors=colors,
                viewmat=view_matrix(dtype, 0.1 * seed), intrinsics=(0.9 * width + 5, 0.9 * width + 7,
                                                                     width / 2 + 0.3, height / 2 - 0.2),
                width=width, height=height, sh_degree=sh_degree,
                background=None if background is None else torch.tensor(background))
    ref = assert_matches_reference(args, tol=1e-9 if dtype == torch.float64 else 1e-4)
    if width * height > 1:
        assert float(ref.alpha.max()) > 0.5  # something was drawn


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpp_matches_reference_antialiased(cpp_module, dtype):
    means, quats, scales, opac, sh = scene(400, 7, dtype)
    args = dict(means=means, quats=quats, scales=scales, opacities=opac, colors=sh, viewmat=view_matrix(dtype),
                intrinsics=(50.0, 55.0, 20.0, 30.0), width=64, height=48, background=(0.1, 0.2, 0.3),
                antialiased=True)
    ref = assert_matches_reference(args)
    plain = rasterize_gaussians(**{**args, "antialiased": False}, impl="reference")
    assert float((ref.rgb - plain.rgb).abs().max()) > 0.05


def test_cpp_matches_reference_where_pixels_saturate(cpp_module):
    """Opaque, overlapping Gaussians: the T < 1e-4 stop and the 0.99 clamp are exercised."""
    means, quats, scales, opac, colors = scene(600, 7, torch.float32, spread=0.4, log_scale=-2.0)
    opac[:300] = 0.999
    args = dict(means=means, quats=quats, scales=scales, opacities=opac, colors=colors, viewmat=torch.eye(4),
                intrinsics=(60.0, 60.0, 40.5, 23.5), width=81, height=47, background=torch.tensor([0.3, 0.1, 0.9]))
    ref = assert_matches_reference(args)
    assert float(ref.alpha.max()) > 0.999 and float(ref.alpha.min()) < 0.5  # T stops near 1e-4


def test_cpp_matches_reference_with_covariances_and_culling(cpp_module):
    """covars instead of quats/scales; some Gaussians behind the camera, off screen or transparent."""
    means, quats, scales, opac, colors = scene(300, 8, torch.float64)
    means[:30, 2] = -1.0  # behind the camera
    means[30:60, 0] += 40.0  # far off screen
    opac[60:90] = 0.003  # below alpha 1/255 everywhere
    args = dict(means=means, quats=None, scales=None, covars=quat_scale_to_covar(quats, scales), opacities=opac,
                colors=colors, viewmat=torch.eye(4, dtype=torch.float64), intrinsics=(50.0, 50.0, 24.0, 20.0),
                width=48, height=40, sh_degree=2)
    ref = assert_matches_reference(args, tol=1e-9)
    assert ref.n_visible <= 300 - 90


def test_cpp_matches_reference_on_the_sample_scene(cpp_module):
    from streamstudio.models.splats.gaussians import load_scene
    from streamstudio.pipelines.splats.splat_render import SceneFit, SplatRenderConfig, camera_path

    sample = load_scene(ASSETS / "sample_scene.ply")
    for cam in camera_path("orbit", SceneFit.of(sample), SplatRenderConfig(width=72, height=45), 2):
        args = dict(means=sample.means, quats=sample.quats, scales=sample.scales(), opacities=sample.opacities(),
                    colors=sample.sh, viewmat=cam.viewmat, intrinsics=cam.intrinsics, width=cam.width,
                    height=cam.height, background=torch.tensor([0.05, 0.05, 0.1]))
        ref = assert_matches_reference(args)
        assert float(ref.alpha.mean()) > 0.05


def test_cpp_nothing_visible_gives_the_background(cpp_module):
    means = torch.tensor([[0.0, 0.0, -2.0]])
    out = rasterize_gaussians(means, torch.tensor([[1.0, 0, 0, 0]]), torch.full((1, 3), 0.1), torch.tensor([0.9]),
                              torch.ones(1, 3), torch.eye(4), (10.0, 10.0, 4.0, 4.0), 9, 7,
                              background=torch.tensor([0.25, 0.5, 0.75]), impl="cpp")
    assert out.n_visible == 0
    assert torch.equal(out.rgb, torch.tensor([0.25, 0.5, 0.75]).expand(7, 9, 3))
    assert float(out.alpha.abs().max()) == 0.0 and float(out.depth.abs().max()) == 0.0


def test_auto_on_cpu_takes_the_cpp_path(cpp_module):
    assert pick_impl("auto", torch.device("cpu")) == "cpp"
    means, quats, scales, opac, colors = scene(50, 9, torch.float32)
    out = rasterize_gaussians(means, quats, scales, opac, colors, torch.eye(4), (30.0, 30.0, 16.0, 12.0), 32, 24)
    assert out.impl == "cpp"


def test_cpp_thread_counts_agree(cpp_module):
    means, quats, scales, opac, colors = scene(800, 10, torch.float32)
    args = (means, quats, scales, opac, colors, torch.eye(4), (60.0, 60.0, 40.0, 30.0), 80, 60)
    one = splat_cpu.render(*args, threads=1)
    two = splat_cpu.render(*args, threads=2)
    for a, b in zip(one[:3], two[:3]):
        assert torch.equal(a, b)


@pytest.fixture
def forget_cpp_state():
    """Run a test with a fresh load state; afterwards the next load imports the built one again."""
    splat_cpu.reset_for_tests()
    yield
    splat_cpu.reset_for_tests()


def test_build_failure_warns_once_and_auto_runs_the_torch_path(tmp_path, monkeypatch, forget_cpp_state):
    broken = tmp_path / "splat_cpu.cpp"
    broken.write_text('#error "deliberately broken for the fallback test"\n')
    monkeypatch.setattr(splat_cpu, "SOURCE", broken)
    means, quats, scales, opac, colors = scene(60, 11, torch.float32)
    args = (means, quats, scales, opac, colors, torch.eye(4), (30.0, 30.0, 16.0, 12.0), 32, 24)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = rasterize_gaussians(*args)
        second = rasterize_gaussians(*args)
    ours = [w for w in caught if "C++ CPU splat renderer" in str(w.message)]
    assert len(ours) == 1 and issubclass(ours[0].category, RuntimeWarning)
    assert first.impl == "fast" and second.impl == "fast"
    assert splat_cpu.failure_reason() is not None
    ref = rasterize_gaussians(*args, impl="reference")
    assert float((first.rgb - ref.rgb).abs().max()) < 2e-3
    with pytest.raises(RuntimeError, match="not available"):
        rasterize_gaussians(*args, impl="cpp")


def test_disabled_by_environment(monkeypatch, forget_cpp_state):
    monkeypatch.setenv(splat_cpu.DISABLE_ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # disabling on purpose is not worth a warning
        assert splat_cpu.load() is None
        assert pick_impl("auto", torch.device("cpu")) == "fast"


@pytest.mark.slow
def test_build_without_ninja(tmp_path, monkeypatch, forget_cpp_state):
    """torch's load() needs ninja; without it the loader calls the compiler itself (a fresh ~15 s build)."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    monkeypatch.setenv(cuda_build.CACHE_ENV, str(tmp_path))
    module = splat_cpu.load()
    assert module is not None, splat_cpu.failure_reason()
    assert list(tmp_path.glob("*/*.so"))
    means, quats, scales, opac, colors = scene(200, 12, torch.float64)
    args = dict(means=means, quats=quats, scales=scales, opacities=opac, colors=colors,
                viewmat=torch.eye(4, dtype=torch.float64), intrinsics=(50.0, 50.0, 20.0, 15.0), width=40, height=30)
    assert_matches_reference(args, tol=1e-9)
