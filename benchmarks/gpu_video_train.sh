#!/usr/bin/env bash
# One GPU call for issue 30's video miss: a wider StreamDiT (192 wide, 6 blocks, 6 heads: 5.1M
# parameters, four times the built-in model) trained from scratch on the synthetic shapes, with the
# empty prompt guidance needs (--cond-drop 0.15), at batch 128 with --workers, for BUDGET seconds.
# Its weights come back in fp16 (about 10 MB: the device tool brings back no file of about 20 MB or
# more; fp32 was over). Judge it here afterwards, on the tuning split first:
#   python3 benchmarks/video_sampler_sweep.py --model DIR --spec g:3 --label wide
#   python3 benchmarks/video_quality.py --model DIR --guidance 3 --seeds 2 3 4 5 6 7 8 9 --threads 2
# usage (device tool): run("bash benchmarks/gpu_video_train.sh", timeout_s=540)
# knobs: BUDGET (s of training, default 420), BATCH (128), WORKERS (7), PROBE (steps timed first, 100)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BUDGET=${BUDGET:-420}
PROBE=${PROBE:-100}
WORK=${WORK:-/tmp/wide}
rm -rf "$WORK" && mkdir -p "$WORK"
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU: a CPU dry run"

# the wider model, freshly initialised, as a checkpoint that --init starts from
python3 - "$WORK/init" <<'EOF'
import sys
from streamstudio.models.video.stream_dit import StreamDiT, StreamDiTConfig, count_parameters, save_checkpoint
model = StreamDiT(StreamDiTConfig(hidden_size=192, depth=6, num_heads=6))
save_checkpoint(model, sys.argv[1])
print(f"wide model: {count_parameters(model) / 1e6:.2f}M parameters")
EOF

COMMON=(--init "$WORK/init" --init-keep-shift --data synthetic --batch-size "${BATCH:-128}" --lr 1e-3 --warmup 200
        --cond-drop 0.15 --num-chunks 8 --micro-steps 2 --seed 5 --no-progress --workers "${WORKERS:-7}")
# a short probe sizes the run so that its cosine schedule ends inside the budget
python3 -m streamstudio train-video --output "$WORK/probe" "${COMMON[@]}" --steps "$PROBE" --save-every 100000 \
  > "$OUT/probe.log" 2>&1
steps=$(python3 -c "import json; s = json.load(open('$WORK/probe/trainer_state.json'))['seconds']; \
print(max(${MINSTEPS:-200}, int($BUDGET * $PROBE / max(s, 0.1) * 0.92)))" 2>/dev/null || echo 2000)
echo "probe: $(cat "$WORK/probe/trainer_state.json" 2>/dev/null) -> $steps steps" | tee -a "$OUT/probe.log"
python3 -m streamstudio train-video --output "$WORK/run" "${COMMON[@]}" --steps "$steps" --save-every 1000 \
  --max-minutes "$(python3 -c "print(($BUDGET + 30) / 60)")" > "$OUT/train.log" 2>&1
tail -n 3 "$OUT/train.log"

# fp16 weights, the config and the run's state come back
python3 - "$WORK/run" "$OUT/wide" <<'EOF'
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
save_file({k: v.half() for k, v in load_file(str(src / "model.safetensors")).items()}, str(dst / "model.safetensors"))
for name in ("config.json", "trainer_state.json"):
    shutil.copy(src / name, dst / name)
print(f"{dst / 'model.safetensors'}: {(dst / 'model.safetensors').stat().st_size / 1e6:.1f} MB")
EOF
