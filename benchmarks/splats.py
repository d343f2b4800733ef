"""Gaussian-splat renderer benchmark: frames per second of the fast CPU path (the C++ renderer,
`impl="cpp"`, at 1 and up to --threads threads) and of the vectorised torch path (`impl="fast"`)
at 10k and 100k Gaussians, 256x256 and 512x512, their speed-ups over the pure-torch reference
(same run), and the CUDA kernel at 1M Gaussians, 1920x1080 when a GPU is present.

    python3 benchmarks/splats.py [--quick] [--threads 2]
    python3 benchmarks/splats.py --cuda-only     # on a GPU machine: the CUDA row alone
    python3 benchmarks/splats.py --gsplat        # on a GPU machine with gsplat: it beside ours

Writes benchmarks/results/splats.json (splats_quick.json with --quick) and prints a table.
The scenes are synthetic and surface-like (a sphere, a ring of small spheres and a ground
disc, Gaussian sizes shrinking as 1/sqrt(N) so the surfaces stay about equally covered), seen
from a fitted orbit camera. Wall-clock fps are noisy on a shared machine, so the CPU time per
frame of this process is reported too.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time

import torch

from common import RESULTS, synchronizer, timed, write_json  # puts the package on sys.path

from streamstudio.kernels.splat import rasterize_gaussians
from streamstudio.pipelines.splats.splat_render import SceneFit, SplatRenderConfig, camera_path
from streamstudio.models.splats.gaussians import GaussianScene

TARGETS_FPS = {(10_000, 256): 60.0, (100_000, 256): 10.0}
GSPLAT_PUBLISHED = "gsplat: 172 fps, 2.8M Gaussians, 1080p, TITAN RTX (published)"


def synthetic_scene(n: int, seed: int = 0) -> GaussianScene:
    """n surface-like Gaussians with degree-3 SH."""
    g = torch.Generator().manual_seed(seed)
    n_ball, n_ring = n // 2, n // 5
    n_disc = n - n_ball - n_ring
    ball = torch.nn.functional.normalize(torch.randn(n_ball, 3, generator=g), dim=1) * 0.6
    ring_c = torch.randint(0, 8, (n_ring,), generator=g).float() * (2 * math.pi / 8)
    ring = torch.stack([1.1 * torch.cos(ring_c), torch.zeros(n_ring), 1.1 * torch.sin(ring_c)], 1)
    ring = ring + 0.13 * torch.nn.functional.normalize(torch.randn(n_ring, 3, generator=g), dim=1)
    r = 1.8 * torch.sqrt(torch.rand(n_disc, generator=g))
    th = 2 * math.pi * torch.rand(n_disc, generator=g)
    disc = torch.stack([r * torch.cos(th), torch.full_like(r, 0.75), r * torch.sin(th)], 1)
    means = torch.cat([ball, ring, disc])
    size = 2.2 / math.sqrt(n)  # about two layers of cover on the ~6 square units of surface
    return GaussianScene(means=means, quats=torch.randn(n, 4, generator=g),
                         log_scales=math.log(size) + 0.3 * torch.randn(n, 3, generator=g),
                         opacity_logits=1.5 + torch.randn(n, generator=g),
                         sh=0.4 * torch.randn(n, 16, 3, generator=g))


def frame_args(scene: GaussianScene, side: int, frames: int, device: str = "cpu", width: int | None = None):
    cfg = SplatRenderConfig(width=width or side, height=side)
    cams = camera_path("orbit", SceneFit.of(scene), cfg, frames)
    tensors = dict(means=scene.means.to(device), quats=scene.quats.to(device), scales=scene.scales().to(device),
                   opacities=scene.opacities().to(device), colors=scene.sh.to(device))
    return [dict(**tensors, viewmat=c.viewmat.to(device), intrinsics=c.intrinsics, width=c.width,
                 height=c.height, sh_degree=3) for c in cams]


def time_frames(args_list, impl: str, sync=lambda: None) -> dict:
    """Median wall and CPU seconds per frame over the frames (after one warm-up frame)."""
    rasterize_gaussians(**args_list[0], impl=impl)
    sync()
    walls, cpus = [], []
    for a in args_list:
        w0, c0 = time.perf_counter(), time.process_time()
        rasterize_gaussians(**a, impl=impl)
        sync()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def cpu_rows(quick: bool, threads: int) -> list[dict]:
    rows = []
    sizes = [(10_000, 256), (100_000, 256)] if quick else [(10_000, 256), (10_000, 512), (100_000, 256),
                                                             (100_000, 512)]
    for n, side in sizes:
        args = frame_args(synthetic_scene(n), side, 3 if quick else 8)
        for impl, n_threads in [*(("cpp", t) for t in range(1, threads + 1)), ("fast", 1)]:
            torch.set_num_threads(n_threads)  # the C++ path takes torch's thread count for its OpenMP loops
            t = time_frames(args, impl)
            row = {"gaussians": n, "size": f"{side}x{side}", "impl": impl, "threads": n_threads,
                   "fps_wall": 1 / t["wall_s"], "ms_wall": 1000 * t["wall_s"], "ms_cpu": 1000 * t["cpu_s"],
                   "fps_cpu": 1 / max(t["cpu_s"], 1e-9)}
            target = TARGETS_FPS.get((n, side))
            if target and impl == "cpp":
                row["target_fps"] = target
            rows.append(row)
            print_row(row)
    torch.set_num_threads(1)
    return rows


def reference_ratio() -> dict:
    """cpp and fast vs reference on the same frame (one frame: the reference takes seconds here)."""
    n, side = 10_000, 128  # the reference loops over tiles and Gaussians in Python: seconds a frame
    args = frame_args(synthetic_scene(n), side, 1)
    ref = time_frames(args, "reference")
    out = {"gaussians": n, "size": f"{side}x{side}", "threads": torch.get_num_threads(),
           "reference_ms_wall": 1000 * ref["wall_s"]}
    for impl in ("cpp", "fast"):
        t = time_frames(args, impl)
        out.update({f"{impl}_ms_wall": 1000 * t["wall_s"], f"{impl}_speedup_wall": ref["wall_s"] / t["wall_s"],
                    f"{impl}_speedup_cpu": ref["cpu_s"] / max(t["cpu_s"], 1e-9)})
        print(f"reference vs {impl} at {n // 1000}k / {side}x{side}: {out['reference_ms_wall']:.0f} ms vs "
              f"{out[f'{impl}_ms_wall']:.1f} ms -> {out[f'{impl}_speedup_wall']:.0f}x "
              f"(CPU time {out[f'{impl}_speedup_cpu']:.0f}x)")
    return out


def build_cpp() -> dict:
    """Load (or build, the first time on a machine) the C++ renderer; seconds it took."""
    from streamstudio.kernels import splat_cpu

    module, took = timed(splat_cpu.load)
    if module is None:
        raise SystemExit(f"the C++ CPU splat renderer did not build: {splat_cpu.failure_reason()}")
    info = {"load_or_build_s": took, "openmp": bool(module.has_openmp())}
    print(f"C++ renderer loaded in {took:.1f} s (a first build is ~15 s here), OpenMP: {info['openmp']}")
    return info


def gpu_row() -> dict:
    if not torch.cuda.is_available():
        return {"status": "missing: no GPU in this session", "compare": GSPLAT_PUBLISHED}
    from streamstudio.kernels import splat_cuda

    if splat_cuda.load() is None:
        return {"status": "missing: the CUDA kernel did not build", "compare": GSPLAT_PUBLISHED}
    args = frame_args(synthetic_scene(1_000_000), 1080, 10, device="cuda", width=1920)
    t = time_frames(args, "cuda", sync=synchronizer(torch.device("cuda")))
    return {"status": "measured", "gaussians": 1_000_000, "size": "1920x1080", "fps": 1 / t["wall_s"],
            "device": torch.cuda.get_device_name(), "compare": GSPLAT_PUBLISHED}


def gsplat_render(gsplat, a: dict) -> torch.Tensor:
    """One `frame_args` frame through gsplat's `rasterization` (the same Gaussians, SH degree and
    camera; gsplat's classic mode, no background): (H, W, 3)."""
    fx, fy, cx, cy = a["intrinsics"]
    k = torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], device=a["means"].device)
    colors, _, _ = gsplat.rasterization(a["means"], a["quats"], a["scales"], a["opacities"], a["colors"],
                                        a["viewmat"][None].float(), k[None], a["width"], a["height"],
                                        sh_degree=a["sh_degree"], near_plane=0.01, far_plane=1e10)
    return colors[0]


def gsplat_row(device: torch.device, n: int = 1_000_000, frames: int = 10, impl: str = "cuda", gsplat=None) -> dict:
    """gsplat beside ours (`impl`) on the same scene and cameras, frame by frame in turn (ours, then
    gsplat's, each timed alone), and how far apart their first frames are (PSNR, dB)."""
    if gsplat is None:
        try:
            import gsplat  # type: ignore[import-not-found,no-redef]
        except ImportError as exc:
            return {"status": f"missing: gsplat does not import ({exc})"}
    sync = synchronizer(device)
    width, side = (1920, 1080) if n >= 1_000_000 else (None, 256)
    args = frame_args(synthetic_scene(n), side, frames, device=str(device), width=width)
    ours_img = rasterize_gaussians(**args[0], impl=impl).rgb  # (warm-ups: gsplat's first call compiles)
    theirs_img = gsplat_render(gsplat, args[0])
    mse = float(((ours_img.clamp(0, 1) - theirs_img.clamp(0, 1)) ** 2).mean())
    ours, theirs = [], []
    for a in args:
        ours.append(timed(lambda: rasterize_gaussians(**a, impl=impl), sync)[1])
        theirs.append(timed(lambda: gsplat_render(gsplat, a), sync)[1])
    fps_ours, fps_theirs = 1 / statistics.median(ours), 1 / statistics.median(theirs)
    return {"status": "measured", "gaussians": n, "size": f"{args[0]['width']}x{args[0]['height']}",
            "fps_ours": fps_ours, "fps_gsplat": fps_theirs, "ours_over_gsplat": fps_ours / fps_theirs,
            "psnr_db": 99.0 if mse == 0 else -10 * math.log10(mse), "gsplat": getattr(gsplat, "__version__", "?"),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"}


def print_row(row: dict) -> None:
    target = f"{row['target_fps']:>6.0f}" if "target_fps" in row else "     -"
    print(f"{row['gaussians']:>9,} {row['size']:>9} {row['impl']:>6} {row['threads']:>7} {row['fps_wall']:>9.2f} "
          f"{row['ms_wall']:>9.1f} {row['ms_cpu']:>9.1f} {row['fps_cpu']:>9.2f} {target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and frames, a smaller reference frame")
    parser.add_argument("--threads", type=int, default=2,
                        help="most CPU threads, at most 2: cpp is timed at 1..threads; fast and the reference "
                             "at 1 (on this shared, busy machine torch with 2 threads is ~10x slower: its "
                             "threads wait at barriers)")
    parser.add_argument("--cuda-only", action="store_true", help="only the CUDA row (on a GPU machine)")
    parser.add_argument("--gsplat", action="store_true",
                        help="only gsplat beside ours: 1M Gaussians at 1920x1080, same cameras (GPU, gsplat installed)")
    parser.add_argument("--out", default=None, help="JSON output (default benchmarks/results/splats.json)")
    args = parser.parse_args(argv)
    if args.gsplat:
        row = gsplat_row(torch.device("cuda")) if torch.cuda.is_available() else {"status": "missing: no GPU"}
        if row["status"] == "measured":
            ok = "pass" if row["ours_over_gsplat"] >= 1.0 else "MISS"
            print(f"1M / 1920x1080: ours {row['fps_ours']:.1f} fps, gsplat {row['fps_gsplat']:.1f} fps: "
                  f"{row['ours_over_gsplat']:.2f}x (target >= 1.0): {ok}; frames {row['psnr_db']:.1f} dB apart")
        else:
            print(row["status"])
        out = write_json(args.out or RESULTS / "splats_gsplat.json", {"benchmark": "splats", "gsplat": row})
        print(f"wrote {out}")
        return 0 if row["status"] == "measured" else 1
    if args.cuda_only:
        gpu = gpu_row()
        print(f"CUDA 1M / 1920x1080: {gpu.get('fps', gpu['status'])}  ({gpu['compare']})")
        out = write_json(args.out or RESULTS / "splats_cuda.json",
                         {"benchmark": "splats", "torch": torch.__version__, "cuda": gpu})
        print(f"wrote {out}")
        return 0 if gpu["status"] == "measured" else 1
    threads = max(1, min(args.threads, 2))
    torch.set_num_threads(threads)
    print(f"CPU splat paths, up to {threads} thread(s), load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    build = build_cpp()
    print(f"{'Gaussians':>9} {'size':>9} {'impl':>6} {'threads':>7} {'fps':>9} {'ms/frame':>9} {'cpu ms':>9} "
          f"{'cpu fps':>9} {'target':>6}")
    rows = cpu_rows(args.quick, threads)  # leaves torch at 1 thread for the reference comparison
    ratio = reference_ratio()
    gpu = gpu_row()
    print(f"CUDA 1M / 1920x1080: {gpu.get('fps', gpu['status'])}  ({gpu['compare']})")
    result = {"benchmark": "splats", "quick": args.quick, "threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "load_average": os.getloadavg(), "cpu_count": os.cpu_count(),
              "cpp_build": build, "cpu": rows, "reference_vs_cpu": ratio, "cuda": gpu}
    out = write_json(args.out or RESULTS / ("splats_quick.json" if args.quick else "splats.json"), result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
