"""What a user sees of `flotilla up` under load (issue 23): the endpoints' 1 s history
(GET /api/2.0/serving-endpoints/{name}/metrics), `flotilla top`, and the dashboard at
/dashboard/ rendered by Debian's headless Chromium.

One `flotilla up` for the module with a synthetic endpoint under bounded closed-loop load
(control_test's fixtures and load client). The dashboard test saves its screenshot to
$FLOTILLA_ARTIFACTS_DIR (the build tree under ctest) when set.
"""

import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import control_test  # noqa: E402  (flotilla up, its fixtures and the load client)
from control_test import BIN, ControlTestCase, served, spec, synthetic_label  # noqa: E402
from harness import wait_until  # noqa: E402

NAME = "observed"
CHROMIUM_DEADLINE_S = 90


def setUpModule():
    control_test.setUpModule()


def tearDownModule():
    control_test.tearDownModule()


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("no Chromium on PATH: scripts/setup.sh installs Debian's chromium")


class DashboardDom(html.parser.HTMLParser):
    """The attributes of the elements with an id, from Chromium's --dump-dom."""

    def __init__(self):
        super().__init__()
        self.by_id = {}

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if "id" in attributes:
            self.by_id[attributes["id"]] = attributes


class Observe(ControlTestCase):
    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up()
        model = control_test.synthetic_model(2)
        s = spec(NAME, served("v1", model, runtime="synthetic", concurrency={"min": 1, "max": 8}))
        cls.up.create(s)
        cls.up.wait_serving(NAME)
        cls.load = control_test.Load(cls.up, NAME, threads=3, total=10 ** 7, deadline_s=240,
                                     label=synthetic_label).start()
        cls.addClassCleanup(cls.load.stop)

    def metrics(self, window="30s", name=NAME):
        return self.up.api("GET", f"/api/2.0/serving-endpoints/{name}/metrics?window={window}")

    def wait_for_seconds(self, count, pred=lambda s: s["requests"] > 0):
        """The metrics once `count` seconds with traffic are in the last 30."""
        def enough():
            view = self.metrics().json()
            return view if sum(1 for s in view["samples"] if pred(s)) >= count else None
        return wait_until(enough, 30, interval_s=0.2, what=f"{count} seconds of metrics")

    def test_metrics_route_gives_each_second_by_code_with_latency_and_replicas(self):
        bad = self.up.gw("POST", f"/serving-endpoints/{NAME}/invocations", b"{not json",
                         headers={"Content-Type": "application/json"})
        self.assertEqual(bad.status, 400, bad)
        view = self.wait_for_seconds(3)
        view = self.wait_for_seconds(1, lambda s: "400" in s["codes"])
        self.assertEqual(view["name"], NAME)
        self.assertEqual(view["window_seconds"], 30)
        samples = view["samples"]
        stamps = [s["timestamp"] for s in samples]
        self.assertEqual(stamps, sorted(set(stamps)))
        for earlier, later in zip(stamps, stamps[1:]):
            self.assertTrue(500 <= later - earlier <= 2500, stamps)
        self.assertTrue(all(stamps[-1] - s <= 31_000 for s in stamps), stamps)
        busy = [s for s in samples if s["requests"] > 0]
        for s in busy:
            self.assertEqual(s["requests"], sum(s["codes"].values()), s)
            self.assertGreater(s["latency_p50_ms"], 0, s)
            self.assertLessEqual(s["latency_p50_ms"], s["latency_p99_ms"], s)
            self.assertGreaterEqual(s["in_flight"], 0, s)
            self.assertGreaterEqual(s["replicas"]["v1"]["ready"], 1, s)
            self.assertIn("target_concurrency", s)
        self.assertGreaterEqual(view["summary"]["codes"]["400"], 1)
        total = sum(s["requests"] for s in samples)
        self.assertAlmostEqual(view["summary"]["requests_per_second"] * len(samples), total,
                               delta=0.01)
        # The synthetic model waits 2 ms: the median is near it, never below it.
        self.assertTrue(1.5 <= view["summary"]["latency_p50_ms"] <= 50, view["summary"])

        for window in ("0", "2h", "abc", "1.5m"):
            self.assertApiError(self.metrics(window), 400, "INVALID_PARAMETER_VALUE", "window")
        self.assertApiError(self.metrics(name="nothing"), 404, "RESOURCE_DOES_NOT_EXIST")
        no_token = self.up.api("GET", f"/api/2.0/serving-endpoints/{NAME}/metrics", token=None)
        self.assertEqual(no_token.status, 401, no_token)

    def run_top(self, *args, token=None):
        argv = [BIN, "top", "--api", f"127.0.0.1:{self.up.api_port}",
                "--token", token or self.up.token, *args]
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)

    def test_top_shows_the_endpoints_as_a_table_and_as_json_lines(self):
        self.wait_for_seconds(3)
        p = self.run_top("-n", "2", "-d", "0.3", "-o", "json")
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertEqual(len(lines), 2, p.stdout)
        for line in lines:
            snapshot = json.loads(line)
            rows = {row["name"]: row for row in snapshot["endpoints"]}
            row = rows[NAME]
            self.assertGreater(row["requests_per_second"], 0, row)
            self.assertGreaterEqual(row["replicas_ready"], 1, row)
            self.assertEqual(row["state"], "READY")
            self.assertLessEqual(row["latency_p50_ms"], row["latency_p99_ms"], row)
            self.assertIn("target_concurrency", row)

        p = self.run_top("-n", "1", NAME)
        self.assertEqual(p.returncode, 0, p.stderr)
        header = next(line for line in p.stdout.splitlines() if line.startswith("NAME"))
        for column in ("REQ/S", "ERR/S", "P50 MS", "P99 MS", "IN-FLIGHT", "QUEUE", "REPLICAS",
                       "TARGET"):
            self.assertIn(column, header)
        self.assertTrue(any(line.startswith(NAME + " ") for line in p.stdout.splitlines()),
                        p.stdout)

        for args, token, needle in ((["-n", "1", "nothing"], None, "does not exist"),
                                    (["-n", "1"], "flt_wrong", "invalid token"),
                                    (["-d", "0"], None, "delay")):
            p = self.run_top(*args, token=token)
            self.assertNotEqual(p.returncode, 0, p.stdout)
            self.assertIn(needle, p.stderr)

    def test_an_inference_table_turned_on_by_an_update_restarts_no_replica(self):
        before = control_test.ready_replicas(self.up.view(NAME))
        model = control_test.synthetic_model(2)
        s = spec(NAME, served("v1", model, runtime="synthetic", concurrency={"min": 1, "max": 8}))
        s["inference_table"] = {"enabled": True, "sample_rate": 1, "max_body_bytes": 4096,
                                "retention": "1d"}
        self.up.put(NAME, s)
        self.up.wait_serving(NAME)
        self.assertEqual(control_test.ready_replicas(self.up.view(NAME)), before)

        def records():
            p = subprocess.run([BIN, "logs", NAME, "--data-dir", self.up.data_dir, "-o", "json",
                                "--since", "1m"], capture_output=True, text=True, timeout=30)
            lines = p.stdout.splitlines() if p.returncode == 0 else []
            return [json.loads(line) for line in lines] if len(lines) >= 20 else None
        taken = wait_until(records, 15, interval_s=0.2, what="records of the load")
        for record in taken[:20]:
            self.assertEqual(record["status"], 200, record)
            self.assertEqual(record["protocol"], "mlflow", record)
            self.assertEqual(json.loads(record["request"]["body"]), control_test.mlflow_body())
            self.assertIn("predictions", json.loads(record["response"]["body"]))
            self.assertIn(record["replica"], before)
        s.pop("inference_table")
        self.up.put(NAME, s)
        self.up.wait_serving(NAME)
        self.assertEqual(control_test.ready_replicas(self.up.view(NAME)), before)

    def test_dashboard_plots_the_last_seconds_and_marks_an_update(self):
        self.wait_for_seconds(3)
        # An update: its event must show on the plots' time axis.
        model = control_test.synthetic_model(2)
        self.up.put(NAME, spec(NAME, served("v1", model, runtime="synthetic",
                                            concurrency={"min": 1, "max": 12})))
        self.up.wait_serving(NAME)
        self.wait_for_seconds(2)
        url = (f"http://127.0.0.1:{self.up.api_port}/dashboard/"
               f"#token={self.up.token}&endpoint={NAME}")
        profile = tempfile.mkdtemp(prefix="chromium-", dir=control_test._tmp_root)
        flags = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                 "--virtual-time-budget=8000", "--window-size=1400,2200"]
        dom = subprocess.run(flags + ["--dump-dom", url], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=CHROMIUM_DEADLINE_S)
        self.assertEqual(dom.returncode, 0, dom.stderr[-3000:])
        parsed = DashboardDom()
        parsed.feed(dom.stdout)
        status = parsed.by_id.get("status", {})
        self.assertEqual(status.get("data-state"), "ok", f"{status}\n{dom.stdout[:3000]}")
        self.assertGreaterEqual(int(status.get("data-samples", 0)), 3, status)
        for figure in ("requests", "latency", "load", "replicas", "target"):
            attributes = parsed.by_id.get(f"figure-{figure}", {})
            self.assertGreater(int(attributes.get("data-points", 0)), 0, (figure, attributes))
            self.assertIn("updated", attributes.get("data-events", "").split(","),
                          (figure, attributes))
        self.assertNotIn(self.up.token, dom.stdout)  # taken from the fragment, kept out of the page

        out_dir = os.environ.get("FLOTILLA_ARTIFACTS_DIR") or profile
        os.makedirs(out_dir, exist_ok=True)
        shot = os.path.join(out_dir, "dashboard.png")
        taken = subprocess.run(flags + [f"--screenshot={shot}", url], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=CHROMIUM_DEADLINE_S)
        self.assertEqual(taken.returncode, 0, taken.stderr[-3000:])
        with open(shot, "rb") as f:
            png = f.read()
        self.assertTrue(png.startswith(b"\x89PNG"), shot)
        self.assertGreater(len(png), 20_000, shot)
        self.assertNoFailures(self.load, "load during the dashboard test")


if __name__ == "__main__":
    unittest.main()
