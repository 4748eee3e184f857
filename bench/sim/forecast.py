#!/usr/bin/python3
"""APA with and without its seasonal forecast (issue 21 item 5), on loads that repeat by day.

Each case runs `flotilla sim --policy apa` twice on the same arrivals (a seed), with the forecast
(the default) and with `--apa-no-forecast`, for each seed; a row gives the medians over the
seeds of bad requests (over the SLO + rejected + failed, % of all) and replica-seconds, and the
ratios forecast / reactive. Cases:

- days, days-pod: five days, each compressed to 24 minutes (a minute a second, the forecast's
  buckets with it), 500 -> 5K req/s and back, and a batch job at 02:00 adding 6K req/s for 30 s;
  replicas that start as an XGBoost replica does from the warm pool (25 ms), or as pods (5 s).
- azure x3, azure-pod x3: the Azure LLM conversation trace (58 minutes) at 100x as
  bench/sim/frontier.py runs it, played three times in a row, each play a day (`--repeat 3`:
  the forecast learns the trace's own shape); and the same with pods' 5 s starts.
- alibaba: the Alibaba GenAI trace as frontier.py runs it: 23 real days (the forecast's own
  day of 86,400 s), image generation of 23 s a request, a 60 s SLO, scale to zero.

    /usr/bin/python3 bench/sim/forecast.py [--seeds 1,2,3]

About 2 minutes on 2 cores.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frontier import SCENARIOS, sim  # noqa: E402  (the traces' settings and the runner)

CASES = {
    "days": ["days"],
    "days-pod": ["days-pod"],
    "azure x3": [*SCENARIOS["azure-trace"], "--repeat", "3"],
    "azure-pod x3": [*SCENARIOS["azure-trace"], "--repeat", "3", "--cold-start-s", "5"],
    "alibaba": SCENARIOS["alibaba-trace"],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print("| case | seeds | reactive bad % | forecast bad % | bad ratio | reactive replica-s "
          "| forecast replica-s | cost ratio | scale events (reactive / forecast) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, case in CASES.items():
        rows = {"reactive": [], "forecast": []}
        for seed in seeds:
            for mode, extra in (("reactive", ["--apa-no-forecast"]), ("forecast", [])):
                summary = sim([*case, "--policy", "apa", "--seed", str(seed), *extra])
                rows[mode].append(summary)
        med = {mode: {key: statistics.median(s[key] for s in runs)
                      for key in ("over_slo_pct", "replica_seconds", "scale_events")}
               for mode, runs in rows.items()}
        r, f = med["reactive"], med["forecast"]
        bad_ratio = f["over_slo_pct"] / r["over_slo_pct"] if r["over_slo_pct"] > 0 else float("nan")
        print(f"| {name} | {len(seeds)} | {r['over_slo_pct']:.3f} | {f['over_slo_pct']:.3f} | "
              f"{bad_ratio:.2f} | {r['replica_seconds']:.0f} | {f['replica_seconds']:.0f} | "
              f"{f['replica_seconds'] / r['replica_seconds']:.3f} | "
              f"{r['scale_events']:.0f} / {f['scale_events']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
