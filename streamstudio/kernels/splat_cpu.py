"""The C++ CPU splat renderer (`csrc/splat_cpu.cpp`): build on first use, cache, call.

`load()` compiles the source with `torch.utils.cpp_extension.load` (-O3, and -fopenmp when a
probe program links with it; else the loops run serially) into torch's extensions folder,
under a name keyed by the source's hash, so later processes only import it. Without ninja
(which torch's load() needs) it makes the same build with one call of the C++ compiler. When it cannot
be built it returns None with ONE warning per process, and `impl="auto"` takes the
vectorised torch path (`splat_fast`). `STREAMSTUDIO_DISABLE_CPU_SPLAT=1` skips the build.

The extension does the whole frame (covariance, SH, projection, depth sort, binning and
blending) with the reference's maths and operation order, in float32 or float64.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from streamstudio.kernels.splat_reference import CAMERA_MODEL_IDS

SOURCE = Path(__file__).resolve().parent / "csrc" / "splat_cpu.cpp"
EXTENSION_NAME = "streamstudio_splat_cpu"
DISABLE_ENV = "STREAMSTUDIO_DISABLE_CPU_SPLAT"
_lock = threading.Lock()
_state: dict = {"module": None, "tried": False, "reason": None}


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


def cpu_has_avx2() -> bool:
    """Whether this x86-64 Linux CPU has AVX2 (the extension is built where it runs; the AVX2 row loop
    is picked at run time anyway, the flag lets the compiler inline it)."""
    try:
        return any(line.startswith("flags") and " avx2" in line for line in open("/proc/cpuinfo"))
    except OSError:
        return False


def _build(verbose: bool):
    from torch.utils import cpp_extension

    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"torch={torch.__version__} py={sys.version_info[:2]}".encode())
    omp = openmp_links()
    flags = ["-O3", "-ffp-contract=off", "-fno-trapping-math"] + (["-fopenmp"] if omp else [])
    flags += ["-mavx2"] if cpu_has_avx2() else []  # in the name's hash: a CPU without it builds its own copy
    h.update(" ".join(flags).encode())
    name = f"{EXTENSION_NAME}_{h.hexdigest()[:12]}"
    if not cpp_extension.is_ninja_available():  # torch's load() needs ninja: build with the compiler directly
        return _build_without_ninja(name, flags, omp, verbose)
    return cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=flags,
                              extra_ldflags=["-fopenmp"] if omp else [], verbose=verbose)


def _build_without_ninja(name: str, flags: list[str], omp: bool, verbose: bool):
    """The same build as torch's load() (its flags, its extensions folder), one compiler call."""
    import importlib.util
    import sysconfig

    from torch.utils import cpp_extension

    folder = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()) / name
    so_path = folder / f"{name}.so"
    if not so_path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
        tmp = folder / f"{name}.{os.getpid()}.tmp.so"
        cmd = [cxx, "-shared", "-fPIC", "-std=c++20", *flags, f"-DTORCH_EXTENSION_NAME={name}",
               "-DTORCH_API_INCLUDE_EXTENSION_H",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(getattr(torch._C, '_GLIBCXX_USE_CXX11_ABI', True))}",
               *(f"-isystem{p}" for p in cpp_extension.include_paths()),
               f"-isystem{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(tmp),
               *(f"-L{p}" for p in cpp_extension.library_paths()), "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python",
               *(["-fopenmp"] if omp else [])]
        proc = subprocess.run(cmd, capture_output=not verbose, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"building {SOURCE.name} failed:\n{proc.stderr}")
        os.replace(tmp, so_path)  # atomic: a concurrent process sees the whole file or none
    spec = importlib.util.spec_from_file_location(name, so_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(verbose: bool = False):
    """The built extension, or None (build failed or disabled; warns once per process)."""
    with _lock:
        if _state["tried"]:
            return _state["module"]
        _state["tried"] = True
        if os.environ.get(DISABLE_ENV, "") not in ("", "0", "false", "False"):
            _state["reason"] = f"{DISABLE_ENV} is set"
            return None
        try:
            _state["module"] = _build(verbose)
        except Exception as exc:  # noqa: BLE001 - any build failure means: use the torch path
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            _state["reason"] = f"{type(exc).__name__}: {' | '.join(lines[:4])}"
            warnings.warn(f"C++ CPU splat renderer could not be built ({_state['reason']}); "
                          f"using the vectorised torch path", RuntimeWarning, stacklevel=2)
            _state["module"] = None
        return _state["module"]


def failure_reason() -> str | None:
    return _state["reason"]


def reset_for_tests() -> None:
    """Forget a previous load attempt (tests)."""
    with _lock:
        _state.update(module=None, tried=False, reason=None)


def render(means, quats, scales, opacities, colors, viewmat, intrinsics, width: int, height: int,
           sh_degree: int | None = None, background=None, covars=None, near: float = 0.01, far: float = 1e10,
           threads: int | None = None, antialiased: bool = False, camera_model: str = "pinhole"):
    """The whole frame in C++ (arguments as `splat.rasterize_gaussians`, CPU tensors).

    Returns rgb (H, W, 3), depth (H, W), alpha (H, W) in the input's float dtype (float64 stays
    float64, anything else runs in float32) and the number of visible Gaussians."""
    module = load()
    if module is None:
        raise RuntimeError(f"the C++ CPU splat renderer is not available ({_state['reason']})")
    if means.device.type != "cpu":
        raise ValueError("the C++ splat path runs on CPU tensors; use impl='auto' or 'cuda'")
    dtype = torch.float64 if means.dtype == torch.float64 else torch.float32

    def prep(t):
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
