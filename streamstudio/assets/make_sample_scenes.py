"""Make the bundled sample Gaussian scenes procedurally (deterministic, seed 0).

    python3 -m streamstudio.assets.make_sample_scenes [--out streamstudio/assets]

* `sample_scene.ply`: about 5000 Gaussians, SH degree 1 (a 3DGS .ply with 9 f_rest): a
  striped sphere, a ring of small spheres around it and a checkered ground disc.
* `sample_4d.ply`: a StreamStudio 4D .ply, about 2000 Gaussians over t in [0, 1]: a static
  centre and three coloured moons orbiting it, each drawn by short-lived moving Gaussians.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch

from streamstudio.models.splats.gaussians import SH_C0, GaussianScene, rotation_4d, save_scene

HERE = Path(__file__).resolve().parent
SCENE_FILE = HERE / "sample_scene.ply"
SCENE_4D_FILE = HERE / "sample_4d.ply"


def _logit(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p / (1 - p))


def _dc(rgb: torch.Tensor) -> torch.Tensor:
    return (rgb - 0.5) / SH_C0  # (N, 3)


def _sphere_points(n: int, g: torch.Generator) -> torch.Tensor:
    v = torch.randn(n, 3, generator=g)
    return v / v.norm(dim=1, keepdim=True)  # (N, 3)


def _gaussians(means, rgb, scale, opacity, g, sh_rest: int = 3) -> GaussianScene:
    n = means.shape[0]
    sh = torch.zeros(n, 1 + sh_rest, 3)
    sh[:, 0] = _dc(rgb)
    sh[:, 1:] = 0.15 * torch.randn(n, sh_rest, 3, generator=g)  # a little view dependence
    return GaussianScene(means=means, quats=torch.randn(n, 4, generator=g),
                         log_scales=math.log(scale) + 0.2 * torch.randn(n, 3, generator=g),
                         opacity_logits=_logit(torch.full((n,), opacity)), sh=sh)


def _concat(parts: list[GaussianScene]) -> GaussianScene:
    fields = parts[0]._fields()
    joined: dict[str, Any] = {k: None if v is None else torch.cat([getattr(p, k) for p in parts])
                              for k, v in fields.items()}
    return GaussianScene(**joined)


def make_static(seed: int = 0) -> GaussianScene:
    g = torch.Generator().manual_seed(seed)
    ball = _sphere_points(2600, g)  # (N, 3) unit sphere, y down is "up" in OpenCV terms
    stripes = (torch.floor((ball[:, 1] + 1) * 4) % 2)[:, None]
    rgb = stripes * torch.tensor([0.9, 0.35, 0.15]) + (1 - stripes) * torch.tensor([0.95, 0.9, 0.8])
    parts = [_gaussians(ball * 0.6, rgb, 0.045, 0.9, g)]
    for k in range(8):  # small moons in a ring
        ang = 2 * math.pi * k / 8
        centre = torch.tensor([1.1 * math.cos(ang), 0.0, 1.1 * math.sin(ang)])
        hue = torch.tensor([0.5 + 0.5 * math.cos(ang), 0.5 + 0.5 * math.cos(ang + 2.1),
                            0.5 + 0.5 * math.cos(ang + 4.2)])
        parts.append(_gaussians(centre + 0.13 * _sphere_points(150, g), hue.expand(150, 3), 0.03, 0.85, g))
    r = 1.8 * torch.sqrt(torch.rand(1200, generator=g))
    th = 2 * math.pi * torch.rand(1200, generator=g)
    disc = torch.stack([r * torch.cos(th), torch.full_like(r, 0.75), r * torch.sin(th)], 1)
    checker = ((torch.floor(disc[:, 0] * 2.5) + torch.floor(disc[:, 2] * 2.5)) % 2)[:, None]
    rgb = 0.25 + 0.5 * checker * torch.tensor([0.6, 0.8, 1.0])
    flat = _gaussians(disc, rgb.expand(-1, 3).clone(), 0.08, 0.8, g)
    flat.log_scales[:, 1] = math.log(0.01)
    flat.quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(1200, 4).clone()
    parts.append(flat)
    return _concat(parts)


def _basis_bilinear() -> torch.Tensor:
    """(16, 16) matrix C with vec(rotation_4d(l, r)) = C vec(l r^T) (the map is bilinear)."""
    eye = torch.eye(4, dtype=torch.float64)
    cols = [rotation_4d(eye[i:i + 1], eye[j:j + 1])[0].reshape(16) for i in range(4) for j in range(4)]
    return torch.stack(cols, 1)


def quats_of_rotation_4d(rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 4, 4) rotations -> (N, 4) left and (N, 4) right quaternions with rotation_4d(l, r) = rot."""
    outer = torch.linalg.solve(_basis_bilinear(), rot.double().reshape(-1, 16).T).T.reshape(-1, 4, 4)
    u, s, vh = torch.linalg.svd(outer)  # outer = l r^T is rank one
    scale = torch.sqrt(s[:, :1])
    return (u[:, :, 0] * scale).float(), (vh[:, 0, :] * scale).float()


def plane_rotation(u: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """(N, 3) unit directions, (N,) angles -> (N, 4, 4) rotation by theta in the plane (u, t)."""
    n = u.shape[0]
    a = torch.cat([u, torch.zeros(n, 1)], 1)  # (N, 4)
    b = torch.zeros(n, 4)
    b[:, 3] = 1.0
    ab = b[:, :, None] * a[:, None, :] - a[:, :, None] * b[:, None, :]  # (N, 4, 4)
    aa_bb = a[:, :, None] * a[:, None, :] + b[:, :, None] * b[:, None, :]
    th = theta[:, None, None]
    return torch.eye(4) + torch.sin(th) * ab + (torch.cos(th) - 1) * aa_bb


def make_4d(seed: int = 0) -> GaussianScene:
    g = torch.Generator().manual_seed(seed)
    centre = _gaussians(0.35 * _sphere_points(500, g), torch.tensor([0.95, 0.85, 0.3]).expand(500, 3), 0.05,
                        0.9, g, sh_rest=0)
    centre.quats_r = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(500, 4).clone()
    centre.quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(500, 4).clone()
    centre.t_centers = torch.full((500,), 0.5)
    centre.t_log_scales = torch.full((500,), math.log(10.0))  # effectively static
    parts = [centre]
    for k, colour in enumerate(([0.2, 0.6, 1.0], [1.0, 0.3, 0.4], [0.3, 1.0, 0.5])):
        n = 500
        t = torch.rand(n, generator=g)  # (N,) time centres
        ang = 2 * math.pi * (t + k / 3)
        radius, omega = 0.9 + 0.2 * k, 2 * math.pi
        pos = torch.stack([radius * torch.cos(ang), 0.15 * (k - 1) * torch.ones_like(t), radius * torch.sin(ang)], 1)
        speed = radius * omega
        tangent = torch.stack([-torch.sin(ang), torch.zeros_like(t), torch.cos(ang)], 1)  # (N, 3)
        blob = pos + 0.08 * _sphere_points(n, g) * torch.rand(n, 1, generator=g)
        moon = _gaussians(blob, torch.tensor(colour).expand(n, 3), 0.035, 0.9, g, sh_rest=0)
        s, st = 0.035, 0.025
        # rotation by theta in (tangent, t) with isotropic spatial scale s gives velocity
        # (st^2 - s^2) sin cos / (st^2 cos^2 + s^2 sin^2); solve tan(theta) for `speed` (small-s limit)
        theta = torch.full((n,), math.atan(speed))
        left, right = quats_of_rotation_4d(plane_rotation(tangent, theta))
        moon.quats, moon.quats_r = left, right
        moon.log_scales = torch.full((n, 3), math.log(s))
        moon.t_centers, moon.t_log_scales = t, torch.full((n,), math.log(st))
        parts.append(moon)
    return _concat(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    static, dynamic = make_static(), make_4d()
    save_scene(static, args.out / SCENE_FILE.name)
    save_scene(dynamic, args.out / SCENE_4D_FILE.name)
    print(f"wrote {len(static)} Gaussians to {args.out / SCENE_FILE.name}, "
          f"{len(dynamic)} to {args.out / SCENE_4D_FILE.name}")


if __name__ == "__main__":
    main()
