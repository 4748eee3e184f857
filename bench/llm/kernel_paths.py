#!/usr/bin/python3
"""Every LLM kernel path this CPU runs, side by side on the engine's matmul shapes.

Runs build/release/bench/llm_matmul_bench (one thread; every path of supported_kernels() but
the portable one, in the same run), medians of --reps repetitions, and prints per shape, weight
format and batch rows m the weight bytes read per second (what bounds decode: m = 1) and
GFLOP/s (what bounds batched decode and prefill: m = 16, 64) for each path, with each path's
ratio to AVX2's. The host's ISA flags head the output: a figure holds for this host only.

With --against OTHER_BIN (another build's llm_matmul_bench, e.g. the commit before a kernel
change) it measures a change instead: both binaries run alternately, --reps times each, and
every path's figures are printed for both with the ratio, this build's to the other's. Paths
whose code the change left alone show how far apart two builds land by noise and layout alone.

Usage: bench/llm/kernel_paths.py [--reps 3] [--min-time 0.2] [--bin build/release/bench/llm_matmul_bench]
                                 [--against OTHER_BIN] [--filter REGEX]
"""
import argparse
import json
import os
import re
import subprocess
import statistics
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORMATS = {0: "fp32", 1: "bf16", 2: "int8", 3: "fp8"}


def host_isa():
    flags = set()
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "amx_int8", "amx_bf16"]
    return model, [f for f in wanted if f in flags]


def measure(binary, filter_regex, min_time, reps):
    """(rows, cols, m, format) -> path -> [(GB/s, GFLOP/s) of each repetition]."""
    out = subprocess.run(
        [binary, f"--benchmark_filter={filter_regex}", "--benchmark_format=json",
         f"--benchmark_repetitions={reps}", f"--benchmark_min_time={min_time}"],
        check=True, capture_output=True, text=True).stdout
    # name: BM_Matmul/rows/cols/m/format/path; label: "<path> <format>"
    samples = defaultdict(lambda: defaultdict(list))
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        rows, cols, m, fmt, _ = (int(v) for v in re.findall(r"/(\d+)", b["run_name"])[:5])
        samples[(rows, cols, m, fmt)][b["label"].split()[0]].append((b["weight_GB/s"], b["GFLOP/s"]))
    return samples


def median_of(values, unit):
    """The figure that bounds this m: GB/s of weights at one row, GFLOP/s above."""
    return statistics.median(v[unit] for v in values)


def by_shape(key):
    rows, _, m, fmt = key
    return (fmt, rows, m)


def print_paths(samples, reps):
    paths = []
    for by_path in samples.values():
        paths += [p for p in by_path if p not in paths]
    if "avx2" not in paths:
        sys.exit("no AVX2 path on this CPU: nothing to compare")
    print(f"medians of {reps}; GB/s of weights read (m = 1) or GFLOP/s (m > 1), one thread; "
          "(xN) = the path's ratio to avx2")
    print(f"{'shape':>11} {'format':>6} {'m':>3} " + " ".join(f"{p:>22}" for p in paths))
    for (rows, cols, m, fmt), by_path in sorted(samples.items(), key=lambda kv: by_shape(kv[0])):
        unit = 0 if m == 1 else 1
        base = median_of(by_path["avx2"], unit)
        cells = []
        for p in paths:
            value = median_of(by_path[p], unit)
            cells.append(f"{value:9.1f} {'GB/s ' if unit == 0 else 'GF/s '}(x{value / base:4.2f})")
        print(f"{rows:>5}x{cols:<5} {FORMATS[fmt]:>6} {m:>3} " + " ".join(f"{c:>22}" for c in cells))


def print_change(ours, theirs, reps):
    print(f"medians of {reps} alternating runs of each build; GB/s of weights read (m = 1) or "
          "GFLOP/s (m > 1), one thread; ratio = this build / the other")
    print(f"{'path':>20} {'shape':>11} {'format':>6} {'m':>3} {'other':>8} {'this':>8} {'ratio':>6}")
    for key in sorted(ours, key=by_shape):
        rows, cols, m, fmt = key
        unit = 0 if m == 1 else 1
        for path, values in ours[key].items():
            if path not in theirs.get(key, {}):
                continue
            new, old = median_of(values, unit), median_of(theirs[key][path], unit)
            print(f"{path:>20} {rows:>5}x{cols:<5} {FORMATS[fmt]:>6} {m:>3} {old:8.1f} {new:8.1f} "
                  f"{new / old:6.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--bin", default=os.path.join(ROOT, "build/release/bench/llm_matmul_bench"))
    parser.add_argument("--against", help="another build's llm_matmul_bench: measure the change")
    parser.add_argument("--filter", default="BM_Matmul", help="benchmark name regex")
    args = parser.parse_args()
    model, isa = host_isa()
    print(f"host: {model}; {os.cpu_count()} cpus; ISA: {' '.join(isa)}")
    if not args.against:
        print_paths(measure(args.bin, args.filter, args.min_time, args.reps), args.reps)
        return
    # Alternating, one repetition at a time: a slow spell of the machine falls on both builds.
    ours, theirs = defaultdict(lambda: defaultdict(list)), defaultdict(lambda: defaultdict(list))
    for _ in range(args.reps):
        for binary, into in ((args.against, theirs), (args.bin, ours)):
            for key, by_path in measure(binary, args.filter, args.min_time, 1).items():
                for path, values in by_path.items():
                    into[key][path] += values
    print_change(ours, theirs, args.reps)


if __name__ == "__main__":
    main()
