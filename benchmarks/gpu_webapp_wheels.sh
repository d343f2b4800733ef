#!/usr/bin/env bash
# The web app's wheels for the lent GPU machine (issue 45, item 6), fetched here and cut into parts
# that travel one device call each. The GPU image has no Gradio, fastrtc, aiortc or PyAV; together
# with what they need that the image lacks they are about 110 MB (Gradio's wheel alone 61 MiB, PyAV's
# 34 MiB), and a call carries at most 64 MiB with the working tree (about 15 MiB). So: one tar of
# the wheels, split into parts of PART_MIB (default 32), each in .webwhl/N/ with the manifest
# (parts, sha256). On a held machine, `benchmarks/gpu_webapp_stage.sh N` keeps each part where the
# next call finds it (a held machine keeps its files between calls), and the last part's call
# reassembles, checks and installs them; then `gpu_session.sh webapp` finds them (docs/kernels.md).
#
#   bash benchmarks/gpu_webapp_wheels.sh       # -> .webwhl/1 .. .webwhl/N (ignored by git)
set -euo pipefail
cd "$(dirname "$0")/.."
PART_MIB=${PART_MIB:-32}
exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.webwhl/' "$exclude" 2>/dev/null || echo '/.webwhl/' >> "$exclude"
rm -rf .webwhl
mkdir -p .webwhl/all
# the versions this project's tests resolved (README's tested versions); Python 3.12 on the image
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .webwhl/all \
  "gradio==5.50.0" "gradio_client==1.14.0" "fastrtc==0.0.34" "aiortc==1.16.0" "aioice==0.13.0" "av==18.1.0" \
  "fastapi==0.163.2" "starlette==0.52.1" "uvicorn==0.54.0" "pydantic==2.12.3" "pydantic_core==2.41.4" \
  "orjson==3.13.0" "python-multipart==0.0.34" "ffmpy==1.0.0" "groovy==0.1.2" "safehttpx==0.1.7" \
  "semantic-version==2.10.0" "tomlkit==0.13.3" "pydub==0.25.1" "pylibsrtp==1.0.0" "pyee==13.0.1" \
  "google-crc32c==1.9.0" "cryptography==50.0.2" "pyOpenSSL==26.4.0" "brotli==1.2.1" "websockets==15.0.1" \
  "dnspython==2.9.2" "ifaddr==0.2.0" "python-osc==1.10.2" "annotated-types==0.7.0" "typing-inspection==0.4.2" \
  "cffi==2.0.0" "pycparser==3.0" "librosa==0.11.0" "audioread==3.1.0" "soundfile==0.14.0" "soxr==1.1.0" \
  "pooch==1.9.0" "platformdirs==4.14.8" "decorator==5.2.1" "pytz==2026.6" "opentelemetry-api==1.45.2" \
  "importlib-metadata==8.7.0" "zipp==3.23.0"
# not carried, on the image already: numpy, pandas, pillow, httpx, anyio, jinja2, huggingface_hub, typer,
# aiofiles, numba, scikit-learn, scipy, msgpack, lazy-loader, pyyaml; not needed to serve: ruff (Gradio's
# custom components). pytz (Gradio's DateTime) and opentelemetry-api (FastAPI's telemetry) were missing
# on the image in the 2026-11-28 draw: carried now
tar -C .webwhl/all -cf .webwhl/wheels.tar .
rm -rf .webwhl/all
sum=$(sha256sum .webwhl/wheels.tar | cut -d' ' -f1)
split -b "${PART_MIB}M" -d -a 2 .webwhl/wheels.tar .webwhl/part.
rm .webwhl/wheels.tar
parts=$(ls .webwhl/part.* | wc -l)
n=0
for f in .webwhl/part.*; do
  n=$((n + 1))
  mkdir -p ".webwhl/$n"
  mv "$f" ".webwhl/$n/part"
  printf '{"part": %d, "parts": %d, "sha256": "%s"}\n' "$n" "$parts" "$sum" > ".webwhl/$n/manifest.json"
done
du -sh .webwhl/*
echo "$parts part(s) of at most $PART_MIB MiB: carry .webwhl/1 .. .webwhl/$parts, one a call (docs/kernels.md)"
