#!/usr/bin/env bash
# A virtual environment with the clients users run against Flotilla that Debian does not
# package, pinned: the official `openai` Python client (the gateway's OpenAI-shaped errors,
# issue 18 item 14), `opentelemetry-proto`, the OpenTelemetry protobuf definitions the trace
# tests' OTLP receiver decodes spans with (issue 23 item 2), and `tritonclient[http,grpc]`, the
# client Triton and KServe users call OIP with over REST and gRPC (issue 24 items 3 and 4).
# protobuf: tritonclient[grpc] takes < 7, opentelemetry-proto >= 5. Made once at $1 (default
# build/clients-venv) and reused; prints the venv's python. Exits non-zero, with the reason on
# stderr, when it cannot be made (no network to PyPI, no venv module): the tests then skip.
set -euo pipefail
OPENAI_VERSION=3.57.0
OTEL_PROTO_VERSION=1.45.2
PROTOBUF_VERSION=6.33.6
GRPCIO_VERSION=1.85.4
TRITONCLIENT_VERSION=2.73.0
VENV=${1:-build/clients-venv}
exec bash "$(dirname "$0")/pinned_venv.sh" "$VENV" \
  "openai==$OPENAI_VERSION" "opentelemetry-proto==$OTEL_PROTO_VERSION" \
  "protobuf==$PROTOBUF_VERSION" "grpcio==$GRPCIO_VERSION" \
  "tritonclient[http,grpc]==$TRITONCLIENT_VERSION"
