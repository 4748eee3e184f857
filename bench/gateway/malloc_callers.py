#!/usr/bin/python3
"""Groups `perf script -F ip,sym` call stacks of malloc by their first two flotilla frames.

Reads the stacks on stdin; the argument is the allocations per request, by which each group's
share is scaled. Used by heap_allocs.sh (ATTRIBUTE=1).
"""
import collections
import re
import sys


def caller(frames):
    ours = [re.sub(r"<.*", "", f)[:80] for f in frames if "flotilla::" in f or "copy_headers" in f]
    allocator = re.sub(r"[(<].*", "", frames[2])[:60] if len(frames) > 2 else ""
    return " <- ".join(ours[:2]) or "(outside flotilla)", allocator


def main():
    per_request = float(sys.argv[1])
    groups = collections.Counter()
    for stack in sys.stdin.read().split("\n\n"):
        frames = [line.strip().split(" ", 1)[-1] for line in stack.strip().splitlines() if line.strip()]
        if frames:
            groups[caller(frames)] += 1
    total = sum(groups.values()) or 1
    for (ours, allocator), count in groups.most_common(15):
        share = count / total * per_request
        if share >= 0.05:
            print(f"{share:5.2f}/request  {ours}  [{allocator}]")


if __name__ == "__main__":
    main()
