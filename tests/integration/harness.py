"""Shared helpers for the black-box integration tests (replica_test.py, gateway_test.py).

Everything here is generic: start a real process that prints a `{"event":"listening",...}`
JSON line first on stdout, talk HTTP/1.1 to it on 127.0.0.1 (http.client or a raw socket),
poll for a condition with a deadline, parse Prometheus text, write YAML files atomically.

House rules (STYLE.md §7): real processes on 127.0.0.1, ports chosen by the kernel, every
process stopped by the test that started it, no bare sleeps: wait_until() polls a condition
with a deadline.
"""

import base64
import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

FLOTILLA_BIN = os.environ.get("FLOTILLA_BIN", "")
PROMTOOL = "/usr/bin/promtool"

STARTUP_DEADLINE_S = 15.0   # from exec to the "listening" line
STOP_DEADLINE_S = 10.0      # from SIGTERM to exit when the server is idle
HTTP_TIMEOUT_S = 10.0       # per socket operation


def require_binary(test_file):
    """Raises unless FLOTILLA_BIN names an executable (call from setUpModule)."""
    if not FLOTILLA_BIN:
        raise RuntimeError(
            "FLOTILLA_BIN is not set: point it at the flotilla binary, e.g. "
            "FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 -m unittest -v "
            f"tests/integration/{test_file}")
    if not (os.path.isfile(FLOTILLA_BIN) and os.access(FLOTILLA_BIN, os.X_OK)):
        raise RuntimeError(f"FLOTILLA_BIN={FLOTILLA_BIN!r} is not an executable file")


def venv_python(test, script, name, what):
    """The python of a pinned venv that `script` (next to this file) makes once next to the
    binary, in directory `name`; skips `test` (a TestCase) when it cannot be made, as when PyPI
    cannot be reached. `what` names its packages in the skip message."""
    venv = os.path.join(os.path.dirname(os.path.abspath(FLOTILLA_BIN)), name)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    made = subprocess.run(["bash", path, venv], capture_output=True, timeout=300)
    if made.returncode != 0:
        reason = made.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        print(f"skipping: no venv with {what}: {reason[0]}", file=sys.stderr)
        test.skipTest(f"no venv with {what}: {reason[0]}")
    return made.stdout.decode().strip()


def clients_python(test):
    """The python of the pinned clients' venv (clients_venv.sh: openai, opentelemetry-proto)."""
    return venv_python(test, "clients_venv.sh", "clients-venv", "the pinned clients")


# --------------------------------------------------------------------------- processes

def _tail(b, n=4000):
    s = b.decode("utf-8", "replace")
    return s if len(s) <= n else "…" + s[-n:]


class ServerStartError(AssertionError):
    pass


class Server:
    """One server subprocess whose first stdout line is the JSON listening event
    (`{"event":"listening","host":...,"port":N,...}`). stderr goes to a temp file so it can
    never fill a pipe; the rest of stdout is drained by a thread."""

    def __init__(self, argv, deadline_s=STARTUP_DEADLINE_S):
        self.argv = list(argv)
        self._stderr = tempfile.TemporaryFile()
        self._saved_stderr = None
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        self.stopped = False
        self.returncode = None
        try:
            line = self._read_first_line(deadline_s)
            try:
                self.info = json.loads(line)
            except ValueError:
                raise ServerStartError(f"first stdout line is not JSON: {line!r}\n"
                                       f"stderr:\n{self.stderr()}")
            if not isinstance(self.info, dict) or "port" not in self.info:
                raise ServerStartError(f"bad listening line {line!r}")
            self.port = int(self.info["port"])
            self.name = self.info.get("model")
        except BaseException:
            self.kill()
            raise
        threading.Thread(target=self._drain_stdout, daemon=True).start()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def _read_first_line(self, deadline_s):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + deadline_s
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerStartError(
                    f"no listening line within {deadline_s}s: {self.argv}\n"
                    f"stdout so far: {buf!r}\nstderr:\n{self.stderr()}")
            r, _, _ = select.select([fd], [], [], min(left, 0.2))
            if r:
                chunk = os.read(fd, 4096)
                if not chunk:
                    rc = self.proc.wait(timeout=5)
                    raise ServerStartError(
                        f"server exited (rc={rc}) before listening: {self.argv}\n"
                        f"stdout: {buf!r}\nstderr:\n{self.stderr()}")
                buf += chunk
        self.extra_stdout = buf.split(b"\n", 1)[1]
        return buf.split(b"\n", 1)[0].decode("utf-8", "replace")

    def _drain_stdout(self):
        try:
            while self.proc.stdout.read(4096):
                pass
        except (OSError, ValueError):
            pass

    def stderr(self):
        if self._saved_stderr is not None:
            return self._saved_stderr
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            return _tail(self._stderr.read())
        except (OSError, ValueError):
            return "<stderr unavailable>"

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stopped = True
        self._close_files()

    def reaped(self, rc):
        """The test waited for the exit itself: nothing left for stop() to do."""
        self.stopped, self.returncode = True, rc
        self._close_files()

    def _close_files(self):
        if self._saved_stderr is None:
            self._saved_stderr = self.stderr()
        for f in (self.proc.stdout, self._stderr):
            try:
                f.close()
            except (OSError, ValueError):
                pass

    def stop(self, check=True):
        """SIGTERM, wait, then SIGKILL. With check, a server that crashed earlier,
        did not exit in time, or exited non-zero is an error."""
        if self.stopped:
            return self.returncode
        self.stopped = True
        crashed_before = self.proc.poll()
        killed = False
        if crashed_before is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                killed = True
        self.returncode = self.proc.returncode
        self._close_files()
        err = self.stderr()
        if check:
            if crashed_before is not None:
                raise AssertionError(f"server died on its own (rc={crashed_before}) "
                                     f"{self.argv}\nstderr:\n{err}")
            if killed:
                raise AssertionError(f"server did not exit within {STOP_DEADLINE_S}s "
                                     f"of SIGTERM {self.argv}\nstderr:\n{err}")
            if self.returncode != 0:
                raise AssertionError(f"server exited {self.returncode} after SIGTERM "
                                     f"{self.argv}\nstderr:\n{err}")
        return self.returncode


def start_process(owner, argv, cls_level=False, deadline_s=STARTUP_DEADLINE_S):
    """Start a Server for `argv` and register its stop as a (class) cleanup of `owner`."""
    srv = Server(argv, deadline_s=deadline_s)
    if cls_level:
        owner.addClassCleanup(srv.stop)
    else:
        owner.addCleanup(srv.stop)
    return srv


def run_to_exit(argv, deadline_s=10):
    """Runs a command that should exit by itself; CompletedProcess with bytes out/err."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"{argv} still running after {deadline_s}s; "
                             f"stdout={out[:500]!r} stderr={err[-2000:]!r}")
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


# --------------------------------------------------------------------------- HTTP

class Resp:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers          # dict, lower-case names
        self.body = body

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self):
        return f"<{self.status} {self.headers} {self.body[:300]!r}>"


def req(port, method, path, body=None, headers=None, conn=None, timeout=HTTP_TIMEOUT_S):
    """One request. With `conn` (an http.client.HTTPConnection) reuses it."""
    own = conn is None
    if own:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        if own:
            conn.close()


class RawConn:
    """A plain socket with a minimal HTTP/1.1 response reader (for pipelining,
    slow-client and drain tests, where http.client gets in the way)."""

    def __init__(self, port, timeout=HTTP_TIMEOUT_S):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by server")
        self.buf += chunk

    def _read_until(self, sep):
        while sep not in self.buf:
            self._fill()
        i = self.buf.index(sep) + len(sep)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def _read_n(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self):
        head = self._read_until(b"\r\n\r\n").decode("latin-1")
        lines = head.split("\r\n")
        m = re.match(r"HTTP/1\.[01] (\d{3})( .*)?$", lines[0])
        if not m:
            raise AssertionError(f"bad status line {lines[0]!r}")
        headers = {}
        for ln in lines[1:]:
            if ln:
                k, _, v = ln.partition(":")
                headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._read_until(b"\r\n").split(b";")[0].strip(), 16)
                if size == 0:
                    self._read_until(b"\r\n")
                    break
                body += self._read_n(size)
                self._read_n(2)
        else:
            body = self._read_n(int(headers.get("content-length", "0")))
        return Resp(int(m.group(1)), headers, body)

    def wait_closed(self, deadline_s):
        """Read (and discard) until EOF/reset. Returns (closed, seconds, data)."""
        t0 = time.monotonic()
        data = self.buf
        self.buf = b""
        while True:
            left = deadline_s - (time.monotonic() - t0)
            if left <= 0:
                return False, time.monotonic() - t0, data
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return False, time.monotonic() - t0, data
            except (ConnectionResetError, BrokenPipeError):
                return True, time.monotonic() - t0, data
            if not chunk:
                return True, time.monotonic() - t0, data
            data += chunk


def raw_request(method, path, body=b"", headers=None, keep_alive=True):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    hdrs = {"Host": "127.0.0.1"}
    if body or method in ("POST", "PUT"):
        hdrs["Content-Type"] = "application/json"
        hdrs["Content-Length"] = str(len(body))
    if not keep_alive:
        hdrs["Connection"] = "close"
    hdrs.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    return head.encode() + b"\r\n" + body


# --------------------------------------------------------------------------- waiting

def free_port():
    """A port nothing listens on right now, for servers that cannot bind port 0 themselves
    (nginx) or for a connection that must be refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, deadline_s, interval_s=0.01, what="condition"):
    """Polls `pred` until it returns a truthy value (returned) or the deadline passes."""
    t_end = time.monotonic() + deadline_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= t_end:
            raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")
        time.sleep(interval_s)   # polling interval, not a wait for the condition


# --------------------------------------------------------------------------- metrics

_SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\d+)?$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """{(name, frozenset(labels)): value} for every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            raise AssertionError(f"unparsable metrics line: {line!r}")
        labels = frozenset(_LABEL_RE.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def promtool_check_metrics(text):
    """(ok, output) of `promtool check metrics` on the exposition `text`."""
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
    return p.returncode == 0, p.stdout.decode("utf-8", "replace")


# --------------------------------------------------------------------------- files

def write_yaml(directory, name, text):
    """Writes `text` to directory/name atomically (temp file + rename), so a process that
    watches the file never reads half of it. Returns the path."""
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def assert_json_error(test, r, status):
    """`r` has `status`, a JSON content type and a body {"error": "<non-empty text>"} (the
    gateway's and the OIP error shape). Returns the decoded body."""
    test.assertEqual(r.status, status, r)
    test.assertIn("application/json", r.headers.get("content-type", ""), r)
    j = r.json()
    test.assertIsInstance(j, dict, r)
    test.assertIsInstance(j.get("error"), str, r)
    test.assertTrue(j["error"], r)
    return j


def assert_gateway_error(test, r, status, shape=None, request_id=True):
    """`r` is one of the gateway's own errors: `status`, JSON, an X-Request-Id, and the body in
    the protocol shape of its route (issue 18 item 14): "openai" {"error": {"message", "type",
    "param", "code"}} (the fields the openai client reads), "mlflow" {"error_code", "message"},
    "oip" {"error": "..."}; shape None accepts any of the three. `request_id` False for the
    errors the HTTP server makes before the gateway sees the request (413, 431, 503 for too many
    connections). Returns the message."""
    test.assertEqual(r.status, status, r)
    test.assertIn("application/json", r.headers.get("content-type", ""), r)
    if request_id:
        test.assertTrue(r.headers.get("x-request-id"), r.headers)
    j = r.json()
    test.assertIsInstance(j, dict, r)
    if isinstance(j.get("error"), dict):
        got, e = "openai", j["error"]
        test.assertEqual(set(e), {"message", "type", "param", "code"}, r)
        test.assertIsInstance(e["type"], str, r)
        message = e["message"]
    elif "error_code" in j:
        got, message = "mlflow", j.get("message")
        test.assertEqual(set(j), {"error_code", "message"}, r)
        test.assertRegex(j["error_code"], r"^[A-Z_]+$", r)
    else:
        got, message = "oip", j.get("error")
        test.assertEqual(set(j), {"error"}, r)
    test.assertIsInstance(message, str, r)
    test.assertTrue(message, r)
    if shape is not None:
        test.assertEqual(got, shape, r)
    return message


# --------------------------------------------------------------------------- process table
# For servers that start processes of their own (`flotilla up` runs replicas as child processes
# in their own process groups): find them in /proc, and kill only what is still the process
# that was seen (pid and start time), never a process that reused the pid.

def process_start_ticks(pid):
    """The start time of a live process in clock ticks since boot (/proc/PID/stat field 22),
    or None when there is no such process or it is a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()   # field 3 (the state) onwards
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def process_parent(pid):
    """The parent pid of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def process_cmdline(pid):
    """The argv of a live process as a list of str, or None (gone, zombie, kernel thread)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if not raw:
        return None
    return [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")]


def list_pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def find_processes(match):
    """Pids of live processes whose argv satisfies `match(argv)`."""
    out = []
    for pid in list_pids():
        argv = process_cmdline(pid)
        if argv and process_start_ticks(pid) is not None and match(argv):
            out.append(pid)
    return out


def children_of(ppid):
    """Pids of the live children of `ppid`."""
    return [pid for pid in list_pids()
            if process_parent(pid) == ppid and process_start_ticks(pid) is not None]


class ProcessTracker:
    """Remembers processes (pid + start time) a test has seen so it can kill exactly those
    that still run at teardown. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seen = {}   # pid -> start ticks

    def record(self, pid):
        pid = int(pid)
        if pid <= 0:
            return
        ticks = process_start_ticks(pid)
        if ticks is None:
            return
        with self._lock:
            self._seen.setdefault(pid, ticks)

    def alive(self):
        """The recorded pids that still run as the process that was recorded."""
        with self._lock:
            seen = dict(self._seen)
        return sorted(pid for pid, ticks in seen.items() if process_start_ticks(pid) == ticks)

    def kill_all(self, deadline_s=5.0):
        """SIGKILLs every recorded process still running; returns the pids it killed."""
        killed = self.alive()
        for pid in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        t_end = time.monotonic() + deadline_s
        while self.alive() and time.monotonic() < t_end:
            time.sleep(0.01)   # polling for the kernel to finish the kills
        return killed


def signal_alive(pid, sig, start_ticks):
    """Sends `sig` to `pid` only if it still is the process started at `start_ticks`."""
    if process_start_ticks(pid) != start_ticks:
        return False
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def label_of(body):
    """Which model answered an MLflow request for one iris row: "classifier" (a class label),
    "proba" (three class probabilities), or None for anything else (the iris fixtures of
    tests/fixtures/make_models.py; bench/chaos uses it too)."""
    try:
        preds = json.loads(body)["predictions"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(preds, list) or len(preds) != 1:
        return None
    p = preds[0]
    if isinstance(p, int) and not isinstance(p, bool):
        return "classifier"
    if isinstance(p, list) and len(p) == 3 and all(isinstance(x, float) for x in p):
        return "proba"
    return None


def mint_token_config_map(apiserver, namespace, token_id, endpoints=None, name=None):
    """Mints a token with `flotilla gateway mint-token` and stores it as a token ConfigMap (its
    salted hash, as the gateways read it) in the fake API server `apiserver`; returns the
    token."""
    argv = [FLOTILLA_BIN, "gateway", "mint-token", "--id", token_id]
    for endpoint in endpoints or []:
        argv += ["--endpoint", endpoint]
    minted = run_to_exit(argv)
    assert minted.returncode == 0, minted
    out = minted.stdout.decode()
    data = {"id": token_id,
            "salt": re.search(r'salt: "([0-9a-f]+)"', out).group(1),
            "sha256": re.search(r'sha256: "([0-9a-f]+)"', out).group(1)}
    if endpoints:
        data["endpoints"] = ",".join(endpoints)
    apiserver.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": name or f"token-{token_id}", "namespace": namespace,
                                   "labels": {"flotilla.dev/token": "true"}},
                      "data": data})
    return re.search(r"token: (\S+)", out).group(1)
