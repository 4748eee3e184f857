#!/usr/bin/env bash
# A virtual environment with Seldon's MLServer and its scikit-learn runtime, pinned, for the
# external runtime's test (external_test.py MlServer): a third-party model server as users run
# it. Its own venv, apart from clients_venv.sh's, because MLServer pins its own protobuf and
# gRPC. Made once at $1 (default build/mlserver-venv) and reused; prints the venv's python.
# Exits non-zero, with the reason on stderr, when it cannot be made (no network to PyPI): the
# test then skips.
set -euo pipefail
MLSERVER_VERSION=1.7.1
SKLEARN_VERSION=1.9.1
# uvloop 0.22 and later raise in asyncio.get_event_loop() where MLServer 1.7's inference
# workers call it at start ("There is no current event loop"): every worker dies and no model
# loads. 0.21 is the last release that MLServer 1.7 works with.
UVLOOP_VERSION=0.21.0
VENV=${1:-build/mlserver-venv}
exec bash "$(dirname "$0")/pinned_venv.sh" "$VENV" \
  "mlserver==$MLSERVER_VERSION" "mlserver-sklearn==$MLSERVER_VERSION" \
  "scikit-learn==$SKLEARN_VERSION" "uvloop==$UVLOOP_VERSION"
