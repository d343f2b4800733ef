"""mkkellogg's GaussianSplats3D `.ksplat` files (read).

Layout, from GaussianSplats3D's `src/loaders/SplatBuffer.js` (version 0.1, all little endian):

* A 4096-byte header: uint8 versionMajor (0), uint8 versionMinor (>= 1; KSplatLoader refuses
  older), uint32 at byte 4 maxSectionCount, 8 sectionCount, 12 maxSplatCount, 16 splatCount,
  uint16 at byte 20 compressionLevel (0, 1 or 2), float32 at 24..32 the scene centre (only used
  to order the splats when written; not a transform), float32 at 36 and 40 the 8-bit SH range
  min and max (0 read as -1.5 and 1.5, `Constants.SphericalHarmonics8BitCompressionRange / 2`).
* maxSectionCount section headers of 1024 bytes: uint32 at byte 0 splatCount, 4 maxSplatCount,
  8 bucketSize, 12 bucketCount, float32 at 16 bucketBlockSize, uint16 at 20 bucketStorageSizeBytes
  (12), uint32 at 24 compressionScaleRange (0 read as the level's: 32767), 28 storageSizeBytes,
  32 fullBucketCount, 36 partiallyFilledBucketCount, uint16 at 40 the SH degree (0..2).
* The sections, in order, each: partiallyFilledBucketCount uint32 lengths of the partly filled
  buckets, bucketCount float32 (x, y, z) bucket centres (full buckets first, then the partly
  filled ones), then maxSplatCount splats. The bucket part's size is bucketStorageSizeBytes x
  bucketCount + 4 x partiallyFilledBucketCount, whatever the level (the writer sets those counts
  to 0 at level 0). Splat i of a section is in bucket i // bucketSize while i < fullBucketCount x
  bucketSize, then in the partly filled buckets in turn.
* Per splat: centre, scale, rotation, colour, SH. Level 0: 3 float32 centre, 3 float32 linear
  scale, 4 float32 rotation (w, x, y, z, normalised), 4 uint8 RGBA, SH float32 (44, 80, 140 bytes
  for SH degree 0, 1, 2). Levels 1 and 2: 3 uint16 centre c, the position being
  (c - range) x (bucketBlockSize / 2) / range + the bucket's centre; scale and rotation as
  float16; RGBA uint8; SH float16 (level 1) or uint8 n read as n / 255 x (max - min) + min
  (level 2). 24, 42, 72 bytes (level 1) and 24, 33, 48 bytes (level 2) per splat.
* RGBA is floor((0.5 + C0 f_dc) x 255) and floor(sigmoid(opacity) x 255), as in `.splat`.
* SH rest: 9 values for degree 1 then 15 for degree 2, each band channel-major: red's 3 (5)
  coefficients, then green's, then blue's (the PLY parser's `degree1Fields` / `degree2Fields`;
  `fillSphericalHarmonicsArray` reads them back with strides 3 and 5). Degree 3 is never written.
* Axes are the source `.ply`'s (the parsers copy x, y, z and the quaternion as they are).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from streamstudio.models.splats.gaussian_scene import (
    SH_C0,
    GaussianScene,
    _check_finite,
    _check_memory,
    _err,
)

KSPLAT_HEADER_BYTES = 4096
KSPLAT_SECTION_HEADER_BYTES = 1024
KSPLAT_BUCKET_STORAGE_BYTES = 12
KSPLAT_SCALE_RANGE = {0: 1, 1: 32767, 2: 32767}
KSPLAT_SH_HALF_RANGE = 1.5  # Constants.SphericalHarmonics8BitCompressionRange / 2
KSPLAT_SH_COMPONENTS = {0: 0, 1: 9, 2: 24}


def ksplat_splat_dtype(level: int, degree: int) -> np.dtype:
    """The packed per-splat record of a compression level and SH degree."""
    ncomp = KSPLAT_SH_COMPONENTS[degree]
    if level == 0:
        fields = [("center", "<f4", 3), ("scale", "<f4", 3), ("rot", "<f4", 4), ("rgba", "u1", 4)]
        sh = "<f4"
    else:
        fields = [("center", "<u2", 3), ("scale", "<f2", 3), ("rot", "<f2", 4), ("rgba", "u1", 4)]
        sh = "<f2" if level == 1 else "u1"
    if ncomp:
        fields.append(("sh", sh, ncomp))
    return np.dtype(fields)


def _sh_rest(sh: np.ndarray, degree: int) -> np.ndarray:
    """(N, K - 1, 3) coefficient-major SH from the stored per-band channel-major values."""
    n = sh.shape[0]
    bands = [sh[:, :9].reshape(n, 3, 3).transpose(0, 2, 1)]
    if degree >= 2:
        bands.append(sh[:, 9:24].reshape(n, 3, 5).transpose(0, 2, 1))
    return np.concatenate(bands, 1)


def read_ksplat(path: str | os.PathLike, max_gaussians: int | None = None) -> GaussianScene:
    """Read a GaussianSplats3D `.ksplat` (compression level 0, 1 or 2; SH degree 0..2) into the
    3DGS `.ply` convention: means, quaternions w first, log scales, opacity logits and SH."""
    path = Path(path)
    raw = path.read_bytes()
    size = len(raw)
    if size < KSPLAT_HEADER_BYTES:
        raise _err(path, f"truncated or not a .ksplat: {size} bytes, less than its {KSPLAT_HEADER_BYTES}-byte header")
    major, minor = raw[0], raw[1]
    if major != 0 or minor < 1:
        raise _err(path, f".ksplat version {major}.{minor} is not supported (0.1 and later 0.x, as GaussianSplats3D "
                         "writes them); re-save it with a current GaussianSplats3D")
    head32 = np.frombuffer(raw, "<u4", 11)
    level = int(np.frombuffer(raw, "<u2", 1, 20)[0])
    max_sections, max_splats = int(head32[1]), int(head32[3])
    if level not in KSPLAT_SCALE_RANGE:
        raise _err(path, f"unknown .ksplat compression level {level} (0, 1 or 2)")
    sh_min, sh_max = (float(v) for v in np.frombuffer(raw, "<f4", 2, 36))
    sh_min = sh_min or -KSPLAT_SH_HALF_RANGE  # as SplatBuffer.parseHeader: 0 means the default
    sh_max = sh_max or KSPLAT_SH_HALF_RANGE
    sections_end = KSPLAT_HEADER_BYTES + max_sections * KSPLAT_SECTION_HEADER_BYTES
    if sections_end > size:
        raise _err(path, f"truncated: {max_sections} section headers need {sections_end} bytes, the file has {size}")
    _check_memory(path, max_splats, max_gaussians)

    sections = []
    base, total = sections_end, 0
    for s in range(max_sections):
        off = KSPLAT_HEADER_BYTES + s * KSPLAT_SECTION_HEADER_BYTES
        u32 = np.frombuffer(raw, "<u4", 10, off)
        u16 = np.frombuffer(raw, "<u2", 21, off)
        n, bucket_size, bucket_count = int(u32[1]), int(u32[2]), int(u32[3])
        block = float(np.frombuffer(raw, "<f4", 1, off + 16)[0])
        bucket_bytes = int(u16[10])
        scale_range = int(u32[6]) or KSPLAT_SCALE_RANGE[level]
        full, partial = int(u32[8]), int(u32[9])
        degree = int(u16[20])
        if degree not in KSPLAT_SH_COMPONENTS:
            raise _err(path, f"section {s}: SH degree {degree}; .ksplat holds degrees 0..2")
        dtype = ksplat_splat_dtype(level, degree)
        meta_bytes = 4 * partial
        buckets_bytes = bucket_bytes * bucket_count + meta_bytes
        data_base = base + buckets_bytes
        end = data_base + dtype.itemsize * n
        if end > size:
            raise _err(path, f"truncated: section {s} ({n} splats of {dtype.itemsize} bytes, {bucket_count} buckets) "
                             f"ends at byte {end}, the file has {size}")
        total += n
        if total > max_splats:
            raise _err(path, f"the sections hold more splats than the header's {max_splats}; the file is corrupt")
        data = np.frombuffer(raw, dtype, n, data_base)
        if level >= 1 and n:
            if bucket_bytes != KSPLAT_BUCKET_STORAGE_BYTES:
                raise _err(path, f"section {s}: bucket storage of {bucket_bytes} bytes (expected "
                                 f"{KSPLAT_BUCKET_STORAGE_BYTES}); the file is corrupt")
            if full + partial != bucket_count:
                raise _err(path, f"section {s}: {full} full and {partial} partly filled buckets but {bucket_count} "
                                 "buckets; the file is corrupt")
            lengths = np.frombuffer(raw, "<u4", partial, base).astype(np.int64)
            if full * bucket_size + int(lengths.sum()) != n:
                raise _err(path, f"section {s}: its buckets hold {full * bucket_size + int(lengths.sum())} splats, "
                                 f"not {n}; the file is corrupt")
            centres = np.frombuffer(raw, "<f4", 3 * bucket_count, base + meta_bytes).reshape(bucket_count, 3)
            which = np.concatenate([np.repeat(np.arange(full), bucket_size),
                                    np.repeat(np.arange(full, bucket_count), lengths)])
            step = np.float64(block / 2.0 / scale_range)
            means = (data["center"].astype(np.float64) - scale_range) * step + centres[which].astype(np.float64)
        else:
            means = data["center"].astype(np.float64)
        sections.append((data, means, degree))
        base = end
    if total != max_splats:
        raise _err(path, f"the header counts {max_splats} splats but its sections hold {total}; the file is corrupt")

    degree = max((d for _, _, d in sections), default=0)
    k = (degree + 1) ** 2
    parts: dict[str, list[np.ndarray]] = {"means": [], "quats": [], "log_scales": [], "opacity": [], "sh": []}
    for data, means, d in sections:
        n = data.shape[0]
        scale = np.abs(data["scale"].astype(np.float32))
        q = data["rot"].astype(np.float32)  # (w, x, y, z)
        norm = np.linalg.norm(q, axis=1, keepdims=True)
        q = np.where(norm > 0, q / np.where(norm > 0, norm, 1), np.array([1, 0, 0, 0], np.float32))
        rgba = data["rgba"].astype(np.float32) / 255.0
        alpha = np.clip(rgba[:, 3], 0.5 / 255, 1 - 0.5 / 255)
        sh = np.zeros((n, k, 3), np.float32)
        sh[:, 0] = (rgba[:, :3] - 0.5) / SH_C0
        if d:
            stored = data["sh"].astype(np.float64)
            if level == 2:
                stored = stored / 255.0 * (sh_max - sh_min) + sh_min
            sh[:, 1:(d + 1) ** 2] = _sh_rest(stored.astype(np.float32), d)
        parts["means"].append(means.astype(np.float32))
        parts["quats"].append(q)
        parts["log_scales"].append(np.log(np.maximum(scale, np.float32(1e-10))))
        parts["opacity"].append(np.log(alpha / (1 - alpha)).astype(np.float32))
        parts["sh"].append(sh)

    def cat(key: str, shape: tuple) -> torch.Tensor:
        arrs = parts[key]
        out = np.concatenate(arrs) if arrs else np.zeros(shape, np.float32)
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

    scene = GaussianScene(means=cat("means", (0, 3)), quats=cat("quats", (0, 4)),
                          log_scales=cat("log_scales", (0, 3)), opacity_logits=cat("opacity", (0,)),
                          sh=cat("sh", (0, k, 3)))
    _check_finite(path, scene)
    return scene


__all__ = ["KSPLAT_HEADER_BYTES", "KSPLAT_SECTION_HEADER_BYTES", "ksplat_splat_dtype", "read_ksplat"]
