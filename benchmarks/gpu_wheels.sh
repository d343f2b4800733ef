#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels that the lent GPU machine's image lacks, into .whl/
# (ignored by git; the device tool carries it: `carry: [".whl"]`). The GPU image has torch,
# transformers, accelerate, peft, onnx, onnxruntime, onnxscript, opencv, pytest, pytest-timeout and
# ninja; it lacks diffusers (and importlib_metadata, which diffusers imports). Python there is 3.12.
# PyAV, Gradio, fastrtc and aiortc (and Gradio's FastAPI/pydantic/uvicorn) are not carried: together
# they exceed the 64 MiB the device tool carries with the working tree, and nothing the GPU run does
# needs them (gpu_session.sh imports only the test files with gpu tests; webapp is reported missing).
# tests/acceleration/test_gpu_session.py counts the pinned wheels below as part of the GPU image.
# streamdiffusion (pure Python, installed with --no-deps) is the peer benchmarks/peers.py times;
# gsplat 1.5.3 (a py3-none-any wheel holding its CUDA sources, compiled on first use by the image's
# nvcc and ninja; its jaxtyping and rich are on the image) the one benchmarks/splats.py --gsplat times.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-dir)/info/exclude"  # .whl/ stays out of git
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl "diffusers==0.42.1" "importlib_metadata==8.7.0" "zipp==3.23.0" \
  "streamdiffusion==0.1.1" "gsplat==1.5.3"
ls -l .whl
size=$(du -sm .whl | cut -f1)
echo "total ${size} MiB (the device tool carries at most 64 MiB with the working tree)"
[ "$size" -le 48 ] || { echo "too large to carry with the working tree" >&2; exit 1; }
