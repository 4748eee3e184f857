#!/usr/bin/env bash
# Installs every Debian package Flotilla needs to build, test, benchmark and run its demo.
# Idempotent: packages already present are skipped, and nothing runs when all are there.
# Works as root or through sudo.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  # libraries
  libboost-dev libsimdjson-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
  libyaml-cpp-dev libxgboost-dev libssl-dev libsqlite3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev zlib1g-dev
  # inference tables: gzip written by Intel's ISA-L igzip (12x zlib's speed at level 1)
  libisal-dev
  # the Open Inference Protocol over gRPC (src/grpc)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # Chart.js, embedded in the binary for the dashboard
  libjs-chart.js
  # tests, fixtures and benchmarks
  python3 python3-venv python3-xgboost python3-sklearn python3-numpy python3-aiohttp python3-matplotlib python3-regex
  python3-yaml
  prometheus wrk curl
  # headless browser for the dashboard's test
  chromium
  # peer proxies, load generators and callgrind for bench/gateway (../shared/bench/peers)
  nginx haproxy hey valgrind
  # h2load: one load generator for REST and gRPC (bench/grpc)
  nghttp2-client
)
# kubectl for scripts/check_manifests.sh (ctest `manifests`). Debian's kubernetes-client and other
# packagings of kubectl (the Google Cloud SDK's `kubectl` package) all ship /usr/bin/kubectl, so
# dpkg refuses to install a second one: any kubectl already on PATH serves (1.20 or newer).
if ! command -v kubectl >/dev/null 2>&1; then
  PACKAGES+=(kubernetes-client)
fi

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "setup: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
# prometheus (for promtool), nginx and haproxy are installed as tools: their services must not
# start here. A policy-rc.d that refuses every start keeps them down during the install.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  own_policy=1
fi
status=0
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || status=$?
if [ "$own_policy" -eq 1 ]; then
  $SUDO rm -f "$policy"
fi
exit "$status"
