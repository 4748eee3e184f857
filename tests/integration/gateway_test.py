#!/usr/bin/python3
"""Black-box integration tests for `flotilla gateway` (contract: src/gateway/gateway.h,
flags: src/cli/gateway_command.cc, docs/gateway.md).

Every test starts real processes on 127.0.0.1 with kernel-chosen ports: the gateway
(`--listen 127.0.0.1:0`), `flotilla replica --runtime synthetic` replicas (`--port 0`, fixed
service times from a YAML model) and, where a test must see what the gateway sent upstream,
tests/integration/echo_upstream.py (a stand-in for the LLM runtime, which does not exist
yet). The gateway's endpoint table is a YAML file it watches (`--config-poll-ms 100`); tests
rewrite it atomically and wait, through /gateway/stats, until the gateway has applied it.

Run from the repository root, with Debian's interpreter:

    FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 -m unittest -v tests/integration/gateway_test.py

No test waits with a bare sleep for a condition: everything polls with a deadline. Load is
bounded in requests and in time. Every process is stopped by the test that started it.
"""

import collections
import gzip
import http.client
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (tests/integration/harness.py: the generic helpers)
from harness import (FLOTILLA_BIN, HTTP_TIMEOUT_S, RawConn, parse_metrics,  # noqa: E402
                     promtool_check_metrics, raw_request, req, run_to_exit, wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
ECHO_UPSTREAM = os.path.join(HERE, "echo_upstream.py")
PYTHON = "/usr/bin/python3"

APPLY_DEADLINE_S = 5.0      # a rewritten config is polled every 100 ms
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

_tmp_root = None


def setUpModule():
    global _tmp_root
    harness.require_binary("gateway_test.py")
    _tmp_root = tempfile.mkdtemp(prefix="flotilla-gateway-test-")


def tearDownModule():
    if _tmp_root:
        shutil.rmtree(_tmp_root, ignore_errors=True)


def fresh_dir():
    return tempfile.mkdtemp(dir=_tmp_root)


# --------------------------------------------------------------------------- upstreams

def synthetic_model(mean_ms, dist="fixed"):
    """A synthetic model file: every request waits `mean_ms` (no CPU burned, no saturation)."""
    return harness.write_yaml(_tmp_root, f"synthetic-{dist}-{mean_ms}.yaml",
                              f"service_time: {{dist: {dist}, mean_ms: {mean_ms}}}\n"
                              "cpu_us: 0\nsaturation: 100000\nseed: 1\n")


def start_replica(owner, name, mean_ms, *flags, cls_level=False):
    """A `flotilla replica` on the synthetic runtime serving model `name`."""
    return harness.start_process(
        owner, [FLOTILLA_BIN, "replica", "--model", synthetic_model(mean_ms),
                "--runtime", "synthetic", "--name", name, "--host", "127.0.0.1",
                "--port", "0", "--workers", "1", *flags], cls_level=cls_level)


def start_echo(owner, cls_level=False):
    return harness.start_process(owner, [PYTHON, ECHO_UPSTREAM, "--port", "0"],
                                 cls_level=cls_level)


def replica_own_requests(replica, route="infer"):
    """Requests a replica answered on `route`, by its own /metrics."""
    samples = parse_metrics(req(replica.port, "GET", "/metrics").body.decode())
    return sum(v for (n, labels), v in samples.items()
               if n == "flotilla_replica_requests_total" and dict(labels).get("route") == route)


def replica_own_in_flight(replica):
    """The replica's in-flight gauge; it counts the scrape itself, hence the - 1."""
    samples = parse_metrics(req(replica.port, "GET", "/metrics").body.decode())
    return samples[("flotilla_replica_in_flight_requests", frozenset())] - 1


class RefusingPort:
    """A kernel-chosen 127.0.0.1 port that refuses connections: bound, never listening, so
    no other process can take it while the test holds it. release() frees it for a server
    the test starts on it."""

    def __init__(self, owner):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        owner.addCleanup(self.release)

    def release(self):
        self.sock.close()


def open_connections(server):
    """How many TCP connections a server process holds open (Linux /proc): its socket
    descriptors less the listener."""
    fd_dir = f"/proc/{server.proc.pid}/fd"
    sockets = 0
    for fd in os.listdir(fd_dir):
        try:
            sockets += os.readlink(os.path.join(fd_dir, fd)).startswith("socket:")
        except OSError:
            pass   # closed while we looked
    return sockets - 1


def wait_connections_closed(replica):
    """Waits until `replica` (started with a short --idle-timeout-ms) has closed every
    connection, the gateway's pooled keep-alive ones included."""
    wait_until(lambda: open_connections(replica) == 0, 5, interval_s=0.01,
               what="the replica to close its idle keep-alive connections")


# --------------------------------------------------------------------------- config

def rep(rid, server, cap=None, state=None):
    """One replica entry of the endpoint table; `server` a harness.Server or "host:port"."""
    entry = {"id": rid, "address": server if isinstance(server, str) else server.address}
    if cap is not None:
        entry["max_in_flight"] = cap
    if state is not None:
        entry["state"] = state
    return entry


def ver(name, replicas, traffic=100, runtime=None, max_model_len=None):
    v = {"name": name, "traffic": traffic, "replicas": replicas}
    if runtime is not None:
        v["runtime"] = runtime
    if max_model_len is not None:
        v["max_model_len"] = max_model_len
    return v


def config_yaml(endpoints, token_records=(), open_routes=None, inference_tables=None):
    """The gateway's YAML config. `endpoints`: {name: [versions]}. `token_records`: the
    record lines printed by `flotilla gateway mint-token`, inserted verbatim under
    auth.tokens. An `auth:` section is written when either auth argument is given.
    `inference_tables`: {name: its inference_table mapping}."""
    lines = ["endpoints:"]
    for name, versions in endpoints.items():
        lines += [f"  - name: {json.dumps(name)}"]
        if name in (inference_tables or {}):
            lines += [f"    inference_table: {json.dumps(inference_tables[name])}"]
        lines += ["    versions:"]
        for v in versions:
            lines += [f"      - name: {json.dumps(v['name'])}",
                      f"        traffic: {v['traffic']}"]
            lines += [f"        {k}: {json.dumps(v[k])}" for k in ("runtime", "max_model_len")
                      if k in v]
            lines += ["        replicas:"]
            lines += [f"          - {json.dumps(r)}" for r in v["replicas"]]
    if token_records or open_routes is not None:
        lines += ["auth:", "  tokens:"]
        lines += [f"    - {record}" for record in token_records]
        if open_routes is not None:
            lines.append(f"  open_routes: {json.dumps(list(open_routes))}")
    return "\n".join(lines) + "\n"


def mint_token(token_id, *endpoints):
    """(token, record line) from `flotilla gateway mint-token`."""
    argv = [FLOTILLA_BIN, "gateway", "mint-token", "--id", token_id]
    for e in endpoints:
        argv += ["--endpoint", e]
    p = run_to_exit(argv)
    out = p.stdout.decode()
    if p.returncode != 0:
        raise AssertionError(f"mint-token failed ({p.returncode}): {p.stderr.decode()}")
    token = re.search(r"^token: (flt_\S+)$", out, re.M)
    record = re.search(r"^\s*- (\{.*\})\s*$", out, re.M)
    if not token or not record:
        raise AssertionError(f"unexpected mint-token output:\n{out}")
    return token.group(1), record.group(1)


# --------------------------------------------------------------------------- gateway

class Gateway:
    """One `flotilla gateway --config FILE` process, its config file and its access log."""

    DEFAULT_FLAGS = {"--workers": "2", "--config-poll-ms": "100"}

    def __init__(self, owner, config, flags=None, cls_level=False):
        self.dir = fresh_dir()
        self.config_path = harness.write_yaml(self.dir, "gateway.yaml", config)
        self.access_log = os.path.join(self.dir, "access.log")
        merged = dict(self.DEFAULT_FLAGS)
        merged.update({k: str(v) for k, v in (flags or {}).items()})
        argv = [FLOTILLA_BIN, "gateway", "--listen", "127.0.0.1:0",
                "--config", self.config_path, "--access-log", self.access_log]
        for k, v in merged.items():
            argv += [k, v]
        self.srv = harness.start_process(owner, argv, cls_level=cls_level)
        self.port = self.srv.port

    def req(self, method, path, body=None, headers=None, **kw):
        return req(self.port, method, path, body, headers, **kw)

    def stats(self, headers=None):
        r = self.req("GET", "/gateway/stats", headers=headers)
        if r.status != 200:
            raise AssertionError(f"/gateway/stats: {r}")
        return r.json()

    def endpoint_stats(self, name, headers=None):
        for e in self.stats(headers)["endpoints"]:
            if e["name"] == name:
                return e
        return None

    def replica_stats(self, endpoint, rid):
        e = self.endpoint_stats(endpoint)
        for r in (e or {}).get("replicas", []):
            if r["id"] == rid:
                return r
        return None

    def metrics_text(self, headers=None):
        r = self.req("GET", "/metrics", headers=headers)
        if r.status != 200:
            raise AssertionError(f"/metrics: {r}")
        return r.body.decode()

    def metrics(self):
        return parse_metrics(self.metrics_text())

    def replica_requests(self, endpoint):
        """{replica id: requests it answered, any code} from the gateway's own counters."""
        out = collections.Counter()
        for (n, labels), v in self.metrics().items():
            d = dict(labels)
            if n == "flotilla_gateway_replica_requests_total" and d.get("endpoint") == endpoint:
                out[d["replica"]] += v
        return out

    def metric_sum(self, name, **want):
        total = 0.0
        for (n, labels), v in self.metrics().items():
            d = dict(labels)
            if n == name and all(d.get(k) == w for k, w in want.items()):
                total += v
        return total

    def rewrite(self, config, applied, what="config applied"):
        """Rewrites the watched config and waits until `applied(self)` holds."""
        harness.write_yaml(self.dir, "gateway.yaml", config)
        wait_until(lambda: applied(self), APPLY_DEADLINE_S, interval_s=0.02, what=what)

    def access_lines(self):
        try:
            with open(self.access_log) as f:
                text = f.read()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def wait_access(self, pred, what):
        """Polls the access log (flushed every 100 ms) for a line satisfying `pred`."""
        def found():
            return [line for line in self.access_lines() if pred(line)]
        return wait_until(found, 5, interval_s=0.02, what=what)[0]


# --------------------------------------------------------------------------- bodies

def oip(rows=1, request_id=None):
    body = {"inputs": [{"name": "x", "shape": [rows, 2], "datatype": "FP32",
                        "data": [float(i) for i in range(rows * 2)]}]}
    if request_id is not None:
        body["id"] = request_id
    return body


def infer_path(endpoint):
    return f"/v2/models/{endpoint}/infer"


# --------------------------------------------------------------------------- load

class Load:
    """Bounded closed-loop load: `threads` clients, each on its own keep-alive connection,
    send POST `path` until `total` requests were sent, `deadline_s` passed or stop().
    Every answer that is not a 200 with the expected OIP body, and every exception, is a
    failure (kept, with its reason)."""

    def __init__(self, port, path, body, threads, total, deadline_s):
        self.port, self.path, self.body = port, path, json.dumps(body).encode()
        self.total, self.deadline = total, time.monotonic() + deadline_s
        self.lock = threading.Lock()
        self.sent = 0
        self.completed = 0
        self.failures = []
        self.statuses = collections.Counter()
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True)
                        for _ in range(threads)]

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

    def _client(self):
        conn = None
        while self._take():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                  timeout=HTTP_TIMEOUT_S)
            reason = None
            try:
                r = req(self.port, "POST", self.path, self.body,
                        {"Content-Type": "application/json"}, conn=conn)
                status = r.status
                if status != 200:
                    reason = f"{r.status} {r.body[:200]!r}"
                elif "outputs" not in r.json():
                    reason = f"200 without outputs: {r.body[:200]!r}"
            except Exception as e:  # noqa: BLE001  (any failure is counted, then reported)
                status, reason = "exception", f"{type(e).__name__}: {e}"
                conn.close()
                conn = None
            with self.lock:
                self.completed += 1
                self.statuses[status] += 1
                if reason:
                    self.failures.append(reason)
        if conn is not None:
            conn.close()

    def wait_completed(self, n, deadline_s=20):
        wait_until(lambda: self.completed >= n or self.finished(), deadline_s,
                   what=f"{n} requests completed")

    def finished(self):
        return not any(t.is_alive() for t in self.threads)

    def stop(self):
        self._stop.set()
        self.join()

    def join(self, timeout=60):
        for t in self.threads:
            t.join(timeout)
        if not self.finished():
            raise AssertionError("load clients did not finish")


class GatewayTestCase(unittest.TestCase):
    maxDiff = 4000

    def assertJsonError(self, r, status, shape=None, request_id=True):
        """One of the gateway's own errors, in its route's shape (any shape when None)."""
        return harness.assert_gateway_error(self, r, status, shape, request_id)

    def assertOk(self, r):
        self.assertEqual(r.status, 200, r)
        return r.json()

    def assertNoFailures(self, load):
        self.assertEqual(load.failures, [],
                         f"{len(load.failures)} of {load.completed} requests failed; "
                         f"statuses {dict(load.statuses)}; first: {load.failures[:5]}")


def read_response_at(conn, out, key):
    """Reads one response on `conn` into out[key] = (monotonic time, Resp or exception)."""
    try:
        r = conn.read_response()
    except Exception as e:  # noqa: BLE001  (reported by the test)
        r = e
    out[key] = (time.monotonic(), r)


# =========================================================================== 1. routing

class Routing(GatewayTestCase):
    """Which route goes where: invocations, OIP, OpenAI by "model", the local routes."""

    @classmethod
    def setUpClass(cls):
        cls.replica = start_replica(cls, "fraud", 1, cls_level=True)
        cls.echo = start_echo(cls, cls_level=True)
        cls.gw = Gateway(cls, config_yaml({
            "fraud": [ver("v1", [rep("r1", cls.replica)])],
            "llm": [ver("v1", [rep("e1", cls.echo)], runtime="llm", max_model_len=2048)],
        }), cls_level=True)

    def test_invocations_route_to_replica_invocations(self):
        r = self.gw.req("POST", "/serving-endpoints/fraud/invocations",
                        {"instances": [[1.0, 2.0], [3.0, 4.0]]})
        self.assertEqual(self.assertOk(r), {"predictions": [0, 0]})
        self.assertTrue(r.headers.get("x-request-id"), r.headers)
        # the echo upstream shows the path the replica gets, query kept
        j = self.assertOk(self.gw.req("POST", "/serving-endpoints/llm/invocations?a=1&b=2",
                                      {"x": 1}))
        self.assertEqual((j["method"], j["path"]), ("POST", "/invocations?a=1&b=2"))
        self.assertEqual(json.loads(j["body"]), {"x": 1})

    def test_oip_infer(self):
        j = self.assertOk(self.gw.req("POST", infer_path("fraud"), oip(3, request_id="q7")))
        self.assertEqual(j.get("model_name"), "fraud", j)
        self.assertEqual(j.get("id"), "q7", j)
        self.assertEqual(j["outputs"][0]["shape"], [3], j)
        self.assertEqual(self.gw.req("POST", "/v2/models/fraud/versions/v1/infer",
                                     oip()).status, 200)

    def test_oip_metadata_and_ready(self):
        j = self.assertOk(self.gw.req("GET", "/v2/models/fraud"))
        self.assertEqual(j.get("name"), "fraud", j)
        self.assertEqual(j.get("platform"), "synthetic", j)
        j = self.assertOk(self.gw.req("GET", "/v2/models/fraud/ready"))
        self.assertTrue(j.get("ready"), j)
        # the OIP path goes to the replica unchanged
        j = self.assertOk(self.gw.req("GET", "/v2/models/llm/ready?x=y"))
        self.assertEqual((j["method"], j["path"]), ("GET", "/v2/models/llm/ready?x=y"))
        # a version path goes to that version's replicas, without the version segment
        j = self.assertOk(self.gw.req("GET", "/v2/models/llm/versions/v1/ready?x=y"))
        self.assertEqual((j["method"], j["path"]), ("GET", "/v2/models/llm/ready?x=y"))

    def test_list_models(self):
        # only generative (llm runtime) endpoints are models to OpenAI clients
        j = self.assertOk(self.gw.req("GET", "/v1/models"))
        self.assertEqual(j.get("object"), "list", j)
        self.assertEqual([m["id"] for m in j["data"]], ["llm"], j)
        for m in j["data"]:
            self.assertEqual(m.get("object"), "model", m)
            self.assertEqual(m.get("max_model_len"), 2048, m)

    def test_openai_routes_by_model(self):
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/completions?stream=false"):
            body = {"stream": False, "messages": [{"role": "user", "content": "hi"}],
                    "model": "llm"}
            j = self.assertOk(self.gw.req("POST", path, body))
            self.assertEqual((j["method"], j["path"]), ("POST", path), j)
            self.assertEqual(json.loads(j["body"]), body)

    def test_unknown_endpoint_is_404_json(self):
        for method, path, body in (
                ("POST", "/serving-endpoints/nope/invocations", {"instances": [[1]]}),
                ("POST", infer_path("nope"), oip()),
                ("GET", "/v2/models/nope", None),
                ("POST", "/v1/chat/completions", {"model": "nope", "messages": []})):
            with self.subTest(path=path):
                shape = {"/se": "mlflow", "/v1": "openai"}.get(path[:3], "oip")
                self.assertJsonError(self.gw.req(method, path, body), 404, shape)

    def test_openai_body_without_model_is_400(self):
        for body in ({"prompt": "x"}, {"model": 7, "prompt": "x"}, b"{not json", b"[1, 2]"):
            with self.subTest(body=body):
                r = self.gw.req("POST", "/v1/completions", body,
                                {"Content-Type": "application/json"})
                self.assertJsonError(r, 400, "openai")

    def test_unknown_path_is_404_json(self):
        for method, path, shape in (("GET", "/nope", "oip"), ("POST", "/invocations", "oip"),
                                    ("GET", "/serving-endpoints/fraud/other", "mlflow"),
                                    ("POST", "/serving-endpoints//invocations", "mlflow"),
                                    ("GET", "/v2/models/", "oip")):
            with self.subTest(path=path):
                self.assertJsonError(self.gw.req(method, path), 404, shape)

    def test_health(self):
        self.assertEqual(self.assertOk(self.gw.req("GET", "/v2/health/live")), {"live": True})
        self.assertEqual(self.assertOk(self.gw.req("GET", "/v2/health/ready")), {"ready": True})

    def test_pipelined_requests_are_answered_in_order(self):
        c = RawConn(self.gw.port)
        self.addCleanup(c.close)
        c.send(raw_request("POST", infer_path("fraud"), oip(request_id="p1")) +
               raw_request("POST", infer_path("llm"), {"id": "p2"}) +
               raw_request("GET", "/v2/health/live") +
               raw_request("POST", infer_path("fraud"), oip(request_id="p4")))
        got = [c.read_response() for _ in range(4)]
        self.assertEqual([r.status for r in got], [200] * 4, got)
        self.assertEqual(got[0].json()["id"], "p1")
        self.assertEqual(json.loads(got[1].json()["body"]), {"id": "p2"})
        self.assertEqual(got[2].json(), {"live": True})
        self.assertEqual(got[3].json()["id"], "p4")

    def test_chunked_body_is_forwarded_whole(self):
        body = json.dumps({"model": "llm", "prompt": "y" * 3000}).encode()
        c = RawConn(self.gw.port)
        self.addCleanup(c.close)
        chunks = [body[:7], body[7:2000], body[2000:]]
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
               b"".join(b"%x\r\n%s\r\n" % (len(ch), ch) for ch in chunks) + b"0\r\n\r\n")
        j = self.assertOk(c.read_response())
        self.assertEqual(j["body"].encode(), body)
        sent = {k.lower(): v for k, v in j["headers"]}
        self.assertEqual(sent.get("content-length"), str(len(body)))
        self.assertNotIn("transfer-encoding", sent)


    def test_response_without_content_type_is_relayed_without_one(self):
        c = RawConn(self.gw.port)
        self.addCleanup(c.close)
        c.send(raw_request("HEAD", "/v2/models/llm"))
        r = c.read_response()
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers.get("x-request-id"), r.headers)
        self.assertNotIn("content-type", r.headers, "an empty Content-Type was added")

class UpstreamsFlag(GatewayTestCase):
    def test_upstreams_serve_every_path_as_endpoint_default(self):
        echo = start_echo(self)
        gw = harness.start_process(self, [FLOTILLA_BIN, "gateway", "--listen", "127.0.0.1:0",
                                          "--upstreams", echo.address, "--workers", "1"])
        j = self.assertOk(req(gw.port, "POST", "/anything/at/all?q=1", {"k": "v"}))
        self.assertEqual((j["method"], j["path"]), ("POST", "/anything/at/all?q=1"))
        j = self.assertOk(req(gw.port, "POST", "/serving-endpoints/default/invocations", {}))
        self.assertEqual(j["path"], "/invocations")
        self.assertJsonError(req(gw.port, "POST", "/serving-endpoints/x/invocations", {}), 404)


# =========================================================================== 2. weights

class TrafficWeights(GatewayTestCase):
    N = 1000

    def test_80_20_split_across_versions(self):
        a = start_replica(self, "w", 1)
        b = start_replica(self, "w", 1)
        gw = Gateway(self, config_yaml({"w": [ver("v1", [rep("a", a)], traffic=80),
                                              ver("v2", [rep("b", b)], traffic=20)]}))
        load = Load(gw.port, infer_path("w"), oip(), threads=4, total=self.N,
                    deadline_s=60).start()
        load.join()
        self.assertNoFailures(load)
        self.assertEqual(load.completed, self.N)
        counts = gw.replica_requests("w")
        self.assertEqual(counts["a"] + counts["b"], self.N, counts)
        # binomial(1000, 0.8): sigma = 12.6; 5 sigma = 63
        sigma = (self.N * 0.8 * 0.2) ** 0.5
        self.assertLess(abs(counts["a"] - 0.8 * self.N), 5 * sigma, counts)
        # the replicas' own counts agree with the gateway's
        self.assertEqual(replica_own_requests(a), counts["a"])
        self.assertEqual(replica_own_requests(b), counts["b"])


# =========================================================================== 3. balancing

class Balancing(GatewayTestCase):
    def test_p2c_prefers_the_less_loaded_replica(self):
        slow = start_replica(self, "p", 200)
        fast = start_replica(self, "p", 1)
        gw = Gateway(self, config_yaml({"p": [ver("v1", [rep("slow", slow),
                                                         rep("fast", fast)])]}),
                     {"--balancer": "p2c"})
        load = Load(gw.port, infer_path("p"), oip(), threads=8, total=1500,
                    deadline_s=2.5).start()
        load.join()
        self.assertNoFailures(load)
        counts = gw.replica_requests("p")
        total = counts["slow"] + counts["fast"]
        self.assertGreaterEqual(total, 200, f"too little load to judge: {counts}")
        # Round robin would give the slow replica half; P2C sends it a request only when
        # it has fewer in flight than the fast one.
        self.assertGreater(counts["fast"], 0.85 * total, counts)

    def test_caps_are_never_exceeded(self):
        one = start_replica(self, "c", 150)
        two = start_replica(self, "c", 150)
        gw = Gateway(self, config_yaml({"c": [ver("v1", [rep("one", one, cap=1),
                                                         rep("two", two, cap=2)])]}))
        n = 9
        seen = {"one": 0, "two": 0, "gw_one": 0, "gw_two": 0}
        done = threading.Event()

        def watch():
            while not done.is_set():
                seen["one"] = max(seen["one"], replica_own_in_flight(one))
                seen["two"] = max(seen["two"], replica_own_in_flight(two))
                for r in gw.endpoint_stats("c")["replicas"]:
                    key = "gw_" + r["id"]
                    seen[key] = max(seen[key], r["in_flight"])

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        conns, out = [], {}
        t0 = time.monotonic()
        for i in range(n):
            c = RawConn(gw.port)
            self.addCleanup(c.close)
            c.send(raw_request("POST", infer_path("c"), oip(request_id=str(i))))
            conns.append(c)
        readers = [threading.Thread(target=read_response_at, args=(c, out, i))
                   for i, c in enumerate(conns)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(20)
        done.set()
        watcher.join(10)
        elapsed = time.monotonic() - t0
        statuses = [out[i][1].status if hasattr(out[i][1], "status") else out[i][1]
                    for i in range(n)]
        self.assertEqual(statuses, [200] * n)
        self.assertLessEqual(seen["one"], 1, seen)
        self.assertLessEqual(seen["two"], 2, seen)
        self.assertLessEqual(seen["gw_one"], 1, seen)
        self.assertLessEqual(seen["gw_two"], 2, seen)
        self.assertGreaterEqual(seen["two"], 1, f"watcher saw nothing: {seen}")
        # 9 requests through 3 slots of 150 ms: at least 3 rounds
        self.assertGreaterEqual(elapsed, 3 * 0.15 * 0.9, "caps not enforced (too fast)")


# =========================================================================== 4. admission

class Admission(GatewayTestCase):
    def single(self, mean_ms, flags):
        replica = start_replica(self, "q", mean_ms)
        gw = Gateway(self, config_yaml({"q": [ver("v1", [rep("r", replica, cap=1)])]}), flags)
        return replica, gw

    def send(self, gw, request_id):
        c = RawConn(gw.port)
        self.addCleanup(c.close)
        c.send(raw_request("POST", infer_path("q"), oip(request_id=request_id)))
        return c

    def wait_state(self, gw, in_flight, queued):
        def ok():
            e = gw.endpoint_stats("q")
            return e["in_flight"] == in_flight and e["queued"] == queued
        wait_until(ok, 5, interval_s=0.005, what=f"in_flight={in_flight}, queued={queued}")

    def test_queue_full_is_429_with_retry_after(self):
        _, gw = self.single(300, {"--queue-size": 2})
        running = self.send(gw, "0")
        self.wait_state(gw, 1, 0)
        queued = []
        for i in (1, 2):
            queued.append(self.send(gw, str(i)))
            self.wait_state(gw, 1, i)
        rejected = [self.send(gw, "3"), self.send(gw, "4")]   # 5 concurrent in all
        for c in rejected:
            r = c.read_response()
            self.assertJsonError(r, 429)
            self.assertEqual(r.headers.get("retry-after"), "1", r.headers)
            self.assertTrue(r.headers.get("x-request-id"), r.headers)
        # rejected at once: the first request is still running
        self.assertEqual(gw.endpoint_stats("q")["in_flight"], 1)
        for c in [running] + queued:
            self.assertEqual(c.read_response().status, 200)
        self.assertEqual(gw.metric_sum("flotilla_gateway_requests_total", endpoint="q",
                                       code="429"), 2)
        self.assertEqual(gw.metric_sum("flotilla_gateway_requests_total", endpoint="q",
                                       code="200"), 3)

    def test_queue_timeout_is_429_after_the_deadline(self):
        _, gw = self.single(3000, {"--queue-timeout-ms": 200})
        running = self.send(gw, "0")
        self.wait_state(gw, 1, 0)
        t0 = time.monotonic()
        waiting = self.send(gw, "1")
        r = waiting.read_response()
        waited = time.monotonic() - t0
        self.assertJsonError(r, 429)
        self.assertEqual(r.headers.get("retry-after"), "1", r.headers)
        self.assertGreaterEqual(waited, 0.18, "answered before the queue timeout")
        # Well before the slot frees (3 s): the deadline answered it, not the dispatch.
        self.assertLess(waited, 2.5, "not answered at the queue timeout")
        self.assertEqual(gw.endpoint_stats("q")["queued"], 0)
        self.assertEqual(running.read_response().status, 200)

    def test_client_gone_while_queued_is_499(self):
        _, gw = self.single(1000, {"--queue-size": 4})
        running = self.send(gw, "0")
        self.wait_state(gw, 1, 0)
        waiting = RawConn(gw.port)
        waiting.send(raw_request("POST", infer_path("q"), oip(), {"X-Request-Id": "left-q"}))
        self.wait_state(gw, 1, 1)
        waiting.close()
        line = gw.wait_access(lambda ln: ln.get("request_id") == "left-q", "the 499 logged")
        self.assertEqual(line["code"], 499, line)
        self.assertEqual(running.read_response().status, 200)
        # the slot freed by the first request goes to the next live request
        self.assertOk(gw.req("POST", infer_path("q"), oip()))

    def test_disconnected_waiters_do_not_hold_queue_slots(self):
        _, gw = self.single(1500, {"--queue-size": 2, "--queue-timeout-ms": 20000})
        running = self.send(gw, "0")
        self.wait_state(gw, 1, 0)
        gone = []
        for i in (1, 2):
            c = RawConn(gw.port)
            self.addCleanup(c.close)
            c.send(raw_request("POST", infer_path("q"), oip(), {"X-Request-Id": f"gone-{i}"}))
            self.wait_state(gw, 1, i)
            gone.append(c)
        for c in gone:
            c.close()
        for i in (1, 2):
            line = gw.wait_access(lambda ln, i=i: ln.get("request_id") == f"gone-{i}",
                                  "the 499s logged")
            self.assertEqual(line["code"], 499, line)
        fresh = self.send(gw, "3")
        r = fresh.read_response()
        self.assertEqual(running.read_response().status, 200)
        self.assertEqual(r.status, 200, f"a live request refused by a queue of gone ones: {r}")

    def test_fifo_dispatch_order(self):
        _, gw = self.single(100, {"--queue-timeout-ms": 20000})
        n = 6
        conns = [self.send(gw, "0")]
        self.wait_state(gw, 1, 0)
        for i in range(1, n):
            conns.append(self.send(gw, str(i)))
            self.wait_state(gw, 1, i)
        out = {}
        readers = [threading.Thread(target=read_response_at, args=(c, out, i))
                   for i, c in enumerate(conns)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(20)
        for i in range(n):
            self.assertEqual(getattr(out[i][1], "status", out[i][1]), 200, out[i])
            self.assertEqual(out[i][1].json().get("id"), str(i))
        order = sorted(range(n), key=lambda i: out[i][0])
        self.assertEqual(order, list(range(n)), "completion order is not arrival order")


# =========================================================================== 5. failover

class Failover(GatewayTestCase):
    def test_kill_9_one_of_three_replicas_under_load(self):
        replicas = [start_replica(self, "k", 2) for _ in range(3)]
        gw = Gateway(self, config_yaml({"k": [ver("v1", [rep(f"r{i}", r)
                                                         for i, r in enumerate(replicas)])]}))
        load = Load(gw.port, infer_path("k"), oip(), threads=8, total=2000,
                    deadline_s=60).start()
        load.wait_completed(400)
        replicas[1].kill()   # SIGKILL: no drain, connections reset
        load.join()
        self.assertNoFailures(load)
        self.assertEqual(load.completed, 2000)
        retries = gw.metric_sum("flotilla_gateway_retries_total", endpoint="k")
        ejections = gw.metric_sum("flotilla_gateway_replica_ejections_total", endpoint="k",
                                  replica="r1")
        self.assertGreater(retries + ejections, 0, "the failure left no trace in /metrics")
        self.assertTrue(gw.replica_stats("k", "r1")["ejected"], "dead replica not ejected")


    def test_dead_replicas_ejected_then_503_then_probed_back(self):
        dead = [RefusingPort(self), RefusingPort(self)]
        gw = Gateway(self, config_yaml({"x": [ver("v1", [rep("d0", dead[0].address),
                                                         rep("d1", dead[1].address)])]}),
                     {"--eject-after": 2, "--cold-start-timeout-ms": 300})
        # both refuse: the request alternates between them until both are ejected (two
        # failures each, --eject-after 2), then waits as for a cold start: 503, never a 502
        r = gw.req("POST", infer_path("x"), oip(), {"X-Request-Id": "twice-1"})
        self.assertJsonError(r, 503, "oip")
        self.assertEqual(r.headers.get("retry-after"), "1", r.headers)
        line = gw.wait_access(lambda ln: ln.get("request_id") == "twice-1", "access log")
        self.assertEqual((line["code"], line["attempts"]), (503, 4), line)
        self.assertEqual(gw.metric_sum("flotilla_gateway_retries_total", endpoint="x"), 4)
        self.assertEqual([r["ejected"] for r in gw.endpoint_stats("x")["replicas"]],
                         [True, True])
        self.assertEqual(gw.metric_sum("flotilla_gateway_replica_ejections_total",
                                       endpoint="x"), 2)
        # nothing eligible: the request waits as for a cold start, then 503
        r = gw.req("POST", infer_path("x"), oip())
        self.assertJsonError(r, 503)
        self.assertEqual(r.headers.get("retry-after"), "1", r.headers)
        # a server comes up on d0's port: the probe (after 1 s) brings d0 back
        dead[0].release()
        echo = harness.start_process(self, [PYTHON, ECHO_UPSTREAM, "--port", str(dead[0].port)])
        self.assertEqual(echo.port, dead[0].port)
        wait_until(lambda: not gw.replica_stats("x", "d0")["ejected"], 5, interval_s=0.05,
                   what="d0 probed back in")
        self.assertTrue(gw.replica_stats("x", "d1")["ejected"])
        j = self.assertOk(gw.req("POST", infer_path("x"), oip()))
        self.assertEqual(j["path"], infer_path("x"))


# =========================================================================== 6. config swap

class ConfigSwap(GatewayTestCase):
    def test_rewrites_under_load(self):
        r1, r2, r3 = (start_replica(self, "s", 2) for _ in range(3))
        gw = Gateway(self, config_yaml({"s": [ver("v1", [rep("r1", r1), rep("r2", r2)])]}))
        load = Load(gw.port, infer_path("s"), oip(), threads=4, total=20000,
                    deadline_s=30).start()
        self.addCleanup(load.stop)

        def more(n):
            target = load.completed + n
            load.wait_completed(target)
            self.assertFalse(load.finished(), "load ended before the test did")

        more(100)
        # 1. add a replica
        gw.rewrite(config_yaml({"s": [ver("v1", [rep("r1", r1), rep("r2", r2),
                                                 rep("r3", r3)])]}),
                   lambda g: g.replica_stats("s", "r3") is not None, "r3 added")
        wait_until(lambda: gw.replica_requests("s")["r3"] > 0, 5, what="r3 gets traffic")
        # 2. drain r1: it stays in the table, gets no new requests
        gw.rewrite(config_yaml({"s": [ver("v1", [rep("r1", r1, state="draining"),
                                                 rep("r2", r2), rep("r3", r3)])]}),
                   lambda g: not g.replica_stats("s", "r1")["eligible"], "r1 draining")
        wait_until(lambda: gw.replica_stats("s", "r1")["in_flight"] == 0, 5,
                   what="r1's in-flight requests to finish")
        drained_at = replica_own_requests(r1)
        more(200)
        self.assertEqual(replica_own_requests(r1), drained_at, "draining r1 got new requests")
        # 3. remove r1, split r2 and r3 into versions weighted 50/50
        gw.rewrite(config_yaml({"s": [ver("v1", [rep("r2", r2)], traffic=50),
                                      ver("v2", [rep("r3b", r3)], traffic=50)]}),
                   lambda g: g.replica_stats("s", "r1") is None and
                   g.replica_stats("s", "r3b") is not None, "r1 removed, v2 added")
        before = gw.replica_requests("s")
        more(400)
        after = gw.replica_requests("s")
        self.assertEqual(replica_own_requests(r1), drained_at, "removed r1 got new requests")
        # Once nothing refers to it, a removed replica's series leave /metrics (churn must not
        # grow the output).
        wait_until(lambda: "r1" not in gw.replica_requests("s") and
                   'replica="r1"' not in gw.metrics_text(), 5, what="r1's series to go")
        # The old entry r3 got nothing more; its series may already be gone (retired once
        # nothing refers to it), which also means it took no new request.
        if "r3" in after:
            self.assertEqual(after["r3"], before["r3"], "old entry r3 still used")
        got_v1, got_v2 = after["r2"] - before["r2"], after["r3b"] - before["r3b"]
        share = got_v2 / max(1, got_v1 + got_v2)
        self.assertTrue(0.3 < share < 0.7, f"v2 share {share:.2f} after a 50/50 split: {after}")
        # 4. back to one replica with a cap
        gw.rewrite(config_yaml({"s": [ver("v1", [rep("r2", r2, cap=2)])]}),
                   lambda g: g.replica_stats("s", "r2")["cap"] == 2 and
                   g.replica_stats("s", "r3b") is None, "single capped replica")
        more(100)
        load.stop()
        self.assertNoFailures(load)


    def test_removed_endpoint_answers_its_waiters_404(self):
        replica = start_replica(self, "gone", 500)
        echo = start_echo(self)
        both = {"gone": [ver("v1", [rep("r", replica, cap=1)])],
                "stays": [ver("v1", [rep("e", echo)])]}
        gw = Gateway(self, config_yaml(both))
        running = RawConn(gw.port)
        self.addCleanup(running.close)
        running.send(raw_request("POST", infer_path("gone"), oip()))
        wait_until(lambda: gw.endpoint_stats("gone")["in_flight"] == 1, 5, what="in flight")
        waiting = RawConn(gw.port)
        self.addCleanup(waiting.close)
        waiting.send(raw_request("POST", infer_path("gone"), oip()))
        wait_until(lambda: gw.endpoint_stats("gone")["queued"] == 1, 5, what="queued")
        gw.rewrite(config_yaml({"stays": both["stays"]}),
                   lambda g: g.endpoint_stats("gone") is None, "endpoint removed")
        self.assertJsonError(waiting.read_response(), 404)
        self.assertEqual(running.read_response().status, 200, "in-flight request not finished")
        self.assertJsonError(gw.req("POST", infer_path("gone"), oip()), 404)
        self.assertOk(gw.req("POST", infer_path("stays"), oip()))
        gw.rewrite(config_yaml(both), lambda g: g.endpoint_stats("gone") is not None,
                   "endpoint back")
        self.assertOk(gw.req("POST", infer_path("gone"), oip()))

    def test_invalid_config_is_ignored_under_load(self):
        r1, r2 = start_replica(self, "s", 2), start_replica(self, "s", 2)
        good = config_yaml({"s": [ver("v1", [rep("r1", r1)])]})
        gw = Gateway(self, good)
        load = Load(gw.port, infer_path("s"), oip(), threads=2, total=5000,
                    deadline_s=20).start()
        self.addCleanup(load.stop)
        load.wait_completed(50)
        for bad in ("endpoints: [{name: s, versions: [{name: v1, traffic: 70, replicas: []}]}]\n",
                    "endpoints:\n  - name: s\n    versions: [\n",
                    config_yaml({"s": [ver("v1", [rep("r1", "127.0.0.1:notaport")])]})):
            # Counted before the write: the gateway may report the file before a count after
            # it would be taken.
            marks = gw.srv.stderr().count("not applied")
            harness.write_yaml(gw.dir, "gateway.yaml", bad)
            wait_until(lambda: gw.srv.stderr().count("not applied") > marks, APPLY_DEADLINE_S,
                       interval_s=0.02, what="the bad config reported")
            n = load.completed
            load.wait_completed(n + 50)
            self.assertFalse(load.finished())
            self.assertEqual([r["id"] for r in gw.endpoint_stats("s")["replicas"]], ["r1"])
        gw.rewrite(config_yaml({"s": [ver("v1", [rep("r2", r2)])]}),
                   lambda g: g.replica_stats("s", "r2") is not None, "a good config again")
        load.stop()
        self.assertNoFailures(load)


# =========================================================================== 7. auth

class Auth(GatewayTestCase):
    @classmethod
    def setUpClass(cls):
        cls.echo = start_echo(cls, cls_level=True)
        cls.all_token, all_record = mint_token("all")
        cls.a_token, a_record = mint_token("scoped", "a")
        cls.gw = Gateway(cls, config_yaml(
            {"a": [ver("v1", [rep("e1", cls.echo)], runtime="llm")],
             "b": [ver("v1", [rep("e2", cls.echo)], runtime="llm")]},
            token_records=[all_record, a_record], open_routes=["health", "metrics"]),
            cls_level=True)

    def bearer(self, token):
        return {"Authorization": f"Bearer {token}"}

    def test_no_header_is_401(self):
        self.assertJsonError(self.gw.req("POST", infer_path("a"), oip()), 401)
        self.assertJsonError(self.gw.req("POST", "/v1/completions", {"model": "a"}), 401)

    def test_bad_token_is_401(self):
        secret_a = self.a_token.rsplit("_", 1)[1]
        wrong_secret = self.a_token[:-len(secret_a)] + ("0" if secret_a[0] != "0" else "1") + \
            secret_a[1:]
        for value in (f"Bearer {wrong_secret}", "Bearer flt_nobody_" + "0" * 64,
                      "Bearer garbage", f"Basic {self.a_token}", "Bearer"):
            with self.subTest(value=value):
                self.assertJsonError(self.gw.req("POST", infer_path("a"), oip(),
                                                 {"Authorization": value}), 401)

    def test_scoped_token_on_other_endpoint_is_403(self):
        self.assertJsonError(self.gw.req("POST", infer_path("b"), oip(),
                                         self.bearer(self.a_token)), 403)

    def test_good_tokens_pass(self):
        self.assertOk(self.gw.req("POST", infer_path("a"), oip(), self.bearer(self.a_token)))
        self.assertOk(self.gw.req("POST", infer_path("a"), oip(), self.bearer(self.all_token)))
        self.assertOk(self.gw.req("POST", infer_path("b"), oip(), self.bearer(self.all_token)))
        self.assertOk(self.gw.req("POST", "/v1/chat/completions", {"model": "b"},
                                  {"Authorization": f"bearer  {self.all_token}"}))

    def test_authorization_is_not_forwarded(self):
        j = self.assertOk(self.gw.req("POST", infer_path("a"), oip(),
                                      self.bearer(self.a_token)))
        names = [k.lower() for k, _ in j["headers"]]
        self.assertNotIn("authorization", names, j["headers"])
        self.assertNotIn(self.a_token, json.dumps(j))

    def test_open_routes_need_no_token(self):
        self.assertEqual(self.gw.req("GET", "/metrics").status, 200)
        self.assertEqual(self.gw.req("GET", "/v2/health/live").status, 200)
        self.assertEqual(self.gw.req("GET", "/v2/health/ready").status, 200)

    def test_other_local_routes_need_a_token(self):
        self.assertJsonError(self.gw.req("GET", "/gateway/stats"), 401)
        self.assertJsonError(self.gw.req("GET", "/v1/models"), 401)
        self.assertJsonError(self.gw.req("GET", "/gateway/stats",
                                         headers={"Authorization": "Bearer nope"}), 401)
        self.assertEqual(self.gw.req("GET", "/gateway/stats",
                                     headers=self.bearer(self.a_token)).status, 200)
        j = self.assertOk(self.gw.req("GET", "/v1/models", headers=self.bearer(self.a_token)))
        self.assertEqual([m["id"] for m in j["data"]], ["a"], "lists what the token may call")
        j = self.assertOk(self.gw.req("GET", "/v1/models", headers=self.bearer(self.all_token)))
        self.assertEqual([m["id"] for m in j["data"]], ["a", "b"])


# =========================================================================== 8. limits

class Limits(GatewayTestCase):
    @classmethod
    def setUpClass(cls):
        cls.echo = start_echo(cls, cls_level=True)
        cls.gw = Gateway(cls, config_yaml({"a": [ver("v1", [rep("e1", cls.echo)])]}),
                         {"--max-header-bytes": 1024, "--max-body-bytes": 1000,
                          "--header-timeout-ms": 300, "--body-timeout-ms": 300,
                          "--idle-timeout-ms": 3000},
                         cls_level=True)

    def conn(self, port=None):
        c = RawConn(port or self.gw.port)
        self.addCleanup(c.close)
        return c

    def test_header_over_limit_is_431(self):
        c = self.conn()
        c.send(raw_request("POST", infer_path("a"), b"{}", {"X-Big": "x" * 2000}))
        self.assertJsonError(c.read_response(), 431, request_id=False)
        # the limit is on the header, not on one field: under it still passes
        self.assertOk(self.gw.req("POST", infer_path("a"), {}, {"X-Small": "x" * 200}))

    def test_body_over_limit_is_413(self):
        r = self.gw.req("POST", infer_path("a"), b"x" * 2000,
                        {"Content-Type": "application/json"})
        self.assertJsonError(r, 413, request_id=False)
        self.assertOk(self.gw.req("POST", infer_path("a"), b"y" * 900,
                                  {"Content-Type": "application/json"}))

    def test_slowloris_header_is_closed_after_header_timeout(self):
        c = self.conn()
        c.send(b"POST /v2/models/a/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        closed, took, _ = c.wait_closed(5)
        self.assertTrue(closed, "a partial header held the connection open")
        self.assertGreaterEqual(took, 0.25, "closed before --header-timeout-ms")
        self.assertLess(took, 2.5, "closed by the idle timeout, not the header timeout")

    def test_slow_body_is_closed_after_body_timeout(self):
        c = self.conn()
        c.send(b"POST /v2/models/a/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\": ")
        closed, took, _ = c.wait_closed(5)
        self.assertTrue(closed, "a partial body held the connection open")
        self.assertGreaterEqual(took, 0.25, "closed before --body-timeout-ms")
        self.assertLess(took, 2.5, "closed by the idle timeout, not the body timeout")

    def test_idle_keep_alive_is_closed_after_idle_timeout(self):
        c = self.conn()
        c.send(raw_request("GET", "/v2/health/live"))
        self.assertEqual(c.read_response().status, 200)
        closed, took, data = c.wait_closed(6)
        self.assertTrue(closed, "idle keep-alive connection never closed")
        self.assertEqual(data, b"")
        self.assertGreaterEqual(took, 2.9, "closed before --idle-timeout-ms")
        self.assertLess(took, 8.0)

    def test_max_connections(self):
        gw = Gateway(self, config_yaml({"a": [ver("v1", [rep("e1", self.echo)])]}),
                     {"--max-connections": 2})
        first, second = self.conn(gw.port), self.conn(gw.port)
        for c in (first, second):   # accepted and counted: each has been answered
            c.send(raw_request("GET", "/v2/health/live"))
            self.assertEqual(c.read_response().status, 200)
        third = self.conn(gw.port)
        third.send(raw_request("POST", infer_path("a"), oip()))
        self.assertJsonError(third.read_response(), 503, request_id=False)
        closed, _, _ = third.wait_closed(5)
        self.assertTrue(closed, "the rejected connection stays open")
        # a slot freed is a slot to use
        first.close()

        def fourth_ok():
            try:
                return req(gw.port, "GET", "/v2/health/live", timeout=2).status == 200
            except OSError:
                return False
        wait_until(fourth_ok, 5, interval_s=0.05, what="a connection after one closed")


# =========================================================================== 9-10. upstream calls

class Upstream(GatewayTestCase):
    def test_upstream_timeout_is_504_json(self):
        replica = start_replica(self, "t", 5000)
        gw = Gateway(self, config_yaml({"t": [ver("v1", [rep("r", replica)])]}),
                     {"--upstream-timeout-ms": 200})
        t0 = time.monotonic()
        r = gw.req("POST", infer_path("t"), oip())
        took = time.monotonic() - t0
        self.assertJsonError(r, 504)
        self.assertTrue(r.headers.get("x-request-id"), r.headers)
        self.assertGreaterEqual(took, 0.18)
        # Well before the replica would answer (5 s): the timeout answered it.
        self.assertLess(took, 4.0, "504 not sent at the upstream timeout")
        wait_until(lambda: gw.endpoint_stats("t")["in_flight"] == 0, 2,
                   what="the timed-out call released")

    def assert_disconnect_releases_call(self, gw, replica, request_id):
        """A client that leaves while its request is at the replica: the gateway cancels the
        upstream call well before the replica's 3 s service time and logs 499."""
        def gauge():
            return gw.metric_sum("flotilla_gateway_replica_in_flight_requests",
                                 endpoint="d", replica="r")

        c = RawConn(gw.port)
        self.addCleanup(c.close)
        c.send(raw_request("POST", infer_path("d"), oip(), {"X-Request-Id": request_id}))
        wait_until(lambda: gauge() == 1, 5, what="the request at the replica")
        wait_until(lambda: replica_own_in_flight(replica) == 1, 5,
                   what="the replica holding the request")
        t0 = time.monotonic()
        c.close()
        wait_until(lambda: gauge() == 0, 5, interval_s=0.02,
                   what="the gateway's in-flight gauge back to 0")
        self.assertLess(time.monotonic() - t0, 2.0, "in-flight not released before 3 s")
        line = gw.wait_access(lambda ln: ln.get("request_id") == request_id, "access log line")
        self.assertEqual(line["code"], 499, line)
        self.assertEqual(gw.endpoint_stats("d")["in_flight"], 0)

    def test_client_disconnect_cancels_the_upstream_call(self):
        replica = start_replica(self, "d", 3000)
        gw = Gateway(self, config_yaml({"d": [ver("v1", [rep("r", replica)])]}))
        self.assert_disconnect_releases_call(gw, replica, "gone-1")

    def test_replica_closing_idle_keep_alive_is_not_a_failure(self):
        # The replica closes idle connections after 100 ms: the gateway's pooled connection
        # is then stale, and the next request must still succeed (no 502, no ejection).
        replicas = [start_replica(self, "ka", 1, "--idle-timeout-ms", "100") for _ in range(2)]
        gw = Gateway(self, config_yaml({"ka": [ver("v1", [rep(f"r{i}", r)
                                                          for i, r in enumerate(replicas)])]}),
                     {"--workers": 1})
        conns = [RawConn(gw.port) for _ in range(8)]
        for c in conns:
            self.addCleanup(c.close)
        for rnd in range(3):
            for c in conns:   # 8 concurrent: several pooled connections per replica
                c.send(raw_request("POST", infer_path("ka"), oip()))
            for c in conns:
                self.assertEqual(c.read_response().status, 200)
            for r in replicas:
                wait_connections_closed(r)
        self.assertEqual(gw.metric_sum("flotilla_gateway_replica_ejections_total",
                                       endpoint="ka"), 0)
        codes = {dict(labels)["code"] for (n, labels), v in gw.metrics().items()
                 if n == "flotilla_gateway_requests_total" and dict(labels)["endpoint"] == "ka"}
        self.assertEqual(codes, {"200"})

    def test_client_disconnect_after_a_stale_connection_was_replaced(self):
        replica = start_replica(self, "d", 3000, "--idle-timeout-ms", "100")
        gw = Gateway(self, config_yaml({"d": [ver("v1", [rep("r", replica)])]}),
                     {"--workers": 1})
        self.assertOk(gw.req("GET", "/v2/models/d"))   # leaves a pooled connection
        wait_connections_closed(replica)               # which the replica then closes
        self.assert_disconnect_releases_call(gw, replica, "gone-stale")


# =========================================================================== 11-13. observability

class Observability(GatewayTestCase):
    @classmethod
    def setUpClass(cls):
        cls.replica = start_replica(cls, "obs", 1, cls_level=True)
        cls.echo = start_echo(cls, cls_level=True)
        cls.gw = Gateway(cls, config_yaml({
            "obs": [ver("v1", [rep("r1", cls.replica)])],
            "llm": [ver("v7", [rep("e1", cls.echo)])],
        }), cls_level=True)

    def test_metrics_pass_promtool_after_traffic_with_errors(self):
        gw = self.gw
        for _ in range(5):
            self.assertOk(gw.req("POST", infer_path("obs"), oip()))
        self.assertEqual(gw.req("POST", infer_path("obs"), b"{bad",
                                {"Content-Type": "application/json"}).status, 400)
        self.assertEqual(gw.req("POST", infer_path("nope"), oip()).status, 404)
        self.assertEqual(gw.req("GET", "/nope").status, 404)
        self.assertEqual(gw.req("POST", "/v1/completions", {"prompt": "x"}).status, 400)
        self.assertOk(gw.req("POST", "/v1/completions", {"model": "llm", "prompt": "x"}))
        text = gw.metrics_text()
        ok, output = promtool_check_metrics(text)
        self.assertTrue(ok, f"promtool check metrics failed:\n{output}\n"
                            f"--- metrics ---\n{text[:4000]}")
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        for name, typ in {"flotilla_gateway_requests_total": "counter",
                          "flotilla_gateway_request_duration_seconds": "histogram",
                          "flotilla_gateway_added_latency_seconds": "histogram",
                          "flotilla_gateway_replica_requests_total": "counter",
                          "flotilla_gateway_replica_in_flight_requests": "gauge",
                          "flotilla_gateway_queue_depth": "gauge",
                          "flotilla_gateway_retries_total": "counter",
                          "flotilla_gateway_unrouted_requests_total": "counter"}.items():
            self.assertEqual(types.get(name), typ, f"# TYPE of {name}")
        self.assertGreaterEqual(gw.metric_sum("flotilla_gateway_requests_total",
                                              endpoint="obs", code="400"), 1)
        self.assertGreaterEqual(gw.metric_sum("flotilla_gateway_unrouted_requests_total",
                                              code="404"), 2)

    def test_access_log_request_id_and_traceparent(self):
        gw = self.gw
        r = gw.req("POST", "/v1/chat/completions", {"model": "llm", "messages": []},
                   {"X-Request-Id": "client-id-42", "traceparent": TRACEPARENT})
        j = self.assertOk(r)
        self.assertEqual(r.headers.get("x-request-id"), "client-id-42")
        sent = {k.lower(): v for k, v in j["headers"]}
        self.assertEqual(sent.get("traceparent"), TRACEPARENT)
        self.assertEqual(sent.get("x-request-id"), "client-id-42")
        line = gw.wait_access(lambda ln: ln.get("request_id") == "client-id-42",
                              "the client's request id in the access log")
        self.assertEqual((line["endpoint"], line["version"], line["replica"], line["code"]),
                         ("llm", "v7", "e1", 200), line)
        self.assertIsInstance(line["latency_ms"], (int, float))
        self.assertGreaterEqual(line["latency_ms"], 0)
        self.assertEqual(line["trace_id"], TRACEPARENT.split("-")[1], line)
        # without a (valid) client id the gateway makes one, sends it upstream and logs it
        for headers in ({}, {"X-Request-Id": "not valid/" + "x" * 200}):
            r = gw.req("POST", infer_path("obs"), oip(), headers)
            self.assertOk(r)
            rid = r.headers.get("x-request-id")
            self.assertTrue(rid, r.headers)
            self.assertNotIn("/", rid)
            line = gw.wait_access(lambda ln: ln.get("request_id") == rid,
                                  "a generated request id in the access log")
            self.assertEqual((line["endpoint"], line["version"], line["replica"],
                              line["code"]), ("obs", "v1", "r1", 200), line)
            self.assertIsNone(line["trace_id"], line)
        r = gw.req("POST", "/v1/completions", {"model": "llm"})
        sent = {k.lower(): v for k, v in self.assertOk(r)["headers"]}
        self.assertEqual(sent.get("x-request-id"), r.headers.get("x-request-id"))
        self.assertNotIn("traceparent", sent)
        # a traceparent that is not one (wrong length, upper case, all-zero trace id) gives none
        for bad in ("00-abc-def-01", TRACEPARENT.upper(), "00-" + "0" * 32 + "-b7ad6b7169203331-01"):
            r = gw.req("POST", infer_path("obs"), oip(), {"traceparent": bad})
            self.assertOk(r)
            rid = r.headers.get("x-request-id")
            line = gw.wait_access(lambda ln, rid=rid: ln.get("request_id") == rid,
                                  "a request with a malformed traceparent in the access log")
            self.assertIsNone(line["trace_id"], (bad, line))

    def test_stats_samples_after_light_load(self):
        gw = self.gw
        t0 = time.monotonic()

        def two_busy_samples():
            self.assertOk(gw.req("POST", infer_path("obs"), oip()))
            busy = [s for s in gw.endpoint_stats("obs")["samples"] if s["arrivals"] > 0]
            return busy if len(busy) >= 2 and time.monotonic() - t0 >= 2 else None

        busy = wait_until(two_busy_samples, 8, interval_s=0.02, what="two busy 1 s samples")
        for s in busy:
            self.assertGreater(s["completions"], 0, s)
            self.assertGreaterEqual(s["concurrency"], 0, s)
            self.assertEqual(s["rejected"], 0, s)
        stamps = [s["unix_ms"] for s in gw.endpoint_stats("obs")["samples"]]
        self.assertEqual(stamps, sorted(stamps))
        self.assertLess(abs(stamps[-1] / 1000 - time.time()), 5)
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        self.assertTrue(all(800 <= g <= 1500 for g in gaps), gaps)
        e = gw.endpoint_stats("obs")
        self.assertEqual([(r["id"], r["version"], r["address"]) for r in e["replicas"]],
                         [("r1", "v1", self.replica.address)])


# =========================================================================== drain

class Drain(GatewayTestCase):
    def test_sigterm_finishes_in_flight_and_queued_requests(self):
        replica = start_replica(self, "dr", 300)
        gw = Gateway(self, config_yaml({"dr": [ver("v1", [rep("r", replica, cap=1)])]}))
        idle = RawConn(gw.port)
        self.addCleanup(idle.close)
        idle.send(raw_request("GET", "/v2/health/live"))
        self.assertEqual(idle.read_response().status, 200)
        conns = []
        for i in range(3):
            c = RawConn(gw.port)
            self.addCleanup(c.close)
            c.send(raw_request("POST", infer_path("dr"), oip(request_id=str(i))))
            conns.append(c)
            wait_until(lambda i=i: gw.endpoint_stats("dr")["queued"] == i, 5,
                       what=f"{i} queued")
        gw.srv.proc.send_signal(signal.SIGTERM)
        closed, _, data = idle.wait_closed(3)
        self.assertTrue(closed, "idle keep-alive connection not closed on SIGTERM")
        self.assertEqual(data, b"")
        for i, c in enumerate(conns):
            r = c.read_response()
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json()["id"], str(i))
            self.assertEqual(r.headers.get("connection", "").lower(), "close", r.headers)
        try:
            rc = gw.srv.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.fail("gateway did not exit after draining")
        gw.srv.reaped(rc)
        self.assertEqual(rc, 0, gw.srv.stderr())


    def test_drain_timeout_exits_1(self):
        replica = start_replica(self, "dt", 3000)
        gw = Gateway(self, config_yaml({"dt": [ver("v1", [rep("r", replica)])]}),
                     {"--drain-timeout-ms": 300})
        c = RawConn(gw.port)
        self.addCleanup(c.close)
        c.send(raw_request("POST", infer_path("dt"), oip()))
        wait_until(lambda: gw.endpoint_stats("dt")["in_flight"] == 1, 5, what="in flight")
        t0 = time.monotonic()
        gw.srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = gw.srv.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.fail("gateway ignored --drain-timeout-ms")
        gw.srv.reaped(rc)
        self.assertEqual(rc, 1, gw.srv.stderr())
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)


# =========================================================================== 14. scale from zero

class ScaleFromZero(GatewayTestCase):
    def test_request_held_until_a_replica_is_ready(self):
        replica = start_replica(self, "z", 1)
        gw = Gateway(self, config_yaml({"z": [ver("v1", [rep("r", replica,
                                                             state="starting")])]}))
        c = RawConn(gw.port)
        self.addCleanup(c.close)
        c.send(raw_request("POST", infer_path("z"), oip(request_id="cold")))
        wait_until(lambda: gw.endpoint_stats("z")["queued"] == 1, 5, what="request held")
        readable, _, _ = select.select([c.sock], [], [], 0)
        self.assertEqual(readable, [], "a held request was answered")
        self.assertEqual(replica_own_requests(replica), 0)
        harness.write_yaml(gw.dir, "gateway.yaml",
                           config_yaml({"z": [ver("v1", [rep("r", replica, state="ready")])]}))
        r = c.read_response()
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json().get("id"), "cold")
        self.assertEqual(gw.endpoint_stats("z")["queued"], 0)

    def test_cold_start_timeout_is_503_with_retry_after(self):
        replica = start_replica(self, "z", 1)
        gw = Gateway(self, config_yaml({"z": [ver("v1", [rep("r", replica,
                                                             state="starting")])]}),
                     {"--cold-start-timeout-ms": 300})
        t0 = time.monotonic()
        r = gw.req("POST", infer_path("z"), oip())
        took = time.monotonic() - t0
        self.assertJsonError(r, 503)
        self.assertEqual(r.headers.get("retry-after"), "1", r.headers)
        self.assertGreaterEqual(took, 0.28)
        self.assertLess(took, 2.0)
        self.assertEqual(replica_own_requests(replica), 0)


class InferenceTables(GatewayTestCase):
    """An endpoint's inference table (docs/inference-tables.md): every request recorded off the
    request path, bodies cut at the cap, a stream assembled into one record and passed on
    unchanged, read back with `flotilla logs`."""

    def read_records(self, directory, endpoint, count):
        """The records of `endpoint`'s table once there are `count` (files flushed each 1 s)."""
        def read():
            p = run_to_exit([FLOTILLA_BIN, "logs", endpoint, "--data-dir", directory,
                             "-o", "json"])
            if p.returncode != 0:
                return None
            records = [json.loads(line) for line in p.stdout.decode().splitlines()]
            return records if len(records) >= count else None
        return wait_until(read, 10, interval_s=0.1, what=f"{count} records of {endpoint}")

    def test_flotilla_logs_orders_records_by_arrival_across_workers_and_gateways(self):
        # A file holds each gateway worker's records in the order they were answered, and a
        # period has a file per gateway: two files of one period, each out of arrival order.
        data_dir = fresh_dir()
        endpoint_dir = os.path.join(data_dir, "inference", "llm")
        os.makedirs(endpoint_dir)
        for pid, stamps in ((101, (5, 1, 4)), (102, (3, 6, 2))):
            with gzip.open(os.path.join(endpoint_dir, f"20260101T000000Z-{pid}.jsonl.gz"),
                           "wt") as f:
                for ms in stamps:
                    f.write(json.dumps({"timestamp_ms": 1767225600000 + ms,
                                        "request_id": f"r{ms}", "status": 200}) + "\n")
        p = run_to_exit([FLOTILLA_BIN, "logs", "llm", "--data-dir", data_dir, "-o", "json"])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([json.loads(line)["request_id"] for line in p.stdout.splitlines()],
                         ["r1", "r2", "r3", "r4", "r5", "r6"])
        p = run_to_exit([FLOTILLA_BIN, "logs", "llm", "--data-dir", data_dir, "-o", "json",
                         "--tail", "2"])
        self.assertEqual([json.loads(line)["request_id"] for line in p.stdout.splitlines()],
                         ["r5", "r6"])

    def test_records_requests_streams_and_errors_and_flotilla_logs_reads_them(self):
        echo = start_echo(self)
        data_dir = fresh_dir()
        table_dir = os.path.join(data_dir, "inference")
        config = config_yaml({"llm": [ver("v1", [rep("e1", echo)])],
                              "quiet": [ver("v1", [rep("e2", echo)])]},
                             inference_tables={"llm": {"enabled": True, "max_body_bytes": 48}})
        gw = Gateway(self, config, flags={"--inference-dir": table_dir})
        path = "/serving-endpoints/llm/invocations"
        small = gw.req("POST", path, {"x": 1},
                       headers={"traceparent":
                                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                                "X-Request-Id": "small-1"})
        self.assertEqual(small.status, 200, small)
        big = gw.req("POST", path, {"x": "y" * 200}, headers={"X-Request-Id": "big-1"})
        self.assertEqual(big.status, 200, big)
        self.assertEqual(json.loads(big.json()["body"]), {"x": "y" * 200})  # passed on whole
        bad = gw.req("POST", path, b"{not json", headers={"Content-Type": "application/json",
                                                           "X-Request-Id": "bad-1"})
        self.assertEqual(bad.status, 200, bad)  # the echo answers anything
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        self.addCleanup(conn.close)
        conn.request("POST", path, body=json.dumps({"sse": {"events": 3}}).encode(),
                     headers={"Content-Type": "application/json", "X-Request-Id": "sse-1"})
        stream = conn.getresponse()
        self.assertEqual(stream.read().count(b"data: "), 4)  # 3 events and [DONE], unchanged
        self.assertEqual(gw.req("POST", "/serving-endpoints/quiet/invocations", {}).status, 200)

        records = {r["request_id"]: r for r in self.read_records(data_dir, "llm", 4)}
        self.assertEqual(set(records), {"small-1", "big-1", "bad-1", "sse-1"})
        first = records["small-1"]
        self.assertEqual((first["endpoint"], first["version"], first["replica"]),
                         ("llm", "v1", "e1"))
        self.assertEqual((first["status"], first["method"], first["protocol"]),
                         (200, "POST", "mlflow"))
        self.assertEqual(first["path"], path)
        self.assertEqual(first["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736")
        self.assertEqual(json.loads(first["request"]["body"]), {"x": 1})
        self.assertFalse(first["request"]["truncated"])
        self.assertGreater(first["latency_ms"], 0)
        self.assertLessEqual(first["queue_wait_ms"], first["latency_ms"])
        self.assertEqual(first["attempts"], 1)
        cut = records["big-1"]
        self.assertTrue(cut["request"]["truncated"])
        self.assertEqual(len(cut["request"]["body"]), 48)
        self.assertGreater(cut["request"]["bytes"], 200)
        self.assertTrue(cut["response"]["truncated"])
        self.assertEqual(records["bad-1"]["request"]["body"], "{not json")
        sse = records["sse-1"]
        self.assertTrue(sse["response"]["stream"])
        self.assertEqual(sse["response"]["stream_events"], 3)
        self.assertTrue(sse["response"]["body"].startswith('data: {"n": 0}'), sse)
        self.assertEqual(gw.metric_sum("flotilla_gateway_inference_records_total",
                                       endpoint="llm"), 4)
        self.assertEqual(gw.metric_sum("flotilla_gateway_inference_records_dropped_total",
                                       endpoint="llm"), 0)
        self.assertFalse(os.path.exists(os.path.join(table_dir, "quiet")))  # not enabled

        # The table view and its filters.
        table = run_to_exit([FLOTILLA_BIN, "logs", "llm", "--data-dir", data_dir,
                             "--status", "2xx", "--since", "5m", "--tail", "2"])
        self.assertEqual(table.returncode, 0, table.stderr)
        lines = table.stdout.decode().splitlines()
        self.assertTrue(lines[0].startswith("TIME"), lines)
        self.assertEqual(len(lines), 3, lines)
        none = run_to_exit([FLOTILLA_BIN, "logs", "llm", "--data-dir", data_dir, "--status",
                            "5xx", "-o", "json"])
        self.assertEqual((none.returncode, none.stdout), (0, b""))
        for args, needle in ((["quiet"], b"has no inference table"),
                             (["llm", "--since", "5 minutes"], b"--since"),
                             (["llm", "--status", "2x"], b"--status")):
            p = run_to_exit([FLOTILLA_BIN, "logs", *args, "--data-dir", data_dir])
            self.assertNotEqual(p.returncode, 0, args)
            self.assertIn(needle, p.stderr, args)
            self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)

        # SIGTERM closes the open file: then it is whole gzip, and never written again.
        gw.srv.stop()
        files = sorted(os.listdir(os.path.join(table_dir, "llm")))
        self.assertEqual(len(files), 1, files)
        self.assertTrue(files[0].endswith(".jsonl.gz"), files)
        with gzip.open(os.path.join(table_dir, "llm", files[0]), "rt") as f:
            self.assertEqual(len(f.read().splitlines()), 4)

    def test_sample_rate_records_a_share_of_the_requests(self):
        echo = start_echo(self)
        data_dir = fresh_dir()
        config = config_yaml({"e": [ver("v1", [rep("e1", echo)])]},
                             inference_tables={"e": {"enabled": True, "sample_rate": 0.25}})
        gw = Gateway(self, config, flags={"--inference-dir": os.path.join(data_dir, "inference")})
        for _ in range(400):
            self.assertEqual(gw.req("POST", "/serving-endpoints/e/invocations", {}).status, 200)
        recorded = wait_until(
            lambda: gw.metric_sum("flotilla_gateway_inference_records_total", endpoint="e"),
            5, what="records counted")
        # 400 draws at 1/4: 100 expected, below 50 or above 150 has odds under 1e-12.
        self.assertTrue(50 <= recorded <= 150, recorded)
        self.read_records(data_dir, "e", int(recorded))


class Streaming(GatewayTestCase):
    """Server-Sent Events pass through as they arrive (tests/integration/echo_upstream.py's
    "sse" bodies time the upstream's stream)."""

    PATH = "/serving-endpoints/llm/invocations"

    def setup_gw(self):
        echo = start_echo(self)
        gw = Gateway(self, config_yaml({"llm": [ver("v1", [rep("e1", echo)])]}))
        return echo, gw

    def open_stream(self, gw, sse, request_id):
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        self.addCleanup(conn.close)
        conn.request("POST", self.PATH, body=json.dumps({"sse": sse}).encode(),
                     headers={"Content-Type": "application/json", "X-Request-Id": request_id})
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        self.assertTrue(r.getheader("content-type", "").startswith("text/event-stream"),
                        r.getheaders())
        self.assertEqual(r.getheader("transfer-encoding"), "chunked", r.getheaders())
        self.assertEqual(r.getheader("x-request-id"), request_id)
        return conn, r

    @staticmethod
    def next_event(r):
        """The next `data:` line of the stream, or None when it ended."""
        while True:
            line = r.readline()
            if not line:
                return None
            line = line.strip()
            if line.startswith(b"data: "):
                return line[len(b"data: "):].decode()

    def test_events_arrive_as_the_upstream_sends_them(self):
        _, gw = self.setup_gw()
        hold = os.path.join(gw.dir, "release")
        conn, r = self.open_stream(gw, {"events": 5, "hold_file": hold}, "sse-1")
        # The upstream sends the rest only once `hold` exists: the first event can only be
        # here if the gateway passed it on before the stream ended.
        self.assertEqual(json.loads(self.next_event(r)), {"n": 0})
        self.assertFalse(os.path.exists(hold))
        with open(hold, "w"):
            pass
        events = []
        while (event := self.next_event(r)) is not None:
            events.append(event)
        self.assertEqual(events, [json.dumps({"n": i}) for i in range(1, 5)] + ["[DONE]"])
        line = gw.wait_access(lambda ln: ln.get("request_id") == "sse-1", "access log line")
        self.assertEqual((line["code"], line["attempts"]), (200, 1), line)
        wait_until(lambda: gw.endpoint_stats("llm")["in_flight"] == 0, 5, what="released")
        self.assertEqual(gw.metric_sum("flotilla_gateway_requests_total", endpoint="llm",
                                       code="200"), 1)
        # The connection serves the next request: a plain JSON answer, unchanged (whole,
        # with its Content-Length).
        conn.request("POST", self.PATH, body=json.dumps({"x": 1}).encode(),
                     headers={"Content-Type": "application/json"})
        r2 = conn.getresponse()
        body = r2.read()
        self.assertEqual(r2.status, 200)
        self.assertEqual(r2.getheader("content-type"), "application/json")
        self.assertEqual(int(r2.getheader("content-length")), len(body))
        self.assertEqual(json.loads(json.loads(body)["body"]), {"x": 1})

    def test_non_stream_response_is_unchanged(self):
        _, gw = self.setup_gw()
        r = gw.req("POST", self.PATH, {"y": [1, 2]})
        j = self.assertOk(r)
        self.assertEqual(json.loads(j["body"]), {"y": [1, 2]})
        self.assertEqual(r.headers.get("content-type"), "application/json")
        self.assertIsNone(r.headers.get("transfer-encoding"), r.headers)
        self.assertEqual(int(r.headers["content-length"]), len(r.body))

    def test_client_disconnect_mid_stream_closes_the_upstream(self):
        _, gw = self.setup_gw()
        closed = os.path.join(gw.dir, "upstream-saw-close")
        conn, r = self.open_stream(gw, {"events": 400, "delay_ms": 50, "closed_file": closed},
                                   "sse-gone")
        self.assertEqual(json.loads(self.next_event(r)), {"n": 0})
        self.assertEqual(gw.endpoint_stats("llm")["in_flight"], 1)
        conn.close()
        r.close()
        # 400 events 50 ms apart would last 20 s: the upstream sees its connection closed
        # once the gateway cancelled the call.
        wait_until(lambda: os.path.exists(closed), 10, interval_s=0.02,
                   what="the upstream seeing its connection closed")
        wait_until(lambda: gw.endpoint_stats("llm")["in_flight"] == 0, 5, interval_s=0.02,
                   what="the gateway's in-flight count back to 0")
        line = gw.wait_access(lambda ln: ln.get("request_id") == "sse-gone", "access log line")
        self.assertEqual(line["code"], 499, line)

    def test_upstream_killed_mid_stream_ends_the_client_stream(self):
        echo, gw = self.setup_gw()
        hold = os.path.join(gw.dir, "never")
        conn, r = self.open_stream(gw, {"events": 2, "hold_file": hold}, "sse-dead")
        self.assertEqual(json.loads(self.next_event(r)), {"n": 0})
        echo.kill()
        t0 = time.monotonic()
        ended = False
        try:
            ended = self.next_event(r) is None
        except (http.client.IncompleteRead, ConnectionError):
            ended = True   # the cut shows as a chunked body that stops short
        self.assertTrue(ended)
        self.assertLess(time.monotonic() - t0, 5.0)
        line = gw.wait_access(lambda ln: ln.get("request_id") == "sse-dead", "access log line")
        self.assertEqual((line["code"], line["attempts"]), (502, 1), line)
        self.assertEqual(gw.metric_sum("flotilla_gateway_retries_total", endpoint="llm"), 0)
        self.assertEqual(gw.metric_sum("flotilla_gateway_requests_total", endpoint="llm",
                                       code="502"), 1)
        wait_until(lambda: gw.endpoint_stats("llm")["in_flight"] == 0, 5, what="released")



# =========================================================================== issue 18

def raw_exchange(port, data):
    """Sends raw request bytes (any, invalid UTF-8 included) on a fresh connection and reads
    one response."""
    c = RawConn(port)
    try:
        c.send(data)
        return c.read_response()
    finally:
        c.close()


class ReplicaDeathIssue18(GatewayTestCase):
    """Issue 18 item 1: a request whose replica failed before any response byte reached the
    client never fails while the endpoint can come back: it goes to another replica, or waits
    in the admission queue (cold-start deadline) for a replacement."""

    def test_single_replica_killed_and_replaced_under_load_loses_nothing(self):
        first = start_replica(self, "solo", 2)
        gw = Gateway(self, config_yaml({"solo": [ver("v1", [rep("r1", first)])]}))
        load = Load(gw.port, infer_path("solo"), oip(), threads=8, total=3000,
                    deadline_s=40).start()
        self.addCleanup(load.stop)
        load.wait_completed(300)
        first.kill()   # SIGKILL: in-flight requests reset, new connects refused
        # what the warm pool does under `flotilla up`: a replacement, in the table soon after
        second = start_replica(self, "solo", 2)
        gw.rewrite(config_yaml({"solo": [ver("v1", [rep("r2", second)])]}),
                   lambda g: g.replica_stats("solo", "r2") is not None, "replacement applied")
        load.join()
        self.assertNoFailures(load)
        self.assertEqual(load.completed, 3000)
        self.assertGreater(gw.metric_sum("flotilla_gateway_retries_total", endpoint="solo"), 0,
                           "the kill left no retry in /metrics")
        self.assertGreater(replica_own_requests(second), 0)

    def test_retry_waits_for_a_replacement_with_its_body(self):
        dead = RefusingPort(self)
        gw = Gateway(self, config_yaml({"w": [ver("v1", [rep("d0", dead.address)])]}))
        body = {"model": "w", "prompt": "kept " * 200}
        out = {}
        conn = RawConn(gw.port)
        self.addCleanup(conn.close)
        conn.send(raw_request("POST", "/v1/completions", body, {"X-Request-Id": "held-1"}))
        reader = threading.Thread(target=read_response_at, args=(conn, out, "r"), daemon=True)
        reader.start()
        wait_until(lambda: gw.endpoint_stats("w")["queued"] == 1, 5, interval_s=0.02,
                   what="the failed request waiting in the queue")
        echo = start_echo(self)
        gw.rewrite(config_yaml({"w": [ver("v1", [rep("e1", echo)])]}),
                   lambda g: g.replica_stats("w", "e1") is not None, "replacement applied")
        reader.join(10)
        _, r = out["r"]
        j = self.assertOk(r)
        self.assertEqual(json.loads(j["body"]), body, "the body was not kept for the retry")
        self.assertEqual(r.headers.get("x-request-id"), "held-1", r.headers)
        line = gw.wait_access(lambda ln: ln.get("request_id") == "held-1", "access log")
        self.assertEqual(line["code"], 200, line)
        self.assertGreaterEqual(line["attempts"], 2, line)

    def test_no_replacement_by_the_deadline_is_503_in_the_route_shape(self):
        dead = RefusingPort(self)
        gw = Gateway(self, config_yaml({"x": [ver("v1", [rep("d0", dead.address)])]}),
                     {"--cold-start-timeout-ms": 300})
        for method, path, body, shape in (
                ("POST", "/v1/chat/completions", {"model": "x", "messages": []}, "openai"),
                ("POST", "/serving-endpoints/x/invocations", {"instances": [[1]]}, "mlflow"),
                ("POST", infer_path("x"), oip(), "oip")):
            with self.subTest(path=path):
                r = gw.req(method, path, body)
                self.assertJsonError(r, 503, shape)
                self.assertEqual(r.headers.get("retry-after"), "1", r.headers)
        r = gw.req("POST", "/v1/completions", {"model": "x", "prompt": "p"})
        self.assertEqual(r.json()["error"]["type"], "unavailable_error", r)
        r = gw.req("POST", "/serving-endpoints/x/invocations", {"instances": [[1]]})
        self.assertEqual(r.json()["error_code"], "TEMPORARILY_UNAVAILABLE", r)


class ErrorShapesIssue18(GatewayTestCase):
    """Issue 18 item 14: the gateway's own errors in the protocol shape of the route, with
    X-Request-Id on every answer; item 6: invalid UTF-8 in the target is a 404, not a 500."""

    @classmethod
    def setUpClass(cls):
        cls.echo = start_echo(cls, cls_level=True)
        cls.token_a, record_a = mint_token("only-a", "a")
        cls.token_all, record_all = mint_token("every")
        cls.gw = Gateway(cls, config_yaml({
            "a": [ver("v1", [rep("e1", cls.echo)], runtime="llm", max_model_len=4096)],
            "b": [ver("v1", [rep("e2", cls.echo)])],
        }, token_records=[record_a, record_all], open_routes=["health"]), cls_level=True)

    def auth(self, token=None):
        return {"Authorization": f"Bearer {token or self.token_a}"}

    ROUTES = (  # (path for endpoint E, body for endpoint E, shape)
        ("/v1/chat/completions", lambda e: {"model": e, "messages": []}, "openai"),
        ("/serving-endpoints/{e}/invocations", lambda e: {"instances": [[1]]}, "mlflow"),
        ("/v2/models/{e}/infer", lambda e: oip(), "oip"),
    )

    def each_route(self, endpoint):
        for path, body, shape in self.ROUTES:
            yield path.format(e=endpoint), body(endpoint), shape

    def test_401_403_404_in_each_route_shape(self):
        openai_types = {401: "authentication_error", 403: "permission_error",
                        404: "not_found_error"}
        mlflow_codes = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                        404: "RESOURCE_DOES_NOT_EXIST"}
        cases = ((401, "a", {}), (401, "a", self.auth("flt_only-a_" + "0" * 64)),
                 (403, "b", self.auth()), (404, "nope", self.auth(self.token_all)))
        for status, endpoint, headers in cases:
            for path, body, shape in self.each_route(endpoint):
                with self.subTest(status=status, path=path):
                    r = self.gw.req("POST", path, body, headers)
                    self.assertJsonError(r, status, shape)
                    j = r.json()
                    if shape == "openai":
                        self.assertEqual(j["error"]["type"], openai_types[status], j)
                        if status == 404:
                            self.assertEqual(j["error"]["code"], "model_not_found", j)
                    elif shape == "mlflow":
                        self.assertEqual(j["error_code"], mlflow_codes[status], j)

    def test_get_on_a_post_route_is_405_with_allow(self):
        for path, _, shape in self.each_route("a"):
            with self.subTest(path=path):
                r = self.gw.req("GET", path, headers=self.auth())
                self.assertJsonError(r, 405, shape)
                self.assertEqual(r.headers.get("allow"), "POST", r.headers)
        r = self.gw.req("POST", "/v1/models", {}, self.auth())
        self.assertJsonError(r, 405, "openai")
        self.assertEqual(r.headers.get("allow"), "GET, HEAD", r.headers)

    def test_every_answer_has_a_request_id(self):
        for method, path, headers in (("GET", "/v2/health/live", {}),
                                      ("GET", "/v1/models", self.auth()),
                                      ("GET", "/gateway/stats", {}),
                                      ("GET", "/v2", self.auth()),
                                      ("GET", "/nope", {})):
            with self.subTest(path=path):
                r = self.gw.req(method, path, headers=headers)
                self.assertTrue(r.headers.get("x-request-id"), r)
        # a proxied answer keeps the id the client gave, and the replica saw the same
        r = self.gw.req("POST", "/v1/completions", {"model": "a", "prompt": "x"},
                        dict(self.auth(), **{"X-Request-Id": "given-7"}))
        j = self.assertOk(r)
        self.assertEqual(r.headers.get("x-request-id"), "given-7")
        sent = {k.lower(): v for k, v in j["headers"]}
        self.assertEqual(sent.get("x-request-id"), "given-7")

    def test_replica_error_paths_echo_invalid_utf8_as_json(self):
        replica = start_replica(self, "fraud", 1)
        for method, path in ((b"GET", b"/\xff"), (b"POST", b"/v2/models/\xff/infer"),
                             (b"POST", b"/v2/models/\xff"), (b"GET", b"/v1/models/\xff")):
            with self.subTest(path=path):
                r = raw_exchange(replica.port, method + b" " + path + b" HTTP/1.1\r\n"
                                 b"Host: x\r\nContent-Length: 2\r\n\r\n{}")
                self.assertIn(r.status, (400, 404, 405), r)
                self.assertIsInstance(r.json(), dict)   # valid JSON (UTF-8) whatever the path

    def test_queue_full_is_429_in_the_openai_shape_with_retry_after(self):
        slow = start_replica(self, "slow", 400)
        gw = Gateway(self, config_yaml({"slow": [ver("v1", [rep("s1", slow, cap=1)])]}),
                     {"--queue-size": 0})
        holder = RawConn(gw.port)
        self.addCleanup(holder.close)
        holder.send(raw_request("POST", infer_path("slow"), oip()))
        wait_until(lambda: gw.endpoint_stats("slow")["in_flight"] == 1, 5, interval_s=0.02,
                   what="the only slot taken")
        r = gw.req("POST", "/v1/completions", {"model": "slow", "prompt": "x"})
        self.assertJsonError(r, 429, "openai")
        self.assertEqual(r.json()["error"]["type"], "rate_limit_error", r)
        self.assertEqual(r.headers.get("retry-after"), "1", r.headers)
        self.assertEqual(holder.read_response().status, 200)


class ModelsAndVersionsIssue18(GatewayTestCase):
    """Issue 18 items 15 and 16 (gateway part): /v1/models lists generative endpoints with
    max_model_len, GET /v1/models/{id}; OIP version paths go to that version; GET /v2."""

    @classmethod
    def setUpClass(cls):
        cls.replica = start_replica(cls, "m", 1, cls_level=True)
        cls.echo = start_echo(cls, cls_level=True)
        cls.gw = Gateway(cls, config_yaml({
            # v2 takes no traffic: only its version path reaches it
            "m": [ver("v1", [rep("r1", cls.replica)], traffic=100),
                  ver("v2", [rep("e1", cls.echo)], traffic=0)],
            "chat": [ver("base", [rep("e2", cls.echo)], runtime="llm", max_model_len=8192)],
            "tree": [ver("v1", [rep("e3", cls.echo)], runtime="xgboost")],
        }), cls_level=True)

    def test_list_models_has_only_generative_endpoints_with_max_model_len(self):
        j = self.assertOk(self.gw.req("GET", "/v1/models"))
        self.assertEqual(j["object"], "list")
        self.assertEqual(j["data"], [{"id": "chat", "object": "model", "created": 0,
                                      "owned_by": "flotilla", "max_model_len": 8192}])

    def test_get_one_model(self):
        j = self.assertOk(self.gw.req("GET", "/v1/models/chat"))
        self.assertEqual((j["id"], j["object"], j["max_model_len"]), ("chat", "model", 8192))
        for name in ("tree", "nope"):
            with self.subTest(name=name):
                r = self.gw.req("GET", f"/v1/models/{name}")
                self.assertJsonError(r, 404, "openai")
                self.assertEqual(r.json()["error"]["code"], "model_not_found")

    def test_version_paths_go_to_that_version(self):
        # v1 (traffic 100) is the synthetic replica; the version path of v2 reaches the echo,
        # without the version segment
        j = self.assertOk(self.gw.req("POST", "/v2/models/m/versions/v1/infer", oip()))
        self.assertIn("outputs", j)
        for path, want in (("/v2/models/m/versions/v2/infer?q=1", "/v2/models/m/infer?q=1"),
                           ("/v2/models/m/versions/v2", "/v2/models/m"),
                           ("/v2/models/m/versions/v2/ready", "/v2/models/m/ready")):
            with self.subTest(path=path):
                method = "POST" if "/infer" in path else "GET"
                j = self.assertOk(self.gw.req(method, path, oip() if method == "POST" else None))
                self.assertEqual(j["path"], want, j)
        j = self.assertOk(self.gw.req("GET", "/v2/models/m/versions/v1/ready"))
        self.assertTrue(j.get("ready"), j)

    def test_unknown_version_is_404_oip(self):
        for method, path in (("POST", "/v2/models/m/versions/v9/infer"),
                             ("GET", "/v2/models/m/versions/v9"),
                             ("GET", "/v2/models/m/versions/v9/ready")):
            with self.subTest(path=path):
                msg = self.assertJsonError(self.gw.req(method, path, oip() if method == "POST"
                                                       else None), 404, "oip")
                self.assertIn("v9", msg)

    def test_invalid_utf8_in_the_target_is_a_json_404(self):
        # issue 18 item 6: these answered 500 "request handler threw"
        for path, shape in ((b"/\xff", "oip"), (b"/serving-endpoints/\xff/invocations", "mlflow"),
                            (b"/v2/models/\xff/infer", "oip"),
                            (b"/v1/models/\xff", "openai")):
            with self.subTest(path=path):
                method = b"GET" if path.startswith(b"/v1/models") or path == b"/\xff" else b"POST"
                r = raw_exchange(self.gw.port, method + b" " + path + b" HTTP/1.1\r\n"
                                 b"Host: x\r\nContent-Length: 2\r\n\r\n{}")
                self.assertJsonError(r, 404, shape)
        self.assertEqual(self.gw.metric_sum("flotilla_bug_total"), 0)

    def test_server_metadata(self):
        j = self.assertOk(self.gw.req("GET", "/v2"))
        self.assertEqual(j.get("name"), "flotilla", j)
        self.assertIsInstance(j.get("version"), str, j)
        self.assertEqual(j.get("extensions"), [], j)



OPENAI_SDK_PROBE = r"""
import json, sys
import openai
port, token = sys.argv[1], sys.argv[2]
out = {}
def call(name, f):
    try:
        out[name] = {"ok": f()}
    except openai.APIStatusError as e:
        out[name] = {"class": type(e).__name__, "status": e.status_code, "type": e.type,
                     "code": e.code, "param": e.param, "message": e.message,
                     "request_id": e.response.headers.get("x-request-id")}
good = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0)
bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="flt_x_" + "0" * 64,
                    max_retries=0)
call("unknown_model", lambda: good.completions.create(model="nope", prompt="x"))
call("bad_key", lambda: bad.chat.completions.create(model="chat", messages=[]))
call("retrieve_unknown", lambda: good.models.retrieve("tree"))
call("list", lambda: [(m.id, (m.model_extra or {}).get("max_model_len"))
                      for m in good.models.list()])
call("retrieve", lambda: good.models.retrieve("chat").id)
print(json.dumps(out))
"""


class OpenAiSdkIssue18(GatewayTestCase):
    """Issue 18 item 14 with the official openai client (pinned; a venv made by
    tests/integration/clients_venv.sh, skipped when PyPI cannot be reached): it reads the
    gateway's errors as typed exceptions with `type` and `code`, and its model list."""

    def test_sdk_reads_error_type_and_code_and_the_model_list(self):
        python = harness.clients_python(self)
        echo = start_echo(self)
        token, record = mint_token("sdk")
        gw = Gateway(self, config_yaml({
            "chat": [ver("v1", [rep("e1", echo)], runtime="llm", max_model_len=4096)],
            "tree": [ver("v1", [rep("e2", echo)], runtime="xgboost")],
        }, token_records=[record]))
        p = subprocess.run([python, "-c", OPENAI_SDK_PROBE, str(gw.port), token],
                           capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        got = json.loads(p.stdout)
        self.assertEqual({k: got["unknown_model"][k] for k in ("class", "status", "type", "code")},
                         {"class": "NotFoundError", "status": 404, "type": "not_found_error",
                          "code": "model_not_found"}, got)
        self.assertTrue(got["unknown_model"]["request_id"], got)
        self.assertEqual({k: got["bad_key"][k] for k in ("class", "status", "type", "code")},
                         {"class": "AuthenticationError", "status": 401,
                          "type": "authentication_error", "code": "invalid_api_key"}, got)
        self.assertEqual(got["retrieve_unknown"]["class"], "NotFoundError", got)
        self.assertEqual(got["list"], {"ok": [["chat", 4096]]}, got)
        self.assertEqual(got["retrieve"], {"ok": "chat"}, got)


# =========================================================================== issue 18: framing

class Framing(GatewayTestCase):
    """Issue 18, items 7-9: Transfer-Encoding other than a single chunked, a body over the limit
    sent whole before the answer is read (urllib), the header timeout from the accept."""

    @classmethod
    def setUpClass(cls):
        cls.echo = start_echo(cls, cls_level=True)
        cls.gw = Gateway(cls, config_yaml({"a": [ver("v1", [rep("e1", cls.echo)])]}),
                         {"--max-body-bytes": 1000, "--header-timeout-ms": 300,
                          "--idle-timeout-ms": 60000}, cls_level=True)

    def conn(self):
        c = RawConn(self.gw.port)
        self.addCleanup(c.close)
        return c

    def test_transfer_encoding_not_a_single_final_chunked_is_400_and_nothing_smuggled(self):
        for te in ("chunked, identity", "identity", "gzip"):
            with self.subTest(te=te):
                c = self.conn()
                smuggled = b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nX-Smuggled: 1\r\n" \
                           b"Content-Length: 2\r\n\r\n{}"
                c.send(b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\n"
                       b"Transfer-Encoding: " + te.encode() + b"\r\n\r\n" + smuggled)
                r = c.read_response()
                self.assertJsonError(r, 400)
                self.assertEqual(r.headers.get("connection"), "close", r)
                closed, _, data = c.wait_closed(5)
                self.assertTrue(closed, "the connection stays open after the 400")
                self.assertEqual(data, b"", "a second answer: the body was read as a request")

    def test_body_over_the_limit_sent_whole_by_urllib_reads_413(self):
        import urllib.error
        import urllib.request
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.gw.port}{infer_path('a')}", data=b"x" * (4 << 20),
            headers={"Content-Type": "application/json"}, method="POST")
        with self.assertRaises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S)
        self.assertEqual(caught.exception.code, 413)
        self.assertIn("error", json.loads(caught.exception.read()))

    def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(self):
        c = self.conn()
        closed, took, data = c.wait_closed(8)
        self.assertTrue(closed, "a silent connection lived past the header timeout")
        self.assertEqual(data, b"")
        self.assertLess(took, 8)


# =========================================================================== issue 18: descriptors

@unittest.skipIf(os.environ.get("FLOTILLA_SANITIZED"),
                 "UBSan's vptr check needs free descriptors (a pipe) to read memory: a sanitized "
                 "gateway out of descriptors reports false errors; the release build runs this")
class FileDescriptors(GatewayTestCase):
    """Issue 18, item 2: a gateway held to 256 descriptors (soft and hard, so raising the soft
    limit gains nothing) in front of a replica, with more connections than it can hold, and
    then with no descriptor left at all."""

    LIMIT = 256
    CONNECTIONS = 300  # more than the gateway could hold descriptors for

    def start_gateway(self, replica):
        directory = fresh_dir()
        config = harness.write_yaml(directory, "gateway.yaml",
                                    config_yaml({"a": [ver("v1", [rep("r", replica)])]}))
        limit = (f"import os, resource, sys; "
                 f"resource.setrlimit(resource.RLIMIT_NOFILE, ({self.LIMIT}, {self.LIMIT})); "
                 f"os.execv(sys.argv[1], sys.argv[1:])")
        # The header timeout is long: connections held idle on purpose must not be closed.
        return harness.start_process(self, [
            PYTHON, "-c", limit, FLOTILLA_BIN, "gateway", "--listen", "127.0.0.1:0",
            "--config", config, "--workers", "2", "--header-timeout-ms", "60000",
            "--upstream-timeout-ms", "5000", "--cold-start-timeout-ms", "1000"])

    def test_over_the_budget_503_no_ejection_no_abort_and_few_log_lines(self):
        replica = start_replica(self, "a", 300)
        gw = self.start_gateway(replica)
        m = wait_until(lambda: re.search(r"serving at most (\d+) connections", gw.stderr()), 5,
                       what="the connection cap in the log")
        cap = int(m.group(1))
        self.assertLess(cap, self.LIMIT)

        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        for _ in range(self.CONNECTIONS):
            socks.append(socket.create_connection(("127.0.0.1", gw.port), timeout=5))

        def answered(sock):
            """True once the gateway wrote to (or closed) `sock` on its own: a 503 past the cap."""
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable)

        # Every connection is accepted: the cap's worth are held idle, the others get a 503.
        wait_until(lambda: sum(map(answered, socks)) == self.CONNECTIONS - cap, 10,
                   interval_s=0.05, what=f"{self.CONNECTIONS - cap} connections answered 503")
        served = [s for s in socks if not answered(s)]
        self.assertEqual(len(served), cap)
        for sock in socks:
            if sock in served:
                continue
            data = b""
            sock.settimeout(5)
            try:
                while b"\r\n\r\n" not in data:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except ConnectionResetError:
                pass
            self.assertTrue(data.startswith(b"HTTP/1.1 503"), data[:200])
            self.assertIn(b"Connection: close", data)

        # Connections within the cap are served; ten at once need ten upstream connections.
        conns = [_SocketConn(sock) for sock in served[:10]]
        for c in conns:
            c.send(raw_request("POST", infer_path("a"), oip()))
        for c in conns:
            self.assertOk(c.read_response())

        # No descriptor left at all (something else took them): new connections are refused
        # cleanly, requests that need a new upstream connection fail as the gateway's own
        # shortage, and the replica is not ejected for it.
        fds = len(os.listdir(f"/proc/{gw.proc.pid}/fd"))
        resource.prlimit(gw.proc.pid, resource.RLIMIT_NOFILE, (fds, self.LIMIT))
        late = [socket.create_connection(("127.0.0.1", gw.port), timeout=5) for _ in range(5)]
        self.addCleanup(lambda: [s.close() for s in late])
        for sock in late:
            data = b""
            try:
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except ConnectionResetError:
                pass
            self.assertTrue(data == b"" or data.startswith(b"HTTP/1.1 503"), data[:200])
        # Twenty at once: more than the upstream connections pooled from the ten before.
        more = [_SocketConn(sock) for sock in served[10:30]]
        for c in more:
            c.send(raw_request("POST", infer_path("a"), oip()))
        statuses = collections.Counter(c.read_response().status for c in more)
        self.assertLessEqual(set(statuses), {200, 502, 503}, statuses)
        self.assertGreater(statuses[502] + statuses[503], 0,
                           f"nothing ran short of descriptors: {statuses}")
        resource.prlimit(gw.proc.pid, resource.RLIMIT_NOFILE, (self.LIMIT, self.LIMIT))

        for c in conns:  # served on as before
            c.send(raw_request("POST", infer_path("a"), oip()))
            self.assertOk(c.read_response())
        self.assertTrue(gw.alive(), gw.stderr())
        for sock in served[30:]:  # room for the checks' own connections
            sock.close()
        r = wait_until(lambda: _try_req(gw.port, "GET", "/metrics"), 5, what="/metrics")
        samples = parse_metrics(r.body.decode())
        ejections = sum(v for (n, _), v in samples.items()
                        if n == "flotilla_gateway_replica_ejections_total")
        self.assertEqual(ejections, 0, "a replica was ejected for the gateway's shortage")
        log = gw.stderr()
        self.assertLessEqual(log.count("accept failed"), 2, log)
        self.assertLessEqual(log.count("too many connections"), 4, log)


class _SocketConn(RawConn):
    """A RawConn on a socket the test opened itself."""

    def __init__(self, sock):  # noqa: super().__init__ would connect anew
        self.sock, self.buf = sock, b""


def _try_req(port, method, path):
    """The response, or None when the request could not be made (yet)."""
    try:
        r = req(port, method, path, timeout=2)
        return r if r.status == 200 else None
    except OSError:
        return None


if __name__ == "__main__":
    unittest.main()
