#!/usr/bin/env bash
# An hf arm on one GPU, in-process and served by Ray actors (README.md beside):
#   benchmarks/gpu_ray/run.sh [--cpu-dry-run] [STEP...]      from the repository root
# STEPs (default: raygpu): raygpu = inproc ray1 ray2 check, in order; each apart too (a later call
# goes on from the runs an earlier one left in RUNS).
#   inproc  (a) `strict-gate run` of hf bundled:tiny-llama float32 on cuda, in the driver's process
#   ray1    `ray start --head --num-gpus 1 --num-cpus 4`, (b) the same run with `[ray] actors = 1, num_gpus = 1`,
#           the cluster stopped (its processes by pid; on the device `ray stop --force` too)
#   ray2    the same with (c) `actors = 2, num_gpus = 0.5` (two actors share the GPU)
#   check   (d) `strict-gate compare` and `strict-gate gate` (both arms recorded) of (b) and (c) against
#           (a), the records compared field by field (timing left out); $OUT/raygpu/table.md
# --cpu-dry-run: device cpu, num_gpus 0, threads 1, N 20 prompts (the same commands otherwise).
# Env: OUT (default /tmp/gpu_ray-out), RUNS (the run directories; default $OUT/raygpu/runs; device_call.sh
#      keeps them in /root/hold/ray/runs), PYTHON (python3), N (prompts, 1000), MAX_TOKENS (32),
#      TOP_LOGPROBS (5), STEP_TIMEOUT (s per command, 270), RAY_CPUS (4),
#      RAY_OBJECT_STORE (bytes, 1e9).
# Every command's output goes to $OUT/raygpu/<name>.log, its exit code to $OUT/raygpu/rc.txt and
# $OUT/rc.txt; a failing command never stops the next.
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
HERE=benchmarks/gpu_ray
DRY=0
if [ "${1:-}" = "--cpu-dry-run" ]; then DRY=1; shift; fi
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(raygpu)
OUT=${OUT:-/tmp/gpu_ray-out}
PYTHON=${PYTHON:-python3}
T=${STEP_TIMEOUT:-270}
MAX_TOKENS=${MAX_TOKENS:-32}; TOP_LOGPROBS=${TOP_LOGPROBS:-5}
if [ $DRY = 1 ]; then
  N=${N:-20}; DEVICE=cpu; GPUS1=0; GPUS2=0; NUM_GPUS=0; THREADS=1
else
  N=${N:-1000}; DEVICE=cuda; GPUS1=1; GPUS2=0.5; NUM_GPUS=1; THREADS=0
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
D=$OUT/raygpu
RUNS=${RUNS:-$D/runs}
mkdir -p "$D" "$RUNS"
RUNS=$(cd "$RUNS" && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the actors' workers inherit it from `ray start`
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
unset RAY_ADDRESS
SG=("$PYTHON" -m strict_gate.cli)
RAY=("$PYTHON" -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; sys.exit(main())')
RUNARGS=(-p "$D/prompts.jsonl" --max-tokens "$MAX_TOKENS" --top-logprobs "$TOP_LOGPROBS" --force)

run() {  # run NAME CMD...: under timeout, logged, its exit code written down; never stops the script
  local name=$1; shift
  local t0=$SECONDS
  echo "== $(date -u +%H:%M:%S) $name: $*" | tee -a "$OUT/run.log"
  timeout -k 20 "$T" "$@" > "$D/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$D/rc.txt" "$OUT/rc.txt"
  tail -n 3 "$D/$name.log" | sed 's/^/   /'
}
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RAYTMP=/tmp/ray-gpu-$port  # this cluster's --temp-dir (short: Ray's socket paths must stay under 108 bytes)
prepare() {
  run prepare "$PYTHON" $HERE/raygpu.py prepare "$D" --n "$N" --device "$DEVICE" --address "127.0.0.1:$port" \
    --gpus1 "$GPUS1" --gpus2 "$GPUS2" --threads "$THREADS" --runs "$RUNS" --max-tokens "$MAX_TOKENS" \
    --top-logprobs "$TOP_LOGPROBS"
}
arm() {  # arm NAME: one `strict-gate run`, measured (wall, driver peak RSS); its manifest, executor.json, logs kept
  # the measure beside the runs (kept across device calls: check may run in a later one), copied to $OUT
  run "$1" "$PYTHON" $HERE/raygpu.py measure "$RUNS/$1.measure.json" -- "${SG[@]}" run "$D/$1.toml" --out "$RUNS/$1" \
    "${RUNARGS[@]}"
  mkdir -p "$D/$1-run"
  cp "$RUNS/$1.measure.json" "$D/$1-run/" 2>/dev/null
  for f in manifest.json executor.json engine.log; do [ -f "$RUNS/$1/$f" ] && cp "$RUNS/$1/$f" "$D/$1-run/"; done
  for f in "$RUNS/$1"/engine-*.log; do [ -f "$f" ] && cp "$f" "$D/$1-run/"; done
  [ -f "$RUNS/$1/records.jsonl" ] && head -n 2 "$RUNS/$1/records.jsonl" > "$D/$1-run/records.head.jsonl"
}
pooled() {  # pooled NAME: a fresh head node (127.0.0.1, the one GPU), the arm, the cluster stopped
  run "ray-start-$1" "${RAY[@]}" start --head --num-gpus "$NUM_GPUS" --num-cpus "${RAY_CPUS:-4}" --port "$port" \
    --temp-dir "$RAYTMP" --include-dashboard=false --node-ip-address 127.0.0.1 --disable-usage-stats \
    --object-store-memory "${RAY_OBJECT_STORE:-1000000000}"  # records are small; /dev/shm may be too
  run "ray-status-$1" "${RAY[@]}" status --address "127.0.0.1:$port"
  arm "$1"
  run "ray-stop-$1" "$PYTHON" $HERE/raygpu.py stop "$RAYTMP"  # this cluster's processes, by pid
  # on the device, the machine is this run's alone: `ray stop --force` as well (every Ray process there)
  [ $DRY = 0 ] && run "ray-stop-force-$1" "${RAY[@]}" stop --force
}

for step in "${STEPS[@]}"; do
  case $step in
    raygpu) set -- inproc ray1 ray2 check ;;
    *) set -- "$step" ;;
  esac
  for s in "$@"; do
    [ -f "$D/prompts.jsonl" ] || prepare
    case $s in
      inproc) arm inproc ;;
      ray1|ray2) prepare; pooled "$s" ;;  # this call's free port into the arm's [ray] address
      check)
        for a in ray1 ray2; do  # the reports beside the runs (a gate's holds both arms' records); what is small to $OUT
          rm -rf "$RUNS/compare/$a" "$RUNS/reports/raygpu-$a-vs-inproc-"*
          run "compare-$a" "${SG[@]}" compare "$RUNS/inproc" "$RUNS/$a" -p "$D/prompts.jsonl" --policy strict \
            --out "$RUNS/compare/$a"
          run "gate-$a" bash -c "cd '$D' && exec ${SG[*]} gate gate-$a.toml -o '$RUNS/reports'"
          mkdir -p "$D/compare-$a" "$D/gate-$a"
          cp "$RUNS/compare/$a"/report.{json,md} "$D/compare-$a/" 2>/dev/null
          cp "$RUNS/reports/raygpu-$a-vs-inproc-"*/{report.json,report.md,junit.xml} "$D/gate-$a/" 2>/dev/null
        done
        run check "$PYTHON" $HERE/raygpu.py check "$D" --runs "$RUNS" --table "$D/table.md" --device "$DEVICE" \
          --max-tokens "$MAX_TOKENS" --top-logprobs "$TOP_LOGPROBS"
        cat "$D/table.md" 2>/dev/null ;;
      *) echo "unknown step $s" | tee -a "$OUT/rc.txt" ;;
    esac
  done
done
