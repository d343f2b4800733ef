"""Pure-torch reference of the 3D Gaussian-splatting renderer (any device, float32/float64).

Conventions (shared by the fast CPU path and the CUDA kernel):
* camera: `viewmat` (4, 4) world -> camera, OpenCV axes (x right, y down, z forward);
  intrinsics fx, fy, cx, cy in pixels; pixel (u, v) has its centre at (u + 0.5, v + 0.5).
* projection (EWA, Zwicker et al. / 3DGS): cov2d = J W S W^T J^T + 0.3 I, with J the
  Jacobian of the camera's map at the mean (pinhole by default; orthographic and equidistant
  fisheye as gsplat, see `project_points`); for the pinhole x/z and y/z clamped to the image's edges
  plus 0.3 x the half-FOV tangent, from the actual principal point (gsplat's `_persp_proj`);
  conic = cov2d^-1; Gaussians with z < near or z > far are culled.
* extent: a Gaussian of opacity o reaches alpha >= 1/255 only inside the ellipse
  d^T cov2d^-1 d <= 2 ln(255 o), whose bounding box has half-widths sqrt(2 ln(255 o) cov_xx)
  and sqrt(2 ln(255 o) cov_yy); it is binned into the 16x16 tiles that box touches (exact:
  no Gaussian that could reach 1/255 at a pixel is left out).
* blending per pixel, front to back in depth order: power = -0.5 (a dx^2 + c dy^2) - b dx dy,
  alpha = min(0.99, o exp(power)), skipped when power > 0 or alpha < 1/255; a Gaussian that
  would take the transmittance T below 1e-4 is not blended and ends the pixel.
  rgb = sum w_i c_i + T bg, depth = sum w_i z_i (not normalised), alpha = 1 - T, w_i = alpha_i T_i.
* colour: SH of degree 0..3 evaluated in the direction camera -> mean, + 0.5, clamped at 0.
"""

from __future__ import annotations

import math

import torch

TILE = 16
ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.99
T_MIN = 1e-4
LOW_PASS = 0.3

SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792,
         0.5462742152960396)
SH_C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
         -0.4570457994644658, 1.445305721320277, -0.5900435899266435)


def quat_scale_to_covar(quats: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(N, 4) quaternions (w first) and (N, 3) linear scales -> (N, 3, 3) covariance R S S R^T."""
    w, x, y, z = torch.nn.functional.normalize(quats, dim=-1).unbind(-1)
    rot = torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(-1, 3, 3)
    m = rot * scales[:, None, :]  # (N, 3, 3) = R S
    return m @ m.transpose(1, 2)


def eval_sh(sh: torch.Tensor, dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """(N, K, 3) coefficients, (N, 3) unit directions -> (N, 3) colour (SH + 0.5, clamped at 0)."""
    degree = min(degree, int(round(math.sqrt(sh.shape[1]))) - 1)
    out = SH_C0 * sh[:, 0]
    if degree >= 1:
        x, y, z = dirs[:, 0:1], dirs[:, 1:2], dirs[:, 2:3]  # (N, 1) each
        out = out - SH_C1 * y * sh[:, 1] + SH_C1 * z * sh[:, 2] - SH_C1 * x * sh[:, 3]
        if degree >= 2:
            xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
            out = (out + SH_C2[0] * xy * sh[:, 4] + SH_C2[1] * yz * sh[:, 5]
                   + SH_C2[2] * (2 * zz - xx - yy) * sh[:, 6] + SH_C2[3] * xz * sh[:, 7]
                   + SH_C2[4] * (xx - yy) * sh[:, 8])
            if degree >= 3:
                out = (out + SH_C3[0] * y * (3 * xx - yy) * sh[:, 9] + SH_C3[1] * xy * z * sh[:, 10]
                       + SH_C3[2] * y * (4 * zz - xx - yy) * sh[:, 11]
                       + SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy) * sh[:, 12]
                       + SH_C3[4] * x * (4 * zz - xx - yy) * sh[:, 13]
                       + SH_C3[5] * z * (xx - yy) * sh[:, 14] + SH_C3[6] * x * (xx - 3 * yy) * sh[:, 15])
    return (out + 0.5).clamp_min(0.0)


def sh_colors(sh: torch.Tensor, means: torch.Tensor, viewmat: torch.Tensor, degree: int) -> torch.Tensor:
    """(N, K, 3) SH -> (N, 3) colours seen from the camera of `viewmat`."""
    rot, trans = viewmat[:3, :3], viewmat[:3, 3]
    campos = -rot.T @ trans  # (3,)
    dirs = torch.nn.functional.normalize(means - campos, dim=-1)  # (N, 3)
    return eval_sh(sh, dirs, degree)


def frustum_limits(fx: float, fy: float, cx: float, cy: float, width: int,
                   height: int) -> tuple[float, float, float, float]:
    """Where the Jacobian's x/z and y/z are clamped: (lim_x_neg, lim_x_pos, lim_y_neg, lim_y_pos),
    x/z in [-lim_x_neg, lim_x_pos], i.e. the image's edges plus 0.3 x the half-FOV tangent
    (gsplat's `_persp_proj`: lim_x_pos = (W - cx) / fx + 0.3 * 0.5 W / fx, lim_x_neg = cx / fx + ...)."""
    tan_fovx, tan_fovy = 0.5 * width / fx, 0.5 * height / fy
    return (cx / fx + 0.3 * tan_fovx, (width - cx) / fx + 0.3 * tan_fovx,
            cy / fy + 0.3 * tan_fovy, (height - cy) / fy + 0.3 * tan_fovy)


def antialias_compensation(cov2d: torch.Tensor) -> torch.Tensor:
    """(N,) gsplat's `antialiased` opacity factor (Mip-Splatting's 2D filter) from cov2d (N, 3) =
    (xx, xy, yy) with the 0.3 low-pass in: sqrt(max(0, det(S) / det(S + 0.3 I))), S without it."""
    c_xx, c_xy, c_yy = cov2d.unbind(-1)
    det_blur = c_xx * c_yy - c_xy * c_xy
    det_orig = (c_xx - LOW_PASS) * (c_yy - LOW_PASS) - c_xy * c_xy
    safe = torch.where(det_blur > 0, det_blur, torch.ones_like(det_blur))
    return torch.sqrt((det_orig / safe).clamp_min(0.0))


CAMERA_MODELS = ("pinhole", "ortho", "fisheye")
CAMERA_MODEL_IDS = {name: i for i, name in enumerate(CAMERA_MODELS)}  # as the C++ renderer numbers them
FISHEYE_EPS = 1e-7  # gsplat's `_fisheye_proj` eps


def project_points(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, fx: float, fy: float, cx: float, cy: float,
                   width: int, height: int, camera_model: str = "pinhole") -> tuple[torch.Tensor, torch.Tensor]:
    """Camera-space points (N,) x3 (z > 0; a culled point may pass z = 1) -> pixel means (N, 2) and the
    Jacobian (N, 2, 3) of the projection at them, as gsplat's `_persp_proj` / `_ortho_proj` /
    `_fisheye_proj` (gsplat/cuda/_torch_impl.py):

    * pinhole: (fx x/z + cx, fy y/z + cy), J = [[fx/z, 0, -fx tx/z^2], [0, fy/z, -fy ty/z^2]] with
      tx/z, ty/z clamped to the image's edges plus 0.15 W/fx (0.15 H/fy) from the actual principal point;
    * ortho: (fx x + cx, fy y + cy), J = [[fx, 0, 0], [0, fy, 0]] (fx: pixels per world unit);
    * fisheye (equidistant, r = f theta): theta = atan2(|xy| + eps, z + eps), means fx x theta / (|xy| + eps) + cx,
      and gsplat's Jacobian of that map (x^2 taken as x^2 + eps, eps = 1e-7)."""
    zero = torch.zeros_like(z)
    if camera_model == "ortho":
        one = torch.ones_like(z)
        jac = torch.stack([fx * one, zero, zero, zero, fy * one, zero], -1).reshape(-1, 2, 3)
        return torch.stack([fx * x + cx, fy * y + cy], -1), jac
    if camera_model == "fisheye":
        eps = FISHEYE_EPS
        xy_len = torch.sqrt(x * x + y * y) + eps
        theta = torch.atan2(xy_len, z + eps)
        means2d = torch.stack([x * fx * theta / xy_len + cx, y * fy * theta / xy_len + cy], -1)
        x2, y2, xy = x * x + eps, y * y, x * y
        x2y2 = x2 + y2
        x2y2z2_inv = 1.0 / (x2y2 + z * z)
        b = torch.atan2(xy_len, z) / xy_len / x2y2
        a = z * x2y2z2_inv / x2y2
        jac = torch.stack([fx * (x2 * a + y2 * b), fx * xy * (a - b), -fx * x * x2y2z2_inv,
                           fy * xy * (a - b), fy * (y2 * a + x2 * b), -fy * y * x2y2z2_inv], -1).reshape(-1, 2, 3)
        return means2d, jac
    if camera_model != "pinhole":
        raise ValueError(f"unknown camera model {camera_model!r}; use one of {CAMERA_MODELS}")
    # x/z, y/z clamped to the image's edges plus 0.15 W/fx (0.15 H/fy), as gsplat's `_persp_proj`:
    # from the actual principal point, so an off-centre cx/cy moves the limits with it
    lim_x_neg, lim_x_pos, lim_y_neg, lim_y_pos = frustum_limits(fx, fy, cx, cy, width, height)
    tx = (x / z).clamp(-lim_x_neg, lim_x_pos) * z
    ty = (y / z).clamp(-lim_y_neg, lim_y_pos) * z
    jac = torch.stack([fx / z, zero, -fx * tx / (z * z),
                       zero, fy / z, -fy * ty / (z * z)], -1).reshape(-1, 2, 3)  # (N, 2, 3)
    return torch.stack([fx * x / z + cx, fy * y / z + cy], -1), jac


def project_gaussians(means: torch.Tensor, covars: torch.Tensor, opacities: torch.Tensor,
                      viewmat: torch.Tensor, fx: float, fy: float, cx: float, cy: float,
                      width: int, height: int, near: float = 0.01, far: float = 1e10, antialiased: bool = False,
                      camera_model: str = "pinhole"
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """EWA projection. Returns means2d (N, 2), conics (N, 3) = (a, b, c) of the inverse 2D
    covariance, depths (N,), radii (N, 2) float half-widths in x and y
    of the box where alpha can reach 1/255 (0 where culled) and cov2d (N, 3) = (xx, xy, yy).
    With `antialiased` the radii are those of the compensated opacity (times
    `antialias_compensation(cov2d)`, which the caller blends with). `camera_model`: pinhole,
    ortho or fisheye (see `project_points`); every model culls on the camera depth z."""
    rot, trans = viewmat[:3, :3].to(means), viewmat[:3, 3].to(means)
    p = means @ rot.T + trans  # (N, 3) camera coordinates
    x, y, z = p.unbind(-1)
    in_depth = (z > near) & (z < far)
    zs = torch.where(in_depth, z, torch.ones_like(z))
    means2d, jac = project_points(x, y, zs, fx, fy, cx, cy, width, height, camera_model)
    t = jac @ rot  # (N, 2, 3)
    cov = t @ covars @ t.transpose(1, 2)  # (N, 2, 2)
    c_xx, c_xy, c_yy = cov[:, 0, 0] + LOW_PASS, cov[:, 0, 1], cov[:, 1, 1] + LOW_PASS
    det = c_xx * c_yy - c_xy * c_xy
    ok = in_depth & (det > 0)
    dets = torch.where(ok, det, torch.ones_like(det))
    conics = torch.stack([c_yy / dets, -c_xy / dets, c_xx / dets], -1)  # (N, 3)
    if antialiased:
        opacities = opacities * antialias_compensation(torch.stack([c_xx, c_xy, c_yy], -1))
    reach = 2.0 * torch.log((255.0 * opacities).clamp_min(1.0))  # 0 where o <= 1/255: never visible
    # half-widths of the box around the ellipse d^T cov2d^-1 d <= reach (alpha >= 1/255 inside)
    radii = torch.sqrt(reach[:, None] * torch.stack([c_xx, c_yy], -1).clamp_min(0))  # (N, 2)
    ok = ok & torch.isfinite(means2d).all(1)
    on_screen = ((means2d + radii > 0) & (means2d - radii < torch.tensor([width, height]).to(means2d))).all(1)
    keep = ok & on_screen & (reach > 0)
    radii = torch.where(keep[:, None], radii, torch.zeros_like(radii))
    return means2d, conics, z, radii, torch.stack([c_xx, c_xy, c_yy], -1)


def tile_ranges(means2d: torch.Tensor, radii: torch.Tensor, width: int, height: int,
                tile: int = TILE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per Gaussian the inclusive tile rectangle (x0, x1, y0, y1) its box touches, as int64."""
    tiles_x, tiles_y = (width + tile - 1) // tile, (height + tile - 1) // tile
    mx, my, rx, ry = means2d[:, 0], means2d[:, 1], radii[:, 0], radii[:, 1]
    # pixel u is touched when |u + 0.5 - mx| <= rx
    x0 = torch.floor((mx - rx - 0.5) / tile).clamp(0, tiles_x - 1).long()
    x1 = torch.floor((mx + rx - 0.5) / tile).clamp(0, tiles_x - 1).long()
    y0 = torch.floor((my - ry - 0.5) / tile).clamp(0, tiles_y - 1).long()
    y1 = torch.floor((my + ry - 0.5) / tile).clamp(0, tiles_y - 1).long()
    return x0, x1, y0, y1


def bin_gaussians(means2d: torch.Tensor, depths: torch.Tensor, radii: torch.Tensor, width: int, height: int,
                  tile: int = TILE, conics: torch.Tensor | None = None, opacities: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tile binning + (tile, depth) sort. Returns gauss_ids (P,) sorted by tile then depth,
    tile_ids (P,) and offsets (n_tiles + 1,) so tile k owns gauss_ids[offsets[k]:offsets[k+1]].

    With conics and opacities, (tile, Gaussian) pairs whose tile lies wholly outside the
    Gaussian's alpha >= 1/255 ellipse (corners of its box) are dropped: exact, and fewer pairs."""
    tiles_x, tiles_y = (width + tile - 1) // tile, (height + tile - 1) // tile
    n_tiles = tiles_x * tiles_y
    visible = radii[:, 0] > 0
    order = torch.argsort(depths, stable=True)
    ids = order[visible[order]]  # (M,) visible Gaussians, front to back
    x0, x1, y0, y1 = (r[ids] for r in tile_ranges(means2d, radii, width, height, tile))
    nx, ny = x1 - x0 + 1, y1 - y0 + 1
    counts = nx * ny  # (M,)
    src = torch.repeat_interleave(torch.arange(ids.shape[0], device=ids.device), counts)  # (P,) pair -> Gaussian
    gauss_ids = ids[src]  # (P,)
    local = torch.arange(src.shape[0], device=ids.device) - (torch.cumsum(counts, 0) - counts)[src]
    nx_p = nx[src]
    tile_ids = (y0[src] + local // nx_p) * tiles_x + x0[src] + local % nx_p
    if conics is not None and opacities is not None:
        keep = _reaches_tile(means2d[gauss_ids], conics[gauss_ids], opacities[gauss_ids], tile_ids, tiles_x, tile)
        gauss_ids, tile_ids = gauss_ids[keep], tile_ids[keep]
    tile_ids, perm = torch.sort(tile_ids, stable=True)  # stable keeps depth order inside a tile
    gauss_ids = gauss_ids[perm]
    per_tile = torch.bincount(tile_ids, minlength=n_tiles)
    offsets = torch.zeros(n_tiles + 1, dtype=torch.long, device=ids.device)
    offsets[1:] = torch.cumsum(per_tile, 0)
    return gauss_ids, tile_ids, offsets


def _reaches_tile(mean: torch.Tensor, conic: torch.Tensor, opac: torch.Tensor, tile_ids: torch.Tensor, tiles_x: int,
                  tile: int) -> torch.Tensor:
    """(P,) whether the pair's Gaussian can reach alpha 1/255 at some pixel centre of its tile:
    the minimum of q = a dx^2 + 2 b dx dy + c dy^2 over the rectangle of the tile's pixel centres
    (zero inside, else on one of its four edges) is at most 2 ln(255 o)."""
    x0 = (tile_ids % tiles_x).to(mean.dtype) * tile + 0.5 - mean[:, 0]  # (P,) rectangle relative to the mean
    y0 = (tile_ids // tiles_x).to(mean.dtype) * tile + 0.5 - mean[:, 1]
    x1, y1 = x0 + (tile - 1), y0 + (tile - 1)
    a, b, c = conic.unbind(-1)
    q = torch.where((x0 <= 0) & (x1 >= 0) & (y0 <= 0) & (y1 >= 0), torch.zeros_like(a), torch.full_like(a, math.inf))
    for dx in (x0, x1):  # vertical edges: best dy = -b dx / c, clamped to the edge
        dy = torch.minimum(torch.maximum(-b * dx / c, y0), y1)
        q = torch.minimum(q, a * dx * dx + 2 * b * dx * dy + c * dy * dy)
    for dy in (y0, y1):  # horizontal edges
        dx = torch.minimum(torch.maximum(-b * dy / a, x0), x1)
        q = torch.minimum(q, a * dx * dx + 2 * b * dx * dy + c * dy * dy)
    reach = 2.0 * torch.log((255.0 * opac).clamp_min(1.0))
    return q <= reach * (1 + 1e-5) + 1e-5  # a hair of slack for rounding: extra pairs are harmless


def rasterize_projected(means2d: torch.Tensor, conics: torch.Tensor, opacities: torch.Tensor, features: torch.Tensor,
                        depths: torch.Tensor, radii: torch.Tensor, width: int, height: int,
                        background: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blend projected Gaussians, one tile at a time, one Gaussian at a time (the reference).

    features (N, C) are blended like colours. Returns (H, W, C) features, (H, W) depth and
    (H, W) alpha; `background` (C,) is added with the final transmittance."""
    tiles_x, tiles_y = (width + TILE - 1) // TILE, (height + TILE - 1) // TILE
    gauss_ids, _, offsets = bin_gaussians(means2d, depths, radii, width, height, TILE, conics, opacities)
    n_feat = features.shape[1]
    dtype, device = means2d.dtype, means2d.device
    out = torch.zeros(tiles_y * TILE, tiles_x * TILE, n_feat + 1, dtype=dtype, device=device)
    trans = torch.ones(tiles_y * TILE, tiles_x * TILE, dtype=dtype, device=device)
    feats = torch.cat([features.to(dtype), depths[:, None].to(dtype)], 1)  # (N, C + 1)
    lin = torch.arange(TILE, dtype=dtype, device=device) + 0.5
    bounds: list[int] = offsets.tolist()
    for tile in range(tiles_x * tiles_y):
        if bounds[tile] == bounds[tile + 1]:
            continue
        ty, tx = divmod(tile, tiles_x)
        px = (tx * TILE + lin)[None, :].expand(TILE, TILE)  # (16, 16)
        py = (ty * TILE + lin)[:, None].expand(TILE, TILE)
        acc, t_tile = _blend_tile(gauss_ids[bounds[tile]:bounds[tile + 1]], px, py, means2d, conics,
                                  opacities, feats)
        out[ty * TILE:(ty + 1) * TILE, tx * TILE:(tx + 1) * TILE] = acc
        trans[ty * TILE:(ty + 1) * TILE, tx * TILE:(tx + 1) * TILE] = t_tile
    out, trans = out[:height, :width], trans[:height, :width]
    rgb = out[..., :n_feat]
    if background is not None:
        rgb = rgb + trans[..., None] * background.to(dtype)
    return rgb, out[..., n_feat], 1.0 - trans


def _blend_tile(ids, px, py, means2d, conics, opacities, feats):
    """Front-to-back blending of Gaussians `ids` (depth order) over one tile's pixels."""
    acc = torch.zeros(*px.shape, feats.shape[1], dtype=px.dtype, device=px.device)  # (16, 16, C + 1)
    trans = torch.ones_like(px)  # (16, 16)
    done = torch.zeros_like(px, dtype=torch.bool)
    for g in ids.tolist():
        dx, dy = px - means2d[g, 0], py - means2d[g, 1]
        a, b, c = conics[g]
        power = -0.5 * (a * dx * dx + c * dy * dy) - b * dx * dy
        alpha = torch.clamp_max(opacities[g] * torch.exp(power), ALPHA_MAX)
        use = (power <= 0) & (alpha >= ALPHA_MIN) & ~done
        test_t = trans * (1 - alpha)
        stop = use & (test_t < T_MIN)
        done = done | stop
        use = use & ~stop
        acc = acc + torch.where(use, alpha * trans, 0)[..., None] * feats[g]
        trans = torch.where(use, test_t, trans)
        if bool(done.all()):
            break
    return acc, trans
