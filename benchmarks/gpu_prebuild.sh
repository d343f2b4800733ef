#!/usr/bin/env bash
# Build the CUDA extensions for the lent GPU HERE, where nvcc is installed and GPU time costs
# nothing, into .gpu_ext/ (ignored by git; the device tool carries it: carry [".whl", ".gpu_ext"]).
# The GPU session then imports them instead of building them (benchmarks/gpu_session.sh sets
# STREAMSTUDIO_PREBUILT_KERNELS; streamstudio/kernels/cuda_build.py loads the file named for its
# build key and the GPU's architecture, and builds only when there is none or it does not load).
#
# The target is the GPU image (/work/.library/device/KINDS.md; tests/acceleration/test_gpu_session.py keeps
# these in step with it): Python 3.12, torch 2.11.0+cu130, H100 / H200 = sm_90. The build runs
# in a Python 3.12 virtual environment with that torch from PyPI (about 4.7 GB, made once, kept in
# $GPU_PREBUILD_VENV), with CUDA 13.0's nvcc, for sm_90 only. About 2 minutes on 2 cores.
#
#   bash benchmarks/gpu_prebuild.sh            # -> .gpu_ext/*.sm_90.so and .gpu_ext/manifest.json
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_PYTHON=3.12
TARGET_TORCH=2.11.0
TARGET_TORCH_VERSION=2.11.0+cu130   # what torch.__version__ says there: part of the build key
TARGET_ARCH=9.0                     # H100, H200
OUT=.gpu_ext
VENV=${GPU_PREBUILD_VENV:-/tmp/streamstudio-gpu-prebuild}

python=${GPU_PREBUILD_PYTHON:-}
if [ -z "$python" ]; then
  for candidate in "python$TARGET_PYTHON" "$(pyenv root 2>/dev/null)/versions/$TARGET_PYTHON"*/bin/python$TARGET_PYTHON; do
    if command -v "$candidate" >/dev/null 2>&1; then python=$(command -v "$candidate"); break; fi
  done
fi
[ -n "$python" ] || { echo "no Python $TARGET_PYTHON here (with its headers); set GPU_PREBUILD_PYTHON" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  "$python" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "torch==$TARGET_TORCH" ninja numpy
fi
have=$("$VENV/bin/python" -c "import torch, sys; print(torch.__version__, '%d.%d' % sys.version_info[:2])")
[ "$have" = "$TARGET_TORCH_VERSION $TARGET_PYTHON" ] \
  || { echo "$VENV has torch/Python '$have', not '$TARGET_TORCH_VERSION $TARGET_PYTHON'" >&2; exit 1; }

exclude="$(git rev-parse --git-dir)/info/exclude"  # .gpu_ext/ stays out of git
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu_ext/' "$exclude" 2>/dev/null || echo '/.gpu_ext/' >> "$exclude"
rm -rf "$OUT"
mkdir -p "$OUT"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} MAX_JOBS=${MAX_JOBS:-$(nproc)}
export STREAMSTUDIO_KERNEL_CACHE=${STREAMSTUDIO_KERNEL_CACHE:-/tmp/streamstudio-prebuild-cache}
PYTHONPATH=$PWD "$VENV/bin/python" - "$OUT" "$TARGET_ARCH" <<'EOF'
import json, os, subprocess, sys, time
from pathlib import Path
import torch
from streamstudio.kernels import EXTENSION, SOURCES, cuda_build, splat_cuda

out, arch = Path(sys.argv[1]), sys.argv[2]
def find_cuobjdump() -> str:  # the toolkit's, else the one triton ships beside this torch
    import shutil
    for candidate in (Path(os.environ["CUDA_HOME"]) / "bin" / "cuobjdump", shutil.which("cuobjdump")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    import triton
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")

cuobjdump = find_cuobjdump()
manifest = {"python": "%d.%d" % sys.version_info[:2], "torch": torch.__version__, "cuda": torch.version.cuda,
            "arch": "sm_" + arch.replace(".", ""), "files": {}}
for name, sources in ((EXTENSION, SOURCES), (splat_cuda.EXTENSION, splat_cuda.SOURCES)):
    t0 = time.time()
    path = cuda_build.prebuild(name, sources, out, arch)
    elfs = subprocess.run([cuobjdump, "--list-elf", str(path)], capture_output=True, text=True).stdout
    assert manifest["arch"] in elfs, f"{path.name} holds no {manifest['arch']} code:\n{elfs}"
    cuda_build._import_file(path.name.split(".")[0], path)  # it loads beside this torch (no GPU needed)
    manifest["files"][name] = path.name
    print(f"{path.name}: {path.stat().st_size / 2**20:.1f} MiB, {time.time() - t0:.0f} s, "
          f"{manifest['arch']} code, loads with torch {torch.__version__}")
(out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
EOF
size=$(du -sm "$OUT" | cut -f1)
echo "total ${size} MiB in $OUT (with .whl, at most 64 MiB are carried)"
