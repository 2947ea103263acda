"""The Windows .ico and the macOS .icns of llm-tray, packed from the PNGs in resources/icons/.

    python installers/icon_files.py          write installers/windows/llm-tray.ico, macos/llm-tray.icns
    python installers/icon_files.py --check  exit 1 if either is out of date

Both formats can hold PNG data as it is (ICO since Windows Vista, ICNS since macOS 10.7), so no
image library is needed and the bytes depend only on the PNGs: tests/unit/test_installer_manifests.py
packs them again and compares. The PNGs come from resources/make_icons.py (the tray's own drawing).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ICONS = ROOT / "resources" / "icons"
ICO_FILE = ROOT / "installers" / "windows" / "llm-tray.ico"
ICNS_FILE = ROOT / "installers" / "macos" / "llm-tray.icns"
ICO_SIZES = (16, 32, 48, 64, 128, 256)
# ICNS element types that hold a PNG of this many pixels a side (Apple's "icp4" … "ic08").
ICNS_TYPES = {16: b"icp4", 32: b"icp5", 64: b"icp6", 128: b"ic07", 256: b"ic08"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_file(size_px: int) -> Path:
    return ICONS / f"llm-tray-{size_px}.png"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if data[:8] != PNG_MAGIC or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def ico_bytes(pngs: dict[int, bytes]) -> bytes:
    """An ICO file with one PNG-compressed image per size (ICONDIR, ICONDIRENTRYs, then the data)."""
    header = struct.pack("<HHH", 0, 1, len(pngs))
    entries = b""
    blobs = b""
    offset = 6 + 16 * len(pngs)
    for size, data in sorted(pngs.items()):
        if png_size(data) != (size, size):
            raise ValueError(f"the {size} px icon is {png_size(data)}")
        side = 0 if size == 256 else size  # 0 stands for 256
        entries += struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(data), offset + len(blobs))
        blobs += data
    return header + entries + blobs


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    """An ICNS file: 'icns' and the total length, then (type, length, PNG) per size."""
    body = b""
    for size, data in sorted(pngs.items()):
        if png_size(data) != (size, size):
            raise ValueError(f"the {size} px icon is {png_size(data)}")
        body += ICNS_TYPES[size] + struct.pack(">I", 8 + len(data)) + data
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def expected() -> dict[Path, bytes]:
    """What the two icon files must contain, from the PNGs as they are now."""
    ico = {size: png_file(size).read_bytes() for size in ICO_SIZES}
    icns = {size: png_file(size).read_bytes() for size in ICNS_TYPES}
    return {ICO_FILE: ico_bytes(ico), ICNS_FILE: icns_bytes(icns)}


def main(argv: list[str]) -> int:
    stale = [path for path, data in expected().items() if not path.is_file() or path.read_bytes() != data]
    if "--check" in argv:
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)} (run python installers/icon_files.py)")
        return 1 if stale else 0
    for path, data in expected().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path.relative_to(ROOT)} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
