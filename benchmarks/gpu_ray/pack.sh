#!/usr/bin/env bash
# On the CPU machine: fetch Ray 2.60.0 (slimmed), the runtime dependencies Ray and strict-gate need that
# the GPU image may lack, and pyarrow, for CPython 3.12 manylinux x86-64, and cut them into pieces small
# enough to travel with the working tree in one device call each (benchmarks/gpu_ray/README.md).
#   bash benchmarks/gpu_ray/pack.sh           # -> .carry/rayNN, .gpu/ray.SHA256SUMS, .gpu/ray.PIECES
#   bash benchmarks/gpu_ray/pack.sh --check   # also: the same slimming of the cp311 wheels, installed
#                                             # into a scratch venv with nothing else, `ray start --head`
#                                             # and an actor answering there (proves the slim wheel runs)
# Two streams, each a tar compressed with xz (the wheels inside stored, not deflated: xz takes Ray's
# binaries to 70% of deflate's size) and cut at PIECE bytes: "core" (deps/ + the slim Ray wheel) first,
# then "pyarrow" (its own piece, skippable where the image has pyarrow >= 19). .gpu/ray.PIECES says which
# piece is which stream; .gpu/ray.SHA256SUMS holds every piece's and every member's sum.
# PIECE (default 38,000,000): one call carries the working tree (25.3 MB at this commit, tracked and
# untracked-not-ignored files) plus one piece, and the device takes 64 MiB (67,108,864 bytes) in all.
# .whl/, .gpu/ and .carry/ are git-ignored (.gitignore, .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/../.."
PIECE=${PIECE:-38000000}
CHECK=0; [ "${1:-}" = "--check" ] && CHECK=1
plat=()
for t in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_31 \
         manylinux_2_34 manylinux_2_35 manylinux_2_5 manylinux1; do plat+=(--platform "${t}_x86_64"); done
dl() {  # dl PYVER DIR SPEC...
  local v=$1 d=$2; shift 2
  nice python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$v" --implementation cp "${plat[@]}" -d "$d" "$@" 2>&1 | grep -v "is ignored: it is neither" || true
}
RAY_SPEC=ray==2.60.0
# Ray's Requires-Dist (no extra): click filelock jsonschema msgpack packaging protobuf pyyaml requests, and theirs
RAY_DEPS=(click==8.5.1 filelock==4.3.2 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
          rpds-py==2026.9.1 attrs==26.1.0 typing-extensions==4.16.0 msgpack==1.2.4 packaging==26.4 protobuf==7.36.2
          pyyaml==6.0.4 requests==2.34.2 urllib3==2.8.0 idna==3.21 charset-normalizer==3.5.3 certifi==2026.10.19.post1)
# strict-gate's own (pyproject) the image lacks, and the hf engine's safetensors (transformers has it already)
SG_DEPS=(msgspec==0.23.0 jsonlines==4.0.0 safetensors==0.8.0)
PYARROW=pyarrow==26.0.1
# Ray less its Java jars (32 MB zipped), the dashboard's source maps, and the libraries a pool of actors
# never imports (RLlib, Tune, Train, Serve, Data, LLM)
RAY_DROP=('ray/jars/*' 'ray/dashboard/client/build/*.map' 'ray/rllib/*' 'ray/tune/*' 'ray/train/*' 'ray/serve/*'
          'ray/data/*' 'ray/llm/*')
# pyarrow less Flight and S3 (no module strict-gate imports links them: readelf -d), its tests, headers, sources
PA_DROP=('pyarrow/libarrow_flight.so*' 'pyarrow/_flight*' 'pyarrow/libarrow_python_flight.so*' 'pyarrow/flight.py'
         'pyarrow/libarrow_s3.so*' 'pyarrow/_s3fs*' 'pyarrow/tests/*' 'pyarrow/include/*' 'pyarrow/src/*')

build() {  # build PYVER DIR: the wheels for PYVER, slimmed, in DIR/{deps,core,pyarrow}
  local v=$1 d=$2
  rm -rf "$d" && mkdir -p "$d/raw" "$d/deps" "$d/core" "$d/pyarrow"
  dl "$v" "$d/raw" "$RAY_SPEC" "$PYARROW"
  dl "$v" "$d/raw/deps" "${RAY_DEPS[@]}" "${SG_DEPS[@]}"
  for w in "$d"/raw/deps/*.whl; do python3 benchmarks/gpu_ray/slim_wheel.py "$w" "$d/deps/$(basename "$w")" >/dev/null; done
  local rw; rw=$(ls "$d"/raw/ray-*.whl)
  nice python3 benchmarks/gpu_ray/slim_wheel.py "$rw" "$d/core/$(basename "$rw")" "${RAY_DROP[@]}"
  local pw; pw=$(ls "$d"/raw/pyarrow-*.whl)
  nice python3 benchmarks/gpu_ray/slim_wheel.py "$pw" "$d/pyarrow/$(basename "$pw")" "${PA_DROP[@]}"
}

W=.whl/ray-cp312
build 3.12 "$W"
mkdir -p .gpu .carry
rm -f .carry/ray?? .gpu/ray.SHA256SUMS .gpu/ray.PIECES
S=$(mktemp -d)
mkdir -p "$S/core" "$S/pyarrow"
cp -r "$W/deps" "$W"/core/*.whl "$S/core/" && cp "$W"/pyarrow/*.whl "$S/pyarrow/"
n=0
for stream in core pyarrow; do  # each stream its own tar.xz, cut; the pieces numbered on across both
  (cd "$S/$stream" && find . -type f | sort | xargs sha256sum) | sed "s#  \./#  ./$stream/#" >> .gpu/ray.SHA256SUMS
  (cd "$S/$stream" && tar -cf - $(ls | sort)) | nice xz -T2 -6 | split -b "$PIECE" -d -a 2 - "$S/cut-$stream-"
  for c in "$S"/cut-$stream-*; do
    p=$(printf "ray%02d" $n); n=$((n + 1))
    mv "$c" ".carry/$p" && echo "$p $stream" >> .gpu/ray.PIECES
  done
done
(cd .carry && sha256sum ray??) >> .gpu/ray.SHA256SUMS
rm -rf "$S"
# the pieces unpacked again as the device unpacks them, each member checked against its sum
T=$(mktemp -d)
for stream in core pyarrow; do
  mkdir -p "$T/$stream"
  cat $(awk -v s=$stream '$2 == s {print ".carry/" $1}' .gpu/ray.PIECES) | xz -d | tar -xf - -C "$T/$stream"
done
(cd "$T" && grep ' \./' "$OLDPWD/.gpu/ray.SHA256SUMS" | sha256sum -c --quiet -) && echo "unpacked again: every member's sum matches"
rm -rf "$T"
echo "pieces (.gpu/ray.PIECES: piece stream):"
while read -r p s; do
  printf "  %s  %11s bytes  %s:" "$p" "$(stat -c %s ".carry/$p")" "$s"
  grep " ./$s/" .gpu/ray.SHA256SUMS | sed "s#.* ./$s/# #" | sed 's/-[0-9].*//' | sort -u | tr -d '\n'; echo
done < .gpu/ray.PIECES
if [ $CHECK = 1 ]; then
  # The cp311 build of the same wheels, slimmed the same way, in a venv of its own with nothing else
  # (no aiohttp, no grpcio, no dashboard deps): ray start --head, one actor, ray stop.
  C=.whl/ray-cp311
  build 3.11 "$C"
  V=$(mktemp -d /tmp/gpuray-check-XXXX)
  python3 -m venv "$V/venv"
  "$V/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$C"/deps/*.whl \
    "$C"/core/*.whl "$C"/pyarrow/*.whl
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  env -u RAY_ADDRESS -u PYTHONPATH nice "$V/venv/bin/python" - "$port" "$V" <<'PY'
import subprocess, sys, time
port, tmp = sys.argv[1], sys.argv[2]
import ray, pyarrow.csv, pyarrow.json, msgspec, jsonlines  # noqa: E401,F401  the slim wheels import
print("ray", ray.__version__, ray.__file__, "| pyarrow", pyarrow.__version__)
cli = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())"]
r = subprocess.run([*cli, "start", "--head", "--num-cpus", "2", "--num-gpus", "0", "--port", port,
                    "--temp-dir", f"{tmp}/t", "--include-dashboard=false", "--node-ip-address", "127.0.0.1",
                    "--disable-usage-stats"], capture_output=True, text=True, timeout=180)
print("ray start rc", r.returncode, (r.stdout + r.stderr).strip().splitlines()[-1:] if r.returncode else "")
try:
    ray.init(address=f"127.0.0.1:{port}", logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_cpus=1)
    class A:
        def ping(self, x):
            import os
            return x * 2, os.getpid(), ray.get_gpu_ids()

    t0 = time.time()
    actors = [A.remote() for _ in range(2)]
    out = ray.get([a.ping.remote(i) for i, a in enumerate(actors)], timeout=120)
    print("actors answered", out, f"{time.time() - t0:.1f}s")
    assert [o[0] for o in out] == [0, 2] and out[0][1] != out[1][1]
    ray.shutdown()
finally:
    subprocess.run([*cli, "stop", "--force"], capture_output=True, timeout=120)
print("SLIM RAY CHECK OK")
PY
  rm -rf "$V"
fi
