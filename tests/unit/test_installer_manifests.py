"""The macOS and Windows packaging, checked here since neither builds on Linux.

The PyInstaller spec is executed with recording stand-ins for PyInstaller's build classes, once
per platform: its data files exist, the .app's Info.plist (installers/macos_info.py, round-tripped
through plistlib) and the Windows executables agree with the app's version, name and icons. The
Inno Setup script is parsed as the INI-like file it is: its name, version, icon, per-user install
and the start-at-login Run value (the app's own, removed at uninstall, never a Startup shortcut).
The .ico / .icns are read back with struct against the PNG sizes they must hold.
"""

from __future__ import annotations

import argparse
import importlib.util
import plistlib
import re
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import trayapp
from trayapp.cli import main as cli
from trayapp.cli.autostart import run_autostart
from trayapp.config import paths
from trayapp.services import autostart

REPO = Path(__file__).resolve().parents[2]
INSTALLERS = REPO / "installers"
SPEC = INSTALLERS / "llm-tray.spec"
ISS = INSTALLERS / "windows" / "llm-tray.iss"
BUILD_PS1 = INSTALLERS / "windows" / "build.ps1"
ENTITLEMENTS = INSTALLERS / "macos" / "entitlements.plist"
ICONS = REPO / "resources" / "icons"


def _load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, INSTALLERS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pyproject_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert match
    return match[1]


# --------------------------------------------------------------------------- the spec, per platform


class _Recorded:
    """A stand-in for one of PyInstaller's build classes: keeps its arguments."""

    def __init__(self, kind: str, calls: list[_Recorded], *args: Any, **kwargs: Any) -> None:
        self.kind, self.args, self.kwargs = kind, args, kwargs
        self.binaries: list[tuple[str, str, str]] = []
        self.datas: list[tuple[str, str, str]] = list(kwargs.get("datas", []))
        self.pure: list[Any] = []
        self.scripts: list[Any] = []
        calls.append(self)


def _package_data(package: str) -> list[tuple[str, str]]:
    """What PyInstaller's collect_data_files gives for trayapp: its non-Python files, by folder."""
    root = REPO / package
    found = [p for p in root.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    return [(str(p), str(p.parent.relative_to(REPO))) for p in found if "__pycache__" not in p.parts]


def run_spec(platform: str, monkeypatch: pytest.MonkeyPatch) -> list[_Recorded]:
    """Execute installers/llm-tray.spec as PyInstaller would on `platform`; the build calls it made."""
    calls: list[_Recorded] = []
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_data_files = _package_data  # type: ignore[attr-defined]
    hooks.collect_submodules = lambda package: [package]  # type: ignore[attr-defined]
    for name in ("PyInstaller", "PyInstaller.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "PyInstaller.utils.hooks", hooks)
    monkeypatch.delitem(sys.modules, "macos_info", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    namespace: dict[str, Any] = {"SPECPATH": str(INSTALLERS), "__name__": "__main__"}
    for kind in ("Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE"):
        namespace[kind] = lambda *a, _kind=kind, **k: _Recorded(_kind, calls, *a, **k)
    code = compile(SPEC.read_text(encoding="utf-8"), str(SPEC), "exec")
    with monkeypatch.context() as patch:
        patch.setattr(sys, "platform", platform)
        exec(code, namespace)
    return calls


def _of(calls: list[_Recorded], kind: str) -> list[_Recorded]:
    return [c for c in calls if c.kind == kind]


@pytest.mark.parametrize("platform", ["linux", "darwin", "win32"])
def test_every_data_file_of_the_spec_exists(platform: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (analysis,) = _of(run_spec(platform, monkeypatch), "Analysis")
    datas = analysis.kwargs["datas"]
    assert (str(ICONS), "resources/icons") in datas
    assert any(Path(src).name == "bandwidth.csv" for src, _dest in datas)
    for src, _dest in datas:
        assert Path(src).exists(), src
    for script in analysis.args[0]:
        assert Path(script).is_file(), script


def test_the_macos_bundle_is_a_menu_bar_app_named_like_its_launch_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = run_spec("darwin", monkeypatch)
    (bundle,) = _of(calls, "BUNDLE")
    kwargs = bundle.kwargs
    assert kwargs["name"] == "llm-tray.app"
    assert kwargs["bundle_identifier"] == autostart.LAUNCH_AGENT_LABEL == "io.github.llm-tray"
    assert kwargs["version"] == trayapp.__version__
    assert Path(kwargs["icon"]).suffix == ".icns" and Path(kwargs["icon"]).is_file()
    info = plistlib.loads(plistlib.dumps(kwargs["info_plist"]))  # what Info.plist will hold
    assert info["LSUIElement"] is True  # no Dock icon
    assert info["CFBundleIdentifier"] == "io.github.llm-tray"
    assert info["CFBundleShortVersionString"] == info["CFBundleVersion"] == trayapp.__version__
    assert info["CFBundleName"] == paths.APP_NAME
    assert info["CFBundleIconFile"] == Path(kwargs["icon"]).name
    (exe,) = _of(calls, "EXE")
    assert exe.kwargs["name"] == "llm-tray" and exe.kwargs["console"] is False  # the .app bootloader


def test_the_bundle_version_comes_from_the_package(tmp_path: Path) -> None:
    macos_info = _load("macos_info")
    assert macos_info.package_version() == trayapp.__version__ == _pyproject_version()
    (tmp_path / "trayapp").mkdir()
    (tmp_path / "trayapp" / "__init__.py").write_text('"""x"""\n\n__version__ = "9.8.7"\n')
    assert macos_info.package_version(tmp_path) == "9.8.7"
    assert macos_info.info_plist("9.8.7")["CFBundleShortVersionString"] == "9.8.7"


def test_windows_builds_a_windowed_tray_and_a_console_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = run_spec("win32", monkeypatch)
    exes = {c.kwargs["name"]: c.kwargs for c in _of(calls, "EXE")}
    assert exes["llm-tray"]["console"] is False and exes["llm-tray-cli"]["console"] is True
    for kwargs in exes.values():
        assert kwargs["icon"] == str(INSTALLERS / "windows" / "llm-tray.ico")
    (collect,) = _of(calls, "COLLECT")
    assert collect.kwargs["name"] == "llm-tray"
    assert not _of(calls, "BUNDLE")


def test_linux_keeps_one_console_executable(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = run_spec("linux", monkeypatch)
    (exe,) = _of(calls, "EXE")
    assert exe.kwargs["name"] == "llm-tray" and exe.kwargs["console"] is True and exe.kwargs["icon"] is None


def test_entitlements_parse_and_keep_the_app_unsandboxed() -> None:
    entitlements = plistlib.loads(ENTITLEMENTS.read_bytes())
    assert entitlements == {
        "com.apple.security.cs.allow-unsigned-executable-memory": True,
        "com.apple.security.cs.disable-library-validation": True,
    }


def test_macos_build_script_signs_notarises_and_staples_only_when_asked() -> None:
    script = (INSTALLERS / "macos" / "build.sh").read_text(encoding="utf-8")
    for needed in (
        "--options runtime",
        '--entitlements "$ENTITLEMENTS"',
        "xcrun notarytool submit",
        "--wait",
        "xcrun stapler staple",
        "LLM_TRAY_SIGN_IDENTITY",
        "LLM_TRAY_TEAM_ID",
        "LLM_TRAY_NOTARY_PROFILE",
        "hdiutil create",
    ):
        assert needed in script, needed
    assert 'ENTITLEMENTS="$ROOT/installers/macos/entitlements.plist"' in script


# --------------------------------------------------------------------------- the icon files


def _png_side(data: bytes) -> int:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width == height
    return int(width)


def test_the_ico_holds_the_resources_pngs() -> None:
    data = (INSTALLERS / "windows" / "llm-tray.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", data[:6])
    assert (reserved, kind, count) == (0, 1, 6)
    sides = []
    for index in range(count):
        w, h, _colours, _res, planes, bits, size, offset = struct.unpack(
            "<BBBBHHII", data[6 + 16 * index : 22 + 16 * index]
        )
        png = data[offset : offset + size]
        side = _png_side(png)
        assert (w or 256, h or 256, planes, bits) == (side, side, 1, 32)
        assert png == (ICONS / f"llm-tray-{side}.png").read_bytes()
        sides.append(side)
    assert sides == [16, 32, 48, 64, 128, 256]


def test_the_icns_holds_the_resources_pngs() -> None:
    data = (INSTALLERS / "macos" / "llm-tray.icns").read_bytes()
    assert data[:4] == b"icns" and struct.unpack(">I", data[4:8])[0] == len(data)
    apple = {b"icp4": 16, b"icp5": 32, b"icp6": 64, b"ic07": 128, b"ic08": 256}  # Apple's ICNS types
    offset, found = 8, {}
    while offset < len(data):
        kind, length = data[offset : offset + 4], struct.unpack(">I", data[offset + 4 : offset + 8])[0]
        png = data[offset + 8 : offset + length]
        assert _png_side(png) == apple[kind]
        assert png == (ICONS / f"llm-tray-{apple[kind]}.png").read_bytes()
        found[kind] = apple[kind]
        offset += length
    assert found == apple


def test_icon_files_are_up_to_date() -> None:
    icon_files = _load("icon_files")
    assert icon_files.main(["--check"]) == 0


# --------------------------------------------------------------------------- the Inno Setup script


def parse_iss(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """ISPP #defines (with `{#Name}` expanded) and each section's lines (comments dropped)."""
    defines: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        define = re.match(r'#define\s+(\w+)\s+"(.*)"$', line)
        if define:
            defines.setdefault(define[1], define[2])
            continue
        if not line or line.startswith((";", "#")):
            continue
        line = re.sub(r"\{#(\w+)\}", lambda m: defines[m[1]], line)
        header = re.fullmatch(r"\[(\w+)\]", line)
        if header:
            current = header[1]
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return defines, sections


def setup_keys(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines)


def entry(line: str) -> dict[str, str]:
    """`Name: "x"; Flags: a b` → {"Name": "x", "Flags": "a b"} (quotes off, "" → ")."""
    fields = {}
    for part in re.findall(r'(\w+):\s*("(?:[^"]|"")*"|[^;]*)', line):
        key, value = part
        value = value.strip()
        if value.startswith('"') and value.endswith('"'):
            value = value[1:-1].replace('""', '"')
        fields[key] = value
    return fields


@pytest.fixture(scope="module")
def iss() -> tuple[dict[str, str], dict[str, list[str]]]:
    return parse_iss(ISS.read_text(encoding="utf-8"))


def test_iss_names_the_app_its_version_and_icon(iss: tuple[dict[str, str], dict[str, list[str]]]) -> None:
    defines, sections = iss
    setup = setup_keys(sections["Setup"])
    assert setup["AppName"] == paths.APP_NAME
    assert setup["AppVersion"] == trayapp.__version__  # the fallback; build.ps1 passes /DAppVersion
    assert re.fullmatch(r"\{\{[0-9A-F]{8}(-[0-9A-F]{4}){3}-[0-9A-F]{12}\}", setup["AppId"])  # {{GUID}
    assert (ISS.parent / setup["SetupIconFile"]).is_file()
    assert (ISS.parent / setup["SetupIconFile"]).read_bytes()[:4] == b"\x00\x00\x01\x00"
    assert setup["UninstallDisplayIcon"] == "{app}\\llm-tray.exe"
    dist = (ISS.parent / defines["DistDir"].replace("\\", "/")).resolve()
    assert dist == REPO / "dist" / "llm-tray"  # the spec's COLLECT folder
    (files,) = sections["Files"]
    assert entry(files)["Source"] == defines["DistDir"] + "\\*"


def test_iss_installs_per_user(iss: tuple[dict[str, str], dict[str, list[str]]]) -> None:
    setup = setup_keys(iss[1]["Setup"])
    assert setup["PrivilegesRequired"] == "lowest"
    assert setup["DefaultDirName"].startswith(("{localappdata}", "{userpf}"))
    icons = [entry(line) for line in iss[1]["Icons"]]
    assert {"Name": "{autoprograms}\\llm-tray", "Filename": "{app}\\llm-tray.exe"}.items() <= icons[0].items()


def test_iss_start_at_login_is_the_apps_own_run_value(
    iss: tuple[dict[str, str], dict[str, list[str]]],
) -> None:
    _defines, sections = iss
    text = "\n".join(line for lines in sections.values() for line in lines).lower()  # no comments
    assert "{userstartup}" not in text and "{commonstartup}" not in text and "{autostartup}" not in text
    tasks = {entry(line)["Name"] for line in sections["Tasks"]}
    assert "autostart" in tasks
    (run_value,) = [entry(line) for line in sections["Registry"]]
    assert run_value["Root"] == "HKCU"
    assert run_value["Subkey"] == autostart.RUN_KEY
    assert run_value["ValueName"] == autostart.APP_ID
    assert run_value["ValueType"] == "string"
    assert run_value["ValueData"] == '"{app}\\llm-tray.exe" --at-login'
    assert run_value["Tasks"] == "autostart"
    assert "uninsdeletevalue" in run_value["Flags"].split()
    # A value the tray's menu wrote after setup is removed at uninstall too.
    code = "\n".join(sections["Code"])
    expected = f"RegDeleteValue(HKEY_CURRENT_USER, '{autostart.RUN_KEY}', '{autostart.APP_ID}')"
    assert expected in code
    assert "CurUninstallStep = usUninstall" in code


def test_iss_stops_the_tray_before_uninstalling(iss: tuple[dict[str, str], dict[str, list[str]]]) -> None:
    (stop,) = [entry(line) for line in iss[1]["UninstallRun"]]
    assert stop["Filename"] == "{sys}\\taskkill.exe" and stop["Parameters"].endswith("/IM llm-tray.exe")
    assert "runhidden" in stop["Flags"].split() and stop["RunOnceId"]


def test_windows_build_passes_the_package_version() -> None:
    script = BUILD_PS1.read_text(encoding="utf-8")
    match = re.search(r"-Pattern '([^']+)'", script)
    assert match
    found = re.search(match[1], (REPO / "trayapp" / "__init__.py").read_text(), re.M)
    assert found and found[1] == trayapp.__version__
    assert '"/DAppVersion=$Version"' in script and "installers\\windows\\llm-tray.iss" in script
    assert "llm-tray-cli.exe" in script  # the version check needs the console executable


def test_parse_iss_reads_what_the_tests_rely_on() -> None:
    defines, sections = parse_iss(
        '#define V "1.2"\n[Setup]\n; comment\nAppVersion={#V}\n[Registry]\n'
        'Root: HKCU; ValueData: """{app}\\a.exe"" --x"; Flags: uninsdeletevalue\n'
    )
    assert defines == {"V": "1.2"} and setup_keys(sections["Setup"]) == {"AppVersion": "1.2"}
    assert entry(sections["Registry"][0]) == {
        "Root": "HKCU",
        "ValueData": '"{app}\\a.exe" --x',
        "Flags": "uninsdeletevalue",
    }


# --------------------------------------------------------------------------- `llm-tray autostart`


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG autostart")
def test_autostart_command_switches_the_app_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    entry_file = tmp_path / "autostart" / "llm-tray.desktop"
    assert cli.main(["autostart", "status"]) == 1
    assert cli.main(["autostart", "on"]) == 0
    assert "Exec=" in entry_file.read_text() and entry_file.read_text().rstrip().endswith("enabled=true")
    assert str(entry_file) in capsys.readouterr().out
    assert cli.main(["autostart", "status"]) == 0
    assert capsys.readouterr().out == "on\n"
    assert cli.main(["autostart", "off"]) == 0
    assert not entry_file.exists()
    assert cli.main(["autostart", "status"]) == 1
    assert capsys.readouterr().out.endswith("off\n")


def test_autostart_command_reports_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(*_a: object, **_k: object) -> str:
        raise autostart.AutostartError("cannot write /x: Permission denied")

    monkeypatch.setattr(autostart, "enable", refuse)
    assert run_autostart(argparse.Namespace(action="on")) == 1
    assert capsys.readouterr().err == "llm-tray: autostart: cannot write /x: Permission denied\n"


def test_the_windows_console_twin_registers_the_windowed_exe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", "/opt/llm-tray/llm-tray-cli.exe")
    assert autostart.autostart_command() == ["/opt/llm-tray/llm-tray.exe", "--at-login"]
    monkeypatch.setattr(sys, "executable", "/opt/llm-tray/llm-tray")
    assert autostart.autostart_command() == ["/opt/llm-tray/llm-tray", "--at-login"]
