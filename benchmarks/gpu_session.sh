#!/usr/bin/env bash
# Everything CI cannot check, in two calls on a lent GPU machine (see docs/kernels.md, "On a GPU").
#
#   check:   build, tests, kernels
#     build             both CUDA extensions (stream_ops, splat rasterizer), ninja on all cores
#     tests             the `gpu` tests of the files that hold them (and nothing else: no test module
#                       that needs PyAV, Gradio or fastrtc is imported), with a JUnit XML
#     kernels           benchmarks/kernels.py: each fused op against eager and the bandwidth floor,
#                       the image pipeline at 512x512 (sd-turbo arch, 1 step, fp16, TAESD): eager,
#                       fused, torch.compile, TensorRT where installed
#   figures: build, stream_diffusion, splats, video, multistream, webapp
#     stream_diffusion  benchmarks/stream_diffusion.py (Stream Batch and RCFG ratios at 512x512)
#     splats            benchmarks/splats.py --cuda-only (1M Gaussians at 1920x1080)
#     video             benchmarks/stream_video.py --gpu-only (the 4B config's step time, paper: 482 ms)
#     multistream       benchmarks/multistream.py --quick (1, 2, 4 streams: batched vs taking turns)
#     webapp            benchmarks/webapp.py --quick (loopback latency), only where Gradio, fastrtc,
#                       aiortc and PyAV import: the GPU image has none, so it is recorded as missing
#
# A call of the device tool runs at most 10 minutes; each group fits one, a cold extension build
# included: every stage has its own time limit (timeout), and the whole script stops starting
# stages when its budget (GPU_SESSION_BUDGET, default 570 s) is nearly spent, so the summary is
# always printed:
#   run(command="bash benchmarks/gpu_session.sh check", carry=[".whl"], timeout_s=600)
#   run(command="bash benchmarks/gpu_session.sh figures", carry=[".whl"], timeout_s=600)
# or name stages (`bash benchmarks/gpu_session.sh tests kernels`). .whl holds the wheels the GPU
# image lacks (benchmarks/gpu_wheels.sh). After each stage, its outcome goes into $OUT/stages.json
# and the summary table into $OUT/summary.md (benchmarks/gpu_summary.py), so a call killed midway
# still leaves what ran; at the end the table is printed: every figure against its target, every
# stage that failed with its first error line. Results land in $OUT (the device tool brings back at
# most 8 files: session.log, stages.json, summary.md and the stages' JSON/XML) or, without $OUT, in
# benchmarks/results/gpu/. Summarize both calls together here with
#   python3 benchmarks/gpu_summary.py table FOLDER_OF_CALL_1 FOLDER_OF_CALL_2
# then copy the JSON into benchmarks/results/ and commit it.
#
# --dry-run (anywhere, no GPU needed): builds nothing and times nothing; the tests stage only
# collects (`pytest --collect-only -m gpu` over the same files), each benchmark stage runs its
# script with --help (which imports everything the script imports). tests/test_gpu_session.py runs
# it in an environment without PyAV, Gradio or fastrtc, as on the GPU image.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
ARGS=()
for a in "$@"; do
  case $a in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$a") ;;
  esac
done
STAGES=" ${ARGS[*]:-check} "
STAGES=${STAGES// check / build tests kernels }
STAGES=${STAGES// figures / build stream_diffusion splats video multistream webapp }
UNIQUE=" "
for s in $STAGES; do
  case $s in
    build|tests|kernels|stream_diffusion|splats|video|multistream|webapp) ;;
    *) echo "unknown stage or group: $s (groups: check figures; stages: build tests kernels stream_diffusion" \
            "splats video multistream webapp)" >&2; exit 2 ;;
  esac
  case "$UNIQUE" in *" $s "*) ;; *) UNIQUE="$UNIQUE$s " ;; esac
done
STAGES=$UNIQUE

OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
LOG="$OUT/session.log"
rm -f "$OUT/stages.json" "$OUT/summary.md"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
BUDGET=${GPU_SESSION_BUDGET:-570}  # seconds for the whole script: one device call is 600
RESERVE=15                          # kept for the summary
START=$SECONDS
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 STREAMSTUDIO_KERNEL_CACHE=${STREAMSTUDIO_KERNEL_CACHE:-/tmp/streamstudio-kernels}
export MAX_JOBS=${MAX_JOBS:-16}
SUMMARY=(python3 benchmarks/gpu_summary.py)

if compgen -G ".whl/*.whl" >/dev/null && [ "$DRY" = 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed" | tee -a "$LOG"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

{
  echo "# StreamStudio GPU session $(date -u +%FT%TZ)$([ "$DRY" = 1 ] && echo ' (dry run)'); stages:$STAGES"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 - <<'EOF'
import sys, importlib
import torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, gpu)
for name in ("diffusers", "transformers", "triton", "onnx", "onnxruntime", "tensorrt", "av", "gradio", "fastrtc"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}", end="; ")
    except Exception as e:  # noqa: BLE001 - a report, not a check
        print(f"{name}: not installed ({type(e).__name__})", end="; ")
print()
EOF
} 2>&1 | tee "$LOG"

summarize() { "${SUMMARY[@]}" table "$OUT" --write "$OUT/summary.md" --quiet || true; }

missing() {  # missing NAME REASON: a stage that cannot run here
  "${SUMMARY[@]}" record --out "$OUT" --stage "$1" --missing "$2" | tee -a "$LOG"
  summarize
}

stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  case "$STAGES" in *" $name "*) ;; *) return 0 ;; esac
  local left=$((BUDGET - RESERVE - (SECONDS - START)))
  if [ "$left" -lt 20 ]; then
    missing "$name" "not started: the call's ${BUDGET} s were nearly spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "## $name (limit ${limit}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG" "$TMP/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "## $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  local dry=()
  [ "$DRY" = 1 ] && dry=(--dry-run)
  "${SUMMARY[@]}" record --out "$OUT" --stage "$name" --rc "$rc" --seconds "$((SECONDS - t0))" --limit "$limit" \
    --log "$TMP/$name.log" --command "$*" "${dry[@]}" | tee -a "$LOG"
  summarize
}

# The gpu tests' files: only these are imported, so a module that needs what the GPU image lacks
# (PyAV, Gradio, fastrtc) cannot stop the run (tests/test_gpu_session.py checks that every gpu test
# is collected this way).
mapfile -t GPU_TEST_FILES < <(grep -l -E 'mark\.gpu' tests/test_*.py)

if [ "$DRY" = 1 ]; then
  HELP=(--help)
  stage build 150 python3 -c "print('dry run: extensions not built')"
  stage tests 180 python3 -m pytest --collect-only -q -m gpu -p no:cacheprovider "${GPU_TEST_FILES[@]}"
else
  HELP=()
  # both extensions first (ninja, all cores), so the tests' first calls do not time out
  stage build 150 python3 -c "
import time, torch
from streamstudio.kernels import cuda_build, splat_cuda, EXTENSION, SOURCES
for name, load in (('stream_ops', lambda: cuda_build.load_extension(EXTENSION, SOURCES, verbose=False)),
                   ('splat_rasterizer', splat_cuda.load)):
    t0 = time.time(); ok = load() is not None
    print(name, 'built' if ok else 'FAILED: ' + str(cuda_build.failure_reason(name)), f'{time.time() - t0:.0f} s')
"
  # -v: each test's outcome is in the log as it goes (the XML is written at the end only);
  # a per-test timeout so one hung test does not take the stage
  stage tests 180 python3 -m pytest -m gpu -v -rs -p no:cacheprovider -o timeout=90 \
    --junitxml="$OUT/gpu_tests.xml" "${GPU_TEST_FILES[@]}"
fi
stage kernels 220 python3 benchmarks/kernels.py --out "$OUT/kernels.json" "${HELP[@]}"
stage stream_diffusion 150 python3 benchmarks/stream_diffusion.py --device cuda --out "$OUT/stream_diffusion.json" "${HELP[@]}"
stage splats 60 python3 benchmarks/splats.py --cuda-only --out "$OUT/splats.json" "${HELP[@]}"
stage video 90 python3 benchmarks/stream_video.py --gpu-only --output "$OUT/stream_video.json" "${HELP[@]}"
stage multistream 90 python3 benchmarks/multistream.py --quick --out "$OUT/multistream.json" "${HELP[@]}"
case "$STAGES" in *" webapp "*)
  lacking=$(python3 -c "
import importlib.util as u
print(' '.join(m for m in ('gradio', 'fastrtc', 'aiortc', 'av') if u.find_spec(m) is None))")
  if [ -n "$lacking" ]; then
    missing webapp "not run: $lacking not installed (the GPU image has none; their wheels exceed the 64 MiB the device tool carries)"
  else
    stage webapp 60 python3 benchmarks/webapp.py --quick --output "$OUT/webapp.json" "${HELP[@]}"
  fi ;;
esac

echo "# done $(date -u +%FT%TZ) after $((SECONDS - START)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
"${SUMMARY[@]}" table "$OUT" --write "$OUT/summary.md" --strict
