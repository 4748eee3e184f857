#!/usr/bin/env bash
# A virtual environment with the official `openai` Python client, pinned, for the gateway test
# that checks the SDK reads the gateway's OpenAI-shaped errors (issue 18 item 14). Made once at
# $1 (default build/openai-venv) and reused; prints the venv's python. Exits non-zero, with the
# reason on stderr, when it cannot be made (no network to PyPI, no venv module): the test then
# skips.
set -euo pipefail
OPENAI_VERSION=3.57.0
VENV=${1:-build/openai-venv}
if ! "$VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" \
    2>/dev/null; then
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --timeout 20 \
    "openai==$OPENAI_VERSION" >&2
fi
echo "$VENV/bin/python"
