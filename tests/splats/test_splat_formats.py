"""Scene formats users bring: SuperSplat's compressed .ply (read from files written by gsplat's own
`ply_compressed` exporter and by hand from the published layout; written back by
`save_compressed_ply`), compared parameter by parameter within the quantisation error and as
renders against the equivalent uncompressed scene."""

from __future__ import annotations

import math
import struct
from io import BytesIO

import numpy as np
import pytest
import torch

from streamstudio.errors import StreamStudioError
from streamstudio.models.splats.gaussians import (
    SH_C0,
    GaussianScene,
    load_scene,
    save_compressed_ply,
    save_format,
    save_scene,
)
from streamstudio.pipelines.splats.splat_render import (
    SceneFit,
    SplatRenderConfig,
    fitted_camera,
    render,
)

# ----------------------------------------------------------------------------------------------
# gsplat's reference writer of the compressed .ply: `gsplat/exporter.py` of gsplat 1.5.3 (pure
# Python; the package is not a dependency here), the functions below copied verbatim but for their
# docstrings. Copyright the Regents of the University of California, Nerfstudio Team and
# contributors; Apache License 2.0. `test_embedded_gsplat_writer_is_gsplats` checks it against the
# installed package where there is one.
# ----------------------------------------------------------------------------------------------

def sh2rgb(sh: torch.Tensor) -> torch.Tensor:
    C0 = 0.28209479177387814
    return sh * C0 + 0.5


def part1by2_vec(x: torch.Tensor) -> torch.Tensor:

    x = x & 0x000003FF
    x = (x ^ (x << 16)) & 0xFF0000FF
    x = (x ^ (x << 8)) & 0x0300F00F
    x = (x ^ (x << 4)) & 0x030C30C3
    x = (x ^ (x << 2)) & 0x09249249
    return x


def encode_morton3_vec(
    x: torch.Tensor, y: torch.Tensor, z: torch.Tensor
) -> torch.Tensor:
    return (part1by2_vec(z) << 2) + (part1by2_vec(y) << 1) + part1by2_vec(x)


def sort_centers(centers: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    # Compute min and max values in a single operation
    min_vals, _ = torch.min(centers, dim=0)
    max_vals, _ = torch.max(centers, dim=0)

    # Compute the scaling factors
    lengths = max_vals - min_vals
    lengths[lengths == 0] = 1  # Prevent division by zero

    # Normalize and scale to 10-bit integer range (0-1024)
    scaled_centers = ((centers - min_vals) / lengths * 1024).floor().to(torch.int32)

    # Extract x, y, z coordinates
    x, y, z = scaled_centers[:, 0], scaled_centers[:, 1], scaled_centers[:, 2]

    # Compute Morton codes using vectorized operations
    morton = encode_morton3_vec(x, y, z)

    # Sort indices based on Morton codes
    sorted_indices = indices[torch.argsort(morton).to(indices.device)]

    return sorted_indices


def pack_unorm(value: torch.Tensor, bits: int) -> torch.Tensor:

    t = (1 << bits) - 1
    packed = torch.clamp((value * t + 0.5).floor(), min=0, max=t)
    # Convert to integer type
    return packed.to(torch.int64)


def pack_111011(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    # Pack each component using pack_unorm
    packed_x = pack_unorm(x, 11) << 21
    packed_y = pack_unorm(y, 10) << 11
    packed_z = pack_unorm(z, 11)

    # Combine the packed values using bitwise OR
    return packed_x | packed_y | packed_z


def pack_8888(
    x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    # Pack each component using pack_unorm
    packed_x = pack_unorm(x, 8) << 24
    packed_y = pack_unorm(y, 8) << 16
    packed_z = pack_unorm(z, 8) << 8
    packed_w = pack_unorm(w, 8)

    # Combine the packed values using bitwise OR
    return packed_x | packed_y | packed_z | packed_w


def pack_rotation(q: torch.Tensor) -> torch.Tensor:

    # Normalize each quaternion
    norms = torch.linalg.norm(q, dim=-1, keepdim=True)
    q = q / norms

    # Find the largest component index for each quaternion
    largest_components = torch.argmax(torch.abs(q), dim=-1)

    # Flip quaternions where the largest component is negative
    batch_indices = torch.arange(q.size(0), device=q.device)
    largest_values = q[batch_indices, largest_components]
    flip_mask = largest_values < 0
    q[flip_mask] *= -1

    # Precomputed indices for the components to pack (excluding largest)
    precomputed_indices = torch.tensor(
        [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]], dtype=torch.long, device=q.device
    )

    # Gather components to pack for each quaternion
    pack_indices = precomputed_indices[largest_components]
    components_to_pack = q[batch_indices[:, None], pack_indices]

    # Scale and pack each component into 10-bit integers
    norm = math.sqrt(2) * 0.5
    scaled = components_to_pack * norm + 0.5
    packed = pack_unorm(scaled, 10)  # Assuming pack_unorm is vectorized

    # Combine into the final 32-bit integer
    largest_packed = largest_components.to(torch.int64) << 30
    c0_packed = packed[:, 0] << 20
    c1_packed = packed[:, 1] << 10
    c2_packed = packed[:, 2]

    result = largest_packed | c0_packed | c1_packed | c2_packed
    return result


def splat2ply_bytes_compressed(
    means: torch.Tensor,
    scales: torch.Tensor,
    quats: torch.Tensor,
    opacities: torch.Tensor,
    sh0: torch.Tensor,
    shN: torch.Tensor,
    chunk_max_size: int = 256,
    opacity_threshold: float = 1 / 255,
) -> bytes:

    # Filter the splats with too low opacity
    mask = torch.sigmoid(opacities) > opacity_threshold
    means = means[mask]
    scales = scales[mask]
    sh0_colors = sh2rgb(sh0)
    sh0_colors = sh0_colors[mask]
    shN = shN[mask]
    quats = quats[mask]
    opacities = opacities[mask]

    num_splats = means.shape[0]
    n_chunks = num_splats // chunk_max_size + (num_splats % chunk_max_size != 0)
    indices = torch.arange(num_splats)
    indices = sort_centers(means, indices)

    float_properties = [
        "min_x",
        "min_y",
        "min_z",
        "max_x",
        "max_y",
        "max_z",
        "min_scale_x",
        "min_scale_y",
        "min_scale_z",
        "max_scale_x",
        "max_scale_y",
        "max_scale_z",
        "min_r",
        "min_g",
        "min_b",
        "max_r",
        "max_g",
        "max_b",
    ]
    uint_properties = [
        "packed_position",
        "packed_rotation",
        "packed_scale",
        "packed_color",
    ]
    buffer = BytesIO()

    # Write PLY header
    buffer.write(b"ply\n")
    buffer.write(b"format binary_little_endian 1.0\n")
    buffer.write(f"element chunk {n_chunks}\n".encode())
    for prop in float_properties:
        buffer.write(f"property float {prop}\n".encode())
    buffer.write(f"element vertex {num_splats}\n".encode())
    for prop in uint_properties:
        buffer.write(f"property uint {prop}\n".encode())
    buffer.write(f"element sh {num_splats}\n".encode())
    for j in range(shN.shape[1]):
        buffer.write(f"property uchar f_rest_{j}\n".encode())
    buffer.write(b"end_header\n")

    chunk_data = []
    splat_data = []
    sh_data = []
    for chunk_idx in range(n_chunks):
        chunk_end_idx = min((chunk_idx + 1) * chunk_max_size, num_splats)
        chunk_start_idx = chunk_idx * chunk_max_size
        splat_idxs = indices[chunk_start_idx:chunk_end_idx]

        # Bounds
        # Means
        chunk_means = means[splat_idxs]
        min_means = torch.min(chunk_means, dim=0).values
        max_means = torch.max(chunk_means, dim=0).values
        mean_bounds = torch.cat([min_means, max_means])
        # Scales
        chunk_scales = scales[splat_idxs]
        min_scales = torch.min(chunk_scales, dim=0).values
        max_scales = torch.max(chunk_scales, dim=0).values
        min_scales = torch.clamp(min_scales, -20, 20)
        max_scales = torch.clamp(max_scales, -20, 20)
        scale_bounds = torch.cat([min_scales, max_scales])
        # Colors
        chunk_colors = sh0_colors[splat_idxs]
        min_colors = torch.min(chunk_colors, dim=0).values
        max_colors = torch.max(chunk_colors, dim=0).values
        color_bounds = torch.cat([min_colors, max_colors])
        chunk_data.extend([mean_bounds, scale_bounds, color_bounds])

        # Quantized properties:
        # Means
        normalized_means = (chunk_means - min_means) / (max_means - min_means)
        means_i = pack_111011(
            normalized_means[:, 0],
            normalized_means[:, 1],
            normalized_means[:, 2],
        )
        # Quaternions
        chunk_quats = quats[splat_idxs]
        quat_i = pack_rotation(chunk_quats)
        # Scales
        normalized_scales = (chunk_scales - min_scales) / (max_scales - min_scales)
        scales_i = pack_111011(
            normalized_scales[:, 0],
            normalized_scales[:, 1],
            normalized_scales[:, 2],
        )
        # Colors
        normalized_colors = (chunk_colors - min_colors) / (max_colors - min_colors)
        chunk_opacities = opacities[splat_idxs]
        chunk_opacities = 1 / (1 + torch.exp(-chunk_opacities))
        chunk_opacities = chunk_opacities.unsqueeze(-1)
        normalized_colors_i = torch.cat([normalized_colors, chunk_opacities], dim=-1)
        color_i = pack_8888(
            normalized_colors_i[:, 0],
            normalized_colors_i[:, 1],
            normalized_colors_i[:, 2],
            normalized_colors_i[:, 3],
        )
        splat_data_chunk = torch.stack([means_i, quat_i, scales_i, color_i], dim=1)
        splat_data_chunk = splat_data_chunk.ravel().to(torch.int64)
        splat_data.extend([splat_data_chunk])

        # Quantized spherical harmonics
        shN_chunk = shN[splat_idxs]
        shN_chunk_quantized = (shN_chunk / 8 + 0.5) * 256
        shN_chunk_quantized = torch.clamp(torch.trunc(shN_chunk_quantized), 0, 255)
        shN_chunk_quantized = shN_chunk_quantized.to(torch.uint8)
        sh_data.extend([shN_chunk_quantized.ravel()])

    float_dtype = np.dtype(np.float32).newbyteorder("<")
    uint32_dtype = np.dtype(np.uint32).newbyteorder("<")
    uint8_dtype = np.dtype(np.uint8)

    buffer.write(
        torch.cat(chunk_data).detach().cpu().numpy().astype(float_dtype).tobytes()
    )
    buffer.write(
        torch.cat(splat_data).detach().cpu().numpy().astype(uint32_dtype).tobytes()
    )
    buffer.write(
        torch.cat(sh_data).detach().cpu().numpy().astype(uint8_dtype).tobytes()
    )

    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------- helpers


def make_scene(n: int, degree: int = 3, seed: int = 0) -> GaussianScene:
    """A random 3D scene in front of the origin (opacities > 1/255, so gsplat keeps every Gaussian)."""
    g = torch.Generator().manual_seed(seed)
    return GaussianScene(means=torch.randn(n, 3, generator=g) * 0.6,
                         quats=torch.randn(n, 4, generator=g),
                         log_scales=torch.randn(n, 3, generator=g) * 0.4 - 3.0,
                         opacity_logits=torch.randn(n, generator=g) * 1.5,
                         sh=torch.randn(n, (degree + 1) ** 2, 3, generator=g) * 0.4)


def gsplat_bytes(scene: GaussianScene) -> bytes:
    """What gsplat's `export_splats(..., format="ply_compressed")` writes for the scene."""
    n = len(scene)
    sh_n = scene.sh[:, 1:].permute(0, 2, 1).reshape(n, -1)  # export_splats: (N, K, 3) -> (N, 3K) channel-major
    return splat2ply_bytes_compressed(scene.means.clone(), scene.log_scales.clone(), scene.quats.clone(),
                                      scene.opacity_logits.clone(), scene.sh[:, 0].clone(), sh_n.clone())


def rotations(quats: torch.Tensor) -> torch.Tensor:
    w, x, y, z = torch.nn.functional.normalize(quats.double(), dim=-1).unbind(-1)
    return torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(-1, 3, 3)


def match_rows(back: GaussianScene, scene: GaussianScene) -> torch.Tensor:
    """For each Gaussian of `back` (reordered by the writer), the index of the nearest original."""
    d = torch.cdist(back.means.double(), scene.means.double())  # (N, N)
    idx = d.argmin(1)
    assert len(set(idx.tolist())) == len(scene), "the decoded Gaussians are not a permutation of the scene's"
    return idx


def chunk_ranges(scene: GaussianScene, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(N, C) the max - min over each Gaussian's chunk of `values` (in file order, original rows idx)."""
    v = values[idx].double()
    out = torch.empty_like(v)
    for start in range(0, len(idx), 256):
        sl = slice(start, start + 256)
        out[sl] = v[sl].max(0).values - v[sl].min(0).values
    return out


def assert_within_quantisation(back: GaussianScene, scene: GaussianScene, degree: int):
    """Every decoded parameter within the format's step of the original."""
    idx = match_rows(back, scene)
    orig = scene.subset(idx)
    pos_step = chunk_ranges(scene, idx, scene.means) / torch.tensor([2047.0, 1023.0, 2047.0])
    assert ((back.means.double() - orig.means.double()).abs() <= pos_step * 0.5 + 1e-6).all()
    scale_step = chunk_ranges(scene, idx, scene.log_scales) / torch.tensor([2047.0, 1023.0, 2047.0])
    assert ((back.log_scales.double() - orig.log_scales.double()).abs() <= scale_step * 0.5 + 1e-5).all()
    rgb = scene.sh[:, 0] * SH_C0 + 0.5
    rgb_step = chunk_ranges(scene, idx, rgb) / 255
    got_rgb, want_rgb = back.sh[:, 0].double() * SH_C0 + 0.5, orig.sh[:, 0].double() * SH_C0 + 0.5
    assert ((got_rgb - want_rgb).abs() <= rgb_step * 0.5 + 1e-5).all()
    assert (back.opacities() - orig.opacities()).abs().max() <= 0.5 / 255 + 1e-6
    # rotation: 10 bits of q / sqrt(2): each component within sqrt(2) / 2046, the matrix close
    assert (rotations(back.quats) - rotations(orig.quats)).abs().max() < 0.01
    assert back.sh_degree == degree
    if degree:  # trunc((v / 8 + 0.5) * 256) read back at the bin's middle: within half a bin, 4 / 256
        inside = orig.sh[:, 1:].abs() < 3.9
        err = (back.sh[:, 1:] - orig.sh[:, 1:]).abs()
        assert float(err[inside].max()) <= 4 / 256 + 1e-5
    return idx


def render_pair(a: GaussianScene, b: GaussianScene, size: int = 48, azimuth: float = 30.0):
    cfg = SplatRenderConfig(width=size, height=size, impl="fast")
    cam = fitted_camera(SceneFit.of(a), cfg, azimuth, 20.0)
    return render(a, cam, cfg), render(b, cam, cfg)


# ---------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_gsplat_written_compressed_ply_reads_within_quantisation(tmp_path, degree):
    scene = make_scene(600, degree)  # three chunks, the last one partial
    path = tmp_path / "g.ply"
    path.write_bytes(gsplat_bytes(scene))
    back = load_scene(path)
    assert len(back) == 600 and not back.is_4d
    assert_within_quantisation(back, scene, degree)


def test_gsplat_written_compressed_ply_renders_like_the_uncompressed_scene(tmp_path):
    scene = make_scene(1500, 3, seed=1)
    save_scene(scene, tmp_path / "plain.ply")
    (tmp_path / "g.compressed.ply").write_bytes(gsplat_bytes(scene))
    plain, packed = load_scene(tmp_path / "plain.ply"), load_scene(tmp_path / "g.compressed.ply")
    for azimuth in (0.0, 140.0):
        a, b = render_pair(plain, packed, azimuth=azimuth)
        assert float(a.alpha.mean()) > 0.2
        diff = (a.rgb - b.rgb).abs()
        # measured: mean 1.4e-3, max 0.028 (alpha 0.011); dropping the SH bands instead gives a mean of 0.05
        assert float(diff.mean()) < 3e-3 and float(diff.max()) < 0.05, (float(diff.mean()), float(diff.max()))
        assert float((a.alpha - b.alpha).abs().max()) < 0.025


@pytest.mark.parametrize("degree", [0, 3])
def test_save_compressed_ply_round_trip(tmp_path, degree):
    scene = make_scene(700, degree, seed=2)
    save_compressed_ply(scene, tmp_path / "s.ply")
    back = load_scene(tmp_path / "s.ply")
    assert_within_quantisation(back, scene, degree)
    # and its renders match those of what gsplat writes for the same scene
    (tmp_path / "g.ply").write_bytes(gsplat_bytes(scene))
    a, b = render_pair(back, load_scene(tmp_path / "g.ply"))
    assert float((a.rgb - b.rgb).abs().mean()) < 2e-3


def test_save_compressed_ply_layout_is_what_supersplat_reads(tmp_path):
    """The header PlayCanvas's reader checks element by element and property by property."""
    save_compressed_ply(make_scene(300, 1), tmp_path / "s.compressed.ply")
    raw = (tmp_path / "s.compressed.ply").read_bytes()
    head, _, body = raw.partition(b"end_header\n")
    lines = head.decode().splitlines()
    assert lines[:2] == ["ply", "format binary_little_endian 1.0"]
    elements = [line for line in lines if line.startswith("element")]
    assert elements == ["element chunk 2", "element vertex 300", "element sh 300"]
    chunk_props = [line.split()[2] for line in lines[lines.index("element chunk 2") + 1:][:18]]
    assert chunk_props == ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z", "min_scale_x", "min_scale_y",
                           "min_scale_z", "max_scale_x", "max_scale_y", "max_scale_z", "min_r", "min_g", "min_b",
                           "max_r", "max_g", "max_b"]
    assert all(line.startswith("property float") for line in lines[lines.index("element chunk 2") + 1:][:18])
    vi = lines.index("element vertex 300")
    assert lines[vi + 1:vi + 5] == [f"property uint packed_{p}" for p in ("position", "rotation", "scale", "color")]
    si = lines.index("element sh 300")
    assert lines[si + 1:] == [f"property uchar f_rest_{i}" for i in range(9)]
    assert len(body) == 2 * 18 * 4 + 300 * 16 + 300 * 9


def hand_written_file(path, chunk: list[float], packed: list[int], sh: list[int] | None = None):
    """One Gaussian, written from the published layout, byte by byte."""
    props = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z", "min_scale_x", "min_scale_y", "min_scale_z",
             "max_scale_x", "max_scale_y", "max_scale_z", "min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
    header = ["ply", "format binary_little_endian 1.0", "comment Generated by SuperSplat 2.7.1", "element chunk 1"]
    header += [f"property float {p}" for p in props[:len(chunk)]]
    header += ["element vertex 1"] + [f"property uint packed_{p}" for p in ("position", "rotation", "scale", "color")]
    if sh is not None:
        header += ["element sh 1"] + [f"property uchar f_rest_{i}" for i in range(len(sh))]
    body = struct.pack(f"<{len(chunk)}f", *chunk) + struct.pack("<4I", *packed)
    if sh is not None:
        body += bytes(sh)
    path.write_bytes(("\n".join(header) + "\nend_header\n").encode() + body)


def test_hand_decoded_gaussian(tmp_path):
    """Bits chosen by hand, decoded by hand with PlayCanvas's formulas."""
    pos = (2047 << 21) | (0 << 11) | 1023  # x = max, y = min, z = 1023/2047 of the way
    # rotation: largest component index 2 (y, of w x y z); the others w, x, z as 10-bit unorms
    a, b, c = 512, 100, 1023
    rot = (2 << 30) | (a << 20) | (b << 10) | c
    scl = (0 << 21) | (1023 << 11) | 2047
    col = (255 << 24) | (0 << 16) | (128 << 8) | 204
    chunk = [-1.0, 0.0, 2.0, 3.0, 4.0, 6.0, -5.0, -4.0, -3.0, -1.0, -2.0, -2.5, 0.1, 0.2, 0.3, 0.9, 0.8, 0.7]
    sh = [0, 255, 128, 10, 20, 30, 40, 50, 60]
    hand_written_file(tmp_path / "h.ply", chunk, [pos, rot, scl, col], sh)
    g = load_scene(tmp_path / "h.ply")
    np.testing.assert_allclose(g.means[0].numpy(), [3.0, 0.0, 2.0 + 4.0 * 1023 / 2047], rtol=1e-6)
    qa, qb, qc = ((v / 1023 - 0.5) * math.sqrt(2) for v in (a, b, c))
    qm = math.sqrt(1 - qa * qa - qb * qb - qc * qc)
    np.testing.assert_allclose(g.quats[0].numpy(), [qa, qb, qm, qc], rtol=1e-6, atol=1e-7)  # (w, x, y, z)
    np.testing.assert_allclose(g.log_scales[0].numpy(), [-5.0, -2.0, -2.5], rtol=1e-6)
    np.testing.assert_allclose((g.sh[0, 0] * SH_C0 + 0.5).numpy(), [0.9, 0.2, 0.3 + 0.4 * 128 / 255], rtol=1e-5)
    assert abs(float(g.opacities()[0]) - 204 / 255) < 1e-6
    # f_rest channel-major (3 coefficients x 3 channels); 0 -> -4, 255 -> 4, n -> ((n + 0.5) / 256 - 0.5) * 8
    dec = [-4.0, 4.0] + [((n + 0.5) / 256 - 0.5) * 8 for n in sh[2:]]
    np.testing.assert_allclose(g.sh[0, 1:].numpy(), np.array(dec).reshape(3, 3).T, rtol=1e-6)


def test_twelve_float_chunks_store_colour_as_is(tmp_path):
    chunk = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, -3.0, -3.0, -3.0, -2.0, -2.0, -2.0]
    col = (51 << 24) | (102 << 16) | (255 << 8) | 255
    hand_written_file(tmp_path / "h.ply", chunk, [0, 3 << 30, 0, col])
    g = load_scene(tmp_path / "h.ply")
    np.testing.assert_allclose((g.sh[0, 0] * SH_C0 + 0.5).numpy(), [0.2, 0.4, 1.0], rtol=1e-5)
    assert float(g.opacities()[0]) > 0.999 and g.sh_degree == 0
    # all three 10-bit fields 0: (0 - 0.5) sqrt(2) each; the largest, sqrt(1 - 1.5), clamps to 0
    h = -0.5 * math.sqrt(2)
    np.testing.assert_allclose(g.quats[0].numpy(), [h, h, h, 0.0], atol=1e-6)


@pytest.mark.parametrize("case, message", [
    ("chunks", "chunks for"), ("truncated", "truncated"), ("sh_count", "element sh"),
    ("vertex_props", "packed_"), ("other_first", "before 'vertex' is not supported"),
])
def test_bad_compressed_files_give_clear_errors(tmp_path, case, message):
    raw = bytearray(gsplat_bytes(make_scene(300, 1)))
    text = raw.decode("latin-1")
    if case == "chunks":
        raw = bytearray(text.replace("element chunk 2", "element chunk 3", 1).encode("latin-1"))
    elif case == "truncated":
        raw = raw[:-100]
    elif case == "sh_count":
        raw = bytearray(text.replace("property uchar f_rest_8\n", "", 1).encode("latin-1"))
    elif case == "vertex_props":
        raw = bytearray(text.replace("packed_scale", "packed_scalX", 1).encode("latin-1"))
    else:
        raw = bytearray(text.replace("element chunk", "element face", 1).encode("latin-1"))
    (tmp_path / "bad.ply").write_bytes(bytes(raw))
    with pytest.raises(StreamStudioError, match=message):
        load_scene(tmp_path / "bad.ply")


def test_a_mesh_element_after_the_vertices_is_skipped(tmp_path):
    scene = make_scene(5, 0)
    save_scene(scene, tmp_path / "s.ply")
    raw = (tmp_path / "s.ply").read_bytes()
    head, _, body = raw.partition(b"end_header\n")
    head += b"element face 1\nproperty list uchar int vertex_indices\n"
    (tmp_path / "m.ply").write_bytes(head + b"end_header\n" + body + bytes([3]) + struct.pack("<3i", 0, 1, 2))
    assert torch.equal(load_scene(tmp_path / "m.ply").means, scene.means)


def test_infinite_opacity_logits_are_fully_opaque_or_transparent_and_nan_is_refused(tmp_path):
    """splat-transform writes alpha 1 and 0 as opacity logits +inf and -inf (log(a / (1 - a)));
    such a .ply was refused as corrupt. They load as alpha 1 and 0; NaN is still corrupt."""
    scene = make_scene(4, 0)
    scene.opacity_logits = torch.tensor([float("inf"), float("-inf"), 0.0, 2.0])
    save_scene(scene, tmp_path / "edges.ply")
    loaded = load_scene(tmp_path / "edges.ply")
    alpha = torch.sigmoid(loaded.opacity_logits)
    assert torch.isfinite(loaded.opacity_logits).all()
    assert (alpha[0] >= 1 - 1e-6 and alpha[1] <= 1e-6
            and torch.allclose(alpha[2:], torch.sigmoid(torch.tensor([0.0, 2.0]))))
    scene.opacity_logits = torch.tensor([float("nan"), 0.0, 0.0, 0.0])
    save_scene(scene, tmp_path / "nan.ply")
    with pytest.raises(StreamStudioError, match="1 Gaussians have NaN or infinite opacity_logits"):
        load_scene(tmp_path / "nan.ply")


def test_save_format_by_name_and_4d_refused(tmp_path):
    assert save_format("a/b.compressed.ply") == "compressed" and save_format("x.PLY") == "ply"
    assert save_format("x.splat") == "splat" and save_format("x.spz") == "spz" and save_format("x.sog") is None
    scene = make_scene(10, 0)
    scene.t_centers, scene.t_log_scales, scene.quats_r = torch.zeros(10), torch.zeros(10), torch.randn(10, 4)
    with pytest.raises(StreamStudioError, match="3D scenes only"):
        save_scene(scene, tmp_path / "s.compressed.ply")
    with pytest.raises(StreamStudioError, match="3D scenes only"):
        save_scene(scene, tmp_path / "s.spz")
    with pytest.raises(StreamStudioError, match="saved as"):
        save_scene(scene, tmp_path / "s.sog")


def test_embedded_gsplat_writer_is_gsplats():
    exporter = pytest.importorskip("gsplat.exporter")
    scene = make_scene(400, 2, seed=5)
    n = len(scene)
    sh_n = scene.sh[:, 1:].permute(0, 2, 1).reshape(n, -1)
    theirs = exporter.splat2ply_bytes_compressed(scene.means.clone(), scene.log_scales.clone(), scene.quats.clone(),
                                                 scene.opacity_logits.clone(), scene.sh[:, 0].clone(), sh_n.clone())
    assert theirs == gsplat_bytes(scene)


# ---------------------------------------------------------------------------------------------- antialiased mode


@pytest.mark.parametrize("comments, want", [
    ([], False), (["SplatRenderMode: mip"], True), (["splatrendermode: MIP"], True),
    (["SplatRenderMode: default"], False), (["antialiased 1"], True), (["antialiased 0"], False),
    (["SplatRenderMode: mip", "antialiased 0"], False), (["antialiased 0", "SplatRenderMode: mip"], True),
    (["SplatRenderMode: 2dgs"], False), (["Generated by SuperSplat 2.7.1"], False),
])
def test_antialiased_read_from_the_ply_header(tmp_path, comments, want):
    save_scene(make_scene(4, 0), tmp_path / "s.ply")
    raw = (tmp_path / "s.ply").read_bytes()
    extra = "".join(f"comment {c}\n" for c in comments).encode()
    (tmp_path / "c.ply").write_bytes(raw.replace(b"format binary_little_endian 1.0\n",
                                                 b"format binary_little_endian 1.0\n" + extra, 1))
    assert load_scene(tmp_path / "c.ply").antialiased is want
    (tmp_path / "g.ply").write_bytes(gsplat_bytes(make_scene(4, 0)).replace(
        b"format binary_little_endian 1.0\n", b"format binary_little_endian 1.0\n" + extra, 1))
    assert load_scene(tmp_path / "g.ply").antialiased is want


@pytest.mark.parametrize("name", ["s.ply", "s.compressed.ply"])
def test_antialiased_is_written_back_and_rendered(tmp_path, name):
    scene = make_scene(300, 1, seed=3)
    scene.antialiased = True
    save_scene(scene, tmp_path / name)
    assert b"comment SplatRenderMode: mip\n" in (tmp_path / name).read_bytes()[:400]
    back = load_scene(tmp_path / name)
    assert back.antialiased and back.subset(torch.arange(10)).antialiased
    cfg = SplatRenderConfig(width=40, height=40, impl="fast")
    cam = fitted_camera(SceneFit.of(back), cfg, 0.0, 20.0)
    from_file = render(back, cam, cfg)
    forced_on = render(back, cam, SplatRenderConfig(width=40, height=40, impl="fast", antialiased=True))
    forced_off = render(back, cam, SplatRenderConfig(width=40, height=40, impl="fast", antialiased=False))
    assert torch.equal(from_file.rgb, forced_on.rgb)
    assert float((from_file.alpha - forced_off.alpha).abs().max()) > 0.02
