"""Cameras, camera paths and frames from a Gaussian scene.

Cameras are pinhole, built from a vertical field of view, with OpenCV axes (x right, y down,
z forward). World "up" defaults to -y, the usual orientation of 3DGS (COLMAP) scenes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.kernels.splat import IMPLS, SplatRender, rasterize_gaussians
from streamstudio.models.gaussians import GaussianScene, slice_4d

PATHS = ("orbit", "turntable", "fly")
MODES = ("rgb", "depth", "alpha")
DEFAULT_UP = (0.0, -1.0, 0.0)


@dataclass
class Camera:
    """A pinhole camera: world -> camera `viewmat` (4, 4) and intrinsics from the vertical FOV."""

    viewmat: torch.Tensor  # (4, 4)
    width: int
    height: int
    fov_y_deg: float = 50.0

    @property
    def intrinsics(self) -> tuple[float, float, float, float]:
        f = 0.5 * self.height / math.tan(math.radians(self.fov_y_deg) / 2)
        return (f, f, self.width / 2, self.height / 2)

    @property
    def position(self) -> torch.Tensor:
        return -self.viewmat[:3, :3].T @ self.viewmat[:3, 3]  # (3,)

    @staticmethod
    def look_at(eye, target, width: int, height: int, fov_y_deg: float = 50.0, up=DEFAULT_UP) -> "Camera":
        eye, target = torch.as_tensor(eye, dtype=torch.float32), torch.as_tensor(target, dtype=torch.float32)
        forward = _unit(target - eye)  # camera +z
        down = -torch.as_tensor(up, dtype=torch.float32)
        right = torch.linalg.cross(down, forward)
        if right.norm() < 1e-6:  # looking straight along up: any right will do
            right = torch.linalg.cross(torch.tensor([0.0, 0.0, 1.0]), forward)
        right = _unit(right)
        below = torch.linalg.cross(forward, right)  # camera +y
        rot = torch.stack([right, below, forward])  # (3, 3) rows are the camera axes
        view = torch.eye(4)
        view[:3, :3], view[:3, 3] = rot, -rot @ eye
        return Camera(view, int(width), int(height), float(fov_y_deg))


def _unit(v: torch.Tensor) -> torch.Tensor:
    n = v.norm()
    if n < 1e-12:
        raise StreamStudioError("camera eye and target coincide; move the camera")
    return v / n


@dataclass
class SplatRenderConfig:
    """How frames are rendered from a scene."""

    width: int = 512
    height: int = 512
    fov_y_deg: float = 50.0
    sh_degree: int = 3
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)
    mode: str = "rgb"  # rgb | depth | alpha
    impl: str = "auto"  # auto | reference | fast | fast_compiled | cuda
    device: str = "cpu"
    up: tuple[float, float, float] = DEFAULT_UP
    antialiased: bool | None = None  # gsplat's "antialiased" mode; None: as the scene's file says

    def check(self) -> None:
        if not (8 <= self.width <= 4096 and 8 <= self.height <= 4096):
            raise StreamStudioError(f"frame size {self.width}x{self.height} is out of range; use 8..4096 pixels")
        if self.mode not in MODES:
            raise StreamStudioError(f"render mode {self.mode!r} is unknown; use one of {', '.join(MODES)}")
        if self.impl not in IMPLS:
            raise StreamStudioError(f"renderer {self.impl!r} is unknown; use one of {', '.join(IMPLS)}")
        if not 0 <= self.sh_degree <= 3:
            raise StreamStudioError("SH degree must be 0..3")
        if not 1.0 <= self.fov_y_deg <= 170.0:
            raise StreamStudioError("field of view must be 1..170 degrees")


@dataclass
class SceneFit:
    """Where a scene is: the centre and radius of its robust bounds."""

    center: torch.Tensor = field(default_factory=lambda: torch.zeros(3))  # (3,)
    radius: float = 1.0

    @staticmethod
    def of(scene: GaussianScene) -> "SceneFit":
        lo, hi = scene.bounds()
        radius = float((hi - lo).norm() / 2)
        return SceneFit(((lo + hi) / 2).float(), max(radius, 1e-3))

    def distance(self, fov_y_deg: float, aspect: float) -> float:
        """Camera distance at which the bounding sphere fills the narrower FOV."""
        half = math.radians(fov_y_deg) / 2
        half = min(half, math.atan(math.tan(half) * aspect))
        return 1.05 * self.radius / math.sin(half)


def _up_basis(up) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unit up u and two unit vectors a, b spanning the plane normal to it."""
    u = torch.nn.functional.normalize(torch.as_tensor(up, dtype=torch.float32), dim=0)
    helper = torch.tensor([1.0, 0.0, 0.0]) if abs(float(u[0])) < 0.9 else torch.tensor([0.0, 0.0, 1.0])
    a = torch.nn.functional.normalize(torch.linalg.cross(u, helper), dim=0)
    return u, a, torch.linalg.cross(u, a)


def fitted_camera(fit: SceneFit, cfg: SplatRenderConfig, azimuth_deg: float = 0.0, elevation_deg: float = 20.0,
                  zoom: float = 1.0, pan: tuple[float, float] = (0.0, 0.0)) -> Camera:
    """A camera looking at the scene centre from (azimuth, elevation), at the fitted distance / zoom.

    pan moves the target (and camera) along the camera's right and up, in scene radii."""
    u, a, b = _up_basis(cfg.up)
    az, el = math.radians(azimuth_deg), math.radians(elevation_deg)
    direction = math.cos(el) * (math.cos(az) * b + math.sin(az) * a) + math.sin(el) * u  # centre -> eye
    dist = fit.distance(cfg.fov_y_deg, cfg.width / cfg.height) / max(zoom, 1e-3)
    cam = Camera.look_at(fit.center + dist * direction, fit.center, cfg.width, cfg.height, cfg.fov_y_deg, cfg.up)
    if pan != (0.0, 0.0):
        shift = fit.radius * (pan[0] * cam.viewmat[0, :3] - pan[1] * cam.viewmat[1, :3])
        cam = Camera.look_at(fit.center + dist * direction + shift, fit.center + shift, cfg.width, cfg.height,
                             cfg.fov_y_deg, cfg.up)
    return cam


def camera_path(kind: str, fit: SceneFit, cfg: SplatRenderConfig, frames: int,
                elevation_deg: float = 20.0) -> list[Camera]:
    """`frames` cameras along a path: orbit (360 degrees around the centre at an elevation that
    swings gently), turntable (360 degrees, level camera) or fly (a loop through the scene,
    looking ahead)."""
    if frames < 1:
        raise StreamStudioError("the number of frames must be at least 1")
    steps = [i / frames for i in range(frames)]
    if kind == "orbit":
        return [fitted_camera(fit, cfg, 360 * s, elevation_deg + 10 * math.sin(2 * math.pi * s)) for s in steps]
    if kind == "turntable":
        return [fitted_camera(fit, cfg, 360 * s, 0.0) for s in steps]
    if kind == "fly":
        return [_fly_camera(fit, cfg, s) for s in steps]
    raise StreamStudioError(f"camera path {kind!r} is unknown; use one of {', '.join(PATHS)}")


def _fly_point(fit: SceneFit, u, a, b, s: float) -> torch.Tensor:
    ang = 2 * math.pi * s
    r = 0.8 * fit.radius
    return fit.center + r * (math.cos(ang) * b + 0.6 * math.sin(ang) * a) + 0.25 * fit.radius * math.sin(2 * ang) * u


def _fly_camera(fit: SceneFit, cfg: SplatRenderConfig, s: float) -> Camera:
    """A figure flying a tilted ellipse through the scene, looking a little ahead and inward."""
    u, a, b = _up_basis(cfg.up)
    eye = _fly_point(fit, u, a, b, s)
    ahead = _fly_point(fit, u, a, b, s + 0.08)
    target = 0.6 * ahead + 0.4 * fit.center
    return Camera.look_at(eye, target, cfg.width, cfg.height, cfg.fov_y_deg, cfg.up)


def render(scene: GaussianScene, camera: Camera, cfg: SplatRenderConfig, time: float | None = None) -> SplatRender:
    """Rasterise `scene` (its slice at `time` when it is 4D) from `camera`."""
    cfg.check()
    if scene.is_4d:
        lo, hi = scene.time_range
        scene = slice_4d(scene, (lo + hi) / 2 if time is None else float(time))
    device = torch.device(cfg.device)
    covars = None if scene.covars is None else scene.covars.to(device)
    bg = torch.tensor(cfg.background, dtype=torch.float32)
    try:
        return rasterize_gaussians(scene.means.to(device), scene.quats.to(device), scene.scales().to(device),
                                   scene.opacities().to(device), scene.sh.to(device), camera.viewmat.to(device),
                                   camera.intrinsics, camera.width, camera.height, sh_degree=cfg.sh_degree,
                                   background=bg.to(device), covars=covars, impl=cfg.impl,
                                   antialiased=scene.antialiased if cfg.antialiased is None else cfg.antialiased)
    except (ValueError, RuntimeError) as exc:
        raise StreamStudioError(f"splat rendering failed: {exc}") from exc


def to_frame(out: SplatRender, cfg: SplatRenderConfig) -> np.ndarray:
    """A render as an RGB uint8 (H, W, 3) frame in the configured mode.

    depth: mean depth (depth / alpha), near white to far black, the background black."""
    if cfg.mode == "rgb":
        img = out.rgb
    elif cfg.mode == "alpha":
        img = out.alpha[..., None].expand(-1, -1, 3)
    else:
        mean = out.depth / out.alpha.clamp_min(1e-6)  # (H, W)
        seen = out.alpha > 0.05
        if bool(seen.any()):
            lo, hi = float(mean[seen].min()), float(mean[seen].max())
            img = torch.where(seen, 1.0 - (mean - lo) / max(hi - lo, 1e-6) * 0.85, torch.zeros_like(mean))
        else:
            img = torch.zeros_like(mean)
        img = img[..., None].expand(-1, -1, 3)
    return (img.clamp(0, 1) * 255 + 0.5).to(torch.uint8).cpu().numpy()


def render_frame(scene: GaussianScene, camera: Camera, cfg: SplatRenderConfig, time: float | None = None) -> np.ndarray:
    """`render` then `to_frame`: RGB uint8 (H, W, 3)."""
    return to_frame(render(scene, camera, cfg, time), cfg)


def path_times(scene: GaussianScene, frames: int, time_range: tuple[float, float] | None = None) -> list[float | None]:
    """Time of each frame: evenly over `time_range` (default the scene's) for 4D, None for 3D."""
    if not scene.is_4d:
        return [None] * frames
    lo, hi = time_range if time_range is not None else scene.time_range
    if frames == 1:
        return [float(lo)]
    return [lo + (hi - lo) * i / (frames - 1) for i in range(frames)]
