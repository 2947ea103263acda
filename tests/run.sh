#!/usr/bin/env bash
# The whole test suite, from a fresh clone: provision what the tests need, then run pytest.
# Extra arguments go to pytest (e.g. tests/run.sh tests/unit -q).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/provision.sh
export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}"
.venv/bin/python -m ruff check trayapp tests bench resources
.venv/bin/python -m mypy trayapp
exec .venv/bin/python -m pytest "$@"
