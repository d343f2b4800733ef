#!/usr/bin/env bash
# One GPU call: the video model from scratch at large batches (experiment of issue 30, not a product script).
# (A record of the call of 2026-11-27 on an H200. "tiny-wide" was a named config in the working tree for
# that call only: StreamDiTConfig(hidden_size=192, depth=6, num_heads=6), 5.1M parameters; it is not kept.)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader || true
COMMON="--data synthetic --batch-size ${BATCH:-128} --lr 1e-3 --warmup 200 --cond-drop 0.15 --num-chunks 8 --micro-steps 2 --seed 5 --no-progress --workers ${WORKERS:-7} --save-every 100000"
BUDGET=${BUDGET:-160}
# probe: 150 steps of both together (as the runs go), to size the runs to BUDGET seconds
for m in tiny tiny-wide; do
  python3 -m streamstudio train-video --output /tmp/probe_$m --model $m $COMMON --steps ${PROBE:-150} > $OUT/probe_$m.log 2>&1 &
done
wait
for m in tiny tiny-wide; do
  steps=$(python3 -c "import json;s=json.load(open('/tmp/probe_$m/trainer_state.json'))['seconds'];print(max(${MINSTEPS:-300},int($BUDGET*${PROBE:-150}/max(s,0.1)*0.92)))" 2>/dev/null || echo 1500)
  echo "$m: probe $(cat /tmp/probe_$m/trainer_state.json 2>/dev/null) -> $steps steps"
  (python3 -m streamstudio train-video --output $OUT/$m --model $m $COMMON --steps $steps --max-minutes $(python3 -c "print(($BUDGET+15)/60)") > $OUT/$m.log 2>&1; rm -f $OUT/$m/optimizer.pt) &
done
wait
tail -n 3 $OUT/*.log; cat $OUT/*/trainer_state.json; ls -la $OUT/*
