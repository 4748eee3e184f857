#!/usr/bin/env bash
# Validates deploy/kubernetes without a cluster (ctest `manifests`): renders it with
# `kubectl kustomize`, then scripts/check_manifests.py dry-runs every object with
# `kubectl create --dry-run=client` and checks the CRD's schema against src/control/spec.cc and
# the objects against each other. Needs kubectl (Debian's kubernetes-client 1.20 or newer;
# scripts/setup.sh installs it) and python3-yaml. Usage: scripts/check_manifests.sh [KUBECTL]
set -euo pipefail
cd "$(dirname "$0")/.."
kubectl="${1:-${KUBECTL:-kubectl}}"
if ! command -v "$kubectl" >/dev/null 2>&1; then
  echo "check_manifests: no kubectl on PATH (scripts/setup.sh installs kubernetes-client)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$kubectl" kustomize deploy/kubernetes >"$work/rendered.yaml"
/usr/bin/python3 scripts/check_manifests.py --kubectl "$kubectl" --rendered "$work/rendered.yaml" \
  --sample deploy/kubernetes/sample-servingendpoint.yaml --work "$work"
