"""Niantic's .spz and PlayCanvas's .sog: files written by writers in this test, written from the
formats' published descriptions (nianticlabs/spz README "File Format" and load-spz.cc;
playcanvas/splat-transform read-sog.ts), are read within their quantisation and render like the
uncompressed scene; our .spz writer round-trips; bad files fail clearly; `splat convert` reads them."""

from __future__ import annotations

import gzip
import io
import json
import math
import struct
import zipfile

import numpy as np
import pytest
import torch

from helpers import assert_renders_alike, random_scene, same_rotation

from streamstudio.app.cli import main
from streamstudio.errors import StreamStudioError
from streamstudio.models.splats.gaussians import GaussianScene, load_scene, save_scene

C0 = 0.28209479177387814


# --------------------------------------------------------------------------- .spz, written from the README

# parity of the 15 non-DC SH basis functions under (x, y, z) -> (x, -y, -z), from the polynomials
# y, z, x | xy, yz, 2zz-xx-yy, xz, xx-yy |
# y(3xx-yy), xyz, y(4zz-xx-yy), z(2zz-3xx-3yy), x(4zz-xx-yy), z(xx-yy), x(xx-3yy)
PARITY = np.array([-1, -1, 1, -1, 1, 1, -1, 1, -1, 1, -1, -1, 1, -1, 1], dtype=np.float64)


def spz_bytes(scene: GaussianScene, version: int = 3, frac: int = 12, antialiased: bool = False,
              axes: str = "rub") -> bytes:
    """A .spz (version 2 or 3, gzip) as the README lays it out; the scene's RDF axes go to RUB, or
    with axes "rdf" stay as they are, as PlayCanvas splat-transform writes its .spz (its
    src/lib/spz-module.ts: "data is baked to PLY/RDF space before saving and written with
    `from: UNSPECIFIED`")."""
    n, degree = len(scene), scene.sh_degree
    flip = np.array([1, -1, -1]) if axes == "rub" else np.ones(3)
    m = scene.means.double().numpy() * flip
    fixed = np.round(m * 2 ** frac).astype(np.int64).reshape(-1)
    pos = b"".join(int(v & 0xFFFFFF).to_bytes(3, "little") for v in fixed)
    alpha = bytes(int(np.clip(round(255 / (1 + math.exp(-float(o)))), 0, 255)) for o in scene.opacity_logits)
    colors = bytes(int(np.clip(round(float(c) * 0.15 * 255 + 127.5), 0, 255)) for c in scene.sh[:, 0].reshape(-1))
    scales = bytes(int(np.clip(round((float(s) + 10) * 16), 0, 255)) for s in scene.log_scales.reshape(-1))
    rots = bytearray()
    for w, x, y, z in torch.nn.functional.normalize(scene.quats.double(), dim=-1).tolist():
        q = [x, -y, -z, w] if axes == "rub" else [x, y, z, w]  # x y z w
        if version == 2:
            s = 1 if w >= 0 else -1
            rots += bytes(int(np.clip(round(s * c * 127.5 + 127.5), 0, 255)) for c in q[:3])
            continue
        big = max(range(4), key=lambda i: abs(q[i]))
        if q[big] < 0:
            q = [-c for c in q]
        word = big
        for i in range(4):
            if i != big:
                word = ((word << 10) | ((1 if q[i] < 0 else 0) << 9)
                        | min(511, int(abs(q[i]) / math.sqrt(0.5) * 511 + 0.5)))
        rots += word.to_bytes(4, "little")
    dim = {0: 0, 1: 3, 2: 8, 3: 15}[degree]
    rest = scene.sh[:, 1:].double().numpy() * (PARITY[:dim, None] if axes == "rub" else 1)  # (N, dim, 3)
    sh = np.clip(np.round(rest * 128 + 128), 0, 255).astype(np.uint8).tobytes()
    head = struct.pack("<IIIBBBB", 0x5053474E, version, n, degree, frac, 1 if antialiased else 0, 0)
    return gzip.compress(head + pos + alpha + colors + scales + bytes(rots) + sh)


@pytest.mark.parametrize("version, degree", [(3, 0), (3, 1), (3, 3), (2, 2)])
def test_spz_from_the_description_reads_within_quantisation_and_renders_alike(tmp_path, version, degree):
    scene = random_scene(400, degree, seed=degree + version)
    f = tmp_path / "s.spz"
    f.write_bytes(spz_bytes(scene, version))
    got = load_scene(f)
    assert len(got) == 400 and got.sh_degree == degree and not got.antialiased
    assert float((got.means - scene.means).abs().max()) <= 0.5 / 4096 + 1e-6
    assert float((got.log_scales - scene.log_scales).abs().max()) <= 1 / 32 + 1e-5
    assert (float((torch.sigmoid(got.opacity_logits) - torch.sigmoid(scene.opacity_logits)).abs().max())
            <= 0.5 / 255 + 1e-4)
    assert float((got.sh[:, 0] - scene.sh[:, 0]).abs().max()) <= 0.5 / (0.15 * 255) + 1e-5
    assert float(same_rotation(got.quats, scene.quats).min()) > (0.999 if version == 3 else 0.99)
    if degree:
        assert float((got.sh[:, 1:] - scene.sh[:, 1:]).abs().max()) <= 0.5 / 128 + 1e-5
    assert_renders_alike(scene, got, degree, mean_tol=4e-3 if version == 3 else 1e-2)


def test_spz_axes_a_known_gaussian(tmp_path):
    """Position y and z, the quaternion's y and z and the degree-1 y/z coefficients flip between spz's
    RUB and the PLY's RDF: one Gaussian, decoded by hand."""
    scene = GaussianScene(means=torch.tensor([[1.0, 2.0, 3.0]]), quats=torch.tensor([[0.8, 0.0, 0.6, 0.0]]),
                          log_scales=torch.tensor([[-2.0, -1.0, -3.0]]), opacity_logits=torch.tensor([0.0]),
                          sh=torch.tensor([[[0.5, 0.0, -0.5], [0.25, 0, 0], [0.5, 0, 0], [0.75, 0, 0]]]))
    raw = gzip.decompress(spz_bytes(scene, 3))
    assert raw[16:19] == (4096).to_bytes(3, "little") and raw[19:22] == ((-8192) & 0xFFFFFF).to_bytes(3, "little")
    f = tmp_path / "one.spz"
    f.write_bytes(gzip.compress(raw))
    got = load_scene(f)
    assert got.means.tolist() == [[1.0, 2.0, 3.0]]
    assert float(same_rotation(got.quats, scene.quats)) > 0.9999
    np.testing.assert_allclose(got.sh[0, 1:, 0].numpy(), [0.25, 0.5, 0.75], atol=1 / 128)


def test_a_spz_written_as_splat_transform_writes_it_loads_upright_with_rdf_axes(tmp_path, capsys):
    """splat-transform writes .spz without spz's RUB conversion (issue 28: its files loaded upside
    down). Read as the spec's RUB, such a file comes out mirrored in y and z; `--spz-axes rdf`
    (and the Splats tab's choice) reads it as written, within quantisation."""
    scene = random_scene(300, 1, seed=11)
    f = tmp_path / "from_splat_transform.spz"
    f.write_bytes(spz_bytes(scene, 3, axes="rdf"))
    as_rub = load_scene(f)
    np.testing.assert_allclose(as_rub.means.numpy(), scene.means.numpy() * [1, -1, -1], atol=0.5 / 4096 + 1e-6)
    got = load_scene(f, spz_axes="rdf")
    assert float((got.means - scene.means).abs().max()) <= 0.5 / 4096 + 1e-6
    assert float(same_rotation(got.quats, scene.quats).min()) > 0.999
    assert float((got.sh[:, 1:] - scene.sh[:, 1:]).abs().max()) <= 0.5 / 128 + 1e-5
    assert_renders_alike(scene, got, 1, mean_tol=4e-3)
    out = tmp_path / "upright.ply"
    assert main(["splat", "convert", str(f), str(out), "--spz-axes", "rdf"]) == 0
    assert float((load_scene(out).means - scene.means).abs().max()) <= 0.5 / 4096 + 1e-6
    with pytest.raises(StreamStudioError, match="axes 'luf'"):
        load_scene(f, spz_axes="luf")


def test_spz_writer_round_trip_and_antialiased_flag(tmp_path):
    scene = random_scene(300, 3, seed=5)
    scene.antialiased = True
    f = tmp_path / "ours.spz"
    save_scene(scene, f)
    got = load_scene(f)
    assert got.antialiased and got.sh_degree == 3
    assert float((got.means - scene.means).abs().max()) <= 0.5 / 4096 + 1e-6
    assert float(same_rotation(got.quats, scene.quats).min()) > 0.999
    # spz's default SH quantisation: degree 1 on 5 bits (buckets of 8), 2..3 on 4 bits (16)
    assert float((got.sh[:, 1:4] - scene.sh[:, 1:4]).abs().max()) <= 4.5 / 128 + 1e-5
    assert_renders_alike(scene, got, 3, mean_tol=6e-3)
    # our writer and the description's agree on everything but the SH buckets
    ref = load_scene_bytes(tmp_path, spz_bytes(scene, 3, antialiased=True))
    for name in ("means", "log_scales", "opacity_logits"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), atol=1e-6, rtol=0)
    step = 1 / (0.15 * 255)  # float32 vs float64 rounding may land a value one step apart
    assert float((got.sh[:, 0] - ref.sh[:, 0]).abs().max()) <= step + 1e-6
    assert float((got.sh[:, 0] != ref.sh[:, 0]).float().mean()) < 0.01


def load_scene_bytes(tmp_path, data: bytes, name="ref.spz") -> GaussianScene:
    f = tmp_path / name
    f.write_bytes(data)
    return load_scene(f)


@pytest.mark.parametrize("data, message", [
    (b"garbage", "not a .spz"),
    (gzip.compress(b"NGSP", mtime=0), "truncated"),
    (gzip.compress(struct.pack("<IIIBBBB", 0x12345678, 3, 1, 0, 12, 0, 0), mtime=0), "NGSP"),
    (gzip.compress(struct.pack("<IIIBBBB", 0x5053474E, 3, 10, 0, 12, 0, 0) + b"\0" * 20, mtime=0), "truncated"),
    (gzip.compress(struct.pack("<IIIBBBB", 0x5053474E, 9, 1, 0, 12, 0, 0), mtime=0), "version 9"),
    (gzip.compress(struct.pack("<IIIBBBB", 0x5053474E, 3, 1, 4, 12, 0, 0), mtime=0), "SH degree 4"),
    (struct.pack("<IIIBBBBI", 0x5053474E, 4, 1, 0, 12, 0, 6, 32) + b"\0" * 12, "zstandard"),
])
def test_bad_spz_files_fail_clearly(tmp_path, data, message):
    if message == "zstandard":
        try:
            import zstandard  # noqa: F401
            pytest.skip("zstandard is installed: version 4 is read")
        except ImportError:
            pass
    with pytest.raises(StreamStudioError, match=message):
        load_scene_bytes(tmp_path, data, "bad.spz")


# --------------------------------------------------------------------------- .sog, written from read-sog.ts


def _webp(rgba: np.ndarray) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="WEBP", lossless=True, quality=100)
    return buf.getvalue()


def _texture(rows: np.ndarray, width: int) -> np.ndarray:
    """(N, 4) uint8 texels -> (H, width, 4) image, row by row, padded."""
    h = -(-len(rows) // width)
    out = np.zeros((h * width, 4), np.uint8)
    out[:len(rows)] = rows
    return out.reshape(h, width, 4)


def _codebook(values: np.ndarray):
    code = np.linspace(values.min(), values.max(), 256)
    idx = np.abs(values[..., None] - code).argmin(-1).astype(np.uint8)
    return code.tolist(), idx


def sog_files(scene: GaussianScene) -> dict[str, bytes]:
    """meta.json and WebP images of SOG version 2 for the scene, from the description."""
    n, degree = len(scene), scene.sh_degree
    width = max(1, math.ceil(math.sqrt(n)))
    m = scene.means.double().numpy()
    lm = np.sign(m) * np.log1p(np.abs(m))
    mins, maxs = lm.min(0), lm.max(0)
    q16 = np.round((lm - mins) / (maxs - mins) * 65535).astype(np.int64)
    a = np.full((n, 1), 255, np.uint8)
    lo = np.concatenate([(q16 & 255).astype(np.uint8), a], 1)
    hi = np.concatenate([(q16 >> 8).astype(np.uint8), a], 1)
    s_code, s_idx = _codebook(scene.log_scales.double().numpy())
    q = torch.nn.functional.normalize(scene.quats.double(), dim=-1).numpy()  # w x y z
    big = np.abs(q).argmax(1)
    q = q * np.where(q[np.arange(n), big] < 0, -1.0, 1.0)[:, None]
    others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[big]
    three = q[np.arange(n)[:, None], others]
    quat = np.concatenate([np.round((three * math.sqrt(2) + 1) / 2 * 255).clip(0, 255).astype(np.uint8),
                           (252 + big)[:, None].astype(np.uint8)], 1)
    c_code, c_idx = _codebook(scene.sh[:, 0].double().numpy())
    alpha = np.round(torch.sigmoid(scene.opacity_logits.double()).numpy() * 255).astype(np.uint8)[:, None]
    files = {"means_l.webp": _webp(_texture(lo, width)), "means_u.webp": _webp(_texture(hi, width)),
             "scales.webp": _webp(_texture(np.concatenate([s_idx, a], 1), width)),
             "quats.webp": _webp(_texture(quat, width)),
             "sh0.webp": _webp(_texture(np.concatenate([c_idx, alpha], 1), width))}
    meta = {"version": 2, "count": n, "means": {"mins": mins.tolist(), "maxs": maxs.tolist(),
                                                 "files": ["means_l.webp", "means_u.webp"]},
            "scales": {"codebook": s_code, "files": ["scales.webp"]}, "quats": {"files": ["quats.webp"]},
            "sh0": {"codebook": c_code, "files": ["sh0.webp"]}}
    if degree:
        coeffs = {1: 3, 2: 8, 3: 15}[degree]
        rest = scene.sh[:, 1:].double().numpy()  # (N, coeffs, 3): one palette entry per Gaussian
        r_code, r_idx = _codebook(rest)
        cen = np.zeros((-(-n // 64), 64 * coeffs, 4), np.uint8)
        cen[..., 3] = 255
        for i in range(n):
            cen[i // 64, (i % 64) * coeffs:(i % 64 + 1) * coeffs, :3] = r_idx[i]
        labels = np.stack([np.arange(n) & 255, np.arange(n) >> 8, np.zeros(n), np.full(n, 255)], 1).astype(np.uint8)
        files["shN_centroids.webp"] = _webp(cen)
        files["shN_labels.webp"] = _webp(_texture(labels, width))
        meta["shN"] = {"count": n, "bands": degree, "codebook": r_code,
                       "files": ["shN_centroids.webp", "shN_labels.webp"]}
    files["meta.json"] = json.dumps(meta).encode()
    return files


@pytest.mark.parametrize("degree, bundled", [(0, True), (1, True), (3, False)])
def test_sog_from_the_description_reads_and_renders_alike(tmp_path, degree, bundled):
    scene = random_scene(300, degree, seed=10 + degree)
    files = sog_files(scene)
    if bundled:
        path = tmp_path / "scene.sog"
        with zipfile.ZipFile(path, "w") as z:
            for name, data in files.items():
                z.writestr(name, data)
    else:
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
        path = tmp_path / "meta.json"
    got = load_scene(path)
    assert len(got) == 300 and got.sh_degree == degree
    assert float((got.means - scene.means).abs().max()) < 1e-3
    assert float(same_rotation(got.quats, scene.quats).min()) > 0.995
    step = float(scene.log_scales.max() - scene.log_scales.min()) / 255
    assert float((got.log_scales - scene.log_scales).abs().max()) <= step / 2 + 1e-5
    if degree:
        step = float(scene.sh[:, 1:].max() - scene.sh[:, 1:].min()) / 255
        assert float((got.sh[:, 1:] - scene.sh[:, 1:]).abs().max()) <= step / 2 + 1e-5
    assert_renders_alike(scene, got, degree, mean_tol=4e-3)


def test_bad_sog_files_fail_clearly(tmp_path):
    scene = random_scene(20, 0)
    files = sog_files(scene)
    meta = json.loads(files["meta.json"])
    for change, message in [({"version": 1}, "version 1"), ({"model": "2dgs"}, "2dgs"), ({"count": 10 ** 4}, "texels")]:
        path = tmp_path / f"bad{len(message)}.sog"
        with zipfile.ZipFile(path, "w") as z:
            for name, data in files.items():
                z.writestr(name, json.dumps({**meta, **change}) if name == "meta.json" else data)
        with pytest.raises(StreamStudioError, match=message):
            load_scene(path)
    path = tmp_path / "missing.sog"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("meta.json", files["meta.json"])
    with pytest.raises(StreamStudioError, match="lacks means_l.webp"):
        load_scene(path)


def test_a_damaged_or_truncated_sog_zip_and_an_empty_splat_fail_clearly(tmp_path):
    """A .sog whose member header is garbled raised zipfile's BadZipFile; a truncated one was read
    as a meta.json ("meta.json is not JSON"); a 0-byte .splat rendered a black video, exit 0."""
    files = sog_files(random_scene(20, 0))
    good = io.BytesIO()
    with zipfile.ZipFile(good, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    raw = bytearray(good.getvalue())
    raw[0:4] = b"XXXX"  # the first member's local header signature (PK\3\4): the central directory still reads
    (tmp_path / "garbled.sog").write_bytes(bytes(raw))
    with pytest.raises(StreamStudioError, match=r"garbled.sog: the bundle's .* is damaged .*export it again"):
        load_scene(tmp_path / "garbled.sog")
    crc = bytearray(good.getvalue())
    offset = crc.find(b"PK\x03\x04") + 30 + len(next(iter(files)))  # the first member's data (stored: no compression)
    crc[offset] ^= 0xFF
    (tmp_path / "crc.sog").write_bytes(bytes(crc))
    with pytest.raises(StreamStudioError, match="is damaged"):
        load_scene(tmp_path / "crc.sog")
    (tmp_path / "truncated.sog").write_bytes(good.getvalue()[: len(raw) // 2])
    with pytest.raises(StreamStudioError, match="truncated or damaged"):
        load_scene(tmp_path / "truncated.sog")
    (tmp_path / "empty.splat").write_bytes(b"")
    with pytest.raises(StreamStudioError, match="holds no Gaussians"):
        load_scene(tmp_path / "empty.splat")
    assert main(["splat", str(tmp_path / "empty.splat"), "--frames", "1", "--size", "32x32",
                 "--output", str(tmp_path / "o.mp4")]) == 1 and not (tmp_path / "o.mp4").exists()


def test_convert_reads_spz_and_sog_and_writes_spz(tmp_path, capsys):
    scene = random_scene(200, 1, seed=3)
    (tmp_path / "a.spz").write_bytes(spz_bytes(scene, 3))
    with zipfile.ZipFile(tmp_path / "b.sog", "w") as z:
        for name, data in sog_files(scene).items():
            z.writestr(name, data)
    assert main(["splat", "convert", str(tmp_path / "a.spz"), str(tmp_path / "a.ply")]) == 0
    assert main(["splat", "convert", str(tmp_path / "b.sog"), str(tmp_path / "b.compressed.ply")]) == 0
    assert main(["splat", "convert", str(tmp_path / "a.ply"), str(tmp_path / "c.spz")]) == 0
    assert "Niantic's .spz" in capsys.readouterr().out
    assert_renders_alike(scene, load_scene(tmp_path / "c.spz"), 1, mean_tol=6e-3)
    assert_renders_alike(scene, load_scene(tmp_path / "b.compressed.ply"), 1, mean_tol=6e-3)
