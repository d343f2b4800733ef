"""The one extension builder for the C++ and CUDA sources in `kernels/csrc/`, shared by every
fused op and the C++ CPU splat renderer.

`load_extension(name, sources)` builds a torch C++/CUDA extension on first use with
`torch.utils.cpp_extension.load` (a C++-only one without ninja: one call of the compiler with
the same flags), caches it for the process (and on disk, in a folder keyed by the sources'
contents, the flags, torch's version and CUDA's version, so an edit rebuilds), and returns None
with ONE warning per extension when it cannot be had (no GPU, no nvcc, a build error). Its
disable variable (STREAMSTUDIO_DISABLE_CUDA_KERNELS=1 for the CUDA ones) also gives None,
without a warning. Callers then use their pure-torch path.

Prebuilt extensions: `prebuild(name, sources, out_dir, arch)` builds a CUDA extension where
there is no GPU (nvcc and the target's torch and Python are enough) into a file named for its
build key and GPU architecture (`stream_ops_<digest>.sm_90.so`); with $STREAMSTUDIO_PREBUILT_KERNELS
naming a folder of them, `load_extension` imports the one matching this process's key and GPU
before it would build, and builds only when there is none or it does not load
(benchmarks/gpu_prebuild.sh makes them for the lent GPU's image).

`nvcc_check(source)` compiles one .cu file for given architectures with torch's own nvcc
flags and `-Xptxas -v`, and reports compile errors and register spills; `binding_check(cpp)`
compiles one torch binding (.cpp) against torch's headers with g++ -fsyntax-only. The CPU
tests run both on every file of csrc/, so no GPU is needed to catch a broken build. The .cu
files hold kernels and plain launchers only (no torch headers); each binding .cpp includes the
launchers' header, and each .cu file defines its launchers with qualified names, so a
declaration that drifts from its definition fails to compile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence
import importlib.util

import torch
from torch.utils import cpp_extension
from torch.utils.cpp_extension import include_paths

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
DISABLE_ENV = "STREAMSTUDIO_DISABLE_CUDA_KERNELS"
CACHE_ENV = "STREAMSTUDIO_KERNEL_CACHE"
PREBUILT_ENV = "STREAMSTUDIO_PREBUILT_KERNELS"
DEFAULT_CUDA_FLAGS = ("-O3", "-lineinfo")  # torch adds its own -std (c++20 for torch 2.13)

_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}
_reasons: dict[str, str | None] = {}


def unavailable_reason() -> str | None:
    """Why no CUDA extension can be built here, or None when one can be tried."""
    if _disabled(DISABLE_ENV):
        return _disabled(DISABLE_ENV)
    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if cpp_extension.CUDA_HOME is None and shutil.which("nvcc") is None:
        return "no CUDA toolkit (nvcc) was found; install it or set CUDA_HOME"
    return None


def cache_root() -> Path:
    """Where built extensions live: $STREAMSTUDIO_KERNEL_CACHE or ~/.cache/streamstudio/kernels."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "streamstudio", "kernels")
    return Path(root)


def source_digest(paths: Sequence[Path], flags: Sequence[str] = (),
                  target: tuple[str, str, tuple] | None = None) -> str:
    """Hash of the sources, the headers beside them, the flags, torch's and CUDA's versions and
    Python's; `target` (torch version, CUDA version, (major, minor) of Python) names another
    environment's (the key a GPU image's process will look for), else this process's."""
    torch_version, cuda_version, python = target or (torch.__version__, torch.version.cuda, sys.version_info[:2])
    h = hashlib.sha256()
    headers = sorted({p for src in paths for p in src.parent.glob("*.h")})
    for path in [*paths, *headers]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(f"torch={torch_version} cuda={cuda_version} py={tuple(python)}".encode())
    h.update(" ".join(flags).encode())
    return h.hexdigest()[:16]


def _disabled(env: str) -> str | None:
    return f"{env} is set" if os.environ.get(env, "") not in ("", "0", "false", "False") else None


def _resolve(sources: Sequence[str | os.PathLike]) -> list[Path]:
    paths = [Path(s) if Path(s).is_absolute() else CSRC / s for s in sources]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"CUDA sources not found: {', '.join(missing)}")
    return paths


@dataclass(frozen=True)
class Flags:
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()


def _digest(paths: list[Path], flags: Flags, target: tuple[str, str, tuple] | None = None) -> str:
    cflags, cuda_cflags = ["-O3", *flags.cflags], [*DEFAULT_CUDA_FLAGS, *flags.cuda_cflags]
    return source_digest(paths, [*cflags, "|", *cuda_cflags, "|", *flags.ldflags], target)


def extension_key(name: str, sources: Sequence[str | os.PathLike], flags: Flags = Flags(),
                  target: tuple[str, str, tuple] | None = None) -> str:
    """`name_digest`: the build key of an extension, here or (`target`) in another environment."""
    return f"{name}_{_digest(_resolve(sources), flags, target)}"


def prebuilt_file(name: str, digest: str, arch: str) -> str:
    """The file name of a prebuilt extension: its build key and the GPU architecture ("sm_90")."""
    return f"{name}_{digest}.{arch}.so"


def device_arch(device: int | None = None) -> str:
    """The CUDA GPU's architecture as nvcc names it ("sm_90" for an H100)."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _import_file(module_name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prebuilt(name: str, digest: str) -> ModuleType | None:
    """The prebuilt extension for this build key and GPU from $STREAMSTUDIO_PREBUILT_KERNELS, or
    None (none there, another key or GPU, or it does not load: then it is built here)."""
    folder = os.environ.get(PREBUILT_ENV)
    if not folder:
        return None
    path = Path(folder) / prebuilt_file(name, digest, device_arch())
    if not path.is_file():
        log.info("no prebuilt %s in %s (have: %s); building it", path.name, folder,
                 ", ".join(sorted(p.name for p in Path(folder).glob(f"{name}_*.so"))) or "none")
        return None
    try:
        module = _import_file(f"{name}_{digest}", path)
    except Exception as exc:  # another torch ABI, a missing library: build instead
        log.warning("prebuilt %s does not load (%s); building it", path, _first_lines(str(exc), 2))
        return None
    log.info("using the prebuilt %s", path)
    return module


def prebuild(name: str, sources: Sequence[str | os.PathLike], out_dir: str | os.PathLike, arch: str = "9.0",
             flags: Flags = Flags(), verbose: bool = False) -> Path:
    """Build CUDA extension `name` for GPU architecture `arch` ("9.0": Hopper) with this process's
    torch and Python, no GPU needed, and copy it into `out_dir` as `prebuilt_file`; returns its path."""
    paths = _resolve(sources)
    digest = _digest(paths, flags)
    before = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch  # what torch's loader compiles for when no GPU says
    try:
        _build(name, paths, flags, verbose, use_prebuilt=False)
    finally:
        if before is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = before
    built = cache_root() / f"{name}-{digest}" / f"{name}_{digest}.so"
    target = Path(out_dir) / prebuilt_file(name, digest, "sm_" + arch.replace(".", "").replace("+PTX", ""))
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built, target)
    return target


def _build(name: str, paths: list[Path], flags: Flags, verbose: bool, use_prebuilt: bool = True) -> ModuleType:
    cflags, cuda_cflags = ["-O3", *flags.cflags], [*DEFAULT_CUDA_FLAGS, *flags.cuda_cflags]
    digest = _digest(paths, flags)
    if use_prebuilt and any(p.suffix == ".cu" for p in paths):
        module = _prebuilt(name, digest)
        if module is not None:
            return module
    build_dir = cache_root() / f"{name}-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    if not any(p.suffix == ".cu" for p in paths) and not cpp_extension.is_ninja_available():
        return _build_without_ninja(f"{name}_{digest}", paths, cflags, list(flags.ldflags), build_dir, verbose)
    return cpp_extension.load(
        name=f"{name}_{digest}",
        sources=[str(p) for p in paths],
        extra_cflags=cflags,
        extra_cuda_cflags=cuda_cflags,
        extra_ldflags=list(flags.ldflags),
        extra_include_paths=[str(p.parent) for p in paths[:1]],
        build_directory=str(build_dir),
        verbose=verbose,
    )


def _build_without_ninja(name: str, paths: list[Path], cflags: list[str], ldflags: list[str], build_dir: Path,
                         verbose: bool) -> ModuleType:
    """A C++ extension as torch's load() builds it (its defines, headers and libraries), with one
    call of the C++ compiler: torch's load() needs ninja."""
    so_path = build_dir / f"{name}.so"
    if not so_path.is_file():
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
        tmp = build_dir / f"{name}.{os.getpid()}.tmp.so"
        cmd = [cxx, "-shared", "-fPIC", "-std=c++20", *cflags, f"-DTORCH_EXTENSION_NAME={name}",
               "-DTORCH_API_INCLUDE_EXTENSION_H",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(getattr(torch._C, '_GLIBCXX_USE_CXX11_ABI', True))}",
               *(f"-isystem{p}" for p in cpp_extension.include_paths()), f"-I{paths[0].parent}",
               f"-isystem{sysconfig.get_paths()['include']}", *map(str, paths), "-o", str(tmp),
               *(f"-L{p}" for p in cpp_extension.library_paths()), "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python",
               *ldflags]
        proc = subprocess.run(cmd, capture_output=not verbose, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"building {paths[0].name} failed:\n{proc.stderr}")
        os.replace(tmp, so_path)  # atomic: a concurrent process sees the whole file or none
    spec = importlib.util.spec_from_file_location(name, so_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {so_path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_extension(name: str, sources: Sequence[str | os.PathLike], *, cuda: bool = True,
                   disable_env: str = DISABLE_ENV, flags: Flags = Flags(), what: str = "fused CUDA kernels",
                   fallback: str = "the pure-torch reference", verbose: bool = False) -> ModuleType | None:
    """The built extension `name` from `sources` (paths relative to csrc/ or absolute), or None.
    `cuda` False: a C++-only extension, which needs no GPU. `what` and `fallback` word the warning.

    Built at most once per process; a failure warns once and is remembered (no retry).
    """
    with _lock:
        if name in _loaded:
            return _loaded[name]
        module = None
        disabled = _disabled(disable_env)
        reason = disabled or (unavailable_reason() if cuda else None)
        if reason is None:
            try:
                module = _build(name, _resolve(sources), flags, verbose)
            except Exception as exc:  # compiler errors arrive as RuntimeError, OSError, ImportError...
                reason = "the build failed: " + _first_lines(str(exc))
        if module is None:
            _reasons[name] = reason
            msg = f"streamstudio: {what} '{name}' not available ({reason}); using {fallback}"
            if disabled:  # disabling on purpose is not worth a warning
                log.info(msg)
            else:
                warnings.warn(msg, RuntimeWarning, stacklevel=3)
                log.warning(msg)
        _loaded[name] = module
        return module


def failure_reason(name: str) -> str | None:
    """Why `name` did not load (None when it loaded or was never asked for)."""
    return _reasons.get(name)


def forget(name: str | None = None) -> None:
    """Drop the cached result (one name or all), so the next call tries again (tests)."""
    with _lock:
        for key in [name] if name else list(_loaded):
            _loaded.pop(key, None)
            _reasons.pop(key, None)


def _first_lines(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[:n]) if lines else "unknown error"


# ---------------------------------------------------------------------------------------------
# nvcc compile check (no GPU needed)
# ---------------------------------------------------------------------------------------------

_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


@dataclass
class NvccReport:
    source: Path
    archs: tuple[str, ...]
    returncode: int
    output: str
    spill_stores: int = 0
    spill_loads: int = 0
    spilling: list[str] = field(default_factory=list)  # ptxas lines naming the functions that spill

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.spill_stores == 0 and self.spill_loads == 0


def find_nvcc() -> str | None:
    """nvcc on PATH, or under CUDA_HOME / /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "nvcc").is_file():
            return str(Path(root, "bin", "nvcc"))
    return None


def cuda_include_dir() -> Path | None:
    """The CUDA toolkit's include folder (the one with cuda_fp16.h), or None."""
    nvcc = find_nvcc()
    candidates = [Path(nvcc).resolve().parent.parent / "include"] if nvcc else []
    candidates += [Path(r, "include") for r in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if r]
    return next((p for p in candidates if (p / "cuda_fp16.h").is_file()), None)


def torch_nvcc_flags() -> list[str]:
    """The flags torch's extension loader gives nvcc (no half operators, relaxed constexpr)."""
    return list(getattr(cpp_extension, "COMMON_NVCC_FLAGS", []))


def nvcc_check(source: str | os.PathLike, archs: Sequence[str] = ("sm_80", "sm_90"),
               extra_flags: Sequence[str] = (), timeout: float = 600) -> NvccReport:
    """Compile `source` to an object file for each arch (`-Xptxas -v`) and parse spills."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found")
    source = Path(source)
    gencode = []
    for arch in archs:
        num = arch.split("_", 1)[1]
        gencode += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
    with tempfile.TemporaryDirectory(prefix="streamstudio-nvcc-") as tmp:
        cmd = [nvcc, "-c", str(source), "-o", os.path.join(tmp, "out.o"), "-std=c++20", *DEFAULT_CUDA_FLAGS,
               *torch_nvcc_flags(), "-Xptxas", "-v", *gencode, f"-I{source.parent}", *extra_flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    report = NvccReport(source, tuple(archs), proc.returncode, output)
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = _SPILL.search(line)
        if m and (int(m.group(1)) or int(m.group(2))):
            report.spill_stores += int(m.group(1))
            report.spill_loads += int(m.group(2))
            report.spilling.append(" / ".join(lines[max(0, i - 2):i + 1]))
    return report


# ---------------------------------------------------------------------------------------------
# binding compile check (no GPU and no CUDA build of torch needed)
# ---------------------------------------------------------------------------------------------

# A CPU build of torch ships c10/cuda's headers but not this one, which CMake generates.
_CUDA_MACROS_HEADER = "c10/cuda/impl/cuda_cmake_macros.h"
_CUDA_MACROS_SHIM = "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"


@dataclass
class BindingReport:
    source: Path
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _binding_key(source: Path, cxx: str, cuda_include: Path) -> str:
    """What a binding check's outcome depends on: the binding and the headers beside it, torch's
    and the compiler's versions, the CUDA headers' folder."""
    h = hashlib.sha256()
    for path in [source, *sorted(source.parent.glob("*.h"))]:
        h.update(path.name.encode() + path.read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    h.update(f"torch={torch.__version__} cxx={version} cuda={cuda_include}".encode())
    return h.hexdigest()[:24]


def binding_check(source: str | os.PathLike, compiler: str | None = None, timeout: float = 600,
                  cache: bool = True) -> BindingReport:
    """Compile one torch binding (.cpp) with `-fsyntax-only` against torch's and CUDA's headers.
    A check that passed is remembered in the kernel cache (`cache_root()/binding-checks`) under
    everything it depends on (`_binding_key`), so an unchanged binding is not compiled again
    (a minute of CPU each); a failure is never remembered."""
    cxx = compiler or shutil.which("g++") or shutil.which("c++")
    cuda_include = cuda_include_dir()
    if cxx is None or cuda_include is None:
        raise FileNotFoundError("the binding check needs g++ and the CUDA headers")
    source = Path(source)
    stamp = cache_root() / "binding-checks" / f"{source.stem}-{_binding_key(source, cxx, cuda_include)}.ok"
    if cache and stamp.is_file():
        return BindingReport(source, 0, f"unchanged since a passing check ({stamp.name})")
    report = _compile_binding(source, cxx, cuda_include, include_paths, timeout)
    if cache and report.ok:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(report.output)
    return report


def _compile_binding(source: Path, cxx: str, cuda_include: Path, include_paths: Callable[[], list[str]],
                     timeout: float) -> BindingReport:
    torch_includes = [Path(p) for p in include_paths()]
    with tempfile.TemporaryDirectory(prefix="streamstudio-binding-") as tmp:
        includes = [source.parent, *torch_includes, Path(sysconfig.get_paths()["include"]), cuda_include]
        if not any((p / _CUDA_MACROS_HEADER).is_file() for p in torch_includes):
            shim = Path(tmp, _CUDA_MACROS_HEADER)
            shim.parent.mkdir(parents=True)
            shim.write_text(_CUDA_MACROS_SHIM)
            includes.append(Path(tmp))
        cmd = [cxx, "-fsyntax-only", "-std=c++20", f"-DTORCH_EXTENSION_NAME={source.stem}",
               *[f"-I{p}" for p in includes], str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return BindingReport(source, proc.returncode, proc.stdout + proc.stderr)
