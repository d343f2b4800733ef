"""The C++ CPU splat renderer (`csrc/splat_cpu.cpp`): build on first use, cache, call.

`load()` builds the source with the package's one extension builder (`cuda_build.load_extension`:
cached on disk by the source's and the flags' hash, so later processes only import it; without
ninja, one call of the C++ compiler), with -O3, and -fopenmp when a probe program links with it
(else the loops run serially). When it cannot be built it returns None with ONE warning per
process, and `impl="auto"` takes the vectorised torch path (`splat_fast`).
`STREAMSTUDIO_DISABLE_CPU_SPLAT=1` skips the build.

The extension does the whole frame (covariance, SH, projection, depth sort, binning and
blending) with the reference's maths and operation order, in float32 or float64.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

import torch

from streamstudio.kernels import cuda_build
from streamstudio.kernels.splat_reference import CAMERA_MODEL_IDS

SOURCE = Path(__file__).resolve().parent / "csrc" / "splat_cpu.cpp"
EXTENSION_NAME = "streamstudio_splat_cpu"
DISABLE_ENV = "STREAMSTUDIO_DISABLE_CPU_SPLAT"


@functools.cache
def openmp_links() -> bool:
    """Whether the C++ compiler builds and links a tiny OpenMP program."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return False
    with tempfile.TemporaryDirectory(prefix="streamstudio-omp-") as tmp:
        src = Path(tmp, "probe.cpp")
        src.write_text("#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
        try:
            proc = subprocess.run([cxx, "-fopenmp", str(src), "-o", str(Path(tmp, "probe"))],
                                  capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
        return proc.returncode == 0


@functools.cache
def cpu_has_avx2() -> bool:
    """Whether this x86-64 Linux CPU has AVX2 (the extension is built where it runs; the AVX2 row loop
    is picked at run time anyway, the flag lets the compiler inline it)."""
    try:
        return any(line.startswith("flags") and " avx2" in line for line in open("/proc/cpuinfo"))
    except OSError:
        return False


_tried = False  # load() has run in this process: its answer is cached, a later call returns at once


def load(verbose: bool = False) -> ModuleType | None:
    """The built extension, or None (build failed or disabled; warns once per process)."""
    global _tried
    omp = openmp_links()
    flags = ["-O3", "-ffp-contract=off", "-fno-trapping-math"] + (["-fopenmp"] if omp else [])
    flags += ["-mavx2"] if cpu_has_avx2() else []  # in the build's hash: a CPU without it builds its own copy
    module = cuda_build.load_extension(
        EXTENSION_NAME, [SOURCE], cuda=False, disable_env=DISABLE_ENV, verbose=verbose,
        flags=cuda_build.Flags(cflags=tuple(flags), ldflags=("-fopenmp",) if omp else ()),
        what="C++ CPU splat renderer", fallback="the vectorised torch path")
    _tried = True
    return module


def ready() -> bool:
    """Whether `load()` answers at once: it already ran in this process (built, imported or
    failed), or the build is switched off. False means the next call may compile the source
    (about a minute; a copy built earlier on this machine is only imported)."""
    return _tried or os.environ.get(DISABLE_ENV, "") not in ("", "0", "false", "False")


def failure_reason() -> str | None:
    return cuda_build.failure_reason(EXTENSION_NAME)


def reset_for_tests() -> None:
    """Forget a previous load attempt (tests)."""
    global _tried
    cuda_build.forget(EXTENSION_NAME)
    _tried = False


def render(means: torch.Tensor, quats: torch.Tensor | None, scales: torch.Tensor | None, opacities: torch.Tensor,
           colors: torch.Tensor, viewmat: torch.Tensor, intrinsics: tuple[float, float, float, float], width: int,
           height: int, sh_degree: int | None = None, background: torch.Tensor | None = None,
           covars: torch.Tensor | None = None, near: float = 0.01, far: float = 1e10, threads: int | None = None,
           antialiased: bool = False, camera_model: str = "pinhole"
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The whole frame in C++ (arguments as `splat.rasterize_gaussians`, CPU tensors).

    Returns rgb (H, W, 3), depth (H, W), alpha (H, W) in the input's float dtype (float64 stays
    float64, anything else runs in float32) and the number of visible Gaussians."""
    module = load()
    if module is None:
        raise RuntimeError(f"the C++ CPU splat renderer is not available ({failure_reason()})")
    if means.device.type != "cpu":
        raise ValueError("the C++ splat path runs on CPU tensors; use impl='auto' or 'cuda'")
    dtype = torch.float64 if means.dtype == torch.float64 else torch.float32

    def prep(t: torch.Tensor | None) -> torch.Tensor:
        return torch.empty(0, dtype=dtype) if t is None else torch.as_tensor(t).to(dtype).contiguous()

    if covars is None and (quats is None or scales is None):
        raise ValueError("give quats and scales, or covars")
    colors = prep(colors)
    degree = -1
    if colors.dim() == 3:
        degree = colors.shape[1] if sh_degree is None else sh_degree
        degree = max(0, min(degree, 3, int(round(colors.shape[1] ** 0.5)) - 1))
    fx, fy, cx, cy = (float(v) for v in intrinsics)
    bg = prep(background).reshape(-1)
    if bg.numel() not in (0, 3):
        raise ValueError("background must be 3 RGB values")
    rgb = torch.empty(int(height), int(width), 3, dtype=dtype)
    depth = torch.empty(int(height), int(width), dtype=dtype)
    alpha = torch.empty(int(height), int(width), dtype=dtype)
    n_visible = module.render(
        prep(means), prep(None if covars is not None else quats), prep(None if covars is not None else scales),
        prep(covars), prep(opacities), colors, degree, prep(viewmat), fx, fy, cx, cy, int(width), int(height),
        float(near), float(far), bool(antialiased), CAMERA_MODEL_IDS[camera_model], bg,
        int(threads or torch.get_num_threads()), rgb, depth, alpha)
    return rgb, depth, alpha, int(n_visible)
