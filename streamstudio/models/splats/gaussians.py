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
        from streamstudio.models.splats.gaussians_4dgs import read_4dgs_checkpoint

        scene, _ = read_4dgs_checkpoint(path)
        _check_memory(path, len(scene), max_gaussians)
    elif suffix == ".ksplat":  # mkkellogg's GaussianSplats3D
        from streamstudio.models.splats.gaussians_ksplat import read_ksplat

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
        raise _err(path, f"truncated: header says {n} Gaussians ({sum(sizes)} bytes) but only {data_bytes} bytes follow")
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


# ----------------------------------------------------------------------------- Niantic's .spz
#
# nianticlabs/spz (README "File Format", src/cc/load-spz.cc): versions 1-3 are one gzip stream of a
# 16-byte header (uint32 magic 0x5053474e "NGSP", uint32 version, uint32 numPoints, uint8 shDegree,
# uint8 fractionalBits, uint8 flags (0x1 antialiased), uint8 reserved) and then, attribute by
# attribute for all points: positions (3 x 24-bit signed fixed point, `fractionalBits` fractional
# bits), alphas (uint8, sigmoid x 255), colours (3 x uint8: the DC SH coefficient c as
# c x 0.15 x 255 + 127.5), scales (3 x uint8: (log scale + 10) x 16), rotations (version 3:
# uint32 "smallest three": 2 bits index of the largest of (x, y, z, w), then per other component
# in order a sign bit and 9 bits of |q_i| / sqrt(1/2) x 511; version 2: 3 x uint8 (x, y, z)
# x 127.5 + 127.5 with w >= 0 derived), SH (degree 1..3: 3, 8, 15 coefficients x 3 channels,
# colour fastest, uint8 (v x 128 + 128)). Version 4 is a 32-byte plain header (+ numStreams,
# tocByteOffset), a table of (compressed, uncompressed) uint64 sizes and one ZSTD stream per
# attribute in the same order. Coordinates are RUB (OpenGL / three.js): to the PLY's RDF,
# y and z flip, the quaternion's y and z flip, and SH coefficients flip sign as the basis
# functions' parity in y and z.

SPZ_MAGIC = 0x5053474E
SPZ_COLOR_SCALE = 0.15
SPZ_SH_DIMS = {0: 0, 1: 3, 2: 8, 3: 15}
# sign of each non-DC SH basis function (degree 1..3, 3DGS order) under (x, y, z) -> (x, -y, -z)
SPZ_SH_FLIP = np.array([-1, -1, 1, -1, 1, 1, -1, 1, -1, 1, -1, -1, 1, -1, 1], dtype=np.float32)


def _spz_payload(path: Path) -> tuple[dict, bytes]:
    """(header, attribute bytes in order) of a .spz file of version 1..4."""
    import gzip
    import struct
    import zlib

    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise _err(path, f"corrupt gzip stream ({exc}); not a .spz file") from None
        if len(raw) < 16:
            raise _err(path, "truncated .spz header")
        magic, version, n, degree, frac, flags, _ = struct.unpack("<IIIBBBB", raw[:16])
        if magic != SPZ_MAGIC:
            raise _err(path, "not a .spz file (no NGSP magic)")
        return dict(version=version, n=n, degree=degree, frac=frac, flags=flags), raw[16:]
    if len(raw) < 32 or struct.unpack("<I", raw[:4])[0] != SPZ_MAGIC:
        raise _err(path, "not a .spz file (neither gzip nor an NGSP header)")
    magic, version, n, degree, frac, flags, streams, toc = struct.unpack("<IIIBBBBI", raw[:20])
    try:
        import zstandard
    except ImportError:
        raise _err(path, f".spz version {version} is ZSTD-compressed; `pip install zstandard` to read it, or "
                         "re-save it as version 3 (spz's PackOptions.version = 3)") from None
    parts = []
    for i in range(streams):
        comp, size = struct.unpack("<QQ", raw[toc + 16 * i:toc + 16 * i + 16])
        parts.append((comp, size))
    offset, out = toc + 16 * streams, []
    for comp, size in parts:
        try:
            out.append(zstandard.ZstdDecompressor().decompress(raw[offset:offset + comp], max_output_size=size))
        except zstandard.ZstdError as exc:
            raise _err(path, f"corrupt ZSTD stream ({exc})") from None
        offset += comp
    return dict(version=version, n=n, degree=degree, frac=frac, flags=flags), b"".join(out)


SPZ_AXES = {"rub": "the format's own RUB axes (Niantic's spz library, and every file StreamStudio writes)",
            "rdf": "the PLY's RDF axes, unconverted (PlayCanvas splat-transform writes its .spz so, with spz's "
                   "`from: UNSPECIFIED`: such files show upside down when read as RUB)"}


def read_spz(path: str | os.PathLike, max_gaussians: int | None = None, axes: str = "rub") -> GaussianScene:
    """Read Niantic's `.spz` (versions 2-3 gzip, 4 ZSTD when `zstandard` is installed) into the
    3DGS `.ply` convention (RDF axes). The format carries no axes field: `axes` says what the file
    holds (`SPZ_AXES`), "rub" as the spec and Niantic's library write, "rdf" as splat-transform does."""
    if axes not in SPZ_AXES:
        raise _err(path, f".spz axes {axes!r}: use one of {', '.join(SPZ_AXES)}")
    path = Path(path)
    head, body = _spz_payload(path)
    n, degree, version = head["n"], head["degree"], head["version"]
    if not 2 <= version <= 4:
        raise _err(path, f".spz version {version} is not supported (2..4)")
    if degree not in SPZ_SH_DIMS:
        raise _err(path, f"SH degree {degree}: StreamStudio renders degrees 0..3")
    _check_memory(path, n, max_gaussians)
    rot_bytes = 4 if version >= 3 else 3
    dim = SPZ_SH_DIMS[degree]
    sizes = [9 * n, n, 3 * n, 3 * n, rot_bytes * n, 3 * dim * n]
    if len(body) < sum(sizes):
        raise _err(path, f"truncated: {n} Gaussians need {sum(sizes)} bytes of attributes, found {len(body)}")
    arr = np.frombuffer(body, dtype=np.uint8)
    cuts = np.cumsum([0] + sizes)
    pos_b, alpha_b, col_b, scale_b, rot_b, sh_b = (arr[cuts[i]:cuts[i + 1]] for i in range(6))
    p = pos_b.reshape(n * 3, 3).astype(np.int32)
    fixed = p[:, 0] | (p[:, 1] << 8) | (p[:, 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
    means = (fixed.astype(np.float32) / np.float32(1 << head["frac"])).reshape(n, 3)
    log_scales = scale_b.reshape(n, 3).astype(np.float32) / 16.0 - 10.0
    a = np.clip(alpha_b.astype(np.float64) / 255.0, 0.5 / 255, 1 - 0.5 / 255)
    opacity = np.log(a / (1 - a)).astype(np.float32)
    dc = (col_b.reshape(n, 3).astype(np.float32) / 255.0 - 0.5) / SPZ_COLOR_SCALE
    if version >= 3:
        r = rot_b.reshape(n, 4).astype(np.uint32)
        comp = r[:, 0] | (r[:, 1] << 8) | (r[:, 2] << 16) | (r[:, 3] << 24)
        largest = (comp >> 30).astype(np.int64)
        xyzw = np.zeros((n, 4), dtype=np.float32)
        rest = np.zeros(n, dtype=np.float32)
        for i in range(3, -1, -1):  # the last stored component is in the lowest bits
            mine = largest != i
            mag = (comp & 511).astype(np.float32)
            neg = (comp >> 9) & 1
            val = np.float32(math.sqrt(0.5)) * mag / np.float32(511)
            val = np.where(neg == 1, -val, val)
            xyzw[:, i] = np.where(mine, val, 0.0)
            rest += np.where(mine, val * val, 0.0)
            comp = np.where(mine, comp >> 10, comp)
        xyzw[np.arange(n), largest] = np.sqrt(np.maximum(0.0, 1.0 - rest))
    else:
        xyz = rot_b.reshape(n, 3).astype(np.float32) / 127.5 - 1.0
        xyzw = np.concatenate([xyz, np.sqrt(np.maximum(0.0, 1.0 - (xyz * xyz).sum(1)))[:, None]], 1)
    sh_rest = (sh_b.reshape(n, dim, 3).astype(np.float32) - 128.0) / 128.0  # (N, dim, 3), colour fastest
    quats = np.stack([xyzw[:, 3], xyzw[:, 0], xyzw[:, 1], xyzw[:, 2]], 1)  # (w, x, y, z)
    if axes == "rub":  # RUB -> RDF: positions (x, -y, -z), quaternion (w, x, -y, -z), SH by parity
        means *= np.array([1, -1, -1], dtype=np.float32)
        quats *= np.array([1, 1, -1, -1], dtype=np.float32)
        sh_rest = sh_rest * SPZ_SH_FLIP[:dim, None]
    sh = np.concatenate([dc[:, None, :], sh_rest], 1)
    scene = GaussianScene(means=torch.from_numpy(np.ascontiguousarray(means)),
                          quats=torch.from_numpy(np.ascontiguousarray(quats)),
                          log_scales=torch.from_numpy(np.ascontiguousarray(log_scales)),
                          opacity_logits=torch.from_numpy(opacity), sh=torch.from_numpy(np.ascontiguousarray(sh)),
                          antialiased=bool(head["flags"] & 1))
    _check_finite(path, scene)
    return scene


def write_spz(scene: GaussianScene, path: str | os.PathLike, fractional_bits: int = 12) -> None:
    """Write `.spz` version 3 (gzip; readable by every spz reader, 4 included), as spz's packer
    does with its defaults: 12 fractional bits, SH degree 1 on 5 bits and 2..3 on 4 bits. 3D only."""
    import gzip
    import struct

    if scene.is_4d:
        raise _err(path, ".spz holds 3D scenes only; write a 4D scene as .ply")
    n, degree = len(scene), scene.sh_degree

    def np_(t):
        return t.detach().float().cpu().numpy()

    means = np_(scene.means) * np.array([1, -1, -1], dtype=np.float32)  # RDF -> RUB
    if np.abs(means).max(initial=0) * (1 << fractional_bits) >= (1 << 23):
        raise _err(path, f"positions beyond +-{(1 << 23) / (1 << fractional_bits):g} do not fit .spz's 24-bit "
                         "fixed point")
    fixed = np.round(means * np.float32(1 << fractional_bits)).astype(np.int64).reshape(-1) & 0xFFFFFF
    pos = np.stack([fixed & 0xFF, (fixed >> 8) & 0xFF, (fixed >> 16) & 0xFF], 1).astype(np.uint8)
    alphas = np.clip(np.round(1 / (1 + np.exp(-np_(scene.opacity_logits))) * 255), 0, 255).astype(np.uint8)
    colors = np.clip(np.round(np_(scene.sh[:, 0]) * (SPZ_COLOR_SCALE * 255) + 127.5), 0, 255).astype(np.uint8)
    scales = np.clip(np.round((np_(scene.log_scales) + 10) * 16), 0, 255).astype(np.uint8)
    q = np_(torch.nn.functional.normalize(scene.quats.float(), dim=-1))  # (w, x, y, z) RDF
    xyzw = np.stack([q[:, 1], -q[:, 2], -q[:, 3], q[:, 0]], 1)  # RUB, x y z w
    largest = np.abs(xyzw).argmax(1)
    negate = xyzw[np.arange(n), largest] < 0
    comp = largest.astype(np.uint64)
    for i in range(4):
        mine = largest != i
        negbit = ((xyzw[:, i] < 0) ^ negate).astype(np.uint64)
        mag = np.floor(np.float32(511) * (np.abs(xyzw[:, i]) / np.float32(math.sqrt(0.5))) + 0.5).astype(np.uint64)
        comp = np.where(mine, (comp << np.uint64(10)) | (negbit << np.uint64(9)) | np.minimum(mag, 511), comp)
    comp = comp.astype(np.uint32)
    rots = np.stack([comp & 0xFF, (comp >> 8) & 0xFF, (comp >> 16) & 0xFF, comp >> 24], 1).astype(np.uint8)
    dim = SPZ_SH_DIMS[degree]
    rest = np_(scene.sh[:, 1:]) * SPZ_SH_FLIP[:dim, None]  # (N, dim, 3)
    bucket = np.where(np.arange(dim) < 3, 1 << 3, 1 << 4)[None, :, None]
    qsh = np.round(rest * 128.0) + 128.0
    qsh = (qsh.astype(np.int64) + bucket // 2) // bucket * bucket
    sh = np.clip(qsh, 0, 255).astype(np.uint8)
    header = struct.pack("<IIIBBBB", SPZ_MAGIC, 3, n, degree, fractional_bits, 1 if scene.antialiased else 0, 0)
    body = b"".join([header, pos.tobytes(), alphas.tobytes(), colors.tobytes(), scales.tobytes(), rots.tobytes(),
                     sh.tobytes()])
    Path(path).write_bytes(gzip.compress(body, mtime=0))


# ----------------------------------------------------------------------------- PlayCanvas's .sog
#
# playcanvas/splat-transform (src/lib/readers/read-sog.ts), version 2: `meta.json` and lossless
# WebP images (RGBA, one texel per Gaussian in order), either loose beside meta.json or bundled in
# one zip, the `.sog`. meta: `count`; `means` {mins, maxs, files: [lo, hi]}: 16-bit per axis
# (lo | hi << 8) / 65535 between mins and maxs, of the log transform sign(x) ln(1 + |x|);
# `scales` {codebook (256 log scales), files}: RGB are codebook indices; `quats` {files}: RGB
# are three components (v / 255 x 2 - 1) / sqrt(2), A = 252 + the index of the largest of
# (w, x, y, z), rebuilt from the unit norm; `sh0` {codebook, files}: RGB codebook indices of
# f_dc, A sigmoid(opacity) x 255; `shN` {count, bands, codebook, files: [centroids, labels]}:
# labels (R | G << 8) pick a row of the centroids image (64 palette entries per row, each
# `coeffs` texels wide), whose RGB are codebook indices of f_rest per channel. Axes are the PLY's.

SOG_SH_COEFFS = {0: 0, 1: 3, 2: 8, 3: 15}


def read_sog(path: str | os.PathLike, max_gaussians: int | None = None) -> GaussianScene:
    """Read PlayCanvas's `.sog` (a zip of meta.json and WebP images) or an unbundled `meta.json`."""
    import io
    import json
    import zipfile

    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if path.suffix.lower() == ".sog" and not zipfile.is_zipfile(path):
        raise _err(path, "not a .sog bundle: the zip file is truncated or damaged; export it again")
    if zipfile.is_zipfile(path):
        try:
            bundle = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise _err(path, f"the .sog bundle is damaged ({exc}); export it again") from None
        names = set(bundle.namelist())

        def load(name: str) -> bytes:
            if name not in names:
                raise _err(path, f"the bundle lacks {name}")
            try:
                return bundle.read(name)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:  # a bad header or CRC in that member
                raise _err(path, f"the bundle's {name} is damaged ({exc}); export it again") from None
    else:
        bundle = None

        def load(name: str) -> bytes:
            f = path.parent / name
            if not f.is_file():
                raise _err(path, f"{name} is missing beside meta.json")
            return f.read_bytes()
    try:
        meta = json.loads(load("meta.json" if bundle is not None else path.name).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _err(path, f"meta.json is not JSON ({exc})") from None
    if isinstance(meta, dict) and meta.get("model") == "2dgs":
        raise _err(path, "a 2D Gaussian splatting (2dgs) scene: StreamStudio renders 3D Gaussians only")
    if not isinstance(meta, dict) or meta.get("version") != 2:
        raise _err(path, f"SOG version {meta.get('version') if isinstance(meta, dict) else '?'} is not supported "
                         "(version 2, splat-transform >= 1.0); re-export it with splat-transform")
    try:
        n = int(meta["count"])
        _check_memory(path, n, max_gaussians)

        def image(name: str) -> np.ndarray:
            try:
                img = Image.open(io.BytesIO(load(name)))
                img.load()
            except (UnidentifiedImageError, OSError) as exc:
                raise _err(path, f"{name} is not a readable image ({exc})") from None
            rgba = np.asarray(img.convert("RGBA"), dtype=np.uint8).reshape(-1, 4)
            if rgba.shape[0] < n:
                raise _err(path, f"{name} has {rgba.shape[0]} texels for {n} Gaussians")
            return rgba

        lo, hi = (image(f)[:n].astype(np.uint32) for f in meta["means"]["files"][:2])
        mins, maxs = np.asarray(meta["means"]["mins"], np.float64), np.asarray(meta["means"]["maxs"], np.float64)
        span = np.where(maxs - mins == 0, 1.0, maxs - mins)
        v = mins + span * ((lo[:, :3] | (hi[:, :3] << 8)) / 65535.0)
        means = np.sign(v) * (np.exp(np.abs(v)) - 1)
        s_code = np.asarray(meta["scales"]["codebook"], np.float32)
        log_scales = s_code[image(meta["scales"]["files"][0])[:n, :3]]
        qr = image(meta["quats"]["files"][0])[:n].astype(np.float64)
        tag = qr[:, 3].astype(np.int64)
        abc = (qr[:, :3] / 255 * 2 - 1) / math.sqrt(2)
        quats = np.zeros((n, 4))
        largest = np.clip(tag - 252, 0, 3)
        others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]  # (N, 3)
        rows = np.arange(n)[:, None]
        quats[rows, others] = abc
        quats[np.arange(n), largest] = np.sqrt(np.maximum(0.0, 1 - (abc * abc).sum(1)))
        quats[(tag < 252)] = (1, 0, 0, 0)
        c0 = image(meta["sh0"]["files"][0])[:n]
        c_code = np.asarray(meta["sh0"]["codebook"], np.float32)
        dc = c_code[c0[:, :3]]
        a = np.clip(c0[:, 3] / 255.0, 1e-6, 1 - 1e-6)
        opacity = np.log(a / (1 - a))
        sh = dc[:, None, :]
        shn = meta.get("shN")
        if shn and SOG_SH_COEFFS.get(int(shn.get("bands", 0)), 0) > 0:
            coeffs = SOG_SH_COEFFS[int(shn["bands"])]
            code = np.asarray(shn["codebook"], np.float32)
            cen_img = Image.open(io.BytesIO(load(shn["files"][0])))
            cw, ch = cen_img.size
            cen = np.asarray(cen_img.convert("RGBA"), dtype=np.uint8)  # (H, W, 4)
            if cw != 64 * coeffs:
                raise _err(path, f"shN centroids are {cw} texels wide, expected {64 * coeffs}")
            lab = image(shn["files"][1])[:n].astype(np.int64)
            label = lab[:, 0] | (lab[:, 1] << 8)
            valid = label < int(shn["count"])
            label = np.where(valid, label, 0)
            cy, cx = label // 64, (label % 64) * coeffs
            cols = cx[:, None] + np.arange(coeffs)[None, :]  # (N, coeffs)
            ok = (cy < ch)[:, None] & (cols < cw) & valid[:, None]
            texels = cen[np.minimum(cy, ch - 1)[:, None], np.minimum(cols, cw - 1)][..., :3]  # (N, coeffs, 3)
            rest = np.where(ok[..., None], code[texels], 0.0).astype(np.float32)
            sh = np.concatenate([sh, rest], 1)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise _err(path, f"malformed SOG meta.json ({type(exc).__name__}: {exc})") from None
    finally:
        if bundle is not None:
            bundle.close()
    scene = GaussianScene(means=torch.from_numpy(means.astype(np.float32)),
                          quats=torch.from_numpy(quats.astype(np.float32)),
                          log_scales=torch.from_numpy(np.ascontiguousarray(log_scales, dtype=np.float32)),
                          opacity_logits=torch.from_numpy(opacity.astype(np.float32)),
                          sh=torch.from_numpy(np.ascontiguousarray(sh, dtype=np.float32)),
                          antialiased=meta.get("model") == "antialiased")
    _check_finite(path, scene)
    return scene


# ----------------------------------------------------------------------------- 4D slicing


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
