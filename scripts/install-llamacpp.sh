#!/usr/bin/env bash
# Installs the llama.cpp engine (llama-cpp-python) and llama.cpp's GGUF converter into
# ./.venvs/llamacpp, a venv of its own: the adapter runs under that interpreter, so
# llama.cpp's numpy/gguf pins never touch strict-gate's .venv. Idempotent.
#
# llama-cpp-python builds llama.cpp from source once (only the two libraries the binding loads: this whole script took
# 5.5 min from a fresh clone on the 2-core development machine, 19.5 min with llama.cpp's common library), so the built wheel is cached under $STRICT_GATE_CACHE/wheels (default ~/.cache/strict-gate) and
# reused. The build uses -march=native (llama.cpp's default), so the cache key includes a
# hash of the CPU's flags: another CPU rebuilds instead of dying of SIGILL.
# The sdist is kept in the cache too: its vendor/llama.cpp holds convert_hf_to_gguf.py and
# gguf-py at exactly the llama.cpp commit the wheel was built from (scripts/convert_llamacpp.py).
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMACPP_VERSION=0.3.36          # llama-cpp-python; vendors llama.cpp + gguf-py 0.19.0
PY=${PYTHON:-python3}
VENV=.venvs/llamacpp
CACHE=${STRICT_GATE_CACHE:-$HOME/.cache/strict-gate}
CPU_KEY=$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)
WHEELS=$CACHE/wheels/llama-cpp-python-$LLAMACPP_VERSION-libs-$CPU_KEY
SDIST_DIR=$CACHE/src/llama_cpp_python-$LLAMACPP_VERSION
PIP=(-m pip install -q --disable-pip-version-check)

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
mkdir -p "$WHEELS" "$CACHE/src"

if [ ! -f "$SDIST_DIR/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
  tmp=$(mktemp -d)
  "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary :all: "llama-cpp-python==$LLAMACPP_VERSION" -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-"$LLAMACPP_VERSION".tar.gz -C "$CACHE/src"
  rm -rf "$tmp"
fi
# The binding loads libllama and libggml only: llama.cpp's `common` library (argument parsing, chat
# templates, JSON schemas; about half the build) is forced on by the sdist's CMakeLists for tools
# the wheel does not ship. Off, the build is the two libraries the engine loads.
sed -i 's/set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)/set(LLAMA_BUILD_COMMON OFF CACHE BOOL "Build llama.cpp common library" FORCE)/' \
  "$SDIST_DIR/CMakeLists.txt"

if ! ls "$WHEELS"/llama_cpp_python-"$LLAMACPP_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMACPP_VERSION from source (libllama and libggml: a few minutes on 2 cores; a one-time cost)..." >&2
  # LLAVA_BUILD=OFF: the multimodal library is not needed and is a third of the build.
  CMAKE_ARGS="-DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    "$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps \
    "$SDIST_DIR" -w "$WHEELS"
fi

"$VENV/bin/python" "${PIP[@]}" "$WHEELS"/llama_cpp_python-"$LLAMACPP_VERSION"-*.whl
# The converter's needs (requirements-convert_hf_to_gguf.txt, CPU torch): gguf-py from the
# same sdist, so the GGUF writer matches the llama.cpp that reads it.
"$VENV/bin/python" "${PIP[@]}" "torch==2.13.0" "transformers==5.19.0" safetensors sentencepiece \
  "$SDIST_DIR/vendor/llama.cpp/gguf-py"
"$VENV/bin/python" -c "import llama_cpp, gguf, torch; print('llama.cpp engine installed: llama-cpp-python', llama_cpp.__version__, '| torch', torch.__version__)"
# The bundled tiny-llama as GGUF F32, F16 and Q8_0 in build/gguf/ (skipped when current).
"$VENV/bin/python" scripts/convert_llamacpp.py --llama-cpp-src "$SDIST_DIR/vendor/llama.cpp"
# The real model too, when scripts/install.sh has converted it (pypi:smollm2-135m, docs/models.md):
# the Q4_1 GGUF exactly as its package ships it, and F32/F16/Q8_0 made from its float32 conversion,
# all in build/gguf/smollm2-135m-*.gguf, for gates/smollm2-llamacpp-*.toml.
if real=$(.venv/bin/strict-gate model path pypi:smollm2-135m 2>/dev/null); then
  "$VENV/bin/python" scripts/convert_llamacpp.py --llama-cpp-src "$SDIST_DIR/vendor/llama.cpp" --model "$real"
  shipped=$(.venv/bin/strict-gate model path --shipped pypi:smollm2-135m)
  cmp -s "$shipped" build/gguf/smollm2-135m-q4_1.gguf || cp "$shipped" build/gguf/smollm2-135m-q4_1.gguf
fi
