#!/usr/bin/env bash
# The whole GPU check for a lent device machine, in one call (see bench/gpu_check.py):
#   1. gpu_check.py: attention backends vs the reference on CUDA, compiled vs eager, tokens/s and
#      MFU of the 125M and 350M presets at seq 2048 (bf16, FSDP2), most wanted runs first;
#   2. the real trainer end to end on a shard set the pipeline wrote (DATA, seq 2048): torchrun,
#      NCCL, the 125m config with compile, stopped at a step (DCP checkpoint), then resumed.
# Usage: bench/gpu_session.sh DATA [OUT]; SKIP_CHECK=1 runs only part 2, WITH_350M=1 adds a 350m
# trainer run. Wheels in .whl/ (pydantic, which the device image lacks)
# are installed to a private folder first. Every part has its own time limit so a short lease
# still returns the most important figures.
set -u
DATA=${1:?shard set folder}
OUT=${2:-${OUT:-gpu_out}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
[ -n "${SKIP_CHECK:-}" ] || timeout "${CHECK_S:-380}" python3 bench/gpu_check.py --budget-s "${BUDGET_S:-270}" --json "$OUT" \
  2>&1 | tee "$OUT/gpu_check.log" | grep -v gpu_check_partial
train() {  # SIZE OUTDIR [extra trainer args]
  local size=$1 out=$2
  shift 2
  timeout "${TRAIN_S:-75}" torchrun --standalone --nproc_per_node=1 -m training.train \
    --config "training/configs/$size.yaml" --data "$DATA" --out "$out" --max-steps 60 \
    --set log.every=10 --set optim.warmup_steps=10 --set checkpoint.every=0 "$@"
  echo "exit $?"
}
RUNS=$(mktemp -d)
{ train 125m "$RUNS/125m" --stop-at 30; train 125m "$RUNS/125m"
  [ -z "${WITH_350M:-}" ] || train 350m "$RUNS/350m" --max-steps 40; } 2>&1 | tee "$OUT/train.log" | grep -v Warning
cp "$RUNS/125m/metrics.jsonl" "$OUT/metrics_125m.jsonl" 2>/dev/null
cp "$RUNS/350m/metrics.jsonl" "$OUT/metrics_350m.jsonl" 2>/dev/null
# the results as bench/results/ names them (gpu_check_<gpu>.json, gpu_session_<gpu>.json): copy them there
python3 -m bench.gpu_session "$OUT" --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
  --command "${WITH_350M:+WITH_350M=1 }bench/gpu_session.sh $*"
true
