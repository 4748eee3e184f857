#!/usr/bin/python3
"""A FAKE Kubernetes API server for Flotilla's tests. It is not Kubernetes.

No real API server can run on the machines the tests run on, so this one stands in for it. It
speaks the real wire protocol (HTTP/1.1 REST, JSON, chunked watch streams, `Status` errors) for
the subset Flotilla's Kubernetes mode uses, keeps everything in memory, and runs no controllers:
nothing ever turns a Deployment into pods unless a test (or the fake kubelet built on
`subscribe()`) does it.

Served (all JSON; discovery at /api, /api/v1, /apis, /apis/{g}, /apis/{g}/{v}, /version):
  v1                            namespaces (cluster), pods, services, secrets, configmaps, events,
                                endpoints, serviceaccounts
  apps/v1                       deployments (+ status, + scale: autoscaling/v1 Scale)
  discovery.k8s.io/v1           endpointslices
  coordination.k8s.io/v1        leases
  apiextensions.k8s.io/v1       customresourcedefinitions (cluster, + status); creating one serves
                                its group/version (storage version only), deleting one stops it
                                and deletes its objects
  flotilla.dev/v1               servingendpoints (+ status), pre-registered through a built-in CRD
                                object unless flotilla_crd=False / --no-flotilla-crd
  policy/v1, networking.k8s.io/v1, rbac.authorization.k8s.io/v1
                                poddisruptionbudgets, networkpolicies, roles, rolebindings,
                                clusterroles, clusterrolebindings (stored only; nothing enforced)
Verbs: get, list (labelSelector: = == != in notin exists !key gt lt; fieldSelector:
metadata.name and metadata.namespace with = == !=; limit/continue), create (409 AlreadyExists,
422 Invalid, generateName), update (409 Conflict on a stale metadata.resourceVersion; custom
resources require one, as on the real server), patch (application/merge-patch+json,
application/json-patch+json, application/strategic-merge-patch+json), delete (DeleteOptions
preconditions and propagationPolicy Orphan), deletecollection, watch (?watch=1 or the old
/watch/ prefix; resourceVersion, allowWatchBookmarks, timeoutSeconds, selectors,
sendInitialEvents).

Semantics kept from the real server: one global resourceVersion counter (a decimal string);
metadata.uid, creationTimestamp, generation (1 on create, +1 on a spec change only; status
writes never bump it); for a resource with a status subresource, writes to the main resource
keep the stored status and writes to /status change only status; an update that changes nothing
is not written (no new resourceVersion, no watch event); a Deployment gets replicas 1,
strategy, revisionHistoryLimit and progressDeadlineSeconds defaulted, and its status is left to
whoever plays the controller; watch objects carry kind/apiVersion, list items of built-in types
do not; an object that stops matching a watch's selector is sent as DELETED (its previous content
with the event's resourceVersion) and one that starts matching as ADDED; a watch from a
resourceVersion older than the kept history gets HTTP 200 and one ERROR event with a Status 410
reason Expired "too old resource version: R (OLDEST)"; BOOKMARK objects carry only kind,
apiVersion and metadata.resourceVersion; DELETE answers a Status Success with details
{name, group, kind: plural, uid}, except pods, services, serviceaccounts (ReturnDeletedObject in
their real storage) and CRDs (deleted through a finalizer), which answer the deleted object.

Differences from a real API server, on purpose:
  - no etcd, no persistence; the watch history is a bounded window of events (history_limit,
    default 1000) that compact() empties; a watch that falls out of the window mid-stream gets
    the same 410 ERROR event and the stream ends (the real server just closes the stream).
  - deletes are immediate: no deletionTimestamp, no finalizers, no graceful deletion; deleting
    an owner deletes its dependents (by ownerReferences uid) at once, in the same request
    (Background and Foreground alike); a dependent that still has another live owner only
    loses the reference. Deleting a Namespace deletes the objects in it. Namespaces need not
    exist to be used.
  - strategic merge patch is a JSON merge patch that also knows the merge keys of the lists
    kubectl patches (containers, env, ports, volumes, volumeMounts, conditions, ...) and the
    directives $patch (replace/delete), $retainKeys, $deleteFromPrimitiveList; it ignores
    $setElementOrder. Server-side apply (application/apply-patch+yaml) answers 415.
  - no admission, no schema validation or pruning of custom resources, no defaulting beyond the
    Deployment fields above, no managedFields, no Table output (kubectl prints its default
    columns), no aggregated discovery (kubectl falls back to the plain discovery documents).
  - JSON only: a protobuf, CBOR or YAML request body answers 415 (kubectl's imperative
    generators such as `kubectl create deployment NAME` send protobuf and fail; `kubectl
    apply/create/replace -f`, `scale`, `patch`, `delete`, `get`, `get -w` work).
  - /openapi/v3 serves only a stub per group/version: each resource's PATCH operation with its
    x-kubernetes-group-version-kind and the fieldValidation parameter and no schemas, which is
    what lets kubectl's default validation through (it sends fieldValidation=Strict, which this
    fake ignores: unknown fields are kept, not rejected). /openapi/v2 answers 404.
  - resourceVersion / resourceVersionMatch on get and list are ignored (they always serve the
    latest state), and continue tokens page through the latest state rather than a snapshot.
    dryRun=All is honoured for create/update/patch/delete.
  - authentication: with a token, every request but /healthz /livez /readyz /version and the
    /fake/ test hooks must carry `Authorization: Bearer TOKEN` (else 401 Unauthorized); with a
    client CA and TLS, a verified client certificate also authenticates. No authorization (RBAC
    objects are stored, not enforced).
  - watch bookmarks come every bookmark_interval seconds (default 1 s; the real server: about a
    minute) or at once on send_bookmarks().

Files: fake_apiserver.py (this: HTTP, routing, discovery, the public FakeApiServer, the process),
apiserver_store.py (resource types, objects, resourceVersions, watch history, one watch's
cursor), apiserver_wire.py (Status errors, selectors, patches).

Use as a module (with this directory on sys.path):
    server = FakeApiServer(port=0)            # token=, tls_cert=, tls_key=, client_ca=, ...
    port = server.start()                     # bound port on 127.0.0.1
    ... server.create({...}); server.get("deployments", "default", "x"); ...
    server.stop()
Use as a process (what C++ tests do):
    /usr/bin/python3 tests/fakes/kubernetes/fake_apiserver.py --port 0 [--port-file F]
        [--token T] [--tls-cert C --tls-key K [--client-ca CA]] [--history N]
        [--bookmark-interval S] [--no-flotilla-crd] [--die-with-parent]
  The first line on stdout is `listening on 127.0.0.1:PORT` (or `https://`-less, always that
  form); with --port-file the port is also written to F (atomically: a reader sees the whole
  number or no file). SIGTERM/SIGINT stop it.
Test hooks (module methods; over HTTP as POST to the /fake/ paths, never faulted or authed):
  compact()                      drop all watch history          POST /fake/compact
  break_watches(abrupt=False)    end every open watch stream     POST /fake/break-watches[?abrupt=1]
                                 (abrupt: close the socket without the last chunk)
  send_bookmarks()               a BOOKMARK to every bookmark watch now  POST /fake/bookmarks
  fail_next(n, code=503, match=None)   the next n requests whose "METHOD PATH?QUERY" matches
                                 the regex get a Status with that code  POST /fake/fail?count=&code=&match=
  hang_next(n, seconds, match=None)    ... are held that long, then their connection is closed
                                 unanswered                      POST /fake/hang?count=&seconds=&match=
  release_hangs()                end held requests now           POST /fake/release
  open_watches(), wait_for_watches(n, timeout)                   GET /fake/watches
  requests()                     the last 1000 "METHOD PATH?QUERY" seen  GET /fake/requests
  subscribe(fn, resources=None, replay=False) -> unsubscribe
                                 fn(type, obj, prev) for every change (to those resources, e.g.
                                 ["deployments"]), in resourceVersion order, on a thread of its
                                 own (no lock held: it may call back in); replay first hands it
                                 the current objects as ADDED. The hook the fake kubelet builds on.
  create/get/list/update/update_status/patch/delete/resource_version: the same operations the
  HTTP API does, in process (they raise ApiError where the API answers a Status).
"""

import argparse
import base64
import collections
import copy
import http.server
import json
import os
import re
import select
import signal
import socket
import socketserver
import ssl
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apiserver_store import Store, Watch  # noqa: E402
from apiserver_wire import (ApiError, bad_request, json_patch, merge_patch,  # noqa: E402,F401
                            parse_field_selector, parse_label_selector, status_object,
                            strategic_merge_patch)

# --------------------------------------------------------------------------------------------
# HTTP.


class _Fault:
    def __init__(self, count, code=None, hang=None, match=None):
        self.count, self.code, self.hang = count, code, hang
        self.match = re.compile(match) if match else None


_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
            405: "MethodNotAllowed", 409: "Conflict", 410: "Gone", 415: "UnsupportedMediaType",
            422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "flotilla-fake-apiserver"
    sys_version = ""

    def log_message(self, fmt, *args):
        pass

    @property
    def fake(self):
        return self.server.fake

    # ---- plumbing

    def setup(self):
        super().setup()
        # Headers and body go out in separate writes: without NODELAY, Nagle and the peer's
        # delayed ACK hold each response ~40 ms (Go's server, like the real one, sets it too).
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        with self.fake._conns_lock:
            self.fake._conns.add(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            with self.fake._conns_lock:
                self.fake._conns.discard(self.connection)

    def _read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
            return data
        return self.rfile.read(length) if length else b""

    def _json_body(self):
        raw = self._read_body()
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type in ("application/vnd.kubernetes.protobuf", "application/cbor",
                            "application/yaml"):
            raise ApiError(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format - accepted media "
                           f"types include: application/json (this fake speaks JSON only; got "
                           f"{content_type})")
        if not raw:
            raise bad_request("the body of the request was empty")
        try:
            return json.loads(raw)
        except ValueError as e:
            raise bad_request(f"the body of the request was not valid JSON: {e}")

    def _send(self, code, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        if code == 429:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, err):
        self._send(err.code, err.status())

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method):
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        try:
            if path.startswith("/fake/"):
                return self._hook(method, path, query)
            self.fake._log(f"{method} {self.path}")
            if path not in ("/healthz", "/livez", "/readyz", "/version") and not self._authenticated():
                self._read_body()
                return self._send(401, status_object(401, "Unauthorized", "Unauthorized"))
            fault = self.fake._take_fault(f"{method} {self.path}")
            if fault is not None:
                self._read_body()
                if fault.hang is not None:
                    self.fake._release.wait(fault.hang)
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                reason = _REASONS.get(fault.code, "InternalError")
                return self._send(fault.code, status_object(fault.code, reason,
                                                            f"injected failure ({fault.code})"))
            self._route(method, path, query)
        except ApiError as e:
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except Exception as e:  # a bug in the fake: answer 500 rather than hang the client
            import traceback
            traceback.print_exc()
            self._send(500, status_object(500, "InternalError", f"fake apiserver bug: {e!r}"))

    def _authenticated(self):
        token = self.fake.token
        if token is None:
            return True
        if self.headers.get("Authorization", "") == f"Bearer {token}":
            return True
        if self.fake.client_ca and isinstance(self.connection, ssl.SSLSocket):
            try:
                return bool(self.connection.getpeercert())
            except (ValueError, ssl.SSLError):
                return False
        return False

    # ---- test hooks over HTTP

    def _hook(self, method, path, query):
        self._read_body()
        fake = self.fake
        name = path[len("/fake/"):]
        if method == "GET" and name == "watches":
            return self._send(200, {"open": fake.open_watches()})
        if method == "GET" and name == "requests":
            return self._send(200, {"requests": fake.requests()})
        if method != "POST":
            raise ApiError(405, "MethodNotAllowed", "test hooks take POST")
        if name == "compact":
            return self._send(200, {"compactedTo": str(fake.compact())})
        if name == "break-watches":
            fake.break_watches(abrupt=query.get("abrupt") in ("1", "true"))
        elif name == "bookmarks":
            fake.send_bookmarks()
        elif name == "fail":
            fake.fail_next(int(query.get("count", "1")), int(query.get("code", "503")),
                           query.get("match") or None)
        elif name == "hang":
            fake.hang_next(int(query.get("count", "1")), float(query.get("seconds", "30")),
                           query.get("match") or None)
        elif name == "release":
            fake.release_hangs()
        else:
            raise ApiError(404, "NotFound", f"no test hook {name!r}")
        self._send(200, {"ok": True})

    # ---- the API

    def _route(self, method, path, query):
        parts = [urllib.parse.unquote(p) for p in path.split("/") if p]
        store = self.fake.store
        if method == "GET" and self._discovery(parts):
            return
        if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           {})
        watch_path = False
        if rest and rest[0] == "watch":
            watch_path, rest = True, rest[1:]
        if not rest:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        ns = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            candidate = store.type_for(group, version, rest[2])
            if candidate is not None and candidate.namespaced:
                ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        rt = store.type_for(group, version, rest[0])
        if rt is None or (ns is not None and not rt.namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in rt.subresources():
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if rt.namespaced and ns is None and (name is not None or method not in ("GET",)):
            if name is None:
                raise ApiError(405, "MethodNotAllowed",
                               "the server does not allow this method on the requested resource")
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        dry_run = "dryRun" in query and query["dryRun"] == "All"
        watch = watch_path or query.get("watch", "") in ("1", "true", "True", "t")

        if method == "GET" and name is None:
            lsel = parse_label_selector(query.get("labelSelector", ""))
            fsel = parse_field_selector(query.get("fieldSelector", ""))
            if watch:
                return self._watch(rt, ns, lsel, fsel, query)
            return self._list(rt, ns, lsel, fsel, query)
        if method == "GET" and watch:  # the old single-object watch
            fsel = [("metadata.name", "=", name)]
            return self._watch(rt, ns, [], fsel, query)
        if method == "GET":
            if sub == "scale":
                return self._send(200, store.get_scale(rt, ns, name))
            return self._send(200, store.get(rt, ns, name))
        if method == "POST" and name is None:
            body = self._json_body()
            obj = store.create(rt, ns, body, dry_run)
            return self._send(201, obj)
        if method == "PUT" and name is not None:
            body = self._json_body()
            obj = store.update(rt, ns, name, body, sub, dry_run)
            return self._send(200, obj)
        if method == "PATCH" and name is not None:
            return self._patch(rt, ns, name, sub, dry_run)
        if method == "DELETE" and name is not None and sub is None:
            raw = self._read_body()
            options = {}
            if raw:
                try:
                    options = json.loads(raw)
                except ValueError:
                    raise bad_request("the body of the request was not valid JSON")
            if "propagationPolicy" in query:
                options["propagationPolicy"] = query["propagationPolicy"]
            deleted = store.delete(rt, ns, name, options, dry_run)
            if rt.deleted_object:
                return self._send(200, deleted)
            return self._send(200, {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": rt.group, "kind": rt.plural,
                            "uid": deleted["metadata"]["uid"]}})
        if method == "DELETE" and name is None:
            self._read_body()
            lsel = parse_label_selector(query.get("labelSelector", ""))
            fsel = parse_field_selector(query.get("fieldSelector", ""))
            items = store.delete_collection(rt, ns, lsel, fsel, dry_run)
            return self._send(200, self._list_body(rt, items, str(store.resource_version())))
        self._read_body()
        raise ApiError(405, "MethodNotAllowed",
                       "the server does not allow this method on the requested resource")

    def _list_body(self, rt, items, rv, cont=None):
        if not rt.custom:
            for item in items:
                item.pop("apiVersion", None)
                item.pop("kind", None)
        meta = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta,
                "items": items}

    def _list(self, rt, ns, lsel, fsel, query):
        limit = 0
        if query.get("limit"):
            try:
                limit = max(0, int(query["limit"]))
            except ValueError:
                raise bad_request("limit must be an integer")
        after = None
        if query.get("continue"):
            try:
                after = json.loads(base64.urlsafe_b64decode(query["continue"].encode()))["after"]
            except (ValueError, KeyError, TypeError):
                raise bad_request("invalid continue token")
        items, rv, next_key = self.fake.store.list(rt, ns, lsel, fsel, limit, after)
        cont = None
        if next_key is not None:
            cont = base64.urlsafe_b64encode(json.dumps({"after": next_key}).encode()).decode()
        self._send(200, self._list_body(rt, items, rv, cont))

    def _patch(self, rt, ns, name, sub, dry_run):
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        body = self._json_body()
        if content_type == "application/merge-patch+json":
            def fn(obj):
                if not isinstance(body, dict):
                    raise bad_request("a merge patch must be a JSON object")
                return merge_patch(obj, body)
        elif content_type == "application/strategic-merge-patch+json":
            if rt.custom:
                raise ApiError(415, "UnsupportedMediaType",
                               "the body of the request was in an unknown format - accepted "
                               "media types include: application/json-patch+json, "
                               "application/merge-patch+json, application/apply-patch+yaml")

            def fn(obj):
                if not isinstance(body, dict):
                    raise bad_request("a strategic merge patch must be a JSON object")
                return strategic_merge_patch(obj, body)
        elif content_type == "application/json-patch+json":
            def fn(obj):
                return json_patch(obj, body)
        else:
            raise ApiError(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format - accepted media "
                           f"types include: application/json-patch+json, "
                           f"application/merge-patch+json, "
                           f"application/strategic-merge-patch+json (this fake has no "
                           f"server-side apply; got {content_type!r})")
        store = self.fake.store
        if sub == "scale":
            return self._send(200, store.patch_scale(rt, ns, name, fn, dry_run))
        self._send(200, store.patch(rt, ns, name, fn, sub, dry_run))

    def _watch(self, rt, ns, lsel, fsel, query):
        timeout = None
        if query.get("timeoutSeconds"):
            try:
                timeout = float(query["timeoutSeconds"])
            except ValueError:
                raise bad_request("timeoutSeconds must be a number")
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true", "True")
        send_initial = query.get("sendInitialEvents") in ("1", "true", "True")
        watch = Watch(self.fake.store, rt, ns, lsel, fsel, query.get("resourceVersion"),
                      bookmarks, send_initial, self.fake.bookmark_interval)
        deadline = time.monotonic() + timeout if timeout else None
        end = None
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache, private")
            self.end_headers()
            self.wfile.flush()
            while True:
                events, end = watch.next(deadline)
                for event in events:
                    data = (json.dumps(event) + "\n").encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                if end is not None:
                    break
                if not events and self._peer_closed():
                    end = "abrupt"
                    break
            if end == "done":
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            end = "abrupt"
        finally:
            watch.close()
        if end == "abrupt":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _peer_closed(self):
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            if isinstance(self.connection, ssl.SSLSocket):
                return True  # a watch client sends nothing more; a TLS record here is a close
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # ---- OpenAPI: just enough v3 for kubectl's validation to see fieldValidation support

    def _openapi(self, parts):
        store = self.fake.store
        gvs = sorted({(t.group, t.version) for t in store.types()})

        def gv_path(g, v):
            return f"apis/{g}/{v}" if g else f"api/{v}"

        if parts == ["v3"]:
            return self._send(200, {"paths": {
                gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{gv_path(g, v)}?hash=fake"}
                for g, v in gvs}})
        if len(parts) >= 3 and parts[0] == "v3":
            wanted = "/".join(parts[1:])
            for g, v in gvs:
                if gv_path(g, v) != wanted:
                    continue
                paths = {}
                for t in store.types():
                    if (t.group, t.version) != (g, v):
                        continue
                    ns = "namespaces/{namespace}/" if t.namespaced else ""
                    paths[f"/{gv_path(g, v)}/{ns}{t.plural}/{{name}}"] = {"patch": {
                        "x-kubernetes-group-version-kind": {"group": g, "version": v,
                                                            "kind": t.kind},
                        "parameters": [{"name": "fieldValidation", "in": "query",
                                        "schema": {"type": "string"}}],
                        "responses": {"200": {"description": "OK"}}}}
                return self._send(200, {"openapi": "3.0.0",
                                        "info": {"title": "Kubernetes (fake)", "version": "v1.32.0"},
                                        "paths": paths})
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})

    # ---- discovery

    def _discovery(self, parts):
        store = self.fake.store
        if parts == []:
            return self._send(200, {"paths": ["/api", "/api/v1", "/apis", "/version",
                                              "/healthz", "/livez", "/readyz"]}) or True
        if parts == ["version"]:
            return self._send(200, {
                "major": "1", "minor": "32", "gitVersion": "v1.32.0-flotilla-fake",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
                "platform": "linux/amd64"}) or True
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return self._send(200, b"ok", "text/plain; charset=utf-8") or True
        if parts and parts[0] == "openapi":
            return self._openapi(parts[1:]) or True
        if parts == ["api"]:
            return self._send(200, {
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                "serverAddress": f"127.0.0.1:{self.fake.port}"}]}) or True
        groups = collections.OrderedDict()
        for t in store.types():
            if t.group:
                groups.setdefault(t.group, set()).add(t.version)

        def group_doc(g):
            versions = [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(groups[g])]
            return {"name": g, "versions": versions, "preferredVersion": versions[0]}

        if parts == ["apis"]:
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1",
                                    "groups": [group_doc(g) for g in groups]}) or True
        if len(parts) == 2 and parts[0] == "apis":
            if parts[1] not in groups:
                raise ApiError(404, "NotFound", "the server could not find the requested "
                                                "resource", {})
            doc = group_doc(parts[1])
            doc.update({"kind": "APIGroup", "apiVersion": "v1"})
            return self._send(200, doc) or True
        if parts == ["api", "v1"]:
            group, version = "", "v1"
        elif len(parts) == 3 and parts[0] == "apis":
            group, version = parts[1], parts[2]
        else:
            return False
        types = [t for t in store.types() if t.group == group and t.version == version]
        if not types:
            raise ApiError(404, "NotFound", "the server could not find the requested resource",
                           {})
        resources = []
        for t in types:
            entry = {"name": t.plural, "singularName": t.kind.lower(), "namespaced": t.namespaced,
                     "kind": t.kind, "verbs": ["create", "delete", "deletecollection", "get",
                                               "list", "patch", "update", "watch"]}
            if t.short_names:
                entry["shortNames"] = t.short_names
            if t.categories:
                entry["categories"] = t.categories
            resources.append(entry)
            if t.status:
                resources.append({"name": f"{t.plural}/status", "singularName": "",
                                  "namespaced": t.namespaced, "kind": t.kind,
                                  "verbs": ["get", "patch", "update"]})
            if t.scale is not None:
                resources.append({"name": f"{t.plural}/scale", "singularName": "",
                                  "namespaced": t.namespaced, "group": "autoscaling",
                                  "version": "v1", "kind": "Scale",
                                  "verbs": ["get", "patch", "update"]})
        self._send(200, {"kind": "APIResourceList", "apiVersion": "v1",
                         "groupVersion": f"{group}/{version}" if group else version,
                         "resources": resources})
        return True


class _HttpServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def get_request(self):
        sock, addr = self.socket.accept()
        if self.ssl_context is not None:
            # The handshake happens on the handler's thread (first read), not the accept loop.
            sock = self.ssl_context.wrap_socket(sock, server_side=True,
                                                do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request, client_address):
        pass  # a client that went away mid-request is not an error of the fake


# --------------------------------------------------------------------------------------------
# The public object.


class FakeApiServer:
    """The fake as a module: see the header for the interface."""

    def __init__(self, port=0, host="127.0.0.1", token=None, tls_cert=None, tls_key=None,
                 client_ca=None, history_limit=1000, bookmark_interval=1.0, flotilla_crd=True):
        self.host, self._want_port = host, port
        self.port = None
        self.token = token
        self.tls_cert, self.tls_key, self.client_ca = tls_cert, tls_key, client_ca
        self.bookmark_interval = bookmark_interval
        self.store = Store(history_limit, flotilla_crd)
        self._faults = []
        self._faults_lock = threading.Lock()
        self._release = threading.Event()
        self._requests = collections.deque(maxlen=1000)
        self._conns = set()
        self._conns_lock = threading.Lock()
        self._httpd = None
        self._thread = None

    # ---- lifecycle

    def start(self):
        httpd = _HttpServer((self.host, self._want_port), _Handler, bind_and_activate=True)
        httpd.fake = self
        httpd.ssl_context = None
        if self.tls_cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
            ctx.set_alpn_protocols(["http/1.1"])
            if self.client_ca:
                ctx.load_verify_locations(self.client_ca)
                ctx.verify_mode = ssl.CERT_OPTIONAL
            httpd.ssl_context = ctx
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True, name="fake-apiserver")
        self._thread.start()
        return self.port

    @property
    def url(self):
        return f"{'https' if self.tls_cert else 'http'}://{self.host}:{self.port}"

    def write_kubeconfig(self, path, namespace):
        """A kubeconfig at `path` for this server (plain http only; TLS tests write their own)
        with `namespace` as its context's namespace. Returns the path."""
        with open(path, "w") as f:
            f.write(f"""apiVersion: v1
kind: Config
current-context: test
clusters:
- name: fake
  cluster: {{server: "{self.url}"}}
contexts:
- name: test
  context: {{cluster: fake, namespace: {namespace}}}
""")
        return path

    def stop(self):
        if self._httpd is None:
            return
        self.store.stop()
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=10)
        self._httpd = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # ---- test hooks

    def compact(self):
        return self.store.compact()

    def break_watches(self, abrupt=False):
        store = self.store
        with store.cond:
            if abrupt:
                store.abrupt_epochs.add(store.watch_epoch)
            store.watch_epoch += 1
            store.cond.notify_all()

    def send_bookmarks(self):
        with self.store.cond:
            self.store.bookmark_epoch += 1
            self.store.cond.notify_all()

    def fail_next(self, count, code=503, match=None):
        with self._faults_lock:
            self._faults.append(_Fault(count, code=code, match=match))

    def hang_next(self, count, seconds, match=None):
        self._release.clear()
        with self._faults_lock:
            self._faults.append(_Fault(count, hang=seconds, match=match))

    def release_hangs(self):
        self._release.set()

    def _take_fault(self, request_line):
        with self._faults_lock:
            for fault in self._faults:
                if fault.count > 0 and (fault.match is None or fault.match.search(request_line)):
                    fault.count -= 1
                    return fault
            self._faults = [f for f in self._faults if f.count > 0]
        return None

    def open_watches(self):
        with self.store.cond:
            return self.store.open_watches

    def wait_for_watches(self, count, timeout=10.0):
        """True once at least count watch streams are open."""
        end = time.monotonic() + timeout
        with self.store.cond:
            while self.store.open_watches < count:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.store.cond.wait(left)
            return True

    def _log(self, line):
        self._requests.append(line)

    def requests(self):
        return list(self._requests)

    def subscribe(self, fn, resources=None, replay=False):
        """See Store.subscribe; resources: names such as "deployments" or "leases.coordination.k8s.io"."""
        keys = None
        if resources is not None:
            keys = {self.store.find_type(r).storage_key for r in resources}
        return self.store.subscribe(fn, keys, replay)

    # ---- objects, in process

    def _type_of(self, obj):
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        group, _, version = api_version.rpartition("/")
        for t in self.store.types():
            if t.group == group and t.version == version and t.kind == kind:
                return t
        raise ApiError(404, "NotFound", f"no resource type for {api_version} {kind}")

    def resource_version(self):
        return str(self.store.resource_version())

    def create(self, obj):
        t = self._type_of(obj)
        return self.store.create(t, obj.get("metadata", {}).get("namespace", "default")
                                 if t.namespaced else None, copy.deepcopy(obj))

    def get(self, resource, namespace, name):
        """The object, or None where it does not exist."""
        t = self.store.find_type(resource)
        try:
            return self.store.get(t, namespace if t.namespaced else None, name)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    def list(self, resource, namespace=None, label_selector=""):
        t = self.store.find_type(resource)
        items, _, _ = self.store.list(t, namespace, parse_label_selector(label_selector))
        return items

    def update(self, obj, subresource=None):
        t = self._type_of(obj)
        meta = obj["metadata"]
        return self.store.update(t, meta.get("namespace", "default") if t.namespaced else None,
                                 meta["name"], copy.deepcopy(obj), subresource)

    def update_status(self, resource, namespace, name, status):
        """Sets status through the status subresource, whatever the resourceVersion."""
        t = self.store.find_type(resource)

        def fn(obj):
            obj["status"] = copy.deepcopy(status)
            return obj
        return self.store.patch(t, namespace if t.namespaced else None, name, fn, "status")

    def patch(self, resource, namespace, name, patch, patch_type="merge", subresource=None):
        t = self.store.find_type(resource)
        apply = {"merge": merge_patch, "strategic": strategic_merge_patch,
                 "json": json_patch}[patch_type]
        return self.store.patch(t, namespace if t.namespaced else None, name,
                                lambda obj: apply(obj, patch), subresource)

    def delete(self, resource, namespace, name, propagation=None):
        t = self.store.find_type(resource)
        return self.store.delete(t, namespace if t.namespaced else None, name,
                                 {"propagationPolicy": propagation} if propagation else None)


# --------------------------------------------------------------------------------------------
# The process.


def main(argv=None):
    parser = argparse.ArgumentParser(description="A FAKE Kubernetes API server for tests.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", help="write the bound port here (atomically)")
    parser.add_argument("--token", help="require Authorization: Bearer TOKEN")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--client-ca", help="with TLS: accept client certificates signed by it")
    parser.add_argument("--history", type=int, default=1000, help="watch events kept")
    parser.add_argument("--bookmark-interval", type=float, default=1.0)
    parser.add_argument("--no-flotilla-crd", action="store_true",
                        help="do not serve servingendpoints.flotilla.dev from the start")
    parser.add_argument("--die-with-parent", action="store_true",
                        help="exit when the parent process dies (Linux prctl)")
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.die_with_parent:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    server = FakeApiServer(port=args.port, token=args.token, tls_cert=args.tls_cert,
                           tls_key=args.tls_key, client_ca=args.client_ca,
                           history_limit=args.history, bookmark_interval=args.bookmark_interval,
                           flotilla_crd=not args.no_flotilla_crd)
    port = server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.port_file:
        tmp = f"{args.port_file}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    while not stop.wait(1.0):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
