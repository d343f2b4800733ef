"""benchmarks/splats.py's gsplat-beside-ours row (issue 45), run on the CPU against a stand-in
gsplat that renders through our own rasterizer from what it is handed: the scene, the camera's
view matrix and its 3x3 K go across as gsplat's `rasterization` takes them (a K built wrong, or
a view matrix left out, renders another picture and the two frames come apart)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import splats as bench  # noqa: E402

from streamstudio.kernels.splat import rasterize_gaussians  # noqa: E402


def stand_in(calls: list):
    def rasterization(means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree, near_plane,
                      far_plane):
        assert viewmats.shape == (1, 4, 4) and Ks.shape == (1, 3, 3) and Ks[0, 2, 2] == 1 and Ks[0, 0, 1] == 0
        calls.append((width, height))
        k = Ks[0]
        out = rasterize_gaussians(means, quats, scales, opacities, colors, viewmats[0],
                                  (float(k[0, 0]), float(k[1, 1]), float(k[0, 2]), float(k[1, 2])), width, height,
                                  sh_degree=sh_degree, near=near_plane, far=far_plane, impl="fast")
        return out.rgb[None], out.alpha[None, ..., None], {}

    return SimpleNamespace(rasterization=rasterization, __version__="stand-in")


def test_gsplat_beside_ours_on_the_same_scene_and_cameras():
    calls: list = []
    row = bench.gsplat_row(torch.device("cpu"), n=3000, frames=3, impl="fast", gsplat=stand_in(calls))
    assert row["status"] == "measured" and row["gsplat"] == "stand-in" and row["size"] == "256x256"
    assert row["psnr_db"] == 99.0  # the same renderer from the same camera: the same frame
    assert len(calls) == 4 and row["fps_ours"] > 0 and row["fps_gsplat"] > 0
    assert row["ours_over_gsplat"] == row["fps_ours"] / row["fps_gsplat"]
    missing = bench.gsplat_row(torch.device("cpu"), n=3000, frames=1)  # gsplat not installed here
    assert missing["status"].startswith("missing: gsplat does not import")
