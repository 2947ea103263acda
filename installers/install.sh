#!/usr/bin/env bash
# Install llm-tray into its own virtual environment and put `llm-tray` on PATH (~/.local/bin).
#   ./installers/install.sh           install (or upgrade) from this checkout
#   ./installers/install.sh --start   ... and start the tray app (its output goes to start.log in
#                                     the data dir; if it exits within START_WAIT_S, this says so)
set -euo pipefail
PREFIX="${LLM_TRAY_PREFIX:-${XDG_DATA_HOME:-$HOME/.local/share}/llm-tray/venv}"
BIN_DIR="${LLM_TRAY_BIN_DIR:-$HOME/.local/bin}"
PY="${PYTHON:-python3}"
START_WAIT_S=3    # how long the app must stay up to count as started
START_LOG_LINES=20  # how much of its log to show when it did not

# The app's data dir, as trayapp/config/paths.py has it (LLM_TRAY_HOME relocates it).
data_dir() {
  if [ -n "${LLM_TRAY_HOME:-}" ]; then
    echo "$LLM_TRAY_HOME/data"
  elif [ "$(uname)" = "Darwin" ]; then
    echo "$HOME/Library/Application Support/llm-tray"
  else
    echo "${XDG_DATA_HOME:-$HOME/.local/share}/llm-tray"
  fi
}

install_app() {
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "llm-tray needs Python 3.10 or newer ($PY is $("$PY" -V 2>&1))." >&2; exit 1
  fi
  if [ ! -x "$PREFIX/bin/python" ]; then
    if ! "$PY" -m venv "$PREFIX" 2>/dev/null; then
      echo "Could not create a virtual environment. On Debian/Ubuntu: sudo apt install python3-venv" >&2; exit 1
    fi
  fi
  "$PREFIX/bin/python" -m pip install -q --upgrade pip
  # With the `fast` extra (uvloop: the recording proxy's event loop in C, measured in docs/performance.md);
  # where it cannot install (no wheel for this platform, no compiler) llm-tray runs on asyncio's own.
  if ! "$PREFIX/bin/python" -m pip install -q --upgrade ".[fast]"; then
    echo "install.sh: uvloop did not install; the proxy uses asyncio's event loop" >&2
    "$PREFIX/bin/python" -m pip install -q --upgrade .
  fi
  mkdir -p "$BIN_DIR"
  ln -sf "$PREFIX/bin/llm-tray" "$BIN_DIR/llm-tray"
  echo "llm-tray installed: $BIN_DIR/llm-tray"
  case ":$PATH:" in *":$BIN_DIR:"*) ;; *) echo "Add $BIN_DIR to your PATH to type 'llm-tray'." ;; esac
}

# Start $BIN_DIR/llm-tray in the background, its output in the data dir's start.log; fail (exit 1,
# with the log's last lines) if it exits with an error within START_WAIT_S.
start_tray() {
  # Qt's xcb platform needs a few X libraries; name them instead of failing obscurely.
  if [ "$(uname)" = "Linux" ] && command -v ldconfig >/dev/null && ! ldconfig -p | grep -q libxcb-cursor.so.0; then
    echo "Note: Qt needs libxcb-cursor0 (sudo apt install libxcb-cursor0 libxkbcommon-x11-0)." >&2
  fi
  local dir log pid status=0 polls
  dir="$(data_dir)"
  mkdir -p "$dir"
  log="$dir/start.log"
  nohup "$BIN_DIR/llm-tray" >"$log" 2>&1 </dev/null &
  pid=$!
  polls=$((START_WAIT_S * 10))
  while [ "$polls" -gt 0 ] && kill -0 "$pid" 2>/dev/null; do
    sleep 0.1
    polls=$((polls - 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "llm-tray started (pid $pid): look for its icon in the system tray. Its output: $log"
    return 0
  fi
  wait "$pid" || status=$?
  if [ "$status" -eq 0 ]; then  # e.g. one was already running: it was asked to show its dashboard
    echo "llm-tray exited at once, without an error. The last lines of $log:"
    tail -n "$START_LOG_LINES" "$log"
    return 0
  fi
  echo "llm-tray failed to start (it exited with status $status). The last lines of $log:" >&2
  tail -n "$START_LOG_LINES" "$log" >&2
  exit 1
}

main() {
  cd "$(dirname "$0")/.."
  install_app
  if [ "${1:-}" = "--start" ]; then
    start_tray
  fi
}

main "$@"
