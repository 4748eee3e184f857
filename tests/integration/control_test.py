#!/usr/bin/python3
"""Black-box integration tests for `flotilla up`, the embedded mode: control plane API,
gateway and local orchestrator in one process, replicas as child processes (contract:
src/control/control.h, src/cli/up_command.cc, src/cli/client_commands.cc).

Every test class starts its own `flotilla up` on a fresh data directory, with the gateway and
the API on kernel-chosen 127.0.0.1 ports, and drives it the way a user does: the REST API under
/api/2.0 with the admin token from <data-dir>/admin.token, predictions through the gateway, and
the CLI (`flotilla deploy`, `ls`, `get`, ...). Models are trained in-process by
tests/fixtures/make_models.py into a temp dir. Two models take the same iris rows and answer
differently, which is how a test tells the versions of an endpoint apart from the outside:

  mlflow_classifier/  {"predictions": [0]}                 (class labels)
  multiclass.ubj      {"predictions": [[0.99, 0.005, ...]]} (class probabilities)

Run from the repository root, with Debian's interpreter:

    FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 -m unittest -v tests/integration/control_test.py

No test waits with a bare sleep for a condition: everything polls with a deadline. Load is a
few client threads on keep-alive connections, bounded in requests and in time. No process
outlives the suite: `flotilla up` runs in its own session, and teardown kills it and every
replica it started (seen in the API's replica lists, as its children in /proc, in the data
directory's state.db, or by a model path under the suite's temp dir).
"""

import collections
import hashlib
import http.client
import http.server
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (tests/integration/harness.py: the generic helpers)
from harness import FLOTILLA_BIN, HTTP_TIMEOUT_S, req, run_to_exit, wait_until  # noqa: E402

# Absolute, so that the CLI tests can run the binary from a directory of their own.
BIN = os.path.abspath(FLOTILLA_BIN) if FLOTILLA_BIN else ""

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MAKE_MODELS = os.path.join(REPO, "tests", "fixtures", "make_models.py")

UP_STARTUP_DEADLINE_S = 20.0   # exec to the "flotilla up: gateway ..." line
UP_STOP_DEADLINE_S = 20.0      # SIGTERM to exit: gateway drain, 1 s replica drain delay, exits
DRAIN_TIMEOUT_MS = 5000        # --drain-timeout-ms: bounds every replica stop
SERVING_DEADLINE_S = 30.0      # a spec accepted to the endpoint serving it
GONE_DEADLINE_S = 15.0         # a retired replica out of the process table
CLI_DEADLINE_S = 60.0

CLASSIFIER = "mlflow_classifier"    # iris, class labels
PROBA = "multiclass.ubj"            # iris, class probabilities
IRIS_ROW = [5.1, 3.5, 1.4, 0.2]     # setosa: class 0
IRIS_FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]

MODELS_DIR = None
_tmp_root = None
TRACKER = harness.ProcessTracker()   # every replica and standby pid any test saw


# --------------------------------------------------------------------------- fixtures

def _load_make_models():
    spec = importlib.util.spec_from_file_location("make_models", MAKE_MODELS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def setUpModule():
    global MODELS_DIR, _tmp_root
    harness.require_binary("control_test.py")
    _tmp_root = tempfile.mkdtemp(prefix="flotilla-control-test-")
    MODELS_DIR = os.path.join(_tmp_root, "models")
    _load_make_models().make_all(MODELS_DIR)


def tearDownModule():
    # Last line of defence: whatever a failed test left behind.
    if _tmp_root:
        for pid in harness.find_processes(_is_our_replica):
            TRACKER.record(pid)
        TRACKER.kill_all()
        shutil.rmtree(_tmp_root, ignore_errors=True)


def _is_replica(argv):
    return len(argv) >= 2 and "flotilla" in os.path.basename(argv[0]) and argv[1] == "replica"


def _is_our_replica(argv):
    """A `flotilla replica` serving a model under this suite's temp dir."""
    return _is_replica(argv) and any(a.startswith(_tmp_root + os.sep) for a in argv)


def record_replica(pid, start_ticks=None):
    """Remembers `pid` for teardown if it is a `flotilla replica` (and, when given, still the
    process started at `start_ticks`): never a process that took over a dead replica's pid."""
    if start_ticks is not None and harness.process_start_ticks(pid) != start_ticks:
        return
    if _is_replica(harness.process_cmdline(pid) or []):
        TRACKER.record(pid)


def fresh_dir(prefix="d"):
    return tempfile.mkdtemp(prefix=prefix + "-", dir=_tmp_root)


def model_path(rel):
    return os.path.join(MODELS_DIR, rel)


def synthetic_model(mean_ms, saturation=100000):
    """A synthetic model whose every request waits `mean_ms` (no CPU burned), longer in
    proportion past `saturation` requests in flight."""
    return harness.write_yaml(_tmp_root, f"synthetic-{mean_ms}-{saturation}.yaml",
                              f"service_time: {{dist: fixed, mean_ms: {mean_ms}}}\n"
                              f"cpu_us: 0\nsaturation: {saturation}\nseed: 1\n")


def synthetic_label(body):
    """A synthetic model's MLflow answer: one prediction per row."""
    try:
        preds = json.loads(body)["predictions"]
    except (ValueError, KeyError, TypeError):
        return None
    return "synthetic" if isinstance(preds, list) and len(preds) == 1 else None


# --------------------------------------------------------------------------- specs

def served(name, model, traffic=None, runtime=None, concurrency=None, **extra):
    """One served model; `model` is a fixture name or an absolute path."""
    entry = {"name": name,
             "model": model if os.path.isabs(model) or "://" in model else model_path(model)}
    if traffic is not None:
        entry["traffic"] = traffic
    if runtime is not None:
        entry["runtime"] = runtime
    if concurrency is not None:
        entry["concurrency"] = concurrency
    entry.update(extra)
    return entry


def spec(name, *served_models):
    return {"name": name, "served_models": list(served_models)}


def canonical(s):
    """The spec as the API shows it (`config`): every default filled in."""
    out = []
    for m in s["served_models"]:
        c = {"min": 1, "max": 64}
        c.update(m.get("concurrency", {}))
        r = {"cpus": 0, "memory_mb": 0}
        r.update(m.get("resources", {}))
        entry = {"name": m["name"], "model": m["model"], "runtime": m.get("runtime", "auto"),
                 "concurrency": c, "scale_to_zero": m.get("scale_to_zero", False),
                 "traffic": m.get("traffic", 100), "resources": r}
        if m.get("per_replica_concurrency") is not None:
            p = {"min": 1, "max": 64}
            p.update(m["per_replica_concurrency"])
            entry["per_replica_concurrency"] = p
        out.append(entry)
    return {"name": s["name"], "served_models": out}


# --------------------------------------------------------------------------- responses

label_of = harness.label_of


def mlflow_body(rows=(IRIS_ROW,)):
    return {"instances": [list(r) for r in rows]}


def oip_body(rows=(IRIS_ROW,)):
    flat = [float(x) for r in rows for x in r]
    return {"inputs": [{"name": "x", "shape": [len(rows), len(rows[0])], "datatype": "FP32",
                        "data": flat}]}


def bearer(token):
    return {"Authorization": f"Bearer {token}"} if token else {}


# --------------------------------------------------------------------------- flotilla up

_FIRST_LINE_RE = re.compile(
    r"^flotilla up: gateway http://127\.0\.0\.1:(\d+), grpc 127\.0\.0\.1:(\d+), "
    r"api http://127\.0\.0\.1:(\d+), data dir (.+)$")
_TOKEN_LINE_RE = re.compile(r"^admin token \(shown once; also in (.+)/admin\.token\): (flt_\S+)$")
_DEFAULT = object()


class Up:
    """One `flotilla up` process (its own session), its two ports, its admin token, and the
    replica processes it was seen to run."""

    def __init__(self, data_dir, *flags):
        self.data_dir = data_dir
        self.argv = [BIN, "up", "--data-dir", data_dir,
                     "--gateway-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0",
                     "--grpc-addr", "127.0.0.1:0", "--gateway-workers", "2", "--drain-timeout-ms", str(DRAIN_TIMEOUT_MS),
                     *flags]
        self._stderr = tempfile.NamedTemporaryFile(dir=_tmp_root, prefix="up-stderr-",
                                                   delete=False)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._stderr,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.start_ticks = harness.process_start_ticks(self.pid)
        self.returncode = None
        self.stdout_lines = []
        self._lines_lock = threading.Lock()
        try:
            first, rest = self._read_first_line()
            m = _FIRST_LINE_RE.match(first)
            if not m:
                raise AssertionError(f"unexpected first line of flotilla up: {first!r}\n"
                                     f"stderr:\n{self.stderr()}")
            self.gateway_port, self.grpc_port = int(m.group(1)), int(m.group(2))
            self.api_port = int(m.group(3))
            self.reported_data_dir = m.group(4)
            self.stdout_lines.append(first)
        except BaseException:
            self.kill9()
            raise
        self._partial = rest
        threading.Thread(target=self._drain_stdout, daemon=True).start()
        with open(os.path.join(data_dir, "admin.token")) as f:
            self.token = f.read().strip()

    # ---- process

    def _read_first_line(self):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + UP_STARTUP_DEADLINE_S
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"flotilla up printed no address line within "
                                     f"{UP_STARTUP_DEADLINE_S}s; stdout {buf!r}\n"
                                     f"stderr:\n{self.stderr()}")
            r, _, _ = select.select([fd], [], [], min(left, 0.2))
            if r:
                chunk = os.read(fd, 4096)
                if not chunk:
                    rc = self.proc.wait(timeout=5)
                    raise AssertionError(f"flotilla up exited (rc={rc}) before its address "
                                         f"line; stdout {buf!r}\nstderr:\n{self.stderr()}")
                buf += chunk
        line, rest = buf.split(b"\n", 1)
        return line.decode("utf-8", "replace"), rest

    def _drain_stdout(self):
        buf = self._partial
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                with self._lines_lock:
                    self.stdout_lines.append(line.decode("utf-8", "replace"))
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk

    def lines(self):
        with self._lines_lock:
            return list(self.stdout_lines)

    def stderr(self):
        try:
            with open(self._stderr.name, "rb") as f:
                data = f.read()
        except OSError:
            return "<stderr unavailable>"
        text = data.decode("utf-8", "replace")
        return text if len(text) <= 6000 else "…" + text[-6000:]

    def alive(self):
        return self.proc.poll() is None

    def record_processes(self):
        """Remembers the children of `flotilla up` (replicas and warm-pool standbys) and the
        replicas its state.db knows, so teardown can kill them even after up is gone."""
        if self.alive():
            for pid in harness.children_of(self.pid):
                TRACKER.record(pid)
        for pid, ticks in self.stored_replicas():
            record_replica(pid, ticks)

    def stored_replicas(self):
        """(pid, start ticks) of every replica in the data directory's state.db."""
        path = os.path.join(self.data_dir, "state.db")
        if not os.path.exists(path):
            return []
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)
            try:
                rows = db.execute("SELECT json FROM replicas").fetchall()
            finally:
                db.close()
        except sqlite3.Error:
            return []
        out = []
        for (text,) in rows:
            try:
                replica = json.loads(text)
                out.append((int(replica["pid"]), int(replica["process_start_ticks"])))
            except (ValueError, KeyError, TypeError):
                pass
        return out

    def stop(self, check=True):
        """SIGTERM and wait; with check, anything but a clean exit 0 is an error."""
        if self.returncode is not None:
            return self.returncode
        self.record_processes()
        crashed = self.proc.poll()
        if crashed is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=UP_STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.kill9()
                if check:
                    raise AssertionError(f"flotilla up did not exit within "
                                         f"{UP_STOP_DEADLINE_S}s of SIGTERM\n"
                                         f"stderr:\n{self.stderr()}")
                return self.returncode
        self.returncode = self.proc.returncode
        self.proc.stdout.close()
        if check and crashed is not None:
            raise AssertionError(f"flotilla up died on its own (rc={crashed})\n"
                                 f"stderr:\n{self.stderr()}")
        if check and self.returncode != 0:
            raise AssertionError(f"flotilla up exited {self.returncode} after SIGTERM\n"
                                 f"stderr:\n{self.stderr()}")
        return self.returncode

    def kill9(self):
        """SIGKILL to `flotilla up` alone: its replicas (own process groups) keep running."""
        if self.proc.poll() is None:
            self.record_processes()
            self.proc.kill()
        self.proc.wait()
        if self.returncode is None:
            self.returncode = self.proc.returncode
        try:
            self.proc.stdout.close()
        except OSError:
            pass

    def sweep(self):
        """Teardown: kill up and every replica it ran; nothing may outlive the test."""
        self.record_processes()
        self.kill9()
        for pid in harness.find_processes(_is_our_replica):
            TRACKER.record(pid)
        for pid, ticks in self.stored_replicas():
            record_replica(pid, ticks)
        TRACKER.kill_all()

    # ---- HTTP

    def _req(self, what, port, method, path, body, hdrs, conn=None):
        """One request; a failure to get an answer at all (refused, reset, timed out) is a
        test failure that says which call and what `flotilla up` logged."""
        t0 = time.monotonic()
        try:
            return req(port, method, path, body, hdrs, conn=conn)
        except (OSError, http.client.HTTPException) as e:
            raise AssertionError(
                f"{what} {method} {path}: no answer after {time.monotonic() - t0:.2f} s: "
                f"{type(e).__name__}: {e}; flotilla up alive: {self.alive()}\n"
                f"stderr of flotilla up:\n{self.stderr()}") from e

    def api(self, method, path, body=None, token=_DEFAULT, headers=None):
        hdrs = bearer(self.token if token is _DEFAULT else token)
        hdrs.update(headers or {})
        return self._req("API", self.api_port, method, path, body, hdrs)

    def gw(self, method, path, body=None, token=_DEFAULT, headers=None, conn=None):
        hdrs = bearer(self.token if token is _DEFAULT else token)
        hdrs.update(headers or {})
        if isinstance(body, (dict, list)):
            hdrs.setdefault("Content-Type", "application/json")
        return self._req("gateway", self.gateway_port, method, path, body, hdrs, conn=conn)

    def invoke(self, name, rows=(IRIS_ROW,), token=_DEFAULT):
        return self.gw("POST", f"/serving-endpoints/{name}/invocations", mlflow_body(rows),
                       token=token)

    def _ok(self, r, what):
        if r.status != 200:
            raise AssertionError(f"{what}: {r}\nstderr of flotilla up:\n{self.stderr()}")
        return r.json()

    def create(self, s):
        return self._ok(self.api("POST", "/api/2.0/serving-endpoints", s), f"create {s['name']}")

    def put(self, name, s):
        return self._ok(self.api("PUT", f"/api/2.0/serving-endpoints/{name}/config", s),
                        f"update {name}")

    def delete(self, name):
        return self._ok(self.api("DELETE", f"/api/2.0/serving-endpoints/{name}"),
                        f"delete {name}")

    def view(self, name):
        v = self._ok(self.api("GET", f"/api/2.0/serving-endpoints/{name}"), f"get {name}")
        for rep in v.get("replicas", []):
            if rep.get("state") != "failed":
                record_replica(rep["pid"])
        return v

    def events(self, name, limit=1000):
        return self._ok(self.api("GET", f"/api/2.0/serving-endpoints/{name}/events"
                                        f"?limit={limit}"), f"events of {name}")["events"]

    def wait_view(self, name, pred, what, deadline_s=SERVING_DEADLINE_S):
        last = {}

        def check():
            last["view"] = self.view(name)
            return last["view"] if pred(last["view"]) else None
        try:
            return wait_until(check, deadline_s, interval_s=0.05, what=f"{name}: {what}")
        except AssertionError as e:
            raise AssertionError(f"{e}\nlast view: {json.dumps(last.get('view'))[:3000]}\n"
                                 f"events: {self.events(name, 30)}") from None

    def wait_serving(self, name, s=None, deadline_s=SERVING_DEADLINE_S):
        """Waits until the endpoint is READY, NOT_UPDATING, serves `s` (when given) and every
        serving version has its wanted ready replicas and nothing else running."""
        want = canonical(s) if s is not None else None

        def serving(v):
            if v["state"] != {"ready": "READY", "config_update": "NOT_UPDATING"}:
                return False
            if want is not None and v["config"] != want:
                return False
            for ver in v["versions"]:
                if ver["replicas_ready"] != ver["replicas_wanted"]:
                    return False
            # Nothing else runs: retired versions' replicas are gone or at least draining.
            names = {m["name"] for m in v["config"]["served_models"]}
            live = [r for r in v["replicas"] if r["state"] not in ("failed", "draining")]
            return (all(r["state"] == "ready" and r["version"] in names for r in live) and
                    len(live) == sum(ver["replicas_wanted"] for ver in v["versions"]))
        return self.wait_view(name, serving, "serving" + (f" {want}" if want else ""),
                              deadline_s)


def ready_replicas(view):
    return {r["id"]: r["pid"] for r in view["replicas"] if r["state"] == "ready"}


def pid_gone(pid):
    return harness.process_start_ticks(pid) is None


def kinds(events):
    return [e["kind"] for e in events]


# --------------------------------------------------------------------------- load

class Load:
    """Bounded closed-loop load on the gateway: `threads` clients, each on its own keep-alive
    connection, POST an MLflow request for one iris row until `total` requests were sent,
    `deadline_s` passed or stop(). Every answer that is not a 200 whose body one of the two
    iris models could have written, and every exception, is a failure (kept with its reason).
    Each client keeps the sequence of versions (labels) that answered it."""

    def __init__(self, up, name, threads=4, total=50000, deadline_s=90, token=None,
                 label=None):
        self.label_of = label or label_of
        self.port = up.gateway_port
        self.path = f"/serving-endpoints/{name}/invocations"
        self.body = json.dumps(mlflow_body()).encode()
        self.headers = {"Content-Type": "application/json",
                        "Authorization": f"Bearer {token or up.token}"}
        self.total, self.deadline = total, time.monotonic() + deadline_s
        self.lock = threading.Lock()
        self.sent = 0
        self.completed = 0
        self.failures = []
        self.labels = collections.Counter()
        self.sequences = [[] for _ in range(threads)]
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                        for i in range(threads)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def _take(self):
        with self.lock:
            if self._stop.is_set() or self.sent >= self.total or \
                    time.monotonic() >= self.deadline:
                return False
            self.sent += 1
            return True

    def _client(self, index):
        conn = None
        while self._take():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                  timeout=HTTP_TIMEOUT_S)
            label, reason = None, None
            try:
                conn.request("POST", self.path, body=self.body, headers=self.headers)
                r = conn.getresponse()
                data = r.read()
                if r.status != 200:
                    reason = f"{r.status} {data[:200]!r}"
                else:
                    label = self.label_of(data)
                    if label is None:
                        reason = f"200 with an unexpected body {data[:200]!r}"
                if r.will_close:
                    conn.close()
                    conn = None
            except Exception as e:  # noqa: BLE001  (any failure is counted, then reported)
                reason = f"{type(e).__name__}: {e}"
                conn.close()
                conn = None
            with self.lock:
                self.completed += 1
                if label:
                    self.labels[label] += 1
                    self.sequences[index].append(label)
                if reason:
                    self.failures.append((time.monotonic(), reason))
        if conn is not None:
            conn.close()

    def finished(self):
        return not any(t.is_alive() for t in self.threads)

    def count(self, label=None):
        with self.lock:
            return self.completed if label is None else self.labels[label]

    def wait_for(self, pred, what, deadline_s=30):
        """Waits until pred(self); a load that ended first is an error."""
        wait_until(lambda: pred(self) or self.finished(), deadline_s, interval_s=0.01,
                   what=what)
        if not pred(self):
            raise AssertionError(f"load ended before {what}: {self.completed} completed, "
                                 f"labels {dict(self.labels)}, failures {self.failures[:5]}")

    def stop(self):
        self._stop.set()
        for t in self.threads:
            t.join(60)
        if not self.finished():
            raise AssertionError("load clients did not finish")
        return self


def run_requests(up, name, n, threads=4):
    """Sends `n` requests over `threads` keep-alive clients; returns the finished Load."""
    load = Load(up, name, threads=threads, total=n, deadline_s=60).start()
    wait_until(load.finished, 90, interval_s=0.01, what=f"{n} requests to {name}")
    return load


# --------------------------------------------------------------------------- base class

class ControlTestCase(unittest.TestCase):
    maxDiff = 6000
    up = None

    @classmethod
    def start_up(cls, *flags, data_dir=None):
        """A `flotilla up` for the whole class, swept (with its replicas) at class teardown
        after a clean SIGTERM stop."""
        up = Up(data_dir or fresh_dir(cls.__name__.lower()), *flags)
        cls.addClassCleanup(up.sweep)
        cls.addClassCleanup(up.stop)
        return up

    def start_up_for_test(self, *flags, data_dir=None):
        up = Up(data_dir or fresh_dir(self._testMethodName), *flags)
        self.addCleanup(up.sweep)
        return up

    def start_load(self, up, name):
        """Load on endpoint `name` until stopped (stopped at the latest by the cleanup)."""
        load = Load(up, name).start()
        self.addCleanup(load.stop)
        return load

    def assertApiError(self, r, status, code, field=None):
        """`r` is the API's JSON error {"error_code", "message"} with `status`; `field`, when
        given, must be named in the message."""
        self.assertEqual(r.status, status, r)
        self.assertIn("application/json", r.headers.get("content-type", ""), r)
        j = r.json()
        self.assertEqual(j.get("error_code"), code, r)
        self.assertIsInstance(j.get("message"), str, r)
        self.assertTrue(j["message"], r)
        if field is not None:
            self.assertIn(field, j["message"], r)
        return j

    def assertGatewayError(self, r, status):
        """The gateway's own error in its route's shape; returns the message."""
        return harness.assert_gateway_error(self, r, status)

    def assertNoFailures(self, load, what):
        self.assertEqual(load.failures, [],
                         f"{what}: {len(load.failures)} of {load.completed} requests failed; "
                         f"labels {dict(load.labels)}; first: {load.failures[:5]}")

    def assertSwitchedOnce(self, load, before, after):
        """Each client saw `before` answers, then only `after` ones: the traffic switch is
        atomic for a client on one connection, never back and forth."""
        for i, seq in enumerate(load.sequences):
            text = "".join("a" if x == after else "b" if x == before else "?" for x in seq)
            self.assertRegex(text, r"^b*a*$",
                             f"client {i} saw {before} after {after} (b={before}, a={after}): "
                             f"{text[:400]}")


# =========================================================================== 1-3. rollouts

class Rollouts(ControlTestCase):
    @classmethod
    def setUpClass(cls):
        # These tests pin issue #4's rule (each version keeps ceil(concurrency.min / target)
        # replicas); the autoscaler, which scales down only after its down window, has its own
        # tests (Autoscaling).
        cls.up = cls.start_up("--no-autoscale")

    def test_deploy_predict_update_rollback_delete_under_load(self):
        up, name = self.up, "roll"
        v1 = spec(name, served("v1", CLASSIFIER, concurrency={"min": 32, "max": 64}))
        v2 = spec(name, served("v2", PROBA, concurrency={"min": 32, "max": 64}))

        created = up.create(v1)
        self.assertEqual(created["name"], name)
        self.assertIsNone(created["config"], "nothing can serve before a replica is ready")
        self.assertEqual(created["pending_config"], canonical(v1))
        self.assertEqual(created["state"]["ready"], "NOT_READY")
        view = up.wait_serving(name, v1)
        (version,) = view["versions"]
        self.assertEqual((version["name"], version["replicas_wanted"],
                          version["target_concurrency_per_replica"], version["runtime"]),
                         ("v1", 2, 16, "auto"))
        v1_pids = ready_replicas(view)
        self.assertEqual(len(v1_pids), 2, view["replicas"])
        self.assertTrue(all(r["version"] == "v1" for r in view["replicas"]), view["replicas"])

        # Both gateway routes.
        r = up.invoke(name, rows=[IRIS_ROW, [6.7, 3.0, 5.2, 2.3]])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"predictions": [0, 2]})
        r = up.gw("POST", f"/v2/models/{name}/infer", oip_body())
        self.assertEqual(r.status, 200, r)
        outputs = {o["name"]: o for o in r.json()["outputs"]}
        self.assertEqual(outputs["predict"]["data"], [0], r)

        # Update to a new model under load: zero failed requests, one switch per client.
        load = self.start_load(up, name)
        load.wait_for(lambda ld: ld.count("classifier") >= 50, "v1 answering under load")
        pending = up.put(name, v2)
        self.assertEqual(pending["state"]["config_update"], "IN_PROGRESS", pending)
        self.assertEqual(pending["config"], canonical(v1))
        self.assertEqual(pending["pending_config"], canonical(v2))
        up.wait_serving(name, v2)
        wait_until(lambda: all(pid_gone(p) for p in v1_pids.values()), GONE_DEADLINE_S,
                   what="v1 replicas to exit after the rollout")
        view = up.wait_view(name, lambda v: len(v["replicas"]) == 2, "v1 replicas unlisted")
        seen = load.count("proba")
        load.wait_for(lambda ld: ld.count("proba") >= seen + 100, "v2 answering under load")
        load.stop()
        self.assertNoFailures(load, "rollout v1 -> v2")
        self.assertGreater(load.count("classifier"), 0)
        self.assertSwitchedOnce(load, "classifier", "proba")
        v2_pids = ready_replicas(view)
        self.assertEqual(len(v2_pids), 2, view["replicas"])
        self.assertFalse(set(v2_pids.values()) & set(v1_pids.values()))
        self.assertEqual([r["version"] for r in view["replicas"]], ["v2", "v2"])
        ev = up.events(name)
        updated = [e for e in ev if e["kind"] == "updated"]
        self.assertEqual(len(updated), 1, ev)
        self.assertIn("rollout started", updated[0]["message"])
        self.assertIn("v2", updated[0]["message"])
        self.assertIn("rollout_complete", kinds(ev))
        drained = {e["message"].split(":")[0] for e in ev if e["kind"] == "replica_draining"}
        self.assertEqual(drained, set(v1_pids), ev)

        # Rollback: the old spec again, under load.
        load = self.start_load(up, name)
        load.wait_for(lambda ld: ld.count("proba") >= 50, "v2 answering under load")
        up.put(name, v1)
        view = up.wait_serving(name, v1)
        wait_until(lambda: all(pid_gone(p) for p in v2_pids.values()), GONE_DEADLINE_S,
                   what="v2 replicas to exit after the rollback")
        seen = load.count("classifier")
        load.wait_for(lambda ld: ld.count("classifier") >= seen + 100, "v1 answering again")
        load.stop()
        self.assertNoFailures(load, "rollback v2 -> v1")
        self.assertSwitchedOnce(load, "proba", "classifier")
        self.assertEqual(len(ready_replicas(view)), 2)
        self.assertEqual(view["config"], canonical(v1))
        self.assertIsNone(view["pending_config"])

        # Delete: the gateway forgets the endpoint, the replicas exit.
        last_pids = ready_replicas(view)
        self.assertEqual(up.delete(name), {})
        wait_until(lambda: up.invoke(name).status == 404, 10, interval_s=0.02,
                   what="the gateway to answer 404 for the deleted endpoint")
        self.assertGatewayError(up.invoke(name), 404)
        self.assertApiError(up.api("GET", f"/api/2.0/serving-endpoints/{name}"), 404,
                            "RESOURCE_DOES_NOT_EXIST")
        wait_until(lambda: all(pid_gone(p) for p in last_pids.values()), GONE_DEADLINE_S,
                   what="the deleted endpoint's replicas to exit")
        listed = up._ok(up.api("GET", "/api/2.0/serving-endpoints"), "list")["endpoints"]
        self.assertNotIn(name, [e["name"] for e in listed])
        # Its history stays readable.
        self.assertIn("deleted", kinds(up.events(name)))

    def test_update_to_a_broken_model_keeps_serving_until_rolled_back(self):
        up, name = self.up, "guard"
        good = spec(name, served("v1", CLASSIFIER))
        broken = spec(name, served("v2", "corrupt.json"))
        up.create(good)
        view = up.wait_serving(name, good)
        pids = ready_replicas(view)

        load = self.start_load(up, name)
        load.wait_for(lambda ld: ld.count() >= 50, "v1 answering under load")
        up.put(name, broken)
        view = up.wait_view(
            name, lambda v: any(r["state"] == "failed" and r["version"] == "v2"
                                for r in v["replicas"]), "a failed v2 replica", 20)
        self.assertEqual(view["state"], {"ready": "READY", "config_update": "IN_PROGRESS"})
        self.assertEqual(view["config"], canonical(good))
        self.assertEqual(view["pending_config"], canonical(broken))
        self.assertEqual({v["name"]: (v["role"], v["serving"]) for v in view["versions"]},
                         {"v2": ("target", False), "v1": ("previous", True)})
        seen = load.count()
        load.wait_for(lambda ld: ld.count() >= seen + 100, "v1 still answering")

        # Rolling back to the spec that serves restarts nothing and stops the v2 attempts.
        up.put(name, good)
        view = up.wait_serving(name, good)
        self.assertEqual(ready_replicas(view), pids)
        up.wait_view(name, lambda v: all(r["state"] == "failed" for r in v["replicas"]
                                         if r["version"] == "v2"),
                     "no v2 replica left running", 10)
        seen = load.count()
        load.wait_for(lambda ld: ld.count() >= seen + 100, "v1 answering after the rollback")
        load.stop()
        self.assertNoFailures(load, "a broken update and its rollback")
        self.assertEqual(set(load.labels), {"classifier"})
        msg = [e for e in up.events(name) if e["kind"] == "updated"][-1]["message"]
        self.assertTrue(msg.startswith("applied without restarting replicas"), msg)
        self.assertNotIn("rollout_complete", kinds(up.events(name)))
        up.delete(name)

    def test_traffic_and_concurrency_changes_keep_replicas(self):
        up, name = self.up, "split"

        def two(a, b, ca=None, cb=None):
            return spec(name, served("a", CLASSIFIER, traffic=a, concurrency=ca),
                        served("b", PROBA, traffic=b, concurrency=cb))

        s = two(50, 50)
        up.create(s)
        view = up.wait_serving(name, s)
        pids = ready_replicas(view)
        self.assertEqual(len(pids), 2, view["replicas"])
        starts = kinds(up.events(name)).count("replica_started")

        load = run_requests(up, name, 400)
        self.assertNoFailures(load, "50/50")
        self.assertGreaterEqual(load.count("classifier"), 120, load.labels)
        self.assertGreaterEqual(load.count("proba"), 120, load.labels)

        def apply(new_spec):
            up.put(name, new_spec)
            msg = [e for e in up.events(name) if e["kind"] == "updated"][-1]["message"]
            self.assertTrue(msg.startswith("applied without restarting replicas"), msg)
            v = up.wait_serving(name, new_spec)
            self.assertEqual(ready_replicas(v), pids, "a traffic or concurrency change "
                                                      "restarted replicas")
            self.assertEqual(kinds(up.events(name)).count("replica_started"), starts)
            self.assertTrue(all(not pid_gone(p) for p in pids.values()))
            return v

        # Traffic only: 90/10.
        apply(two(90, 10))
        load = run_requests(up, name, 400)
        self.assertNoFailures(load, "90/10")
        self.assertGreaterEqual(load.count("proba"), 8, load.labels)
        self.assertLessEqual(load.count("proba"), 100, load.labels)

        # Traffic only: 0/100 sends nothing to `a` once the table has reached the gateway.
        apply(two(0, 100))
        wait_until(lambda: all(label_of(up.invoke(name).body) == "proba" for _ in range(20)),
                   5, what="20 answers in a row from b")
        load = run_requests(up, name, 200)
        self.assertNoFailures(load, "0/100")
        self.assertEqual(dict(load.labels), {"proba": 200})

        # Concurrency only (still one replica per version: min <= 16).
        apply(two(0, 100, ca={"min": 16, "max": 128}, cb={"min": 8, "max": 32}))

        # A higher minimum adds a replica and keeps the running one.
        bigger = two(0, 100, ca={"min": 16, "max": 128}, cb={"min": 32, "max": 64})
        up.put(name, bigger)
        view = up.wait_serving(name, bigger)
        now = ready_replicas(view)
        self.assertEqual(len(now), 3, view["replicas"])
        self.assertLessEqual(set(pids.items()), set(now.items()))
        self.assertEqual([v["replicas_wanted"] for v in view["versions"]], [1, 2])

        # Back down under load: the newest replica drains, the gateway stops using it before
        # it stops, and no request fails.
        extra = set(now) - set(pids)
        smaller = two(0, 100, ca={"min": 16, "max": 128}, cb={"min": 8, "max": 64})
        load = self.start_load(up, name)
        load.wait_for(lambda ld: ld.count() >= 50, "load running")
        up.put(name, smaller)
        view = up.wait_serving(name, smaller)
        wait_until(lambda: all(pid_gone(now[i]) for i in extra), GONE_DEADLINE_S,
                   what="the surplus replica to exit")
        seen = load.count()
        load.wait_for(lambda ld: ld.count() >= seen + 100, "load after the scale-down")
        load.stop()
        self.assertNoFailures(load, "scale-down")
        self.assertEqual(ready_replicas(view), pids)
        up.delete(name)

    def test_killed_replica_is_replaced_while_under_load(self):
        up, name = self.up, "heal"
        s = spec(name, served("v1", CLASSIFIER, concurrency={"min": 32, "max": 64}))
        up.create(s)
        view = up.wait_serving(name, s)
        pids = ready_replicas(view)
        self.assertEqual(len(pids), 2)
        victim_id, victim_pid = sorted(pids.items())[0]

        load = self.start_load(up, name)
        load.wait_for(lambda ld: ld.count() >= 200, "load running")
        ticks = harness.process_start_ticks(victim_pid)
        killed_at = time.monotonic()
        self.assertTrue(harness.signal_alive(victim_pid, signal.SIGKILL, ticks))

        def replaced(v):
            states = {r["id"]: r for r in v["replicas"]}
            victim = states.get(victim_id)
            fresh = [r for r in v["replicas"] if r["state"] == "ready" and r["id"] != victim_id]
            return victim is not None and victim["state"] == "failed" and len(fresh) == 2
        view = up.wait_view(name, replaced, "a replacement replica ready", deadline_s=15)
        replaced_in = time.monotonic() - killed_at
        victim = next(r for r in view["replicas"] if r["id"] == victim_id)
        self.assertIn("signal 9", victim["reason"])
        failed = [e for e in up.events(name) if e["kind"] == "replica_failed"]
        self.assertEqual(len(failed), 1, failed)
        self.assertTrue(failed[0]["message"].startswith(victim_id), failed)
        self.assertIn("signal 9", failed[0]["message"])
        survivor = [i for i in pids if i != victim_id][0]
        self.assertIn(survivor, ready_replicas(view), "the surviving replica was restarted")
        self.assertEqual(up.view(name)["state"]["ready"], "READY")

        seen = load.count()
        load.wait_for(lambda ld: ld.count() >= seen + 300, "load on the replacement")
        load.stop()
        self.assertNoFailures(load, f"kill -9 of a replica (replaced in {replaced_in:.2f} s)")
        up.delete(name)


    def test_requests_in_flight_on_a_killed_replica_are_retried(self):
        # Slow synthetic replicas (300 ms a request) make sure requests are in flight on the
        # victim when it dies: the gateway retries them on the other replica.
        up, name = self.up, "inflight"
        s = spec(name, served("v1", synthetic_model(300), runtime="synthetic",
                              concurrency={"min": 16, "max": 64}))
        up.create(s)
        view = up.wait_serving(name, s)
        pids = ready_replicas(view)
        self.assertEqual(len(pids), 2, view["replicas"])
        victim_id, victim_pid = sorted(pids.items())[0]
        ticks = harness.process_start_ticks(victim_pid)

        results = [None] * 6

        def call(i):
            try:
                results[i] = up.invoke(name)
            except Exception as e:  # noqa: BLE001  (reported below)
                results[i] = e
        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()

        def victim_busy():
            stats = up.gw("GET", "/gateway/stats").json()
            for e in stats["endpoints"]:
                for r in e["replicas"] if e["name"] == name else []:
                    if r["id"] == victim_id and r["in_flight"] >= 1:
                        return True
            return False
        wait_until(victim_busy, 5, interval_s=0.005, what="requests in flight on the victim")
        self.assertTrue(harness.signal_alive(victim_pid, signal.SIGKILL, ticks))
        for t in threads:
            t.join(30)
        bad = [(i, r) for i, r in enumerate(results)
               if not isinstance(r, harness.Resp) or r.status != 200]
        self.assertEqual(bad, [], "requests in flight on a replica killed with SIGKILL failed")
        up.delete(name)

# =========================================================================== 4. restart

class Restart(ControlTestCase):
    def test_kill9_of_up_then_restart_adopts_replicas(self):
        data_dir = fresh_dir("restart")
        up = self.start_up_for_test(data_dir=data_dir)
        wait_until(lambda: any(_TOKEN_LINE_RE.match(x) for x in up.lines()), 5,
                   what="the admin token line on the first start")
        (token_line,) = [x for x in up.lines() if _TOKEN_LINE_RE.match(x)]
        self.assertEqual(_TOKEN_LINE_RE.match(token_line).group(2), up.token)
        self.assertEqual(oct(os.stat(os.path.join(data_dir, "admin.token")).st_mode & 0o777),
                         "0o600")
        self.assertEqual(up.reported_data_dir, data_dir)
        info = up._ok(up.api("GET", "/api/2.0/info"), "info")
        self.assertEqual((info["gateway"], info["api"], info["data_dir"]),
                         (f"http://127.0.0.1:{up.gateway_port}",
                          f"http://127.0.0.1:{up.api_port}", data_dir))

        one = spec("keep", served("v1", CLASSIFIER, concurrency={"min": 32, "max": 64}))
        two = spec("keep2", served("a", CLASSIFIER, traffic=30),
                   served("b", PROBA, traffic=70, concurrency={"min": 2, "max": 20}))
        up.create(one)
        up.create(two)
        before = {n: up.wait_serving(n, s) for n, s in (("keep", one), ("keep2", two))}
        pids = {n: ready_replicas(v) for n, v in before.items()}
        self.assertEqual((len(pids["keep"]), len(pids["keep2"])), (2, 2))
        scoped = up._ok(up.api("POST", "/api/2.0/tokens",
                               {"id": "client", "endpoints": ["keep"]}), "token")["token"]
        self.assertEqual(up.invoke("keep", token=scoped).status, 200)
        # Warm-pool standbys: children that serve no endpoint (a replica taken from the pool
        # keeps the standby's command line).
        replica_pids = {p for ps in pids.values() for p in ps.values()}
        standbys = [p for p in harness.children_of(up.pid)
                    if "--standby" in (harness.process_cmdline(p) or []) and
                    p not in replica_pids]
        self.assertTrue(standbys, "no warm-pool standby running")

        up.kill9()
        self.assertEqual(up.returncode, -signal.SIGKILL)
        for n, ps in pids.items():
            for rid, pid in ps.items():
                self.assertFalse(pid_gone(pid), f"replica {rid} of {n} died with flotilla up")
        # A warm-pool standby has no model to serve: it sees EOF on its stdin and exits.
        wait_until(lambda: all(pid_gone(p) for p in standbys), 10,
                   what=f"the old warm-pool standbys {standbys} to exit")

        again = self.start_up_for_test(data_dir=data_dir)
        self.assertEqual(again.token, up.token)
        listed = again._ok(again.api("GET", "/api/2.0/serving-endpoints"), "list")["endpoints"]
        self.assertEqual(sorted(e["name"] for e in listed), ["keep", "keep2"])
        for n, s in (("keep", one), ("keep2", two)):
            view = again.wait_serving(n, s, deadline_s=15)
            self.assertEqual(view["config"], before[n]["config"])
            self.assertEqual(view["creation_timestamp"], before[n]["creation_timestamp"])
            self.assertEqual(ready_replicas(view), pids[n], f"{n}: replicas not adopted")
            # Events come from the orchestrator's thread, a moment after the adoption itself.
            adopted = wait_until(
                lambda: (lambda a: a if len(a) >= len(pids[n]) else None)(
                    [e for e in again.events(n) if e["kind"] == "replica_adopted"]),
                10, interval_s=0.02, what=f"{n}: replica_adopted events")
            self.assertEqual(sorted(e["message"].split(":")[0] for e in adopted),
                             sorted(pids[n]), adopted)
            started_after = [e for e in again.events(n)
                             if e["kind"] == "replica_started" and
                             e["timestamp"] > adopted[0]["timestamp"]]
            self.assertEqual(started_after, [], "replicas started although adopted ones ran")

        r = again.invoke("keep", rows=[IRIS_ROW, [6.7, 3.0, 5.2, 2.3]])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json(), {"predictions": [0, 2]})
        load = run_requests(again, "keep2", 200)
        self.assertNoFailures(load, "the adopted two-version endpoint")
        self.assertEqual(set(load.labels), {"classifier", "proba"})
        self.assertEqual(again.invoke("keep", token=scoped).status, 200,
                         "a token made before the restart stopped working")
        self.assertGatewayError(again.invoke("keep2", token=scoped), 403)

        # The second start minted no token and printed none.
        self.assertEqual([x for x in again.lines() if x.startswith("admin token")], [])
        # A second `flotilla up` on a data directory in use refuses to start.
        p = run_to_exit([BIN, "up", "--data-dir", data_dir, "--gateway-addr",
                         "127.0.0.1:0", "--api-addr", "127.0.0.1:0", "--grpc-addr",
                         "127.0.0.1:0"], deadline_s=10)
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(p.stdout, b"")
        err = p.stderr.decode().splitlines()
        self.assertEqual(len(err), 1, err)
        self.assertIn("in use", err[0])
        self.assertEqual(again.invoke("keep").status, 200)

        # A clean stop now also stops the adopted replicas (not children of this process).
        self.assertEqual(again.stop(), 0)
        all_pids = [p for ps in pids.values() for p in ps.values()]
        wait_until(lambda: all(pid_gone(p) for p in all_pids), 5,
                   what="adopted replicas gone after SIGTERM")

    def test_replica_that_died_while_up_was_down_is_replaced(self):
        data_dir = fresh_dir("lost")
        up = self.start_up_for_test(data_dir=data_dir)
        s = spec("lost", served("v1", CLASSIFIER, concurrency={"min": 32, "max": 64}))
        up.create(s)
        pids = ready_replicas(up.wait_serving("lost", s))
        up.kill9()
        (dead_id, dead_pid), (kept_id, kept_pid) = sorted(pids.items())
        self.assertTrue(harness.signal_alive(dead_pid, signal.SIGKILL,
                                             harness.process_start_ticks(dead_pid)))
        wait_until(lambda: pid_gone(dead_pid), 5, what="the killed replica to die")

        again = self.start_up_for_test(data_dir=data_dir)
        view = again.wait_serving("lost", s, deadline_s=15)
        now = ready_replicas(view)
        self.assertEqual(len(now), 2, view["replicas"])
        self.assertEqual(now.get(kept_id), kept_pid, "the live replica was not adopted")
        self.assertNotIn(dead_id, now)
        ev = again.events("lost")
        self.assertIn("replica_lost", kinds(ev))
        lost = [e for e in ev if e["kind"] == "replica_lost"]
        self.assertEqual([e["message"].split(":")[0] for e in lost], [dead_id], lost)
        self.assertEqual(again.invoke("lost").status, 200)
        self.assertEqual(again.stop(), 0)
        wait_until(lambda: all(pid_gone(p) for p in now.values()), 5,
                   what="replicas gone after SIGTERM")


    def test_restart_during_a_stuck_rollout_keeps_serving_the_old_version(self):
        data_dir = fresh_dir("midroll")
        up = self.start_up_for_test(data_dir=data_dir)
        good = spec("mid", served("v1", CLASSIFIER))
        broken = spec("mid", served("v2", "corrupt.json"))
        up.create(good)
        pids = ready_replicas(up.wait_serving("mid", good))
        up.put("mid", broken)
        up.wait_view("mid", lambda v: any(r["state"] == "failed" for r in v["replicas"]),
                     "a failed v2 replica", 20)
        up.kill9()

        again = self.start_up_for_test(data_dir=data_dir)
        view = again.view("mid")
        self.assertEqual(view["config"], canonical(good), "the serving config was lost")
        self.assertEqual(view["pending_config"], canonical(broken))
        self.assertEqual(view["state"], {"ready": "READY", "config_update": "IN_PROGRESS"})
        self.assertEqual(ready_replicas(view), pids)
        load = run_requests(again, "mid", 200)
        self.assertNoFailures(load, "the old version after the restart")
        self.assertEqual(set(load.labels), {"classifier"})

        # Deleting an endpoint in the middle of a rollout stops every replica of both versions.
        started = [int(re.search(r": pid (\d+),", e["message"]).group(1))
                   for e in again.events("mid") if e["kind"] == "replica_started"]
        again.delete("mid")
        wait_until(lambda: all(pid_gone(p) for p in started), GONE_DEADLINE_S,
                   what="every replica of the deleted endpoint to exit")
        self.assertGatewayError(again.invoke("mid"), 404)


# =========================================================================== 5. concurrency

class ApiConcurrency(ControlTestCase):
    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up()

    def test_concurrent_updates_of_one_endpoint(self):
        up, name = self.up, "race"

        def variant(i):
            a = 5 * (i + 1)   # 5 .. 80, never the initial 90
            return spec(name, served("a", CLASSIFIER, traffic=a,
                                     concurrency={"min": 1, "max": 100 + i}),
                        served("b", PROBA, traffic=100 - a))
        initial = spec(name, served("a", CLASSIFIER, traffic=90), served("b", PROBA, traffic=10))
        up.create(initial)
        view = up.wait_serving(name, initial)
        pids = ready_replicas(view)
        specs = [variant(i) for i in range(16)]
        results = [None] * 16
        barrier = threading.Barrier(16)

        def client(i):
            barrier.wait(10)
            try:
                results[i] = up.api("PUT", f"/api/2.0/serving-endpoints/{name}/config",
                                    specs[i])
            except Exception as e:  # noqa: BLE001  (reported below)
                results[i] = e
        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i, r in enumerate(results):
            self.assertIsInstance(r, harness.Resp, f"PUT {i}: {r}")
            self.assertEqual(r.status, 200, f"PUT {i}: {r}")
            body = r.json()
            self.assertIn(body["pending_config"] or body["config"],
                          [canonical(s) for s in specs], f"PUT {i}")

        view = up.wait_serving(name)
        self.assertIn(view["config"], [canonical(s) for s in specs])
        self.assertIsNone(view["pending_config"])
        self.assertEqual(ready_replicas(view), pids, "traffic changes restarted replicas")
        updated = [e for e in up.events(name) if e["kind"] == "updated"]
        self.assertEqual(len(updated), 16, "one 'updated' event per distinct accepted spec")
        final = view["config"]["served_models"]
        self.assertIn(f"a {final[0]['traffic']}%, b {final[1]['traffic']}%",
                      updated[-1]["message"], "the last update recorded is not the one kept")

        # The database agrees with the API.
        db = sqlite3.connect(f"file:{up.data_dir}/state.db?mode=ro", uri=True, timeout=5)
        try:
            (spec_json, serving_json), = db.execute(
                "SELECT spec_json, serving_json FROM endpoints WHERE name = ?", (name,))
        finally:
            db.close()
        self.assertEqual(json.loads(spec_json), view["config"])
        self.assertEqual(json.loads(serving_json), view["config"])

        load = run_requests(up, name, 100)
        self.assertNoFailures(load, "after the concurrent updates")
        up.delete(name)

    def test_concurrent_rollouts_converge_on_one_version(self):
        up, name = self.up, "churn"
        first = spec(name, served("r", CLASSIFIER))
        up.create(first)
        up.wait_serving(name, first)
        specs = [spec(name, served(f"r{i}", CLASSIFIER if i % 2 else PROBA))
                 for i in range(8)]
        results = [None] * 8
        barrier = threading.Barrier(8)

        def client(i):
            barrier.wait(10)
            try:
                results[i] = up.api("PUT", f"/api/2.0/serving-endpoints/{name}/config",
                                    specs[i])
            except Exception as e:  # noqa: BLE001  (reported below)
                results[i] = e
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual([getattr(r, "status", r) for r in results], [200] * 8)
        view = up.wait_serving(name)
        self.assertIn(view["config"], [canonical(s) for s in specs])
        final = view["config"]["served_models"][0]["name"]
        updated = [e for e in up.events(name) if e["kind"] == "updated"]
        self.assertEqual(len(updated), 8)
        self.assertIn(final, updated[-1]["message"])

        # Every replica started for a version that lost the race exits.
        started = [int(re.search(r": pid (\d+),", e["message"]).group(1))
                   for e in up.events(name) if e["kind"] == "replica_started"]
        keep = set(ready_replicas(view).values())
        wait_until(lambda: all(pid_gone(p) for p in started if p not in keep),
                   GONE_DEADLINE_S, what="replicas of superseded versions to exit")
        view = up.wait_view(name, lambda v: all(r["version"] == final for r in v["replicas"]
                                                if r["state"] != "failed"),
                            "only the final version listed")
        self.assertEqual(len(ready_replicas(view)), 1, view["replicas"])
        load = run_requests(up, name, 100)
        self.assertNoFailures(load, "after concurrent rollouts")
        self.assertEqual(set(load.labels), {"classifier" if int(final[1:]) % 2 else "proba"})
        up.delete(name)

    def test_concurrent_deletes_of_one_endpoint(self):
        up, name = self.up, "gone"
        s = spec(name, served("v1", CLASSIFIER))
        up.create(s)
        pids = ready_replicas(up.wait_serving(name, s))
        results = [None] * 8
        barrier = threading.Barrier(8)

        def client(i):
            barrier.wait(10)
            try:
                results[i] = up.api("DELETE", f"/api/2.0/serving-endpoints/{name}")
            except Exception as e:  # noqa: BLE001  (reported below)
                results[i] = e
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        statuses = collections.Counter(getattr(r, "status", repr(r)) for r in results)
        self.assertEqual(statuses, {200: 1, 404: 7}, results)
        self.assertEqual(kinds(up.events(name)).count("deleted"), 1)
        wait_until(lambda: all(pid_gone(p) for p in pids.values()), GONE_DEADLINE_S,
                   what="the deleted endpoint's replica to exit")
        # The name is free again.
        up.create(s)
        up.wait_serving(name, s)
        up.delete(name)

    def test_concurrent_creates_of_one_name(self):
        up, name = self.up, "dup"
        specs = [spec(name, served("v1", CLASSIFIER, concurrency={"min": 1, "max": 10 + i}))
                 for i in range(16)]
        results = [None] * 16
        barrier = threading.Barrier(16)

        def client(i):
            barrier.wait(10)
            try:
                results[i] = up.api("POST", "/api/2.0/serving-endpoints", specs[i])
            except Exception as e:  # noqa: BLE001  (reported below)
                results[i] = e
        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        statuses = collections.Counter(getattr(r, "status", repr(r)) for r in results)
        self.assertEqual(statuses, {200: 1, 409: 15}, results)
        winner = next(i for i, r in enumerate(results) if r.status == 200)
        for r in results:
            if r.status == 409:
                self.assertApiError(r, 409, "RESOURCE_ALREADY_EXISTS", name)
        view = up.wait_serving(name, specs[winner])
        self.assertEqual(len(ready_replicas(view)), 1)
        self.assertEqual(kinds(up.events(name)).count("created"), 1)
        up.delete(name)


# =========================================================================== 6. errors

class Errors(ControlTestCase):
    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up()

    def post(self, body):
        return self.up.api("POST", "/api/2.0/serving-endpoints", body,
                           headers={"Content-Type": "application/json"})

    def test_invalid_specs_are_400_naming_the_field(self):
        good = served("v1", CLASSIFIER)
        cases = {
            "malformed JSON": ('{"name": "e1", "served_models": [', "spec"),
            "malformed YAML": ("name: e1\nserved_models: [ {name: v1\n", "spec"),
            "not a mapping": ("[1, 2]", "spec"),
            "unknown top-level field": (spec("e1", good) | {"replicas": 3}, "'replicas'"),
            "unknown served field": (spec("e1", dict(good, modle="/x")),
                                     "served_models[0]: unknown field 'modle'"),
            "traffic does not sum to 100": (
                spec("e1", served("a", CLASSIFIER, traffic=50),
                     served("b", PROBA, traffic=40)), "served_models: traffic sums to 90"),
            "traffic out of range": (spec("e1", served("a", CLASSIFIER, traffic=150)),
                                     "served_models[0].traffic"),
            "traffic as a string": (spec("e1", served("a", CLASSIFIER, traffic="100")),
                                    "served_models[0].traffic"),
            "traffic missing with two models": (
                spec("e1", served("a", CLASSIFIER), served("b", PROBA, traffic=100)),
                "served_models[0].traffic"),
            "missing model": (spec("e1", {"name": "v1"}), "served_models[0].model: "),
            "relative model path": (spec("e1", {"name": "v1", "model": "models/binary.json"}),
                                    "served_models[0].model"),
            "nonexistent model file": (
                spec("e1", served("a", CLASSIFIER, traffic=50),
                     served("b", model_path("nope.json"), traffic=50)),
                "served_models[1].model"),
            "bad runtime": (spec("e1", served("v1", CLASSIFIER, runtime="tensorflow")),
                            "served_models[0].runtime"),
            "missing name": ({"served_models": [good]}, "name: "),
            "bad name": (spec("bad/name", good), "name: 'bad/name'"),
            "no served models": (spec("e1"), "served_models: "),
            "duplicate version": (spec("e1", served("v1", CLASSIFIER, traffic=50),
                                       served("v1", PROBA, traffic=50)),
                                  "served_models[1].name"),
            "min above max": (spec("e1", served("v1", CLASSIFIER,
                                                concurrency={"min": 9, "max": 3})),
                              "served_models[0].concurrency"),
            "negative memory": (spec("e1", served("v1", CLASSIFIER,
                                                  resources={"memory_mb": -1})),
                                "served_models[0].resources.memory_mb"),
        }
        for what, (body, field) in cases.items():
            with self.subTest(what):
                self.assertApiError(self.post(body), 400, "INVALID_PARAMETER_VALUE", field)
        j = self.assertApiError(self.post(cases["relative model path"][0]), 400,
                                "INVALID_PARAMETER_VALUE")
        self.assertIn("absolute", j["message"])
        j = self.assertApiError(self.post(cases["nonexistent model file"][0]), 400,
                                "INVALID_PARAMETER_VALUE")
        self.assertIn("does not exist", j["message"])
        listed = self.up._ok(self.up.api("GET", "/api/2.0/serving-endpoints"), "list")
        self.assertNotIn("e1", [e["name"] for e in listed["endpoints"]])
        self.assertApiError(self.up.api("GET", "/api/2.0/serving-endpoints/e1"), 404,
                            "RESOURCE_DOES_NOT_EXIST")

    def test_invalid_update_leaves_the_endpoint_unchanged(self):
        up, name = self.up, "steady"
        s = spec(name, served("v1", CLASSIFIER))
        up.create(s)
        view = up.wait_serving(name, s)
        path = f"/api/2.0/serving-endpoints/{name}/config"
        self.assertApiError(up.api("PUT", path, spec(name, served("v1", CLASSIFIER,
                                                                  traffic=99))),
                            400, "INVALID_PARAMETER_VALUE", "traffic")
        self.assertApiError(up.api("PUT", path, spec("other", served("v1", CLASSIFIER))),
                            400, "INVALID_PARAMETER_VALUE", "name")
        self.assertApiError(up.api("PUT", path, "{"), 400, "INVALID_PARAMETER_VALUE")
        # The name may be left out of an update: it comes from the path.
        up.put(name, {"served_models": [served("v1", CLASSIFIER,
                                               concurrency={"min": 1, "max": 8})]})
        after = up.wait_serving(name)
        self.assertEqual(after["config"]["served_models"][0]["concurrency"],
                         {"min": 1, "max": 8})
        self.assertEqual(ready_replicas(after), ready_replicas(view))
        self.assertEqual(kinds(up.events(name)).count("updated"), 1)
        # The same spec again changes nothing and records nothing.
        again = up.put(name, spec(name, served("v1", CLASSIFIER,
                                               concurrency={"min": 1, "max": 8})))
        self.assertEqual(again["state"], {"ready": "READY", "config_update": "NOT_UPDATING"})
        self.assertEqual(kinds(up.events(name)).count("updated"), 1)
        up.delete(name)

    def test_oversized_body_is_413_in_the_api_error_shape(self):
        # The API's errors are {"error_code", "message"}, whichever layer refuses the call.
        r = self.post("name: big\n# " + "x" * (2 * 1024 * 1024) + "\n")
        self.assertEqual(r.status, 413, r)
        self.assertIn("application/json", r.headers.get("content-type", ""), r)
        self.assertEqual(sorted(r.json()), ["error_code", "message"], r)

    def test_unknown_endpoint_is_404(self):
        up = self.up
        base = "/api/2.0/serving-endpoints/nope"
        for method, path, body in (("GET", base, None),
                                   ("PUT", base + "/config", spec("nope",
                                                                  served("v1", CLASSIFIER))),
                                   ("DELETE", base, None),
                                   ("GET", base + "/events", None)):
            with self.subTest(f"{method} {path}"):
                self.assertApiError(up.api(method, path, body), 404,
                                    "RESOURCE_DOES_NOT_EXIST", "nope")
        self.assertApiError(up.api("GET", "/api/2.0/nothing-here"), 404, "ENDPOINT_NOT_FOUND")
        self.assertApiError(up.api("GET", base + "/replicas"), 404, "ENDPOINT_NOT_FOUND")
        self.assertGatewayError(up.invoke("nope"), 404)

    def test_events_limit(self):
        up, name = self.up, "evented"
        s = spec(name, served("v1", CLASSIFIER))
        up.create(s)
        up.wait_serving(name, s)
        up.put(name, spec(name, served("v1", CLASSIFIER, concurrency={"min": 1, "max": 9})))
        every = up.events(name)
        self.assertGreaterEqual(len(every), 4, every)
        ids = [e["id"] for e in every]
        self.assertEqual(ids, sorted(ids), "events are not oldest first")
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(every[0]["kind"], "created")
        self.assertEqual(every[0]["actor"], "admin")
        self.assertEqual(up.events(name, limit=2), every[-2:], "limit keeps the newest")
        for bad in ("0", "-1", "x", "10001", "1.5"):
            with self.subTest(limit=bad):
                self.assertApiError(
                    up.api("GET", f"/api/2.0/serving-endpoints/{name}/events?limit={bad}"),
                    400, "INVALID_PARAMETER_VALUE", "limit")
        up.delete(name)

    def test_wrong_method_is_405(self):
        up = self.up
        for method, path in (("PATCH", "/api/2.0/serving-endpoints"),
                             ("PUT", "/api/2.0/serving-endpoints"),
                             ("POST", "/api/2.0/serving-endpoints/x"),
                             ("GET", "/api/2.0/serving-endpoints/x/config"),
                             ("POST", "/api/2.0/serving-endpoints/x/events"),
                             ("PUT", "/api/2.0/tokens"),
                             ("GET", "/api/2.0/tokens/x")):
            with self.subTest(f"{method} {path}"):
                r = up.api(method, path)
                self.assertApiError(r, 405, "METHOD_NOT_ALLOWED")
                self.assertTrue(r.headers.get("allow"), r.headers)

    def test_api_auth(self):
        up = self.up
        path = "/api/2.0/serving-endpoints"
        self.assertApiError(up.api("GET", path, token=None), 401, "UNAUTHENTICATED")
        self.assertApiError(up.api("GET", path, token="flt_admin_" + "0" * 64), 401,
                            "UNAUTHENTICATED")
        self.assertApiError(up.api("GET", path, token="garbage"), 401, "UNAUTHENTICATED")
        self.assertApiError(up.api("GET", path, headers={"Authorization": "Basic eDp5"},
                                   token=None), 401, "UNAUTHENTICATED")
        user = up._ok(up.api("POST", "/api/2.0/tokens", {"id": "user"}), "token")
        self.assertRegex(user["token"], r"^flt_user_")
        self.assertEqual(user["token_info"]["admin"], False)
        self.assertApiError(up.api("GET", path, token=user["token"]), 403, "PERMISSION_DENIED")
        self.assertApiError(up.api("POST", "/api/2.0/tokens", {"id": "x"}, token=user["token"]),
                            403, "PERMISSION_DENIED")
        ops = up._ok(up.api("POST", "/api/2.0/tokens", {"id": "ops", "admin": True}), "token")
        self.assertEqual(up.api("GET", path, token=ops["token"]).status, 200)
        # Token API errors.
        self.assertApiError(up.api("POST", "/api/2.0/tokens", {"id": "ops"}), 409,
                            "RESOURCE_ALREADY_EXISTS", "ops")
        self.assertApiError(up.api("POST", "/api/2.0/tokens", {"id": "t", "colour": 1}), 400,
                            "INVALID_PARAMETER_VALUE", "colour")
        self.assertApiError(up.api("POST", "/api/2.0/tokens", {"endpoints": []}), 400,
                            "INVALID_PARAMETER_VALUE", "id")
        self.assertApiError(up.api("DELETE", "/api/2.0/tokens/never-made"), 404,
                            "RESOURCE_DOES_NOT_EXIST")
        self.assertApiError(up.api("DELETE", "/api/2.0/tokens/ops", token=ops["token"]), 400,
                            "INVALID_PARAMETER_VALUE")
        # Revoked: 401 at once.
        self.assertEqual(up._ok(up.api("DELETE", "/api/2.0/tokens/ops"), "revoke"), {})
        self.assertApiError(up.api("GET", path, token=ops["token"]), 401, "UNAUTHENTICATED")
        ids = [t["id"] for t in up._ok(up.api("GET", "/api/2.0/tokens"), "tokens")["tokens"]]
        self.assertIn("admin", ids)
        self.assertIn("user", ids)
        self.assertNotIn("ops", ids)
        self.assertEqual(up.api("GET", "/health", token=None).status, 200)

    def test_gateway_auth(self):
        up = self.up
        for n in ("ga", "gb"):
            up.create(spec(n, served("v1", CLASSIFIER)))
        for n in ("ga", "gb"):
            up.wait_serving(n)
        scoped = up._ok(up.api("POST", "/api/2.0/tokens", {"id": "only-ga",
                                                            "endpoints": ["ga"]}), "t")["token"]
        every = up._ok(up.api("POST", "/api/2.0/tokens", {"id": "every"}), "t")["token"]
        self.assertEqual(up.invoke("ga", token=scoped).status, 200)
        self.assertEqual(up.invoke("gb", token=every).status, 200)
        self.assertGatewayError(up.invoke("gb", token=scoped), 403)
        self.assertGatewayError(up.invoke("ga", token=None), 401)
        self.assertGatewayError(up.invoke("ga", token="flt_every_" + "1" * 64), 401)
        self.assertEqual(up.gw("GET", "/v2/health/live", token=None).status, 200)
        up._ok(up.api("DELETE", "/api/2.0/tokens/every"), "revoke")
        self.assertGatewayError(up.invoke("ga", token=every), 401)
        self.assertEqual(up.invoke("ga", token=scoped).status, 200)
        for n in ("ga", "gb"):
            up.delete(n)

    def test_corrupt_model_never_ready_then_a_good_spec_recovers(self):
        up, name = self.up, "broken"
        bad = spec(name, served("v1", "corrupt.json"))
        up.create(bad)

        def two_failures(v):
            return sum(r["state"] == "failed" for r in v["replicas"]) >= 2
        view = up.wait_view(name, two_failures, "two failed replicas", deadline_s=20)
        self.assertEqual(view["state"], {"ready": "NOT_READY", "config_update": "IN_PROGRESS"})
        self.assertIsNone(view["config"])
        # The orchestrator's replica list changes before its watchers record the event: the
        # second failure's event may follow the view that shows it by a moment.
        def two_failed_events():
            failed = [e for e in up.events(name) if e["kind"] == "replica_failed"]
            return failed if len(failed) >= 2 else None
        failed = wait_until(two_failed_events, 5, interval_s=0.02, what="two replica_failed events")
        # The event and the replica's reason must say why: the model cannot be loaded, and
        # which one (checked as a subtest so that the recovery below still runs).
        with self.subTest("replica_failed explains"):
            for e in failed:
                self.assertIn("cannot load model", e["message"], e)
                self.assertIn("corrupt.json", e["message"], e)
            for r in view["replicas"]:
                if r["state"] == "failed":
                    self.assertIn("cannot load model", r["reason"], r)
        # Backoff: restarts slow down rather than spin.
        starts = [e["timestamp"] for e in up.events(name) if e["kind"] == "replica_started"]
        self.assertLessEqual(len(starts), 6, starts)

        good = spec(name, served("v2", CLASSIFIER))
        up.put(name, good)
        view = up.wait_serving(name, good, deadline_s=20)
        self.assertEqual(up.invoke(name).status, 200)
        self.assertEqual(label_of(up.invoke(name).body), "classifier")

        def bad_retired(v):
            return all(r["state"] == "failed" for r in v["replicas"] if r["version"] == "v1")
        up.wait_view(name, bad_retired, "no v1 replica restarting", deadline_s=10)
        up.delete(name)


# =========================================================================== 7. CLI

class Cli(ControlTestCase):
    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up()
        cls.cwd = fresh_dir("cli-cwd")   # no .flotilla/admin.token here

    def cli(self, *args, token=_DEFAULT, env=None, deadline_s=CLI_DEADLINE_S):
        argv = [BIN, *args]
        if token is not None:
            argv += ["--api", f"127.0.0.1:{self.up.api_port}",
                     "--token", self.up.token if token is _DEFAULT else token]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=self.cwd,
                             env=dict(os.environ, **(env or {})))
        try:
            out, err = p.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            self.fail(f"{argv} still running after {deadline_s}s: {out!r} {err!r}")
        return subprocess.CompletedProcess(argv, p.returncode, out.decode(), err.decode())

    def assertCliOk(self, p):
        self.assertEqual(p.returncode, 0, f"{p.args}: rc {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p.stdout

    def assertCliFails(self, p, *needles):
        """Non-zero exit, nothing on stdout, exactly one line on stderr holding `needles`."""
        self.assertNotEqual(p.returncode, 0, f"{p.args} succeeded: {p.stdout}")
        self.assertEqual(p.stdout, "", p.args)
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, f"{p.args}: stderr {p.stderr!r}")
        self.assertTrue(lines[0].startswith("flotilla "), lines[0])
        for n in needles:
            self.assertIn(n, lines[0])
        return lines[0]

    def test_cli_round_trip(self):
        up, name = self.up, "cli-e"
        # deploy -f with a model path relative to the spec file (not to the cwd).
        spec_dir = fresh_dir("cli-spec")
        os.symlink(MODELS_DIR, os.path.join(spec_dir, "m"))
        spec_file = harness.write_yaml(spec_dir, "endpoint.yaml", (
            f"name: {name}\n"
            "served_models:\n"
            "  - name: v1\n"
            f"    model: m/{CLASSIFIER}\n"
            "    concurrency: {min: 1, max: 16}\n"))
        out = self.assertCliOk(self.cli("deploy", "-f", spec_file))
        self.assertIn(f"endpoint {name}: serving v1 100% (1/1 ready)", out)
        view = up.view(name)
        self.assertEqual(view["state"]["ready"], "READY")
        self.assertEqual(view["config"]["served_models"][0]["model"],
                         os.path.join(spec_dir, "m", CLASSIFIER))

        out = self.assertCliOk(self.cli("ls"))
        self.assertRegex(out, rf"(?m)^{name}\s+READY\s+NOT_UPDATING\s+v1 100% \(1/1 ready\)")
        got = json.loads(self.assertCliOk(self.cli("get", name, "-o", "json")))
        self.assertEqual((got["name"], got["config"]), (name, view["config"]))
        out = self.assertCliOk(self.cli("get", name))
        self.assertIn(f"endpoint {name}: READY", out)

        out = self.assertCliOk(self.cli("predict", name, "--json",
                                        json.dumps(mlflow_body([IRIS_ROW, [6.7, 3.0, 5.2, 2.3]]))))
        self.assertEqual(json.loads(out), {"predictions": [0, 2]})
        csv = harness.write_yaml(spec_dir, "rows.csv", ",".join(IRIS_FEATURES) + "\n"
                                 "5.1,3.5,1.4,0.2\n6.7,3.0,5.2,2.3\n")
        out = self.assertCliOk(self.cli("predict", name, "--csv", csv))
        self.assertEqual(json.loads(out), {"predictions": [0, 2]})
        # Through the environment instead of flags.
        out = self.assertCliOk(self.cli("predict", name, "--json", json.dumps(mlflow_body()),
                                        token=None,
                                        env={"FLOTILLA_API": f"http://127.0.0.1:{up.api_port}",
                                             "FLOTILLA_TOKEN": up.token}))
        self.assertEqual(json.loads(out), {"predictions": [0]})

        out = self.assertCliOk(self.cli("events", name))
        self.assertRegex(out, r"(?m)^TIME\s+KIND\s+ACTOR\s+MESSAGE")
        for kind in ("created", "replica_started", "replica_ready", "ready"):
            self.assertRegex(out, rf"(?m)^\S+\s+{kind}\s", kind)

        # Update by flags: a new version rolls out, deploy returns once it serves.
        out = self.assertCliOk(self.cli("deploy", "--name", name, "--model",
                                        model_path(PROBA), "--version", "v2"))
        self.assertIn(f"endpoint {name}: serving v2 100% (1/1 ready)", out)
        self.assertEqual(label_of(up.invoke(name).body), "proba")

        # Tokens.
        tok = self.assertCliOk(self.cli("tokens", "create", "--id", "cli-tok",
                                        "--endpoint", name, "--comment", "from the cli")).strip()
        self.assertRegex(tok, r"^flt_cli-tok_\S+$")
        self.assertEqual(up.invoke(name, token=tok).status, 200)
        out = self.assertCliOk(self.cli("tokens", "ls"))
        self.assertRegex(out, rf"(?m)^cli-tok\s+no\s+{name}\s+\S+\s+from the cli$")
        self.assertNotIn(tok.rsplit("_", 1)[1], out, "tokens ls printed a secret")
        self.assertCliOk(self.cli("tokens", "revoke", "cli-tok"))
        self.assertGatewayError(up.invoke(name, token=tok), 401)
        self.assertCliFails(self.cli("tokens", "revoke", "cli-tok"), "cli-tok")

        out = self.assertCliOk(self.cli("rm", name))
        self.assertIn(f"endpoint {name} deleted", out)
        self.assertCliFails(self.cli("get", name), name)

    def test_cli_failures_are_one_line(self):
        up = self.up
        spec_dir = fresh_dir("cli-bad")
        bad = harness.write_yaml(spec_dir, "bad.yaml", (
            "name: cli-bad\nserved_models:\n"
            f"  - {{name: a, model: {model_path(CLASSIFIER)}, traffic: 60}}\n"
            f"  - {{name: b, model: {model_path(PROBA)}, traffic: 30}}\n"))
        self.assertCliFails(self.cli("get", "nope"), "nope")
        self.assertCliFails(self.cli("rm", "nope"), "nope")
        self.assertCliFails(self.cli("events", "nope"), "nope")
        self.assertCliFails(self.cli("deploy", "-f", bad), "traffic sums to 90")
        self.assertCliFails(self.cli("deploy", "-f", os.path.join(spec_dir, "missing.yaml")),
                            "missing.yaml")
        self.assertCliFails(self.cli("deploy", "--name", "x", "--model",
                                     model_path("nope.json")), "does not exist")
        self.assertCliFails(self.cli("deploy", "--name", "x"))
        self.assertCliFails(self.cli("predict", "nope", "--json", json.dumps(mlflow_body())),
                            "404")
        self.assertCliFails(self.cli("predict", "nope"))
        self.assertCliFails(self.cli("ls", token="flt_admin_" + "0" * 64), "invalid token")
        user = up._ok(up.api("POST", "/api/2.0/tokens", {"id": "cli-user"}), "t")["token"]
        self.assertCliFails(self.cli("ls", token=user))
        # Nothing listens on a port this test holds bound.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            self.assertCliFails(self.cli("ls", "--api", f"127.0.0.1:{port}", "--token", "x",
                                         token=None), "cannot reach the control plane")

    def test_cli_deploy_of_a_model_that_cannot_load_says_why(self):
        self.addCleanup(self.up.api, "DELETE", "/api/2.0/serving-endpoints/cli-corrupt")
        line = self.assertCliFails(self.cli("deploy", "--name", "cli-corrupt", "--model",
                                            model_path("corrupt.json"), "--timeout-s", "3"),
                                   "cli-corrupt", "last replica failure")
        self.assertIn("cannot load model", line)


# =========================================================================== 8. shutdown

class ModelServer(http.server.ThreadingHTTPServer):
    """A static HTTP server on 127.0.0.1 (port 0) for model URLs, counting the GETs per path.
    It ignores Range, so a pull is one GET."""
    daemon_threads = True

    def __init__(self, directory):
        gets = collections.Counter()

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=directory, **kwargs)

            def log_message(self, *args):
                pass

            def do_GET(self):
                gets[self.path] += 1
                super().do_GET()

        super().__init__(("127.0.0.1", 0), Handler)
        self.gets = gets
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def url(self, path):
        return f"http://127.0.0.1:{self.server_address[1]}/{path}"


class UrlModels(ControlTestCase):
    """Models given as http:// URLs: each replica pulls into the data directory's cache
    (issue #6); a second replica finds the model there."""

    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up()
        cls.files = tempfile.mkdtemp(dir=_tmp_root)
        shutil.copy(model_path(PROBA), cls.files)
        shutil.copytree(model_path(CLASSIFIER), os.path.join(cls.files, "classifier"))
        r = run_to_exit([FLOTILLA_BIN, "artifact", "pack", os.path.join(cls.files, "classifier")])
        assert r.returncode == 0, r.stderr
        cls.server = ModelServer(cls.files)
        cls.addClassCleanup(cls.server.server_close)
        cls.addClassCleanup(cls.server.shutdown)

    def test_a_file_url_is_pulled_once_for_two_replicas(self):
        up, name = self.up, "remote-file"
        s = spec(name, served("v1", self.server.url(PROBA), concurrency={"min": 32, "max": 64}))
        up.create(s)
        view = up.wait_serving(name, s)
        self.assertEqual(len(ready_replicas(view)), 2)  # 32 / the xgboost default 16
        r = up.invoke(name)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(label_of(r.body), "proba")
        self.assertEqual(self.server.gets["/" + PROBA], 1, self.server.gets)
        blobs = os.listdir(os.path.join(up.data_dir, "cache", "blobs"))
        with open(model_path(PROBA), "rb") as f:
            self.assertIn(hashlib.sha256(f.read()).hexdigest(), blobs)
        up.delete(name)

    def test_a_manifest_url_serves_a_model_directory(self):
        up, name = self.up, "remote-dir"
        url = self.server.url("classifier/flotilla-manifest.json")
        # Through the CLI: a URL in --model is sent as it is (not made a local path).
        p = run_to_exit([FLOTILLA_BIN, "deploy", "--name", name, "--model", url, "--api",
                         f"127.0.0.1:{up.api_port}", "--token", up.token], deadline_s=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(up.view(name)["config"]["served_models"][0]["model"], url)
        r = up.invoke(name)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(label_of(r.body), "classifier")
        up.delete(name)

    def test_a_model_url_that_cannot_be_fetched_fails_the_replica_and_says_why(self):
        up, name = self.up, "remote-missing"
        up.create(spec(name, served("v1", self.server.url("missing.ubj"))))
        view = up.wait_view(name, lambda v: any(r["state"] == "failed" for r in v["replicas"]),
                            "a failed replica", 20)
        reasons = [r["reason"] for r in view["replicas"] if r["state"] == "failed"]
        self.assertTrue(any("cannot fetch model" in x and "HTTP 404" in x for x in reasons),
                        reasons)
        up.delete(name)


    def test_a_replica_that_answers_while_it_loads_shows_as_loading(self):
        # The replica listens before it loads its model (here a synthetic load of 3 s, as a
        # long download would take): the orchestrator sees it answer "not ready" and shows it
        # as loading until it is ready.
        up, name = self.up, "slow-load"
        model = harness.write_yaml(_tmp_root, "synthetic-slow-load.yaml",
                                   "service_time: {dist: fixed, mean_ms: 1}\nload_ms: 3000\n")
        up.create(spec(name, served("v1", model, runtime="synthetic")))
        up.wait_view(name, lambda v: any(r["state"] == "loading" for r in v["replicas"]),
                     "a loading replica", 20)
        up.wait_serving(name)
        self.assertEqual(up.invoke(name).status, 200)
        up.delete(name)


class Shutdown(ControlTestCase):
    NAMES = ("sd-slow", "sd-fast", "sd-stuck")

    def test_sigterm_finishes_in_flight_requests_and_stops_every_replica(self):
        up = self.start_up_for_test()
        slow, fast, stuck = self.NAMES
        up.create(spec(slow, served("v1", synthetic_model(400), runtime="synthetic")))
        up.create(spec(fast, served("v1", CLASSIFIER, concurrency={"min": 32, "max": 64})))
        up.wait_serving(slow)
        up.wait_serving(fast)
        # And one that keeps failing and restarting: nothing of it may survive either.
        up.create(spec(stuck, served("v1", "corrupt.json")))
        up.wait_view(stuck, lambda v: any(r["state"] == "failed" for r in v["replicas"]),
                     "a failed replica", 20)
        replica_pids = [r["pid"] for n in (slow, fast) for r in up.view(n)["replicas"]]
        self.assertEqual(len(replica_pids), 3)
        children = harness.children_of(up.pid)
        self.assertLessEqual(set(replica_pids), set(children))
        self.assertGreater(len(children), 3, "no warm-pool standby running")

        results = {}

        def call(i):
            try:
                results[i] = up.gw("POST", f"/serving-endpoints/{slow}/invocations",
                                   mlflow_body())
            except Exception as e:  # noqa: BLE001  (reported below)
                results[i] = e
        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()

        def in_flight():
            stats = up.gw("GET", "/gateway/stats").json()
            return sum(e["in_flight"] for e in stats["endpoints"] if e["name"] == slow) == 3
        wait_until(in_flight, 5, interval_s=0.01, what="3 requests in flight")
        children = harness.children_of(up.pid)
        for pid in children:
            TRACKER.record(pid)
        t0 = time.monotonic()
        up.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        for i in range(3):
            r = results.get(i)
            self.assertIsInstance(r, harness.Resp, f"request {i} in flight at SIGTERM: {r}")
            self.assertEqual(r.status, 200, r)
        try:
            rc = up.proc.wait(timeout=UP_STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.fail(f"flotilla up still running {UP_STOP_DEADLINE_S}s after SIGTERM\n"
                      f"{up.stderr()}")
        took = time.monotonic() - t0
        up.returncode = rc
        self.assertEqual(rc, 0, up.stderr())
        self.assertLess(took, UP_STOP_DEADLINE_S)

        def ours(argv):
            return any(a == "--name" and b in self.NAMES for a, b in zip(argv, argv[1:]))
        left = sorted(set(p for p in children if not pid_gone(p)) |
                      set(harness.find_processes(ours)))
        self.assertEqual(left, [], f"processes outlived flotilla up: "
                                   f"{[harness.process_cmdline(p) for p in left]}")
        with socket.socket() as s:
            self.assertNotEqual(s.connect_ex(("127.0.0.1", up.gateway_port)), 0,
                                "the gateway still accepts connections")
        with socket.socket() as s:
            self.assertNotEqual(s.connect_ex(("127.0.0.1", up.api_port)), 0,
                                "the API still accepts connections")


# =========================================================================== 9. autoscaler

class Autoscaling(ControlTestCase):
    """The autoscaler's live loop (issue #5) with test-shortened periods and windows:
    decisions every 0.5 s on a 2 s up window and a 4 s down window, the vertical policy every
    second."""
    DOWN_WINDOW_S = 4.0

    @classmethod
    def setUpClass(cls):
        cls.up = cls.start_up("--autoscale-period-ms", "500", "--scale-up-window-ms", "2000",
                              "--scale-down-window-ms", str(int(cls.DOWN_WINDOW_S * 1000)),
                              "--vertical-period-ms", "1000", "--cold-start-timeout-ms", "20000")

    def ready_count(self, view):
        return sum(r["state"] == "ready" for r in view["replicas"])

    def autoscaler_events(self, name):
        return [e for e in self.up.events(name) if e["kind"] == "autoscaler"]

    def test_scales_up_under_stepped_load_then_down_after_the_down_window(self):
        up, name = self.up, "stepped"
        # 50 ms a request and a fixed per-replica target of 4: 16 clients need 4 replicas.
        up.create(spec(name, served("v1", synthetic_model(50), runtime="synthetic",
                                    concurrency={"min": 1, "max": 64},
                                    per_replica_concurrency={"min": 4, "max": 4})))
        up.wait_view(name, lambda v: v["state"]["ready"] == "READY", "ready")

        light = Load(up, name, threads=2, total=100000, deadline_s=60,
                     label=synthetic_label).start()
        self.addCleanup(light.stop)
        light.wait_for(lambda l: l.completed >= 60, "60 light requests")  # 3 s at 2 x 20/s
        light.stop()
        self.assertNoFailures(light, "light load")
        self.assertEqual(self.ready_count(up.view(name)), 1, "2 clients fit in one replica")

        heavy = Load(up, name, threads=16, total=100000, deadline_s=60,
                     label=synthetic_label).start()
        self.addCleanup(heavy.stop)
        up.wait_view(name, lambda v: self.ready_count(v) >= 4, "4 ready replicas under 16 "
                     "clients", deadline_s=20)
        # The load goes on for more than a down window (16 clients x 20 requests/s each at
        # most: 1,600 requests take at least 5 s): nothing scales down meanwhile.
        completed = heavy.count()
        heavy.wait_for(lambda l: l.completed >= completed + 1600, "1,600 more requests")
        self.assertGreaterEqual(self.ready_count(up.view(name)), 4)
        heavy.stop()
        stopped = time.time()
        self.assertNoFailures(heavy, "heavy load while scaling up")
        ups = [e for e in self.autoscaler_events(name) if "-> " in e["message"] and
               "horizontal" in e["message"] and " up:" in e["message"]]
        self.assertTrue(ups, self.autoscaler_events(name))

        up.wait_view(name, lambda v: self.ready_count(v) == 1 and len(v["replicas"]) == 1,
                     "back to one replica", deadline_s=30)
        downs = [e for e in self.autoscaler_events(name) if " down:" in e["message"]]
        self.assertTrue(downs, self.autoscaler_events(name))
        # Nothing goes below what the load needed (4) before the whole down window asked for
        # fewer replicas: the last busy sample ends at most 1 s after the load stopped. (A
        # step down to 4 from an overshoot may come at any time.)
        below = [e for e in downs
                 if int(re.search(r"-> (\d+) replicas", e["message"]).group(1)) < 4]
        self.assertTrue(below, downs)
        first_down_s = below[0]["timestamp"] / 1000.0 - stopped
        self.assertGreaterEqual(first_down_s, self.DOWN_WINDOW_S - 1.0, downs)

    def test_vertical_target_converges_near_the_saturation_point(self):
        up, name = self.up, "learned"
        saturation = 12
        # Latency is flat up to 12 requests in flight per replica and grows in proportion
        # beyond; the target starts at the synthetic runtime's default, 8.
        # The bounds leave room to probe past it (the curve counts as known above from 90% of
        # the max, 18).
        up.create(spec(name, served("v1", synthetic_model(50, saturation), runtime="synthetic",
                                    concurrency={"min": 1, "max": 24},
                                    per_replica_concurrency={"min": 1, "max": 20})))
        up.wait_view(name, lambda v: v["state"]["ready"] == "READY", "ready")
        self.assertEqual(up.view(name)["autoscaler"]["target_concurrency"], 8)
        load = Load(up, name, threads=40, total=1000000, deadline_s=120,
                    label=synthetic_label).start()
        self.addCleanup(load.stop)
        # The band: the knee (90% of the best throughput: 10.8 here) read off a flat plateau
        # moves with the noise on it; on a loaded host (tests in parallel, ASan) the policy's
        # estimate was seen at 15 (1.25x).
        band = 0.3 * saturation

        seen = {"target": None, "since": 0.0}

        def settled(v):
            # Past the probes (which pass through the band on their way up): the last move took
            # the target to the knee of the curve it learned, or an overload cut it, and it has
            # held for two vertical periods. (Any such move in the history was taken once: an
            # overload cut to 15 was followed by a move up to a noisy knee at 16.7, under ASan.)
            target = v["autoscaler"]["target_concurrency"]
            now = time.monotonic()
            if target != seen["target"]:
                seen.update(target=target, since=now)
            vertical = [e["message"] for e in self.autoscaler_events(name)
                        if "vertical" in e["message"]]
            return abs(target - saturation) <= band and bool(vertical) and \
                ("to the knee" in vertical[-1] or "overload" in vertical[-1]) and \
                now - seen["since"] >= 2.0
        up.wait_view(name, settled, "a target within 30% of the saturation point",
                     deadline_s=90)
        # It stays there: three more vertical periods.
        time.sleep(3)  # the condition below must hold after them, not be waited for
        target = up.view(name)["autoscaler"]["target_concurrency"]
        load.stop()
        self.assertNoFailures(load, "load while learning")
        self.assertLessEqual(abs(target - saturation), band,
                             [e["message"] for e in self.autoscaler_events(name)])

    def test_vertical_target_falls_when_requests_queue_inside_replicas(self):
        up, name = self.up, "queueing"
        # Each replica serves 6 requests at once and queues the rest inside; at the starting
        # target of 8, 2 wait in each replica and latency is 50 x 8/6 = 67 ms, 1.33x the
        # 50 ms a request takes: under the latency threshold (1.5x), so only the replicas'
        # queue (flotilla_replica_queue_wait_seconds_total, read by the control plane) shows
        # the overload. Without it the target would rise (67 ms would be the baseline).
        model = harness.write_yaml(_tmp_root, "synthetic-queueing.yaml",
                                   "service_time: {dist: fixed, mean_ms: 50}\n"
                                   "max_concurrency: 6\nseed: 1\n")
        up.create(spec(name, served("v1", model, runtime="synthetic",
                                    concurrency={"min": 1, "max": 16},
                                    per_replica_concurrency={"min": 1, "max": 8})))
        up.wait_view(name, lambda v: v["state"]["ready"] == "READY", "ready")
        self.assertEqual(up.view(name)["autoscaler"]["target_concurrency"], 8)
        load = Load(up, name, threads=24, total=1000000, deadline_s=60,
                    label=synthetic_label).start()
        self.addCleanup(load.stop)

        def queue_events():
            return [e["message"] for e in self.autoscaler_events(name)
                    if "vertical: target 8.00 ->" in e["message"]]
        up.wait_view(name, lambda v: queue_events(), "the target lowered from 8",
                     deadline_s=30)
        load.stop()
        self.assertNoFailures(load, "load while queueing")
        first = queue_events()[0]
        self.assertIn("overload", first)
        queued = float(re.search(r"queued ([0-9.]+)", first).group(1))
        self.assertGreaterEqual(queued, 1.0, first)

    def test_learned_target_survives_a_restart(self):
        flags = ("--autoscale-period-ms", "500", "--vertical-period-ms", "1000")
        data_dir = fresh_dir("learned-restart")
        up, name = self.start_up_for_test(*flags, data_dir=data_dir), "remembered"
        # Latency grows past 2 requests in flight: under 16 clients the target (8 at first)
        # falls by 25% a vertical period.
        up.create(spec(name, served("v1", synthetic_model(50, 2), runtime="synthetic",
                                    concurrency={"min": 1, "max": 16},
                                    per_replica_concurrency={"min": 1, "max": 32})))
        up.wait_view(name, lambda v: v["state"]["ready"] == "READY", "ready")
        # One client first, for the vertical policy's latency baseline (50 ms).
        light = Load(up, name, threads=1, total=1000000, deadline_s=60,
                     label=synthetic_label).start()
        self.addCleanup(light.stop)
        light.wait_for(lambda l: l.completed >= 50, "50 requests of one client")  # 2.5 s
        light.stop()
        load = Load(up, name, threads=16, total=1000000, deadline_s=60,
                    label=synthetic_label).start()
        self.addCleanup(load.stop)
        up.wait_view(name, lambda v: v["autoscaler"]["target_concurrency"] <= 4.5,
                     "the target lowered twice", deadline_s=30)
        load.stop()
        self.assertNoFailures(light, "one client")
        self.assertNoFailures(load, "load while learning")
        # With no load, no vertical decision moves it any more.
        time.sleep(1.5)
        learned = up.view(name)["autoscaler"]["target_concurrency"]
        up.stop()

        again = self.start_up_for_test(*flags, data_dir=data_dir)
        view = again.wait_view(name, lambda v: v["state"]["ready"] == "READY", "ready again")
        self.assertAlmostEqual(view["autoscaler"]["target_concurrency"], learned, places=6)

    def test_scale_to_zero_holds_the_first_request_until_a_replica_is_ready(self):
        up, name = self.up, "idle"
        up.create(spec(name, served("v1", synthetic_model(5), runtime="synthetic",
                                    concurrency={"min": 0, "max": 8}, scale_to_zero=True)))
        up.wait_view(name, lambda v: v["state"]["ready"] == "READY", "ready")
        up.wait_view(name, lambda v: not v["replicas"], "scaled to zero",
                     deadline_s=self.DOWN_WINDOW_S + 20)
        t0 = time.monotonic()
        r = up.gw("POST", f"/serving-endpoints/{name}/invocations", {"instances": [[1.0]]})
        self.assertEqual(r.status, 200, r)
        held_s = time.monotonic() - t0
        events = [e["message"] for e in self.autoscaler_events(name)]
        self.assertTrue(any("scale from zero" in m for m in events), events)
        self.assertLess(held_s, 20, "held for the cold start only")

    def test_scale_from_zero_that_never_gets_ready_is_503(self):
        up = self.start_up_for_test("--cold-start-timeout-ms", "1500", "--autoscale-period-ms",
                                    "500", "--scale-down-window-ms", "2000")
        name = "never"
        broken = harness.write_yaml(_tmp_root, "synthetic-broken.yaml",
                                    "service_time: {dist: nonsense}\n")
        up.create(spec(name, served("v1", broken, runtime="synthetic",
                                    concurrency={"min": 0, "max": 8}, scale_to_zero=True)))
        r = up.gw("POST", f"/serving-endpoints/{name}/invocations", {"instances": [[1.0]]})
        self.assertIn(name, self.assertGatewayError(r, 503))



# =========================================================================== issue 18

class GatewayIssue18(ControlTestCase):
    """Issue 18 at the gateway of `flotilla up`. Item 1: kill -9 of the only replica of an
    endpoint under load; the requests it held and those arriving before its replacement is
    ready wait in the gateway (retried, then queued with the cold-start deadline) instead of
    failing with 502. Item 6: invalid UTF-8 in the target on the API and gateway ports."""

    def test_sole_replica_killed_under_load_no_request_fails(self):
        up, name = self.start_up_for_test(), "sole"
        s = spec(name, served("v1", CLASSIFIER, concurrency={"min": 1, "max": 8}))
        up.create(s)
        view = up.wait_serving(name, s)
        pids = ready_replicas(view)
        self.assertEqual(len(pids), 1, view["replicas"])
        (victim_id, victim_pid), = pids.items()
        load = Load(up, name, threads=8, deadline_s=30).start()
        self.addCleanup(load.stop)
        load.wait_for(lambda ld: ld.count() >= 200, "load running")
        ticks = harness.process_start_ticks(victim_pid)
        self.assertTrue(harness.signal_alive(victim_pid, signal.SIGKILL, ticks))

        def replaced(v):
            return any(r["state"] == "ready" and r["id"] != victim_id for r in v["replicas"])
        up.wait_view(name, replaced, "a replacement replica ready", deadline_s=10)
        seen = load.count()
        load.wait_for(lambda ld: ld.count() >= seen + 300, "load on the replacement")
        load.stop()
        self.assertNoFailures(load, "kill -9 of the sole replica")
        up.delete(name)

    def test_invalid_utf8_in_the_target_is_a_json_error_on_both_ports(self):
        # issue 18 item 6: the gateway answered these 500 "request handler threw"
        up = self.start_up_for_test()
        for port, path in ((up.api_port, b"/\xff"),
                           (up.api_port, b"/api/2.0/serving-endpoints/\xff"),
                           (up.api_port, b"/api/2.0/serving-endpoints/\xff/events"),
                           (up.gateway_port, b"/\xff"),
                           (up.gateway_port, b"/serving-endpoints/\xff/invocations"),
                           (up.gateway_port, b"/v2/models/\xff/infer")):
            with self.subTest(port=port, path=path):
                c = harness.RawConn(port)
                try:
                    c.send(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                           b"Authorization: Bearer " + up.token.encode() + b"\r\n\r\n{}")
                    r = c.read_response()
                finally:
                    c.close()
                self.assertIn(r.status, (400, 404, 405), r)
                self.assertIsInstance(r.json(), dict, r)  # valid JSON, hence valid UTF-8
        self.assertNotIn("request handler threw", up.stderr())



# =========================================================================== issue 18: 3, 4, 5, 10, 13

def marked_processes(data_dir):
    """Pids of live processes that `flotilla up --data-dir data_dir` started, whatever became of
    the `flotilla up` that started them: those with its marker (FLOTILLA_INSTANCE=<data dir>
    in /proc/PID/environ) or whose stdout is a log file in <data dir>/logs (every replica and
    standby, with or without the marker)."""
    marker = b"FLOTILLA_INSTANCE=" + os.fsencode(data_dir)
    logs = os.path.join(data_dir, "logs") + os.sep
    out = []
    for pid in harness.list_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                marked = marker in f.read().split(b"\0")
        except OSError:
            marked = False
        try:
            marked = marked or os.readlink(f"/proc/{pid}/fd/1").startswith(logs)
        except OSError:
            pass
        if marked and harness.process_start_ticks(pid) is not None:
            out.append(pid)
    return out


def kill_marked(data_dir):
    """Teardown: SIGKILL whatever still carries the data directory's marker."""
    for pid in marked_processes(data_dir):
        TRACKER.record(pid)
    TRACKER.kill_all()


class Orphans(ControlTestCase):
    """Issue 18, item 3: kill -9 of `flotilla up` must leave no process that nobody stops."""

    def test_kill9_during_scale_ups_then_restart_and_rm_leaves_only_up(self):
        data_dir = os.path.join(fresh_dir("orphans"), "data")
        self.addCleanup(kill_marked, data_dir)
        one = {"min": 1, "max": 1}
        for i in range(5):
            up = self.start_up_for_test("--no-autoscale", data_dir=data_dir)
            if i > 0:
                up.delete(f"e{i - 1}")  # its replicas drain while the next ones start
            up.create(spec(f"e{i}", served("v1", CLASSIFIER, concurrency={"min": 3, "max": 3},
                                           per_replica_concurrency=one)))
            # Kill at a different point of the scale-up each time: at once (replicas being
            # spawned, their rows not yet written), or once 1 or 2 more children run.
            if i % 3:
                try:
                    wait_until(lambda: len(harness.children_of(up.pid)) >= 1 + i % 3, 5,
                               interval_s=0.005, what="children")
                except AssertionError:
                    pass
            up.kill9()
        final = self.start_up_for_test("--no-autoscale", "--warm-pool", "0", data_dir=data_dir)
        names = [e["name"] for e in
                 final._ok(final.api("GET", "/api/2.0/serving-endpoints"), "list")["endpoints"]]
        self.assertEqual(names, ["e4"])
        for name in names:
            final.delete(name)
        left = []

        def only_up():
            left[:] = [(p, harness.process_cmdline(p)) for p in marked_processes(data_dir)
                       if p != final.pid]
            return not left
        try:
            wait_until(only_up, 30, interval_s=0.1, what="no process but flotilla up")
        except AssertionError:
            raise AssertionError(f"left running: {left}\nstderr of flotilla up:\n"
                                 f"{final.stderr()}") from None
        self.assertTrue(final.alive())


class HungReplicas(ControlTestCase):
    """Issue 18, item 4: a ready replica that stops answering (SIGSTOP) is replaced."""
    LIVENESS_TIMEOUT_S = 2.0

    def test_a_stopped_replica_is_replaced_and_requests_keep_succeeding(self):
        up = self.start_up_for_test("--no-autoscale", "--liveness-timeout-ms",
                                    str(int(self.LIVENESS_TIMEOUT_S * 1000)))
        name = "hung"
        up.create(spec(name, served("v1", CLASSIFIER, concurrency={"min": 32, "max": 64})))
        view = up.wait_serving(name)
        pids = ready_replicas(view)
        self.assertEqual(len(pids), 2, view)
        victim_id, victim = sorted(pids.items())[0]
        load = self.start_load(up, name)
        load.wait_for(lambda l: l.completed >= 200, "200 requests before the hang")
        os.kill(victim, signal.SIGSTOP)
        self.addCleanup(lambda: pid_gone(victim) or os.kill(victim, signal.SIGKILL))
        stopped_at = time.monotonic()

        def replaced(v):
            ready = ready_replicas(v)
            return len(ready) == 2 and victim_id not in ready
        up.wait_view(name, replaced, "the hung replica replaced", deadline_s=30)
        replaced_s = time.monotonic() - stopped_at
        wait_until(lambda: pid_gone(victim), 10, what="the hung replica killed")
        hung = [e for e in up.events(name) if e["kind"] == "replica_hung"]
        self.assertEqual(len(hung), 1, up.events(name, 30))
        m = re.match(re.escape(victim_id) + r": hung: no liveness answer in ([0-9.]+) s; replaced$",
                     hung[0]["message"])
        self.assertTrue(m, hung[0])
        self.assertGreaterEqual(float(m.group(1)), self.LIVENESS_TIMEOUT_S)
        # The bound is the timeout plus one probe interval and the replacement's start; a
        # loaded test machine gets generous slack.
        self.assertLess(replaced_s, self.LIVENESS_TIMEOUT_S + 15, "replaced within the bound")
        done = load.count()
        load.wait_for(lambda l: l.completed >= done + 500, "500 requests after the replacement")
        load.stop()
        # The requests in flight on the hung replica fail over once it is killed: the gateway
        # retries a request whose upstream failed before any response byte (issue 18 item 1).
        self.assertEqual(load.failures, [], f"failures: {load.failures[:5]}")


class ReplicaCap(ControlTestCase):
    """Issue 18, item 5: `flotilla up --max-replicas` bounds replica processes host-wide."""

    def test_a_spec_past_the_cap_is_refused(self):
        up = self.start_up_for_test("--max-replicas", "3")
        huge = spec("huge", served("v1", CLASSIFIER, concurrency={"min": 100000, "max": 100000},
                                   per_replica_concurrency={"min": 1, "max": 1}))
        j = self.assertApiError(up.api("POST", "/api/2.0/serving-endpoints", huge), 400,
                                "INVALID_PARAMETER_VALUE", "served_models[0].concurrency.min")
        self.assertIn("cap of 3 replicas (flotilla up --max-replicas)", j["message"])
        self.assertEqual(up.api("GET", "/api/2.0/serving-endpoints/huge").status, 404)
        # An update past the cap is refused too, and changes nothing.
        small = spec("small", served("v1", CLASSIFIER))
        up.create(small)
        self.assertApiError(up.api("PUT", "/api/2.0/serving-endpoints/small/config",
                                   {"served_models": huge["served_models"]}), 400,
                            "INVALID_PARAMETER_VALUE", "cap of 3")
        self.assertEqual(up.wait_serving("small")["config"], canonical(small))

    def test_the_autoscaler_is_held_at_the_cap(self):
        data_dir = fresh_dir("cap")
        self.addCleanup(kill_marked, data_dir)
        up = self.start_up_for_test("--max-replicas", "3", "--warm-pool", "0",
                                    "--autoscale-period-ms", "500", "--scale-up-window-ms", "2000",
                                    data_dir=data_dir)
        name = "wide"
        # One request at a time per replica, 50 ms each: 8 clients ask for 8 replicas.
        up.create(spec(name, served("v1", synthetic_model(50), runtime="synthetic",
                                    concurrency={"min": 1, "max": 64},
                                    per_replica_concurrency={"min": 1, "max": 1})))
        up.wait_serving(name)
        load = Load(up, name, threads=8, total=1000000, deadline_s=60,
                    label=synthetic_label).start()
        self.addCleanup(load.stop)
        most = [0]

        def capped():
            most[0] = max(most[0], len([p for p in marked_processes(data_dir) if p != up.pid]))
            return any(e["kind"] == "replicas_capped" for e in up.events(name))
        wait_until(capped, 30, interval_s=0.05, what="the cap reported")
        view = up.wait_view(name, lambda v: self.ready_count(v) == 3, "3 replicas ready")
        self.assertGreaterEqual(view["autoscaler"]["replicas"], 4, "the autoscaler wants more")
        # Several autoscaler periods at the cap: never more processes, one event.
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:
            capped()
        load.stop()
        self.assertNoFailures(load, "load at the cap")
        self.assertLessEqual(most[0], 3, "replica processes past --max-replicas 3")
        events = [e for e in up.events(name) if e["kind"] == "replicas_capped"]
        self.assertEqual(len(events), 1, events)
        self.assertIn("host-wide cap of 3", events[0]["message"])
        metrics = up.api("GET", "/metrics").body.decode()
        self.assertRegex(metrics, r"(?m)^flotilla_replicas_capped_total [1-9]")

    @staticmethod
    def ready_count(view):
        return sum(r["state"] == "ready" for r in view["replicas"])


class AdminTokenFile(ControlTestCase):
    """Issue 18, item 10: the admin token's file, its data directory, and the way back in."""

    def token_rows(self, data_dir):
        db = sqlite3.connect(f"file:{os.path.join(data_dir, 'state.db')}?mode=ro", uri=True)
        try:
            return db.execute("SELECT id FROM tokens").fetchall()
        finally:
            db.close()

    def test_a_failed_token_write_commits_no_row(self):
        data_dir = fresh_dir("token-fail")
        os.mkdir(os.path.join(data_dir, "admin.token"))  # the file cannot be created
        argv = [BIN, "up", "--data-dir", data_dir, "--gateway-addr", "127.0.0.1:0",
                "--api-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--warm-pool", "0"]
        p = run_to_exit(argv, deadline_s=20)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("admin.token", p.stderr.decode())
        self.assertEqual(self.token_rows(data_dir), [], "a token row nobody holds")
        os.rmdir(os.path.join(data_dir, "admin.token"))
        up = self.start_up_for_test("--warm-pool", "0", data_dir=data_dir)
        self.assertEqual(up.api("GET", "/api/2.0/serving-endpoints").status, 200)

    def test_modes_and_recovery_of_a_lost_admin_token(self):
        data_dir = os.path.join(fresh_dir("token"), "new", "data")  # made by flotilla up
        token_path = os.path.join(data_dir, "admin.token")
        up = self.start_up_for_test("--warm-pool", "0", data_dir=data_dir)
        self.assertEqual(oct(os.stat(data_dir).st_mode & 0o777), "0o700")
        self.assertEqual(oct(os.stat(token_path).st_mode & 0o777), "0o600")
        first = up.token
        self.assertEqual(up.stop(), 0)

        # Lost: the next start says how to recover.
        os.unlink(token_path)
        proc = subprocess.Popen([BIN, "up", "--data-dir", data_dir, "--gateway-addr",
                                 "127.0.0.1:0", "--api-addr", "127.0.0.1:0", "--grpc-addr",
                                 "127.0.0.1:0", "--warm-pool", "0"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        self.addCleanup(lambda: proc.poll() is not None or proc.kill())
        err = b""
        deadline = time.monotonic() + UP_STARTUP_DEADLINE_S
        while b"reset-admin" not in err and time.monotonic() < deadline:
            r, _, _ = select.select([proc.stderr], [], [], 0.2)
            if r:
                chunk = os.read(proc.stderr.fileno(), 4096)
                if not chunk:
                    break
                err += chunk
        self.assertIn(f"flotilla tokens reset-admin --data-dir {data_dir}".encode(), err)
        # While it runs, the reset is refused and changes nothing.
        p = run_to_exit([BIN, "tokens", "reset-admin", "--data-dir", data_dir], deadline_s=10)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("in use", p.stderr.decode())
        self.assertFalse(os.path.exists(token_path))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=UP_STOP_DEADLINE_S)
        proc.stderr.close()

        p = run_to_exit([BIN, "tokens", "reset-admin", "--data-dir", data_dir], deadline_s=10)
        self.assertEqual(p.returncode, 0, p.stderr)
        new = p.stdout.decode().strip()
        self.assertTrue(new.startswith("flt_admin_"), new)
        self.assertEqual(oct(os.stat(token_path).st_mode & 0o777), "0o600")
        again = self.start_up_for_test("--warm-pool", "0", data_dir=data_dir)
        self.assertEqual(again.token, new)
        self.assertEqual(again.api("GET", "/api/2.0/serving-endpoints").status, 200)
        self.assertEqual(again.api("GET", "/api/2.0/serving-endpoints", token=first).status, 401)


class IdleAutoscaler(ControlTestCase):
    """Issue 18, item 13: the vertical policy lowered an idle xgboost endpoint's target on
    latency noise (0.2 ms vs a 0.1 ms baseline). "5 min idle and 5 min at 10% load never lower
    the target": at the default 30 s vertical period those are 10 + 10 decision cycles; here
    --vertical-period-ms 1000 runs the same 20 cycles in about 20 s."""
    CYCLES = 10

    def test_idle_and_light_load_never_lower_the_target(self):
        up = self.start_up_for_test("--vertical-period-ms", "1000", "--autoscale-period-ms", "1000")
        name = "quiet"
        up.create(spec(name, served("v1", CLASSIFIER)))
        up.wait_serving(name)
        start = up.view(name)["autoscaler"]["target_concurrency"]
        self.assertEqual(start, 16)
        # Nearly idle: a request now and then (about 4 per vertical cycle).
        t_end = time.monotonic() + self.CYCLES
        while time.monotonic() < t_end:
            self.assertEqual(up.invoke(name).status, 200)
            time.sleep(0.25)  # pacing the load, not waiting for a condition
        # About 10% of the target: 2 closed-loop clients against 16 in flight per replica.
        load = Load(up, name, threads=2, total=1000000, deadline_s=self.CYCLES + 30)
        load.start()
        self.addCleanup(load.stop)
        time.sleep(self.CYCLES)  # pacing: the load runs for CYCLES vertical periods
        load.stop()
        self.assertNoFailures(load, "light load")
        lowered = []
        for e in up.events(name):
            m = re.match(r"vertical: target ([0-9.]+) -> ([0-9.]+)", e["message"])
            if m and float(m.group(2)) < float(m.group(1)):
                lowered.append(e["message"])
        self.assertEqual(lowered, [], "the target fell on an idle or lightly loaded endpoint")
        self.assertGreaterEqual(up.view(name)["autoscaler"]["target_concurrency"], start)


# =========================================================================== issue 18, item 12

class MetricsAndStatsByScope(ControlTestCase):
    """/metrics on both ports and the gateway's /gateway/stats need a token: any valid one sees
    everything, one scoped to endpoints sees only their series and stats; `--open-routes
    metrics` opens /metrics (both ports) for a local Prometheus, and nothing else."""

    @classmethod
    def setUpClass(cls):
        cls.up = up = cls.start_up()
        for n in ("mine", "theirs"):
            up.create(spec(n, served("v1", CLASSIFIER)))
        for n in ("mine", "theirs"):
            up.wait_serving(n)
            assert up.invoke(n).status == 200
        cls.scoped = up._ok(up.api("POST", "/api/2.0/tokens",
                                   {"id": "scoped", "endpoints": ["mine"]}), "token")["token"]
        cls.every = up._ok(up.api("POST", "/api/2.0/tokens", {"id": "every"}), "token")["token"]

    def metrics(self, port_name, token):
        call = self.up.api if port_name == "API" else self.up.gw
        return call("GET", "/metrics", token=token)

    def assertPromtool(self, text):
        ok, output = harness.promtool_check_metrics(text)
        self.assertTrue(ok, f"promtool check metrics failed:\n{output}\n{text[:2000]}")

    def test_metrics_need_a_token_on_both_ports(self):
        for port_name in ("API", "gateway"):
            with self.subTest(port=port_name):
                self.assertEqual(self.metrics(port_name, None).status, 401)
                self.assertEqual(self.metrics(port_name, "flt_every_" + "1" * 64).status, 401)
                self.assertEqual(self.metrics(port_name, "garbage").status, 401)

    def test_a_token_for_every_endpoint_sees_every_series(self):
        for port_name in ("API", "gateway"):
            for token in (self.up.token, self.every):
                with self.subTest(port=port_name, admin=token == self.up.token):
                    r = self.metrics(port_name, token)
                    self.assertEqual(r.status, 200, r)
                    text = r.body.decode()
                    self.assertPromtool(text)
                    samples = harness.parse_metrics(text)
                    endpoints = {dict(labels).get("endpoint") for _, labels in samples}
                    self.assertLessEqual({"mine", "theirs"}, endpoints)
                    self.assertIn("process_open_fds", {name for name, _ in samples})

    def test_a_scoped_token_sees_only_its_endpoints_series(self):
        for port_name in ("API", "gateway"):
            with self.subTest(port=port_name):
                r = self.metrics(port_name, self.scoped)
                self.assertEqual(r.status, 200, r)
                text = r.body.decode()
                self.assertPromtool(text)
                self.assertFalse("theirs" in text, "another endpoint's series")
                samples = harness.parse_metrics(text)
                self.assertTrue(samples, "nothing of its own endpoint")
                self.assertEqual({dict(labels).get("endpoint") for _, labels in samples},
                                 {"mine"}, "only series labelled with its endpoint")
                names = {name for name, _ in samples}
                self.assertIn("flotilla_gateway_requests_total", names)

    def test_stats_by_scope(self):
        up = self.up
        self.assertEqual(up.gw("GET", "/gateway/stats", token=None).status, 401)
        self.assertEqual(up.gw("GET", "/gateway/stats", token="flt_x_" + "0" * 64).status, 401)
        for token, names in ((up.token, ["mine", "theirs"]), (self.every, ["mine", "theirs"]),
                             (self.scoped, ["mine"])):
            r = up.gw("GET", "/gateway/stats", token=token)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(sorted(e["name"] for e in r.json()["endpoints"]), names)
            self.assertEqual(token == self.scoped, "theirs" not in r.body.decode())

    def test_open_routes_metrics_opens_metrics_on_both_ports_and_nothing_else(self):
        up = self.start_up_for_test("--open-routes", "health", "metrics")
        for port_name, call in (("API", up.api), ("gateway", up.gw)):
            with self.subTest(port=port_name):
                r = call("GET", "/metrics", token=None)
                self.assertEqual(r.status, 200, r)
                self.assertPromtool(r.body.decode())
        self.assertEqual(up.gw("GET", "/gateway/stats", token=None).status, 401)
        self.assertEqual(up.api("GET", "/api/2.0/serving-endpoints", token=None).status, 401)
        up.stop()


if __name__ == "__main__":
    unittest.main()
