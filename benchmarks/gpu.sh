#!/usr/bin/env bash
# The "GPU (H200)" figures of benchmarks/README.md in one command (a leased GPU machine is
# short-lived, so everything happens in one go and every result lands in $OUT as it is made):
#   1. the 1B-shaped random bf16 Llama (benchmarks/gpu.py model),
#   2. the hf arm's overhead, gate / bare, batch 1 (benchmarks/overhead.py), max_tokens 16 and 128,
#      on the first $PROMPTS (6) prompts of the battery,
#   3. the hf ladder, TTFT and decode tok/s at 128/1024/4096 prompt tokens (benchmarks/gpu.py ladder),
#   4. with STRICT_GATE_BEFORE=<another checkout>, step 2 again with that checkout's strict_gate
#      (a before/after of an engine change on the same machine; last, as it matters least).
#
#   bash benchmarks/gpu.sh           # on the GPU machine, from the repository root
#   bash benchmarks/gpu.sh --tiny    # a 2-layer model on the CPU: tries the whole script in a minute
#
# WHEELS=<dir of .whl> installs strict-gate's missing dependencies (jsonlines, msgspec on a
# bare torch image) into /tmp/site first, without the network.
set -uo pipefail
tiny=""
if [ "${1:-}" = "--tiny" ]; then tiny=--tiny; fi
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
py=${PYTHON:-python3}
if [ -n "${WHEELS:-}" ]; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
  site=/tmp/site
else
  site=""
fi
export PYTHONUNBUFFERED=1
model=/tmp/strict-gate-llama-1b-shape${tiny:+-tiny}
if [ -n "$tiny" ]; then
  device=cpu; limit=2; reps=1; runs=2; threads="--threads 1"; lengths="--lengths 16 64"; tokens="8 16"
else
  device=cuda; limit=${PROMPTS:-6}; reps=3; runs=5; threads=""; lengths=""; tokens="16 128"
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  $py -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.version.cuda)"
  nproc; uptime
} 2>&1 | tee "$out/machine.txt"

cd "$root"
PYTHONPATH="$root${site:+:$site}" $py benchmarks/gpu.py model "$model" $tiny 2>&1 | tee "$out/log.txt" || exit 1
overhead() {  # $1: checkout whose strict_gate is measured, $2: file name stem
  PYTHONPATH="$1${site:+:$site}" $py benchmarks/overhead.py --engines hf --model "$model" --dtype bfloat16 \
    --device $device $threads --limit $limit --max-tokens $tokens --reps $reps --profile \
    --md "$out/$2.md" --json "$out/$2.json" 2>&1 | tee -a "$out/log.txt"
}
overhead "$root" overhead
PYTHONPATH="$root${site:+:$site}" $py benchmarks/gpu.py ladder "$model" --device $device --runs $runs $lengths \
  --json "$out/ladder.json" --md "$out/ladder.md" 2>&1 | tee -a "$out/log.txt"
if [ -n "${STRICT_GATE_BEFORE:-}" ]; then
  overhead "$STRICT_GATE_BEFORE" overhead-before
fi
uptime | tee -a "$out/machine.txt"
