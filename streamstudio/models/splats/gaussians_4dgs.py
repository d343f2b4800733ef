"""Checkpoints of the reference 4D Gaussian splatting code (fudan-zvg/4d-gaussian-splatting,
Yang et al., "Real-time photorealistic dynamic scene representation and rendering with 4D
Gaussian splatting", ICLR 2024) read into a StreamStudio 4D `GaussianScene`.

Its trainer saves `torch.save((gaussians.capture(), iteration), "chkpnt*.pth")`; for a 4D
model `capture()` is the tuple

    (active_sh_degree, xyz, features_dc, features_rest, scaling, rotation, opacity, max_radii2D,
     xyz_gradient_accum, t_gradient_accum, denom, optimizer_state, spatial_lr_scale,
     t, scaling_t, rotation_r, rot_4d, env_map, active_sh_degree_t)

read here with `torch.load(..., weights_only=True)`: tensors and plain containers only, never
a full unpickle of a file a user supplied.

Conventions, from its `scene/gaussian_model.py` and `utils/general_utils.py`:
- `rot_4d` true: the 4D rotation is `(M_l(rotation) @ M_r(rotation_r)).flip(1, 2)` over
  (x, y, z, t) and the 4D covariance `R S S^T R^T`, S = exp(scaling ++ scaling_t). Ours is
  `M_l(quats) @ M_r(quats_r)` without the flip (`gaussians.rotation_4d`), so its rotation
  matrix is decomposed again into our left and right quaternions (`isoclinic_quaternions`);
  for unit quaternions this is rotation -> (w, -x, y, -z), rotation_r -> (w, x, -y, -z).
- `rot_4d` false: a 3DGS spatial covariance (rotation, scaling) and no space-time coupling;
  the time marginal uses exp(scaling_t) as the time *variance* (`get_cov_t`), so our log time
  standard deviation is scaling_t / 2.
- Colour: spatial SH of degree `active_sh_degree` in the 3DGS basis; with `sh_degree_t` > 0
  further coefficients multiply cos(2 pi k t / duration) (time-dependent colour). We keep the
  time-independent term and say what was dropped. Its `prefilter_var` (off by default) and
  `env_map` are not part of the scene.
"""

from __future__ import annotations

import logging
import pickle
import zipfile
from pathlib import Path

import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.splats.gaussian_scene import GaussianScene, rotation_4d

log = logging.getLogger(__name__)

CAPTURE_4D_LENGTH = 19
CAPTURE_3D_LENGTH = 12


def read_4dgs_checkpoint(path: str | Path) -> tuple[GaussianScene, list[str]]:
    """(scene, notes on what was not kept) of a fudan-zvg 4D Gaussian splatting checkpoint."""
    path = Path(path)
    capture = _capture(path)
    if len(capture) == CAPTURE_3D_LENGTH:
        raise StreamStudioError(f"{path}: a 3D checkpoint of the 4D Gaussian code (gaussian_dim 3); export it as a "
                                "3DGS .ply with that code, or train with gaussian_dim 4")
    if len(capture) != CAPTURE_4D_LENGTH:
        raise StreamStudioError(f"{path}: not a checkpoint of fudan-zvg/4d-gaussian-splatting (its model state "
                                f"has {len(capture)} entries, a 4D one has {CAPTURE_4D_LENGTH})")
    (sh_degree, xyz, f_dc, f_rest, scaling, rotation, opacity, *_unused, t, scaling_t, rotation_r, rot_4d,
     _env_map, sh_degree_t) = capture
    tensors = {"xyz": xyz, "features_dc": f_dc, "features_rest": f_rest, "scaling": scaling, "rotation": rotation,
               "opacity": opacity, "t": t, "scaling_t": scaling_t, "rotation_r": rotation_r}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise StreamStudioError(f"{path}: its {name} is not a tensor; is this a 4D Gaussian checkpoint?")
    n = xyz.shape[0]
    shapes = {"xyz": (n, 3), "scaling": (n, 3), "rotation": (n, 4), "opacity": (n, 1), "t": (n, 1),
              "scaling_t": (n, 1)}
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise StreamStudioError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
    sh, notes = _spatial_sh(path, f_dc, f_rest, int(sh_degree), int(sh_degree_t or 0))
    quats, quats_r, t_log_scales = _rotation(bool(rot_4d), rotation.float(), rotation_r.float(), scaling_t.float())
    scene = GaussianScene(means=xyz.float(), quats=quats, log_scales=scaling.float(),
                          opacity_logits=opacity.float()[:, 0], sh=sh, t_centers=t.float()[:, 0],
                          t_log_scales=t_log_scales, quats_r=quats_r)
    for note in notes:
        log.warning("%s: %s", path.name, note)
    return scene, notes


def _capture(path: Path) -> tuple:
    if not zipfile.is_zipfile(path):
        raise StreamStudioError(f"{path}: not a readable torch checkpoint (torch.save writes a zip archive); give a "
                                "chkpnt*.pth of fudan-zvg/4d-gaussian-splatting")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise StreamStudioError(f"{path}: holds objects other than tensors and plain containers, which are not "
                                f"loaded (no full unpickle of a file from elsewhere): {str(exc).splitlines()[0]}")
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise StreamStudioError(f"{path}: not a readable torch checkpoint ({exc})") from exc
    if isinstance(saved, (tuple, list)) and len(saved) == 2 and isinstance(saved[0], (tuple, list)):
        saved = saved[0]  # (capture(), iteration)
    if not isinstance(saved, (tuple, list)):
        raise StreamStudioError(f"{path}: not a checkpoint of fudan-zvg/4d-gaussian-splatting "
                                "(expected the tuple its trainer saves)")
    return tuple(saved)


def _spatial_sh(path: Path, f_dc: torch.Tensor, f_rest: torch.Tensor, degree: int, degree_t: int):
    """(N, (degree + 1)^2, 3) spatial SH, and what was dropped."""
    if not 0 <= degree <= 3:
        raise StreamStudioError(f"{path}: SH degree {degree}; degrees 0 to 3 are supported")
    features = torch.cat([f_dc, f_rest], dim=1).float()  # (N, K, 3)
    keep = (degree + 1) ** 2
    if features.dim() != 3 or features.shape[2] != 3 or features.shape[1] < keep:
        raise StreamStudioError(f"{path}: SH features of shape {tuple(features.shape)} do not hold degree {degree}")
    notes = []
    if degree_t > 0:
        notes.append(f"its colour changes with time (4D SH, time degree {degree_t}); the time-independent "
                     f"term is kept and {features.shape[1] - keep} coefficient(s) per channel are dropped")
    return features[:, :keep].contiguous(), notes


def _rotation(rot_4d: bool, rotation: torch.Tensor, rotation_r: torch.Tensor, scaling_t: torch.Tensor):
    """(our left quaternions, our right quaternions, log time standard deviations)."""
    if rot_4d:
        theirs = rotation_4d(rotation, rotation_r).flip(1, 2)  # their matrix over (x, y, z, t)
        t_log = scaling_t[:, 0]
    else:
        theirs = torch.zeros(rotation.shape[0], 4, 4)
        theirs[:, :3, :3] = _rotation_3d(rotation)
        theirs[:, 3, 3] = 1.0
        t_log = 0.5 * scaling_t[:, 0]  # exp(scaling_t) is its time variance
    left, right = isoclinic_quaternions(theirs)
    return left, right, t_log


def _rotation_3d(q: torch.Tensor) -> torch.Tensor:
    """(N, 4) quaternions, w first -> (N, 3, 3) rotations (the 3DGS convention)."""
    w, x, y, z = torch.nn.functional.normalize(q, dim=-1).unbind(-1)
    return torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(-1, 3, 3)


def isoclinic_quaternions(rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 4, 4) rotations of R^4 -> unit quaternions (l, r), w first, with
    `gaussians.rotation_4d(l, r)` equal to them (each 4D rotation is a left times a right
    isoclinic rotation, unique up to the sign of both).

    The product is bilinear: rotation_4d(l, r) = Phi(l r^T) for a fixed invertible linear map
    Phi of the 16 entries of the outer product; l r^T is then recovered as Phi^-1(rot), a
    rank-one matrix whose factors are l and r."""
    phi = _phi().to(rot.dtype)  # (16, 16): outer-product entries -> rotation entries
    outer = torch.linalg.solve(phi, rot.reshape(-1, 16).T).T.reshape(-1, 4, 4)  # (N, 4, 4) = l r^T
    u, s, vh = torch.linalg.svd(outer)
    left = u[:, :, 0] * s[:, :1].sqrt()
    right = vh[:, 0, :] * s[:, :1].sqrt()
    sign = torch.where(left[:, :1] < 0, -1.0, 1.0).to(rot.dtype)  # w >= 0 on the left; (l, r) ~ (-l, -r)
    return torch.nn.functional.normalize(left * sign, dim=-1), torch.nn.functional.normalize(right * sign, dim=-1)


def _phi() -> torch.Tensor:
    eye = torch.eye(4, dtype=torch.float64)
    columns = [rotation_4d(eye[i:i + 1], eye[j:j + 1])[0].reshape(16) for i in range(4) for j in range(4)]
    return torch.stack(columns, dim=1)  # column i*4+j: the image of e_i e_j^T
