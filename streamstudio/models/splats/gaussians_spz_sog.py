"""Niantic's `.spz` (read and write) and PlayCanvas's `.sog` (read), the web viewers' compressed
splat formats; `gaussians.load_scene` and `save_scene` (models/splats/gaussians.py) pick them by
name. Each format's layout is in the comment above its reader."""

from __future__ import annotations

import math
import os
from pathlib import Path
import gzip
import io
import json
import struct
import zipfile
import zlib

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from streamstudio.models.splats.gaussian_scene import GaussianScene, _check_finite, _check_memory, _err


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
