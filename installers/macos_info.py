"""The macOS bundle's Info.plist settings, shared by installers/llm-tray.spec and its tests.

`info_plist(version)` is what the spec hands to PyInstaller's BUNDLE (which adds CFBundleExecutable,
CFBundlePackageType and the like itself). LSUIElement: an agent app, no Dock icon and no app menu —
the tray icon (a template image drawn by trayapp/ui/icons.py, so macOS tints it for a light or dark
menu bar) is the whole interface. The bundle id is the LaunchAgent label the app writes for start at
login (trayapp/services/autostart.py), so the two are one name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NAME = "llm-tray"
BUNDLE_ID = "io.github.llm-tray"
ICNS = ROOT / "installers" / "macos" / "llm-tray.icns"
ENTITLEMENTS = ROOT / "installers" / "macos" / "entitlements.plist"


def package_version(root: Path = ROOT) -> str:
    """trayapp.__version__, read from the source (the build venv need not import it)."""
    text = (root / "trayapp" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if match is None:
        raise ValueError("no __version__ in trayapp/__init__.py")
    return match[1]


def info_plist(version: str) -> dict[str, Any]:
    """The Info.plist keys of llm-tray.app."""
    return {
        "CFBundleName": NAME,
        "CFBundleDisplayName": NAME,
        "CFBundleIdentifier": BUNDLE_ID,
        "CFBundleShortVersionString": version,
        "CFBundleVersion": version,
        "CFBundleIconFile": ICNS.name,
        "LSUIElement": True,  # no Dock icon: a menu-bar app
        "LSApplicationCategoryType": "public.app-category.developer-tools",
        "NSHighResolutionCapable": True,
        "NSRequiresAquaSystemAppearance": False,  # follow dark mode
        "NSHumanReadableCopyright": "MIT License",
    }
