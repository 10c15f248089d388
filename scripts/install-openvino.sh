#!/usr/bin/env bash
# Installs the OpenVINO GenAI engine's own environment into ./.venvs/openvino (idempotent), then
# converts the bundled tiny Llama to OpenVINO IR (f32 and int8 weights) under build/openvino/.
# The engine runs under this interpreter, not strict-gate's: the gate only speaks
# strict-gate/engine@1 to it (examples/engines/openvino_engine.py).
# Pins: openvino, openvino-genai and openvino-tokenizers 2026.4.1 (manylinux wheels), nncf 3.4.0
# for int8 weights, and for the converter (ov.convert_model of the transformers model: no
# optimum-intel) transformers plus the CPU torch of constraints/cpu.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venvs/openvino
OV_VERSION=2026.4.1
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --only-binary openvino,openvino-genai,torch \
  -c constraints/cpu.txt "openvino==$OV_VERSION" "openvino-genai==$OV_VERSION.0" \
  "openvino-tokenizers==$OV_VERSION.0" "nncf==3.4.0" torch transformers
"$VENV/bin/python" -c "import openvino, openvino_genai, nncf, torch, transformers; \
print('openvino', openvino.__version__, '| genai', openvino_genai.__version__, '| nncf', nncf.__version__, \
'| torch', torch.__version__, '| transformers', transformers.__version__)"
"$VENV/bin/python" scripts/convert_openvino.py
# The real model too, when scripts/install.sh has converted it (pypi:smollm2-135m, docs/models.md):
# build/openvino/smollm2-135m-f32 and -int8, for gates/smollm2-openvino-*.toml.
if real=$(.venv/bin/strict-gate model path pypi:smollm2-135m 2>/dev/null); then
  "$VENV/bin/python" scripts/convert_openvino.py --model "$real"
fi
