#!/usr/bin/env bash
# Install llm-tray into its own virtual environment and put `llm-tray` on PATH (~/.local/bin).
#   ./installers/install.sh           install (or upgrade) from this checkout
#   ./installers/install.sh --start   ... and start the tray app
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX="${LLM_TRAY_PREFIX:-${XDG_DATA_HOME:-$HOME/.local/share}/llm-tray/venv}"
BIN_DIR="${LLM_TRAY_BIN_DIR:-$HOME/.local/bin}"
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "llm-tray needs Python 3.10 or newer ($PY is $("$PY" -V 2>&1))." >&2; exit 1
fi
if [ ! -x "$PREFIX/bin/python" ]; then
  if ! "$PY" -m venv "$PREFIX" 2>/dev/null; then
    echo "Could not create a virtual environment. On Debian/Ubuntu: sudo apt install python3-venv" >&2; exit 1
  fi
fi
"$PREFIX/bin/python" -m pip install -q --upgrade pip
"$PREFIX/bin/python" -m pip install -q --upgrade .
mkdir -p "$BIN_DIR"
ln -sf "$PREFIX/bin/llm-tray" "$BIN_DIR/llm-tray"
echo "llm-tray installed: $BIN_DIR/llm-tray"
case ":$PATH:" in *":$BIN_DIR:"*) ;; *) echo "Add $BIN_DIR to your PATH to type 'llm-tray'." ;; esac
if [ "${1:-}" = "--start" ]; then
  # Qt's xcb platform needs a few X libraries; name them instead of failing obscurely.
  if [ "$(uname)" = "Linux" ] && command -v ldconfig >/dev/null && ! ldconfig -p | grep -q libxcb-cursor.so.0; then
    echo "Note: Qt needs libxcb-cursor0 (sudo apt install libxcb-cursor0 libxkbcommon-x11-0)." >&2
  fi
  nohup "$BIN_DIR/llm-tray" >/dev/null 2>&1 &
  echo "llm-tray started (pid $!): look for its icon in the system tray."
fi
