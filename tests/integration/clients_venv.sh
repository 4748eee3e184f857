#!/usr/bin/env bash
# A virtual environment with the clients users run against Flotilla that Debian does not
# package, pinned: the official `openai` Python client (the gateway's OpenAI-shaped errors,
# issue 18 item 14) and `opentelemetry-proto`, the OpenTelemetry protobuf definitions the trace
# tests' OTLP receiver decodes spans with (issue 23 item 2). Made once at $1 (default
# build/clients-venv) and reused; prints the venv's python. Exits non-zero, with the reason on
# stderr, when it cannot be made (no network to PyPI, no venv module): the tests then skip.
set -euo pipefail
OPENAI_VERSION=3.57.0
OTEL_PROTO_VERSION=1.45.2
PROTOBUF_VERSION=7.36.2
VENV=${1:-build/clients-venv}
if ! "$VENV/bin/python" - "$OPENAI_VERSION" "$OTEL_PROTO_VERSION" <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
sys.exit(m.version("openai") != sys.argv[1] or m.version("opentelemetry-proto") != sys.argv[2])
PY
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --timeout 20 \
    "openai==$OPENAI_VERSION" "opentelemetry-proto==$OTEL_PROTO_VERSION" \
    "protobuf==$PROTOBUF_VERSION" >&2
fi
echo "$VENV/bin/python"
