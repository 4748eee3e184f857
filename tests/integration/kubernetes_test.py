"""`flotilla gateway --kubernetes` against the fake API server (tests/fakes/kubernetes): a FAKE of
the Kubernetes API server, speaking its wire protocol for the subset Flotilla uses, since none
can run on these machines. Everything else is real: `flotilla replica` processes on 127.0.0.1,
the gateway process, HTTP on loopback.

The test plays the controller and the EndpointSlice controller itself: it writes the
ServingEndpoint, the EndpointSlices of its version's Service (with the replicas' real
addresses) and a token Secret, and checks what the gateway routes, through broken watches and
a relist after 410 Gone.
"""

import json
import os
import re
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes",
                                "kubernetes"))

import harness  # noqa: E402
from harness import FLOTILLA_BIN, req, wait_until  # noqa: E402
import fake_apiserver  # noqa: E402

NS = "serving"
DEADLINE_S = 20.0


def setUpModule():
    harness.require_binary("kubernetes_test.py")


class Api:
    """JSON over HTTP to the fake API server, as any client would speak to a real one."""

    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method, path, body=None, content_type="application/json"):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def create(self, path, body):
        status, obj = self.call("POST", path, body)
        assert status == 201, (status, obj)
        return obj

    def patch(self, path, body):
        status, obj = self.call("PATCH", path, body, "application/merge-patch+json")
        assert status == 200, (status, obj)
        return obj

    def delete(self, path):
        status, obj = self.call("DELETE", path)
        assert status == 200, (status, obj)


def serving_endpoint(name, version="v1"):
    return {"apiVersion": "flotilla.dev/v1", "kind": "ServingEndpoint",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"served_models": [{"name": version, "model": "https://models/m.yaml",
                                        "runtime": "synthetic", "traffic": 100}]}}


def endpoint_slice(name, service, endpoint, replicas):
    """A slice of `service` listing `replicas`: (pod name, port, ready, terminating)."""
    ports = {port for _, port, _, _ in replicas}
    assert len(ports) <= 1, "one port per slice, as in Kubernetes"
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"kubernetes.io/service-name": service,
                                    "flotilla.dev/endpoint": endpoint}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": ports.pop() if ports else 0, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"],
                           "conditions": {"ready": ready, "serving": ready or terminating,
                                          "terminating": terminating},
                           "targetRef": {"kind": "Pod", "name": pod, "namespace": NS}}
                          for pod, _, ready, terminating in replicas]}


class GatewayKubernetesTest(unittest.TestCase):
    """One fake API server, one gateway process and two replicas for the whole class."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="flotilla-k8s-")
        cls.addClassCleanup(lambda: __import__("shutil").rmtree(cls.tmp, ignore_errors=True))
        cls.apiserver = fake_apiserver.FakeApiServer(port=0)
        cls.api_port = cls.apiserver.start()
        cls.addClassCleanup(cls.apiserver.stop)
        cls.api = Api(cls.api_port)

        model = harness.write_yaml(cls.tmp, "model.yaml",
                                   "service_time: {dist: fixed, mean_ms: 1}\ncpu_us: 0\n"
                                   "saturation: 100000\nseed: 1\n")
        cls.replicas = [
            harness.start_process(cls, [FLOTILLA_BIN, "replica", "--model", model, "--runtime",
                                        "synthetic", "--name", "fraud", "--host", "127.0.0.1",
                                        "--port", "0", "--workers", "1"], cls_level=True)
            for _ in range(2)]

        cls.token = harness.mint_token_config_map(cls.apiserver, NS, "ci", endpoints=["fraud"])
        kubeconfig = cls.apiserver.write_kubeconfig(os.path.join(cls.tmp, "kubeconfig"), NS)
        cls.gateway = harness.start_process(
            cls, [FLOTILLA_BIN, "gateway", "--kubernetes", "--kubeconfig", kubeconfig,
                  "--listen", "127.0.0.1:0", "--workers", "1", "--cold-start-timeout-ms", "200"],
            cls_level=True)
        cls.port = cls.gateway.port

    def infer(self, endpoint="fraud", token=None):
        headers = {"Authorization": "Bearer " + (token or self.token),
                   "Content-Type": "application/json"}
        return req(self.port, "POST", f"/serving-endpoints/{endpoint}/invocations",
                   {"inputs": [[1.0, 2.0]]}, headers=headers)

    def stats(self):
        r = req(self.port, "GET", "/gateway/stats",
                headers={"Authorization": "Bearer " + self.token})
        self.assertEqual(r.status, 200, r)
        return r.json()

    def replica_ids(self, endpoint="fraud"):
        for e in self.stats().get("endpoints", []):
            if e["name"] == endpoint:
                return sorted(r["id"] for r in e["replicas"] if r["eligible"])
        return None

    def slices_path(self):
        return f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"

    def test_routes_by_what_the_api_server_says_through_broken_watches_and_a_relist(self):
        ports = [r.port for r in self.replicas]
        self.api.create(f"/apis/flotilla.dev/v1/namespaces/{NS}/servingendpoints",
                        serving_endpoint("fraud"))
        self.api.create(self.slices_path(), endpoint_slice(
            "fraud-v1-a", "fraud-v1", "fraud", [("fraud-v1-0", ports[0], True, False)]))

        wait_until(lambda: self.infer().status == 200, DEADLINE_S, what="the first route")
        self.assertEqual(self.replica_ids(), ["fraud-v1-0"])
        self.assertEqual(self.infer(token="wrong").status, 401)

        # Broken watches: the gateway keeps its table and serves on, then sees new changes.
        self.apiserver.break_watches()
        for _ in range(20):
            self.assertEqual(self.infer().status, 200)
        self.api.patch(self.slices_path() + "/fraud-v1-a", {"endpoints": [
            {"addresses": ["127.0.0.1"], "conditions": {"ready": True},
             "targetRef": {"kind": "Pod", "name": "fraud-v1-0"}}]})
        self.api.create(self.slices_path(), endpoint_slice(
            "fraud-v1-b", "fraud-v1", "fraud", [("fraud-v1-1", ports[1], True, False)]))
        wait_until(lambda: self.replica_ids() == ["fraud-v1-0", "fraud-v1-1"], DEADLINE_S,
                   what="the second replica after the watches reconnected")

        # History gone: the slices' watch is held off (its next request hangs) while a change
        # is made and the history compacted, so its watch from the last resourceVersion it saw
        # gets 410 and only a new list finds the change.
        self.apiserver.hang_next(1, 30, match=re.compile(r"endpointslices\?.*watch=1"))
        self.apiserver.break_watches()
        for _ in range(20):
            self.assertEqual(self.infer().status, 200)
        self.api.patch(self.slices_path() + "/fraud-v1-a", {"endpoints": [
            {"addresses": ["127.0.0.1"], "conditions": {"ready": False, "terminating": True},
             "targetRef": {"kind": "Pod", "name": "fraud-v1-0"}}]})
        self.apiserver.compact()
        self.apiserver.release_hangs()
        wait_until(lambda: self.replica_ids() == ["fraud-v1-1"], DEADLINE_S,
                   what="the terminating replica out of the ready set after a relist")
        self.assertIn("is too old; listing again", self.gateway.stderr())
        before = replica_requests(self.replicas[0])
        for _ in range(20):
            self.assertEqual(self.infer().status, 200)
        self.assertEqual(replica_requests(self.replicas[0]), before,
                         "a terminating replica got new requests")

        # The endpoint deleted: its route goes.
        self.api.delete(f"/apis/flotilla.dev/v1/namespaces/{NS}/servingendpoints/fraud")
        wait_until(lambda: self.infer().status == 404, DEADLINE_S, what="the route removed")


def replica_requests(replica):
    """MLflow invocations a replica has answered (its own metrics; scrapes not counted)."""
    r = req(replica.port, "GET", "/metrics")
    return sum(value for (name, labels), value in harness.parse_metrics(r.body.decode()).items()
               if name == "flotilla_replica_requests_total" and ("route", "invocations") in labels)


if __name__ == "__main__":
    unittest.main()
