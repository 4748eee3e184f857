#!/usr/bin/python3
"""What bounds APA on the spike with pods' 5 s cold starts (`spike-pod`; issues #5, 21): APA as
it ships (the 1 s fast path between 5 s cycles), on DESIGN.md §4's limits alone (a decision
every 5 s, at most x2 a decision: --apa-no-fast-path) and with each lifted, behind the scenario's
gateway queue (5 s deadline) and behind one that sheds at the SLO (100 ms), against HPA behind
the same queue, and the offline bound at HPA's replica-seconds (`--bound`: the fewest misses any
schedule can have at that cost, for the same arrivals). Prints a markdown table with HPA's
misses over each (the issue's target for APA: 5x at no more replica-seconds).

    /usr/bin/python3 bench/sim/spike_limits.py [--seed 1]
"""
import argparse
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("FLOTILLA_BIN", os.path.join(REPO, "build", "release", "flotilla"))

APA_VARIANTS = [
    ("apa (fast path, as shipped)", []),
    ("apa, DESIGN.md §4 (5 s, x2)", ["--apa-no-fast-path"]),
    ("apa, 1 s decisions, x2", ["--apa-no-fast-path", "--apa-period-ms", "1000"]),
    ("apa, 5 s decisions, no cap (x100)", ["--apa-no-fast-path", "--apa-max-up-factor", "100"]),
    ("apa, 1 s decisions, no cap", ["--apa-no-fast-path", "--apa-period-ms", "1000",
                                    "--apa-max-up-factor", "100"]),
]
QUEUES = [("5 s (scenario)", "5"), ("100 ms (the SLO)", "0.1")]


def sim(seed, queue, *args):
    out = subprocess.run([BIN, "sim", "spike-pod", "--seed", str(seed), "--queue-timeout-s", queue,
                          "-o", "json", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print("| queue deadline | policy | over SLO % | rejected % | replica-seconds "
          "| HPA's over SLO / this |")
    print("|---|---|---|---|---|---|")
    for queue_label, queue in QUEUES:
        hpa = sim(args.seed, queue, "--policy", "hpa", "--bound")
        print(f"| {queue_label} | hpa | {hpa['over_slo_pct']:.2f} | {hpa['rejected_pct']:.2f} "
              f"| {hpa['replica_seconds']:.0f} | 1.00 |")
        bound = hpa["bound_bad_pct_at_cost"]
        print(f"| {queue_label} | offline bound at HPA's replica-seconds | {bound:.2f} | - "
              f"| {hpa['replica_seconds']:.0f} | - |")
        for label, flags in APA_VARIANTS:
            apa = sim(args.seed, queue, "--policy", "apa", *flags)
            ratio = hpa["over_slo_pct"] / max(apa["over_slo_pct"], 1e-9)
            more = " (more than HPA's)" if apa["replica_seconds"] > hpa["replica_seconds"] else ""
            print(f"| {queue_label} | {label} | {apa['over_slo_pct']:.2f} "
                  f"| {apa['rejected_pct']:.2f} | {apa['replica_seconds']:.0f}{more} "
                  f"| **{ratio:.2f}x** |")


if __name__ == "__main__":
    main()
