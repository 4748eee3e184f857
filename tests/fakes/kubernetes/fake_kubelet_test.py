"""Tests of the fake kubelet (fake_kubelet.py) on the fake API server, with real
`flotilla replica --runtime synthetic` processes on 127.0.0.1.

Run: FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 -m unittest -v \
         tests/fakes/kubernetes/fake_kubelet_test.py
Every wait is on a condition with a deadline; no sleep decides an outcome. Changes the tests must
see however briefly (an endpoint terminating, a restarted pod not ready) are recorded from the
server's subscribe() hook as they happen.
"""

import http.client
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_apiserver  # noqa: E402
import fake_kubelet  # noqa: E402

FLOTILLA_BIN = os.environ.get("FLOTILLA_BIN", "")
DEADLINE_S = 15.0


def setUpModule():
    if not (FLOTILLA_BIN and os.access(FLOTILLA_BIN, os.X_OK)):
        raise RuntimeError("FLOTILLA_BIN must name the flotilla binary, e.g. "
                           "FLOTILLA_BIN=build/release/flotilla")


def wait_until(fn, what, timeout=DEADLINE_S):
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def alive(pid):
    """True while /proc has the process and it is no zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")[:-1]


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


class HookServer:
    """Records the preStop hooks' GETs (what the kubelet calls on 127.0.0.1:PORT)."""

    def __init__(self):
        self.calls = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.calls.append((self.path, time.monotonic()))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class SliceRecorder:
    """Every state of a Service's EndpointSlices, in order: [{pod: conditions}], starting from
    the slices there are (replayed one by one: the first states are partial)."""

    def __init__(self, server, service):
        self.service = service
        self.slices = {}
        self.states = []
        self.lock = threading.Lock()
        self.unsubscribe = server.subscribe(self.on_event, ["endpointslices"], replay=True)

    def on_event(self, type_, obj, prev):
        labels = obj["metadata"].get("labels") or {}
        if labels.get(fake_kubelet.SERVICE_NAME_LABEL) != self.service:
            return
        with self.lock:
            if type_ == "DELETED":
                self.slices.pop(obj["metadata"]["name"], None)
            else:
                self.slices[obj["metadata"]["name"]] = obj
            self.states.append({e["targetRef"]["name"]: e["conditions"]
                                for s in self.slices.values() for e in s.get("endpoints") or []})

    def history(self):
        with self.lock:
            return list(self.states)


def model_file(tmp):
    path = os.path.join(tmp, "model.yaml")
    with open(path, "w") as f:
        f.write("service_time: {dist: fixed, mean_ms: 1}\ncpu_us: 0\nsaturation: 100000\n"
                "seed: 1\n")
    return path


def deployment(name, model, replicas=2, prestop_port=None, liveness_path="/v2/health/live",
               grace_s=5):
    """A Deployment as `flotilla controller` writes one: 0.0.0.0:8080 in the template."""
    labels = {"app": name, "flotilla.dev/endpoint": name, "flotilla.dev/version": "v1"}
    container = {
        "name": "replica", "image": "registry.example/flotilla:0.1.0",
        "command": ["/usr/local/bin/flotilla"],
        "args": ["replica", "--model", model, "--runtime", "synthetic", "--name", "$(ENDPOINT)",
                 "--model-version", "$(POD_NAME)", "--host", "0.0.0.0", "--port", "8080",
                 "--workers", "1", "--drain-timeout-ms", "2000", "--cache-dir", "/cache"],
        "env": [{"name": "ENDPOINT", "value": name},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "http", "containerPort": 8080}],
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                           "periodSeconds": 2, "failureThreshold": 1},
        "livenessProbe": {"httpGet": {"path": liveness_path, "port": 8080},
                          "periodSeconds": 1 if liveness_path != "/v2/health/live" else 10,
                          "failureThreshold": 1 if liveness_path != "/v2/health/live" else 2},
    }
    if prestop_port:
        container["lifecycle"] = {"preStop": {"httpGet": {"path": f"/prestop/{name}",
                                                          "port": prestop_port}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", "labels": dict(labels)},
            "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)},
                     "template": {"metadata": {"labels": dict(labels)},
                                  "spec": {"containers": [container],
                                           "terminationGracePeriodSeconds": grace_s,
                                           "volumes": [{"name": "cache", "emptyDir": {}}]}}}}


# A server that ignores SIGTERM, run by its absolute command (no image mapping).
STUBBORN = ("import http.server, signal, sys\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
            "host = sys.argv[sys.argv.index('--host') + 1]\n"
            "http.server.HTTPServer((host, port), http.server.SimpleHTTPRequestHandler)"
            ".serve_forever()\n")


def stubborn_deployment(name, replicas=1, grace_s=1, tag=""):
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {
                         "terminationGracePeriodSeconds": grace_s,
                         "containers": [{
                             "name": "stubborn", "image": "python:3",
                             "command": [sys.executable, "-c", STUBBORN],
                             "args": ["--host", "0.0.0.0", "--port", "80", "--tag", tag],
                             "readinessProbe": {"httpGet": {"path": "/", "port": 80}}}]}}}}


def service(name):
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"flotilla.dev/endpoint": name, "team": "ml"}},
            "spec": {"selector": {"app": name},
                     "ports": [{"name": "http", "port": 80, "targetPort": "http",
                                "protocol": "TCP"}]}}


class PureHelpersTest(unittest.TestCase):
    def test_expansion_as_kubernetes_does(self):
        env = fake_kubelet.container_env(
            {"env": [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)-$(C)-$$(A)"},
                     {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                     {"name": "D", "valueFrom": {"fieldRef": {
                         "fieldPath": "metadata.labels['app']"}}}]},
            {"name": "p-1", "namespace": "ns", "labels": {"app": "fraud"}})
        self.assertEqual(env, {"A": "x", "B": "x-$(C)-$(A)", "C": "p-1", "D": "fraud"})
        self.assertEqual(fake_kubelet.expand("$(C) $(Z) $$", env), "p-1 $(Z) $")

    def test_argv_substitution(self):
        self.assertEqual(
            fake_kubelet.substitute_argv(["x", "--host", "0.0.0.0", "--port", "8080", "--a",
                                          "--port=1", "--host=::", "--listen", "0.0.0.0:80"],
                                         4321),
            ["x", "--host", "127.0.0.1", "--port", "4321", "--a", "--port=4321",
             "--host=127.0.0.1", "--listen", "127.0.0.1:4321"])
        self.assertEqual(fake_kubelet.template_port({"args": ["--port", "9000"]}), 9000)
        self.assertEqual(fake_kubelet.template_port(
            {"ports": [{"containerPort": 8080}], "args": ["--port", "9000"]}), 8080)

    def test_rolling_parameters_and_hash(self):
        spec = {"strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}}
        self.assertEqual(fake_kubelet.rolling_params(spec, 2), (1, 0))
        self.assertEqual(fake_kubelet.rolling_params(spec, 8), (2, 2))
        self.assertEqual(fake_kubelet.rolling_params(
            {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}}, 3), (0, 1))
        a = fake_kubelet.template_hash({"spec": {"containers": [{"name": "a"}]}})
        self.assertRegex(a, r"^[bcdfghjklmnpqrstvwxz2456789]{1,10}$")
        self.assertEqual(a, fake_kubelet.template_hash({"spec": {"containers": [{"name": "a"}]}}))
        self.assertNotEqual(a, fake_kubelet.template_hash({"spec": {"containers": [{}]}}))


class FakeKubeletTest(unittest.TestCase):
    """One fake API server and one kubelet for the class; each test its own Deployment."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="fake-kubelet-test-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.model = model_file(cls.tmp)
        cls.server = fake_apiserver.FakeApiServer(port=0)
        cls.api_port = cls.server.start()
        cls.addClassCleanup(cls.server.stop)
        cls.hooks = HookServer()
        cls.addClassCleanup(cls.hooks.stop)
        cls.kubelet = fake_kubelet.FakeKubelet(cls.server, {"flotilla": FLOTILLA_BIN},
                                               probe_period_s=0.1,
                                               log_dir=os.path.join(cls.tmp, "logs"),
                                               restart_backoff_s=0.2)
        cls.kubelet.start()
        cls.addClassCleanup(cls.kubelet.stop)

    def pods(self, deployment):
        return [p for p in self.kubelet.pods() if p["deployment"] == deployment]

    def logs(self, deployment):
        return "\n".join(f"--- {p['name']}\n{self.kubelet.pod_log(p['name'])[-2000:]}"
                         for p in self.pods(deployment))

    def ready_status(self, name, replicas):
        d = self.server.get("deployments", "default", name)
        s = d.get("status") or {}
        return (s.get("observedGeneration") == d["metadata"]["generation"]
                and s.get("readyReplicas") == replicas and s.get("availableReplicas") == replicas
                and s.get("updatedReplicas") == replicas and s.get("replicas") == replicas
                and {c["type"]: c["status"] for c in s.get("conditions", [])}
                == {"Available": "True", "Progressing": "True"} and s)

    def wait_ready(self, name, replicas):
        try:
            return wait_until(lambda: self.ready_status(name, replicas) and
                              len(self.endpoints(name, ready=True)) == replicas
                              and self.ready_status(name, replicas),
                              f"{replicas} ready pods of {name}")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.server.get('deployments', 'default', name)}\n"
                                 f"{self.logs(name)}")

    def slices(self, svc):
        return self.server.list("endpointslices", "default",
                                f"{fake_kubelet.SERVICE_NAME_LABEL}={svc}")

    def endpoints(self, svc, ready=None):
        """[(pod, port, conditions)] of the Service's slices."""
        out = []
        for s in self.slices(svc):
            for e in s.get("endpoints") or []:
                if ready is None or e["conditions"]["ready"] == ready:
                    out.append((e["targetRef"]["name"], s["ports"][0]["port"], e["conditions"]))
        return sorted(out)

    def scale(self, name, replicas):
        """Through the scale subresource over HTTP, as the autoscaler does."""
        conn = http.client.HTTPConnection("127.0.0.1", self.api_port, timeout=5)
        try:
            conn.request("PATCH", f"/apis/apps/v1/namespaces/default/deployments/{name}/scale",
                         json.dumps({"spec": {"replicas": replicas}}),
                         {"Content-Type": "application/merge-patch+json"})
            r = conn.getresponse()
            self.assertEqual(r.status, 200, r.read())
            r.read()
        finally:
            conn.close()

    def start(self, name, replicas=2, **kw):
        self.server.create(service(name))
        self.server.create(deployment(name, self.model, replicas, **kw))
        self.wait_ready(name, replicas)

    def test_pods_become_ready_and_slices_list_their_real_ports(self):
        self.start("fraud")
        d = self.server.get("deployments", "default", "fraud")
        pods = self.pods("fraud")
        self.assertEqual(len(pods), 2)
        for p in pods:
            obj = self.server.get("pods", "default", p["name"])
            self.assertRegex(p["name"], rf"^fraud-{p['hash']}-[a-z0-9]{{5}}$")
            self.assertEqual(obj["metadata"]["labels"],
                             {"app": "fraud", "flotilla.dev/endpoint": "fraud",
                              "flotilla.dev/version": "v1", "pod-template-hash": p["hash"]})
            owner = obj["metadata"]["ownerReferences"][0]
            self.assertEqual((owner["kind"], owner["name"], owner["uid"], owner["controller"]),
                             ("Deployment", "fraud", d["metadata"]["uid"], True))
            status = obj["status"]
            self.assertEqual((status["phase"], status["podIP"]), ("Running", "127.0.0.1"))
            self.assertIn({"type": "Ready", "status": "True"},
                          [{k: c[k] for k in ("type", "status")} for c in status["conditions"]])
            self.assertEqual(status["containerStatuses"][0]["restartCount"], 0)
            self.assertTrue(status["containerStatuses"][0]["ready"])
            self.assertEqual(obj["spec"]["containers"][0]["ports"][0]["containerPort"],
                             p["port"])
            # the process: host and port substituted, $(VAR)s expanded, the emptyDir mapped
            argv = cmdline(p["pid"])
            self.assertEqual(argv[0], FLOTILLA_BIN)
            self.assertEqual(argv[argv.index("--host") + 1], "127.0.0.1")
            self.assertEqual(argv[argv.index("--port") + 1], str(p["port"]))
            self.assertEqual(argv[argv.index("--name") + 1], "fraud")
            self.assertEqual(argv[argv.index("--model-version") + 1], p["name"])
            self.assertTrue(argv[argv.index("--cache-dir") + 1].startswith(
                self.kubelet.log_dir), argv)
        slices = self.slices("fraud")
        self.assertEqual(len(slices), 2, "one slice per pod: each pod has its own port")
        for s in slices:
            self.assertRegex(s["metadata"]["name"], r"^fraud-[a-z0-9]{5}$")
            self.assertEqual(s["metadata"]["labels"], {
                "kubernetes.io/service-name": "fraud",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "flotilla.dev/endpoint": "fraud", "team": "ml"})
            self.assertEqual(s["metadata"]["ownerReferences"][0]["kind"], "Service")
            self.assertEqual(s["addressType"], "IPv4")
            self.assertEqual(len(s["ports"]), 1)
            self.assertEqual((s["ports"][0]["name"], s["ports"][0]["protocol"]), ("http", "TCP"))
            self.assertEqual(len(s["endpoints"]), 1)
            e = s["endpoints"][0]
            self.assertEqual(e["addresses"], ["127.0.0.1"])
            self.assertEqual(e["conditions"],
                             {"ready": True, "serving": True, "terminating": False})
            self.assertEqual(e["targetRef"]["kind"], "Pod")
        self.assertEqual(sorted((n, port) for n, port, _ in self.endpoints("fraud")),
                         sorted((p["name"], p["port"]) for p in pods))
        for name, port, _ in self.endpoints("fraud"):
            status, body = get(port, "/v2/models/fraud")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["versions"], [name])
        status = self.ready_status("fraud", 2)
        self.assertEqual({c["type"]: c["reason"] for c in status["conditions"]},
                         {"Available": "MinimumReplicasAvailable",
                          "Progressing": "NewReplicaSetAvailable"})

    def test_scaling_up_then_down_drains_and_removes_pods(self):
        self.start("scaled", prestop_port=self.hooks.port)
        recorder = SliceRecorder(self.server, "scaled")
        self.addCleanup(recorder.unsubscribe)
        self.scale("scaled", 3)
        self.wait_ready("scaled", 3)
        self.assertEqual(len(self.slices("scaled")), 3)
        before = {p["name"]: p["pid"] for p in self.pods("scaled")}
        self.scale("scaled", 1)
        self.wait_ready("scaled", 1)
        wait_until(lambda: len(self.endpoints("scaled")) == 1, "the removed endpoints gone")
        (kept,) = [n for n, _, _ in self.endpoints("scaled")]
        removed = sorted(set(before) - {kept})
        self.assertEqual(len(removed), 2)
        for name in removed:
            self.assertFalse(alive(before[name]), f"{name}'s process is still running")
            self.assertIsNone(self.server.get("pods", "default", name))
            seen = [s[name] for s in recorder.history() if name in s]
            self.assertIn({"ready": False, "serving": True, "terminating": True}, seen,
                          f"{name} was never published terminating and still serving")
            self.assertEqual(seen[0]["terminating"], False)
        self.assertEqual(len([c for c in self.hooks.calls if c[0] == "/prestop/scaled"]), 2)
        self.assertTrue(alive(before[kept]))
        self.assertEqual(len(self.slices("scaled")), 1)

    def test_a_killed_process_is_restarted(self):
        self.start("crashy", replicas=1)
        recorder = SliceRecorder(self.server, "crashy")
        self.addCleanup(recorder.unsubscribe)
        (pod,) = self.pods("crashy")
        self.assertEqual(self.kubelet.kill_pod_process(pod["name"]), pod["pid"])
        wait_until(lambda: self.pods("crashy")[0]["restart_count"] == 1
                   and self.pods("crashy")[0]["ready"], "the pod restarted and ready")
        self.wait_ready("crashy", 1)
        (after,) = self.pods("crashy")
        self.assertEqual(after["name"], pod["name"])
        self.assertNotEqual(after["pid"], pod["pid"])
        self.assertFalse(alive(pod["pid"]))
        status = self.server.get("pods", "default", pod["name"])["status"]
        container = status["containerStatuses"][0]
        self.assertEqual(container["restartCount"], 1)
        self.assertEqual(container["lastState"]["terminated"]["exitCode"], 137)
        seen = lambda: [s[pod["name"]]["ready"]  # noqa: E731
                        for s in recorder.history() if pod["name"] in s]
        wait_until(lambda: seen()[-1], "the endpoint ready again")
        self.assertIn(False, seen(),
                      "the endpoint never went not ready while the process was down")
        status, _ = get(after["port"], "/v2/health/ready")
        self.assertEqual(status, 200)

    def test_a_failing_liveness_probe_restarts_the_container(self):
        self.server.create(deployment("unwell", self.model, 1, liveness_path="/no-such-path"))
        wait_until(lambda: self.pods("unwell") and self.pods("unwell")[0]["restart_count"] >= 1,
                   "a restart after the liveness probe failed")
        self.server.delete("deployments", "default", "unwell")
        wait_until(lambda: not self.pods("unwell"), "the deleted Deployment's pods gone")

    def test_a_template_change_rolls_the_pods(self):
        self.start("rolled")
        recorder = SliceRecorder(self.server, "rolled")
        self.addCleanup(recorder.unsubscribe)
        old = {p["name"]: p for p in self.pods("rolled")}
        self.server.patch("deployments", "default", "rolled", {"spec": {"template": {
            "metadata": {"annotations": {"rollout": "2"}}}}})
        wait_until(lambda: (lambda s: s.get("observedGeneration") == 2)(
            self.server.get("deployments", "default", "rolled").get("status") or {}),
            "the new generation observed")
        self.wait_ready("rolled", 2)
        wait_until(lambda: len(self.pods("rolled")) == 2 and len(self.endpoints("rolled")) == 2,
                   "the old pods gone")
        new = self.pods("rolled")
        self.assertFalse(set(old) & {p["name"] for p in new})
        self.assertEqual(len({p["hash"] for p in new}), 1)
        self.assertNotEqual(new[0]["hash"], next(iter(old.values()))["hash"])
        for p in old.values():
            self.assertFalse(alive(p["pid"]))
        # maxSurge 1 / maxUnavailable 0: never fewer than 2 ready, never more than 3 pods
        history = recorder.history()
        ready = [sum(1 for c in state.values() if c["ready"]) for state in history]
        self.assertIn(2, ready)
        history = history[ready.index(2):]  # past the replay of the slices there were
        self.assertGreater(len(history), 4, "the rollout was not recorded")
        for state in history:
            self.assertGreaterEqual(sum(1 for c in state.values() if c["ready"]), 2, history)
            self.assertLessEqual(sum(1 for c in state.values() if not c["terminating"]), 3)
        wait_until(lambda: (self.ready_status("rolled", 2) or {"conditions": [{}, {}]})[
            "conditions"][1].get("reason") == "NewReplicaSetAvailable", "the rollout complete")


    def test_sigkill_after_the_grace_period(self):
        self.server.create(stubborn_deployment("stubborn"))
        wait_until(lambda: [p for p in self.pods("stubborn") if p["ready"]], "a ready pod")
        (pod,) = self.pods("stubborn")
        self.assertEqual(cmdline(pod["pid"])[-6:-2], ["--host", "127.0.0.1", "--port",
                                                     str(pod["port"])])
        began = time.monotonic()
        self.server.delete("deployments", "default", "stubborn")
        wait_until(lambda: not alive(pod["pid"]), "the process killed")
        self.assertGreaterEqual(time.monotonic() - began, 0.9,
                                "killed before terminationGracePeriodSeconds (1 s)")
        wait_until(lambda: not self.pods("stubborn"), "the pod gone")

    def test_a_pod_deleted_through_the_api_is_replaced(self):
        self.start("replaced", replicas=1)
        (pod,) = self.pods("replaced")
        self.server.delete("pods", "default", pod["name"])
        wait_until(lambda: not alive(pod["pid"]), "the deleted pod's process stopped")
        self.wait_ready("replaced", 1)
        # the deleted pod stays listed (terminating) a moment after its process is gone
        def only_the_replacement():
            pods = self.pods("replaced")
            return pods if len(pods) == 1 and pods[0]["name"] != pod["name"] else None
        (after,) = wait_until(only_the_replacement, "only the replacement listed")
        self.assertNotEqual(after["name"], pod["name"])
        self.assertIsNotNone(self.server.get("pods", "default", after["name"]))


class StopTest(unittest.TestCase):
    def test_stop_leaves_no_process(self):
        tmp = tempfile.mkdtemp(prefix="fake-kubelet-stop-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        model = model_file(tmp)
        server = fake_apiserver.FakeApiServer(port=0)
        server.start()
        self.addCleanup(server.stop)
        kubelet = fake_kubelet.FakeKubelet(server, {"flotilla": FLOTILLA_BIN},
                                           probe_period_s=0.1, stop_grace_s=0.5)
        kubelet.start()
        try:
            server.create(deployment("stopped", model, replicas=2))
            server.create(stubborn_deployment("stubborn", grace_s=30, tag=tmp))
            wait_until(lambda: len([p for p in kubelet.pods() if p["ready"]]) == 3,
                       "three ready pods")
            pids = [p["pid"] for p in kubelet.pods()]
        finally:
            kubelet.stop()
        for pid in pids:
            self.assertFalse(alive(pid), f"pid {pid} survived stop()")
        self.assertEqual([p["pid"] for p in kubelet.pods()], [None] * 3)
        left = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    argv = cmdline(int(entry))
                    if model in argv or tmp in argv:
                        left.append(entry)
                except OSError:
                    pass
        self.assertEqual(left, [], "processes running the test's model after stop()")
        self.assertFalse(os.path.exists(kubelet.log_dir), "its own log directory is removed")


if __name__ == "__main__":
    unittest.main()
