"""Tests of the fake Kubernetes API server (fake_apiserver.py) over its real wire protocol.

Run: /usr/bin/python3 -m unittest -v tests/fakes/kubernetes/fake_apiserver_test.py
Every wait is on a condition with a generous bound; no sleep decides an outcome.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_apiserver  # noqa: E402

NS = "default"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
ENDPOINTS = f"/apis/flotilla.dev/v1/namespaces/{NS}/servingendpoints"
PODS = f"/api/v1/namespaces/{NS}/pods"


def deployment(name, replicas=None, labels=None, owner=None):
    labels = labels or {"app": name}
    obj = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": name, "labels": dict(labels)},
           "spec": {"selector": {"matchLabels": dict(labels)},
                    "template": {"metadata": {"labels": dict(labels)},
                                 "spec": {"containers": [{"name": "replica", "image": "flotilla",
                                                          "env": [{"name": "A", "value": "1"}]}]}}}}
    if replicas is not None:
        obj["spec"]["replicas"] = replicas
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [owner_ref(owner)]
    return obj


def owner_ref(owner):
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def serving_endpoint(name, spec=None):
    return {"apiVersion": "flotilla.dev/v1", "kind": "ServingEndpoint",
            "metadata": {"name": name},
            "spec": spec or {"versions": [{"name": "v1", "model": "file:///m.json"}]}}


class Client:
    """A keep-alive HTTP/1.1 client over one connection."""

    def __init__(self, port, token=None, timeout=10):
        self.port, self.token, self.timeout = port, token, timeout
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def close(self):
        self.conn.close()

    def request(self, method, path, body=None, content_type="application/json", headers=None):
        hdrs = dict(headers or {})
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = content_type
        self.conn.request(method, path, body=data, headers=hdrs)
        resp = self.conn.getresponse()
        raw = resp.read()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, (json.loads(raw) if ctype.startswith("application/json") else raw)

    def ok(self, method, path, body=None, content_type="application/json", code=None):
        status, obj = self.request(method, path, body, content_type)
        if code is not None and status != code or status >= 300:
            raise AssertionError(f"{method} {path}: {status} {obj}")
        return obj


class WatchStream:
    """One watch request; next() reads one event line within a bounded time."""

    def __init__(self, port, path, token=None, timeout=10):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.conn.request("GET", path, headers=headers)
        self.resp = self.conn.getresponse()
        self.buf = b""

    def next(self):
        """The next event, or None at the clean end of the chunked body (an abrupt end raises
        http.client.IncompleteRead: read1 tells the two apart, readline does not)."""
        while b"\n" not in self.buf:
            data = self.resp.read1(65536)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def until(self, predicate, limit=50):
        """Events up to and including the first one predicate accepts."""
        seen = []
        for _ in range(limit):
            event = self.next()
            if event is None:
                raise AssertionError(f"stream ended; saw {seen}")
            seen.append(event)
            if predicate(event):
                return seen
        raise AssertionError(f"no matching event in {seen}")

    def close(self):
        self.conn.close()


class FakeTestCase(unittest.TestCase):
    server_args = {}

    def setUp(self):
        self.server = fake_apiserver.FakeApiServer(port=0, **self.server_args)
        self.port = self.server.start()
        self.client = Client(self.port, token=self.server_args.get("token"))
        self.addCleanup(self.server.stop)
        self.addCleanup(self.client.close)

    def watch(self, path):
        stream = WatchStream(self.port, path, token=self.server_args.get("token"))
        self.addCleanup(stream.close)
        return stream

    def assert_status(self, status, obj, code, reason):
        self.assertEqual(status, code, obj)
        self.assertEqual(obj["kind"], "Status")
        self.assertEqual(obj["apiVersion"], "v1")
        self.assertEqual(obj["status"], "Failure")
        self.assertEqual(obj["code"], code)
        self.assertEqual(obj["reason"], reason)
        self.assertTrue(obj["message"])


class CrudTest(FakeTestCase):
    def test_create_get_update_conflict_delete(self):
        c = self.client
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": "leader", "labels": {"a": "b"}},
                 "spec": {"holderIdentity": "one", "leaseDurationSeconds": 15}}
        status, created = c.request("POST", LEASES, lease)
        self.assertEqual(status, 201)
        meta = created["metadata"]
        self.assertEqual(meta["namespace"], NS)
        self.assertTrue(meta["uid"])
        self.assertRegex(meta["creationTimestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertIsInstance(meta["resourceVersion"], str)
        self.assertEqual(created["kind"], "Lease")

        status, obj = c.request("POST", LEASES, lease)
        self.assert_status(status, obj, 409, "AlreadyExists")
        self.assertEqual(obj["details"], {"name": "leader", "group": "coordination.k8s.io",
                                          "kind": "leases"})

        got = c.ok("GET", f"{LEASES}/leader")
        self.assertEqual(got, created)

        got["spec"]["holderIdentity"] = "two"
        updated = c.ok("PUT", f"{LEASES}/leader", got)
        self.assertGreater(int(updated["metadata"]["resourceVersion"]),
                           int(created["metadata"]["resourceVersion"]))
        self.assertEqual(updated["metadata"]["uid"], meta["uid"])

        # The second writer of the same version loses: 409 Conflict.
        got["spec"]["holderIdentity"] = "three"
        status, obj = c.request("PUT", f"{LEASES}/leader", got)
        self.assert_status(status, obj, 409, "Conflict")
        self.assertIn("the object has been modified", obj["message"])

        # An update that changes nothing writes nothing: same resourceVersion.
        again = c.ok("PUT", f"{LEASES}/leader", updated)
        self.assertEqual(again["metadata"]["resourceVersion"], updated["metadata"]["resourceVersion"])

        status, obj = c.request("DELETE", f"{LEASES}/leader")
        self.assertEqual(status, 200)
        self.assertEqual(obj["kind"], "Status")
        self.assertEqual(obj["status"], "Success")
        self.assertEqual(obj["details"]["uid"], meta["uid"])
        status, obj = c.request("GET", f"{LEASES}/leader")
        self.assert_status(status, obj, 404, "NotFound")
        self.assertEqual(obj["details"]["name"], "leader")
        status, obj = c.request("DELETE", f"{LEASES}/leader")
        self.assert_status(status, obj, 404, "NotFound")

    def test_delete_answers_and_collections_and_dry_run(self):
        c = self.client
        c.ok("POST", PODS, {"metadata": {"name": "p", "labels": {"app": "x"}}, "spec": {}})
        deleted = c.ok("DELETE", f"{PODS}/p")
        self.assertEqual((deleted["kind"], deleted["metadata"]["name"]), ("Pod", "p"))
        for n in range(3):
            c.ok("POST", PODS, {"metadata": {"name": f"q{n}", "labels": {"app": "q" if n else "r"}}})
        gone = c.ok("DELETE", f"{PODS}?labelSelector=app%3Dq")
        self.assertEqual((gone["kind"], [i["metadata"]["name"] for i in gone["items"]]),
                         ("PodList", ["q1", "q2"]))
        self.assertEqual([i["metadata"]["name"] for i in c.ok("GET", PODS)["items"]], ["q0"])
        rv = self.server.resource_version()
        c.ok("POST", f"{LEASES}?dryRun=All", {"metadata": {"name": "dry"}})
        c.ok("DELETE", f"{PODS}/q0?dryRun=All")
        self.assertEqual(self.server.resource_version(), rv)
        self.assertIsNone(self.server.get("leases", NS, "dry"))
        self.assertIsNotNone(self.server.get("pods", NS, "q0"))

    def test_invalid_names_and_generate_name(self):
        c = self.client
        status, obj = c.request("POST", LEASES, {"metadata": {}, "spec": {}})
        self.assert_status(status, obj, 422, "Invalid")
        self.assertEqual(obj["details"]["causes"][0]["field"], "metadata.name")
        status, obj = c.request("POST", LEASES, {"metadata": {"name": "Bad_Name"}})
        self.assert_status(status, obj, 422, "Invalid")
        a = c.ok("POST", LEASES, {"metadata": {"generateName": "lease-"}})
        b = c.ok("POST", LEASES, {"metadata": {"generateName": "lease-"}})
        self.assertTrue(a["metadata"]["name"].startswith("lease-"))
        self.assertNotEqual(a["metadata"]["name"], b["metadata"]["name"])
        status, obj = c.request("POST", LEASES, {"metadata": {"name": "x", "namespace": "other"}})
        self.assert_status(status, obj, 400, "BadRequest")
        status, obj = c.request("PUT", f"{LEASES}/missing", {"metadata": {"name": "missing"}})
        self.assert_status(status, obj, 404, "NotFound")
        status, obj = c.request("POST", f"{LEASES}/x", {"metadata": {"name": "x"}})
        self.assert_status(status, obj, 405, "MethodNotAllowed")
        status, obj = c.request("GET", "/apis/nope.dev/v1/namespaces/default/things")
        self.assert_status(status, obj, 404, "NotFound")

    def test_keep_alive_and_resource_versions_are_global(self):
        c = self.client
        a = c.ok("POST", LEASES, {"metadata": {"name": "a"}})
        sock = c.conn.sock
        b = c.ok("POST", DEPLOYMENTS, deployment("b"))
        self.assertIs(c.conn.sock, sock, "the connection was not kept alive")
        self.assertEqual(int(b["metadata"]["resourceVersion"]),
                         int(a["metadata"]["resourceVersion"]) + 1)
        listed = c.ok("GET", LEASES)
        self.assertEqual(listed["kind"], "LeaseList")
        self.assertEqual(listed["metadata"]["resourceVersion"], b["metadata"]["resourceVersion"])
        # Built-in list items carry no kind, as on the real server; custom resources do.
        self.assertNotIn("kind", listed["items"][0])
        c.ok("POST", ENDPOINTS, serving_endpoint("e"))
        self.assertEqual(c.ok("GET", ENDPOINTS)["items"][0]["kind"], "ServingEndpoint")
        all_ns = c.ok("GET", "/apis/apps/v1/deployments")
        self.assertEqual([d["metadata"]["name"] for d in all_ns["items"]], ["b"])

    def test_list_pages_with_limit_and_continue(self):
        for n in range(5):
            self.client.ok("POST", LEASES, {"metadata": {"name": f"l{n}"}})
        names, token = [], None
        for _ in range(5):
            page = self.client.ok("GET", f"{LEASES}?limit=2" + (f"&continue={token}" if token else ""))
            names += [i["metadata"]["name"] for i in page["items"]]
            token = page["metadata"].get("continue")
            if not token:
                break
        self.assertEqual(names, ["l0", "l1", "l2", "l3", "l4"])


class GenerationTest(FakeTestCase):
    def test_generation_moves_on_spec_only_and_status_has_its_own_subresource(self):
        c = self.client
        body = serving_endpoint("fraud")
        body["status"] = {"observedGeneration": 7}
        se = c.ok("POST", ENDPOINTS, body)
        self.assertEqual(se["metadata"]["generation"], 1)
        self.assertNotIn("status", se, "create must drop status when status is a subresource")

        se["metadata"]["labels"] = {"team": "risk"}
        se = c.ok("PUT", f"{ENDPOINTS}/fraud", se)
        self.assertEqual(se["metadata"]["generation"], 1, "a metadata change bumped generation")

        se["spec"]["versions"][0]["model"] = "file:///m2.json"
        se = c.ok("PUT", f"{ENDPOINTS}/fraud", se)
        self.assertEqual(se["metadata"]["generation"], 2)

        # /status writes only status; generation and spec stay.
        with_status = json.loads(json.dumps(se))
        with_status["status"] = {"observedGeneration": 2, "conditions": [{"type": "Ready"}]}
        with_status["spec"] = {"versions": []}
        after = c.ok("PUT", f"{ENDPOINTS}/fraud/status", with_status)
        self.assertEqual(after["status"]["observedGeneration"], 2)
        self.assertEqual(after["spec"], se["spec"])
        self.assertEqual(after["metadata"]["generation"], 2)

        # The main resource cannot write status.
        after["status"] = {"observedGeneration": 99}
        after["spec"]["versions"][0]["model"] = "file:///m3.json"
        main = c.ok("PUT", f"{ENDPOINTS}/fraud", after)
        self.assertEqual(main["status"]["observedGeneration"], 2)
        self.assertEqual(main["metadata"]["generation"], 3)

        patched = c.ok("PATCH", f"{ENDPOINTS}/fraud/status", {"status": {"ready": 1}},
                       "application/merge-patch+json")
        self.assertEqual(patched["status"], {"observedGeneration": 2, "ready": 1,
                                             "conditions": [{"type": "Ready"}]})
        self.assertEqual(patched["metadata"]["generation"], 3)

        # A custom resource's update must name the version it replaces.
        del main["metadata"]["resourceVersion"]
        status, obj = c.request("PUT", f"{ENDPOINTS}/fraud", main)
        self.assert_status(status, obj, 422, "Invalid")

    def test_deployment_status_is_left_to_the_controller(self):
        d = self.client.ok("POST", DEPLOYMENTS, deployment("web"))
        self.assertEqual(d["spec"]["replicas"], 1)  # defaulted, as on the real server
        self.assertEqual(d["status"], {})
        self.assertEqual(d["metadata"]["generation"], 1)
        self.server.update_status("deployments", NS, "web",
                                  {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1})
        d = self.client.ok("GET", f"{DEPLOYMENTS}/web")
        self.assertEqual(d["status"]["readyReplicas"], 1)
        self.assertEqual(d["metadata"]["generation"], 1)


class PatchTest(FakeTestCase):
    def test_merge_strategic_and_json_patches(self):
        c = self.client
        c.ok("POST", DEPLOYMENTS, deployment("web", replicas=2))
        d = c.ok("PATCH", f"{DEPLOYMENTS}/web",
                 {"metadata": {"labels": {"extra": "1", "app": None}}, "spec": {"replicas": 4}},
                 "application/merge-patch+json")
        self.assertEqual(d["metadata"]["labels"], {"extra": "1"})
        self.assertEqual(d["spec"]["replicas"], 4)
        self.assertEqual(d["metadata"]["generation"], 2)

        # Strategic: containers merge by name, env by name; $setElementOrder is not stored.
        d = c.ok("PATCH", f"{DEPLOYMENTS}/web", {"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "replica"}, {"name": "sidecar"}],
            "containers": [{"name": "replica", "env": [{"name": "B", "value": "2"}]},
                           {"name": "sidecar", "image": "envoy"}]}}}},
                 "application/strategic-merge-patch+json")
        containers = d["spec"]["template"]["spec"]["containers"]
        self.assertEqual([x["name"] for x in containers], ["replica", "sidecar"])
        self.assertEqual(containers[0]["image"], "flotilla")
        self.assertEqual([e["name"] for e in containers[0]["env"]], ["A", "B"])
        self.assertNotIn("$setElementOrder/containers", d["spec"]["template"]["spec"])
        d = c.ok("PATCH", f"{DEPLOYMENTS}/web", {"spec": {"template": {"spec": {
            "containers": [{"name": "sidecar", "$patch": "delete"}]}}}},
                 "application/strategic-merge-patch+json")
        self.assertEqual([x["name"] for x in d["spec"]["template"]["spec"]["containers"]],
                         ["replica"])

        d = c.ok("PATCH", f"{DEPLOYMENTS}/web", [
            {"op": "test", "path": "/spec/replicas", "value": 4},
            {"op": "replace", "path": "/spec/replicas", "value": 6},
            {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "c"}},
            {"op": "add", "path": "/spec/template/spec/containers/0/env/-",
             "value": {"name": "C", "value": "3"}},
            {"op": "remove", "path": "/metadata/labels/extra"},
        ], "application/json-patch+json")
        self.assertEqual(d["spec"]["replicas"], 6)
        self.assertEqual(d["metadata"]["annotations"], {"a/b": "c"})
        self.assertNotIn("extra", d["metadata"].get("labels", {}))
        self.assertEqual(d["spec"]["template"]["spec"]["containers"][0]["env"][-1]["name"], "C")
        d = c.ok("PATCH", f"{DEPLOYMENTS}/web", [
            {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "d"}],
                 "application/json-patch+json")
        self.assertEqual(d["metadata"]["annotations"], {"a/b": "d"})

        status, obj = c.request("PATCH", f"{DEPLOYMENTS}/web",
                                [{"op": "test", "path": "/spec/replicas", "value": 1}],
                                "application/json-patch+json")
        self.assert_status(status, obj, 422, "Invalid")
        # A patch that names a stale resourceVersion conflicts.
        status, obj = c.request("PATCH", f"{DEPLOYMENTS}/web",
                                {"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 1}},
                                "application/merge-patch+json")
        self.assert_status(status, obj, 409, "Conflict")
        status, obj = c.request("PATCH", f"{DEPLOYMENTS}/web", {"spec": {}},
                                "application/apply-patch+yaml")
        self.assert_status(status, obj, 415, "UnsupportedMediaType")
        status, obj = c.request("PATCH", f"{DEPLOYMENTS}/missing", {"spec": {}},
                                "application/merge-patch+json")
        self.assert_status(status, obj, 404, "NotFound")


class ScaleTest(FakeTestCase):
    def test_scale_subresource_reads_and_writes_spec_replicas(self):
        c = self.client
        c.ok("POST", DEPLOYMENTS, deployment("web", labels={"app": "web", "tier": "a"}))
        scale = c.ok("GET", f"{DEPLOYMENTS}/web/scale")
        self.assertEqual(scale["kind"], "Scale")
        self.assertEqual(scale["apiVersion"], "autoscaling/v1")
        self.assertEqual(scale["spec"], {"replicas": 1})
        self.assertEqual(scale["status"], {"replicas": 0, "selector": "app=web,tier=a"})

        scale["spec"]["replicas"] = 3
        scale = c.ok("PUT", f"{DEPLOYMENTS}/web/scale", scale)
        self.assertEqual(scale["spec"]["replicas"], 3)
        d = c.ok("GET", f"{DEPLOYMENTS}/web")
        self.assertEqual(d["spec"]["replicas"], 3)
        self.assertEqual(d["metadata"]["generation"], 2)
        self.assertEqual(d["metadata"]["resourceVersion"], scale["metadata"]["resourceVersion"])

        stale = dict(scale, metadata=dict(scale["metadata"], resourceVersion="1"))
        status, obj = c.request("PUT", f"{DEPLOYMENTS}/web/scale", stale)
        self.assert_status(status, obj, 409, "Conflict")

        scale = c.ok("PATCH", f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": 5}},
                     "application/merge-patch+json")
        self.assertEqual(scale["spec"]["replicas"], 5)
        self.server.update_status("deployments", NS, "web", {"replicas": 4})
        self.assertEqual(c.ok("GET", f"{DEPLOYMENTS}/web/scale")["status"]["replicas"], 4)
        status, obj = c.request("PATCH", f"{DEPLOYMENTS}/web/scale", {"spec": {"replicas": -1}},
                                "application/merge-patch+json")
        self.assert_status(status, obj, 422, "Invalid")
        status, obj = c.request("GET", f"{LEASES}/x/scale")
        self.assert_status(status, obj, 404, "NotFound")


class SelectorTest(FakeTestCase):
    def test_label_and_field_selectors(self):
        c = self.client
        pods = {"a": {"app": "web", "tier": "front"}, "b": {"app": "web", "tier": "back"},
                "c": {"app": "db"}, "d": {}}
        for name, labels in pods.items():
            c.ok("POST", PODS, {"metadata": {"name": name, "labels": labels}, "spec": {}})

        def names(selector, field=""):
            from urllib.parse import quote
            q = f"?labelSelector={quote(selector)}"
            if field:
                q += f"&fieldSelector={quote(field)}"
            return sorted(i["metadata"]["name"] for i in c.ok("GET", PODS + q)["items"])

        self.assertEqual(names("app=web"), ["a", "b"])
        self.assertEqual(names("app==web,tier=back"), ["b"])
        self.assertEqual(names("app!=web"), ["c", "d"])  # != also selects the unlabelled
        self.assertEqual(names("tier in (front, back)"), ["a", "b"])
        self.assertEqual(names("tier notin (front),app"), ["b", "c"])
        self.assertEqual(names("tier"), ["a", "b"])
        self.assertEqual(names("!tier"), ["c", "d"])
        self.assertEqual(names("", "metadata.name=c"), ["c"])
        self.assertEqual(names("app=web", "metadata.name!=a"), ["b"])
        status, obj = c.request("GET", PODS + "?labelSelector=a%3D%3D%3Db")
        self.assert_status(status, obj, 400, "BadRequest")
        status, obj = c.request("GET", PODS + "?fieldSelector=spec.x%3D1")
        self.assert_status(status, obj, 400, "BadRequest")


class CascadeTest(FakeTestCase):
    def test_deleting_an_owner_deletes_its_dependents(self):
        c = self.client
        se = c.ok("POST", ENDPOINTS, serving_endpoint("fraud"))
        d1 = c.ok("POST", DEPLOYMENTS, deployment("fraud-v1", owner=se))
        c.ok("POST", DEPLOYMENTS, deployment("fraud-v2", owner=se))
        c.ok("POST", SLICES, {"metadata": {"name": "fraud-v1-abc", "ownerReferences": [owner_ref(d1)]},
                              "addressType": "IPv4", "endpoints": []})
        other = c.ok("POST", LEASES, {"metadata": {"name": "keep"}})
        shared = c.ok("POST", LEASES, {"metadata": {"name": "shared", "ownerReferences": [
            owner_ref(se), owner_ref(other)]}})
        c.ok("POST", LEASES, {"metadata": {"name": "unrelated"}})

        status, obj = c.request("DELETE", f"{ENDPOINTS}/fraud")
        self.assertEqual(status, 200)
        self.assertEqual(obj["details"]["kind"], "servingendpoints")
        self.assertEqual(c.ok("GET", DEPLOYMENTS)["items"], [])
        self.assertEqual(c.ok("GET", SLICES)["items"], [])
        left = c.ok("GET", f"{LEASES}/shared")
        self.assertEqual([r["uid"] for r in left["metadata"]["ownerReferences"]],
                         [other["metadata"]["uid"]])
        self.assertEqual(sorted(i["metadata"]["name"] for i in c.ok("GET", LEASES)["items"]),
                         ["keep", "shared", "unrelated"])
        self.assertNotEqual(left["metadata"]["resourceVersion"], shared["metadata"]["resourceVersion"])

    def test_orphan_keeps_dependents(self):
        c = self.client
        owner = c.ok("POST", LEASES, {"metadata": {"name": "owner"}})
        c.ok("POST", LEASES, {"metadata": {"name": "child", "ownerReferences": [owner_ref(owner)]}})
        c.ok("DELETE", f"{LEASES}/owner", {"propagationPolicy": "Orphan"})
        self.assertNotIn("ownerReferences", c.ok("GET", f"{LEASES}/child")["metadata"])

    def test_delete_preconditions(self):
        c = self.client
        lease = c.ok("POST", LEASES, {"metadata": {"name": "l"}})
        status, obj = c.request("DELETE", f"{LEASES}/l",
                                {"preconditions": {"resourceVersion": "1"}})
        self.assert_status(status, obj, 409, "Conflict")
        c.ok("DELETE", f"{LEASES}/l",
             {"preconditions": {"uid": lease["metadata"]["uid"],
                                "resourceVersion": lease["metadata"]["resourceVersion"]}})


class WatchTest(FakeTestCase):
    server_args = {"bookmark_interval": 3600.0}

    def test_watch_from_a_resource_version_sees_changes_in_order(self):
        c = self.client
        c.ok("POST", LEASES, {"metadata": {"name": "before"}})
        rv = c.ok("GET", LEASES)["metadata"]["resourceVersion"]
        w = self.watch(f"{LEASES}?watch=1&resourceVersion={rv}")
        self.assertEqual(w.resp.status, 200)
        self.assertEqual(w.resp.getheader("Transfer-Encoding"), "chunked")
        self.assertEqual(w.resp.getheader("Content-Type"), "application/json")
        self.assertTrue(self.server.wait_for_watches(1))
        lease = c.ok("POST", LEASES, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
        c.ok("POST", DEPLOYMENTS, deployment("noise"))  # another resource: not on this stream
        c.ok("PATCH", f"{LEASES}/l", {"spec": {"holderIdentity": "b"}}, "application/merge-patch+json")
        c.ok("DELETE", f"{LEASES}/l")
        events = [w.next() for _ in range(3)]
        self.assertEqual([e["type"] for e in events], ["ADDED", "MODIFIED", "DELETED"])
        self.assertEqual(events[0]["object"]["metadata"]["uid"], lease["metadata"]["uid"])
        self.assertEqual(events[0]["object"]["kind"], "Lease")
        self.assertEqual(events[0]["object"]["apiVersion"], "coordination.k8s.io/v1")
        self.assertEqual(events[1]["object"]["spec"]["holderIdentity"], "b")
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        self.assertEqual(rvs, sorted(rvs))
        self.assertEqual(rvs[2], int(self.server.resource_version()))

    def test_watch_without_resource_version_starts_with_the_current_objects(self):
        c = self.client
        c.ok("POST", LEASES, {"metadata": {"name": "a"}})
        c.ok("POST", LEASES, {"metadata": {"name": "b"}})
        w = self.watch(f"{LEASES}?watch=true")
        first = [w.next(), w.next()]
        self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in first],
                         [("ADDED", "a"), ("ADDED", "b")])
        c.ok("DELETE", f"{LEASES}/a")
        self.assertEqual(w.next()["type"], "DELETED")

    def test_selector_watch_sends_deleted_when_an_object_stops_matching(self):
        c = self.client
        rv = self.server.resource_version()
        w = self.watch(f"{PODS}?watch=1&resourceVersion={rv}&labelSelector=app%3Dweb")
        self.assertTrue(self.server.wait_for_watches(1))
        c.ok("POST", PODS, {"metadata": {"name": "p", "labels": {"app": "web"}}})
        c.ok("POST", PODS, {"metadata": {"name": "q", "labels": {"app": "db"}}})
        moved = c.ok("PATCH", f"{PODS}/p", {"metadata": {"labels": {"app": "db"}}},
                     "application/merge-patch+json")
        c.ok("PATCH", f"{PODS}/p", {"metadata": {"labels": {"app": "web"}}},
             "application/merge-patch+json")
        events = [w.next() for _ in range(3)]
        self.assertEqual([(e["type"], e["object"]["metadata"]["name"]) for e in events],
                         [("ADDED", "p"), ("DELETED", "p"), ("ADDED", "p")])
        # DELETED carries the object as it was (still matching), at the event's version.
        self.assertEqual(events[1]["object"]["metadata"]["labels"], {"app": "web"})
        self.assertEqual(events[1]["object"]["metadata"]["resourceVersion"],
                         moved["metadata"]["resourceVersion"])

    def test_bookmarks_carry_only_the_resource_version(self):
        c = self.client
        rv = self.server.resource_version()
        plain = self.watch(f"{LEASES}?watch=1&resourceVersion={rv}")
        w = self.watch(f"{LEASES}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true")
        self.assertTrue(self.server.wait_for_watches(2))
        c.ok("POST", DEPLOYMENTS, deployment("elsewhere"))
        self.server.send_bookmarks()
        bookmark = w.next()
        self.assertEqual(bookmark["type"], "BOOKMARK")
        self.assertEqual(bookmark["object"], {
            "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"resourceVersion": self.server.resource_version()}})
        # A watch that did not ask for bookmarks gets none: its next event is the next change.
        c.ok("POST", LEASES, {"metadata": {"name": "l"}})
        self.assertEqual(plain.next()["type"], "ADDED")
        self.assertEqual(w.next()["type"], "ADDED")

    def test_periodic_bookmarks(self):
        self.server.bookmark_interval = 0.05
        w = self.watch(f"{LEASES}?watch=1&allowWatchBookmarks=1&resourceVersion=1")
        self.assertEqual(w.next()["type"], "BOOKMARK")
        self.assertEqual(w.next()["type"], "BOOKMARK")

    def test_send_initial_events_ends_with_an_annotated_bookmark(self):
        self.client.ok("POST", LEASES, {"metadata": {"name": "a"}})
        w = self.watch(f"{LEASES}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
                       "&resourceVersionMatch=NotOlderThan")
        self.assertEqual(w.next()["type"], "ADDED")
        end = w.next()
        self.assertEqual(end["type"], "BOOKMARK")
        self.assertEqual(end["object"]["metadata"]["annotations"],
                         {"k8s.io/initial-events-end": "true"})

    def test_timeout_seconds_ends_the_stream(self):
        start = time.monotonic()
        w = self.watch(f"{LEASES}?watch=1&timeoutSeconds=1&resourceVersion=1")
        self.assertIsNone(w.next())  # the clean end of the chunked body
        self.assertLess(time.monotonic() - start, 8)
        # The connection stays usable after the stream ends.
        w.conn.request("GET", LEASES)
        self.assertEqual(w.conn.getresponse().status, 200)

    def test_too_old_resource_version_gets_an_expired_error_event(self):
        c = self.client
        c.ok("POST", LEASES, {"metadata": {"name": "a"}})
        old = self.server.resource_version()
        c.ok("POST", LEASES, {"metadata": {"name": "b"}})
        self.server.compact()
        w = self.watch(f"{LEASES}?watch=1&resourceVersion={old}")
        self.assertEqual(w.resp.status, 200)
        event = w.next()
        self.assertEqual(event["type"], "ERROR")
        self.assert_status(410, event["object"], 410, "Expired")
        self.assertIn("too old resource version", event["object"]["message"])
        self.assertIsNone(w.next())
        # From the current version (list, then watch) all is well again.
        rv = c.ok("GET", LEASES)["metadata"]["resourceVersion"]
        w2 = self.watch(f"{LEASES}?watch=1&resourceVersion={rv}")
        self.assertTrue(self.server.wait_for_watches(1))
        c.ok("DELETE", f"{LEASES}/a")
        self.assertEqual(w2.next()["type"], "DELETED")

    def test_break_watches_ends_streams_and_a_rewatch_misses_nothing(self):
        c = self.client
        rv = self.server.resource_version()
        w = self.watch(f"{LEASES}?watch=1&resourceVersion={rv}")
        self.assertTrue(self.server.wait_for_watches(1))
        c.ok("POST", LEASES, {"metadata": {"name": "a"}})
        last = w.next()["object"]["metadata"]["resourceVersion"]
        self.server.break_watches()
        self.assertIsNone(w.next())
        c.ok("POST", LEASES, {"metadata": {"name": "b"}})  # while no one watches
        w2 = self.watch(f"{LEASES}?watch=1&resourceVersion={last}")
        self.assertEqual(w2.next()["object"]["metadata"]["name"], "b")
        self.assertTrue(self.server.wait_for_watches(1))
        self.server.break_watches(abrupt=True)
        with self.assertRaises(http.client.IncompleteRead):
            w2.next()
        self.assertTrue(self._wait(lambda: self.server.open_watches() == 0))

    def _wait(self, predicate, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(0.01)
        return False


class SlowWatcherTest(FakeTestCase):
    def test_a_watch_that_is_not_read_blocks_no_one(self):
        c = self.client
        stalled = self.watch(f"{LEASES}?watch=1&resourceVersion=1")
        self.assertTrue(self.server.wait_for_watches(1))
        big = "x" * 60000
        for n in range(80):  # ~5 MB: more than the socket buffers hold
            c.ok("POST", LEASES, {"metadata": {"name": f"l{n}", "annotations": {"big": big}}})
        other = self.watch(f"{LEASES}?watch=1&resourceVersion={self.server.resource_version()}")
        self.assertTrue(self.server.wait_for_watches(2))
        c.ok("DELETE", f"{LEASES}/l0")
        self.assertEqual(other.next()["type"], "DELETED")
        self.assertEqual(stalled.next()["object"]["metadata"]["name"], "l0")


class HistoryWindowTest(FakeTestCase):
    server_args = {"history_limit": 3}

    def test_a_watch_older_than_the_window_expires(self):
        c = self.client
        start = self.server.resource_version()
        for n in range(5):
            c.ok("POST", LEASES, {"metadata": {"name": f"l{n}"}})
        event = self.watch(f"{LEASES}?watch=1&resourceVersion={start}").next()
        self.assertEqual(event["type"], "ERROR")
        self.assertEqual(event["object"]["code"], 410)
        recent = int(self.server.resource_version()) - 2
        events = self.watch(f"{LEASES}?watch=1&resourceVersion={recent}")
        self.assertEqual([events.next()["type"], events.next()["type"]], ["ADDED", "ADDED"])


class AuthTest(FakeTestCase):
    server_args = {"token": "s3cret"}

    def test_requests_need_the_bearer_token(self):
        anon = Client(self.port)
        self.addCleanup(anon.close)
        status, obj = anon.request("GET", LEASES)
        self.assert_status(status, obj, 401, "Unauthorized")
        status, obj = anon.request("GET", LEASES, headers={"Authorization": "Bearer wrong"})
        self.assert_status(status, obj, 401, "Unauthorized")
        status, obj = anon.request("GET", f"{LEASES}?watch=1")
        self.assert_status(status, obj, 401, "Unauthorized")
        self.assertEqual(anon.request("GET", "/version")[0], 200)
        self.assertEqual(self.client.request("GET", LEASES)[0], 200)


@unittest.skipUnless(shutil.which("openssl"), "openssl is not on PATH")
class TlsTest(unittest.TestCase):
    def test_serves_tls_that_a_client_verifies_against_the_cert(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
        server = fake_apiserver.FakeApiServer(port=0, tls_cert=cert, tls_key=key)
        port = server.start()
        self.addCleanup(server.stop)
        ctx = ssl.create_default_context(cafile=cert)
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
        conn.request("GET", "/apis/apps/v1")
        self.assertEqual(json.loads(conn.getresponse().read())["groupVersion"], "apps/v1")
        conn.close()
        # With a client CA, a verified client certificate authenticates instead of the token.
        ccert, ckey = os.path.join(tmp, "client.pem"), os.path.join(tmp, "client-key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=flotilla-test", "-keyout", ckey, "-out", ccert],
                       check=True, capture_output=True, timeout=60)
        authed = fake_apiserver.FakeApiServer(port=0, tls_cert=cert, tls_key=key, token="t",
                                              client_ca=ccert)
        aport = authed.start()
        self.addCleanup(authed.stop)
        with_cert = ssl.create_default_context(cafile=cert)
        with_cert.load_cert_chain(ccert, ckey)
        for context, want in ((with_cert, 200), (ssl.create_default_context(cafile=cert), 401)):
            conn = http.client.HTTPSConnection("127.0.0.1", aport, context=context, timeout=10)
            conn.request("GET", LEASES)
            resp = conn.getresponse()
            resp.read()
            self.assertEqual(resp.status, want)
            conn.close()
        untrusting = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                                 context=ssl.create_default_context())
        with self.assertRaises(ssl.SSLError):
            untrusting.request("GET", "/version")
        untrusting.close()


class FaultTest(FakeTestCase):
    def test_fail_and_hang_next_requests(self):
        c = self.client
        self.server.fail_next(2, 503, match=r"/leases")
        status, obj = c.request("GET", LEASES)
        self.assert_status(status, obj, 503, "ServiceUnavailable")
        self.assertEqual(c.request("GET", DEPLOYMENTS)[0], 200)  # not matched
        self.assertEqual(c.request("GET", LEASES)[0], 503)
        self.assertEqual(c.request("GET", LEASES)[0], 200)

        self.server.hang_next(1, 30)
        slow = Client(self.port, timeout=0.3)
        self.addCleanup(slow.close)
        with self.assertRaises(socket.timeout):
            slow.request("GET", LEASES)
        self.server.release_hangs()
        fresh = Client(self.port)
        self.addCleanup(fresh.close)
        self.assertEqual(fresh.request("GET", LEASES)[0], 200)
        self.assertIn(f"GET {LEASES}", self.server.requests())


class SubscribeTest(FakeTestCase):
    def test_subscribers_see_every_change_in_order_and_may_write_back(self):
        import queue
        seen = queue.Queue()

        def on_change(type_, obj, prev):
            seen.put((type_, obj["kind"], obj["metadata"]["name"]))
            if type_ == "ADDED" and obj["kind"] == "Deployment":  # what a kubelet does
                self.server.update_status("deployments", NS, obj["metadata"]["name"],
                                          {"readyReplicas": obj["spec"]["replicas"]})

        self.addCleanup(self.server.subscribe(on_change))
        self.client.ok("POST", DEPLOYMENTS, deployment("web", replicas=2))
        got = [seen.get(timeout=10) for _ in range(2)]
        self.assertEqual(got, [("ADDED", "Deployment", "web"), ("MODIFIED", "Deployment", "web")])
        self.assertEqual(self.server.get("deployments", NS, "web")["status"]["readyReplicas"], 2)

    def test_replay_and_resource_filter(self):
        import queue
        self.client.ok("POST", LEASES, {"metadata": {"name": "old"}})
        self.client.ok("POST", DEPLOYMENTS, deployment("old"))
        seen = queue.Queue()
        self.addCleanup(self.server.subscribe(
            lambda t, obj, prev: seen.put((t, obj["metadata"]["name"])),
            resources=["leases"], replay=True))
        self.client.ok("POST", DEPLOYMENTS, deployment("new"))
        self.client.ok("POST", LEASES, {"metadata": {"name": "new"}})
        self.assertEqual([seen.get(timeout=10) for _ in range(2)],
                         [("ADDED", "old"), ("ADDED", "new")])


class DiscoveryTest(FakeTestCase):
    def test_discovery_documents_and_crds(self):
        c = self.client
        self.assertEqual(c.ok("GET", "/api")["versions"], ["v1"])
        groups = {g["name"] for g in c.ok("GET", "/apis")["groups"]}
        self.assertTrue({"apps", "discovery.k8s.io", "coordination.k8s.io", "flotilla.dev",
                         "apiextensions.k8s.io"} <= groups)
        apps = {r["name"]: r for r in c.ok("GET", "/apis/apps/v1")["resources"]}
        self.assertEqual((apps["deployments/scale"]["group"], apps["deployments/scale"]["kind"]),
                         ("autoscaling", "Scale"))
        self.assertIn("watch", apps["deployments"]["verbs"])
        self.assertIn("servingendpoints/status",
                      {r["name"] for r in c.ok("GET", "/apis/flotilla.dev/v1")["resources"]})
        self.assertEqual(c.request("GET", "/openapi/v2")[0], 404)
        root = c.ok("GET", "/openapi/v3")["paths"]
        self.assertIn("apis/flotilla.dev/v1", root)
        doc = c.ok("GET", root["apis/apps/v1"]["serverRelativeURL"])
        patch = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
        self.assertEqual(patch["x-kubernetes-group-version-kind"]["kind"], "Deployment")

        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "widgets.example.com"},
               "spec": {"group": "example.com", "scope": "Namespaced",
                        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                        "versions": [{"name": "v1", "served": True, "storage": True,
                                      "subresources": {"status": {}, "scale": {
                                          "specReplicasPath": ".spec.size",
                                          "statusReplicasPath": ".status.size"}}}]}}
        created = c.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        self.assertEqual({x["type"] for x in created["status"]["conditions"]},
                         {"Established", "NamesAccepted"})
        widgets = "/apis/example.com/v1/namespaces/default/widgets"
        c.ok("POST", widgets, {"apiVersion": "example.com/v1", "kind": "Widget",
                               "metadata": {"name": "w"}, "spec": {"size": 2}})
        self.assertEqual(c.ok("GET", f"{widgets}/w/scale")["spec"]["replicas"], 2)
        c.ok("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
        self.assertEqual(c.request("GET", widgets)[0], 404)
        self.assertNotIn("example.com", {g["name"] for g in c.ok("GET", "/apis")["groups"]})


class ProcessTest(unittest.TestCase):
    def test_runs_as_a_process_and_reports_its_port(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen([sys.executable, fake_apiserver.__file__, "--port", "0",
                                 "--port-file", port_file, "--token", "t"],
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        line = proc.stdout.readline().strip()
        self.assertRegex(line, r"^listening on 127\.0\.0\.1:\d+$")
        port = int(line.rsplit(":", 1)[1])
        with open(port_file) as f:
            self.assertEqual(int(f.read()), port)
        c = Client(port, token="t")
        self.addCleanup(c.close)
        c.ok("POST", LEASES, {"metadata": {"name": "a"}})
        # The test hooks over HTTP (no token needed).
        hook = Client(port)
        self.addCleanup(hook.close)
        self.assertEqual(hook.ok("POST", "/fake/compact")["compactedTo"],
                         c.ok("GET", LEASES)["metadata"]["resourceVersion"])
        hook.ok("POST", "/fake/fail?count=1&code=500")
        self.assertEqual(c.request("GET", LEASES)[0], 500)
        self.assertEqual(hook.ok("GET", "/fake/watches"), {"open": 0})
        w = WatchStream(port, f"{LEASES}?watch=1", token="t")
        self.addCleanup(w.close)
        self.assertEqual(w.next()["type"], "ADDED")
        hook.ok("POST", "/fake/break-watches")
        self.assertIsNone(w.next())
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=10), 0)


@unittest.skipUnless(shutil.which("kubectl"), "kubectl is not on PATH: the kubectl run is skipped")
class KubectlTest(FakeTestCase):
    def kubectl(self, *args, stdin=None):
        cmd = ["kubectl", "--server", f"http://127.0.0.1:{self.port}", "--cache-dir",
               os.path.join(self.home, "cache"), "-n", NS, *args]
        env = dict(os.environ, HOME=self.home, KUBECONFIG=os.path.join(self.home, "none"))
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30,
                              env=env)
        self.assertEqual(proc.returncode, 0, f"{cmd}: {proc.stderr}")
        return proc.stdout

    def test_kubectl_get_apply_scale_delete(self):
        self.home = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.home)
        manifests = textwrap.dedent("""\
            apiVersion: flotilla.dev/v1
            kind: ServingEndpoint
            metadata: {name: fraud}
            spec:
              versions: [{name: v1, model: "file:///m.json"}]
            ---
            apiVersion: apps/v1
            kind: Deployment
            metadata: {name: fraud-v1, labels: {app: fraud}}
            spec:
              replicas: 1
              selector: {matchLabels: {app: fraud}}
              template:
                metadata: {labels: {app: fraud}}
                spec:
                  containers: [{name: replica, image: "flotilla:1"}]
            """)
        # kubectl's default validation (fieldValidation=Strict, seen in the OpenAPI v3 stub).
        out = self.kubectl("apply", "-f", "-", stdin=manifests)
        self.assertIn("servingendpoint.flotilla.dev/fraud created", out)
        self.assertIn("deployment.apps/fraud-v1 created", out)
        out = self.kubectl("apply", "-f", "-",
                           stdin=manifests.replace("flotilla:1", "flotilla:2")
                           .replace("m.json", "m2.json"))
        self.assertIn("configured", out)
        se = self.server.get("servingendpoints", NS, "fraud")
        self.assertEqual(se["spec"]["versions"][0]["model"], "file:///m2.json")
        self.assertEqual(se["metadata"]["generation"], 2)
        d = self.server.get("deployments", NS, "fraud-v1")
        self.assertEqual(d["spec"]["template"]["spec"]["containers"][0]["image"], "flotilla:2")

        names = self.kubectl("get", "servingendpoints,deployments", "-o", "name").split()
        self.assertEqual(sorted(names), ["deployment.apps/fraud-v1",
                                         "servingendpoint.flotilla.dev/fraud"])
        got = json.loads(self.kubectl("get", "se", "fraud", "-o", "json"))
        self.assertEqual(got["metadata"]["uid"], se["metadata"]["uid"])

        self.assertIn("scaled", self.kubectl("scale", "deployment/fraud-v1", "--replicas=4"))
        self.assertEqual(self.server.get("deployments", NS, "fraud-v1")["spec"]["replicas"], 4)
        self.assertTrue(any("/deployments/fraud-v1/scale" in r for r in self.server.requests()))

        self.kubectl("delete", "servingendpoint", "fraud")
        self.kubectl("delete", "deployment", "fraud-v1")
        self.assertIsNone(self.server.get("servingendpoints", NS, "fraud"))
        self.assertIsNone(self.server.get("deployments", NS, "fraud-v1"))
        self.assertEqual(self.kubectl("get", "deployments", "-o", "name").strip(), "")


if __name__ == "__main__":
    unittest.main()
