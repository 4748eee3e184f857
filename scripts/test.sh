#!/usr/bin/env bash
# From a fresh Debian 12 machine to all tests passing: installs, builds (release), and runs
# the unit and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release
ctest --preset release -j"$(nproc)"
