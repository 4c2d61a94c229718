#!/bin/bash
# The checks this project runs when a GPU machine is lent (docs/benchmarks/history.md, memory
# depth: "The opening and the reminder on an H100"): the engine's tests on CUDA, then the first
# token (live, warm, cold) and the next turn's opening under load, on a random-weight copy
# of the model (same shapes and cost; the weights themselves may not reach that machine).
#
#   bash bench/gpu_check.sh MODEL_DIR [OUT_DIR]
#
# MODEL_DIR: the model's directory, or a copy of it without weights (config, tokenizer,
# chat template: bench/random_weights.py fills in the weights). PY: the python with torch,
# transformers and redis (default python3). Each step has its own time limit, so one that
# hangs leaves the others their time.
set -u
SRC=${1:?usage: gpu_check.sh MODEL_DIR [OUT_DIR]}
OUT=${2:-var/gpu-check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
"$PY" -c 'import torch; assert torch.cuda.is_available(), "needs CUDA"' || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
RAND=$(mktemp -d)
"$PY" bench/random_weights.py "$SRC" "$RAND" > /dev/null 2>&1 || exit 1
step() {  # step NAME SECONDS COMMAND...: run it, log to OUT/NAME.log, print its tail
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? in $((SECONDS - start)) s" | tee -a "$OUT/$name.log"
  grep -E '^\||passed|failed|[0-9] error' "$OUT/$name.log" | tail -12
}
step test-gpu 250 make test-gpu TEST_PY="$PY"
export MODEL_PATH=$RAND MODEL_DEVICE=cuda
for opening in on off; do
  step "ttft-opening-$opening" 150 "$PY" bench/bench_memory_depth.py --sets tuning --cases 1 \
    --depths 8 --contrast 1 --many reminder,c=1 --ttft-cases 6 --ttft-reps 2 \
    --only "platform;platform + reminder;platform + reminder + contrast 1;platform, 20 memories + reminder + contrast 1" \
    --opening "$opening"
done
step opening-load 90 "$PY" bench/bench_opening_load.py --reps 3
