#!/usr/bin/env bash
# Clang's thread-safety analysis over every src/ translation unit, syntax only (no second
# build): each file is parsed with the flags CMake recorded in build/release's
# compile_commands.json plus -Wthread-safety -Werror=thread-safety. Exits non-zero on any
# warning. Needs a configured release build (cmake --preset release). Arguments, when given,
# limit it to those src/ files.
set -euo pipefail
cd "$(dirname "$0")/.."

db=build/release/compile_commands.json
if [[ ! -f "$db" ]]; then
  echo "check_thread_safety: $db missing; run: cmake --preset release" >&2
  exit 2
fi

# One line per src/ TU: the recorded command, with gcc swapped for clang++, the output and
# optimisation flags dropped and -fsyntax-only plus the analysis added.
python3 - "$db" "$@" >"${TMPDIR:-/tmp}/flotilla_tsa_cmds.$$" <<'PY'
import json, os, shlex, sys
root = os.getcwd()
only = set(sys.argv[2:])  # optional: just these src/ files
for entry in json.load(open(sys.argv[1])):
    src = os.path.relpath(entry["file"], root)
    if not src.startswith("src/") or not src.endswith(".cc"):
        continue
    if only and src not in only:
        continue
    # No locks, and clang 14 rejects its gcc-only __builtin_cpu_supports("f16c").
    if src == "src/llm/kernels_avx2.cc":
        continue
    args = entry.get("arguments") or shlex.split(entry["command"])
    out, skip = ["clang++"], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-O") or a.startswith("-g"):
            continue
        out.append(a)
    out += ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", "-Wno-unknown-warning-option"]
    print(shlex.quote(entry["directory"]) + "\t" + shlex.join(out))
PY
cmds="${TMPDIR:-/tmp}/flotilla_tsa_cmds.$$"
trap 'rm -f "$cmds"' EXIT

count=$(wc -l <"$cmds")
echo "check_thread_safety: $count translation units"
# xargs exits 123 when any command failed; clang prints the findings.
if ! tr '\n' '\0' <"$cmds" |
  xargs -0 -P"$(nproc)" -n1 bash -c 'cd "${1%%$'"'"'\t'"'"'*}" && eval "${1#*$'"'"'\t'"'"'}"' _; then
  echo "check_thread_safety: FAILED (see the warnings above)" >&2
  exit 1
fi
echo "check_thread_safety: clean"
