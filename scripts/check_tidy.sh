#!/usr/bin/env bash
# clang-tidy (the checks in .clang-tidy) over the src/ .cc files changed against a base ref,
# using build/release/compile_commands.json. Usage: scripts/check_tidy.sh [BASE]; BASE
# defaults to origin/main, or HEAD~1 (the last commit's changes, as in a clean CI clone) when
# there is no origin/main. Exits non-zero on any finding. Needs: cmake --preset release.
set -euo pipefail
cd "$(dirname "$0")/.."

db=build/release
if [[ ! -f "$db/compile_commands.json" ]]; then
  echo "check_tidy: $db/compile_commands.json missing; run: cmake --preset release" >&2
  exit 2
fi
base="${1:-}"
if [[ -z "$base" ]]; then
  if git rev-parse -q --verify origin/main >/dev/null; then
    base="$(git merge-base HEAD origin/main)"
  else
    base=HEAD~1
  fi
fi
mapfile -t files < <(git diff --name-only --diff-filter=d "$base" -- 'src/*.cc' |
  grep -v '^src/llm/kernels_avx2.cc$' || true)
if [[ ${#files[@]} -eq 0 ]]; then
  echo "check_tidy: no src/ .cc files changed against $base"
  exit 0
fi
echo "check_tidy: ${#files[@]} files changed against $base"
# -P: one clang-tidy per file in parallel; xargs exits 123 when any of them found something.
if ! printf '%s\0' "${files[@]}" |
  xargs -0 -P"$(nproc)" -n1 clang-tidy -p "$db" --quiet; then
  echo "check_tidy: FAILED (see the findings above)" >&2
  exit 1
fi
echo "check_tidy: clean"
