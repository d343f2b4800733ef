#!/usr/bin/env bash
# Everything CI cannot check, on a lent GPU machine, planned for its budget (see docs/kernels.md,
# "On a GPU"): 15 minutes of device time per task, every start (1-2 min), call and idle wait
# counted. So: ONE call of at most 9 minutes (the machine's start excluded) makes every headline
# figure of issue 45, then an optional second call of at most 4 minutes, made at once while the
# machine is warm, for the rest; a third group (`later`) is only run when named.
#
#   first  (call 1, 540 s: stages in order of value, each with its own limit)
#     build             the CUDA extensions, prebuilt here for the image (benchmarks/gpu_prebuild.sh:
#                       sm_90, Python 3.12, torch 2.11.0+cu130) and carried in .gpu_ext/: imported,
#                       not built; built there (sm_90 only, ninja on all cores) only if they do not load
#     tests             the `gpu` tests of the files that hold them (parity of every CUDA path with its
#                       reference, the captured frame graph against the eager stream), with a JUnit XML;
#                       no module needing PyAV, Gradio or fastrtc is imported
#     frame_path        benchmarks/frame_path.py: img2img 512x512 (sd-turbo arch, 1 step, fp16, TAESD)
#                       eager, compiled per network, and through the captured frame graph with frames in
#                       flight (eager and compiled networks, channels_last + fused QKV), interleaved;
#                       a per-stage CUDA-event breakdown; RCFG and Stream Batch ratios through the graph
#     multistream       benchmarks/multistream.py --quick: 1, 2, 4 streams, batched vs taking turns
#     peers             benchmarks/peers.py: StreamDiffusion 0.1.1 (the registry's wheel, carried) beside
#                       ours on the same weights, eager and compiled, interleaved
#     tensorrt          recorded as missing, no GPU time: the image has no TensorRT and its wheels are
#                       far beyond the 64 MiB a call carries
#   second (call 2, 240 s)
#     splats            benchmarks/splats.py --cuda-only: 1M Gaussians at 1920x1080
#     video             benchmarks/stream_video.py --gpu-only: the 4B config's step (paper: 482 ms)
#     causal            benchmarks/causal_video.py --gpu-only: the causal 1.3B at 480x832, ms a chunk and fps
#                       (StreamDiffusionV2: 64.5 fps on 4 H100s)
#     addons            benchmarks/stream_diffusion.py --part addons: 1 and 2 ControlNets, a LoRA fused
#                       and unfused, the SDXL UNet, against the plain model
#     webapp            only where Gradio, fastrtc, aiortc and PyAV import: the image has none; their wheels
#                       (about 110 MB) are staged over calls first (gpu_webapp_wheels.sh here, then
#                       gpu_webapp_stage.sh N there, one part a call), else it is recorded as missing
#   later (only when named)
#     kernels           benchmarks/kernel_ops.py --quick: each fused op against eager and the bandwidth floor
#     stream_diffusion  benchmarks/stream_diffusion.py --part core: ratios on eager networks (the old way)
#     tests_slow        the `gpu` tests marked slow (torch.compile's cold compiles, over 45 s each)
#     kernels_full      benchmarks/kernel_ops.py without --quick: checks the quick figures
#     tuned             benchmarks/frame_path.py --parts tuned,fp8: the compiled frame graph plain, with
#                       channels_last + fused QKV, TAESD in channels_last too, and the UNet's linear and
#                       1x1 layers in FP8 (--fp8, Ada/Hopper), interleaved; FP8's numeric difference
#     autotune          benchmarks/frame_path.py --parts autotune: the tuned frame with torch.compile's
#                       max-autotune (minutes of compiling) against the same without
#     gsplat            benchmarks/splats.py --gsplat: gsplat 1.5.3 (carried in .whl, its CUDA compiled there
#                       on first use, MAX_JOBS=16) beside ours, 1M Gaussians at 1920x1080, same cameras
#
# The calls (the device tool's `run`), the first right after the second's prerequisites are made here:
#   bash benchmarks/gpu_wheels.sh && bash benchmarks/gpu_prebuild.sh        # here, before the session
#   run(command="bash benchmarks/gpu_session.sh first", carry=[".whl", ".gpu_ext"], timeout_s=540)
#   run(command="bash benchmarks/gpu_session.sh second", carry=[".whl", ".gpu_ext"], timeout_s=240)
# Each group's budget (GPU_SESSION_BUDGET, default 520 s for first, 220 s for second) leaves the call
# a margin; a stage is started only when its limit fits what is left (else it is recorded as not
# started), so the summary is always printed. `--plan` prints the plan as JSON (tests/acceleration/test_gpu_session.py
# checks it fits); any stage can be named alone (`bash benchmarks/gpu_session.sh tests kernels`).
# GPU_LIMIT_<stage>=SECONDS overrides a stage's limit, for a rerun of what a call cut short.
# FRAME_PATH_PARTS=tuned runs only frame_path's compiled variants (plain, channels_last + fused QKV,
# and TAESD in channels_last too), for a draw that has the other modes already.
# .whl holds the wheels the image lacks (benchmarks/gpu_wheels.sh), .gpu_ext the prebuilt extensions.
# After each stage, its outcome goes into $OUT/stages.json and the summary table into $OUT/summary.md
# (benchmarks/gpu_summary.py), so a call killed midway still leaves what ran; at the end the table is
# printed: every figure against its target, every stage that failed with its first error line.
# Results land in $OUT (the device tool brings its files back) or, without $OUT, in
# benchmarks/results/gpu/. Summarize both calls together here with
#   python3 benchmarks/gpu_summary.py table FOLDER_OF_CALL_1 FOLDER_OF_CALL_2
# then copy the JSON into benchmarks/results/ and commit it.
#
# --dry-run (anywhere, no GPU needed): builds nothing and times nothing; the tests stage only
# collects (`pytest --collect-only -m gpu` over the same files), each benchmark stage runs its
# script with --help (which imports everything the script imports). tests/acceleration/test_gpu_session.py runs
# it in an environment without PyAV, Gradio or fastrtc, as on the GPU image.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
PLAN=0
ARGS=()
for a in "$@"; do
  case $a in
    --dry-run) DRY=1 ;;
    --plan) PLAN=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$a") ;;
  esac
done

# The plan: each stage's time limit (seconds), each group's stages in order of value and its budget.
# Sized from the H100 and H200 sessions (benchmarks/results/gpu_h100_2026-11-2[67]/, gpu_h200_2026-11-27/):
# build 4-7 s (prebuilt), causal 47 s (killed at 40 in a cold first call), tests 39-78 s (the
# compile test alone over 45 s: now tests_slow), kernels 89-110 s, stream_diffusion 67-92, video 12-17, splats 6-9, multistream 67-82, tests_slow 64-109,
# addons 91-93; frame_path and peers estimated (two or three UNet compiles each, 40-60 s a compile
# cold); the machine's start took 30-60 s.
declare -A LIMIT=([build]=15 [tests]=60 [frame_path]=230 [multistream]=85 [peers]=110 [tensorrt]=0
                  [splats]=15 [video]=25 [causal]=55 [addons]=105 [webapp]=0
                  [kernels]=140 [stream_diffusion]=100 [tests_slow]=110 [kernels_full]=100
                  [tuned]=220 [autotune]=300 [gsplat]=300)
FIRST="build tests frame_path multistream peers tensorrt"
SECOND="splats video causal addons webapp"
LATER="kernels stream_diffusion tests_slow kernels_full tuned autotune gsplat"  # only when named
RESERVE=15                         # kept for the summary
CALL_FIRST=540 CALL_SECOND=240     # the device calls' timeout_s
BUDGET_FIRST=520 BUDGET_SECOND=220 # the script's own budget in each call: the call keeps a margin
for s in "${!LIMIT[@]}"; do         # GPU_LIMIT_<stage>=SECONDS overrides one stage's limit (a rerun)
  v=GPU_LIMIT_$s; [ -z "${!v:-}" ] || LIMIT[$s]=${!v}
done

GROUP=""
STAGES=" ${ARGS[*]:-first} "
case "$STAGES" in *" first "*|*" check "*) GROUP=first ;; *" second "*|*" figures "*) GROUP=second ;; esac
STAGES=${STAGES// first / $FIRST }
STAGES=${STAGES// check / $FIRST }  # the old group names
STAGES=${STAGES// second / $SECOND }
STAGES=${STAGES// figures / $SECOND }
STAGES=${STAGES// later / $LATER }
UNIQUE=" "
for s in $STAGES; do
  [ -n "${LIMIT[$s]+x}" ] || { echo "unknown stage or group: $s (groups: first second later; stages: $FIRST $SECOND $LATER)" >&2; exit 2; }
  case "$UNIQUE" in *" $s "*) ;; *) UNIQUE="$UNIQUE$s " ;; esac
done
STAGES=$UNIQUE
DEFAULT_BUDGET=$BUDGET_FIRST
[ "$GROUP" = second ] && DEFAULT_BUDGET=$BUDGET_SECOND
BUDGET=${GPU_SESSION_BUDGET:-$DEFAULT_BUDGET}  # seconds for the whole script

if [ "$PLAN" = 1 ]; then  # the plan as JSON, for tests/acceleration/test_gpu_session.py and docs/kernels.md
  printf '{"reserve": %s, "budget": %s, "stages": [' "$RESERVE" "$BUDGET"
  sep=""
  for s in $STAGES; do printf '%s{"stage": "%s", "limit": %s}' "$sep" "$s" "${LIMIT[$s]}"; sep=", "; done
  printf '], "groups": {"first": {"call_timeout_s": %s, "budget": %s, "stages": "%s"}, ' "$CALL_FIRST" "$BUDGET_FIRST" "$FIRST"
  printf '"second": {"call_timeout_s": %s, "budget": %s, "stages": "%s"}}}\n' "$CALL_SECOND" "$BUDGET_SECOND" "$SECOND"
  exit 0
fi

OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
LOG="$OUT/session.log"
rm -f "$OUT/stages.json" "$OUT/summary.md"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
START=$SECONDS
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 STREAMSTUDIO_KERNEL_CACHE=${STREAMSTUDIO_KERNEL_CACHE:-/tmp/streamstudio-kernels}
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # a build there: sm_90 only
# the extensions prebuilt here for the image (benchmarks/gpu_prebuild.sh), imported instead of built
[ -d .gpu_ext ] && export STREAMSTUDIO_PREBUILT_KERNELS=$PWD/.gpu_ext
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

stage() {  # stage NAME COMMAND... (its limit: LIMIT[NAME])
  local name=$1 limit=${LIMIT[$1]}
  shift 1
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
# (PyAV, Gradio, fastrtc) cannot stop the run (tests/acceleration/test_gpu_session.py checks that every gpu test
# is collected this way).
mapfile -t GPU_TEST_FILES < <(grep -l -E 'mark\.gpu' tests/*/test_*.py)

if [ "$DRY" = 1 ]; then
  HELP=(--help)
  stage build python3 -c "print('dry run: extensions not built')"
  stage tests python3 -m pytest --collect-only -q -m "gpu and not slow" -p no:cacheprovider "${GPU_TEST_FILES[@]}"
  stage tests_slow python3 -m pytest --collect-only -q -m "gpu and slow" -p no:cacheprovider "${GPU_TEST_FILES[@]}"
else
  HELP=()
  # both extensions first: the prebuilt ones imported (.gpu_ext), else built (sm_90, ninja, all cores)
  stage build python3 -c "
import os, time, torch
from streamstudio.kernels import cuda_build, splat_cuda, EXTENSION, SOURCES
print('prebuilt extensions:', os.environ.get(cuda_build.PREBUILT_ENV) or 'none carried', '; GPU', cuda_build.device_arch())
for name, load in (('stream_ops', lambda: cuda_build.load_extension(EXTENSION, SOURCES, verbose=False)),
                   ('splat_rasterizer', splat_cuda.load)):
    t0 = time.time(); module = load()
    how = 'FAILED: ' + str(cuda_build.failure_reason(name)) if module is None else (
        'prebuilt' if '.sm_' in os.path.basename(module.__file__) else 'built here')
    print(name, how, f'{time.time() - t0:.1f} s')
"
  # -v: each test's outcome is in the log as it goes (the XML is written at the end only);
  # a per-test timeout so one hung test does not take the stage
  stage tests python3 -m pytest -m "gpu and not slow" -v -rs -p no:cacheprovider -o timeout=45 \
    --junitxml="$OUT/gpu_tests.xml" "${GPU_TEST_FILES[@]}"
  # the slow ones (torch.compile's cold compiles): the second call's
  stage tests_slow python3 -m pytest -m "gpu and slow" -v -rs -p no:cacheprovider -o timeout=100 \
    --junitxml="$OUT/gpu_tests_slow.xml" "${GPU_TEST_FILES[@]}"
fi
stage frame_path python3 benchmarks/frame_path.py --device cuda --frames 200 --rounds 2 --budget-s $((LIMIT[frame_path] - 10)) \
  --parts "${FRAME_PATH_PARTS:-modes,stages,ratios,fp8}" \
  --out "$OUT/frame_path.json" "${HELP[@]}"
stage tuned python3 benchmarks/frame_path.py --device cuda --frames 200 --rounds 2 --parts tuned,fp8 \
  --out "$OUT/frame_path_tuned.json" "${HELP[@]}"
stage autotune python3 benchmarks/frame_path.py --device cuda --frames 200 --rounds 2 --parts autotune \
  --out "$OUT/frame_path_autotune.json" "${HELP[@]}"
stage peers python3 benchmarks/peers.py --device cuda --out "$OUT/peers.json" "${HELP[@]}"
stage kernels python3 benchmarks/kernel_ops.py --quick --out "$OUT/kernels.json" "${HELP[@]}"
stage stream_diffusion python3 benchmarks/stream_diffusion.py --device cuda --part core \
  --out "$OUT/stream_diffusion.json" "${HELP[@]}"
stage video python3 benchmarks/stream_video.py --gpu-only --output "$OUT/stream_video.json" "${HELP[@]}"
stage causal python3 benchmarks/causal_video.py --gpu-only --out "$OUT/causal_video.json" "${HELP[@]}"
stage splats python3 benchmarks/splats.py --cuda-only --out "$OUT/splats.json" "${HELP[@]}"
export MAX_JOBS=${MAX_JOBS:-16}  # gsplat compiles its CUDA sources on first use, on every core
stage gsplat python3 benchmarks/splats.py --gsplat --out "$OUT/splats_gsplat.json" "${HELP[@]}"
stage multistream python3 benchmarks/multistream.py --quick --out "$OUT/multistream.json" "${HELP[@]}"
case "$STAGES" in *" tensorrt "*)
  missing tensorrt "not run: the GPU image has no TensorRT, and its wheels are far beyond the 64 MiB a call carries" ;;
esac
stage addons python3 benchmarks/stream_diffusion.py --device cuda --part addons \
  --out "$OUT/stream_diffusion_addons.json" "${HELP[@]}"
stage kernels_full python3 benchmarks/kernel_ops.py --out "$OUT/kernels_full.json" "${HELP[@]}"
case "$STAGES" in *" webapp "*)
  STAGE_DIR=${WEBAPP_STAGE_DIR:-/tmp/streamstudio-webapp-stage}  # the web app's wheels, staged over calls
  [ -f "$STAGE_DIR/ready" ] && export PYTHONPATH=$STAGE_DIR/site:$PYTHONPATH  # (benchmarks/gpu_webapp_stage.sh)
  lacking=$(python3 -c "
import importlib.util as u
print(' '.join(m for m in ('gradio', 'fastrtc', 'aiortc', 'av') if u.find_spec(m) is None))")
  if [ -n "$lacking" ]; then
    missing webapp "not run: $lacking not installed (the GPU image has none; stage their wheels first: benchmarks/gpu_webapp_wheels.sh, gpu_webapp_stage.sh)"
  else
    LIMIT[webapp]=60  # not on the image: 0 in the plan; the budget check still holds
    stage webapp python3 benchmarks/webapp.py --quick --output "$OUT/webapp.json" "${HELP[@]}"
  fi ;;
esac

echo "# done $(date -u +%FT%TZ) after $((SECONDS - START)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
"${SUMMARY[@]}" table "$OUT" --write "$OUT/summary.md" --strict
