#!/usr/bin/env bash
# Build llm-tray.app on macOS: a PyInstaller one-folder .app (installers/llm-tray.spec), then a zip and a dmg.
#   installers/macos/build.sh            unsigned: dist/llm-tray.app, dist/llm-tray-<version>-macos-<arch>.{zip,dmg}
#   installers/macos/build.sh --sign     signed with the hardened runtime, notarised and stapled
# Signing needs a "Developer ID Application" certificate in the keychain and notarytool credentials
# stored once with `xcrun notarytool store-credentials <profile> --apple-id … --team-id … --password …`:
#   LLM_TRAY_SIGN_IDENTITY   "Developer ID Application: Jane Doe (AB12CD34EF)"  (security find-identity -v -p codesigning)
#   LLM_TRAY_TEAM_ID         AB12CD34EF  (must be the team in the identity)
#   LLM_TRAY_NOTARY_PROFILE  the keychain profile name given to store-credentials
# Environment: PYTHON (python3, 3.10+, a universal2 or native build), LLM_TRAY_BUILD_VENV
# (build/bundle-venv-macos), LLM_TRAY_DIST (dist).
# An unsigned app runs on the machine that built it; downloaded elsewhere, Gatekeeper blocks it
# (right-click > Open once, or `xattr -dr com.apple.quarantine llm-tray.app`).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
SIGN=0
for arg in "$@"; do
  case "$arg" in
    --sign) SIGN=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg (--sign, --help)" >&2; exit 2 ;;
  esac
done
if [ "$SIGN" = 1 ]; then
  missing=""
  for var in LLM_TRAY_SIGN_IDENTITY LLM_TRAY_TEAM_ID LLM_TRAY_NOTARY_PROFILE; do
    [ -n "${!var:-}" ] || missing="$missing $var"
  done
  if [ -n "$missing" ]; then
    echo "build.sh --sign: set$missing (see the top of $0); without --sign it builds an unsigned app" >&2
    exit 2
  fi
  case "$LLM_TRAY_SIGN_IDENTITY" in
    *"($LLM_TRAY_TEAM_ID)"*) ;;
    *) echo "build.sh --sign: the identity '$LLM_TRAY_SIGN_IDENTITY' is not team $LLM_TRAY_TEAM_ID" >&2; exit 2 ;;
  esac
fi
if [ "$(uname)" != "Darwin" ]; then
  echo "build.sh: builds on macOS only (PyInstaller does not cross-compile)" >&2; exit 1
fi
if [ "$SIGN" = 1 ]; then
  if ! security find-identity -v -p codesigning | grep -qF "\"$LLM_TRAY_SIGN_IDENTITY\""; then
    echo "build.sh --sign: no valid signing identity '$LLM_TRAY_SIGN_IDENTITY' in the keychain" >&2; exit 2
  fi
fi

PY="${PYTHON:-python3}"
VENV="${LLM_TRAY_BUILD_VENV:-$ROOT/build/bundle-venv-macos}"
DIST="${LLM_TRAY_DIST:-$ROOT/dist}"
WORK="$ROOT/build/pyinstaller-macos"
ENTITLEMENTS="$ROOT/installers/macos/entitlements.plist"

"$PY" installers/icon_files.py --check  # the .icns matches resources/icons
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q ".[fast]" pyinstaller  # fast: uvloop, the proxy's event loop
"$VENV/bin/python" -m PyInstaller --noconfirm --clean --log-level WARN \
  --distpath "$DIST" --workpath "$WORK" installers/llm-tray.spec

APP="$DIST/llm-tray.app"
VERSION="$("$APP/Contents/MacOS/llm-tray" --version | awk '{print $2}')"  # also: the bundle starts
[ "$(/usr/libexec/PlistBuddy -c 'Print :LSUIElement' "$APP/Contents/Info.plist")" = "true" ] \
  || { echo "build.sh: LSUIElement is not set in Info.plist" >&2; exit 1; }
[ "$(/usr/libexec/PlistBuddy -c 'Print :CFBundleShortVersionString' "$APP/Contents/Info.plist")" = "$VERSION" ] \
  || { echo "build.sh: Info.plist's version is not $VERSION" >&2; exit 1; }
ARCH="$(uname -m)"
NAME="llm-tray-$VERSION-macos-$ARCH"

sign() {  # sign one file or bundle with the hardened runtime and a secure timestamp
  codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" \
    --sign "$LLM_TRAY_SIGN_IDENTITY" "$1"
}
notarize() {  # submit, wait for Apple's verdict, print the log when it is not "Accepted"
  local verdict id
  verdict="$WORK/notary-$(basename "$1").plist"
  xcrun notarytool submit "$1" --keychain-profile "$LLM_TRAY_NOTARY_PROFILE" --wait --output-format plist \
    > "$verdict"
  id="$(/usr/libexec/PlistBuddy -c 'Print :id' "$verdict")"
  if [ "$(/usr/libexec/PlistBuddy -c 'Print :status' "$verdict")" != "Accepted" ]; then
    xcrun notarytool log "$id" --keychain-profile "$LLM_TRAY_NOTARY_PROFILE" >&2 || true
    echo "build.sh: notarisation of $1 failed (submission $id)" >&2; exit 1
  fi
}

if [ "$SIGN" = 1 ]; then
  # Inside out: every Mach-O file (libraries, Qt plugins, Python extensions), then the app itself.
  # No `codesign --deep`: it signs in no defined order and applies the entitlements to everything.
  find "$APP/Contents" -type f -print0 | while IFS= read -r -d '' file; do
    if file -b "$file" | grep -q 'Mach-O'; then sign "$file"; fi
  done
  sign "$APP"
  codesign --verify --strict --deep --verbose=2 "$APP"
  ditto -c -k --keepParent "$APP" "$WORK/notarize.zip"
  notarize "$WORK/notarize.zip"
  xcrun stapler staple "$APP"
fi

rm -f "$DIST/$NAME.zip" "$DIST/$NAME.dmg"
ditto -c -k --keepParent "$APP" "$DIST/$NAME.zip"
STAGE="$WORK/dmg"
rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
hdiutil create -quiet -volname "llm-tray $VERSION" -srcfolder "$STAGE" -fs HFS+ -format UDZO "$DIST/$NAME.dmg"
if [ "$SIGN" = 1 ]; then
  codesign --force --timestamp --sign "$LLM_TRAY_SIGN_IDENTITY" "$DIST/$NAME.dmg"
  notarize "$DIST/$NAME.dmg"
  xcrun stapler staple "$DIST/$NAME.dmg"
  spctl --assess --type execute --verbose "$APP"
  echo "signed, notarised and stapled: $APP, $DIST/$NAME.dmg"
else
  echo "unsigned (no --sign): Gatekeeper blocks it on other Macs until notarised"
fi
echo "app: $APP ($(du -sh "$APP" | cut -f1))"
echo "zip: $DIST/$NAME.zip ($(du -h "$DIST/$NAME.zip" | cut -f1))"
echo "dmg: $DIST/$NAME.dmg ($(du -h "$DIST/$NAME.dmg" | cut -f1))"
