#!/usr/bin/env bash
# One device call, on the GPU machine, from the repository root (benchmarks/gpu_ray/README.md):
#   bash benchmarks/gpu_ray/device_call.sh NN [STEP...]        NN: the piece carried (00 for .carry/ray00),
#                                                              or - when the call carries none
# carried with .gpu and .carry/rayNN. The piece is kept in /root/hold/ray (which lives while the machine
# stays warm between calls); a stream whose pieces are all held is unpacked, each wheel checked against
# .gpu/ray.SHA256SUMS, and what the image lacks installed into /tmp/site-ray (benchmarks/gpu_ray/install.py;
# Ray always). Then the STEPs of benchmarks/gpu_ray/run.sh run, their runs kept in /root/hold/ray/runs
# across calls. Everything is logged; $OUT comes back as one archive, results-NN.tgz.
set -u
NN=$1; shift
H=${HOLD:-/root/hold/ray}; SITE=${SITE:-/tmp/site-ray}; G=$PWD/.gpu  # HOLD, SITE: for a rehearsal elsewhere
mkdir -p "$H" "$OUT" "$SITE"
versions() {  # versions LABEL: what python3 imports, with the PYTHONPATH given
  python3 - "$1" <<'PY'
import importlib.metadata as m, sys
out = []
for d in ("torch", "transformers", "tokenizers", "numpy", "pyarrow", "msgspec", "jsonlines", "safetensors", "ray",
          "msgpack", "protobuf", "click", "jsonschema", "aiohttp", "grpcio", "typer", "rich"):
    try:
        out.append(f"{d} {m.version(d)}")
    except m.PackageNotFoundError:
        out.append(f"{d} -")
print(f"{sys.argv[1]}: " + ", ".join(out))
PY
}
main() {
  echo "== piece ray$NN, $(date -u +%FT%TZ), steps: $*"
  python3 -VV
  env -u PYTHONPATH bash -c "$(declare -f versions); versions 'the image'"
  nvidia-smi -L 2>&1 || echo "no nvidia-smi"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.device_count(), "GPU(s)")' 2>&1
  echo "cores $(nproc), $(free -g | awk '/Mem:/ {print $2}') GiB memory, $(df -h /tmp | awk 'NR == 2 {print $4}') free in /tmp"
  if [ "$NN" != "-" ]; then
    if [ -f ".carry/ray$NN" ]; then
      cp ".carry/ray$NN" "$H/" && (cd "$H" && grep " ray$NN\$" "$G/ray.SHA256SUMS" | sha256sum -c -) || exit 3
    else
      echo "no .carry/ray$NN here: carry it (carry [\".gpu\", \".carry/ray$NN\"])"
    fi
  fi
  echo "held: $(cd "$H" && ls ray?? 2>/dev/null | tr '\n' ' ')"
  python3 benchmarks/gpu_ray/install.py "$H" "$SITE" "$G/ray.SHA256SUMS" "$G/ray.PIECES"
  echo "install rc=$?"
  PYTHONPATH="$SITE" versions "with $SITE"
  if [ $# -gt 0 ]; then
    RUNS=$H/runs PYTHONPATH="$SITE" bash benchmarks/gpu_ray/run.sh "$@"
    echo "run.sh rc=$?"
  fi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1
  echo "== done piece ray$NN $(date -u +%FT%TZ)"
}
main "$@" 2>&1 | tee "$H/call$NN.log"
# the device tool brings back few files: everything in one archive
cp "$H/call$NN.log" "$OUT/" ; (cd "$OUT" && tar czf "$H/results-$NN.tgz" . && rm -rf ./* && mv "$H/results-$NN.tgz" .)
