#!/usr/bin/python3
"""Every LLM kernel path this CPU runs, side by side on the engine's matmul shapes.

Runs build/release/bench/llm_matmul_bench (one thread; every path of supported_kernels() but
the portable one, in the same run), medians of --reps repetitions, and prints per shape, weight
format and batch rows m the weight bytes read per second (what bounds decode: m = 1) and
GFLOP/s (what bounds batched decode and prefill: m = 16, 64) for each path, with each path's
ratio to AVX2's. The host's ISA flags head the output: a figure holds for this host only.

Usage: bench/llm/kernel_paths.py [--reps 3] [--min-time 0.2] [--bin build/release/bench/llm_matmul_bench]
"""
import argparse
import json
import os
import re
import subprocess
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--bin", default=os.path.join(ROOT, "build/release/bench/llm_matmul_bench"))
    args = parser.parse_args()
    model, isa = host_isa()
    print(f"host: {model}; {os.cpu_count()} cpus; ISA: {' '.join(isa)}")
    out = subprocess.run(
        [args.bin, "--benchmark_filter=BM_Matmul", "--benchmark_format=json",
         f"--benchmark_repetitions={args.reps}", "--benchmark_report_aggregates_only=true",
         f"--benchmark_min_time={args.min_time}"],
        check=True, capture_output=True, text=True).stdout
    # name: BM_Matmul/rows/cols/m/format/path/repeats:N_median; label: "<path> <format>"
    results = defaultdict(dict)  # (rows, cols, m, format) -> path -> (GB/s, GFLOP/s)
    paths = []
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        rows, cols, m, fmt, _ = (int(v) for v in re.findall(r"/(\d+)", b["run_name"])[:5])
        path = b["label"].split()[0]
        if path not in paths:
            paths.append(path)
        results[(rows, cols, m, fmt)][path] = (b["weight_GB/s"], b["GFLOP/s"])
    if "avx2" not in paths:
        sys.exit("no AVX2 path on this CPU: nothing to compare")
    print(f"medians of {args.reps}; GB/s of weights read (m = 1) or GFLOP/s (m > 1), one thread; "
          "(xN) = the path's ratio to avx2")
    header = f"{'shape':>11} {'format':>6} {'m':>3} " + " ".join(f"{p:>22}" for p in paths)
    print(header)
    for (rows, cols, m, fmt), by_path in sorted(results.items(), key=lambda kv: (kv[0][3], kv[0][0], kv[0][2])):
        unit = 0 if m == 1 else 1
        base = by_path["avx2"][unit]
        cells = []
        for p in paths:
            value = by_path[p][unit]
            cells.append(f"{value:9.1f} {'GB/s ' if unit == 0 else 'GF/s '}(x{value / base:4.2f})")
        print(f"{rows:>5}x{cols:<5} {FORMATS[fmt]:>6} {m:>3} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
