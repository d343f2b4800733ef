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
* SuperSplat's compressed `.ply` (its default export; gsplat's `ply_compressed`, PlayCanvas's
  splat-transform): `element chunk` (one per 256 Gaussians, in file order) of 18 float32
  `min_x min_y min_z max_x max_y max_z min_scale_x.. max_scale_z min_r.. max_b` (or the first 12,
  without colour bounds), `element vertex` of 4 uint32 `packed_position packed_rotation
  packed_scale packed_color`, and optionally `element sh` of 9, 24 or 45 uint8 `f_rest_i`
  (channel-major, as in the 3DGS `.ply`). Position and log scale are 11-10-11 bit unorms between
  the chunk's min and max; rotation is 2 bits for the index of the largest of (w, x, y, z) (made
  positive) and the other three as 10-bit unorms of q_i / sqrt(2) + 0.5; colour is 8-8-8-8: the
  DC colour 0.5 + C0 f_dc between the chunk's colour bounds (or as is, 12-float chunks) and
  sigmoid(opacity); an SH coefficient v is stored as trunc((v / 8 + 0.5) * 256) clamped to
  0..255 and read back as ((n + 0.5) / 256 - 0.5) * 8 (0 and 255 read as -4 and 4), as
  splat-transform's reader does. Written by `save_compressed_ply` (Gaussians in Morton order,
  as gsplat and splat-transform write them); a file name ending `.compressed.ply` picks it in
  `save_scene`. 3D only.
* Niantic's `.spz` and PlayCanvas's `.sog`: in `models/splats/gaussians_spz_sog.py`, picked
  here by name; GaussianSplats3D's `.ksplat` in `models/splats/gaussians_ksplat.py`.
* Render mode: a `.ply` (either kind) whose header says `comment SplatRenderMode: mip` (Brush,
  splat-transform) or `comment antialiased 1` (Postshot) was trained with gsplat's
  "antialiased" mode; `GaussianScene.antialiased` keeps it and the writers write the first form.
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

from streamstudio.models.splats.gaussian_scene import (BYTES_PER_GAUSSIAN_IN_MEMORY, SH_C0, GaussianScene,  # noqa: F401
                                                _check_finite, _check_memory, _err, rotation_4d)
from streamstudio.models.splats.gaussians_spz_sog import read_sog, read_spz, write_spz
from streamstudio.models.splats.gaussians_4dgs import read_4dgs_checkpoint
from streamstudio.models.splats.gaussians_ksplat import read_ksplat

PLY_TYPES = {"float": "<f4", "float32": "<f4", "double": "<f8", "float64": "<f8", "uchar": "u1",
             "uint8": "u1", "char": "i1", "int8": "i1", "short": "<i2", "int16": "<i2", "ushort": "<u2",
             "uint16": "<u2", "int": "<i4", "int32": "<i4", "uint": "<u4", "uint32": "<u4"}
FOURD_COMMENT = "streamstudio-4dgs 1"


def load_scene(path: str | os.PathLike, max_gaussians: int | None = None, spz_axes: str = "rub") -> GaussianScene:
    """Read a `.ply` (3DGS, StreamStudio 4D or SuperSplat's compressed) or `.splat` file; bad files
    raise StreamStudioError. `spz_axes`: the axes of a `.spz` file (`read_spz`)."""
    path = Path(path)
    if not path.is_file():
        raise _err(path, "no such file; give the path of a .ply or .splat Gaussian scene")
    suffix = path.suffix.lower()
    if suffix == ".ply":
        scene = read_ply(path, max_gaussians)
    elif suffix == ".splat":
        scene = read_splat(path, max_gaussians)
    elif suffix == ".spz":
        scene = read_spz(path, max_gaussians, spz_axes)
    elif suffix == ".sog" or path.name.lower() == "meta.json":
        scene = read_sog(path, max_gaussians)
    elif suffix in (".pth", ".pt"):  # a checkpoint of the reference 4D Gaussian code (tensors only)
        scene, _ = read_4dgs_checkpoint(path)
        _check_memory(path, len(scene), max_gaussians)
    elif suffix == ".ksplat":  # mkkellogg's GaussianSplats3D
        scene = read_ksplat(path, max_gaussians)
    else:
        raise _err(path, f"unknown scene format {suffix!r}; use a 3DGS .ply (or SuperSplat's compressed .ply), "
                         "an antimatter15 .splat, Niantic's .spz, PlayCanvas's .sog (or its meta.json), "
                         "GaussianSplats3D's .ksplat or a checkpoint .pth of fudan-zvg's 4D Gaussian splatting")
    if len(scene) == 0:  # (an empty .splat once rendered a black video and said it had)
        raise _err(path, "the file holds no Gaussians; give a scene with at least one")
    return scene


SAVE_FORMATS = {"ply": "3DGS .ply", "compressed": "SuperSplat's compressed .ply", "splat": "antimatter15 .splat",
                "spz": "Niantic's .spz (version 3, gzip)"}


def save_format(path: str | os.PathLike) -> str | None:
    """What `save_scene` writes for this name: "compressed" (`*.compressed.ply`), "ply", "splat", or None."""
    name = Path(path).name.lower()
    if name.endswith(".compressed.ply"):
        return "compressed"
    if name.endswith(".ply"):
        return "ply"
    if name.endswith(".splat"):
        return "splat"
    if name.endswith(".spz"):
        return "spz"
    return None


def save_scene(scene: GaussianScene, path: str | os.PathLike, fmt: str | None = None) -> None:
    """Write a scene; the format is `fmt` ("ply", "compressed", "splat") or else from the name:
    `*.compressed.ply` SuperSplat's compressed .ply, `*.ply` the 3DGS .ply, `*.splat`."""
    path = Path(path)
    fmt = fmt or save_format(path)
    if fmt == "splat":
        write_splat(scene, path)
    elif fmt == "ply":
        write_ply(scene, path)
    elif fmt == "compressed":
        save_compressed_ply(scene, path)
    elif fmt == "spz":
        write_spz(scene, path)
    else:
        raise _err(path, "scenes are saved as .ply, .compressed.ply (SuperSplat's compressed .ply), .splat or .spz")


GAUSSIAN_ELEMENTS = ("vertex", "chunk", "sh")  # the elements read; others after them are skipped


@dataclass
class PlyElement:
    name: str
    count: int
    props: list  # [(name, numpy dtype string)]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.props)


def _read_ply_header(path: Path, f) -> tuple[list[PlyElement], list[str]]:
    """Elements (in file order) and comments of a binary little-endian PLY header."""
    first = f.readline()
    if first.strip() != b"ply":
        raise _err(path, "not a PLY file (first line is not 'ply')")
    elements: list[PlyElement] = []
    comments: list[str] = []
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
            if any(e.name == words[1] for e in elements):
                raise _err(path, f"PLY header has two 'element {words[1]}' lines; the file is corrupt")
            elements.append(PlyElement(words[1], _ply_count(path, words[2]), []))
        if words[0] == "property" and elements:
            props = elements[-1].props
            if len(words) >= 2 and (words[1] == "list" or words[1] not in PLY_TYPES):
                if elements[-1].name not in GAUSSIAN_ELEMENTS:  # e.g. a mesh's faces after the vertices: never read
                    continue
                raise _err(path, f"unsupported PLY property type {' '.join(words[1:])!r}")
            if len(words) != 3:
                raise _err(path, f"bad PLY header line {line!r}: expected 'property TYPE NAME'")
            if any(name == words[2] for name, _ in props):
                raise _err(path, f"PLY property {words[2]!r} is declared twice; the file is corrupt")
            props.append((words[2], PLY_TYPES[words[1]]))
    else:
        raise _err(path, "PLY header too long")
    names = [e.name for e in elements]
    if "vertex" not in names:
        raise _err(path, "PLY has no 'element vertex' (not a Gaussian scene)")
    if not elements[names.index("vertex")].props:
        raise _err(path, "PLY 'element vertex' has no properties; not a 3DGS Gaussian scene")
    return elements, comments


def antialiased_from_comments(comments: list[str]) -> bool:
    """Whether a PLY header says the scene was trained antialiased: Brush's `SplatRenderMode:
    default | mip` and Postshot's `antialiased 0 | 1`, case-insensitive, the last one winning
    (as PlayCanvas's splat-transform reads them)."""
    result = False
    for comment in comments:
        text = comment.strip().lower()
        if text.startswith("splatrendermode:"):
            mode = text[len("splatrendermode:"):].strip()
            if mode in ("default", "mip"):
                result = mode == "mip"
        elif text.startswith("antialiased "):
            value = text[len("antialiased "):].strip()
            if value in ("0", "1"):
                result = value == "1"
    return result


ANTIALIASED_COMMENT = "SplatRenderMode: mip"  # what Brush and splat-transform write for an antialiased scene


def _ply_count(path: Path, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise _err(path, f"bad PLY element count {text!r}; it must be a whole number >= 0 (the file is corrupt)")
    return n


def read_ply(path: str | os.PathLike, max_gaussians: int | None = None) -> GaussianScene:
    """Read a 3DGS `.ply` of SH degree 0..3 (and the StreamStudio 4D extension), or SuperSplat's
    compressed `.ply`."""
    path = Path(path)
    with open(path, "rb") as f:
        elements, comments = _read_ply_header(path, f)
        if elements[0].name == "chunk":
            scene = _read_compressed_ply(path, f, elements, max_gaussians)
            scene.antialiased = antialiased_from_comments(comments)
            return scene
        if elements[0].name != "vertex":
            raise _err(path, f"PLY element {elements[0].name!r} before 'vertex' is not supported; a 3DGS .ply "
                             "starts with 'element vertex' (SuperSplat's compressed .ply with 'element chunk')")
        n, dtype = elements[0].count, elements[0].dtype
        _check_memory(path, n, max_gaussians)
        data_bytes = path.stat().st_size - f.tell()
        if data_bytes < n * dtype.itemsize:
            raise _err(path, f"truncated: header says {n} Gaussians ({n * dtype.itemsize} bytes) "
                             f"but only {data_bytes} bytes follow")
        data = np.fromfile(f, dtype=dtype, count=n)
    names = set(dtype.names or ())  # (a structured dtype: its field names)
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
    scene.antialiased = antialiased_from_comments(comments)
    _check_finite(path, scene)
    return scene


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
        assert scene.t_log_scales is not None and scene.quats_r is not None  # (a 4D scene's time fields)
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
    if scene.antialiased:
        header.append(f"comment {ANTIALIASED_COMMENT}")
    header += [f"element vertex {n}"] + [f"property float {name}" for name, _ in columns] + ["end_header"]
    with open(path, "wb") as f:
        f.write(("\n".join(header) + "\n").encode("ascii"))
        arr.tofile(f)


# ----------------------------------------------------------------------------- compressed .ply

COMPRESSED_CHUNK = 256  # Gaussians per chunk
CHUNK_PROPS = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z",
               "min_scale_x", "min_scale_y", "min_scale_z", "max_scale_x", "max_scale_y", "max_scale_z"]
CHUNK_COLOR_PROPS = ["min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
PACKED_PROPS = ["packed_position", "packed_rotation", "packed_scale", "packed_color"]
COMPRESSED_SH_COUNTS = {9: 1, 24: 2, 45: 3}  # uint8 f_rest properties -> SH degree


def _unorm(bits: np.ndarray, shift: int, width: int) -> np.ndarray:
    return ((bits >> np.uint32(shift)) & np.uint32((1 << width) - 1)).astype(np.float64) / ((1 << width) - 1)


def _unpack_111011(bits: np.ndarray) -> np.ndarray:
    return np.stack([_unorm(bits, 21, 11), _unorm(bits, 11, 10), _unorm(bits, 0, 11)], -1)  # (N, 3)


def _lerp(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    return lo * (1 - t) + hi * t


def _read_compressed_ply(path: Path, f, elements: list[PlyElement], max_gaussians: int | None) -> GaussianScene:
    """SuperSplat's compressed `.ply` (the module docstring has the layout)."""
    names = [e.name for e in elements]
    layout = "'element chunk' (18 or 12 float bounds), 'element vertex' (4 uint packed_*), optionally 'element sh'"
    if names[:2] != ["chunk", "vertex"] or not set(names[2:]) <= {"sh"}:
        raise _err(path, f"PLY elements {names} are not SuperSplat's compressed .ply ({layout})")
    chunk, vertex = elements[0], elements[1]
    chunk_names = [name for name, _ in chunk.props]
    if (chunk_names not in (CHUNK_PROPS, CHUNK_PROPS + CHUNK_COLOR_PROPS)
            or any(t != "<f4" for _, t in chunk.props)):
        raise _err(path, f"compressed .ply chunk properties {chunk_names} are not the float {CHUNK_PROPS} "
                         f"(+ {CHUNK_COLOR_PROPS}) of SuperSplat's format")
    if [name for name, _ in vertex.props] != PACKED_PROPS or any(t != "<u4" for _, t in vertex.props):
        raise _err(path, f"compressed .ply vertex properties must be the uint {PACKED_PROPS}")
    n = vertex.count
    if chunk.count != -(-n // COMPRESSED_CHUNK):
        raise _err(path, f"compressed .ply has {chunk.count} chunks for {n} Gaussians; "
                         f"it needs {-(-n // COMPRESSED_CHUNK)} (one per {COMPRESSED_CHUNK}); the file is corrupt")
    sh_el = elements[2] if len(elements) == 3 else None
    if sh_el is not None and not sh_el.props and sh_el.count == n:
        sh_el = None  # gsplat writes an empty 'element sh' for SH degree 0
    if sh_el is not None:
        k = len(sh_el.props)
        if (k not in COMPRESSED_SH_COUNTS or [name for name, _ in sh_el.props] != [f"f_rest_{i}" for i in range(k)]
                or any(t != "u1" for _, t in sh_el.props) or sh_el.count != n):
            raise _err(path, f"compressed .ply 'element sh' must hold {n} rows of 9, 24 or 45 uchar f_rest_i")
    _check_memory(path, n, max_gaussians)
    sizes = [e.count * e.dtype.itemsize for e in elements]
    data_bytes = path.stat().st_size - f.tell()
    if data_bytes < sum(sizes):
        raise _err(path, f"truncated: header says {n} Gaussians ({sum(sizes)} bytes) but only {data_bytes} bytes "
                         "follow")
    ch = np.fromfile(f, dtype="<f4", count=chunk.count * len(chunk_names)).reshape(chunk.count, -1).astype(np.float64)
    packed = np.fromfile(f, dtype="<u4", count=n * 4).reshape(n, 4)  # (N, 4)
    sh_bytes = np.fromfile(f, dtype="u1", count=n * len(sh_el.props)).reshape(n, -1) if sh_el else None
    if not np.isfinite(ch).all():
        raise _err(path, "NaN or infinite chunk bounds; the file is corrupt")
    ci = np.arange(n) // COMPRESSED_CHUNK  # (N,) chunk of each Gaussian
    c = ch[ci]  # (N, 12 or 18)
    means = _lerp(c[:, 0:3], c[:, 3:6], _unpack_111011(packed[:, 0]))
    log_scales = _lerp(c[:, 6:9], c[:, 9:12], _unpack_111011(packed[:, 2]))
    # rotation: 2 bits for the largest component's index in (w, x, y, z), 3 x 10 bits for the others
    rot = packed[:, 1]
    others = np.stack([(_unorm(rot, s, 10) - 0.5) * math.sqrt(2) for s in (20, 10, 0)], -1)  # (N, 3)
    largest_value = np.sqrt(np.clip(1.0 - (others ** 2).sum(-1), 0.0, None))
    largest = (rot >> np.uint32(30)).astype(np.int64)
    quats = np.empty((n, 4))
    slot = np.arange(4)[None, :] - (np.arange(4)[None, :] > largest[:, None])  # (N, 4) which packed value lands where
    quats[:] = np.take_along_axis(others, np.clip(slot, 0, 2), axis=1)
    quats[np.arange(n), largest] = largest_value
    col = np.stack([_unorm(packed[:, 3], s, 8) for s in (24, 16, 8, 0)], -1)  # (N, 4)
    rgb = _lerp(c[:, 12:15], c[:, 15:18], col[:, :3]) if c.shape[1] == 18 else col[:, :3]
    alpha = col[:, 3]
    with np.errstate(divide="ignore"):
        logits = np.where(alpha <= 0, -40.0, np.where(alpha >= 1, 40.0, -np.log(1 / np.maximum(alpha, 1e-300) - 1)))
    dc = (rgb - 0.5) / SH_C0  # (N, 3)
    sh = dc[:, None, :]
    if sh_bytes is not None:
        k_rest = sh_bytes.shape[1] // 3
        q = sh_bytes.astype(np.float64)
        unit = np.where(sh_bytes == 0, 0.0, np.where(sh_bytes == 255, 1.0, (q + 0.5) / 256))
        rest = ((unit - 0.5) * 8).reshape(n, 3, k_rest).transpose(0, 2, 1)  # channel-major -> (N, K-1, 3)
        sh = np.concatenate([sh, rest], 1)
    def as_t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    scene = GaussianScene(means=as_t(means), quats=as_t(quats), log_scales=as_t(log_scales),
                          opacity_logits=as_t(logits), sh=as_t(sh))
    _check_finite(path, scene)
    return scene


def _morton_order(means: np.ndarray) -> np.ndarray:
    """Indices sorting the points by their 30-bit Morton code over the scene's bounds (gsplat's
    and splat-transform's order: neighbours share chunks, so the chunks' bounds are tight)."""
    if len(means) == 0:
        return np.zeros(0, np.int64)
    lo, hi = means.min(0), means.max(0)
    span = np.where(hi - lo > 0, hi - lo, 1.0)
    q = np.clip(np.floor((means - lo) / span * 1024), 0, 1023).astype(np.uint64)  # (N, 3)

    def spread(x):  # 10 bits -> every third bit
        x = x & np.uint64(0x3FF)
        x = (x | (x << np.uint64(16))) & np.uint64(0xFF0000FF)
        x = (x | (x << np.uint64(8))) & np.uint64(0x0300F00F)
        x = (x | (x << np.uint64(4))) & np.uint64(0x030C30C3)
        x = (x | (x << np.uint64(2))) & np.uint64(0x09249249)
        return x

    code = (spread(q[:, 2]) << np.uint64(2)) | (spread(q[:, 1]) << np.uint64(1)) | spread(q[:, 0])
    return np.argsort(code, kind="stable")


def _pack_unorm(t: np.ndarray, bits: int) -> np.ndarray:
    top = (1 << bits) - 1
    return np.clip(np.floor(t * top + 0.5), 0, top).astype(np.uint32)


def _normalise_in(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """x between lo and hi as 0..1 (0 where the range is under 1e-5), as splat-transform."""
    span = hi - lo
    t = np.where(span < 1e-5, 0.0, (x - lo) / np.where(span < 1e-5, 1.0, span))
    return np.clip(t, 0.0, 1.0)


def save_compressed_ply(scene: GaussianScene, path: str | os.PathLike) -> None:
    """Write SuperSplat's compressed `.ply` (module docstring), Gaussians in Morton order, SH
    beyond degree 0 as uint8 when the scene has it. Position, scale and colour are quantised to
    11/10/8 bits of each chunk's range, rotation to 10 bits, SH to 8 bits of [-4, 4]."""
    path = Path(path)
    if scene.is_4d:
        raise _err(path, "SuperSplat's compressed .ply holds 3D scenes only; write a 4D scene as .ply")
    n = len(scene)
    def np_(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().double().numpy()

    order = _morton_order(np_(scene.means))
    means, log_scales = np_(scene.means)[order], np_(scene.log_scales)[order]
    quats, logits, sh = np_(scene.quats)[order], np_(scene.opacity_logits)[order], np_(scene.sh)[order]
    n_chunks = -(-n // COMPRESSED_CHUNK)
    chunk_data = np.zeros((n_chunks, 18), np.float32)
    packed = np.zeros((n, 4), np.uint32)
    rgb = sh[:, 0] * SH_C0 + 0.5  # (N, 3)
    # rotation (per Gaussian): normalise, make the largest |component| positive, drop it
    q = quats / np.maximum(np.linalg.norm(quats, axis=1, keepdims=True), 1e-30)
    largest = np.argmax(np.abs(q), axis=1)
    q = q * np.where(q[np.arange(n), largest] < 0, -1.0, 1.0)[:, None]
    keep = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]  # (N, 3)
    rest = _pack_unorm(np.take_along_axis(q, keep, 1) * (math.sqrt(2) * 0.5) + 0.5, 10)
    packed[:, 1] = ((largest.astype(np.uint32) << np.uint32(30)) | (rest[:, 0] << np.uint32(20))
                    | (rest[:, 1] << np.uint32(10)) | rest[:, 2])
    opacity = 1.0 / (1.0 + np.exp(-logits))

    def pack_111011(t):
        return (_pack_unorm(t[:, 0], 11) << np.uint32(21)) | (_pack_unorm(t[:, 1], 10) << np.uint32(11)) \
            | _pack_unorm(t[:, 2], 11)

    for k in range(n_chunks):
        sl = slice(k * COMPRESSED_CHUNK, min(n, (k + 1) * COMPRESSED_CHUNK))
        p_lo, p_hi = means[sl].min(0), means[sl].max(0)
        s_lo, s_hi = np.clip(log_scales[sl].min(0), -20, 20), np.clip(log_scales[sl].max(0), -20, 20)
        c_lo, c_hi = rgb[sl].min(0), rgb[sl].max(0)
        chunk_data[k] = np.concatenate([p_lo, p_hi, s_lo, s_hi, c_lo, c_hi])
        lo32 = chunk_data[k].astype(np.float64)  # quantise against the bounds as stored (float32)
        packed[sl, 0] = pack_111011(_normalise_in(means[sl], lo32[0:3], lo32[3:6]))
        packed[sl, 2] = pack_111011(_normalise_in(log_scales[sl], lo32[6:9], lo32[9:12]))
        t_rgb = _normalise_in(rgb[sl], lo32[12:15], lo32[15:18])
        packed[sl, 3] = ((_pack_unorm(t_rgb[:, 0], 8) << np.uint32(24)) | (_pack_unorm(t_rgb[:, 1], 8) << np.uint32(16))
                         | (_pack_unorm(t_rgb[:, 2], 8) << np.uint32(8)) | _pack_unorm(opacity[sl], 8))
    k_rest = sh.shape[1] - 1
    header = ["ply", "format binary_little_endian 1.0", "comment Generated by StreamStudio"]
    if scene.antialiased:
        header.append(f"comment {ANTIALIASED_COMMENT}")
    header.append(f"element chunk {n_chunks}")
    header += [f"property float {name}" for name in CHUNK_PROPS + CHUNK_COLOR_PROPS]
    header += [f"element vertex {n}"] + [f"property uint {name}" for name in PACKED_PROPS]
    sh_bytes = None
    if k_rest > 0:
        rest_cm = sh[:, 1:].transpose(0, 2, 1).reshape(n, 3 * k_rest)  # channel-major, as f_rest
        sh_bytes = np.clip(np.trunc((rest_cm / 8 + 0.5) * 256), 0, 255).astype(np.uint8)
        header += [f"element sh {n}"] + [f"property uchar f_rest_{i}" for i in range(3 * k_rest)]
    header.append("end_header")
    with open(path, "wb") as f:
        f.write(("\n".join(header) + "\n").encode("ascii"))
        f.write(chunk_data.astype("<f4").tobytes())
        f.write(packed.astype("<u4").tobytes())
        if sh_bytes is not None:
            f.write(sh_bytes.tobytes())


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


def covariance_4d(scene: GaussianScene) -> torch.Tensor:
    """(N, 4, 4) covariance over (x, y, z, t) of a 4D scene."""
    assert scene.quats_r is not None and scene.t_log_scales is not None  # (a 4D scene's time fields)
    rot = rotation_4d(scene.quats, scene.quats_r)
    s = torch.exp(torch.cat([scene.log_scales, scene.t_log_scales[:, None]], dim=1))  # (N, 4)
    m = rot * s[:, None, :]  # (N, 4, 4) = R S
    return m @ m.transpose(1, 2)


def slice_4d(scene: GaussianScene, t: float, min_weight: float = 1.0 / 255.0) -> GaussianScene:
    """The 3D scene at time t: conditional mean and covariance of each 4D Gaussian given t,
    its opacity times the (unnormalised) marginal exp(-(t - mu_t)^2 / (2 var_t)), and only the
    Gaussians whose opacity times that marginal is at least `min_weight` (the others could not
    reach alpha 1/255 anywhere). A 3D scene is returned as is."""
    if scene.t_centers is None:  # (not is_4d)
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
