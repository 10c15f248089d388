#!/usr/bin/env bash
# Builds the C++ example engine (examples/engines/cpp/, standard library only) with the system
# compiler: build/cpp/engine. No flags beyond the C++17 standard and -O2, except
# -ffp-contract=off: a compiler may otherwise fuse a * b + c into one FMA where the target has
# it (-march=native on a recent x86, any aarch64), which changes the rounding of every dot
# product and so the engine's tokens from one machine to the next.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-g++}
OUT=build/cpp
mkdir -p "$OUT"
"$CXX" -O2 -std=c++17 -ffp-contract=off -Wall -Wextra -o "$OUT/engine.tmp" examples/engines/cpp/engine.cpp
mv -f "$OUT/engine.tmp" "$OUT/engine"   # never a half-written binary at build/cpp/engine
echo "built $OUT/engine ($("$CXX" --version | head -1))" >&2
