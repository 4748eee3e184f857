"""`flotilla pull` and `flotilla artifact pack` against real HTTP servers on 127.0.0.1 (issue #6).

Two servers: Debian's nginx serving a directory (it honours Range), and a small server of ours
in this process that injects faults: drops connections mid-range, ignores Range, sends wrong
bytes, truncates a response, fails after a number of ranges (then heals, for resume), and counts
every range it is asked for.
"""

import hashlib
import http.server
import json
import os
import re
import resource
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

NGINX = "/usr/sbin/nginx"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20


def setUpModule():
    harness.require_binary("store_test.py")


def digest(data):
    return hashlib.sha256(data).hexdigest()


def pull(uri, data_dir, *flags, preexec_fn=None, timeout=60, env=None):
    """Runs `flotilla pull`; returns (returncode, stdout, stderr)."""
    p = subprocess.run([harness.FLOTILLA_BIN, "pull", uri, "--data-dir", data_dir,
                        "--range-mib", "1", *flags],
                       capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn,
                       env=env)
    return p.returncode, p.stdout, p.stderr


def cache_files(data_dir):
    """Every file under DIR/cache/blobs and DIR/cache/artifacts."""
    found = []
    for sub in ("blobs", "artifacts"):
        for root, _, files in os.walk(os.path.join(data_dir, "cache", sub)):
            found += [os.path.join(root, f) for f in files]
    return found


class Nginx:
    """nginx serving `root` on a free port: / as is, /slow/ at 8 MiB/s per connection; over TLS
    with `tls` = (certificate, key) files."""

    def __init__(self, root, tls=None):
        self.dir = tempfile.mkdtemp(prefix="flotilla-nginx-")
        self.tls = tls
        for attempt in range(5):
            self.port = harness.free_port()
            conf = os.path.join(self.dir, "nginx.conf")
            with open(conf, "w") as f:
                f.write(f"""daemon off;
worker_processes 1;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log {self.dir}/access.log;
  server {{
    listen 127.0.0.1:{self.port}{" ssl" if tls else ""};
    {f"ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};" if tls else ""}
    root {root};
    location /slow/ {{ alias {root}/; limit_rate 8m; }}
  }}
}}
""")
            self.proc = subprocess.Popen([NGINX, "-c", conf, "-p", self.dir],
                                         stderr=subprocess.DEVNULL)
            try:
                harness.wait_until(lambda: self._listening() or self.proc.poll() is not None,
                                   5, what="nginx to listen")
            except AssertionError:
                pass
            if self.proc.poll() is None and self._listening():
                return
            self.stop()
        raise AssertionError("nginx did not start")

    def _listening(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def url(self, path, host="127.0.0.1"):
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/{path}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class FaultHandler(http.server.BaseHTTPRequestHandler):
    """Serves FaultServer.files under /<mode>/<name>; the mode decides the fault."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        parts = self.path.split("?")[0].split("/", 2)
        if len(parts) < 3 or parts[2] not in server.files:
            self.send_error(404)
            return
        mode, name = parts[1], parts[2]
        data = server.files[name]
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        with server.lock:
            server.requests.append((mode, name, m.group(0) if m else None))
            first_time = (mode, name, m.group(0) if m else None) not in server.seen
            server.seen.add((mode, name, m.group(0) if m else None))
        if mode in ("norange", "truncate") or not m:
            body = data
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if mode == "truncate":
                self.wfile.write(body[:len(body) // 2])
                self.close_connection = True
                return
            self.wfile.write(body)
            return
        first, last = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
        body = data[first:last + 1]
        if mode == "failafter" and last > 0:
            with server.lock:
                served = len({r for (md, _, r) in server.requests
                              if md == "failafter" and r and r != "bytes=0-0"})
            if not server.healed and served > server.fail_after:
                self.send_error(503)
                return
        if mode == "corrupt" and first == 0 and last > 0:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "drop" and first_time and last > 0:
            self.wfile.write(body[:len(body) // 2])  # then the connection drops
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if mode == "slow":
            time.sleep(0.05)
        self.wfile.write(body)


class FaultServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self, files):
        super().__init__(("127.0.0.1", 0), FaultHandler)
        self.files = files
        self.lock = threading.Lock()
        self.requests = []
        self.seen = set()
        self.fail_after = 3
        self.healed = False
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def url(self, mode, name):
        return f"http://127.0.0.1:{self.server_address[1]}/{mode}/{name}"

    def ranges(self, mode, name):
        return [r for (md, n, r) in self.requests if md == mode and n == name]

    def stop(self):
        self.shutdown()
        self.server_close()


class StoreTest(unittest.TestCase):
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="flotilla-store-")
        os.chmod(cls.root, 0o755)  # nginx's workers run as another user
        cls.www = os.path.join(cls.root, "www")
        os.makedirs(os.path.join(cls.www, "model", "sub"))
        cls.big = os.urandom(9 * MIB + 12345)  # 10 ranges of 1 MiB, the last one short
        with open(os.path.join(cls.www, "model", "weights.bin"), "wb") as f:
            f.write(cls.big)
        with open(os.path.join(cls.www, "model", "config.json"), "w") as f:
            f.write('{"layers": 2}')
        with open(os.path.join(cls.www, "model", "sub", "tokenizer.txt"), "w") as f:
            f.write("a b c\n")
        with open(os.path.join(cls.www, "empty.bin"), "wb"):
            pass
        cls.nginx = Nginx(cls.www)
        cls.addClassCleanup(cls.nginx.stop)
        cls.faults = FaultServer({"weights.bin": cls.big, "small.bin": b"0123456789" * 1000})
        cls.addClassCleanup(cls.faults.stop)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def data_dir(self):
        d = tempfile.mkdtemp(prefix="flotilla-pull-", dir=self.root)
        return d

    def assertPulled(self, result, expected_bytes):
        code, out, err = result
        self.assertEqual(code, 0, err)
        path = out.strip().splitlines()[-1]
        with open(path, "rb") as f:
            self.assertEqual(digest(f.read()), digest(expected_bytes))
        return path

    def assertFailsCleanly(self, result, data_dir, *needles):
        code, out, err = result
        self.assertNotEqual(code, 0, out)
        self.assertEqual(out, "", "nothing on stdout when it fails")
        for needle in needles:
            self.assertIn(needle, err)
        self.assertEqual(cache_files(data_dir), [], "nothing may be cached after a failure")

    # ------------------------------------------------------------------ integrity and sharing

    def test_ranged_pull_from_nginx_is_verified_and_cached(self):
        d = self.data_dir()
        path = self.assertPulled(pull(self.nginx.url("model/weights.bin"), d), self.big)
        self.assertTrue(path.endswith("/weights.bin"), path)
        self.assertEqual(os.path.basename(os.path.dirname(os.path.dirname(path))), "artifacts")
        blobs = os.listdir(os.path.join(d, "cache", "blobs"))
        self.assertEqual(blobs, [digest(self.big)])
        self.assertEqual(os.listdir(os.path.join(d, "cache", "partial")), [])
        # Ranged: nginx saw 206s (the probe and ten 1 MiB ranges).
        def ranged_gets():
            with open(os.path.join(self.nginx.dir, "access.log")) as f:
                return f.read().count('"GET /model/weights.bin HTTP/1.1" 206')
        self.assertGreaterEqual(ranged_gets(), 11)
        # A second pull is the cache's: the server is not asked again.
        asked = ranged_gets()
        again = pull(self.nginx.url("model/weights.bin"), d)
        self.assertEqual(self.assertPulled(again, self.big), path)
        self.assertEqual(ranged_gets(), asked)

    def test_pinned_digest_and_a_wrong_one(self):
        d = self.data_dir()
        self.assertPulled(pull(self.nginx.url("model/weights.bin") + "#sha256=" +
                               digest(self.big), d), self.big)
        d = self.data_dir()
        wrong = "0" * 64
        self.assertFailsCleanly(pull(self.nginx.url("model/weights.bin") + "#sha256=" + wrong, d),
                                d, "does not match its digest", wrong, digest(self.big))
        self.assertEqual(os.listdir(os.path.join(d, "cache", "partial")), [])

    def test_manifest_directory_shares_blobs(self):
        src = os.path.join(self.www, "model")
        p = subprocess.run([harness.FLOTILLA_BIN, "artifact", "pack", src], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), os.path.join(src, "flotilla-manifest.json"))
        manifest = json.load(open(os.path.join(src, "flotilla-manifest.json")))
        self.assertEqual([f["path"] for f in manifest["files"]],
                         ["config.json", "sub/tokenizer.txt", "weights.bin"])
        d = self.data_dir()
        self.assertPulled(pull(self.nginx.url("model/weights.bin"), d), self.big)
        code, out, err = pull(self.nginx.url("model/flotilla-manifest.json"), d)
        self.assertEqual(code, 0, err)
        directory = out.strip()
        for f in manifest["files"]:
            with open(os.path.join(directory, f["path"]), "rb") as h:
                self.assertEqual(digest(h.read()), f["sha256"], f["path"])
        # weights.bin was in the cache already: one blob, linked from both artifacts.
        self.assertEqual(len(os.listdir(os.path.join(d, "cache", "blobs"))), 3)
        self.assertEqual(os.stat(os.path.join(directory, "weights.bin")).st_nlink, 3)

    def test_empty_file(self):
        d = self.data_dir()
        self.assertPulled(pull(self.nginx.url("empty.bin"), d), b"")

    def test_concurrent_pulls_share_one_download(self):
        d = self.data_dir()
        before = len(self.faults.ranges("slow", "weights.bin"))
        procs = [subprocess.Popen([harness.FLOTILLA_BIN, "pull",
                                   self.faults.url("slow", "weights.bin"), "--data-dir", d,
                                   "--range-mib", "1", "--connections", "2"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
        outs = [p.communicate(timeout=60) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        self.assertEqual(len({out.strip() for out, _ in outs}), 1)
        asked = self.faults.ranges("slow", "weights.bin")[before:]
        # One probe and ten ranges, once: the other two pulls waited and found it cached.
        self.assertEqual(len(asked), 11, asked)

    # ------------------------------------------------------------------ faults

    def test_dropped_connections_mid_range_are_retried(self):
        d = self.data_dir()
        self.assertPulled(pull(self.faults.url("drop", "weights.bin"), d), self.big)
        asked = self.faults.ranges("drop", "weights.bin")
        self.assertEqual(len(asked), 1 + 2 * 10, asked)  # every range twice

    def test_server_that_ignores_range_gets_one_stream(self):
        d = self.data_dir()
        code, out, err = pull(self.faults.url("norange", "weights.bin"), d)
        self.assertPulled((code, out, err), self.big)
        self.assertIn("ignores Range requests", err)
        self.assertEqual(len(self.faults.ranges("norange", "weights.bin")), 1)

    def test_truncated_response_is_an_error_and_caches_nothing(self):
        d = self.data_dir()
        self.assertFailsCleanly(pull(self.faults.url("truncate", "weights.bin"), d), d,
                                self.faults.url("truncate", "weights.bin").split("//")[1]
                                .split("/")[0])

    def test_wrong_bytes_fail_the_digest(self):
        d = self.data_dir()
        url = self.faults.url("corrupt", "weights.bin") + "#sha256=" + digest(self.big)
        self.assertFailsCleanly(pull(url, d), d, "does not match its digest")

    def test_not_found_and_unreachable(self):
        d = self.data_dir()
        self.assertFailsCleanly(pull(self.nginx.url("model/missing.bin"), d), d, "HTTP 404")
        port = harness.free_port()  # nothing listens there
        self.assertFailsCleanly(pull(f"http://127.0.0.1:{port}/x.bin", d), d,
                                f"127.0.0.1:{port}", "cannot connect")
        self.assertFailsCleanly(pull("http://no-such-host.invalid/x.bin", d), d,
                                "cannot resolve 'no-such-host.invalid'")
        self.assertFailsCleanly(pull("/no/such/path", d), d, "no such file or directory")
        code, _, err = pull("ftp://127.0.0.1/x", d)
        self.assertNotEqual(code, 0)
        self.assertEqual(cache_files(d), [])

    def test_interrupted_download_resumes_the_missing_ranges(self):
        d = self.data_dir()
        self.faults.healed = False
        code, out, err = pull(self.faults.url("failafter", "weights.bin"), d, "--connections", "1")
        self.assertNotEqual(code, 0)
        self.assertIn("HTTP 503", err)
        self.assertEqual(cache_files(d), [])
        partial = os.listdir(os.path.join(d, "cache", "partial"))
        self.assertEqual(len([p for p in partial if p.endswith(".state")]), 1, partial)
        first = [r for r in self.faults.ranges("failafter", "weights.bin") if r != "bytes=0-0"]
        served = set(first[:self.faults.fail_after])
        self.faults.healed = True
        before = len(self.faults.ranges("failafter", "weights.bin"))
        self.assertPulled(pull(self.faults.url("failafter", "weights.bin"), d), self.big)
        second = [r for r in self.faults.ranges("failafter", "weights.bin")[before:]
                  if r != "bytes=0-0"]
        self.assertEqual(len(second), 10 - len(served), second)
        self.assertFalse(served & set(second), "a finished range was fetched again")

    def test_a_full_disk_is_a_clear_error(self):
        # A file size limit makes writes fail as a full disk does (EFBIG instead of ENOSPC).
        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (2 * MIB, 2 * MIB))
        d = self.data_dir()
        self.assertFailsCleanly(pull(self.nginx.url("model/weights.bin"), d, preexec_fn=limit),
                                d, "File too large")
        self.assertEqual(os.listdir(os.path.join(d, "cache", "partial")), [])

    def test_bad_manifests_are_refused(self):
        for name, files in (
                ("dotdot", [{"path": "../evil", "size": 1, "sha256": "0" * 64}]),
                ("absolute", [{"path": "/etc/passwd", "size": 1, "sha256": "0" * 64}]),
                ("twice", [{"path": "a", "size": 1, "sha256": "0" * 64}] * 2),
                ("baddigest", [{"path": "a", "size": 1, "sha256": "xyz"}])):
            os.makedirs(os.path.join(self.www, "bad", name), exist_ok=True)
            with open(os.path.join(self.www, "bad", name, "flotilla-manifest.json"), "w") as f:
                json.dump({"files": files}, f)
            d = self.data_dir()
            self.assertFailsCleanly(pull(self.nginx.url(f"bad/{name}/flotilla-manifest.json"), d),
                                    d, "manifest")

    # ------------------------------------------------------------------ eviction

    def test_eviction_keeps_the_cache_under_its_limit(self):
        d = self.data_dir()
        a = self.assertPulled(pull(self.nginx.url("model/weights.bin"), d, "--max-cache-mib",
                                   "12"), self.big)
        b = self.assertPulled(pull(self.faults.url("ok", "weights.bin") + "?v=2", d,
                                   "--max-cache-mib", "12"), self.big)
        # Same content: one blob, two artifacts; under the limit, nothing evicted.
        self.assertTrue(os.path.exists(a) and os.path.exists(b))
        small = self.assertPulled(pull(self.faults.url("ok", "small.bin"), d, "--max-cache-mib",
                                       "9"), b"0123456789" * 1000)
        # Over 9 MiB: the least recently used artifacts go, the one just pulled stays.
        self.assertFalse(os.path.exists(a))
        self.assertFalse(os.path.exists(b))
        self.assertTrue(os.path.exists(small))
        self.assertEqual(os.listdir(os.path.join(d, "cache", "blobs")),
                         [digest(b"0123456789" * 1000)])


class LazyLoadTest(unittest.TestCase):
    """A replica serving a language model from a manifest URL loads it while it downloads
    (lazy loading, the default) and serves exactly what the local copy serves; bytes that fail
    their digest fail the replica even though the loader already read them."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="flotilla-lazy-")
        os.chmod(cls.root, 0o755)
        cls.addClassCleanup(shutil.rmtree, cls.root, True)
        www = os.path.join(cls.root, "www")
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tests/fixtures/make_llm.py"),
                        www], check=True, capture_output=True)
        # Sharded, with an index: several files, each awaited by the loader.
        cls.model = os.path.join(www, "mistral-f16")
        subprocess.run([harness.FLOTILLA_BIN, "artifact", "pack", cls.model], check=True,
                       capture_output=True)
        for base, dirs, files in os.walk(www):
            for name in dirs:
                os.chmod(os.path.join(base, name), 0o755)
            for name in files:
                os.chmod(os.path.join(base, name), 0o644)
        with open(os.path.join(cls.model, "reference.json")) as f:
            cls.reference = json.load(f)
        cls.nginx = Nginx(www)
        cls.addClassCleanup(cls.nginx.stop)
        files = {}
        for name in os.listdir(cls.model):
            with open(os.path.join(cls.model, name), "rb") as f:
                files[name] = f.read()
        cls.model_bytes = sum(len(data) for name, data in files.items()
                              if name != "flotilla-manifest.json")
        cls.faults = FaultServer(files)
        cls.addClassCleanup(cls.faults.stop)

    def replica(self, model, cache, *flags):
        return harness.start_process(self, [harness.FLOTILLA_BIN, "replica", "--model", model,
                                            "--port", "0", "--cache-dir", cache,
                                            "--skip-tokenizer", "--llm-threads", "1",
                                            "--dtype", "float32", *flags])

    def greedy(self, port, prompt):
        r = harness.req(port, "POST", "/v1/completions",
                        {"prompt": prompt, "max_tokens": len(self.reference["greedy"][0]),
                         "temperature": 0, "ignore_eos": True, "return_token_ids": True})
        self.assertEqual(r.status, 200, r)
        return r.json()["choices"][0]["token_ids"]

    def test_lazy_and_eager_loads_serve_what_the_local_copy_serves(self):
        url = self.nginx.url("slow/mistral-f16/flotilla-manifest.json")
        local = self.replica(self.model, tempfile.mkdtemp(dir=self.root))
        lazy = self.replica(url, tempfile.mkdtemp(dir=self.root))
        eager = self.replica(url, tempfile.mkdtemp(dir=self.root), "--no-lazy-load")
        self.assertEqual(lazy.name, "mistral-f16")
        for prompt, expected in zip(self.reference["prompts"], self.reference["greedy"]):
            self.assertEqual(self.greedy(local.port, prompt), expected)
            self.assertEqual(self.greedy(lazy.port, prompt), expected)
            self.assertEqual(self.greedy(eager.port, prompt), expected)
        # The download's progress stays in /metrics: every byte of the model's files.
        text = harness.req(lazy.port, "GET", "/metrics").body.decode()
        harness.promtool_check_metrics(text)
        metrics = {name: value for (name, _), value in harness.parse_metrics(text).items()}
        self.assertEqual(metrics["flotilla_model_download_bytes"], self.model_bytes)
        self.assertEqual(metrics["flotilla_model_download_size_bytes"], self.model_bytes)
        self.assertEqual(metrics["flotilla_model_download_eta_seconds"], 0)

    def test_bytes_that_fail_their_digest_fail_the_replica(self):
        cache = tempfile.mkdtemp(dir=self.root)
        url = self.faults.url("corrupt", "flotilla-manifest.json")
        result = harness.run_to_exit([harness.FLOTILLA_BIN, "replica", "--model", url,
                                      "--port", "0", "--cache-dir", cache, "--skip-tokenizer"],
                                     deadline_s=30)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stdout, b"", "it never said it was serving")
        self.assertIn(b"cannot fetch model", result.stderr)
        self.assertIn(b"does not match its digest", result.stderr)
        self.assertEqual(os.listdir(os.path.join(cache, "artifacts")), [])
        for blob in os.listdir(os.path.join(cache, "blobs")):  # only verified content, if any
            with open(os.path.join(cache, "blobs", blob), "rb") as f:
                self.assertEqual(digest(f.read()), blob)


class TlsTest(unittest.TestCase):
    """https:// with certificate and host name verification; a test CA through SSL_CERT_FILE
    (OpenSSL's standard variable)."""

    def test_https_is_verified(self):
        work = tempfile.mkdtemp(prefix="flotilla-tls-")
        self.addCleanup(shutil.rmtree, work, True)
        os.chmod(work, 0o755)
        cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        key, "-out", cert, "-days", "2", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True)
        os.chmod(key, 0o644)
        data = os.urandom(3 * MIB)
        with open(os.path.join(work, "m.bin"), "wb") as f:
            f.write(data)
        server = Nginx(work, tls=(cert, key))
        self.addCleanup(server.stop)
        trusted = dict(os.environ, SSL_CERT_FILE=cert)
        for host in ("127.0.0.1", "localhost"):
            d = tempfile.mkdtemp(dir=work)
            code, out, err = pull(server.url("m.bin", host), d, env=trusted)
            self.assertEqual(code, 0, err)
            with open(out.strip(), "rb") as f:
                self.assertEqual(f.read(), data)
        d = tempfile.mkdtemp(dir=work)
        code, out, err = pull(server.url("m.bin"), d,
                              env={k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"})
        self.assertNotEqual(code, 0)
        self.assertIn("certificate verify failed", err)
        self.assertEqual(cache_files(d), [])


if __name__ == "__main__":
    unittest.main()
