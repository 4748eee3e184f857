#!/usr/bin/env bash
# The one way the test venvs are made (clients_venv.sh, mlserver_venv.sh, mlflow_venv.sh):
# pinned_venv.sh VENV NAME==VERSION... makes a virtual environment at VENV holding exactly
# those pins, or reuses the one there when every pin is already installed at its version;
# prints the venv's python. Exits non-zero, with the reason on stderr, when it cannot be made
# (no network to PyPI, no venv module): the tests then skip.
set -euo pipefail
VENV=$1
shift
if ! "$VENV/bin/python" - "$@" <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    if m.version(name.split("[")[0]) != version:  # "tritonclient[http]": the distribution's
        sys.exit(1)
PY
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --timeout 20 "$@" >&2
fi
echo "$VENV/bin/python"
