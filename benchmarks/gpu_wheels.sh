#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels that the lent GPU machine's image lacks, into .whl/
# (ignored by git; the device tool carries it: `carry: [".whl"]`). The GPU image has torch,
# transformers, accelerate, peft, onnx, onnxruntime, onnxscript, opencv, pytest and ninja; it
# lacks diffusers (and importlib_metadata, which diffusers imports). Python there is 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-dir)/info/exclude"  # .whl/ stays out of git
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl "diffusers==0.42.1" "importlib_metadata==8.7.0" "zipp==3.23.0"
ls -l .whl
