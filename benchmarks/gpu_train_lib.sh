# Shared by the one-call GPU training scripts (gpu_video_train.sh, gpu_causal_train.sh); sourced.
#   probe_and_train WORK OUT MINSTEPS FALLBACK -- TRAIN_ARGS...
#     times PROBE steps, sizes the run so its cosine schedule ends inside BUDGET seconds, trains it
#     into WORK/run (log: OUT/train.log)
#   fp16_back SRC DST
#     the run's weights in fp16 (the device tool brings back no file of about 20 MB or more), its
#     config and its state, into DST

probe_and_train() {
  local work=$1 out=$2 minsteps=$3 fallback=$4
  shift 5  # (the "--")
  python3 -m streamstudio train-video --output "$work/probe" "$@" --steps "$PROBE" --save-every 100000 \
    > "$out/probe.log" 2>&1
  local steps
  steps=$(python3 -c "import json; s = json.load(open('$work/probe/trainer_state.json'))['seconds']; \
print(max($minsteps, int($BUDGET * $PROBE / max(s, 0.1) * 0.92)))" 2>/dev/null || echo "$fallback")
  echo "probe: $(cat "$work/probe/trainer_state.json" 2>/dev/null) -> $steps steps" | tee -a "$out/probe.log"
  python3 -m streamstudio train-video --output "$work/run" "$@" --steps "$steps" --save-every 1000 \
    --max-minutes "$(python3 -c "print(($BUDGET + 30) / 60)")" > "$out/train.log" 2>&1
  tail -n 3 "$out/train.log"
}

fp16_back() {
  python3 - "$1" "$2" <<'PY'
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
save_file({k: v.half() for k, v in load_file(str(src / "model.safetensors")).items()}, str(dst / "model.safetensors"))
for name in ("config.json", "trainer_state.json"):
    shutil.copy(src / name, dst / name)
print(f"{dst / 'model.safetensors'}: {(dst / 'model.safetensors').stat().st_size / 1e6:.1f} MB")
PY
}
