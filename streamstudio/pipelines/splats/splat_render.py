"""Cameras, camera paths and frames from a Gaussian scene.

Cameras are pinhole (or orthographic, or equidistant fisheye), built from a vertical field of
view, with OpenCV axes (x right, y down, z forward). World "up" defaults to -y, the usual
orientation of 3DGS (COLMAP) scenes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Union

import numpy as np
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.kernels.splat import SplatRender, rasterize_gaussians
from streamstudio.models.splats.gaussians import GaussianScene, slice_4d
from streamstudio.pipelines.live_settings import SPLAT_SETTINGS

PATHS = ("orbit", "turntable", "fly")
MODES = ("rgb", "depth", "alpha")
DEFAULT_UP = (0.0, -1.0, 0.0)
Vector = Union[torch.Tensor, np.ndarray, Sequence[float]]  # a point or direction (3,), any of these


CAMERAS = {"perspective": "pinhole", "ortho": "ortho", "fisheye": "fisheye"}  # config name -> renderer model


@dataclass
class Camera:
    """A camera: world -> camera `viewmat` (4, 4), and intrinsics by `model`: pinhole from the
    vertical FOV (f = H/2 / tan(fov/2)), fisheye (equidistant, r = f theta) with the vertical FOV
    across the height (f = H/2 / (fov/2)), ortho with `ortho_height` world units across the height."""

    viewmat: torch.Tensor  # (4, 4)
    width: int
    height: int
    fov_y_deg: float = 50.0
    model: str = "pinhole"  # pinhole | ortho | fisheye
    ortho_height: float = 2.0  # ortho: world units the image height spans

    @property
    def intrinsics(self) -> tuple[float, float, float, float]:
        if self.model == "ortho":
            f = self.height / self.ortho_height
        elif self.model == "fisheye":
            f = 0.5 * self.height / (math.radians(self.fov_y_deg) / 2)
        else:
            f = 0.5 * self.height / math.tan(math.radians(self.fov_y_deg) / 2)
        return (f, f, self.width / 2, self.height / 2)

    @property
    def position(self) -> torch.Tensor:
        return -self.viewmat[:3, :3].T @ self.viewmat[:3, 3]  # (3,)

    @staticmethod
    def look_at(eye: Vector, target: Vector, width: int, height: int, fov_y_deg: float = 50.0,
                up: Vector = DEFAULT_UP) -> "Camera":
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
    camera: str = "perspective"  # perspective | ortho | fisheye (equidistant)
    ortho_height: float | None = None  # ortho: world units across the height (None: framed like perspective)

    def check(self) -> None:
        for name in ("width", "height", "mode", "impl", "sh_degree", "camera"):  # the table's ranges and choices
            SPLAT_SETTINGS[name].check(getattr(self, name))
        top = 180.0 if self.camera == "fisheye" else 170.0
        if not 1.0 <= self.fov_y_deg <= top:
            raise StreamStudioError(f"field of view must be 1..{top:g} degrees")
        if self.ortho_height is not None and not (self.ortho_height > 0 and math.isfinite(self.ortho_height)):
            raise StreamStudioError("the orthographic view height must be a positive number of scene units")


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


def _up_basis(up: Vector) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    return with_camera_model(cam, cfg, fit)


def with_camera_model(cam: Camera, cfg: SplatRenderConfig, fit: SceneFit | None = None) -> Camera:
    """`cam` with the configured camera model. An orthographic view spans `cfg.ortho_height`, else
    what the perspective view spans at the depth of the scene centre (2 d tan(fov/2); the fitted
    distance when the centre is behind the camera), so switching model keeps the framing."""
    model = CAMERAS.get(cfg.camera, "pinhole")
    if model == "pinhole" and cam.model == "pinhole":
        return cam
    height = cfg.ortho_height
    if model == "ortho" and height is None:
        fit = fit or SceneFit()
        depth = float(cam.viewmat[2, :3] @ fit.center.to(cam.viewmat) + cam.viewmat[2, 3])
        if depth <= 1e-3 * fit.radius:
            depth = fit.distance(cam.fov_y_deg, cam.width / cam.height)
        height = 2 * depth * math.tan(math.radians(cam.fov_y_deg) / 2)
    return replace(cam, model=model, ortho_height=float(height or cam.ortho_height))


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


def _fly_point(fit: SceneFit, u: torch.Tensor, a: torch.Tensor, b: torch.Tensor, s: float) -> torch.Tensor:
    ang = 2 * math.pi * s
    r = 0.8 * fit.radius
    return fit.center + r * (math.cos(ang) * b + 0.6 * math.sin(ang) * a) + 0.25 * fit.radius * math.sin(2 * ang) * u


def _fly_camera(fit: SceneFit, cfg: SplatRenderConfig, s: float) -> Camera:
    """A figure flying a tilted ellipse through the scene, looking a little ahead and inward."""
    u, a, b = _up_basis(cfg.up)
    eye = _fly_point(fit, u, a, b, s)
    ahead = _fly_point(fit, u, a, b, s + 0.08)
    target = 0.6 * ahead + 0.4 * fit.center
    return with_camera_model(Camera.look_at(eye, target, cfg.width, cfg.height, cfg.fov_y_deg, cfg.up), cfg, fit)


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
                                   antialiased=scene.antialiased if cfg.antialiased is None else cfg.antialiased,
                                   camera_model=camera.model)
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


# ----------------------------------------------------------------------------- keyframed paths
#
# A fly-through users author: keyframes (camera pose, field of view, seconds along the path),
# interpolated smoothly: positions (and look-at targets, fields of view, 4D times) by a cubic
# Hermite spline with Catmull-Rom tangents over the keyframe times, rotations by squad (Shoemake's
# spherical quadrangle interpolation, slerp-based). Read from nerfstudio's camera_path.json and
# SuperSplat's camera animation (see `path_from_json`), written as nerfstudio's camera_path.json.

GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])  # camera axes: OpenGL (x right, y up, z back) <-> OpenCV
# SuperSplat's world = Rz(180) of the file's (splat-transform's Transform.PLY)
SUPERSPLAT_TO_FILE = np.diag([-1.0, -1.0, 1.0])


@dataclass
class Keyframe:
    """One authored camera: camera -> world (4, 4) with OpenCV axes, vertical FOV, when (seconds).

    `target` (3,), when set, is a look-at point (SuperSplat's poses): the path then interpolates
    position and target and looks from one at the other with the path's `up`."""

    c2w: np.ndarray  # (4, 4) float64
    fov_y_deg: float = 50.0
    time: float = 0.0  # seconds from the start of the path
    scene_time: float | None = None  # 4D scenes: normalised time 0..1 (nerfstudio's render_time)
    target: np.ndarray | None = None  # (3,)

    @staticmethod
    def from_camera(cam: Camera, time: float = 0.0) -> "Keyframe":
        return Keyframe(np.linalg.inv(cam.viewmat.double().numpy()), float(cam.fov_y_deg), float(time))


@dataclass
class KeyframePath:
    """Keyframes and how to play them; `width`, `height`, `fps` are the file's (None: not given)."""

    keyframes: list[Keyframe]
    seconds: float | None = None  # duration; default the last keyframe's time (loop: one more gap)
    loop: bool = False
    smoothness: float = 1.0  # tangent scale: 1 Catmull-Rom, 0 ease in/out at every key (SuperSplat's "smoothness")
    fps: float | None = None
    width: int | None = None
    height: int | None = None
    up: tuple[float, float, float] = DEFAULT_UP  # for look-at keyframes
    fov_long_side: bool = False  # the FOVs span the view's longer side (SuperSplat), not its height
    source: str = "keyframes"

    @property
    def duration(self) -> float:
        if self.seconds is not None:
            return float(self.seconds)
        times = [k.time for k in self.keyframes]
        if len(times) < 2:
            return 0.0
        return times[-1] - times[0] + ((times[-1] - times[0]) / (len(times) - 1) if self.loop else 0.0)

    def check(self) -> None:
        if not self.keyframes:
            raise StreamStudioError("the camera path has no keyframes; add at least one")
        times = [k.time for k in self.keyframes]
        if any(b <= a for a, b in zip(times, times[1:])):
            raise StreamStudioError("camera path keyframe times must increase")
        for k in self.keyframes:
            if k.c2w.shape != (4, 4) or not np.isfinite(k.c2w).all():
                raise StreamStudioError("a camera path keyframe has a bad camera matrix (need 4x4 finite numbers)")
            if abs(np.linalg.det(k.c2w[:3, :3]) - 1.0) > 1e-3 or not 0.1 <= k.fov_y_deg <= 179.0:
                raise StreamStudioError("a camera path keyframe has a matrix that is not a rotation, or a FOV "
                                        "outside 0.1..179 degrees")

    def sample(self, t: float) -> tuple[np.ndarray, float, float | None]:
        """(c2w (4, 4) OpenCV axes, vertical FOV, scene time or None) at `t` seconds."""
        self.check()
        keys = self.keyframes
        times = np.array([k.time for k in keys])
        if len(keys) == 1:
            k = keys[0]
            return _c2w_of(k, self.up), k.fov_y_deg, k.scene_time
        period = self.duration if self.loop else None
        if period is not None and period <= times[-1] - times[0]:
            period = None  # no room for the closing gap: play it open
        t = float(t)
        if period is not None:
            t = times[0] + (t - times[0]) % period
        fov = float(hermite(times, np.array([[k.fov_y_deg] for k in keys]), t, self.smoothness, period)[0])
        scene_times = [k.scene_time for k in keys]
        scene_t = None
        if all(s is not None for s in scene_times):
            scene_t = float(hermite(times, np.array([[s] for s in scene_times]), t, self.smoothness, period)[0])
        positions = np.stack([k.c2w[:3, 3] for k in keys])
        eye = hermite(times, positions, t, self.smoothness, period)
        targets = [k.target for k in keys if k.target is not None]
        if len(targets) == len(keys):
            target = hermite(times, np.stack(targets), t, self.smoothness, period)
            view = Camera.look_at(eye, target, 8, 8, fov, self.up).viewmat.double().numpy()
            return np.linalg.inv(view), fov, scene_t
        quats = np.stack([rotation_to_quat(k.c2w[:3, :3]) for k in keys])
        c2w = np.eye(4)
        c2w[:3, :3] = quat_to_rotation(squad_path(times, quats, t, period))
        c2w[:3, 3] = eye
        return c2w, fov, scene_t

    def frame_times(self, fps: float, frames: int | None = None) -> list[float]:
        """Seconds of each frame: `frames` (default duration x fps, at least 1) evenly over the path;
        a looping path stops one frame before it closes, an open one ends on its last keyframe."""
        start, dur = self.keyframes[0].time, self.duration
        n = frames if frames is not None else max(1, int(round(dur * fps)))
        if self.loop or frames is None:  # frames at i / fps, as nerfstudio renders them
            step = dur / n if frames is not None else 1.0 / fps
            return [start + i * step for i in range(n)]
        return [start + dur * i / max(n - 1, 1) for i in range(n)]

    def cameras(self, width: int, height: int, fps: float, frames: int | None = None,
                fov_scale: float = 1.0) -> list[tuple[Camera, float | None]]:
        """(camera, scene time or None) per frame."""
        out = []
        for t in self.frame_times(fps, frames):
            c2w, fov, scene_t = self.sample(t)
            view = torch.from_numpy(np.linalg.inv(c2w)).float()
            fov = vertical_fov(fov, width, height, self.fov_long_side)
            out.append((Camera(view, int(width), int(height), float(fov) * fov_scale), scene_t))
        return out


def _c2w_of(k: Keyframe, up: Vector) -> np.ndarray:
    if k.target is None:
        return k.c2w
    return np.linalg.inv(Camera.look_at(k.c2w[:3, 3], k.target, 8, 8, k.fov_y_deg, up).viewmat.double().numpy())


def _padded(times: np.ndarray, values: np.ndarray, period: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Times and values, for a loop with the last two keys before and the first two after (SuperSplat's
    `fromPointsLooping`), so the tangents wrap."""
    if period is None:
        return times, values
    times = np.concatenate([times[-2:] - period, times, times[:2] + period])
    values = np.concatenate([values[-2:], values, values[:2]])
    return times, values


def hermite(times: np.ndarray, values: np.ndarray, t: float, smoothness: float = 1.0,
            period: float | None = None) -> np.ndarray:
    """Cubic Hermite interpolation of values (K, D) at keyframe times (K,), tangents Catmull-Rom
    over non-uniform times, m_i = (p_{i+1} - p_{i-1}) / (t_{i+1} - t_{i-1}) (one-sided at open ends),
    times `smoothness` (0: zero tangents, easing in and out of every key). Clamped outside the keys;
    `period` wraps (a loop). The same spline as SuperSplat's `CubicSpline.fromPoints` /
    `fromPointsLooping`."""
    times, values = _padded(np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.float64), period)
    n = len(times)
    if t <= times[0]:
        return values[0].copy()
    if t >= times[-1]:
        return values[-1].copy()
    i = int(np.searchsorted(times, t, side="right")) - 1
    i = min(i, n - 2)

    def tangent(j):
        if j == 0:
            return (values[1] - values[0]) / (times[1] - times[0])
        if j == n - 1:
            return (values[j] - values[j - 1]) / (times[j] - times[j - 1])
        return (values[j + 1] - values[j - 1]) / (times[j + 1] - times[j - 1])

    h = times[i + 1] - times[i]
    s = (t - times[i]) / h
    m0, m1 = tangent(i) * h * smoothness, tangent(i + 1) * h * smoothness
    s2, s3 = s * s, s * s * s
    return ((2 * s3 - 3 * s2 + 1) * values[i] + (s3 - 2 * s2 + s) * m0 + (-2 * s3 + 3 * s2) * values[i + 1]
            + (s3 - s2) * m1)


# quaternions (w, x, y, z), float64 numpy

def rotation_to_quat(r: np.ndarray) -> np.ndarray:
    """(3, 3) rotation -> unit quaternion (w, x, y, z), w >= 0 (Shepperd's method)."""
    m = np.asarray(r, dtype=np.float64)
    tr = np.trace(m)
    if tr > 0:
        s = 2.0 * math.sqrt(tr + 1.0)
        q = np.array([0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s])
    else:
        i = int(np.argmax(np.diag(m)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * math.sqrt(max(1.0 + m[i, i] - m[j, j] - m[k, k], 1e-300))
        q = np.zeros(4)
        q[0] = (m[k, j] - m[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (m[j, i] + m[i, j]) / s
        q[1 + k] = (m[k, i] + m[i, k]) / s
    q /= np.linalg.norm(q)
    return -q if q[0] < 0 else q


def quat_to_rotation(q: np.ndarray) -> np.ndarray:
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def _qmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2])


def _qconj(q: np.ndarray) -> np.ndarray:
    return q * np.array([1.0, -1.0, -1.0, -1.0])


def _qlog(q: np.ndarray) -> np.ndarray:
    """log of a unit quaternion: (0, v) with |v| the half angle."""
    v = q[1:]
    n = np.linalg.norm(v)
    if n < 1e-15:
        return np.zeros(4)
    return np.concatenate([[0.0], v / n * math.atan2(n, q[0])])


def _qexp(q: np.ndarray) -> np.ndarray:
    v = q[1:]
    n = np.linalg.norm(v)
    if n < 1e-15:
        return np.array([1.0, 0.0, 0.0, 0.0])
    return np.concatenate([[math.cos(n)], v / n * math.sin(n)])


def slerp(a: np.ndarray, b: np.ndarray, s: float) -> np.ndarray:
    """Spherical linear interpolation of unit quaternions (the short way when a . b >= 0)."""
    d = float(np.clip(np.dot(a, b), -1.0, 1.0))
    if d > 1 - 1e-12:
        q = a + s * (b - a)
        return q / np.linalg.norm(q)
    th = math.acos(d)
    return (math.sin((1 - s) * th) * a + math.sin(s * th) * b) / math.sin(th)


def squad_path(times: np.ndarray, quats: np.ndarray, t: float, period: float | None = None) -> np.ndarray:
    """Squad through unit quaternions (K, 4) at keyframe times: slerp(slerp(q_i, q_i+1, s),
    slerp(a_i, a_i+1, s), 2 s (1 - s)) with a_i = q_i exp(-(log(q_i^-1 q_i+1) + log(q_i^-1 q_i-1)) / 4)
    (a_i = q_i at open ends). Each quaternion is first put on its predecessor's hemisphere."""
    quats = np.array(quats, dtype=np.float64)
    for i in range(1, len(quats)):
        if np.dot(quats[i - 1], quats[i]) < 0:
            quats[i] = -quats[i]
    times, quats = _padded(np.asarray(times, dtype=np.float64), quats, period)
    for i in range(1, len(quats)):
        if np.dot(quats[i - 1], quats[i]) < 0:
            quats[i] = -quats[i]
    n = len(times)
    if t <= times[0]:
        return quats[0]
    if t >= times[-1]:
        return quats[-1]
    i = min(int(np.searchsorted(times, t, side="right")) - 1, n - 2)

    def inner(j):
        if j == 0 or j == n - 1:
            return quats[j]
        inv = _qconj(quats[j])
        return _qmul(quats[j], _qexp(-0.25 * (_qlog(_qmul(inv, quats[j + 1])) + _qlog(_qmul(inv, quats[j - 1])))))

    s = (t - times[i]) / (times[i + 1] - times[i])
    q = slerp(slerp(quats[i], quats[i + 1], s), slerp(inner(i), inner(i + 1), s), 2 * s * (1 - s))
    return q / np.linalg.norm(q)


# file formats (dicts; the app reads and writes the files)

def path_from_json(data: dict, name: str = "the camera path", prefer: str = "frames") -> KeyframePath:
    """A camera path from a parsed JSON document:

    * nerfstudio's camera_path.json (its viewer's "Generate Command"): `camera_path` (the frames
      ns-render renders: `camera_to_world` row-major 4x4 with OpenGL camera axes, `fov` vertical
      degrees, `aspect`, optional `render_time`), `keyframes` (`matrix`, same axes, `fov`),
      `render_width`/`render_height`, `fps`, `seconds`, `is_cycle`. With prefer="frames" the frames
      are the keys (so sampling at the file's fps gives them back exactly); with "keyframes" (or
      no frames) the keyframes, spread evenly over `seconds`.
    * SuperSplat's camera animation: the viewer export's settings (`animTracks[0]`: `frameRate`,
      `duration` seconds, `loopMode`, `smoothness`, `keyframes.times` in frames and
      `keyframes.values.position` / `target` / `fov` flat lists) or a project's document.json
      (`poseSets[0].poses` with `frame`, `position`, `target`, `fov`, and `timeline`).
      Positions are in SuperSplat's world, the file's rotated 180 degrees about z; the camera looks
      from position at target, up the file's -y; `fov` spans the longer side of the view
      (SuperSplat sets PlayCanvas's horizontalFov when the view is wider than tall)."""
    if not isinstance(data, dict):
        raise StreamStudioError(f"{name}: not a camera path (expected a JSON object)")
    try:
        if "camera_path" in data or ("keyframes" in data and isinstance(data["keyframes"], list)):
            return _nerfstudio_path(data, prefer)
        if "animTracks" in data:
            return _supersplat_track(data)
        if "poseSets" in data:
            return _supersplat_document(data)
    except StreamStudioError as exc:
        raise StreamStudioError(f"{name}: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise StreamStudioError(f"{name}: malformed camera path ({type(exc).__name__}: {exc})") from None
    raise StreamStudioError(f"{name}: not a camera path: expected nerfstudio's camera_path.json (camera_path / "
                            "keyframes) or SuperSplat's animation (animTracks, or a project's poseSets)")


def _matrix(values: Sequence[float] | np.ndarray) -> np.ndarray:
    m = np.asarray(values, dtype=np.float64).reshape(4, 4)  # row-major
    return m @ GL_TO_CV  # OpenGL camera axes -> OpenCV


def _nerfstudio_path(data: dict, prefer: str) -> KeyframePath:
    frames, keys = data.get("camera_path") or [], data.get("keyframes") or []
    camera_type = str(data.get("camera_type", "perspective")).lower()
    if camera_type not in ("perspective", "pinhole"):
        raise StreamStudioError(f"camera_type {camera_type!r} is not supported; use a perspective path")
    fps = float(data["fps"]) if data.get("fps") else None
    seconds = float(data["seconds"]) if data.get("seconds") else None
    loop = bool(data.get("is_cycle", False))
    common = dict(fps=fps, width=_int_or_none(data.get("render_width")), height=_int_or_none(data.get("render_height")),
                  source="nerfstudio")
    if frames and (prefer == "frames" or len(keys) < 1):
        rate = len(frames) / seconds if seconds else (fps or 24.0)
        kf = [Keyframe(_matrix(f["camera_to_world"]), float(f.get("fov", 50.0)), i / rate,
                       _float_or_none(f.get("render_time"))) for i, f in enumerate(frames)]
        return KeyframePath(kf, seconds=len(frames) / rate, loop=loop, **common)
    if not keys:
        raise StreamStudioError("no camera_path frames and no keyframes")
    default_fov = float(data.get("default_fov", 50.0))
    n = len(keys)
    span = seconds if seconds else float(data.get("default_transition_sec", 2.0)) * (n if loop else max(n - 1, 1))
    kf = [Keyframe(_matrix(k["matrix"]), float(k.get("fov", default_fov)), span * i / (n if loop else max(n - 1, 1)),
                   _float_or_none(k.get("render_time"))) for i, k in enumerate(keys)]
    return KeyframePath(kf, seconds=span, loop=loop, smoothness=1.0, **common)


def _int_or_none(v):
    return int(v) if v not in (None, "") else None


def _float_or_none(v):
    return float(v) if v is not None else None


def _supersplat_keys(times_frames: Sequence[float], positions: np.ndarray | Sequence[Vector],
                     targets: np.ndarray | Sequence[Vector], fovs: Sequence[float], rate: float) -> list[Keyframe]:
    order = np.argsort(np.asarray(times_frames, dtype=np.float64), kind="stable")
    keys = []
    for i in order:
        eye = SUPERSPLAT_TO_FILE @ np.asarray(positions[i], dtype=np.float64)
        target = SUPERSPLAT_TO_FILE @ np.asarray(targets[i], dtype=np.float64)
        c2w = np.eye(4)
        c2w[:3, 3] = eye
        keys.append(Keyframe(c2w, float(fovs[i]), float(times_frames[i]) / rate, target=target))
    return keys


def _supersplat_track(data: dict) -> KeyframePath:
    tracks = data["animTracks"]
    if not tracks:
        raise StreamStudioError("animTracks is empty: export the viewer with its animation on")
    track = tracks[0]
    rate = float(track.get("frameRate", 30))
    kf, vals = track["keyframes"], track["keyframes"]["values"]
    times = list(kf["times"])
    n = len(times)
    pos = np.asarray(vals["position"], dtype=np.float64).reshape(n, 3)
    tgt = np.asarray(vals["target"], dtype=np.float64).reshape(n, 3)
    fov = list(vals.get("fov") or [60.0] * n)
    loop = track.get("loopMode", "none") != "none"
    duration = float(track["duration"]) if track.get("duration") else None
    smooth = float(track.get("smoothness", 1.0)) if track.get("interpolation", "spline") == "spline" else 0.0
    return KeyframePath(_supersplat_keys(times, pos, tgt, fov, rate), seconds=duration, loop=loop, smoothness=smooth,
                        fps=rate, fov_long_side=True, source="supersplat")


def _supersplat_document(data: dict) -> KeyframePath:
    sets = data["poseSets"]
    if not sets or not sets[0].get("poses"):
        raise StreamStudioError("the project has no camera poses")
    timeline = data.get("timeline") or {}
    rate = float(timeline.get("frameRate", 30))
    frames = float(timeline.get("frames", 180))
    fov_default = float((data.get("camera") or {}).get("fov", 60.0))
    poses = [p for i, p in enumerate(sets[0]["poses"])]
    times = [float(p.get("frame", i * rate)) for i, p in enumerate(poses)]
    keep = [i for i, t in enumerate(times) if t < frames]  # SuperSplat drops keys past the timeline's end
    poses, times = [poses[i] for i in keep], [times[i] for i in keep]
    return KeyframePath(_supersplat_keys(times, [p["position"] for p in poses], [p["target"] for p in poses],
                                         [p.get("fov", fov_default) for p in poses], rate),
                        seconds=frames / rate, loop=bool(timeline.get("loop", True)),
                        smoothness=float(timeline.get("smoothness", 1.0)), fps=rate, fov_long_side=True,
                        source="supersplat")


def vertical_fov(fov_deg: float, width: int, height: int, long_side: bool) -> float:
    """The vertical FOV of a view whose `fov_deg` spans its longer side (long_side) or its height."""
    if not long_side or width <= height:
        return fov_deg
    return math.degrees(2 * math.atan(math.tan(math.radians(fov_deg) / 2) * height / width))


def path_to_nerfstudio(path: KeyframePath, width: int, height: int, fps: float,
                       time_range: tuple[float, float] | None = None) -> dict:
    """nerfstudio's camera_path.json for a path of pose keyframes: its `keyframes` (what its viewer
    loads back) and the `camera_path` frames at `fps` (what ns-render renders)."""
    path.check()
    aspect = width / height
    n = len(path.keyframes)
    seconds = path.duration if n > 1 else 1.0 / fps
    keys = []
    for k in path.keyframes:
        entry = {"matrix": (_c2w_of(k, path.up) @ GL_TO_CV).reshape(-1).tolist(), "fov": k.fov_y_deg,
                 "aspect": aspect, "override_transition_enabled": False, "override_transition_sec": None}
        if k.scene_time is not None:
            entry["render_time"], entry["override_time_enabled"] = k.scene_time, True
        keys.append(entry)
    frames = []
    for t in path.frame_times(fps):
        c2w, fov, scene_t = path.sample(t)
        entry = {"camera_to_world": (c2w @ GL_TO_CV).reshape(-1).tolist(), "fov": fov, "aspect": aspect}
        if scene_t is not None:
            entry["render_time"] = scene_t
        frames.append(entry)
    return {"default_fov": path.keyframes[0].fov_y_deg,
            "default_transition_sec": seconds / (n if path.loop else max(n - 1, 1)),
            "keyframes": keys, "camera_type": "perspective", "render_height": int(height),
            "render_width": int(width), "fps": fps, "seconds": seconds, "is_cycle": bool(path.loop),
            "smoothness_value": 0.5, "camera_path": frames}
