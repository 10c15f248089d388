#!/usr/bin/env bash
# README command 2, and exactly what .ci/run runs: install everything the tests use, then lint,
# type-check, run the tests and the acceptance run's fast tier.
#
#   bash scripts/test.sh                 # the CI tier of the tests (what .ci/run runs)
#   STRICT_GATE_TESTS=full bash scripts/test.sh   # every test, the slow localisation and speculation ones too
#
# Installs (idempotent, each script says what it does): Debian's chromium when missing (for the report.html
# test; needs root and apt), strict-gate and the real model (scripts/install.sh), the CTranslate2 engine
# (its own venv), the llama.cpp engine (its own venv; a source build of the two libraries the binding
# loads, cached under ~/.cache/strict-gate, keyed by the CPU), the OpenVINO GenAI and mistral.rs engines
# (their own venvs, wheels only), the C++ example engine. The CTranslate2, OpenVINO and mistral.rs
# installs and the C++ build run beside the llama.cpp build (that one is compile-bound, they are not).
# Each step prints its wall time; the tier and what it leaves out: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
step() { echo "== $1: $(( $(date +%s) - t0 )) s since start" >&2; }

# Debian's chromium downloads beside the pip installs (both wait on the network, not the cores)
chromium=""
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  mkdir -p build
  (apt-get update -qq && apt-get install -y -qq chromium) > build/install-chromium.log 2>&1 &
  chromium=$!
fi
bash scripts/install.sh
step install
mkdir -p build
command -v g++ >/dev/null || { [ "$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq g++; }
bash scripts/install-ctranslate2.sh > build/install-ctranslate2.log 2>&1 &
ct2=$!
bash scripts/install-openvino.sh > build/install-openvino.log 2>&1 &
ov=$!
bash scripts/install-mistralrs.sh > build/install-mistralrs.log 2>&1 &
mrs=$!
bash scripts/build-cpp-engine.sh
bash scripts/install-llamacpp.sh
step llama.cpp
wait "$ct2" || { cat build/install-ctranslate2.log >&2; echo "install-ctranslate2.sh failed" >&2; exit 1; }
tail -n 3 build/install-ctranslate2.log
step ctranslate2
wait "$ov" || { cat build/install-openvino.log >&2; echo "install-openvino.sh failed" >&2; exit 1; }
tail -n 3 build/install-openvino.log
wait "$mrs" || { cat build/install-mistralrs.log >&2; echo "install-mistralrs.sh failed" >&2; exit 1; }
tail -n 3 build/install-mistralrs.log
step "openvino, mistral.rs"
if [ -n "$chromium" ]; then
  wait "$chromium" || { cat build/install-chromium.log >&2; echo "apt-get install chromium failed" >&2; exit 1; }
fi
step chromium
.venv/bin/ruff check strict_gate tests
.venv/bin/mypy
step lint
if [ "${STRICT_GATE_TESTS:-ci}" = full ]; then
  .venv/bin/python -m pytest -ra --durations=25
else
  .venv/bin/python -m pytest -ra --durations=25 -m "not full"
fi
step pytest
# the acceptance run's fast tier: the shipped gates as a user types them, from a git-archive copy of
# HEAD, relative paths, each checked against benchmarks/acceptance.toml (benchmarks/README.md)
bash scripts/acceptance.sh --tier fast --out acceptance-results
step acceptance
