#!/usr/bin/env bash
# The whole test suite, from a fresh clone: provision what the tests need, then run pytest.
# Extra arguments go to pytest (e.g. tests/run.sh tests/unit -q).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/provision.sh
export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}"
.venv/bin/python -m ruff check trayapp tests bench resources
.venv/bin/python -m ruff format --check trayapp tests bench resources
.venv/bin/python -m mypy trayapp
.venv/bin/lint-imports --no-cache  # the layers (pyproject.toml [tool.importlinter])
# LLM_TRAY_TEST_HOG=N: run the suite beside N busy-loop processes (a busy neighbour; issue #24):
# every real-server test derives its thresholds from the server's own numbers, so it must pass so too.
if [ "${LLM_TRAY_TEST_HOG:-0}" -gt 0 ]; then
  .venv/bin/python -m tests.support.load --processes "$LLM_TRAY_TEST_HOG" --limit-s 7200 &
  hog_pid=$!
  trap 'kill "$hog_pid" 2>/dev/null; wait "$hog_pid" 2>/dev/null || true' EXIT
  echo "run.sh: $LLM_TRAY_TEST_HOG busy-loop process(es) beside the suite (pid $hog_pid)"
fi
# Two pytest workers (LLM_TRAY_TEST_WORKERS=0: one process): most real-server tests wait on a
# one-thread llama-server, so two run at once on two cores. Each test file runs whole on one worker
# (its module- and session-scoped fixtures start once); tests marked `alone` (a quiet-machine
# measurement) run afterwards, by themselves. "No tests collected" (5) in either part is no failure.
workers="${LLM_TRAY_TEST_WORKERS:-2}"
status=0
.venv/bin/python -m pytest -n "$workers" --dist loadfile -m "not alone" "$@" || status=$?
[ "$status" -eq 5 ] && status=0
alone=0
.venv/bin/python -m pytest -m alone "$@" || alone=$?
[ "$alone" -eq 5 ] && alone=0
[ "$status" -ne 0 ] && exit "$status"
exit "$alone"
