"""The fake Kubernetes API server's state (fake_apiserver.py): resource types, the object store
with its one resourceVersion counter and bounded watch history, and one watch's cursor."""

import collections
import copy
import datetime
import queue
import random
import re
import sys
import threading
import time
import uuid

from apiserver_wire import (ApiError, bad_request, field_selector_matches,
                            label_selector_matches, selector_string, status_object)

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
        T("", "v1", "services", "Service", status=True, short_names=["svc"], categories=["all"],
          deleted_object=True),
        T("", "v1", "secrets", "Secret"),
        T("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
        T("", "v1", "events", "Event", short_names=["ev"]),
        T("", "v1", "endpoints", "Endpoints", short_names=["ep"]),
        T("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"], deleted_object=True),
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

    def subscribe(self, fn, resources=None, replay=False):
        """fn(type, obj, prev) for each change to the storage keys in resources (all if None),
        on a thread of its own; replay first delivers the current objects as ADDED, with no
        change lost or doubled between the two."""
        q = queue.Queue()

        def run():
            while True:
                event = q.get()
                if event is None:
                    return
                if resources is not None and event.key not in resources:
                    continue
                try:
                    fn(event.type, copy.deepcopy(event.obj), copy.deepcopy(event.prev))
                except Exception as e:  # a broken subscriber must not kill the dispatcher
                    print(f"fake_apiserver: subscriber raised {e!r}", file=sys.stderr)

        thread = threading.Thread(target=run, daemon=True, name="fake-apiserver-subscriber")
        with self.cond:
            if replay:
                for key, objs in sorted(self._objects.items()):
                    for _, obj in sorted(objs.items()):
                        q.put(_Event(self._rv, key, "ADDED", obj, None))
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
