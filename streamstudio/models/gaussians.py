"""Gaussian scenes: the in-memory dataclass, file I/O and 4D time slicing.

Formats
-------
* 3DGS `.ply` (binary little endian): per Gaussian `x y z nx ny nz f_dc_0..2 f_rest_0..M-1
  opacity scale_0..2 rot_0..3` as float32, with M = 3 * ((d + 1)^2 - 1) for SH degree d in
  0..3 (45 for degree 3, i.e. 62 floats). `f_rest` is channel-major: index c * (K - 1) + (k - 1)
  holds channel c of coefficient k, K = (d + 1)^2. Scales are log, opacity is a logit,
  `rot` is a quaternion w first (not necessarily normalised).
* antimatter15 `.splat`: 32 bytes per Gaussian: position 3 x float32, linear scale 3 x float32,
  RGBA 4 x uint8 (rgb = (0.5 + C0 * f_dc) * 255, a = sigmoid(opacity) * 255), rotation
  4 x uint8 (q / |q| * 128 + 128, w first). Degree-0 colour only.
* StreamStudio 4D `.ply`: the 3DGS `.ply` plus four extra float32 properties per Gaussian,
  `t` (time centre), `t_scale` (log of the time standard deviation) and `rotr_0..3` (the right
  quaternion of the 4D rotation, w first; `rot_0..3` is the left one), and the header comment
  `comment streamstudio-4dgs 1`. The 4D covariance is R S S^T R^T with R = L(rot) R(rotr) over
  (x, y, z, t) and S = diag(exp(scale_0..2), exp(t_scale)), as in Yang et al. 2024 (4DGS).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from streamstudio.errors import StreamStudioError

SH_C0 = 0.28209479177387814
PLY_TYPES = {"float": "<f4", "float32": "<f4", "double": "<f8", "float64": "<f8", "uchar": "u1",
             "uint8": "u1", "char": "i1", "int8": "i1", "short": "<i2", "int16": "<i2", "ushort": "<u2",
             "uint16": "<u2", "int": "<i4", "int32": "<i4", "uint": "<u4", "uint32": "<u4"}
FOURD_COMMENT = "streamstudio-4dgs 1"
BYTES_PER_GAUSSIAN_IN_MEMORY = 4 * (3 + 4 + 3 + 1 + 48 + 9)  # float32 fields once loaded, with covariances


@dataclass
class GaussianScene:
    """A 3D (or 4D) Gaussian scene, in the raw parameters of the 3DGS files.

    `covars`, when set (a 4D time slice), replaces quats and log_scales as the 3D covariance.
    """

    means: torch.Tensor  # (N, 3) world positions
    quats: torch.Tensor  # (N, 4) rotation quaternions, w first, not necessarily normalised
    log_scales: torch.Tensor  # (N, 3) log standard deviations
    opacity_logits: torch.Tensor  # (N,) logit of the opacity
    sh: torch.Tensor  # (N, K, 3) SH coefficients, K = (degree + 1)^2, sh[:, 0] the DC term
    t_centers: torch.Tensor | None = None  # (N,) 4D only: time centre
    t_log_scales: torch.Tensor | None = None  # (N,) 4D only: log time standard deviation
    quats_r: torch.Tensor | None = None  # (N, 4) 4D only: right quaternion of the 4D rotation
    covars: torch.Tensor | None = None  # (N, 3, 3) explicit 3D covariance (time slices)
    opacity_scale: torch.Tensor | None = None  # (N,) time-slice marginal multiplying the opacity

    def __len__(self) -> int:
        return int(self.means.shape[0])

    @property
    def sh_degree(self) -> int:
        return int(round(math.sqrt(self.sh.shape[1]))) - 1

    @property
    def is_4d(self) -> bool:
        return self.t_centers is not None

    @property
    def time_range(self) -> tuple[float, float]:
        """(earliest, latest) time a Gaussian is centred at; (0, 0) for a 3D scene."""
        if not self.is_4d or len(self) == 0:
            return (0.0, 0.0)
        return (float(self.t_centers.min()), float(self.t_centers.max()))

    def opacities(self) -> torch.Tensor:
        """(N,) activated opacity in [0, 1] (times the time marginal for a slice)."""
        o = torch.sigmoid(self.opacity_logits)
        return o if self.opacity_scale is None else o * self.opacity_scale

    def scales(self) -> torch.Tensor:
        return torch.exp(self.log_scales)  # (N, 3)

    def bounds(self, quantile: float = 0.02) -> tuple[torch.Tensor, torch.Tensor]:
        """Robust axis-aligned bounds (lo, hi) of the means, ignoring the outer quantiles."""
        if len(self) == 0:
            return torch.zeros(3), torch.zeros(3)
        m = self.means.float()
        return torch.quantile(m, quantile, dim=0), torch.quantile(m, 1 - quantile, dim=0)

    def subset(self, mask: torch.Tensor) -> "GaussianScene":
        """The Gaussians where `mask` (N,) is true (or the given indices)."""
        pick = {k: (None if v is None else v[mask]) for k, v in self._fields().items()}
        return GaussianScene(**pick)

    def _fields(self) -> dict:
        return {k: getattr(self, k) for k in ("means", "quats", "log_scales", "opacity_logits", "sh",
                                               "t_centers", "t_log_scales", "quats_r", "covars",
                                               "opacity_scale")}


def _err(path, what: str) -> StreamStudioError:
    return StreamStudioError(f"{path}: {what}")


def load_scene(path: str | os.PathLike, max_gaussians: int | None = None) -> GaussianScene:
    """Read a `.ply` (3DGS or StreamStudio 4D) or `.splat` file; bad files raise StreamStudioError."""
    path = Path(path)
    if not path.is_file():
        raise _err(path, "no such file; give the path of a .ply or .splat Gaussian scene")
    suffix = path.suffix.lower()
    if suffix == ".ply":
        scene = read_ply(path, max_gaussians)
    elif suffix == ".splat":
        scene = read_splat(path, max_gaussians)
    else:
        raise _err(path, f"unknown scene format {suffix!r}; use a 3DGS .ply or an antimatter15 .splat")
    return scene


def save_scene(scene: GaussianScene, path: str | os.PathLike) -> None:
    path = Path(path)
    if path.suffix.lower() == ".splat":
        write_splat(scene, path)
    elif path.suffix.lower() == ".ply":
        write_ply(scene, path)
    else:
        raise _err(path, "scenes are saved as .ply or .splat")


def _check_memory(path, n: int, max_gaussians: int | None) -> None:
    if max_gaussians is not None and n > max_gaussians:
        raise _err(path, f"{n} Gaussians is more than the limit of {max_gaussians}")
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    need = n * BYTES_PER_GAUSSIAN_IN_MEMORY * 3  # the file, the tensors and the renderer's copies
    if need > available:
        raise _err(path, f"{n} Gaussians need about {need / 2**30:.1f} GiB but only "
                         f"{available / 2**30:.1f} GiB of memory is free; use a smaller scene")


def _read_ply_header(path: Path, f) -> tuple[int, list[tuple[str, str]], list[str]]:
    first = f.readline()
    if first.strip() != b"ply":
        raise _err(path, "not a PLY file (first line is not 'ply')")
    n, props, comments, in_vertex, seen_vertex = None, [], [], False, False
    for _ in range(10000):
        raw = f.readline()
        if not raw:
            raise _err(path, "truncated PLY header (no end_header)")
        line = raw.decode("ascii", errors="replace").strip()
        words = line.split()
        if not words:
            continue
        if words[0] == "end_header":
            break
        if words[0] == "format" and words[1:2] != ["binary_little_endian"]:
            raise _err(path, f"PLY format {' '.join(words[1:])!r} is not supported; save as binary_little_endian")
        if words[0] == "comment":
            comments.append(" ".join(words[1:]))
        if words[0] == "element":
            if len(words) != 3:
                raise _err(path, f"bad PLY header line {line!r}: expected 'element NAME COUNT'")
            in_vertex = words[1] == "vertex"
            if in_vertex:
                if seen_vertex:
                    raise _err(path, "PLY header has two 'element vertex' lines; the file is corrupt")
                n, seen_vertex = _ply_count(path, words[2]), True
            elif not seen_vertex:
                raise _err(path, "PLY element before 'vertex' is not supported")
            else:
                _ply_count(path, words[2])
        if words[0] == "property" and in_vertex:
            if len(words) >= 2 and (words[1] == "list" or words[1] not in PLY_TYPES):
                raise _err(path, f"unsupported PLY property type {' '.join(words[1:])!r}")
            if len(words) != 3:
                raise _err(path, f"bad PLY header line {line!r}: expected 'property TYPE NAME'")
            if any(name == words[2] for name, _ in props):
                raise _err(path, f"PLY property {words[2]!r} is declared twice; the file is corrupt")
            props.append((words[2], PLY_TYPES[words[1]]))
    else:
        raise _err(path, "PLY header too long")
    if n is None:
        raise _err(path, "PLY has no 'element vertex' (not a Gaussian scene)")
    if not props:
        raise _err(path, "PLY 'element vertex' has no properties; not a 3DGS Gaussian scene")
    return n, props, comments


def _ply_count(path: Path, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise _err(path, f"bad PLY element count {text!r}; it must be a whole number >= 0 (the file is corrupt)")
    return n


def read_ply(path: str | os.PathLike, max_gaussians: int | None = None) -> GaussianScene:
    """Read a 3DGS `.ply` of SH degree 0..3 (and the StreamStudio 4D extension)."""
    path = Path(path)
    with open(path, "rb") as f:
        n, props, _comments = _read_ply_header(path, f)
        dtype = np.dtype(props)
        _check_memory(path, n, max_gaussians)
        data_bytes = path.stat().st_size - f.tell()
        if data_bytes < n * dtype.itemsize:
            raise _err(path, f"truncated: header says {n} Gaussians ({n * dtype.itemsize} bytes) "
                             f"but only {data_bytes} bytes follow")
        data = np.fromfile(f, dtype=dtype, count=n)
    names = set(dtype.names)
    need = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
            "rot_0", "rot_1", "rot_2", "rot_3"]
    missing = [p for p in need if p not in names]
    if missing:
        raise _err(path, f"missing PLY properties {missing}; not a 3DGS Gaussian scene")
    n_rest = sum(1 for p in names if p.startswith("f_rest_"))
    if n_rest not in (0, 9, 24, 45) or any(f"f_rest_{i}" not in names for i in range(n_rest)):
        raise _err(path, f"{n_rest} f_rest properties; a 3DGS scene has 0, 9, 24 or 45 (SH degree 0..3)")

    def cols(keys: list[str]) -> torch.Tensor:
        arr = np.stack([data[k].astype(np.float32) for k in keys], axis=-1) if keys else np.zeros((n, 0), np.float32)
        return torch.from_numpy(np.ascontiguousarray(arr))

    k_rest = n_rest // 3
    dc = cols(["f_dc_0", "f_dc_1", "f_dc_2"])  # (N, 3)
    rest = cols([f"f_rest_{i}" for i in range(n_rest)]).reshape(n, 3, k_rest).transpose(1, 2)  # (N, K-1, 3)
    scene = GaussianScene(
        means=cols(["x", "y", "z"]), quats=cols([f"rot_{i}" for i in range(4)]),
        log_scales=cols([f"scale_{i}" for i in range(3)]), opacity_logits=cols(["opacity"])[:, 0].contiguous(),
        sh=torch.cat([dc[:, None], rest], dim=1).contiguous())
    if "t" in names:
        fourd = ["t", "t_scale", "rotr_0", "rotr_1", "rotr_2", "rotr_3"]
        if any(p not in names for p in fourd):
            raise _err(path, f"4D scene lacks some of the properties {fourd}")
        scene.t_centers = cols(["t"])[:, 0].contiguous()
        scene.t_log_scales = cols(["t_scale"])[:, 0].contiguous()
        scene.quats_r = cols([f"rotr_{i}" for i in range(4)])
    _check_finite(path, scene)
    return scene


def _check_finite(path, scene: GaussianScene) -> None:
    for name, value in scene._fields().items():
        if value is not None and not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).reshape(len(scene), -1).any(dim=1).sum())
            raise _err(path, f"{bad} Gaussians have NaN or infinite {name}; the file is corrupt")
    if len(scene) and (scene.quats.norm(dim=-1) == 0).any():
        raise _err(path, "some rotation quaternions are all zero; the file is corrupt")


def write_ply(scene: GaussianScene, path: str | os.PathLike) -> None:
    """Write the 3DGS `.ply` layout (and the 4D extension for a 4D scene)."""
    n, k = len(scene), scene.sh.shape[1]
    columns: list[tuple[str, np.ndarray]] = []
    add = lambda name, t: columns.append((name, t.detach().float().cpu().numpy()))  # noqa: E731
    for i, axis in enumerate("xyz"):
        add(axis, scene.means[:, i])
    for name in ("nx", "ny", "nz"):
        columns.append((name, np.zeros(n, np.float32)))
    for c in range(3):
        add(f"f_dc_{c}", scene.sh[:, 0, c])
    rest = scene.sh[:, 1:].transpose(1, 2).reshape(n, 3 * (k - 1))  # channel-major
    for i in range(3 * (k - 1)):
        add(f"f_rest_{i}", rest[:, i])
    add("opacity", scene.opacity_logits)
    for i in range(3):
        add(f"scale_{i}", scene.log_scales[:, i])
    for i in range(4):
        add(f"rot_{i}", scene.quats[:, i])
    if scene.is_4d:
        add("t", scene.t_centers)
        add("t_scale", scene.t_log_scales)
        for i in range(4):
            add(f"rotr_{i}", scene.quats_r[:, i])
    arr = np.empty(n, dtype=[(name, "<f4") for name, _ in columns])
    for name, values in columns:
        arr[name] = values
    header = ["ply", "format binary_little_endian 1.0"]
    if scene.is_4d:
        header.append(f"comment {FOURD_COMMENT}")
    header += [f"element vertex {n}"] + [f"property float {name}" for name, _ in columns] + ["end_header"]
    with open(path, "wb") as f:
        f.write(("\n".join(header) + "\n").encode("ascii"))
        arr.tofile(f)


SPLAT_DTYPE = np.dtype([("pos", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)])


def read_splat(path: str | os.PathLike, max_gaussians: int | None = None) -> GaussianScene:
    """Read antimatter15's `.splat` (32 bytes per Gaussian, degree-0 colour)."""
    path = Path(path)
    size = path.stat().st_size
    if size % SPLAT_DTYPE.itemsize:
        raise _err(path, f"truncated or not a .splat: {size} bytes is not a multiple of 32")
    n = size // SPLAT_DTYPE.itemsize
    _check_memory(path, n, max_gaussians)
    data = np.fromfile(path, dtype=SPLAT_DTYPE, count=n)
    rgba = data["rgba"].astype(np.float32) / 255.0  # (N, 4)
    scale = data["scale"].astype(np.float32)
    if not np.isfinite(scale).all() or not np.isfinite(data["pos"]).all():
        raise _err(path, "NaN or infinite positions or scales; the file is corrupt")
    if (scale <= 0).any():
        raise _err(path, "non-positive scales; the file is corrupt or not a .splat")
    alpha = np.clip(rgba[:, 3], 0.5 / 255, 1 - 0.5 / 255)
    quats = (data["rot"].astype(np.float32) - 128.0) / 128.0
    quats[np.linalg.norm(quats, axis=1) == 0] = (1, 0, 0, 0)
    scene = GaussianScene(
        means=torch.from_numpy(data["pos"].astype(np.float32).copy()),
        quats=torch.from_numpy(quats / np.linalg.norm(quats, axis=1, keepdims=True)),
        log_scales=torch.from_numpy(np.log(scale)),
        opacity_logits=torch.from_numpy(np.log(alpha / (1 - alpha))),
        sh=torch.from_numpy(((rgba[:, :3] - 0.5) / SH_C0)[:, None, :].copy()))
    _check_finite(path, scene)
    return scene


def write_splat(scene: GaussianScene, path: str | os.PathLike) -> None:
    """Write `.splat` (drops SH beyond degree 0 and any 4D parameters), sorted as given."""
    n = len(scene)
    arr = np.zeros(n, dtype=SPLAT_DTYPE)
    arr["pos"] = scene.means.detach().float().cpu().numpy()
    arr["scale"] = scene.scales().detach().float().cpu().numpy()
    rgb = (0.5 + SH_C0 * scene.sh[:, 0]).detach().float().cpu().numpy()
    a = torch.sigmoid(scene.opacity_logits).detach().float().cpu().numpy()
    arr["rgba"] = np.clip(np.round(np.concatenate([rgb, a[:, None]], axis=1) * 255), 0, 255).astype(np.uint8)
    q = torch.nn.functional.normalize(scene.quats.detach().float(), dim=-1).cpu().numpy()
    arr["rot"] = np.clip(np.round(q * 128 + 128), 0, 255).astype(np.uint8)
    arr.tofile(path)


# ----------------------------------------------------------------------------- 4D slicing

def rotation_4d(quats_l: torch.Tensor, quats_r: torch.Tensor) -> torch.Tensor:
    """(N, 4), (N, 4) left and right quaternions (w first) -> (N, 4, 4) rotation over (x, y, z, t)."""
    a, b, c, d = torch.nn.functional.normalize(quats_l, dim=-1).unbind(-1)
    p, q, r, s = torch.nn.functional.normalize(quats_r, dim=-1).unbind(-1)
    m_l = torch.stack([a, -b, -c, -d, b, a, -d, c, c, d, a, -b, d, -c, b, a], -1).reshape(-1, 4, 4)
    m_r = torch.stack([p, q, r, s, -q, p, -s, r, -r, s, p, -q, -s, -r, q, p], -1).reshape(-1, 4, 4)
    return m_l @ m_r  # (N, 4, 4)


def covariance_4d(scene: GaussianScene) -> torch.Tensor:
    """(N, 4, 4) covariance over (x, y, z, t) of a 4D scene."""
    rot = rotation_4d(scene.quats, scene.quats_r)
    s = torch.exp(torch.cat([scene.log_scales, scene.t_log_scales[:, None]], dim=1))  # (N, 4)
    m = rot * s[:, None, :]  # (N, 4, 4) = R S
    return m @ m.transpose(1, 2)


def slice_4d(scene: GaussianScene, t: float, min_weight: float = 1.0 / 255.0) -> GaussianScene:
    """The 3D scene at time t: conditional mean and covariance of each 4D Gaussian given t,
    its opacity times the (unnormalised) marginal exp(-(t - mu_t)^2 / (2 var_t)), and only the
    Gaussians whose opacity times that marginal is at least `min_weight` (the others could not
    reach alpha 1/255 anywhere). A 3D scene is returned as is."""
    if not scene.is_4d:
        return scene
    cov = covariance_4d(scene)  # (N, 4, 4)
    var_t = cov[:, 3, 3]  # (N,)
    cross = cov[:, :3, 3]  # (N, 3)
    dt = t - scene.t_centers  # (N,)
    marginal = torch.exp(-0.5 * dt * dt / var_t)  # (N,)
    keep = torch.sigmoid(scene.opacity_logits) * marginal >= min_weight
    means = scene.means + cross * (dt / var_t)[:, None]  # (N, 3)
    covars = cov[:, :3, :3] - cross[:, :, None] * cross[:, None, :] / var_t[:, None, None]  # (N, 3, 3)
    sliced = replace(scene, means=means, covars=covars, opacity_scale=marginal,
                     t_centers=None, t_log_scales=None, quats_r=None)
    return sliced.subset(keep)
