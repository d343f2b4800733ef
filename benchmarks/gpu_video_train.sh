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
. "$(dirname "$0")/gpu_train_lib.sh"
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
probe_and_train "$WORK" "$OUT" "${MINSTEPS:-200}" 2000 -- "${COMMON[@]}"

# fp16 weights, the config and the run's state come back
fp16_back "$WORK/run" "$OUT/wide"
