#!/usr/bin/env bash
# Build the Linux bundle from a clean clone: a PyInstaller one-folder build (installers/llm-tray.spec)
# packed with the .desktop entry, hicolor icons, an XDG autostart file and the systemd user unit.
#   installers/build-linux.sh     -> dist/llm-tray/ and dist/llm-tray-<version>-linux-<arch>.tar.gz
# Environment: PYTHON (python3, 3.10+), LLM_TRAY_BUILD_VENV (build/bundle-venv: a venv of its own,
# so nothing is installed into yours), LLM_TRAY_DIST (dist), LLM_TRAY_LEAN_NUMPY (1; 0: PyPI's numpy).
# The system libraries the desktop provides are left out by the spec; this script fails if one
# slipped in, and prints what the bundled Qt xcb plugin resolves outside the bundle (ldd).
# The spec's size cuts need a C compiler (cc: ICU's empty data package) and binutils (strip,
# readelf); without them the build still works, with warnings, and is ~65 MB bigger.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PYTHON:-python3}"
VENV="${LLM_TRAY_BUILD_VENV:-$ROOT/build/bundle-venv}"
DIST="${LLM_TRAY_DIST:-$ROOT/dist}"
WORK="$ROOT/build/pyinstaller"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q ".[fast]" pyinstaller  # fast: uvloop, the proxy's event loop (1.6 MB)
# A lean numpy: without OpenBLAS (numpy.libs, 28 MB) and without its per-CPU SIMD variants, built
# from source once (minutes; needs cc, c++ and Python's headers) into build/numpy-lean/, reused after.
# numpy then uses its own loops and lapack_lite instead of BLAS/LAPACK: the same results, slower only
# on large matrices; llm-tray's numpy work is pyqtgraph's on a few thousand points per curve.
# (--no-cache-dir: pip's wheel cache ignores -C settings and would hand back another build.)
NUMPY_VERSION="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("numpy"))')"
if [ "${LLM_TRAY_LEAN_NUMPY:-1}" = 1 ]; then
  LEAN="$ROOT/build/numpy-lean"
  if ! ls "$LEAN/numpy-$NUMPY_VERSION"-*.whl >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip wheel -q --no-cache-dir --no-deps --no-binary numpy -w "$LEAN" \
      "numpy==$NUMPY_VERSION" -Csetup-args=-Dallow-noblas=true -Csetup-args=-Dblas=none \
      -Csetup-args=-Dlapack=none -Csetup-args=-Dcpu-dispatch=none
  fi
  "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$LEAN/numpy-$NUMPY_VERSION"-*.whl
else  # PyPI's wheel, also over a lean one left in the venv by an earlier build
  "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall --only-binary numpy "numpy==$NUMPY_VERSION"
fi
"$VENV/bin/python" -m PyInstaller --noconfirm --clean --log-level WARN \
  --distpath "$DIST" --workpath "$WORK" installers/llm-tray.spec

BUNDLE="$DIST/llm-tray"
VERSION="$("$BUNDLE/llm-tray" --version | awk '{print $2}')"  # also: the bundle starts
ARCH="$(uname -m)"

# The desktop's own libraries must not be in the bundle (ActivityWatch #710, #660).
SYSTEM_LIBS='^lib(glib-2\.0|gio-2\.0|gobject-2\.0|harfbuzz|fontconfig|freetype|dbus-1|X11|xcb\.|xkbcommon|wayland-)'
if find "$BUNDLE" -name 'lib*.so*' -printf '%f\n' | grep -E "$SYSTEM_LIBS"; then
  echo "build-linux.sh: system libraries above are in the bundle; see SYSTEM_LIBS in installers/llm-tray.spec" >&2
  exit 1
fi
XCB_PLUGIN="$(find "$BUNDLE" -name 'libqxcb.so' | head -n 1)"
if [ -n "$XCB_PLUGIN" ] && command -v ldd >/dev/null; then
  echo "from the desktop (ldd $(basename "$XCB_PLUGIN")):"
  LD_LIBRARY_PATH="$(dirname "$XCB_PLUGIN")/../../lib:$BUNDLE/_internal" ldd "$XCB_PLUGIN" \
    | grep -v "$BUNDLE" | awk '{print "  " $1 " " $3}' | sort -u
fi

NAME="llm-tray-$VERSION-linux-$ARCH"
STAGE="$WORK/stage/$NAME"
rm -rf "$WORK/stage"
mkdir -p "$STAGE/share/applications" "$STAGE/autostart" "$STAGE/systemd"
cp -a "$BUNDLE" "$STAGE/llm-tray"
cp installers/linux/llm-tray.desktop "$STAGE/share/applications/llm-tray.desktop"
cp installers/linux/llm-tray-autostart.desktop "$STAGE/autostart/llm-tray.desktop"
cp installers/linux/llm-tray-agent.service "$STAGE/systemd/llm-tray-agent.service"
for png in resources/icons/llm-tray-[0-9]*.png; do
  size="$(basename "$png" .png)"; size="${size#llm-tray-}"
  mkdir -p "$STAGE/share/icons/hicolor/${size}x${size}/apps"
  cp "$png" "$STAGE/share/icons/hicolor/${size}x${size}/apps/llm-tray.png"
done
cp installers/linux/install-bundle.sh "$STAGE/install.sh"
chmod +x "$STAGE/install.sh"
tar -C "$WORK/stage" -czf "$DIST/$NAME.tar.gz" "$NAME"

echo "bundle: $BUNDLE ($(du -sh "$BUNDLE" | cut -f1), $(du -sb "$BUNDLE" | cut -f1) bytes)"
echo "tarball: $DIST/$NAME.tar.gz ($(du -h "$DIST/$NAME.tar.gz" | cut -f1))"
