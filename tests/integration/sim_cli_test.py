"""`flotilla sim` as users run it (issue 21): the offline bound in its JSON output, the frontier
knob, the replica-model overrides, and the clear refusals of bad flags.

    FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 -m unittest -v tests/integration/sim_cli_test.py
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (tests/integration/harness.py: the generic helpers)


def setUpModule():
    harness.require_binary("sim_cli_test.py")


def sim(*args):
    return subprocess.run([harness.FLOTILLA_BIN, "sim", *args], capture_output=True, text=True,
                          timeout=120)


def sim_json(*args):
    done = sim(*args, "-o", "json")
    if done.returncode != 0:
        raise AssertionError(f"flotilla sim {' '.join(args)}: {done.stderr}")
    return json.loads(done.stdout)


class SimCliTest(unittest.TestCase):
    def test_the_bound_lies_below_the_run_and_falls_as_cost_rises(self):
        for policy in ("apa", "hpa", "kpa"):
            out = sim_json("zero-pod", "--policy", policy, "--bound")
            frontier = out["bound"]
            self.assertGreater(len(frontier), 1)
            costs = [cost for cost, _ in frontier]
            bads = [bad for _, bad in frontier]
            self.assertEqual(costs, sorted(costs))
            self.assertEqual(bads, sorted(bads, reverse=True))
            self.assertLessEqual(out["bound_bad_pct_at_cost"], out["over_slo_pct"] + 1e-9, policy)

    def test_the_knob_and_the_model_overrides_reach_the_run(self):
        lean = sim_json("steady", "--policy", "static", "--utilization", "1")
        padded = sim_json("steady", "--policy", "static", "--utilization", "0.5")
        self.assertGreater(padded["replica_seconds"], 1.3 * lean["replica_seconds"])
        # A model slower than its SLO misses every request, and the bound says so (the run's
        # figure leaves out the requests still running when it ends: neither good nor bad).
        slow = sim_json("steady", "--service-ms", "200", "--slo-ms", "100", "--bound")
        self.assertGreater(slow["over_slo_pct"], 99.9)
        self.assertEqual(slow["bound_bad_pct_at_cost"], 100)

    def test_without_the_fast_path_a_spike_misses_more(self):
        fast = sim_json("spike-pod")
        slow = sim_json("spike-pod", "--apa-no-fast-path")
        self.assertLess(fast["over_slo_pct"], slow["over_slo_pct"])

    def test_bad_flags_are_refused_with_a_reason(self):
        with tempfile.TemporaryDirectory() as workdir:
            missing = os.path.join(workdir, "missing.csv")
            cases = [
                (["nope"], "unknown scenario"),
                (["zero", "--policy", "oracle"], "--policy"),
                (["zero", "--utilization", "0"], "--utilization"),
                (["zero", "--service-sigma", "-1"], "--service-sigma"),
                (["zero", "--min-replicas", "-2"], "--min-replicas"),
                (["--trace", missing], "cannot read trace"),
            ]
            for args, reason in cases:
                done = sim(*args)
                self.assertNotEqual(done.returncode, 0, args)
                self.assertIn(reason, done.stderr + done.stdout, args)
                self.assertFalse(done.stdout.strip().startswith("{"), args)  # no summary


if __name__ == "__main__":
    unittest.main()
