"""Fast CPU rasteriser: the reference's maths, vectorised over tiles and Gaussians.

Tiles are laid out as a padded (tiles, slots) table of Gaussian ids in depth order. The table
is walked in blocks of `block` depth slots; in each block the alphas of every (tile, slot,
pixel) are computed at once, the transmittance comes from a cumulative product along the
slots, and the colours are summed with one batched matrix product. Tiles whose pixels have
all stopped (T < 1e-4) leave the walk, which is where opaque scenes save most of the work.
The result equals the reference up to float rounding.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from streamstudio.kernels.splat_reference import ALPHA_MAX, ALPHA_MIN, T_MIN, bin_gaussians

MIN_BLOCK, MAX_BLOCK, BLOCK_ELEMENTS = 32, 512, 1 << 19
CHUNK_ELEMENTS = 1 << 20  # alphas per chunk of tiles (4 MiB of float32), to stay near the cache
LOG_ALPHA_MAX = math.log(ALPHA_MAX)
Tensor = torch.Tensor
StepFn = Callable[[Tensor, Tensor, Tensor, Tensor, int, int], tuple[Tensor, Tensor]]  # `transmit`'s signature
_COMPILED: dict[str, StepFn] = {}  # "fn": the compiled transmit step
ALPHA_SKIP = math.nextafter(ALPHA_MIN, 0.0)  # threshold keeps x > ALPHA_SKIP, i.e. x >= 1/255


def tile_table(gauss_ids: Tensor, tile_ids: Tensor, offsets: Tensor, n_tiles: int,
               sentinel: int) -> tuple[Tensor, Tensor]:
    """(n_tiles, K) Gaussian ids per tile in depth order, padded with `sentinel`, and counts (n_tiles,)."""
    counts = offsets[1:] - offsets[:-1]  # (n_tiles,)
    k_max = int(counts.max()) if counts.numel() else 0
    table = torch.full((n_tiles, max(k_max, 1)), sentinel, dtype=torch.long)
    slot = torch.arange(gauss_ids.shape[0]) - offsets[tile_ids]
    table[tile_ids, slot] = gauss_ids
    return table, counts


def rasterize_projected(means2d: Tensor, conics: Tensor, opacities: Tensor, features: Tensor, depths: Tensor,
                        radii: Tensor, width: int, height: int, background: torch.Tensor | None = None,
                        tile: int | None = None, block: int | None = None,
                        compile: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Same contract as `splat_reference.rasterize_projected`, CPU tensors, float32.

    `compile=True` runs the alpha / transmittance step through torch.compile (Inductor's C++
    codegen: about 2x on that step here, after a first compile of ~20 s; needs a C++ compiler,
    and falls back to eager with one warning when it fails).
    `tile` is the binning tile of this path (default: from the Gaussians' median footprint,
    4, 8 or 16 pixels, so small Gaussians waste few pixel evaluations; the result does not
    depend on it, binning is exact). `block`
    is the number of depth slots blended at once (default: 32, more when few tiles are busy)."""
    tile = tile or pick_tile(radii)
    tiles_x, tiles_y = (width + tile - 1) // tile, (height + tile - 1) // tile
    n_tiles, n = tiles_x * tiles_y, means2d.shape[0]
    gauss_ids, tile_ids, offsets = bin_gaussians(means2d, depths, radii, width, height, tile, conics, opacities)
    table, counts = tile_table(gauss_ids, tile_ids, offsets, n_tiles, sentinel=n)
    # per-Gaussian parameters, with one extra transparent Gaussian for the padding
    f32 = torch.float32
    feats = torch.cat([features.to(f32), depths[:, None].to(f32)], 1)  # (N, C + 1)
    feats = torch.cat([feats, feats.new_zeros(1, feats.shape[1])])  # (N + 1, C + 1)
    log_o = torch.log(opacities.to(f32).clamp_min(1e-30))
    params = torch.stack([means2d[:, 0].to(f32), means2d[:, 1].to(f32), -0.5 * conics[:, 0].to(f32),
                          -conics[:, 1].to(f32), -0.5 * conics[:, 2].to(f32), log_o], 1)  # (N, 6)
    params = torch.cat([params, torch.tensor([[0, 0, 0, 0, 0, -1e30]], dtype=f32)])  # (N + 1, 6)
    shape = (n_tiles, tile * tile)
    acc, trans = _walk_with(_compiled_transmit() if compile else transmit, table, counts, params, feats, shape,
                            tiles_x, tile, block)
    return _untile(acc, trans, tiles_x, tiles_y, tile, width, height, features.shape[1], background)


def _walk_with(step_fn: StepFn, table: Tensor, counts: Tensor, params: Tensor, feats: Tensor, shape: tuple[int, int],
               tiles_x: int, tile: int, block: int | None) -> tuple[Tensor, Tensor]:
    """acc (T, P, C + 1) and trans (T, P) from walking the table with `step_fn` (eager again,
    with one warning, if a compiled step fails)."""
    for fn in (step_fn, transmit) if step_fn is not transmit else (transmit,):
        acc = torch.zeros(*shape, feats.shape[1], dtype=torch.float32)  # (T, P, C + 1)
        trans = torch.ones(*shape, dtype=torch.float32)  # (T, P)
        try:
            _walk(fn, table, counts, params, feats, acc, trans, tiles_x, tile, block)
            return acc, trans
        except Exception as exc:  # noqa: BLE001 - only a compiled step gets here
            if fn is transmit:
                raise
            warnings.warn(f"torch.compile of the splat step failed ({type(exc).__name__}: {exc}); eager from now",
                          RuntimeWarning, stacklevel=3)
            _COMPILED["fn"] = transmit
    raise AssertionError("unreachable")


def _compiled_transmit() -> StepFn:
    """`transmit` through torch.compile (made once per process)."""
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(transmit, dynamic=True)
    return _COMPILED["fn"]


def transmit(p: torch.Tensor, active: torch.Tensor, t_prev: torch.Tensor, basis: torch.Tensor, tiles_x: int,
             tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B, 6) pair parameters, (A,) tiles, (A, P) running T -> T after each Gaussian
    t_incl (A, B, P) and blend weights T_{k-1} alpha_k (A, B, P)."""
    alpha = _alphas(p, active, tiles_x, tile, basis)  # (A, B, P)
    t_incl = torch.cumprod(torch.rsub(alpha, 1.0), dim=1).mul_(t_prev[:, None])  # (A, B, P)
    weights = torch.cat([t_prev[:, None], t_incl[:, :-1]], 1).sub_(t_incl)  # T_{k-1} alpha_k
    return t_incl, weights


def pick_tile(radii: torch.Tensor) -> int:
    """Tile side for the median half-width of the visible Gaussians (N, 2): 4, 8 or 16 pixels."""
    seen = radii[radii[:, 0] > 0]
    if not seen.numel():
        return 16
    r = float(seen.max(1).values.median())
    return 4 if r <= 6 else 8 if r <= 12 else 16


def pixel_basis(tile: int) -> torch.Tensor:
    """(6, tile * tile) monomials u^2, u v, v^2, u, v, 1 of the pixel centres relative to the
    tile centre (pixel index = v * tile + u)."""
    c = torch.arange(tile, dtype=torch.float32) + 0.5 - tile / 2
    v, u = torch.meshgrid(c, c, indexing="ij")
    u, v = u.reshape(-1), v.reshape(-1)
    return torch.stack([u * u, u * v, v * v, u, v, torch.ones_like(u)])


def _alphas(p: torch.Tensor, active: torch.Tensor, tiles_x: int, tile: int, basis: torch.Tensor) -> torch.Tensor:
    """(A, B, 6) Gaussian parameters of active tiles (A,) -> (A, B, tile * tile) alphas, 0 where skipped.

    log alpha = log o - 0.5 a dx^2 - b dx dy - 0.5 c dy^2 is a quadratic in the pixel position,
    so it is one small matrix product of 6 per-pair coefficients with the pixel monomials."""
    ox = ((active % tiles_x) * tile + tile / 2).float()[:, None]  # (A, 1) tile centre
    oy = ((active // tiles_x) * tile + tile / 2).float()[:, None]
    mx, my = p[..., 0] - ox, p[..., 1] - oy  # (A, B) means relative to the tile centre
    ha, nb, hc, log_o = p[..., 2], p[..., 3], p[..., 4], p[..., 5]  # -a/2, -b, -c/2, log o
    coef = torch.stack([ha, nb, hc, -2 * ha * mx - nb * my, -2 * hc * my - nb * mx,
                        ha * mx * mx + nb * mx * my + hc * my * my + log_o], -1)  # (A, B, 6)
    alpha = (coef.reshape(-1, 6) @ basis).reshape(p.shape[0], p.shape[1], -1)  # (A, B, P) log alpha
    alpha.clamp_max_(LOG_ALPHA_MAX).exp_()
    return torch.threshold_(alpha, ALPHA_SKIP, 0.0)  # alpha < 1/255 -> 0 (the same op as F.threshold_)


def _block_size(n_active: int, tile: int, block: int | None) -> int:
    """Depth slots per step: the given block, else 32, or more while few tiles are busy (keeping
    a step near BLOCK_ELEMENTS alphas, so a small image of a big scene takes few steps)."""
    if block is not None:
        return block
    return int(min(MAX_BLOCK, max(MIN_BLOCK, BLOCK_ELEMENTS // max(n_active * tile * tile, 1))))


def _walk(step_fn: StepFn, table: Tensor, counts: Tensor, params: Tensor, feats: Tensor, acc: Tensor, trans: Tensor,
          tiles_x: int, tile: int, block: int | None) -> None:
    """Blend the table block by block into acc (T, P, C + 1) and trans (T, P) in place.

    A pixel that stops keeps its final transmittance in `final`; its running T is set to 0,
    which makes every later weight T_{k-1} - T_k exactly 0 without any masking. Each block is
    done in chunks of tiles small enough for the intermediate arrays to stay in cache."""
    basis = pixel_basis(tile)  # (6, P)
    final = torch.full_like(trans, -1.0)  # (T, P) final T of stopped pixels, -1 while running
    order = torch.argsort(counts, descending=True)
    active = order[:int((counts > 0).sum())]  # tiles still blending, busiest first
    k0 = 0
    while active.numel():
        active = active[counts[active] > k0]
        if not active.numel():
            break
        size = _block_size(active.numel(), tile, block)
        chunk = max(1, CHUNK_ELEMENTS // (size * tile * tile))
        running = [_step(step_fn, part, table[part, k0:k0 + size], params, feats, acc, trans, final, tiles_x,
                         tile, basis) for part in active.split(chunk)]
        active = active[torch.cat(running)]
        k0 += size
    torch.where(final >= 0, final, trans, out=trans)


def _step(step_fn: StepFn, active: Tensor, ids: Tensor, params: Tensor, feats: Tensor, acc: Tensor, trans: Tensor,
          final: Tensor, tiles_x: int, tile: int, basis: Tensor) -> torch.Tensor:
    """Blend Gaussians ids (A, B) into tiles `active` (A,); returns which tiles still run (A,)."""
    t_prev = trans[active]  # (A, P), 0 for stopped pixels
    t_incl, weights = step_fn(params[ids], active, t_prev, basis, tiles_x, tile)  # (A, B, P) each
    t_last = t_incl[:, -1].clone()  # (A, P)
    stops = (t_last < T_MIN).logical_and_(t_prev > 0)  # pixels stopping in this block
    rows = stops.any(1).nonzero()[:, 0]
    if rows.numel():
        _stop(rows, stops, t_incl, t_prev, weights, t_last, final, active)
    acc[active] += torch.bmm(weights.transpose(1, 2), feats[ids])  # (A, P, C + 1)
    trans[active] = t_last
    return (t_last > 0).any(1)


def _stop(rows: Tensor, stops: Tensor, t_incl: Tensor, t_prev: Tensor, weights: Tensor, t_last: Tensor, final: Tensor,
          active: Tensor) -> None:
    """In the tiles `rows` where pixels stop: drop the Gaussians at and after each stop (T < 1e-4),
    record the stopped pixels' final T and zero their running T."""
    ti = t_incl[rows]  # (R, B, P)
    dead = ti < T_MIN  # all false for pixels that go on
    weights[rows] = weights[rows].masked_fill_(dead, 0.0)
    last_ok = torch.minimum(ti.masked_fill_(dead, 2.0).amin(1), t_prev[rows])  # (R, P)
    s = stops[rows]
    tiles = active[rows]
    final[tiles] = torch.where(s, last_ok, final[tiles])
    t_last[rows] = t_last[rows].masked_fill_(s, 0.0)


def _untile(acc: Tensor, trans: Tensor, tiles_x: int, tiles_y: int, tile: int, width: int, height: int, n_feat: int,
            background: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """(T, P, C + 1), (T, P) -> (H, W, C), (H, W) depth, (H, W) alpha."""
    img = acc.reshape(tiles_y, tiles_x, tile, tile, -1).permute(0, 2, 1, 3, 4)
    img = img.reshape(tiles_y * tile, tiles_x * tile, -1)[:height, :width]
    t_img = trans.reshape(tiles_y, tiles_x, tile, tile).permute(0, 2, 1, 3)
    t_img = t_img.reshape(tiles_y * tile, tiles_x * tile)[:height, :width]
    rgb = img[..., :n_feat]
    if background is not None:
        rgb = rgb + t_img[..., None] * background.to(rgb)
    return rgb, img[..., n_feat], 1.0 - t_img
