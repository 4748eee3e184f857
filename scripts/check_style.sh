#!/usr/bin/env bash
# House-style checks that need no build (STYLE.md §1, §8):
#  - clang-format 14 finds nothing to change;
#  - a module includes only other modules' public headers: src/<module>/<module>.h, and
#    src/<module>/<module>_<part>.h where one module offers a lighter part of its contract
#    (gateway/gateway_policy.h: the balancer and admission queue without Boost); its tests
#    (tests/<module>/) and micro-benchmarks (bench/<module>/) may include its private ones.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t sources < <(git ls-files 'src/*.cc' 'src/*.h' 'tests/*.cc' 'tests/*.h' 'bench/*.cc' 'bench/*.h')
clang-format --dry-run --Werror "${sources[@]}"

status=0
for file in "${sources[@]}"; do
  case "$file" in
    src/*|tests/*|bench/*) own=$(echo "$file" | cut -d/ -f2) ;;
    *) own="" ;;
  esac
  while IFS= read -r header; do
    module=${header%%/*}
    if [ "$module" != "$own" ] && [ "$header" != "$module/$module.h" ] &&
      [[ "$header" != "$module/${module}_"*.h ]] && [ -d "src/$module" ]; then
      echo "$file includes $header, a private header of module '$module'" >&2
      status=1
    fi
  done < <(sed -n 's/^#include "\([a-z_]*\/[a-z_.]*\)".*/\1/p' "$file")
done
exit $status
