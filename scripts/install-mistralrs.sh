#!/usr/bin/env bash
# Installs the mistral.rs engine's own environment into ./.venvs/mistralrs (idempotent), then
# prepares the bundled tiny Llama for it under build/mistralrs/ (scripts/convert_mistralrs.py:
# a config.json with rope_theta, links to the weights; no conversion, mistral.rs reads the
# safetensors and quantises at load). The engine runs under this interpreter, not strict-gate's:
# the gate only speaks strict-gate/engine@1 to it (examples/engines/mistralrs_engine.py).
# Pin: mistralrs 0.9.5, the CPU wheel (manylinux, abi3; no Rust toolchain, no build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venvs/mistralrs
MISTRALRS_VERSION=0.9.5
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary mistralrs "mistralrs==$MISTRALRS_VERSION"
"$VENV/bin/python" -c "from importlib.metadata import version; print('mistralrs', version('mistralrs'))"
"$VENV/bin/python" scripts/convert_mistralrs.py
# The real model too, when scripts/install.sh has converted it (pypi:smollm2-135m, docs/models.md):
# build/mistralrs/smollm2-135m, for gates/smollm2-mistralrs-*.toml.
if real=$(.venv/bin/strict-gate model path pypi:smollm2-135m 2>/dev/null); then
  "$VENV/bin/python" scripts/convert_mistralrs.py --model "$real"
fi
