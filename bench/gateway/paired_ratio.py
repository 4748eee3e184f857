#!/usr/bin/python3
"""Paired throughput ratios from run-peers.sh's raw results (issue #3).

run-peers.sh interleaves its targets and rotates their order each rep, so the runs of one rep
share the machine's phase; the VM's speed drifts by more than the proxies differ over minutes.
This divides, within each rep and connection count, flotilla's req/s by the best peer's, and
its CPU-µs per request by the leanest peer's, and prints each rep's ratios and their medians:
a steadier figure than the ratio of medians that run-peers.sh prints.

    /usr/bin/python3 bench/gateway/paired_ratio.py [/tmp/run-peers-last.tsv] [--target flotilla]
"""
import argparse
import collections
import csv
import statistics


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tsv", nargs="?", default="/tmp/run-peers-last.tsv")
    parser.add_argument("--target", default="flotilla")
    args = parser.parse_args()
    with open(args.tsv) as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["mode"] == "throughput"]
    runs = collections.defaultdict(dict)  # (load, rep) -> target -> row
    for row in rows:
        runs[(row["load"], row["rep"])][row["target"]] = row
    print("| conns | reps | req/s vs best peer, per rep | median | CPU-µs/req vs leanest, median |")
    print("|---|---|---|---|---|")
    for load in sorted({load for load, _ in runs}, key=lambda l: int(l.split("=")[1])):
        speed, cost = [], []
        for (run_load, _), targets in sorted(runs.items()):
            peers = [r for name, r in targets.items() if name not in (args.target, "direct")]
            if run_load != load or args.target not in targets or not peers:
                continue
            ours = targets[args.target]
            speed.append(float(ours["rps"]) / max(float(p["rps"]) for p in peers))
            cost.append(float(ours["proxy_us_per_req"]) /
                        min(float(p["proxy_us_per_req"]) for p in peers))
        if speed:
            print(f"| {load.split('=')[1]} | {len(speed)} | "
                  f"{' '.join(f'{x:.2f}' for x in speed)} | **{statistics.median(speed):.2f}x** | "
                  f"{statistics.median(cost):.2f}x |")


if __name__ == "__main__":
    main()
