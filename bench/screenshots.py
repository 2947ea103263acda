"""Screenshots of the real tray app for the README: `docs/screenshots/tray.png`, `tray-prefill.png`
and `dashboard.png`.

    python bench/screenshots.py [--out docs/screenshots] [--keep DIR]

Runs a real llama-server (test model, -t 1), a real X display (Xvfb + trayer) and the real
app (`python -m trayapp`), then has a separate client send a long prompt (prefill) and three
requests at growing context depths so both dashboard plots have data.

* `tray.png`: the right end of trayer's panel with the icon idle (left) and while the model
  generates (right), scaled ×4 without smoothing (the icon itself is drawn at 22 px).
* `tray-prefill.png`: the same crop while the server reads a ~3.5k-token prompt sent through the
  tray's own recording proxy (`[[proxies]]`), so its length is known: the prompt tokens in place as
  the number, the ring filling with the share read, the violet prefill colour; scaled ×4.
* `dashboard.png`: the dashboard window during the third request.

Notifications are set to do-not-disturb for the run (an alert still shows in the dashboard;
its bubble would cover the window, since Xvfb has no window manager). Needs Xvfb, trayer,
xdotool and ImageMagick (tests/provision.sh installs them). Look at the PNGs after running it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trayrun import filler_prompt

from tests.support.llama import LlamaServer, free_port, generate_in_background
from tests.support.trayapp_process import REPO, Event, Geometry, TrayAppProcess, is_event, wait_value
from tests.support.xdisplay import XDisplay, xdisplay_tools_missing

TRAY_CROP_W = 72  # pixels of the panel's right end kept per state (before scaling)
TRAY_SCALE = 4
QUIET_CONFIG = "[notifications]\ndo_not_disturb = true\n"
PROXY_CONFIG = '[[proxies]]\nlisten = "127.0.0.1:{port}"\nupstream = "{upstream}"\nkind = "llamacpp"\n'
REQUESTS = ((0, 500), (1500, 400), (4500, 400))  # (filler prompt tokens, tokens to generate)
PREFILL_FILLER_TOKENS = 3000  # ~3.5k real tokens: read for tens of seconds at -t 1


def _all_idle(event: Event) -> bool:
    models = event.get("models")
    if event["event"] != "snapshot" or not isinstance(models, list):
        return False
    return all(m["phase"] == "idle" for m in models)


def _reading_a_long_prompt(event: Event) -> bool:
    """The icon while a prompt of known length is read, once a thousand or more of its tokens are
    in place ('1k'…): the tooltip then says 'reading prompt 1.2k / 3.5k · 34 %'."""
    tooltip = event.get("tooltip") or ""
    if event["event"] != "icon" or "reading prompt" not in tooltip or " / " not in tooltip:
        return False
    return str(event.get("text") or "").endswith("k")


def _prefill_shot(
    app: TrayAppProcess, url: str, display: XDisplay, crop: tuple[Geometry, Geometry], path: Path
) -> Path:
    """The panel's end while the server reads a long prompt sent to `url` (the tray's proxy; one
    token generated, then idle again)."""
    request = generate_in_background(url, filler_prompt(PREFILL_FILLER_TOKENS), 1, timeout_s=300.0)
    event = app.wait_for("a prefill icon", _reading_a_long_prompt, 180.0)
    shot = _panel_end(display, *crop, path)
    print(f"tray: showing {event['text']} ({event['tooltip'].splitlines()[1]})")
    print(f"prefill: {request.result(timeout=300)['timings']['prompt_n']} prompt tokens")
    app.wait_for("the server idle again", _all_idle)
    return shot


def _convert(*args: str) -> None:
    subprocess.run(["convert", *args], check=True, timeout=60)


def _panel_end(display: XDisplay, icon: Geometry, panel: Geometry, path: Path) -> Path:
    """A screenshot of the panel's right end, around the icon."""
    px, py, _, ph = panel
    left = max(icon[0] + icon[2] + 6 - TRAY_CROP_W, px)
    display.screenshot(path, crop=f"{TRAY_CROP_W}x{ph}+{left}+{py}")
    _convert(str(path), "+repage", str(path))
    return path


def take(out_dir: Path, work_dir: Path) -> tuple[Path, Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    tray_png, dashboard_png = out_dir / "tray.png", out_dir / "dashboard.png"
    prefill_png = out_dir / "tray-prefill.png"
    with LlamaServer(threads=1, log_dir=work_dir) as server, XDisplay() as display:
        proxy_port = free_port()
        proxy_config = PROXY_CONFIG.format(port=proxy_port, upstream=server.url)
        app = TrayAppProcess(display, server.url, work_dir, config_toml=QUIET_CONFIG + proxy_config)
        try:
            app.wait_for("'tray_shown'", is_event("tray_shown"))
            app.wait_for("an idle icon", is_event("icon", health="idle"))
            icon = wait_value("the docked icon", lambda: app.window_geometry(small=True))
            panel = app.panels()[0]
            idle = _panel_end(display, icon, panel, work_dir / "tray-idle.png")
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            prefill = _prefill_shot(app, proxy_url, display, (icon, panel), work_dir / "tray-reading.png")
            app.open_dashboard()
            for index, (prompt_tokens, n_predict) in enumerate(REQUESTS):
                request = generate_in_background(
                    server.url, filler_prompt(prompt_tokens), n_predict, ignore_eos=True, timeout_s=300.0
                )
                live = app.wait_live_number(120.0)
                if index == 0:
                    busy = _panel_end(display, icon, panel, work_dir / "tray-generating.png")
                    print(f"tray: showing {live['text']} ({live['tooltip'].splitlines()[1]})")
                if index == len(REQUESTS) - 1:
                    for _ in range(6):  # a few live ticks at this depth
                        app.wait_for("a curve redraw", is_event("curve"), 30.0)
                    x, y, w, h = wait_value("the dashboard", lambda: app.window_geometry(small=False))
                    display.screenshot(dashboard_png, crop=f"{w}x{h}+{x}+{y}")
                timings = request.result(timeout=300)["timings"]
                print(
                    f"request {index + 1}: {timings['prompt_n']} prompt tokens, "
                    f"{timings['predicted_n']} generated at {timings['predicted_per_second']:.0f} tok/s"
                )
                app.wait_for("the server idle again", _all_idle)
        finally:
            code = app.quit()
    if code != 0:
        raise RuntimeError(f"the app exited with {code}; log: {app.log_path}")
    gap = f"2x{panel[3]}"
    _convert(
        str(idle), "(", "-size", gap, "xc:#7f7f7f", ")", str(busy), "+append",
        "-scale", f"{TRAY_SCALE * 100}%", str(tray_png),
    )  # fmt: skip
    _convert(str(prefill), "-scale", f"{TRAY_SCALE * 100}%", str(prefill_png))
    for path in (tray_png, prefill_png, dashboard_png):
        _convert(str(path), "+repage", "-strip", "-define", "png:compression-level=9", str(path))
    return tray_png, prefill_png, dashboard_png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    parser.add_argument("--keep", type=Path, help="keep the app's events, log and home in this folder")
    args = parser.parse_args()
    missing = xdisplay_tools_missing()
    if missing:
        raise SystemExit(f"missing X display tools: {', '.join(missing)} (tests/provision.sh installs them)")
    started = time.monotonic()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        paths = take(args.out, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="llm-tray-shots-") as work:
            paths = take(args.out, Path(work))
    for path in paths:
        print(f"{path} ({path.stat().st_size / 1024:.0f} KiB)")
    print(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
