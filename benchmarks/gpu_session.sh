#!/usr/bin/env bash
# Everything CI cannot check, in one call on a lent GPU machine (see docs/kernels.md, "On a GPU"):
#   1. the `gpu` tests: every fused kernel and the splat rasterizer against their references,
#      the pipeline with and without them, torch.compile, TensorRT where installed;
#   2. benchmarks/kernels.py: each fused op against eager and the bandwidth floor, and the
#      image pipeline at 512x512 (sd-turbo architecture, 1 step, fp16, TAESD), target 150 fps;
#   3. benchmarks/stream_diffusion.py on the GPU (Stream Batch and RCFG ratios at 512x512);
#   4. benchmarks/splats.py --cuda-only (1M Gaussians at 1920x1080);
#   5. benchmarks/stream_video.py --gpu-only (the 4B config's step time, paper: 482 ms);
#   6. benchmarks/multistream.py --quick (1, 2, 4 live streams: batched across users vs turns).
#
# One device call runs at most 10 minutes, so the stages come in two groups of one call each
# (the machine stays warm for 30 s between calls; a cold one rebuilds the extensions, ~1-2 min):
#   run(command="bash benchmarks/gpu_session.sh check", carry=[".whl"], timeout_s=600)    # 1 + 2
#   run(command="bash benchmarks/gpu_session.sh figures", carry=[".whl"], timeout_s=600)  # 3 to 6
# or name stages: build tests kernels stream_diffusion splats video multistream. .whl holds the wheels the
# GPU image lacks (benchmarks/gpu_wheels.sh). Results land in $OUT (the device tool brings
# them back; at most 8 files) or, without $OUT, in benchmarks/results/gpu/; copy them to
# benchmarks/results/ and commit them. Each stage has its own time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
STAGES=" ${*:-check} "
STAGES=${STAGES// check / build tests kernels }
STAGES=${STAGES// figures / build stream_diffusion splats video multistream }
LOG="$OUT/session.log"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 STREAMSTUDIO_KERNEL_CACHE=${STREAMSTUDIO_KERNEL_CACHE:-/tmp/streamstudio-kernels}
export MAX_JOBS=${MAX_JOBS:-16}

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed" | tee -a "$LOG"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

{
  echo "# StreamStudio GPU session $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  python3 -c "import diffusers, transformers; print('diffusers', diffusers.__version__, 'transformers', transformers.__version__)"
  python3 -c "import tensorrt; print('tensorrt', tensorrt.__version__)" 2>/dev/null || echo "tensorrt: not installed"
} 2>&1 | tee "$LOG"

stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  echo "## $name (limit ${limit}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "## $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
}

# build both extensions first (ninja, all cores), so the tests' first calls don't time out
stage build 120 python3 -c "
import time, torch
from streamstudio.kernels import cuda_build, splat_cuda, EXTENSION, SOURCES
for name, load in (('stream_ops', lambda: cuda_build.load_extension(EXTENSION, SOURCES, verbose=False)),
                   ('splat_rasterizer', splat_cuda.load)):
    t0 = time.time(); ok = load() is not None
    print(name, 'built' if ok else 'FAILED: ' + str(cuda_build.failure_reason(name)), f'{time.time() - t0:.0f} s')
"
stage tests 200 python3 -m pytest -m gpu -q -rs --junitxml="$OUT/gpu_tests.xml" tests
stage kernels 230 python3 benchmarks/kernels.py --out "$OUT/kernels.json"
stage stream_diffusion 180 python3 benchmarks/stream_diffusion.py --device cuda --out "$OUT/stream_diffusion.json"
stage splats 90 python3 benchmarks/splats.py --cuda-only --out "$OUT/splats.json"
stage video 110 python3 benchmarks/stream_video.py --gpu-only --output "$OUT/stream_video.json"
stage multistream 90 python3 benchmarks/multistream.py --quick --out "$OUT/multistream.json"
echo "# done $(date -u +%FT%TZ); files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
