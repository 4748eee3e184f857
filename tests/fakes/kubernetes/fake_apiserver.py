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
{name, group, kind: plural, uid} (pods and CRDs answer the deleted object, as their graceful /
finalized deletion does on the real server).

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

Use as a module:
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
  subscribe(fn) -> unsubscribe   fn(type, obj, prev) for every change, in resourceVersion order,
                                 on a thread of its own (no lock held: it may call back in);
                                 this is the hook the fake kubelet builds on.
  create/get/list/update/update_status/patch/delete/resource_version: the same operations the
  HTTP API does, in process (they raise ApiError where the API answers a Status).
"""

import argparse
import base64
import collections
import copy
import datetime
import http.server
import json
import os
import queue
import random
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
import uuid

# --------------------------------------------------------------------------------------------
# Errors: every failure the API reports is a metav1.Status.


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self):
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code, reason, message, details=None):
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        status["details"] = details
    return status


def bad_request(message):
    return ApiError(400, "BadRequest", message)


# --------------------------------------------------------------------------------------------
# Resource types.


class ResourceType:
    def __init__(self, group, version, plural, kind, namespaced=True, status=False, scale=None,
                 short_names=(), generation=False, custom=False, categories=(), deleted_object=False):
        self.group = group
        self.version = version
        self.plural = plural
        self.kind = kind
        self.namespaced = namespaced
        self.status = status
        # scale: {"spec": path, "status": path, "selector": path or None (None: spec.selector)}.
        self.scale = scale
        self.short_names = list(short_names)
        self.generation = generation or custom
        self.custom = custom
        self.categories = list(categories)
        # What DELETE answers: the object (pods, CRDs) or a Status Success.
        self.deleted_object = deleted_object

    @property
    def api_version(self):
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self):
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def storage_key(self):
        return (self.group, self.plural)

    def subresources(self):
        subs = []
        if self.status:
            subs.append("status")
        if self.scale is not None:
            subs.append("scale")
        return subs


_DEPLOYMENT_SCALE = {"spec": ["spec", "replicas"], "status": ["status", "replicas"], "selector": None}


def _builtin_types():
    T = ResourceType
    return [
        T("", "v1", "namespaces", "Namespace", namespaced=False, status=True, short_names=["ns"]),
        T("", "v1", "pods", "Pod", status=True, short_names=["po"], categories=["all"],
          deleted_object=True),
        T("", "v1", "services", "Service", status=True, short_names=["svc"], categories=["all"]),
        T("", "v1", "secrets", "Secret"),
        T("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
        T("", "v1", "events", "Event", short_names=["ev"]),
        T("", "v1", "endpoints", "Endpoints", short_names=["ep"]),
        T("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"]),
        T("apps", "v1", "deployments", "Deployment", status=True, scale=_DEPLOYMENT_SCALE,
          short_names=["deploy"], generation=True, categories=["all"]),
        T("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
        T("coordination.k8s.io", "v1", "leases", "Lease"),
        T("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
          namespaced=False, status=True, short_names=["crd", "crds"], generation=True,
          deleted_object=True),
        T("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", status=True,
          short_names=["pdb"], generation=True),
        T("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=["netpol"],
          generation=True),
        T("rbac.authorization.k8s.io", "v1", "roles", "Role"),
        T("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
        T("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
        T("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
          namespaced=False),
    ]


# The CRD the fake serves from the start (deploy/kubernetes carries the real one, with its schema;
# applying it over this one is an ordinary update).
FLOTILLA_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servingendpoints.flotilla.dev"},
    "spec": {
        "group": "flotilla.dev",
        "names": {"plural": "servingendpoints", "singular": "servingendpoint",
                  "kind": "ServingEndpoint", "listKind": "ServingEndpointList",
                  "shortNames": ["se"]},
        "scope": "Namespaced",
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object",
                                           "x-kubernetes-preserve-unknown-fields": True}},
            "subresources": {"status": {}},
        }],
    },
}


def _crd_types(crd):
    """The ResourceType a CRD object serves (its storage version), or an ApiError."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group")
    plural = names.get("plural")
    kind = names.get("kind")
    versions = spec.get("versions") or []
    if not group or not plural or not kind or not versions:
        raise ApiError(422, "Invalid", "CustomResourceDefinition.apiextensions.k8s.io "
                       f"\"{crd['metadata'].get('name', '')}\" is invalid: spec: group, "
                       "names.plural, names.kind and versions are required")
    if crd["metadata"].get("name") != f"{plural}.{group}":
        raise ApiError(422, "Invalid", "CustomResourceDefinition.apiextensions.k8s.io "
                       f"\"{crd['metadata'].get('name', '')}\" is invalid: metadata.name: "
                       f"Invalid value: must be spec.names.plural+\".\"+spec.group")
    storage = next((v for v in versions if v.get("storage")), versions[0])
    subs = storage.get("subresources") or spec.get("subresources") or {}
    scale = None
    if "scale" in subs:
        s = subs["scale"] or {}
        scale = {
            "spec": _json_path(s.get("specReplicasPath", ".spec.replicas")),
            "status": _json_path(s.get("statusReplicasPath", ".status.replicas")),
            "selector": _json_path(s["labelSelectorPath"]) if s.get("labelSelectorPath") else [],
        }
    return ResourceType(group, storage.get("name", "v1"), plural, kind,
                        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                        status="status" in subs, scale=scale,
                        short_names=names.get("shortNames") or [], custom=True,
                        categories=names.get("categories") or [])


def _json_path(path):
    return [p for p in path.lstrip(".").split(".") if p]


def _dig(obj, path):
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            return None
        obj = obj[p]
    return obj


def _set_path(obj, path, value):
    for p in path[:-1]:
        obj = obj.setdefault(p, {})
    obj[path[-1]] = value


# --------------------------------------------------------------------------------------------
# Selectors.

_LABEL_KEY = re.compile(r"^([a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?/)?[a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?$")


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _split_top(text):
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text):
    """A list of (key, op, values) requirements; raises ApiError 400 on a bad selector."""
    reqs = []
    if not text:
        return reqs
    for part in _split_top(text):
        m = re.match(r"^(\S+)\s+(in|notin)\s*\((.*)\)$", part)
        if m:
            values = [v.strip() for v in m.group(3).split(",") if v.strip()]
            reqs.append((m.group(1), m.group(2), values))
        elif part.startswith("!"):
            reqs.append((part[1:].strip(), "!", []))
        else:
            m = re.match(r"^([^=!<>\s]+)\s*(==|=|!=|>|<)\s*(\S*)$", part)
            if m:
                reqs.append((m.group(1), m.group(2).replace("==", "="), [m.group(3)]))
            elif re.match(r"^[^=!<>\s()]+$", part):
                reqs.append((part, "exists", []))
            else:
                raise bad_request(f"unable to parse requirement: {part!r}")
    for key, op, values in reqs:
        if not _LABEL_KEY.match(key):
            raise bad_request(f"unable to parse requirement: invalid label key \"{key}\"")
        for value in values:
            if op not in (">", "<") and not _LABEL_VALUE.match(value):
                raise bad_request(f"unable to parse requirement: invalid label value: "
                                  f"\"{value}\"")
        if op in (">", "<"):
            try:
                int(values[0])
            except ValueError:
                raise bad_request("unable to parse requirement: for 'gt', 'lt' operators, "
                                  "the value must be an integer")
    return reqs


def label_selector_matches(reqs, labels):
    labels = labels or {}
    for key, op, values in reqs:
        has = key in labels
        val = labels.get(key)
        if op == "=" and not (has and val == values[0]):
            return False
        if op == "!=" and has and val == values[0]:
            return False
        if op == "in" and not (has and val in values):
            return False
        if op == "notin" and has and val in values:
            return False
        if op == "exists" and not has:
            return False
        if op == "!" and has:
            return False
        if op in (">", "<"):
            try:
                n = int(val)
            except (TypeError, ValueError):
                return False
            if (op == ">" and not n > int(values[0])) or (op == "<" and not n < int(values[0])):
                return False
    return True


def parse_field_selector(text):
    reqs = []
    if not text:
        return reqs
    for part in _split_top(text):
        m = re.match(r"^([^=!\s]+)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid field selector: {part!r}")
        field, op, value = m.group(1), m.group(2).replace("==", "="), m.group(3)
        if field not in ("metadata.name", "metadata.namespace"):
            raise bad_request(f"field label not supported: {field}")
        reqs.append((field, op, value))
    return reqs


def field_selector_matches(reqs, obj):
    meta = obj.get("metadata", {})
    for field, op, value in reqs:
        actual = meta.get(field.split(".", 1)[1], "")
        if (op == "=") != (actual == value):
            return False
    return True


def selector_string(selector):
    """A metav1.LabelSelector as the string form the scale subresource reports."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, vals = expr.get("key"), expr.get("operator"), sorted(expr.get("values") or [])
        if op == "In":
            parts.append(f"{key} in ({','.join(vals)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(vals)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


# --------------------------------------------------------------------------------------------
# Patches.


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "imagePullSecrets": "name",
    "conditions": "type", "ownerReferences": "uid", "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey", "volumeDevices": "devicePath",
}


def _list_merge_key(field, items):
    if field == "ports":
        return "containerPort" if any("containerPort" in i for i in items) else "port"
    return _MERGE_KEYS.get(field)


def strategic_merge_patch(target, patch):
    """Merge patch plus list merge keys and the $-directives kubectl sends (see the header)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return strategic_merge_patch({}, {k: v for k, v in patch.items() if k != "$patch"})
    if directive == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and all(isinstance(i, dict) for i in value) and \
                _list_merge_key(key, value + (result.get(key) or [])) and \
                isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, _list_merge_key(key, value + result[key]))
        else:
            result[key] = _strip_directives(value)
    if "$retainKeys" in patch:
        keep = set(patch["$retainKeys"])
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _merge_list(current, patch_items, merge_key):
    if any(i.get("$patch") == "replace" for i in patch_items):
        return [_strip_directives(i) for i in patch_items if i.get("$patch") != "replace"]
    result = copy.deepcopy(current)
    for item in patch_items:
        key = item.get(merge_key)
        index = next((n for n, e in enumerate(result)
                      if isinstance(e, dict) and e.get(merge_key) == key), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(strategic_merge_patch({}, item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _strip_directives(value):
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return copy.deepcopy(value)


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"json patch: invalid path {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc, tokens, path):
    for t in tokens:
        if isinstance(doc, dict) and t in doc:
            doc = doc[t]
        elif isinstance(doc, list) and t.isdigit() and int(t) < len(doc):
            doc = doc[int(t)]
        else:
            raise ApiError(422, "Invalid", f"json patch: doc is missing path: \"{path}\"")
    return doc


def json_patch(doc, ops):
    """RFC 6902 JSON patch."""
    if not isinstance(ops, list):
        raise bad_request("json patch: the patch is not a list of operations")
    doc = copy.deepcopy(doc)

    def get(path):
        tokens = _pointer(path)
        return _container(doc, tokens, path) if tokens else doc

    def remove(path):
        tokens = _pointer(path)
        parent = _container(doc, tokens[:-1], path)
        last = tokens[-1]
        if isinstance(parent, dict) and last in parent:
            return parent.pop(last)
        if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
            return parent.pop(int(last))
        raise ApiError(422, "Invalid", f"json patch: unable to remove nonexistent key: {path}")

    def add(path, value, replace=False):
        nonlocal doc
        tokens = _pointer(path)
        if not tokens:
            doc = value
            return
        parent = _container(doc, tokens[:-1], path)
        last = tokens[-1]
        if isinstance(parent, dict):
            if replace and last not in parent:
                raise ApiError(422, "Invalid",
                               f"json patch: replace operation does not apply: doc is missing "
                               f"key: {path}")
            parent[last] = value
        elif isinstance(parent, list):
            if last == "-" and not replace:
                parent.append(value)
            elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
                if replace:
                    parent[int(last)] = value
                else:
                    parent.insert(int(last), value)
            else:
                raise ApiError(422, "Invalid", f"json patch: index out of range: {path}")
        else:
            raise ApiError(422, "Invalid", f"json patch: doc is missing path: \"{path}\"")

    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request("json patch: an operation needs op and path")
        kind, path = op["op"], op["path"]
        if kind == "add":
            add(path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            remove(path)
        elif kind == "replace":
            add(path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "move":
            add(path, remove(op["from"]))
        elif kind == "copy":
            add(path, copy.deepcopy(get(op["from"])))
        elif kind == "test":
            if get(path) != op.get("value"):
                raise ApiError(422, "Invalid", f"json patch: testing value {path} failed")
        else:
            raise bad_request(f"json patch: unknown operation {kind!r}")
    return doc


# --------------------------------------------------------------------------------------------
# The store: objects, the global resourceVersion, the watch history.

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Event:
    __slots__ = ("rv", "key", "type", "obj", "prev")

    def __init__(self, rv, key, type_, obj, prev):
        self.rv, self.key, self.type, self.obj, self.prev = rv, key, type_, obj, prev


class Store:
    def __init__(self, history_limit=1000, flotilla_crd=True):
        self.cond = threading.Condition(threading.RLock())  # list() runs inside other locked steps
        self._rv = 1
        self._history = collections.deque()
        self._history_limit = history_limit
        self._compacted_rv = 0  # events up to this resourceVersion are gone
        self._types = {}        # (group, version, plural) -> ResourceType
        self._objects = collections.defaultdict(dict)  # storage_key -> {(ns, name): obj}
        self.watch_epoch = 0
        self.abrupt_epochs = set()
        self.bookmark_epoch = 0
        self.stopped = False
        self.open_watches = 0
        self._subscribers = []
        for t in _builtin_types():
            self._types[(t.group, t.version, t.plural)] = t
        if flotilla_crd:
            self.create(self.type_for("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
                        None, copy.deepcopy(FLOTILLA_CRD))

    # ---- types

    def type_for(self, group, version, plural):
        with self.cond:
            return self._types.get((group, version, plural))

    def types(self):
        with self.cond:
            return list(self._types.values())

    def find_type(self, resource):
        """'deployments' or 'deployments.apps' -> ResourceType."""
        plural, _, group = resource.partition(".")
        with self.cond:
            found = [t for t in self._types.values()
                     if t.plural == plural and (not group or t.group == group)]
        if len(found) != 1:
            raise ApiError(404, "NotFound", f"the server doesn't have a resource type "
                                            f"\"{resource}\"")
        return found[0]

    # ---- reads

    def resource_version(self):
        with self.cond:
            return self._rv

    def get(self, rt, ns, name):
        with self.cond:
            return copy.deepcopy(self._get_locked(rt, ns, name))

    def _get_locked(self, rt, ns, name):
        obj = self._objects[rt.storage_key].get((ns or "", name))
        if obj is None:
            raise ApiError(404, "NotFound", f"{rt.qualified} \"{name}\" not found",
                           {"name": name, "group": rt.group, "kind": rt.plural})
        return obj

    def list(self, rt, ns, lsel=(), fsel=(), limit=0, after=None):
        """(items sorted by namespace/name, list resourceVersion, next key or None)."""
        with self.cond:
            items = []
            for (ons, oname), obj in sorted(self._objects[rt.storage_key].items()):
                if ns and ons != ns:
                    continue
                if after is not None and (ons, oname) <= tuple(after):
                    continue
                if not label_selector_matches(lsel, obj["metadata"].get("labels")):
                    continue
                if not field_selector_matches(fsel, obj):
                    continue
                if limit and len(items) == limit:
                    return items, str(self._rv), [items[-1]["metadata"].get("namespace", ""),
                                                  items[-1]["metadata"]["name"]]
                items.append(copy.deepcopy(obj))
            return items, str(self._rv), None

    # ---- writes

    def _commit(self, rt, type_, obj, prev):
        """Stores (or removes) obj under a new resourceVersion and records the event."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if type_ == "DELETED":
            self._objects[rt.storage_key].pop(key, None)
        else:
            self._objects[rt.storage_key][key] = obj
        event = _Event(self._rv, rt.storage_key, type_, obj, prev)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self._compacted_rv = self._history.popleft().rv
        for q in self._subscribers:
            q.put(event)
        self.cond.notify_all()
        return obj

    def _check_namespace(self, rt, ns, body):
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request("the namespace of the provided object does not match the "
                                  "namespace sent on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if (api_version and api_version != rt.api_version) or (kind and kind != rt.kind):
            raise bad_request(f"the API version in the data ({api_version}) and kind ({kind}) do "
                              f"not match the expected {rt.api_version} {rt.kind}")
        body["apiVersion"], body["kind"] = rt.api_version, rt.kind

    def _invalid(self, rt, name, field, message, reason="FieldValueInvalid"):
        group = f".{rt.group}" if rt.group else ""
        return ApiError(422, "Invalid", f"{rt.kind}{group} \"{name}\" is invalid: {field}: "
                                        f"{message}",
                        {"name": name, "group": rt.group, "kind": rt.kind,
                         "causes": [{"reason": reason, "message": message, "field": field}]})

    def create(self, rt, ns, body, dry_run=False):
        if not isinstance(body, dict):
            raise bad_request("the body of the request was not a JSON object")
        with self.cond:
            self._check_namespace(rt, ns, body)
            meta = body["metadata"]
            if not meta.get("name"):
                if meta.get("generateName"):
                    for _ in range(16):
                        name = meta["generateName"] + "".join(
                            random.choice(_GENERATE_CHARS) for _ in range(5))
                        if (ns or "", name) not in self._objects[rt.storage_key]:
                            break
                    meta["name"] = name
                else:
                    raise self._invalid(rt, "", "metadata.name",
                                        "Required value: name or generateName is required",
                                        "FieldValueRequired")
            name = meta["name"]
            if not isinstance(name, str) or len(name) > 253 or not _NAME.match(name):
                raise self._invalid(rt, str(name), "metadata.name",
                                    f"Invalid value: \"{name}\": a lowercase RFC 1123 subdomain "
                                    "must consist of lower case alphanumeric characters, '-' or "
                                    "'.', and must start and end with an alphanumeric character")
            if (ns or "", name) in self._objects[rt.storage_key]:
                raise ApiError(409, "AlreadyExists", f"{rt.qualified} \"{name}\" already exists",
                               {"name": name, "group": rt.group, "kind": rt.plural})
            if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                served = _crd_types(body)
                body["status"] = self._crd_status(body)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "managedFields", "selfLink"):
                meta.pop(k, None)
            if rt.generation:
                meta["generation"] = 1
            if rt.status and rt.storage_key != ("apiextensions.k8s.io", "customresourcedefinitions"):
                if rt.custom:
                    body.pop("status", None)
                else:
                    body["status"] = {}
            if rt.storage_key == ("apps", "deployments"):
                _default_deployment(body)
            if dry_run:
                return copy.deepcopy(body)
            if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                self._serve_crd(served)
            return copy.deepcopy(self._commit(rt, "ADDED", body, None))

    def _crd_status(self, crd):
        now = _now()
        return {
            "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
                              or [crd["spec"]["versions"][0]["name"]],
        }

    def _serve_crd(self, served):
        for key, t in list(self._types.items()):
            if t.custom and t.storage_key == served.storage_key:
                del self._types[key]
        self._types[(served.group, served.version, served.plural)] = served

    def update(self, rt, ns, name, body, subresource=None, dry_run=False):
        if not isinstance(body, dict):
            raise bad_request("the body of the request was not a JSON object")
        with self.cond:
            old = self._get_locked(rt, ns, name)
            if subresource == "scale":
                return self._write_scale(rt, old, body, dry_run)
            self._check_namespace(rt, ns, body)
            if body["metadata"].get("name", name) != name:
                raise bad_request(f"the name of the object ({body['metadata']['name']}) does not "
                                  f"match the name on the URL ({name})")
            rv = body["metadata"].get("resourceVersion")
            if not rv and rt.custom:  # custom resources allow no unconditional update
                raise self._invalid(rt, name, "metadata.resourceVersion",
                                    "Invalid value: 0x0: must be specified for an update")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise self._conflict(rt, name)
            return self._replace(rt, old, body, subresource, dry_run)

    def _conflict(self, rt, name):
        return ApiError(409, "Conflict", f"Operation cannot be fulfilled on {rt.qualified} "
                                         f"\"{name}\": the object has been modified; please "
                                         "apply your changes to the latest version and try again",
                        {"name": name, "group": rt.group, "kind": rt.plural})

    def _replace(self, rt, old, new, subresource, dry_run):
        """Writes new over old with the rules of the main resource or the status subresource."""
        if subresource == "status":
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = copy.deepcopy(new["status"])
            else:
                result.pop("status", None)
        else:
            result = copy.deepcopy(new)
            meta = result.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "name", "namespace"):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
            meta.pop("managedFields", None)
            if rt.status and rt.storage_key != ("apiextensions.k8s.io", "customresourcedefinitions"):
                if "status" in old:
                    result["status"] = copy.deepcopy(old["status"])
                else:
                    result.pop("status", None)
            if rt.storage_key == ("apps", "deployments"):
                _default_deployment(result)
            if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                served = _crd_types(result)
                if (served.group, served.plural) != (_crd_types(old).group, _crd_types(old).plural):
                    raise self._invalid(rt, old["metadata"]["name"], "spec.group",
                                        "Invalid value: field is immutable")
                result["status"] = self._crd_status(result)
            if rt.generation:
                meta["generation"] = old["metadata"].get("generation", 1)
                if _spec_part(rt, result) != _spec_part(rt, old):
                    meta["generation"] += 1
        result["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if result == old:
            return copy.deepcopy(old)  # the real server skips writes that change nothing
        if dry_run:
            return result
        if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._serve_crd(_crd_types(result))
        return copy.deepcopy(self._commit(rt, "MODIFIED", result, copy.deepcopy(old)))

    # ---- scale subresource

    def scale_of(self, rt, obj):
        replicas = _dig(obj, rt.scale["spec"])
        if rt.scale["selector"] is None:
            selector = selector_string((obj.get("spec") or {}).get("selector"))
        else:
            selector = _dig(obj, rt.scale["selector"]) if rt.scale["selector"] else None
        meta = obj["metadata"]
        scale = {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                              "creationTimestamp") if k in meta},
            "spec": {"replicas": replicas} if replicas is not None else {},
            "status": {"replicas": _dig(obj, rt.scale["status"]) or 0},
        }
        if selector:
            scale["status"]["selector"] = selector
        return scale

    def get_scale(self, rt, ns, name):
        with self.cond:
            return self.scale_of(rt, copy.deepcopy(self._get_locked(rt, ns, name)))

    def _write_scale(self, rt, old, scale, dry_run):
        name = old["metadata"]["name"]
        if scale.get("kind", "Scale") != "Scale":
            raise bad_request(f"the kind in the data ({scale.get('kind')}) is not Scale")
        if (scale.get("metadata") or {}).get("name", name) != name:
            raise bad_request("the name of the object does not match the name on the URL")
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise self._conflict(rt, name)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(422, "Invalid", f"Scale.autoscaling \"{name}\" is invalid: "
                                           "spec.replicas: Invalid value: must be greater than "
                                           "or equal to 0",
                           {"name": name, "group": "autoscaling", "kind": "Scale"})
        new = copy.deepcopy(old)
        _set_path(new, rt.scale["spec"], replicas)
        return self.scale_of(rt, self._replace(rt, old, new, None, dry_run))

    def patch_scale(self, rt, ns, name, patch_fn, dry_run=False):
        with self.cond:
            old = self._get_locked(rt, ns, name)
            return self._write_scale(rt, old, patch_fn(self.scale_of(rt, copy.deepcopy(old))),
                                     dry_run)

    def patch(self, rt, ns, name, patch_fn, subresource=None, dry_run=False):
        with self.cond:
            old = self._get_locked(rt, ns, name)
            new = patch_fn(copy.deepcopy(old))
            if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
                raise ApiError(422, "Invalid", f"{rt.qualified} \"{name}\": the patch made the "
                                               "object invalid")
            self._check_namespace(rt, ns, new)
            if new["metadata"].get("name") != name:
                raise bad_request("the name of the object does not match the name on the URL")
            rv = new["metadata"].get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise self._conflict(rt, name)
            return self._replace(rt, old, new, subresource, dry_run)

    # ---- deletes

    def delete(self, rt, ns, name, options=None, dry_run=False):
        options = options or {}
        with self.cond:
            old = self._get_locked(rt, ns, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on "
                                                f"{rt.qualified} \"{name}\": Precondition failed: "
                                                f"UID in precondition: {pre['uid']}, UID in object "
                                                f"meta: {old['metadata']['uid']}",
                               {"name": name, "group": rt.group, "kind": rt.plural})
            if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on "
                                                f"{rt.qualified} \"{name}\": Precondition failed: "
                                                f"ResourceVersion in precondition: "
                                                f"{pre['resourceVersion']}, ResourceVersion in "
                                                f"object meta: {old['metadata']['resourceVersion']}",
                               {"name": name, "group": rt.group, "kind": rt.plural})
            if dry_run:
                return copy.deepcopy(old)
            orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents")
            return copy.deepcopy(self._delete_locked(rt, old, orphan))

    def _delete_locked(self, rt, obj, orphan=False):
        deleted = self._commit(rt, "DELETED", copy.deepcopy(obj), copy.deepcopy(obj))
        uid = obj["metadata"]["uid"]
        if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            served = _crd_types(obj)
            for key, t in list(self._types.items()):
                if t.custom and t.storage_key == served.storage_key:
                    del self._types[key]
                    for dependent in list(self._objects[t.storage_key].values()):
                        self._delete_locked(t, dependent)
        if rt.storage_key == ("", "namespaces"):
            for t in list(self._types.values()):
                if t.namespaced:
                    for (ons, _), o in list(self._objects[t.storage_key].items()):
                        if ons == obj["metadata"]["name"]:
                            self._delete_locked(t, o)
        # Garbage collection, at once: dependents whose every owner is gone are deleted, those
        # with another live owner (or with Orphan) lose the reference.
        live = {o["metadata"]["uid"] for objs in self._objects.values() for o in objs.values()}
        for t in list(self._types.values()):
            for dependent in list(self._objects[t.storage_key].values()):
                refs = dependent["metadata"].get("ownerReferences") or []
                if not any(r.get("uid") == uid for r in refs):
                    continue
                if dependent["metadata"]["uid"] not in live:
                    continue  # already deleted by an earlier step of this cascade
                remaining = [r for r in refs if r.get("uid") != uid]
                if orphan or any(r.get("uid") in live for r in remaining):
                    new = copy.deepcopy(dependent)
                    if remaining:
                        new["metadata"]["ownerReferences"] = remaining
                    else:
                        new["metadata"].pop("ownerReferences", None)
                    self._commit(t, "MODIFIED", new, copy.deepcopy(dependent))
                else:
                    self._delete_locked(t, dependent)
                    live.discard(dependent["metadata"]["uid"])
        return deleted

    def delete_collection(self, rt, ns, lsel, fsel, dry_run=False):
        with self.cond:
            items, _, _ = self.list(rt, ns, lsel, fsel)
            if dry_run:
                return items
            out = []
            for item in items:
                key = (item["metadata"].get("namespace", ""), item["metadata"]["name"])
                current = self._objects[rt.storage_key].get(key)
                if current is not None:
                    out.append(copy.deepcopy(self._delete_locked(rt, current)))
            return out

    # ---- history and watches

    def compact(self):
        with self.cond:
            self._history.clear()
            self._compacted_rv = self._rv
            self.cond.notify_all()
            return self._rv

    def subscribe(self, fn):
        q = queue.Queue()

        def run():
            while True:
                event = q.get()
                if event is None:
                    return
                try:
                    fn(event.type, copy.deepcopy(event.obj), copy.deepcopy(event.prev))
                except Exception as e:  # a broken subscriber must not kill the dispatcher
                    print(f"fake_apiserver: subscriber raised {e!r}", file=sys.stderr)

        thread = threading.Thread(target=run, daemon=True, name="fake-apiserver-subscriber")
        with self.cond:
            self._subscribers.append(q)
        thread.start()

        def unsubscribe():
            with self.cond:
                if q in self._subscribers:
                    self._subscribers.remove(q)
            q.put(None)
            if threading.current_thread() is not thread:
                thread.join(timeout=10)

        return unsubscribe

    def stop(self):
        with self.cond:
            self.stopped = True
            for q in self._subscribers:
                q.put(None)
            self._subscribers.clear()
            self.cond.notify_all()


def _spec_part(rt, obj):
    if rt.custom:
        skip = ("metadata", "status") if rt.status else ("metadata",)
        return {k: v for k, v in obj.items() if k not in skip + ("apiVersion", "kind")}
    return obj.get("spec")


def _default_deployment(obj):
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        strategy["type"] = "RollingUpdate"
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", "25%")
        rolling.setdefault("maxSurge", "25%")


class Watch:
    """One watch stream's position in the history and its filter."""

    def __init__(self, store, rt, ns, lsel, fsel, rv_param, bookmarks, send_initial,
                 bookmark_interval):
        self.store, self.rt, self.ns, self.lsel, self.fsel = store, rt, ns, lsel, fsel
        self.bookmarks = bookmarks
        self.bookmark_interval = bookmark_interval
        self.next_bookmark = time.monotonic() + bookmark_interval
        self.pending = []
        self.done = False
        with store.cond:
            self.epoch = store.watch_epoch
            self.bookmark_epoch = store.bookmark_epoch
            if rv_param in (None, "", "0") or send_initial:
                items, _, _ = store.list(rt, ns, lsel, fsel)
                self.pending = [self._event("ADDED", o) for o in items]
                self.cursor = store._rv
                if send_initial and bookmarks:
                    self.pending.append(self._bookmark(initial_end=True))
            else:
                try:
                    self.cursor = int(rv_param)
                except ValueError:
                    raise bad_request(f"invalid resource version: {rv_param!r}")
                if self.cursor < store._compacted_rv:
                    self._expire()
            store.open_watches += 1

    def close(self):
        with self.store.cond:
            self.store.open_watches -= 1
            self.store.cond.notify_all()

    def _event(self, type_, obj):
        obj = copy.deepcopy(obj)
        return {"type": type_, "object": obj}

    def _bookmark(self, initial_end=False):
        meta = {"resourceVersion": str(self.cursor)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"kind": self.rt.kind,
                                               "apiVersion": self.rt.api_version,
                                               "metadata": meta}}

    def _expire(self):
        oldest = self.store._compacted_rv + 1
        self.pending.append({"type": "ERROR", "object": status_object(
            410, "Expired", f"too old resource version: {self.cursor} ({oldest})")})
        self.done = True

    def _matches(self, obj):
        if obj is None:
            return False
        if self.ns and obj["metadata"].get("namespace") != self.ns:
            return False
        return label_selector_matches(self.lsel, obj["metadata"].get("labels")) and \
            field_selector_matches(self.fsel, obj)

    def _convert(self, e):
        if e.key != self.rt.storage_key:
            return None
        cur = e.type != "DELETED" and self._matches(e.obj)
        old = self._matches(e.prev)
        if cur and not old:
            return self._event("ADDED", e.obj)
        if cur and old:
            return self._event("MODIFIED", e.obj)
        if old:  # deleted, or stopped matching: the previous content at the event's version
            obj = copy.deepcopy(e.prev)
            obj["metadata"]["resourceVersion"] = str(e.rv)
            return self._event("DELETED", obj)
        return None

    def next(self, deadline, wait=0.5):
        """(events, end) where end is None, "done" (clean end) or "abrupt"."""
        if self.pending:
            out, self.pending = self.pending, []
            return out, "done" if self.done else None
        if self.done:
            return [], "done"
        store = self.store
        with store.cond:
            if store.stopped:
                return [], "abrupt"
            if store.watch_epoch != self.epoch:
                return [], "abrupt" if self.epoch in store.abrupt_epochs else "done"
            if self.cursor < store._compacted_rv:
                self._expire()
                out, self.pending = self.pending, []
                return out, "done"
            fresh = []
            for e in reversed(store._history):
                if e.rv <= self.cursor:
                    break
                fresh.append(e)
            out = []
            for e in reversed(fresh):
                converted = self._convert(e)
                if converted is not None:
                    out.append(converted)
            self.cursor = store._rv
            now = time.monotonic()
            if self.bookmarks and (now >= self.next_bookmark or
                                   store.bookmark_epoch != self.bookmark_epoch):
                out.append(self._bookmark())
                self.next_bookmark = now + self.bookmark_interval
                self.bookmark_epoch = store.bookmark_epoch
            if out:
                return out, None
            if deadline is not None and now >= deadline:
                return [], "done"
            timeout = wait
            if deadline is not None:
                timeout = min(timeout, deadline - now)
            if self.bookmarks:
                timeout = min(timeout, max(0.0, self.next_bookmark - now))
            store.cond.wait(max(0.0, timeout))
            return [], None


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

    def subscribe(self, fn):
        return self.store.subscribe(fn)

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
