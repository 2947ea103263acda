#!/usr/bin/env bash
# Install the unpacked llm-tray bundle for this user (no root): the app under ~/.local/opt/llm-tray,
# `llm-tray` on PATH (~/.local/bin), its menu entry and icons.
#   ./install.sh               install (or upgrade)
#   ./install.sh --autostart   ... and start the tray at login (the app's own menu can switch it off)
#   ./install.sh --agent       ... and install the systemd user unit for `llm-tray agent` (not enabled)
set -euo pipefail
cd "$(dirname "$0")"
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
CONFIG="${XDG_CONFIG_HOME:-$HOME/.config}"
OPT="${LLM_TRAY_OPT:-$HOME/.local/opt/llm-tray}"
BIN_DIR="${LLM_TRAY_BIN_DIR:-$HOME/.local/bin}"

rm -rf "$OPT"
mkdir -p "$OPT" "$BIN_DIR" "$DATA/applications"
cp -a llm-tray/. "$OPT/"
ln -sf "$OPT/llm-tray" "$BIN_DIR/llm-tray"
cp share/applications/llm-tray.desktop "$DATA/applications/llm-tray.desktop"
cp -r share/icons "$DATA/"
command -v update-desktop-database >/dev/null && update-desktop-database -q "$DATA/applications" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$DATA/icons/hicolor" || true
echo "llm-tray installed: $BIN_DIR/llm-tray -> $OPT/llm-tray"
for arg in "$@"; do
  case "$arg" in
    --autostart)
      # The same file the app writes from its menu (XDG autostart, llm-tray.desktop): never two entries.
      # Exec is the installed executable's full path (what the app writes too): a login session's
      # PATH may lack ~/.local/bin.
      exe="$OPT/llm-tray"; case "$exe" in *" "*) exe="\"$exe\"" ;; esac
      mkdir -p "$CONFIG/autostart"
      sed "s|^Exec=llm-tray |Exec=$exe |" autostart/llm-tray.desktop > "$CONFIG/autostart/llm-tray.desktop"
      echo "starts at login: $CONFIG/autostart/llm-tray.desktop" ;;
    --agent)
      mkdir -p "$CONFIG/systemd/user" && cp systemd/llm-tray-agent.service "$CONFIG/systemd/user/"
      echo "agent unit installed: systemctl --user daemon-reload && systemctl --user enable --now llm-tray-agent" ;;
  esac
done
case ":$PATH:" in *":$BIN_DIR:"*) ;; *) echo "Add $BIN_DIR to your PATH to type 'llm-tray'." ;; esac
