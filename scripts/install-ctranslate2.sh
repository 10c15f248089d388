#!/usr/bin/env bash
# Installs the CTranslate2 engine's own environment into ./.venvs/ctranslate2 (idempotent),
# then converts the bundled tiny Llama to CTranslate2 (float32, int8, int16) under build/ct2/.
# The engine runs under this interpreter, not strict-gate's: the gate only speaks
# strict-gate/engine@1 to it (examples/engines/ctranslate2_engine.py).
# Pins: ctranslate2 4.8.5 (a manylinux wheel), and for its converter transformers plus the
# CPU torch of constraints/cpu.txt (an unpinned torch resolves to a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venvs/ctranslate2
CT2_VERSION=4.8.5
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary ctranslate2,torch \
  -c constraints/cpu.txt "ctranslate2==$CT2_VERSION" torch transformers
"$VENV/bin/python" -c "import ctranslate2, torch, transformers; \
print('ctranslate2', ctranslate2.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
"$VENV/bin/python" scripts/convert_ctranslate2.py
# The real model too, when scripts/install.sh has converted it (pypi:smollm2-135m, docs/models.md):
# build/ct2/smollm2-135m-float32 and -int8, for gates/smollm2-ctranslate2-*.toml.
if real=$(.venv/bin/strict-gate model path pypi:smollm2-135m 2>/dev/null); then
  "$VENV/bin/python" scripts/convert_ctranslate2.py --model "$real" --quantization float32 int8
fi
