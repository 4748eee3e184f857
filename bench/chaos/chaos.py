#!/usr/bin/python3
"""Chaos benchmark for `flotilla up` (issue 18, "Proof, in the repo"): nothing lost under chaos.

One run, bounded in time and requests, on 127.0.0.1 only:

  1. Trains the XGBoost fixtures the tests use (tests/fixtures/make_models.py: iris classifier,
     MLflow directory, and an iris probability model for the rollout) into a temp dir.
  2. Starts `flotilla up` on a fresh data dir with two free ports chosen here (so a restart can
     take the same ones) and deploys two endpoints whose replica counts the autoscaler cannot
     change (concurrency.min = max, per_replica_concurrency pinned at 16):
       single  1 replica  (concurrency 16)      triple  3 replicas (concurrency 48)
  3. Drives closed-loop load through the gateway for the whole run: --clients per endpoint
     (default 8), each on one keep-alive connection, POST /serving-endpoints/E/invocations with
     one iris row. Clients retry nothing: a failed request counts as failed; after a connection
     error a client reconnects (after --reconnect-backoff-ms when the connect itself failed).
  4. After --steady-s of steady load, the chaos period (offsets from its start, I = 20 s):
       every I s from 0     kill -9 a ready replica of `single` and one of `triple`
       0.5 I  (10 s)        rollout: `single` to a new model version (v2), under load
       1.5 I  (30 s)        kill -9 of `flotilla up` itself (its pid only), restarted at once on
                            the same data dir and ports (it adopts its replicas)
       2.5 I  (50 s)        SIGSTOP a ready replica of `triple`, left stopped (the platform has
                            to replace it; the kills spare it). After the up restart on purpose:
                            when a stopped process's parent dies, the kernel sends its (then
                            orphaned) process group SIGHUP and SIGCONT, which would end it.
     then --recovery-s without chaos.
  5. Stops the load, SIGTERMs `flotilla up`, waits for it, and lists every process of this
     run still alive (a process whose stdout/stderr is under the run's dir: every replica and
     warm-pool standby logs there; or whose argv names it). Target: 0.

A request unanswered for --request-timeout-s (20 s, below the gateway's 60 s upstream timeout) is
a client timeout: requests stuck at a hung replica show up as timeouts, not as 504s.

Every request is recorded (start, latency, endpoint, status or error kind) and is assigned to the
phase of the last chaos action started before it: warmup (first 3 s, not counted in latency),
steady, kill, rollout, sigstop, up-restart, recovery. Reported as a table on stdout and as JSON
(--json-out): requests, 2xx, non-2xx by status code, connection errors (refused, reset/EOF,
timeout) by phase and endpoint, p50/p99 of 2xx latency before and during chaos, the up-restart
window (kill -9 to the new gateway listening; connection errors inside it counted apart), the
time each killed replica took to be replaced, the rollout's duration, what became of the
SIGSTOPped replica, and the leftover processes. Targets (issue 18): non-2xx 0 except
connection errors inside the up-restart window; leftover processes 0.

Cleanup: every process started here is killed on every exit path (Ctrl-C, SIGTERM, exceptions):
`flotilla up` runs in its own session (its process group is killed), and every process of the
run's dir (replicas, standbys) is found in /proc and killed; the temp dir is removed unless
--keep-dir.

Usage (from the repository root; about 30 s of set-up plus --duration-s plus shutdown):

    FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 bench/chaos/chaos.py \
        [--duration-s 210] [--clients 8] [--json-out chaos.json]

--duration-s is the load's length (steady + chaos + recovery, 95 to 540 s); the whole run is
bounded by about --duration-s + 2 x --request-timeout-s + 90 s.
"""

import argparse
import array
import asyncio
import bisect
import collections
import http.client
import importlib.util
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import harness  # noqa: E402  (the /proc helpers the integration tests use)

MAKE_MODELS = os.path.join(REPO, "tests", "fixtures", "make_models.py")

IRIS_ROW = [5.1, 3.5, 1.4, 0.2]
TARGET_PER_REPLICA = 16
ENDPOINTS = (("single", 1), ("triple", 3))     # name, replicas
MODEL_V1 = "mlflow_classifier"                 # {"predictions": [0]}
MODEL_V2 = "multiclass.ubj"                    # {"predictions": [[p0, p1, p2]]}

UP_START_DEADLINE_S = 30.0
UP_STOP_DEADLINE_S = 60.0
DEPLOY_DEADLINE_S = 60.0
WARMUP_S = 3.0
API_TIMEOUT_S = 5.0

# Error kinds (negative codes in the per-request record; HTTP statuses are positive).
REFUSED, RESET, TIMEOUT, CONNECT_ERROR, BAD_BODY = -1, -2, -3, -4, -5
KIND_NAMES = {REFUSED: "refused", RESET: "reset/eof", TIMEOUT: "timeout",
              CONNECT_ERROR: "connect-error", BAD_BODY: "bad-200-body"}
CONN_KINDS = (REFUSED, RESET, TIMEOUT, CONNECT_ERROR)

PHASES = ("warmup", "steady", "kill", "rollout", "sigstop", "up-restart", "recovery")
CHAOS_PHASES = ("kill", "rollout", "sigstop", "up-restart")

# SIGINT/SIGTERM during the load end it early (then the run stops and reports as usual); a
# second signal, or one at any other time, aborts (KeyboardInterrupt: cleanup only). A flag
# rather than task cancellation: Python 3.11's asyncio.wait_for can swallow a cancellation.
INTERRUPTED = threading.Event()
LOAD_RUNNING = threading.Event()

_FIRST_LINE_RE = re.compile(
    r"^flotilla up: gateway http://127\.0\.0\.1:(\d+), api http://127\.0\.0\.1:(\d+), "
    r"data dir (.+)$")


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- flotilla up

class Up:
    """One `flotilla up` process in its own session, on the given ports."""

    def __init__(self, binary, data_dir, gateway_port, api_port, flags, stderr_path):
        self.argv = [binary, "up", "--data-dir", data_dir,
                     "--gateway-addr", f"127.0.0.1:{gateway_port}",
                     "--api-addr", f"127.0.0.1:{api_port}", "--grpc-addr", "off", *flags]
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "ab")
        self.t_exec = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._stderr,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.t_listening = None
        try:
            line = self._first_line()
            if not _FIRST_LINE_RE.match(line):
                raise RuntimeError(f"unexpected first line of flotilla up: {line!r}")
        except BaseException:
            self.kill9()
            raise
        self.t_listening = time.monotonic()
        threading.Thread(target=self._drain, daemon=True).start()

    def _first_line(self):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + UP_START_DEADLINE_S
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"flotilla up printed no address line within "
                                   f"{UP_START_DEADLINE_S}s: {self.stderr_tail()}")
            r, _, _ = select.select([fd], [], [], min(left, 0.2))
            if r:
                chunk = os.read(fd, 4096)
                if not chunk:
                    rc = self.proc.wait(timeout=5)
                    raise RuntimeError(f"flotilla up exited (rc={rc}) before its address line: "
                                       f"{self.stderr_tail()}")
                buf += chunk
        return buf.split(b"\n", 1)[0].decode("utf-8", "replace")

    def _drain(self):
        try:
            while self.proc.stdout.read(4096):
                pass
        except (OSError, ValueError):
            pass

    def stderr_tail(self, n=1500):
        try:
            with open(self.stderr_path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return "<no stderr>"
        return text[-n:]

    def alive(self):
        return self.proc.poll() is None

    def kill9(self, group=True):
        """SIGKILL to `flotilla up` (with `group`, to its process group: cleanup; replicas and
        standbys have groups of their own either way)."""
        try:
            if group:
                os.killpg(self.pid, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._close()

    def stop(self, deadline_s=UP_STOP_DEADLINE_S):
        """SIGTERM and wait; returns (exit status or None if it had to be killed, seconds)."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                self.kill9()
                return None, time.monotonic() - t0
        self._close()
        return self.proc.returncode, time.monotonic() - t0

    def _close(self):
        for f in (self.proc.stdout, self._stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass


def api(port, token, method, path, body=None, timeout=API_TIMEOUT_S):
    """(status, decoded JSON or None); raises OSError/HTTPException when nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, None
    finally:
        conn.close()


# --------------------------------------------------------------------------- load

def load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The tests' reading of an answer: "classifier" is MODEL_V1's, "proba" MODEL_V2's.
_HARNESS = load_module("harness", os.path.join(REPO, "tests", "integration", "harness.py"))
_VERSION_OF_LABEL = {"classifier": "v1", "proba": "v2"}


def label_of(body):
    """Which model version wrote an MLflow answer for one iris row: "v1", "v2", or None
    (anything else, a failure)."""
    return _VERSION_OF_LABEL.get(_HARNESS.label_of(body))


async def read_response(reader):
    """(status, body, server closes) of one HTTP/1.1 response."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ConnectionError(f"bad status line {lines[0]!r}")
    status = int(parts[1])
    close = parts[0] == "HTTP/1.0"
    length, chunked = None, False
    for ln in lines[1:]:
        if not ln:
            continue
        k, _, v = ln.partition(":")
        k, v = k.strip().lower(), v.strip().lower()
        if k == "content-length":
            length = int(v)
        elif k == "transfer-encoding":
            chunked = v.endswith("chunked")
        elif k == "connection":
            close = "close" in v
    if chunked:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    elif length is not None:
        body = await reader.readexactly(length)
    else:
        body = await reader.read()
        close = True
    return status, body, close


class Recorder:
    """Every request: start (s since the load began), latency (s), endpoint index, code (HTTP
    status, or a negative error kind). Compact arrays: a run is at most --max-requests."""

    def __init__(self, max_requests):
        self.max_requests = max_requests
        self.start = array.array("d")
        self.latency = array.array("d")
        self.endpoint = array.array("b")
        self.code = array.array("h")
        self.labels = collections.Counter()          # (endpoint, label) of good 2xx answers
        self.samples = collections.defaultdict(list)  # (endpoint, code) -> first few details

    def full(self):
        return len(self.code) >= self.max_requests

    def add(self, t_start, latency, ep, code, detail=None):
        self.start.append(t_start)
        self.latency.append(latency)
        self.endpoint.append(ep)
        self.code.append(code)
        if detail is not None:
            s = self.samples[(ep, code)]
            if len(s) < 3:
                s.append({"t": round(t_start, 3), "latency_s": round(latency, 3),
                          "detail": detail[:200]})


class Load:
    """Closed-loop clients on the gateway, --clients per endpoint, in one asyncio loop."""

    def __init__(self, args, gateway_port, token, recorder, t_base):
        self.args = args
        self.port = gateway_port
        self.rec = recorder
        self.t_base = t_base
        self.stop = False
        body = json.dumps({"instances": [IRIS_ROW]}).encode()
        self.requests = []
        for name, _ in ENDPOINTS:
            self.requests.append(
                (f"POST /serving-endpoints/{name}/invocations HTTP/1.1\r\n"
                 f"Host: 127.0.0.1:{gateway_port}\r\n"
                 f"Authorization: Bearer {token}\r\n"
                 "Content-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n").encode() + body)

    async def client(self, ep):
        timeout = self.args.request_timeout_s
        backoff = self.args.reconnect_backoff_ms / 1000.0
        request = self.requests[ep]
        reader = writer = None
        loop_time = time.monotonic
        while not self.stop and not INTERRUPTED.is_set() and not self.rec.full():
            t0 = loop_time()
            ts = t0 - self.t_base
            if writer is None:
                try:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", self.port), timeout)
                    writer.get_extra_info("socket").setsockopt(
                        socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except ConnectionRefusedError as e:
                    self.rec.add(ts, loop_time() - t0, ep, REFUSED, str(e))
                    reader = writer = None
                    await asyncio.sleep(backoff)
                    continue
                except (OSError, asyncio.TimeoutError) as e:
                    self.rec.add(ts, loop_time() - t0, ep, CONNECT_ERROR,
                                 f"{type(e).__name__}: {e}")
                    reader = writer = None
                    await asyncio.sleep(backoff)
                    continue
            try:
                writer.write(request)
                status, body, close = await asyncio.wait_for(read_response(reader), timeout)
            except asyncio.TimeoutError:
                self.rec.add(ts, loop_time() - t0, ep, TIMEOUT, f"no answer within {timeout}s")
                writer.close()
                reader = writer = None
                continue
            except (OSError, ConnectionError, asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError, ValueError) as e:
                self.rec.add(ts, loop_time() - t0, ep, RESET, f"{type(e).__name__}: {e}")
                writer.close()
                reader = writer = None
                continue
            latency = loop_time() - t0
            if 200 <= status < 300:
                label = label_of(body)
                if label is None:
                    self.rec.add(ts, latency, ep, BAD_BODY, repr(body[:200]))
                else:
                    self.rec.add(ts, latency, ep, status)
                    self.rec.labels[(ep, label)] += 1
            else:
                self.rec.add(ts, latency, ep, status, body[:200].decode("utf-8", "replace"))
            if close:
                writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    async def run(self, duration_s):
        tasks = [asyncio.ensure_future(self.client(ep))
                 for ep in range(len(ENDPOINTS)) for _ in range(self.args.clients)]
        end = self.t_base + duration_s
        while time.monotonic() < end and not self.rec.full() and not INTERRUPTED.is_set():
            await asyncio.sleep(0.2)
        self.stop = True
        # In-flight requests finish or time out (request_timeout_s); then nothing is left.
        done, pending = await asyncio.wait(tasks, timeout=self.args.request_timeout_s + 5)
        for t in pending:
            t.cancel()
        for t in done:
            if t.exception() is not None:
                raise t.exception()


# --------------------------------------------------------------------------- the run

class Run:
    def __init__(self, args):
        self.args = args
        self.binary = os.path.abspath(args.flotilla)
        self.work = os.path.realpath(tempfile.mkdtemp(prefix="flotilla-chaos-"))
        self.data_dir = os.path.join(self.work, "data")
        self.models = os.path.join(self.work, "models")
        self.rng = random.Random(args.seed)
        self.ups = []                 # every Up started (the killed one and its successor)
        self.up = None
        self.token = None
        self.gateway_port = self.api_port = None
        self.t_base = None            # load start (monotonic)
        self.events = []              # dicts: t (s since t_base), kind, ...
        self.phase_marks = []         # (t, phase) in order
        self.errors = []              # chaos actions that failed (text)
        self.stopped = None           # the SIGSTOPped replica: dict pid, ticks, id
        self.lock = threading.Lock()
        self.stop_chaos = threading.Event()
        self.watchers = []
        self.rec = Recorder(args.max_requests)
        self.result = {}

    def now(self):
        return time.monotonic() - self.t_base

    # ---- set-up

    def prepare_models(self):
        load_module("make_models", MAKE_MODELS).make_all(self.models)

    def up_flags(self):
        return ["--drain-timeout-ms", str(self.args.drain_timeout_ms), "--log-level", "warn",
                *self.args.up_flag]

    def start_up(self):
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        self.gateway_port = harness.free_port()
        self.api_port = harness.free_port()
        while self.api_port == self.gateway_port:
            self.api_port = harness.free_port()
        self.up = Up(self.binary, self.data_dir, self.gateway_port, self.api_port,
                     self.up_flags(), os.path.join(self.work, "up-stderr.log"))
        self.ups.append(self.up)
        with open(os.path.join(self.data_dir, "admin.token")) as f:
            self.token = f.read().strip()

    def spec(self, name, replicas, version, model):
        c = TARGET_PER_REPLICA * replicas
        return {"name": name, "served_models": [{
            "name": version, "model": os.path.join(self.models, model), "runtime": "xgboost",
            "concurrency": {"min": c, "max": c},
            "per_replica_concurrency": {"min": TARGET_PER_REPLICA, "max": TARGET_PER_REPLICA}}]}

    def view(self, name):
        status, v = api(self.api_port, self.token, "GET", f"/api/2.0/serving-endpoints/{name}")
        if status != 200 or not isinstance(v, dict):
            raise RuntimeError(f"GET {name}: {status} {v}")
        return v

    @staticmethod
    def ready(view):
        return [r for r in view.get("replicas", []) if r.get("state") == "ready"]

    @staticmethod
    def serving(view, replicas, version=None):
        if view.get("state") != {"ready": "READY", "config_update": "NOT_UPDATING"}:
            return False
        if version is not None and \
                [m["name"] for m in (view.get("config") or {}).get("served_models", [])] != \
                [version]:
            return False
        return len(Run.ready(view)) >= replicas

    def deploy(self):
        for name, replicas in ENDPOINTS:
            status, body = api(self.api_port, self.token, "POST", "/api/2.0/serving-endpoints",
                               self.spec(name, replicas, "v1", MODEL_V1))
            if status != 200:
                raise RuntimeError(f"create {name}: {status} {body}")
        deadline = time.monotonic() + DEPLOY_DEADLINE_S
        for name, replicas in ENDPOINTS:
            while not self.serving(self.view(name), replicas, "v1"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not serving within {DEPLOY_DEADLINE_S}s: "
                                       f"{json.dumps(self.view(name))[:2000]}")
                time.sleep(0.1)
        log("deployed: " + ", ".join(f"{n} ({r} replica{'s' if r > 1 else ''})"
                                     for n, r in ENDPOINTS))

    # ---- chaos actions

    def event(self, kind, **fields):
        e = {"t": round(self.now(), 3), "kind": kind, **fields}
        with self.lock:
            self.events.append(e)
        log(f"t={e['t']:.1f}s {kind} " + " ".join(f"{k}={v}" for k, v in fields.items()))
        return e

    def mark(self, phase):
        with self.lock:
            self.phase_marks.append((self.now(), phase))

    def view_retrying(self, name, deadline_s=8.0):
        """The endpoint's view; the API may be away for a moment (the up restart)."""
        t_end = time.monotonic() + deadline_s
        while True:
            try:
                return self.view(name)
            except (OSError, http.client.HTTPException, RuntimeError):
                if time.monotonic() > t_end or self.stop_chaos.is_set():
                    raise
                time.sleep(0.1)

    def pick_replica(self, name):
        """A ready replica of `name` (never the SIGSTOPped one) that still is a live
        `flotilla replica` process: (id, pid, start ticks) or None."""
        view = self.view_retrying(name)
        stopped_pid = self.stopped["pid"] if self.stopped else None
        candidates = [r for r in self.ready(view) if r.get("pid") != stopped_pid]
        self.rng.shuffle(candidates)
        for r in candidates:
            pid = int(r["pid"])
            ticks = harness.process_start_ticks(pid)
            argv = harness.process_cmdline(pid) or []
            if ticks is not None and len(argv) > 1 and argv[1] == "replica":
                return r["id"], pid, ticks
        return None

    def kill_replica(self, name, replicas):
        picked = self.pick_replica(name)
        if picked is None:
            self.errors.append(f"t={self.now():.1f}s kill {name}: no ready replica to kill")
            return
        rid, pid, ticks = picked
        if not harness.signal_alive(pid, signal.SIGKILL, ticks):
            self.errors.append(f"t={self.now():.1f}s kill {name}: {rid} gone before the kill")
            return
        e = self.event("kill", endpoint=name, replica=rid, pid=pid)
        self.watch(self._watch_replaced, e, name, replicas, rid)

    def _watch_replaced(self, e, name, replicas, rid):
        """Time until `name` has `replicas` ready again without the killed one."""
        t_end = time.monotonic() + 20
        while time.monotonic() < t_end and not self.stop_chaos.is_set():
            try:
                ready = [r["id"] for r in self.ready(self.view(name))]
                if rid not in ready and len(ready) >= replicas:
                    e["replaced_after_s"] = round(self.now() - e["t"], 3)
                    return
            except (OSError, http.client.HTTPException, RuntimeError):
                pass
            time.sleep(0.05)
        e["replaced_after_s"] = None

    def rollout(self):
        self.mark("rollout")
        spec = self.spec("single", 1, "v2", MODEL_V2)
        status, body = api(self.api_port, self.token, "PUT",
                           "/api/2.0/serving-endpoints/single/config", spec, timeout=30)
        e = self.event("rollout", endpoint="single", to="v2", api_status=status)
        if status != 200:
            self.errors.append(f"rollout: PUT answered {status} {body}")
            return
        self.watch(self._watch_rollout, e)

    def _watch_rollout(self, e):
        t_end = time.monotonic() + 60
        while time.monotonic() < t_end and not self.stop_chaos.is_set():
            try:
                if self.serving(self.view("single"), 1, "v2"):
                    e["complete_after_s"] = round(self.now() - e["t"], 3)
                    return
            except (OSError, http.client.HTTPException, RuntimeError):
                pass
            time.sleep(0.05)
        e["complete_after_s"] = None

    def sigstop(self):
        self.mark("sigstop")
        picked = self.pick_replica("triple")
        if picked is None:
            self.errors.append("sigstop: no ready replica of triple")
            return
        rid, pid, ticks = picked
        if not harness.signal_alive(pid, signal.SIGSTOP, ticks):
            self.errors.append(f"sigstop: {rid} gone before the signal")
            return
        self.stopped = {"id": rid, "pid": pid, "ticks": ticks}
        e = self.event("sigstop", endpoint="triple", replica=rid, pid=pid)
        self.watch(self._watch_sigstop, e, rid, pid, ticks)

    def _watch_sigstop(self, e, rid, pid, ticks):
        """When the stopped replica leaves the ready set (replaced or failed) and when its
        process is gone; polled until the chaos ends."""
        e["left_ready_after_s"] = None
        e["process_gone_after_s"] = None
        e["state_at_end"] = None
        while not self.stop_chaos.is_set():
            e["watched_s"] = round(self.now() - e["t"], 3)
            if e["process_gone_after_s"] is None and \
                    harness.process_start_ticks(pid) != ticks:
                e["process_gone_after_s"] = round(self.now() - e["t"], 3)
            try:
                view = self.view("triple")
                states = {r["id"]: r.get("state") for r in view.get("replicas", [])}
                e["state_at_end"] = states.get(rid, "not listed")
                if e["left_ready_after_s"] is None and states.get(rid) != "ready":
                    e["left_ready_after_s"] = round(self.now() - e["t"], 3)
            except (OSError, http.client.HTTPException, RuntimeError):
                pass
            self.stop_chaos.wait(0.2)

    def restart_up(self):
        self.mark("up-restart")
        old = self.up
        e = self.event("up-kill", pid=old.pid)
        t_kill = time.monotonic()
        old.kill9(group=False)
        attempts = []
        t_end = time.monotonic() + 30
        while True:
            try:
                self.up = Up(self.binary, self.data_dir, self.gateway_port, self.api_port,
                             self.up_flags(), os.path.join(self.work, "up2-stderr.log"))
                self.ups.append(self.up)
                break
            except RuntimeError as err:   # e.g. a port not free yet: try again, bounded
                attempts.append(str(err)[-300:])
                if time.monotonic() > t_end:
                    raise RuntimeError(f"flotilla up did not restart: {attempts}") from None
                time.sleep(0.2)
        e["restart_attempts_failed"] = attempts
        e["listening_after_s"] = round(self.up.t_listening - t_kill, 3)
        e["t_listening"] = round(self.up.t_listening - self.t_base, 3)
        log(f"flotilla up restarted, listening {e['listening_after_s']:.3f}s after the kill")
        self.watch(self._watch_adopted, e)

    def _watch_adopted(self, e):
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and not self.stop_chaos.is_set():
            try:
                if all(self.serving(self.view(n), r) for n, r in ENDPOINTS):
                    e["serving_after_s"] = round(self.now() - e["t"], 3)
                    return
            except (OSError, http.client.HTTPException, RuntimeError):
                pass
            time.sleep(0.05)
        e["serving_after_s"] = None

    def watch(self, fn, *a):
        t = threading.Thread(target=self._guarded, args=(fn, *a), daemon=True)
        self.watchers.append(t)
        t.start()

    def _guarded(self, fn, *a):
        try:
            fn(*a)
        except Exception as err:  # noqa: BLE001  (a failed action is reported, the run goes on)
            self.errors.append(f"t={self.now():.1f}s {fn.__name__}: {type(err).__name__}: {err}")

    def schedule(self):
        a = self.args
        t0 = a.steady_s
        chaos_s = a.duration_s - a.steady_s - a.recovery_s
        interval = a.kill_interval_s
        plan = [(t0 + k * interval, "kill") for k in range(int(chaos_s // interval) + 1)
                if k * interval < chaos_s]
        plan += [(t0 + 0.5 * interval, "rollout"), (t0 + 1.5 * interval, "up-restart"),
                 (t0 + 2.5 * interval, "sigstop"), (t0 + chaos_s, "recovery")]
        return sorted(plan)

    def chaos(self):
        """The chaos thread: runs the plan at its times (late when an action took longer)."""
        self.mark("warmup")
        if self.stop_chaos.wait(WARMUP_S):
            return
        self.mark("steady")
        for t, what in self.schedule():
            if self.stop_chaos.wait(max(0.0, t - self.now())) or INTERRUPTED.is_set():
                return
            try:
                if what == "kill":
                    self.mark("kill")
                    threads = [threading.Thread(target=self._guarded,
                                                args=(self.kill_replica, n, r))
                               for n, r in ENDPOINTS]
                    for th in threads:
                        th.start()
                    for th in threads:
                        th.join()
                elif what == "rollout":
                    self.rollout()
                elif what == "sigstop":
                    self.sigstop()
                elif what == "up-restart":
                    self.restart_up()
                elif what == "recovery":
                    self.mark("recovery")
            except Exception as err:  # noqa: BLE001
                self.errors.append(f"t={self.now():.1f}s {what}: {type(err).__name__}: {err}")
                log(f"chaos action {what} failed: {err}")

    def run_load(self):
        self.t_base = time.monotonic()
        load = Load(self.args, self.gateway_port, self.token, self.rec, self.t_base)
        chaos = threading.Thread(target=self._guarded, args=(self.chaos,), daemon=True)
        chaos.start()
        LOAD_RUNNING.set()
        try:
            asyncio.run(load.run(self.args.duration_s))
        finally:
            LOAD_RUNNING.clear()
            self.t_load_end = self.now()
            self.stop_chaos.set()
            chaos.join(40)
            for t in self.watchers:
                t.join(10)

    # ---- processes of this run

    def run_processes(self):
        """{pid: description} of every live process of this run but this script: argv naming
        the run's dir, or stdout/stderr under it (replicas and warm-pool standbys log to
        DATA/logs, `flotilla up` to the run's dir)."""
        out = {}
        me = os.getpid()
        prefix = self.work + os.sep
        for pid in harness.list_pids():
            if pid == me:
                continue
            ticks = harness.process_start_ticks(pid)
            if ticks is None:
                continue
            argv = harness.process_cmdline(pid) or []
            why = "argv" if any(prefix in a for a in argv) else None
            if why is None:
                for fd in (1, 2):
                    try:
                        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                            why = f"fd{fd}"
                            break
                    except OSError:
                        pass
            if why is None:
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    st = f.read()
                state = st[st.rfind(")") + 2:].split()[0]
            except OSError:
                state = "?"
            out[pid] = {"pid": pid, "ticks": ticks, "state": state,
                        "ppid": harness.process_parent(pid), "argv": " ".join(argv)[:300],
                        "found_by": why}
        return out

    def shutdown(self):
        """Stops `flotilla up` the way a user does and lists what of this run still runs."""
        s = self.stopped
        sig = {}
        if s is not None:
            alive = harness.process_start_ticks(s["pid"]) == s["ticks"]
            listed_ready = False
            try:
                listed_ready = any(r["id"] == s["id"] for r in self.ready(self.view("triple")))
            except (OSError, http.client.HTTPException, RuntimeError):
                pass
            sig = {"alive_at_end": alive, "still_ready_at_end": listed_ready,
                   "sigcont_before_shutdown": False}
            # Still the platform's ready replica: it never acted; resume it so the shutdown
            # measures the platform's stop, not a process nobody told to run. One it dropped
            # but left alive (stopped) is left as it is: a leftover if it survives the stop.
            if alive and listed_ready:
                harness.signal_alive(s["pid"], signal.SIGCONT, s["ticks"])
                sig["sigcont_before_shutdown"] = True
        self.result["sigstop_end"] = sig
        before = self.run_processes()
        rc, secs = self.up.stop()
        log(f"flotilla up stopped: exit {rc} after {secs:.2f}s")
        at_exit = self.run_processes()
        t_end = time.monotonic() + self.args.leftover_grace_s
        left = at_exit
        while left and time.monotonic() < t_end:
            time.sleep(0.1)
            left = self.run_processes()
        self.result["shutdown"] = {
            "up_exit_status": rc, "up_stop_s": round(secs, 3),
            "processes_before_stop": len(before),
            "leftover_at_exit": sorted(at_exit.values(), key=lambda p: p["pid"]),
            "leftover_after_grace": sorted(left.values(), key=lambda p: p["pid"]),
            "grace_s": self.args.leftover_grace_s}

    def cleanup(self):
        """Every exit path: kill `flotilla up` (each one started) and every process of this run."""
        for sig in (signal.SIGINT, signal.SIGTERM):   # nothing interrupts the cleanup itself
            signal.signal(sig, signal.SIG_IGN)
        self.stop_chaos.set()
        for up in self.ups:
            if up.alive():
                up.kill9()
        for _ in range(3):
            procs = self.run_processes()
            if not procs:
                break
            for p in procs.values():
                harness.signal_alive(p["pid"], signal.SIGCONT, p["ticks"])
                harness.signal_alive(p["pid"], signal.SIGKILL, p["ticks"])
            t_end = time.monotonic() + 5
            while time.monotonic() < t_end and any(
                    harness.process_start_ticks(p["pid"]) == p["ticks"] for p in procs.values()):
                time.sleep(0.05)
        if self.args.keep_dir:
            log(f"kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    # ---- report

    def phase_of(self):
        marks = sorted(self.phase_marks)
        times = [t for t, _ in marks]

        def f(t):
            i = bisect.bisect_right(times, t) - 1
            return marks[i][1] if i >= 0 else "warmup"
        return f

    def report(self):
        rec = self.rec
        phase_of = self.phase_of()
        names = [n for n, _ in ENDPOINTS]
        restart = next((e for e in self.events if e["kind"] == "up-kill"), None)
        window = None
        if restart is not None and "t_listening" in restart:
            window = (restart["t"], restart["t_listening"])

        def empty():
            return {"sent": 0, "2xx": 0, "non2xx": collections.Counter(),
                    "conn": collections.Counter(), "lat": array.array("d")}
        by_phase = collections.defaultdict(empty)
        by_ep = collections.defaultdict(empty)
        by_phase_ep = collections.defaultdict(empty)
        in_window = collections.Counter()
        out_window = collections.Counter()
        first_ok_after_kill = {}
        # While the SIGSTOPped replica is still listed ready, every failure of its endpoint
        # (whatever the phase label says) is counted here too: that is the hung replica's cost.
        stop_ev = next((e for e in self.events if e["kind"] == "sigstop"), None)
        stop_span = None
        if stop_ev is not None:
            left = stop_ev.get("left_ready_after_s")
            stop_span = (stop_ev["t"], stop_ev["t"] + left if left is not None else float("inf"),
                         names.index(stop_ev["endpoint"]))
        stop_failures = collections.Counter()
        for i in range(len(rec.code)):
            t, lat, ep, code = rec.start[i], rec.latency[i], rec.endpoint[i], rec.code[i]
            ph = phase_of(t)
            for b in (by_phase[ph], by_ep[names[ep]], by_phase_ep[(ph, names[ep])]):
                b["sent"] += 1
                if 200 <= code < 300:
                    b["2xx"] += 1
                    b["lat"].append(lat)
                elif code > 0:
                    b["non2xx"][str(code)] += 1
                elif code in CONN_KINDS:
                    b["conn"][KIND_NAMES[code]] += 1
                else:
                    b["non2xx"][KIND_NAMES[code]] += 1
            if code in CONN_KINDS:
                done = t + lat
                if window and window[0] <= done <= window[1]:
                    in_window[KIND_NAMES[code]] += 1
                else:
                    out_window[KIND_NAMES[code]] += 1
            if stop_span and ep == stop_span[2] and stop_span[0] <= t < stop_span[1] and \
                    not 200 <= code < 300:
                stop_failures[str(code) if code > 0 else KIND_NAMES[code]] += 1
            if window and 200 <= code < 300 and t >= window[0]:
                first_ok_after_kill.setdefault(names[ep], round(t + lat - window[0], 3))

        def pcts(lats):
            """(p50, p99) in ms, nearest rank."""
            if not lats:
                return None, None
            lats = sorted(lats)
            return tuple(round(1000 * lats[min(len(lats) - 1, int(q * len(lats)))], 3)
                         for q in (0.50, 0.99))

        def summary(b):
            p50, p99 = pcts(b["lat"])
            return {"sent": b["sent"], "2xx": b["2xx"],
                    "non2xx": dict(sorted(b["non2xx"].items())),
                    "non2xx_total": sum(b["non2xx"].values()),
                    "conn_errors": dict(sorted(b["conn"].items())),
                    "conn_errors_total": sum(b["conn"].values()),
                    "p50_ms": p50, "p99_ms": p99}

        chaos_lat = array.array("d")
        for ph in CHAOS_PHASES:
            b = by_phase.get(ph)
            if b:
                chaos_lat.extend(b["lat"])
        total = empty()
        for b in by_phase.values():
            total["sent"] += b["sent"]
            total["2xx"] += b["2xx"]
            total["non2xx"].update(b["non2xx"])
            total["conn"].update(b["conn"])
        steady = by_phase.get("steady", empty())
        kills = [e for e in self.events if e["kind"] == "kill"]
        self.result.update({
            "config": {k: v for k, v in vars(self.args).items()},
            "binary": self.binary,
            "load_s": round(getattr(self, "t_load_end", 0.0), 3),
            "totals": summary(total),
            "latency_ms": dict(zip(("steady_p50", "steady_p99", "chaos_p50", "chaos_p99"),
                                   pcts(steady["lat"]) + pcts(chaos_lat))),
            "phases": {ph: summary(by_phase[ph]) for ph in PHASES if ph in by_phase},
            "endpoints": {n: summary(by_ep[n]) for n in names if n in by_ep},
            "phase_endpoint": {f"{ph}/{n}": summary(by_phase_ep[(ph, n)])
                               for ph in PHASES for n in names if (ph, n) in by_phase_ep},
            "answers": {f"{names[ep]}/{label}": c for (ep, label), c in sorted(rec.labels.items())},
            "up_restart": {
                "window_s": round(window[1] - window[0], 3) if window else None,
                "serving_after_s": restart.get("serving_after_s") if restart else None,
                "failed_restart_attempts": len(restart.get("restart_attempts_failed", []))
                if restart else None,
                "conn_errors_inside_window": dict(in_window),
                "conn_errors_outside_window": dict(out_window),
                "first_2xx_after_kill_s": first_ok_after_kill},
            "sigstop_failures_while_listed": dict(stop_failures),
            "kills": {n: {"count": sum(1 for e in kills if e["endpoint"] == n),
                          "replaced_after_s": [e.get("replaced_after_s") for e in kills
                                               if e["endpoint"] == n]} for n in names},
            "events": self.events,
            "chaos_errors": self.errors,
            "error_samples": {f"{names[ep]}/{code if code > 0 else KIND_NAMES[code]}": s
                              for (ep, code), s in sorted(rec.samples.items())},
        })
        return self.result


def print_table(r):
    def codes(d):
        return " ".join(f"{k}:{v}" for k, v in d.items()) or "-"

    def ms(v):
        return "-" if v is None else f"{v:.2f}"
    row = "{:<20} {:>8} {:>8} {:>8}  {:<24} {:<28} {:>8} {:>8}"
    print(row.format("phase", "sent", "2xx", "non-2xx", "non-2xx by status",
                     "conn errors", "p50 ms", "p99 ms"))
    groups = list(r["phases"].items()) + [("-- " + k, v) for k, v in r["endpoints"].items()] \
        + [("-- total", r["totals"])]
    for name, s in groups:
        print(row.format(name, s["sent"], s["2xx"], s["non2xx_total"], codes(s["non2xx"]),
                         codes(s["conn_errors"]), ms(s["p50_ms"]), ms(s["p99_ms"])))
    print()
    for name, s in r["phase_endpoint"].items():
        if s["non2xx_total"] or s["conn_errors_total"]:
            print(f"  {name}: non-2xx {codes(s['non2xx'])}; conn errors {codes(s['conn_errors'])}")
    lat = r["latency_ms"]
    print(f"\nlatency of 2xx: steady p50 {ms(lat['steady_p50'])} ms, p99 {ms(lat['steady_p99'])} ms;"
          f" during chaos p50 {ms(lat['chaos_p50'])} ms, p99 {ms(lat['chaos_p99'])} ms")
    u = r["up_restart"]
    print(f"up restart: kill -9 to listening {u['window_s']} s; endpoints serving again "
          f"{u['serving_after_s']} s after the kill; first 2xx after it {u['first_2xx_after_kill_s']}"
          f"; conn errors inside the window {u['conn_errors_inside_window'] or 0}, outside "
          f"{u['conn_errors_outside_window'] or 0}")
    for n, k in r["kills"].items():
        print(f"kills of {n}: {k['count']}, replaced after (s) {k['replaced_after_s']}")
    ro = next((e for e in r["events"] if e["kind"] == "rollout"), None)
    if ro:
        print(f"rollout of single to v2: complete {ro.get('complete_after_s')} s after the PUT; "
              f"answers {r['answers']}")
    st = next((e for e in r["events"] if e["kind"] == "sigstop"), None)
    if st:
        def after(k):
            v = st.get(k)
            return f"after {v} s" if v is not None else f"never (watched {st.get('watched_s')} s)"
        print(f"SIGSTOP {st['replica']}: left the ready set {after('left_ready_after_s')}, "
              f"process gone {after('process_gone_after_s')}, state at the end "
              f"{st.get('state_at_end')}; failures of {st['endpoint']} while it was listed ready "
              f"{r.get('sigstop_failures_while_listed') or 0}; at shutdown {r.get('sigstop_end')}")
    sd = r.get("shutdown", {})
    if sd:
        print(f"shutdown: flotilla up exit {sd['up_exit_status']} after {sd['up_stop_s']} s; "
              f"leftover processes at its exit {len(sd['leftover_at_exit'])}, "
              f"{sd['grace_s']} s later {len(sd['leftover_after_grace'])}")
        for p in sd["leftover_after_grace"]:
            print(f"  leftover pid {p['pid']} ppid {p['ppid']} state {p['state']}: {p['argv']}")
    if r["chaos_errors"]:
        print("chaos actions that failed: " + "; ".join(r["chaos_errors"]))
    if r["error_samples"]:
        print("samples:")
        for k, s in r["error_samples"].items():
            print(f"  {k}: {s[:2]}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flotilla", default=os.environ.get(
        "FLOTILLA_BIN", os.path.join(REPO, "build", "release", "flotilla")))
    p.add_argument("--duration-s", type=float, default=210,
                   help="load duration: steady + chaos + recovery (95..540)")
    p.add_argument("--steady-s", type=float, default=20, help="steady load before the chaos")
    p.add_argument("--recovery-s", type=float, default=15, help="load after the last action")
    p.add_argument("--kill-interval-s", type=float, default=20)
    p.add_argument("--clients", type=int, default=8, help="closed-loop clients per endpoint")
    p.add_argument("--request-timeout-s", type=float, default=20,
                   help="a request unanswered this long is a timeout (a failure)")
    p.add_argument("--reconnect-backoff-ms", type=float, default=50,
                   help="wait after a failed connect before the next attempt")
    p.add_argument("--max-requests", type=int, default=4_000_000)
    p.add_argument("--drain-timeout-ms", type=int, default=5000,
                   help="flotilla up --drain-timeout-ms (bounds every replica stop)")
    p.add_argument("--up-flag", action="append", default=[],
                   help="extra flag for flotilla up (repeatable), e.g. --up-flag=--warm-pool=2")
    p.add_argument("--leftover-grace-s", type=float, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json-out", help="write the full result as JSON here")
    p.add_argument("--keep-dir", action="store_true", help="keep the temp dir (logs, state)")
    a = p.parse_args(argv)
    chaos_s = a.duration_s - a.steady_s - a.recovery_s
    if not 95 <= a.duration_s <= 540 or chaos_s < 2.5 * a.kill_interval_s + 10:
        p.error(f"--duration-s {a.duration_s}: must be 95..540 s and leave at least "
                f"{2.5 * a.kill_interval_s + 10:.0f} s of chaos after --steady-s and --recovery-s")
    if not 1 <= a.clients <= 256:
        p.error("--clients: 1..256")
    if not 1 <= a.request_timeout_s <= 60:
        p.error("--request-timeout-s: 1..60")
    if not (os.path.isfile(a.flotilla) and os.access(a.flotilla, os.X_OK)):
        p.error(f"no flotilla binary at {a.flotilla!r} (set FLOTILLA_BIN or --flotilla)")
    return a


def main(argv):
    args = parse_args(argv)

    def on_signal(signum, frame):
        first = not INTERRUPTED.is_set()
        INTERRUPTED.set()
        if first and LOAD_RUNNING.is_set():
            log(f"signal {signum}: ending the load now (again: abort)")
            return
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_signal)
    run = Run(args)
    interrupted = None
    try:
        log(f"work dir {run.work}; training the fixtures")
        run.prepare_models()
        run.start_up()
        log(f"flotilla up: gateway 127.0.0.1:{run.gateway_port}, api 127.0.0.1:{run.api_port}")
        run.deploy()
        log(f"load: {args.clients} clients per endpoint for {args.duration_s:.0f} s; "
            f"plan {[(round(t), w) for t, w in run.schedule()]}")
        run.run_load()
        if INTERRUPTED.is_set():
            interrupted = "interrupted: the load ended early"
        run.shutdown()
    except KeyboardInterrupt:
        interrupted = "interrupted"
        log("interrupted: cleaning up")
    except Exception as err:  # noqa: BLE001  (reported; cleanup runs regardless)
        interrupted = f"{type(err).__name__}: {err}"
        log(f"run failed: {interrupted}")
    finally:
        run.cleanup()
    if run.t_base is None:
        return 1
    result = run.report()
    result["aborted"] = interrupted
    print_table(result)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0 if interrupted is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
