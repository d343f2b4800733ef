"""mkkellogg's GaussianSplats3D `.ksplat`: files made by GaussianSplats3D's own generator (embedded
below) and files from a writer in this test, written from its `src/loaders/SplatBuffer.js`, are
read within each compression level's quantisation step and render like the source scene; a
hand-built one-splat file decodes to hand-computed values; bad files fail clearly; `splat convert`
reads them.

The embedded reference files (REFERENCE_KSPLAT, zlib + base64) were made from
`reference_source_scene()` written as a 3DGS .ply, by GaussianSplats3D at commit eb2fc45 ("Update
README", v0.4.7) with three 0.160.1 under Node 20, with this script beside its `src/`:

    import * as fs from 'fs';
    import * as THREE from 'three';
    import { PlyParser } from './src/loaders/ply/PlyParser.js';
    import { SplatBufferGenerator } from './src/loaders/SplatBufferGenerator.js';
    const [inp, out, level, shDeg, blockSize, bucketSize, sectionSize] = process.argv.slice(2);
    const data = fs.readFileSync(inp);
    const buf = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
    const arr = PlyParser.parseToUncompressedSplatArray(buf, parseInt(shDeg));
    const gen = SplatBufferGenerator.getStandardGenerator(1, parseInt(level), parseInt(sectionSize),
        new THREE.Vector3(), parseFloat(blockSize), parseInt(bucketSize));
    fs.writeFileSync(out, Buffer.from(gen.generateFromUncompressedSplatArray(arr).bufferData));

run as `node gen.mjs src.ply out.ksplat LEVEL 2 1.0 4 10` (levels 0, 1, 2: SH degree 2, three
sections of 10, 10 and 4 splats, buckets of 4 in blocks of 1.0, so full and partly filled
buckets) and `node gen.mjs src.ply out.ksplat 1 0 5.0 256 0` (create-ksplat's defaults, SH 0).
"""

from __future__ import annotations

import base64
import math
import struct
import zlib

import numpy as np
import helpers
import pytest
import torch
from helpers import random_scene, same_rotation

from streamstudio.app.cli import main
from streamstudio.errors import StreamStudioError
from streamstudio.models.splats.gaussians import GaussianScene, load_scene
from streamstudio.models.splats.gaussians_ksplat import read_ksplat

C0 = 0.28209479177387814
SCALE_RANGE = 32767  # SplatBuffer.CompressionLevels[1 and 2].ScaleRange
SH_COMPONENTS = {0: 0, 1: 9, 2: 24}


def reference_source_scene() -> GaussianScene:
    """The 24 Gaussians (SH degree 2) the embedded reference files were made from."""
    i = np.arange(24, dtype=np.float64)[:, None]
    means = np.concatenate([(i % 4) * 0.9 + 0.13 * np.sin(i * 1.7), (i // 4 % 3) * 0.8 + 0.1 * np.cos(i * 2.3),
                            (i // 12) * 1.1 + 0.07 * np.sin(i * 0.9) - 0.5], 1)
    quats = np.concatenate([np.cos(i * 0.7) + 1.2, np.sin(i * 1.3), 0.5 * np.cos(i * 0.4), 0.8 * np.sin(i * 2.1)], 1)
    log_scales = -2.5 + 0.5 * np.sin(i * np.array([1.1, 1.9, 2.7]))
    opacity = 2.0 * np.sin(i[:, 0] * 0.77) + 0.5
    sh = 0.3 * np.sin(i[:, :, None] * np.arange(1, 10)[None, :, None] * 0.37 + np.arange(3)[None, None, :] * 1.3)
    sh[:, 0] = 1.5 * np.sin(i * np.array([0.5, 0.8, 1.4]) + 0.3)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    return GaussianScene(means=t(means), quats=t(quats), log_scales=t(log_scales), opacity_logits=t(opacity), sh=t(sh))


def assert_renders_alike(a: GaussianScene, b: GaussianScene, degree: int, mean_tol: float, max_tol: float = 0.15):
    """The shared check, looking at the scene's centre (these scenes are not around the origin)."""
    helpers.assert_renders_alike(a, b, degree, mean_tol, max_tol, centre=a.means.mean(0), min_brightness=0.02)


# --------------------------------------------------------------------------- a writer from SplatBuffer.js

def write_ksplat(scene: GaussianScene, level: int, sections: list[int] | None = None, block_size: float = 5.0,
                 bucket_size: int = 256, sh_range: tuple[float, float] | None = None) -> tuple[bytes, np.ndarray]:
    """(file bytes, source index of each stored splat), as SplatBuffer.generateFromUncompressedSplatArrays
    lays it out: `sections` splits the splats in order (default one section); buckets as
    computeBucketsForUncompressedSplatArray (grid blocks of `block_size`, a bucket full at
    `bucket_size`, full ones first, then the partly filled ones in block-id order)."""
    n, degree = len(scene), scene.sh_degree
    sections = sections or [n]
    assert sum(sections) == n
    means = scene.means.double().numpy()
    scale = np.exp(scene.log_scales.double().numpy())
    quats = torch.nn.functional.normalize(scene.quats.double(), dim=-1).numpy()  # (w, x, y, z)
    rgb = np.clip(np.floor((0.5 + C0 * scene.sh[:, 0].double().numpy()) * 255), 0, 255)
    alpha = np.clip(np.floor(torch.sigmoid(scene.opacity_logits.double()).numpy() * 255), 0, 255)
    rgba = np.concatenate([rgb, alpha[:, None]], 1).astype(np.uint8)
    rest = scene.sh[:, 1:].double().numpy()  # (N, K-1, 3) coefficient-major
    stored = [rest[:, :3].transpose(0, 2, 1).reshape(n, 9)] if degree >= 1 else []  # band 1, channel-major
    if degree >= 2:
        stored.append(rest[:, 3:8].transpose(0, 2, 1).reshape(n, 15))
    sh = np.concatenate(stored, 1) if stored else np.zeros((n, 0))
    lo, hi = sh_range or ((float(sh.min()), float(sh.max())) if sh.size else (-1.5, 1.5))
    ncomp = SH_COMPONENTS[degree]
    if level == 0:
        rec = [("center", "<f4", 3), ("scale", "<f4", 3), ("rot", "<f4", 4), ("rgba", "u1", 4)]
        sh_type = "<f4"
    else:
        rec = [("center", "<u2", 3), ("scale", "<f2", 3), ("rot", "<f2", 4), ("rgba", "u1", 4)]
        sh_type = "<f2" if level == 1 else "u1"
    dtype = np.dtype(rec + ([("sh", sh_type, ncomp)] if ncomp else []))
    section_headers, bodies, order, start = [], [], [], 0
    for count in sections:
        idx = np.arange(start, start + count)
        start += count
        if level >= 1:
            p = means[idx]
            mn = p.min(0)
            dims = p.max(0) - mn
            yb, zb = math.ceil(dims[1] / block_size), math.ceil(dims[2] / block_size)
            full, partial = [], {}
            for j, row in enumerate(idx):
                b = np.floor((p[j] - mn) / block_size)
                bid = int(b[0] * (yb * zb) + b[1] * zb + b[2])
                bucket = partial.get(bid)
                if bucket is None:
                    bucket = partial[bid] = {"splats": [], "center": b * block_size + mn + block_size / 2}
                bucket["splats"].append(row)
                if len(bucket["splats"]) >= bucket_size:
                    full.append(bucket)
                    partial[bid] = None
            partly = [partial[k] for k in sorted(partial) if partial[k] is not None]
            buckets = full + partly
            rows = np.array([r for b in buckets for r in b["splats"]], dtype=np.int64)
            bucket_of = np.concatenate([np.full(len(b["splats"]), i) for i, b in enumerate(buckets)])
            centres = np.array([b["center"] for b in buckets], dtype=np.float32).reshape(-1, 3)
            meta = np.array([len(b["splats"]) for b in partly], "<u4").tobytes() + centres.astype("<f4").tobytes()
            counts = (len(buckets), len(full), len(partly))
        else:
            rows, meta, counts = idx, b"", (0, 0, 0)
        data = np.zeros(count, dtype)
        if level == 0:
            data["center"] = means[rows]
            data["scale"] = scale[rows]
            data["rot"] = quats[rows]
        else:
            delta = means[rows] - centres[bucket_of].astype(np.float64)
            data["center"] = np.clip(np.floor(delta * (SCALE_RANGE / (block_size * 0.5)) + 0.5) + SCALE_RANGE,
                                     0, 2 * SCALE_RANGE + 1)
            data["scale"] = scale[rows].astype(np.float16)
            data["rot"] = quats[rows].astype(np.float16)
        data["rgba"] = rgba[rows]
        if ncomp:
            if level == 2:
                data["sh"] = np.clip(np.floor((np.clip(sh[rows], lo, hi) - lo) / (hi - lo) * 255), 0, 255)
            else:
                data["sh"] = sh[rows]
        body = meta + data.tobytes()
        head = bytearray(1024)
        struct.pack_into("<IIIIfHxxIIII", head, 0, count, count, bucket_size if level else 0, counts[0],
                         block_size if level else 0.0, 12 if level else 0, SCALE_RANGE if level else 0, len(body),
                         counts[1], counts[2])
        struct.pack_into("<H", head, 40, degree)
        section_headers.append(bytes(head))
        bodies.append(body)
        order.append(rows)
    header = bytearray(4096)
    struct.pack_into("<BBxxIIIIH", header, 0, 0, 1, len(sections), len(sections), n, n, level)
    struct.pack_into("<5f", header, 24, 0.0, 0.0, 0.0, lo, hi)
    return bytes(header) + b"".join(section_headers) + b"".join(bodies), np.concatenate(order)


# --------------------------------------------------------------------------- checks

def assert_within_quantisation(src: GaussianScene, got: GaussianScene, level: int, block_size: float,
                               sh_step: float, degree: int):
    """`got[i]` is `src[i]` within the level's steps: positions half a 16-bit step of the bucket
    block (levels 1-2), one float16 step (relative 2^-10: three.js's toHalfFloat truncates) for
    scales, rotations and level-1 SH, the truncated 8-bit colour and alpha, and one 8-bit step of
    the SH range (level 2)."""
    pos_tol = 1e-6 if level == 0 else block_size / 2 / SCALE_RANGE * 0.5 + 1e-6
    half = 1e-6 if level == 0 else 2.0 ** -10 * 1.01
    assert (got.means - src.means).abs().max() <= pos_tol
    assert (same_rotation(got.quats, src.quats) >= 1 - 4 * half).all()
    assert (got.log_scales - src.log_scales).abs().max() <= half + 1e-6
    dc_err = src.sh[:, 0] - got.sh[:, 0]  # colour truncated (floor), so read back never above
    assert dc_err.min() >= -1e-5 and dc_err.max() <= 1 / 255 / C0 + 1e-5
    assert (torch.sigmoid(got.opacity_logits) - torch.sigmoid(src.opacity_logits)).abs().max() <= 1 / 255 + 1e-6
    assert got.sh_degree == degree
    if degree:
        rest_err = (got.sh[:, 1:] - src.sh[:, 1:(degree + 1) ** 2]).abs()
        tol = {0: 1e-6, 1: float(src.sh[:, 1:].abs().max()) * half + 1e-6, 2: sh_step + 1e-4}[level]
        assert rest_err.max() <= tol, (float(rest_err.max()), tol)


def nearest(src: GaussianScene, got: GaussianScene) -> torch.Tensor:
    """The source index of each read Gaussian (the writer reorders them), by nearest position."""
    idx = torch.cdist(got.means.double(), src.means.double()).argmin(1)
    assert len(set(idx.tolist())) == len(src)
    return idx


@pytest.mark.parametrize("name,level,degree,block", [("level0", 0, 2, 1.0), ("level1", 1, 2, 1.0),
                                                     ("level2", 2, 2, 1.0), ("level1_defaults_sh0", 1, 0, 5.0)])
def test_files_from_gaussiansplats3d_read_within_quantisation(tmp_path, name, level, degree, block):
    path = tmp_path / "ref.ksplat"
    path.write_bytes(zlib.decompress(base64.b64decode("".join(REFERENCE_KSPLAT[name]))))
    got = load_scene(path)
    src = reference_source_scene()
    src = src.subset(nearest(src, got))
    if degree == 0:
        src.sh = src.sh[:, :1]
    raw = path.read_bytes()
    lo, hi = struct.unpack_from("<2f", raw, 36)
    # its 8-bit SH range leaves out the last coefficient (a `< FRC23` loop), which is clamped into it
    assert_within_quantisation(src, got, level, block, (hi - lo) / 255 + 2e-4, degree)
    head = np.frombuffer(raw, "<u4", 10, 4096)
    if level >= 1 and block == 1.0:
        assert head[8] >= 1 and head[9] >= 1  # the first section has full and partly filled buckets
    elif level >= 1:
        assert head[3] == 1 and head[9] == 1  # all in one partly filled bucket
    assert_renders_alike(src, got, degree, mean_tol=1.5e-3, max_tol=0.02)


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("degree", [0, 2])
@pytest.mark.parametrize("sections", ["one", "two"])
def test_writer_from_the_layout_round_trips(tmp_path, level, degree, sections):
    src = random_scene(300, degree, seed=level + 3 * degree)
    split = [300] if sections == "one" else [170, 130]
    block, bucket = (5.0, 256) if sections == "one" else (1.0, 8)
    data, order = write_ksplat(src, level, split, block_size=block, bucket_size=bucket)
    path = tmp_path / "a.ksplat"
    path.write_bytes(data)
    got = read_ksplat(path)
    assert len(got) == 300
    src = src.subset(torch.from_numpy(order))
    if sections == "two" and level >= 1:
        head = [np.frombuffer(data, "<u4", 10, 4096 + 1024 * s) for s in range(2)]
        assert all(h[8] >= 1 and h[9] >= 1 for h in head)  # full and partly filled buckets in each
    sh_step = float(src.sh[:, 1:].max() - src.sh[:, 1:].min()) / 255 if degree else 0.0
    assert_within_quantisation(src, got, level, block, sh_step, degree)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_renders_like_the_source_scene(tmp_path, level):
    src = random_scene(400, 2, seed=7)
    data, _ = write_ksplat(src, level, [250, 150], block_size=1.0, bucket_size=32)
    path = tmp_path / "r.ksplat"
    path.write_bytes(data)
    assert_renders_alike(src, read_ksplat(path), 2, mean_tol=2.5e-3, max_tol=0.02)


def test_a_hand_built_splat(tmp_path):
    """Level 2, SH degree 1, one section with one partly filled bucket holding one splat."""
    header = bytearray(4096)
    struct.pack_into("<BBxxIIIIH", header, 0, 0, 1, 1, 1, 1, 1, 2)
    struct.pack_into("<5f", header, 24, 9.0, 9.0, 9.0, -2.0, 2.0)  # the scene centre is not a transform
    splat = struct.pack("<3H", 32767, 65534, 0)  # relative to the bucket centre, 2.5 / 32767 per unit
    splat += struct.pack("<3H", 0x3C00, 0x4000, 0x3800)  # float16 scales 1, 2, 0.5
    splat += struct.pack("<4H", 0x3800, 0x3800, 0xB800, 0x3800)  # float16 rotation w, x, y, z = .5, .5, -.5, .5
    splat += bytes([255, 128, 0, 204])  # RGBA
    splat += bytes([255, 0, 51, 102, 153, 204, 0, 0, 255])  # red's 3 coefficients, green's, blue's: n / 255 * 4 - 2
    body = struct.pack("<I", 1) + struct.pack("<3f", 1.0, 2.0, 3.0) + splat
    section = bytearray(1024)
    struct.pack_into("<IIIIfHxxIIII", section, 0, 1, 1, 256, 1, 5.0, 12, 32767, len(body), 0, 1)
    struct.pack_into("<H", section, 40, 1)
    path = tmp_path / "one.ksplat"
    path.write_bytes(bytes(header) + bytes(section) + body)
    got = load_scene(path)
    assert len(got) == 1 and got.sh_degree == 1
    torch.testing.assert_close(got.means[0], torch.tensor([1.0, 4.5, 0.5]))
    torch.testing.assert_close(got.log_scales[0], torch.tensor([0.0, math.log(2), -math.log(2)]))
    torch.testing.assert_close(got.quats[0], torch.tensor([0.5, 0.5, -0.5, 0.5]))
    torch.testing.assert_close(got.sh[0, 0], torch.tensor([0.5, 128 / 255 - 0.5, -0.5]) / C0)
    torch.testing.assert_close(got.opacity_logits[0], torch.tensor(math.log(0.8 / 0.2)))
    # coefficient k's (R, G, B): R from the first three bytes, G the next three, B the last three
    torch.testing.assert_close(got.sh[0, 1:], torch.tensor([[2.0, -0.4, -2.0], [-2.0, 0.4, -2.0], [-1.2, 1.2, 2.0]]))


def good_file(level=1, degree=1) -> bytes:
    data, _ = write_ksplat(random_scene(300, degree, seed=1), level, [170, 130], block_size=1.0, bucket_size=8)
    return data


def patched(data: bytes, offset: int, fmt: str, *values) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


@pytest.mark.parametrize("make,message", [
    (lambda: b"", "less than its 4096-byte header"),
    (lambda: good_file()[:4000], "less than its 4096-byte header"),
    (lambda: patched(good_file(), 0, "<BB", 0, 0), "version 0.0 is not supported"),
    (lambda: patched(good_file(), 0, "<BB", 1, 0), "version 1.0 is not supported"),
    (lambda: patched(good_file(), 20, "<H", 3), "unknown .ksplat compression level 3"),
    (lambda: patched(good_file(), 4, "<I", 100000), "100000 section headers need"),
    (lambda: good_file()[:-10], "truncated: section 1"),
    (lambda: good_file(0)[:-1], "truncated: section 1"),
    (lambda: patched(good_file(), 12, "<I", 301), "the header counts 301 splats but its sections hold 300"),
    (lambda: patched(good_file(), 12, "<I", 200), "more splats than the header's 200"),
    (lambda: patched(good_file(), 4096 + 1024 + 4, "<I", 131), "truncated: section 1"),
    (lambda: patched(good_file(), 4096 + 8, "<I", 9), "its buckets hold"),
    (lambda: patched(good_file(), 4096 + 4, "<I", 171), "its buckets hold 170 splats, not 171"),
    (lambda: patched(good_file(), 4096 + 36, "<I", 0), "buckets but"),
    (lambda: patched(good_file(), 4096 + 40, "<H", 3), "SH degree 3"),
])
def test_bad_files_fail_clearly(tmp_path, make, message):
    path = tmp_path / "bad.ksplat"
    path.write_bytes(make())
    with pytest.raises(StreamStudioError, match=message) as info:
        load_scene(path)
    assert "bad.ksplat" in str(info.value)


def test_limits_and_the_unknown_format_message(tmp_path):
    path = tmp_path / "a.ksplat"
    path.write_bytes(good_file())
    with pytest.raises(StreamStudioError, match="more than the limit of 10"):
        load_scene(path, max_gaussians=10)
    (tmp_path / "a.xyz").write_bytes(b"x")
    with pytest.raises(StreamStudioError, match="GaussianSplats3D's .ksplat"):
        load_scene(tmp_path / "a.xyz")


def test_convert_reads_ksplat(tmp_path):
    path = tmp_path / "a.ksplat"
    path.write_bytes(zlib.decompress(base64.b64decode("".join(REFERENCE_KSPLAT["level2"]))))
    assert main(["splat", "convert", str(path), str(tmp_path / "a.ply")]) == 0
    got, want = load_scene(tmp_path / "a.ply"), read_ksplat(path)
    for key in ("means", "quats", "log_scales", "opacity_logits", "sh"):
        torch.testing.assert_close(getattr(got, key), getattr(want, key))


# --------------------------------------------------------------------------- GaussianSplats3D's own files

REFERENCE_KSPLAT = {
    "level0": (
        "eNrtmotXzVkbx4+oyDSFUFgjKSmmkqaRzn52qeh2SEkRmWlcBkkaRohOut+k6zmHKLemMdGMS6J+z0GNchkaTEqMkksil0hDmHee"
        "886876x3+QfeWee71l5ZS+2zf8/38/3u31ol6iUS9Rb9exn+uf5Xt7cq8LFcASK11FJLLbXUUksttdRSSy211FLr/1I6f673KVLz"
        "v//WUI9KLbXU+VdLLbX+Merz53qfbDTU+VdLrX+0jNqZacU8nn3fkuvaz2QhdUEsdE4oG3iVc2nPW0g4nwg77h6C5jIH6Qltb9xs"
        "noRtiXJcWjYGJgVK2a6uyYJnfhZo+CpgvHYajNDIxdShUbhl2sf4S3mG0HxiOGtPH4oN8lDsCcnE5zEKHL4tHVc8CYQjWj1sbkW6"
        "eGltuWARAXi9NoRrHT3s+OZZf/71d/1APiOJTbgZw4ouBILbjmlKdx8P6Gf7IT9iOHeuXXCYcEAvG/SvPWDzLBRYld9QsUEqh605"
        "dYLDrRxcpOXA9u9PxIUXLTBUHAY1LBDih7hi8co4FvpBFm6SvBSe90+Ap0usweVzBUgyAsU5enI8WZAp9O7eCvuHakLgqwIhWbMv"
        "f6N1m/1ssYyVPX7HDHM3cBvvkVA8949z/baTxUwffNh44khAe1+g2Whk+eJ6nSTVbII6EtFcEiPQbBaf2SQ4eyogMemcQPMpbgsF"
        "6+kKfLn9LNNZEAWq+Yx6LbiU1goLiqKwxT1UNZ/6Nhl2tfnyl8YzefFRYx6vk88erO1mE+O0wNN8OT/2k0SwaZaA16wSxDaTuqWv"
        "4x0Lu2odHbo1xRvTcuD0pRyYMiAX1p8eBts7DeGh8VDoH2Eubm53F/t8vkwc1R4vLt+dJ37rkwudW3Jh5PlciNPMg1GQB2GSwTA+"
        "chCM3TUAltbqQVeHrup3wD9duMD++KK0GlHM/lozdq/j9H97n4aovqegoGDn3zErEuXAX+vAvI/+s96H5N+/930/89eSpseyAQ0T"
        "+cDH2sopj3xY3Wd9IbFFwkodFsMpZzfl7UKfysNFhvzSnIB9Je3zWeOTbNziel3QG5OCL2o+wlbpWrDx9kLTDl+wS1sFe3VSgLzc"
        "Yb8WiXXyVGu/F5CnsY2rVMyTt1tHmiN5q1f0kBH75PGjG2lsr2sNDzP9gJsEf8PsXp5mUS6bWFSGO9e/cgcq91oJRpo3cLxLlHL/"
        "mAgVD5SVPdguEAeUka5IOZL/lI17P7ihEXvFTkQrQL5PH94Z2+Gjgx+DbqcMnI8dZ6MjgnFhTwaemJ4J2DCUNRRL8cqVWOxMqxMn"
        "H47luquThM5Hrdif94ZVD7RggEUda2qbzTfXXob8KA84oC+DC7fab1qYzoDpOcmwq1sO+qJk6DtZAr5zG9ktuwihdZ4Zis6vxZai"
        "bFhzZDUkvDEGmuMls8WCvpdZhc6b20KKzkykeU4yUCAG5KBZmRwDliYhzTU+9qqwK0rKbcbP4eFxA5QhU0OZwYNdrJ9rD4uuK4J3"
        "Fkkw7kgsTjsRrNwzomm6RrUJWsokSD6Ee2bjtOemqvlneuxznPUwSzX3+yX+bHGVHDe9vMtojp5fRWLwthTM2uQlZBTIgeZZkB6O"
        "tsc9UGaeClu8nRnNNXnzE3Zocj2v75XJGicO4x07q9jX9jrQfu57dvvtZgh5PlC5O6wSvl1hrWwaddOGGJCFSthXp7KAvO+rm4pr"
        "zulWkucXR7ujj3Eu+nN/VZ4t3OSqvqvwM4DQDxOB8nz+C0uB+q4wOQjL1yULlGej5jSgvqtsjUM3vMM0ZzXwAVtaccakFqa1qJ5p"
        "LzvPDlyZy0cvPIZXzefjM+8dOOK7URnELHFJTBKzxCOxSMwSh8QgzYL6h85L/UxdQ7OgHqJzU09T19AsqI/o/NTX1DUx277ic1zP"
        "cgd2Exsr4plJhoSVu3zJ3kav4NsT9+KaXc7YEpQqNriz+5r1oNssI9lUlY3LlXJIf5ul6rtlWz1YlUubI2WBPAnpTAHbkzmqc4Qv"
        "kSN5UrXZHawWGKk678wBW4E86dhpiQcjAlTniFydBv7G7vxScw1vlw7jIfdms/vneliK21Gmt2I4j37hxIMdIvCweykbPNhgMflD"
        "n0EekD+0N82e/KE9aeYy5zQgXy4XRmOkPcdtaQtAp8wFyJdTKV/iogQ7eL00Fo5etEbypdek3pB0NwNKb+0T6s1uc6uTn1Y+MLyJ"
        "VU09TGf7WjZk7UL2YoMfDx5bAEnDAsBn6jW8fzf2IeWHMkL5oPxQNigXlB/KBOWB+KYOmj0iWdVDNEvinLpoh0c4I29ppsQ7dZKO"
        "lULlMc32g1PX+VVXfz6oUVfpEVHNfHxnsd+EOHbjjS4/VzWNj4/PxnO2JeKw4TVW9Bm0NzFDe9OexAztSXsRM5Qh8pBmSNyQX5Qh"
        "8pJmSdyQX5Qh8pRmStyQX4enXec1Rp/yIJMB/M7mNyzcuZblhngzqWIJf3XtEnp+JAKNk9os7XpRO30G7U0c0N60J/lPe9Je5PuP"
        "I7OA7kPyid4XZI0yYazgU0n3IflE7wv0N0jjduQi3YfkE70v5Nd8L4iW1PO61z/yC5Of4dkOL2Y54ShrkWmDS/wyvue4B1xuG4GR"
        "JYVg1vzgIfUKPTdlhXqFnpcyQr1Cz0nZSF1+WaBupmxTP9PZ2rrWqe5qyjb1NJ3N4WkYUFdTtqmv6Wxm0S28u7WBB1qN5TYanzO5"
        "6wI2+tUptl6aDS80lVhq0okdmcANzefbjpWMwbwWd4y7kgoPD2bhMXtL6J7pBoodg8U9v2XCx0OssM1vPBvfI8MpK0Ug27gEPkuM"
        "QcOaNLxx1kh4VyCD5v198OwXC3FPmTP6HUqHH+y12RVHGe78tS/cMTRz2qj3DTtz8CnazdvOqryi2aexfeHDR7Z8quYEZWviZPDM"
        "ni9uOzCkmbilTiduiFvqcuKGuKUOJ26ol4mpPnoK1R1JHUD9TGxtDPuFEV/UBdTTxJhEa53qjqRO6HCc6PR7yCJu3a3NDXo04F23"
        "F9tk0wveJa/g+40kuO7HNWyb/k4IyH1wL9dUAauawkG4I2YjpT+zM9sfCws7UnEPrMe9AXK8/8wV36WOw0JpLjp8E4+v950QZvtr"
        "QGZ5JoruDUIbIYfJE6QwZbUMNvZZLx7XEgRaaQrIb1gMS8+8FU8qNndaYvoJr1j0Ow6q7gcGXe3s1eIS1n09gNuXTYVnpVl/dO5l"
        "YAFiZ8opPS/dBZRPek66CyiX9Hx0F9A9RBm6scZT1b3UR3QPUYa2rh0L1L3US3QPUYZivLJU3Uv9lHnW2snw6wvCa9FYfjF5Oev0"
        "yWP9Dp5hNyut+EXdgfxe3n0oLYxhD7+odiRuqVeJTeKW+pSYJG6pR4nF4vNGQLxS59G7g/5uFPyMAlS8UufRu8PEe9EgrExQZYk6"
        "j94d6id9CREZ45xuLW/kL2z7Ks1cEhj59K1IwgITGP/BWoevNC8RrmbXomSXtNV8Xjb4zakXiOF+u3MrmisjVQwH5+fgXh6uYth/"
        "kgKIb9GGWIEYNytJQJeMnxhxfmO+Aon1akUaE63egMR77+PVAjHvtV4BuqJPnPzyT/G2y5a8/nAZO+2UxarKw1n1nBmgV+io9LU6"
        "hg3VOkq7lb9+EhuVg01HOljd66FQaDUcZQvkUJIXiAue+0M/tGGzOuJx4Cg5PpsQBMnLB7Eng+Kw6dAWODfURDDqHQ9Dem3BZ3cK"
        "mfevDqDrmQ5NqBDiLohVf+/o1eWA/wKf/Swk"
    ),
    "level1": (
        "eNrtmPtTFFcWx1vUUildSSqIliDIQ7Bnprvn9hkcHmEYwGitSEmJi2KIBI1mBdFYca1VV9EFzSZEGRccXxEzUZZhhpnp7gOCIKi8"
        "R3xWVo2vUETiK4lZ3eDiPtyeJbO6/gdr9efWmT7z7TPVNeee7/2hqWEUNZwaiok/hyz9D32l+5p/2LsvgVJQUFBQUFBQUFBQUFBQ"
        "UPi/xPfnGCHHyP8ohYax8uezLRQVOHzoXYDnno/SKgWFV9r/o1/y/7zhQzWjFf8rKLySjHgpXvR/zrDnNYr/FRRePTy+HvbCVcZQ"
        "PexqQunGAoM3LwwrOeHJV1J1hiH95Av6yf/WJwfV/5gf/wf6Fp2r+lfMwxkJYNb11sUU5ohGbEOd1kd9xVoGbsiBKuyVVgq/s9+M"
        "anItkz7BHszHTnKVXRXeUfNY6Oxb7v+boLlckvoX6g4Sf/yX5AM9TszKWmvbC2lsN7YdaoMiRyV2TX8T04QP+FMkRAxTl6Lo5GCj"
        "9gy0hZ7EEvsOeGsqRX08yY9NVz1hb8Q95XzVT9Rb0/ylQc5EjFgmJoKP2oC+djcM2NyQ4eiVVvBuTGX6+GXSRedMR7+Uy19lW/DO"
        "pSn9saRX3cgCtyiuoHo1ya1tvht6gQ2cNYUNOQKVUAWXuU6ugYubOit0fhgbXhteDXZwgAsEqOYOcJ9ym7nVHEXt1RS9lqjxrLNx"
        "FBXAU1RFRcWhobYfBs96xHnW8/0ZUp/f8ay1fpc794zZQSdzq2ktTx8vtrTrzy/KPPqQrsBLjnQccDXxWaKZlPDzYJBrkHJEE8km"
        "ZeJOSadNBL1gwGy2DHztB17bYbEGxWoCmEeqlNhpM9ZZe+vUyZtaTPyArQoXON3Y5GrFmY5OohG72TNQzH0urNK2wFnNY3ELfgzN"
        "USNxChZNWzHqLz47gydxM7itzLHYPdFzSD30fH3/5m9JKnTCbPg1cTMmGy00S5/BUX6U9iGttdH7ApwfienYhRZsx2TMEo84Bin6"
        "e4rKVY3XXGOjdUYIwp+OfxF4PW2CkC/Og/0Yqc0mdJBZ/gc1dAeyrIlvlTJwcXUbLHAWSXPFReBLt+Im9kN78LR6VSCTzm3XBIC5"
        "/hvdxobrU2/Kncij98BOaSEWHM5mjaIVrSTDcRpXChZOD338fOsneEOcY8/lV8Cq8Eh82RsvR7c50FBY2mzgTNknvPn309Yabs85"
        "Z3hmfJrg0b25V/fWe3OP/igiMtFb7809OkVtl14PHMNKzGLmcmxj7T3xPgbapu665BjkcsQmvkzUaUt4A5aBiTfiHmhDt9wJH3XB"
        "4SvWVKZV/mbFHOiXhl1ZUR4brFHn00mqvLjw2nFiVvgbty1X/NhwwUTawYyJkEonBfvaW6VMqJR/14pFUgpxu1KZcusmNkNoJP3S"
        "Uthhq9idFXWMvsVWa67rR8WapA0af/83lufRlZjhWIhuVx9vFBtJLp8LFu6f0qDwDxJEbogp0hHtZNgsROIkbgswNdKfKCo1+Bbb"
        "pApTHYgdhHpyvO5O/+8fdMrT8ZB2MwHOdGyW2uWZmCBU4Gx5pv3Y/fJUb1M18e0gTwDphhI+lb63N/QqRYUxFjpCvVqfEHsQ340o"
        "mNzJVKAfO8gNuNqhTHZBKm3ADjSRPNqImbC4OhEWoo86hcjTYjeKsu+FAfOThr9Puc0mMUvp+LjNdRSXEFVyrfK+iWTKp1UipJBU"
        "xteeIfRLpbCCt3A3o5rtxZaLzhtivnxy2bEFI/GxsL1GV/rlznj/JbRVE89lxM0ld1wjdRG99x7MA/n5fDZZXL3AqRcWyd39o2PA"
        "ZiVVWArn5RNHD02uYst6fqZjjr2T2PG9ykocFT1a9ZQezxyEv9Wajv01ZmJkNiHCLPEdKMd0LU3sIbtgjZA7vQWHc3H8WFyO56qa"
        "IMIVJo0TV0FMVAO+xZ1Zfypgm/819VNVCmeO+ajhS+13oXdrJvQe5bW2Cgxwdsk9bccjDjPJF/3YLvmsCBcite1gY+S+oVmeiS7J"
        "gEnBma7Euxf8A7gl9BguP+590aH6ETLL733bDdv5O9NLmA+dS/CidBojxbcFO2rwzzWvc59iheuoegQ0woWwr0kPRPM/RL7sH33V"
        "rMQNfT0JiezwE9587Nn1Bk9+SC8ZvLon9+gUJZ4rHJ3GZbJLNc2xOlKO5dFvZsYbZ2MXNEjbVDZmp9QNXVI2y7J59HxxjzzLbfJu"
        "J2sLDrtdvrRR3C07opEUh1AUcG+rRLWOWRdTqo+fMU79YGlbXAe2SgO2xdVFkhsXwSZ2puMcVwq50M3+VFMvFluCSAs843l5xzcL"
        "zVFG/rPx7/VQFFEHcO/T38Wk69+tSamb+3nhN/tBdBCh5mA7X45HcCtvD+mGWeJk+zugw3wmXetGmixTX5d2QYRjjXAGlug6Do7k"
        "azW71cWqDeRmQ0Ptr+ph9S3dF7iKbeG+cp2GNtFJiqezeAq/IgeiQnAd+FmjYA2O0pzTroSz9m+FHjgv/BvQUGzk"
    ),
    "level2": (
        "eNrtlflTE2ccxt+wCYcNAawhcQAvDjO7m2SNCQkbIIhO2ynCqIhUWoeCHA6lMHVqnQErl0DrWAENh0ilpVNaQBEJQQ5BUxF6oEWG"
        "QkDlvr0wQUmCrCVKWst/UGc/O8/us89+f9jZeZ99AQUACLwSe0lm4L8MZ59pflRwxhuQkJCQkJCQkJCQkJCQkJD8L1mxJOqiaC+T"
        "ZBl98fwiCQDUDADK0jMz8lORkLzR/bdc1v+Pl0pvSfafhOSNhLpMr/f/5eZP7v8kJG8sZks1N/u37rJyito7OzFOZvLJzieajD4G"
        "1Mpe5ddey6/9M7/VqW4m1vNruB8ORwiPx2JvYb5osNYjGWaAlsJYPaGF7MVhWT5O5sCqV5GxF2sbjmJ+4eSP+aIMtFXg2fC+4DNJ"
        "DTskJEpfBY4Qu6FTDI/hXl6h+fZHvxLplLC5d9YDcHy1LX8nMse/KzVgK9A5NCWAqVB1MzgzhYwIIpIIsh8CZZNOfotXBWWic80Y"
        "LhhEG/lCbK80rjxeEK5sntzQkZKaapifv9rcnHYsPSNzfn7++fOmK42NDQAUcI/Z+XCNx00pAKzNABQXF59LSkoyGAwqlSop6ZV9"
        "eaNSHbTtbsuzyoS3YvHwps1wQ3rJDcmfe4N/zKPuonuNIz0jGhUb7u7iOLTM4IwqfcRZu8ySMiecy+JpkG24m/hQ2WAtuvXI1dFI"
        "KAD4gKBeroJoFLYtlDpb6LJWrTwebfHE7OTa1ZgYS+FdxvPc/QR1wvaB6Xt/PSGedJ2PwtmGsV/yoo/u4NAXf9EMJFAP4IcAhCM2"
        "3D6+u2iL0KnmacMPjncCpLCGdr0rRY/ngoujbHoMEeCAaE+DS5+fX+tWhzjydmIZXJYwv25ElFh/Z/09jC3XO9ATq1BIHUQRNz2e"
        "/NTcJXxoNsNu+VpZrt/yHWXJ2c0yLGdfk8k/dDsoG/W7JXuxxeBtzE3elJvmTd6Ya1w3+pjmTd6YA5ChWOloxVfwPuR1443Kqerp"
        "GseK9Vm7VPA4p2WEoR9l6AERUJgYWwYISGtP6YnOxddy0VjYF/lE6qK0rg5xWTVa0lMp7SZoM/LUCLYGIoBDp6ws9pJEbT+bWVF8"
        "KoRzGe7nl3PvSCzwHEUCl8lcFSWHguiySVQ9pG1iYnc7XNb8/sDdTvlsn+InALav7edfQZyRs7heWCdoqJ0YS7tPjOWd30FnA0RK"
        "td5VSfMqGCdSeogR+VTBBjUAzrwS2BWNl3jjRTVhrnEObTxqpcqL4PTIGaBbztDEzNALO7URKCF5lj9XP79mlO/L2w97So/WAsyb"
        "c6KvdLpbQ8x0lkVI7HVDTVmhCX4uVgCi2GEhouyuk57MULiM64ntlvoLJqpoItfBqfsaMNoVE4BrQWCkGtJNgMc+CcNB4b1QZGlp"
        "jYW7JWKAbXhFQp0y5/KsB3vjPgGOammtt9N04hxKzcDbK+IX3lvHf/oNpe6PwypWKrMPNSDbsHyPr+q7Nj3YMHnBfnAsmroDeIHA"
        "HriSUEmvExUcml7OZqQGV/lMdjBZWChshcVKD1RXIjPC4NypcWLkdLn/WywKVwLZfqA09z03vZDeRwycWL6eJD+/u/im7d4+fKjJ"
        "5Ok3D8uM/pxEITPlRm/MAai+lWwZgAXz93ObcZEgtybX3SvYc4s1wS6ocCDYVRfliB4i6DcSZadRHaROXweAEPsIqUZFvEMe2RJP"
        "sTV6f3+LFLAjYxyA9lLQVZ1WEeyW0LEwZQO5Zw18axPZDoAAZWEH4AceOyVhF7bV+n+fPKIPxL8cp1FH0gg0QmtT3gpuF7F0e8RE"
        "qKi1iLZZyT2FpiMJgnv19co9dcL4fhG1qlm24KrOsaX0nbR7GvfQ6rv22dBNLwR/AwxMbbQ="
    ),
    "level1_defaults_sh0": (
        "eNpjYGRgACIwloBiEBsVHNgPxPYMo2AUjIJRMApGwSgYBaNgFIyCUTAKRsEoGJIA1udnYIT1+xc48ADJ//UMDAFMEDWMo8E0CkbB"
        "sM3/DAwKDv5zJB1O2H63Z2Cw5mpkdtAFwbPWDAzixgwM8+fPn3eL1cnQw75T655WkvY/y/fmdibTTR9ss2yI1k1hFbf0NXDS4dM5"
        "ZmSzy8uo0GKLRFTUCjZZRj8LAf1A7e/6d6x/GXDpfNdp9BPdrKf1Qc/O9oHObn0Tg0jrvFX5Rklb971QuuDFLKL5mrFdy9kgX8vQ"
        "WGtX66KjFucjw5euM9nMGMAmaWBu0Ki33WqambfRDpMz91/dTTXuNmBgSNLm172lb2bqaCK75euuxTK3/VqZL4YoWlrpiut90nax"
        "UjMvXflgm45zzf4NoXs5PlrL6AUatOmKm0zf8di0eudtxbsGO1iXREeycepv1ovWu2a1e+vLTa+2yKxW7GfT4A9ltNmudU9/le5t"
        "C3ariZurdEVFRdL8w3drKlo90XfSS9aysa7bxmBgp9Fza9mrHQbzQn+z6erkaDlpZ1urbOXdFKUi8mTR9dKoLpZ/bPf092gra8+2"
        "+mmyw2jXtudPm183hB/R38OgrLdIS1Un38LOas6WRNU86eN6RlF3o/facWj/0uLXm2PyY+vE7V8sJdRjjQ6F+ob8ZonXWqlrYxBi"
        "7Wv0fAOrqeqDl6+FW7w4OVlv6fzSdjGYbtmx84rhG6UXa8UeJPX/NfK2EDeI1+I0yLHO2LRO+4NJ+NSXzxb0MDBssYvR3qRjqldq"
        "OcHCxpxX53XyEWv5tnDNCcx+BuH6ybr7rEyNpm6ZamYbbuN4ZkJfkIv9Vt1JOq3aVUZ3d+7cGrbDJP+eqV2nSMxdRiMdcYMMrTeW"
        "gRaJa122+S5seAwAJHro7A=="
    ),
}
