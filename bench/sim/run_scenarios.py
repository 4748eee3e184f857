#!/usr/bin/python3
"""Every simulator scenario (and the Azure trace) under every policy, in one run (issue #5).

Prints the markdown table kept in bench/RESULTS.md and, with --plots DIR, writes one PNG per
scenario: offered load, ready replicas and p99 latency per second, one line per policy.

    /usr/bin/python3 bench/sim/run_scenarios.py [--plots bench/sim/plots] [--seed 1]
"""
import argparse
import csv
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("FLOTILLA_BIN", os.path.join(REPO, "build", "release", "flotilla"))
TRACE = os.path.join(os.path.dirname(REPO), "shared", "traces", "AzureLLMInferenceTrace_conv.csv")
SCENARIOS = ["spike", "diurnal", "ramp", "zero", "unknown-capacity", "hetero", "batched",
             "crashes"]
POLICIES = ["apa", "hpa", "kpa", "kpa-default", "ray", "ray-auto", "static"]


def run(args, csv_path):
    out = subprocess.run([BIN, "sim", *args, "-o", "json", "--csv", csv_path],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def read_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def plot(name, series, directory):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    first = next(iter(series.values()))
    axes[0].plot([int(r["second"]) for r in first], [int(r["arrivals"]) for r in first], "k")
    axes[0].set_ylabel("offered req/s")
    for policy, rows in series.items():
        t = [int(r["second"]) for r in rows]
        axes[1].plot(t, [int(r["ready"]) for r in rows], label=policy)
        axes[2].plot(t, [max(float(r["p99_ms"]), 1) for r in rows], label=policy)
    axes[1].set_ylabel("ready replicas")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("p99 ms (per second)")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("simulated seconds")
    axes[1].legend(ncol=5, fontsize=8)
    fig.suptitle(f"flotilla sim {name}")
    fig.tight_layout()
    path = os.path.join(directory, f"{name}.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plots", help="write one PNG per scenario into this directory")
    parser.add_argument("--seed", default="1")
    args = parser.parse_args()
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
    print("| scenario | policy | over SLO % | rejected % | failed % | replica-seconds | "
          "scale events | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    runs = [(s, [s]) for s in SCENARIOS]
    if os.path.exists(TRACE):
        runs.append(("azure-trace", ["--trace", TRACE, "--rate-scale", "100"]))
    with tempfile.TemporaryDirectory() as tmp:
        for name, scenario_args in runs:
            series = {}
            for policy in POLICIES:
                path = os.path.join(tmp, f"{name}-{policy}.csv")
                d = run([*scenario_args, "--policy", policy, "--seed", args.seed], path)
                learned = (f" (learned target {d['final_target_concurrency']:.0f})"
                           if policy == "apa" else "")
                print(f"| {name} | {policy}{learned} | {d['over_slo_pct']:.3f} | "
                      f"{d['rejected_pct']:.3f} | {d['failed_pct']:.3f} | "
                      f"{d['replica_seconds']:.0f} | "
                      f"{d['scale_events']} | {d['p99_ms']:.1f} |", flush=True)
                series[policy] = read_rows(path)
            if args.plots:
                plot(name, series, args.plots)


if __name__ == "__main__":
    main()
