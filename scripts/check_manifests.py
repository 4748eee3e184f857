#!/usr/bin/python3
"""Checks the Kubernetes manifests in deploy/kubernetes without a cluster.

Run by scripts/check_manifests.sh (ctest `manifests`), which renders them with `kubectl kustomize`
first. Three parts:

1. A client-side dry run: `kubectl create --dry-run=client` of every rendered object and of the
   sample ServingEndpoint. kubectl maps each kind to a resource through API discovery, which needs
   a server; here it reads discovery documents this script writes into kubectl's own disk cache
   (--cache-dir) for a kubeconfig whose server nobody listens on. The documents list the GA API
   versions the manifests target (Kubernetes 1.21 and later) and the CRD's own resource, so an
   object of a removed or misspelt apiVersion or kind fails as it would against a cluster. Works
   with Debian 12's kubectl 1.20 and with current ones.
2. The CRD: a structural schema as the API server requires one, whose `spec` accepts exactly
   the fields src/control/spec.cc accepts (read from spec.cc, so the two cannot drift apart);
   the sample, the spec seeds in tests/data/fuzz/spec and a few specs spec.cc refuses are checked
   against it.
3. Consistency kubectl does not check: selectors match pod template labels, Services' target
   ports exist, RBAC names real resources with real verbs and nothing cluster-wide (and lets
   the gateway get only named Secrets), the
   NetworkPolicy and the replica PodDisruptionBudget select the labels the controller gives
   replica pods and nothing else, containers run locked down as the Dockerfile's user.

Prints one line per problem and exits 1 if there is any.
"""

import argparse
import copy
import json
import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
NAMESPACE = "flotilla"
ENDPOINT_LABEL = "flotilla.dev/endpoint"

# The resources of the API versions the manifests may use: (group/version, plural, kind,
# namespaced, subresources). Also what RBAC rules may name. Beta versions are left out on purpose.
API = [
    ("v1", "namespaces", "Namespace", False, []),
    ("v1", "serviceaccounts", "ServiceAccount", True, []),
    ("v1", "services", "Service", True, ["status"]),
    ("v1", "secrets", "Secret", True, []),
    ("v1", "configmaps", "ConfigMap", True, []),
    ("v1", "pods", "Pod", True, ["status", "log", "eviction"]),
    ("v1", "events", "Event", True, []),
    ("apps/v1", "deployments", "Deployment", True, ["status", "scale"]),
    ("rbac.authorization.k8s.io/v1", "roles", "Role", True, []),
    ("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True, []),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False, []),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False, []),
    ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ["status"]),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True, []),
    ("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", False,
     ["status"]),
    ("coordination.k8s.io/v1", "leases", "Lease", True, []),
    ("discovery.k8s.io/v1", "endpointslices", "EndpointSlice", True, []),
]
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
CLUSTER_SCOPED_ALLOWED = {"Namespace", "CustomResourceDefinition"}

problems = []


def problem(where, message):
    problems.append(f"{where}: {message}")


def where_of(obj):
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name')}"


# ---- 1. client-side dry run -------------------------------------------------------------------


def write_discovery_cache(cache_dir, api):
    """Writes kubectl's disk discovery cache for server https://127.0.0.1:9 (nothing listens)."""
    host_dir = os.path.join(cache_dir, "discovery", "127.0.0.1_9")
    versions = {}
    for group_version, plural, kind, namespaced, subresources in api:
        entries = versions.setdefault(group_version, [])
        entries.append({"name": plural, "singularName": kind.lower(), "namespaced": namespaced,
                        "kind": kind, "verbs": sorted(VERBS)})
        for sub in subresources:
            entries.append({"name": f"{plural}/{sub}", "singularName": "", "namespaced": namespaced,
                            "kind": kind, "verbs": ["get", "patch", "update"]})
    groups = {}
    for group_version in versions:
        group = group_version.rpartition("/")[0]
        groups.setdefault(group, []).append(group_version)
    group_list = {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
    for group, gvs in groups.items():
        entries = [{"groupVersion": gv, "version": gv.rpartition("/")[2]} for gv in gvs]
        group_list["groups"].append({"name": group, "versions": entries,
                                     "preferredVersion": entries[0]})
    os.makedirs(host_dir, exist_ok=True)
    with open(os.path.join(host_dir, "servergroups.json"), "w") as f:
        json.dump(group_list, f)
    for group_version, resources in versions.items():
        gv_dir = os.path.join(host_dir, *group_version.split("/"))
        os.makedirs(gv_dir, exist_ok=True)
        with open(os.path.join(gv_dir, "serverresources.json"), "w") as f:
            json.dump({"kind": "APIResourceList", "apiVersion": "v1",
                       "groupVersion": group_version, "resources": resources}, f)


KUBECONFIG = f"""apiVersion: v1
kind: Config
clusters:
- name: offline
  cluster: {{server: "https://127.0.0.1:9"}}
contexts:
- name: offline
  context: {{cluster: offline, user: offline, namespace: {NAMESPACE}}}
current-context: offline
users:
- name: offline
  user: {{token: unused}}
"""


def dry_run(kubectl, work, api, files_and_objects):
    cache_dir = os.path.join(work, "kubectl-cache")
    write_discovery_cache(cache_dir, api)
    kubeconfig = os.path.join(work, "kubeconfig")
    with open(kubeconfig, "w") as f:
        f.write(KUBECONFIG)
    for path, objects in files_and_objects:
        command = [kubectl, "create", "--dry-run=client", "--validate=false", "-o", "name",
                   "--kubeconfig", kubeconfig, "--cache-dir", cache_dir, "--request-timeout", "5s",
                   "-f", path]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            # A miss in the cache makes kubectl try the (absent) server; the last line says which
            # object it could not map.
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            problem(path, "kubectl create --dry-run=client failed: " +
                    (lines[-1] if lines else f"exit {result.returncode}"))
            continue
        names = sorted(line.strip() for line in result.stdout.splitlines() if line.strip())
        expected = sorted(expected_dry_run_name(obj, api) for obj in objects)
        if names != expected:
            problem(path, f"dry run printed {names}, expected {expected}")


def expected_dry_run_name(obj, api):
    group = obj.get("apiVersion", "").rpartition("/")[0]
    for gv, plural, kind, _, _ in api:
        if kind == obj.get("kind") and gv.rpartition("/")[0] == group:
            singular = kind.lower()
            return f"{singular}.{group}/{obj['metadata']['name']}" if group else \
                f"{singular}/{obj['metadata']['name']}"
    return f"(unknown kind {obj.get('kind')})"


# ---- 2. the CRD -------------------------------------------------------------------------------

SCALAR_TYPES = {"string", "integer", "number", "boolean"}
TYPES = SCALAR_TYPES | {"object", "array"}
# What this project's schema may use; anything else is refused here rather than guessed about.
SCHEMA_KEYS = {"type", "description", "properties", "items", "required", "enum", "minimum",
               "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "format",
               "nullable", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
               "additionalProperties"}


def check_structural(node, path):
    """The structural-schema rules the API server applies that this schema could break."""
    if not isinstance(node, dict):
        problem(path, "schema node is not a mapping")
        return
    for key in node:
        if key not in SCHEMA_KEYS:
            problem(path, f"schema keyword '{key}' is not one this check knows")
    kind = node.get("type")
    if kind not in TYPES:
        problem(path, f"every node needs a type (one of {sorted(TYPES)}), got {kind!r}")
        return
    if "properties" in node and "additionalProperties" in node:
        problem(path, "properties and additionalProperties are mutually exclusive")
    if "properties" in node and kind != "object":
        problem(path, "properties on a non-object")
    if kind == "array" and "items" not in node:
        problem(path, "an array needs items")
    if "items" in node and kind != "array":
        problem(path, "items on a non-array")
    for name in node.get("required", []):
        if name not in node.get("properties", {}):
            problem(path, f"required '{name}' is not a property")
    for value in node.get("enum", []):
        if not matches_type(value, kind):
            problem(path, f"enum value {value!r} is not a {kind}")
    if "pattern" in node:
        try:
            re.compile(node["pattern"])
        except re.error as e:
            problem(path, f"bad pattern: {e}")
    if "minimum" in node and "maximum" in node and node["minimum"] > node["maximum"]:
        problem(path, "minimum > maximum")
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None:
        if kind != "array" or list_type not in {"atomic", "set", "map"}:
            problem(path, "bad x-kubernetes-list-type")
        if list_type == "map":
            items = node.get("items", {})
            for key in node.get("x-kubernetes-list-map-keys", []):
                key_schema = items.get("properties", {}).get(key, {})
                if key not in items.get("required", []):
                    problem(path, f"list-map key '{key}' must be required in the items")
                if key_schema.get("type") not in SCALAR_TYPES:
                    problem(path, f"list-map key '{key}' must be a scalar")
            if not node.get("x-kubernetes-list-map-keys"):
                problem(path, "a list-map needs x-kubernetes-list-map-keys")
    for name, child in node.get("properties", {}).items():
        check_structural(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        if kind != "object":
            problem(path, "additionalProperties on a non-object")
        check_structural(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        check_structural(node["items"], f"{path}[]")


def matches_type(value, kind):
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    return False


def validate(value, node, path, errors):
    """`value` against `node` as the API server does under strict field validation (unknown
    fields are errors, as spec.cc makes them)."""
    if value is None:
        if not node.get("nullable"):
            errors.append(f"{path}: null")
        return
    kind = node["type"]
    if not matches_type(value, kind):
        errors.append(f"{path}: not a {kind}")
        return
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{path}: {value!r} not in {node['enum']}")
    if "minimum" in node and value < node["minimum"]:
        errors.append(f"{path}: below {node['minimum']}")
    if "maximum" in node and value > node["maximum"]:
        errors.append(f"{path}: above {node['maximum']}")
    if "minLength" in node and len(value) < node["minLength"]:
        errors.append(f"{path}: shorter than {node['minLength']}")
    if "maxLength" in node and len(value) > node["maxLength"]:
        errors.append(f"{path}: longer than {node['maxLength']}")
    if "pattern" in node and not re.search(node["pattern"], value):
        errors.append(f"{path}: does not match {node['pattern']}")
    if "minItems" in node and len(value) < node["minItems"]:
        errors.append(f"{path}: fewer than {node['minItems']} items")
    if kind == "object" and "properties" in node:
        for name in node.get("required", []):
            if name not in value:
                errors.append(f"{path}.{name}: required")
        for name, child in value.items():
            if name not in node["properties"]:
                errors.append(f"{path}: unknown field '{name}'")
            else:
                validate(child, node["properties"][name], f"{path}.{name}", errors)
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        for name, child in value.items():
            validate(child, node["additionalProperties"], f"{path}.{name}", errors)
    if kind == "array":
        keys = node.get("x-kubernetes-list-map-keys", [])
        seen = set()
        for i, item in enumerate(value):
            validate(item, node["items"], f"{path}[{i}]", errors)
            if keys and isinstance(item, dict):
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    errors.append(f"{path}[{i}]: duplicate key {key}")
                seen.add(key)


def spec_cc_fields():
    """The field sets and runtimes src/control/spec.cc accepts, read from its check_keys calls."""
    with open(os.path.join(ROOT, "src/control/spec.cc")) as f:
        text = f.read()
    field_sets = set()
    # check_keys(node, {...}) calls, and read_range's key lists: its default and the lists
    # callers pass it (the last argument, before the closing parenthesis).
    for pattern in [r"check_keys\(\s*\w+,\s*\{([^}]*)\}", r"\bkeys\s*=\s*\{([^}]*)\}",
                    r"read_range\([^;]*?\{([^}]*)\}\s*\)"]:
        for match in re.finditer(pattern, text):
            field_sets.add(frozenset(re.findall(r'"([^"]+)"', match.group(1))))
    runtimes = re.search(r"kRuntimes\s*=\s*\{([^}]*)\}", text)
    return field_sets, set(re.findall(r'"([^"]+)"', runtimes.group(1))) if runtimes else set()


def object_field_sets(node, found):
    if node.get("type") == "object" and "properties" in node:
        found.add(frozenset(node["properties"]))
        for child in node["properties"].values():
            object_field_sets(child, found)
    if "items" in node:
        object_field_sets(node["items"], found)
    return found


def find_node(node, path):
    """The schema node at a JSONPath such as .status.readyReplicas (no filters)."""
    for part in path.strip(".").split("."):
        node = node.get("properties", {}).get(part)
        if node is None:
            return None
    return node


def check_crd(crd):
    where = where_of(crd)
    spec = crd["spec"]
    names = spec["names"]
    if crd["metadata"]["name"] != f"{names['plural']}.{spec['group']}":
        problem(where, "metadata.name must be <plural>.<group>")
    if spec.get("scope") != "Namespaced":
        problem(where, "ServingEndpoints are namespaced")
    if [v for v in spec["versions"] if v.get("storage")] != spec["versions"][:1] or \
            len(spec["versions"]) != 1:
        problem(where, "one version, the storage version")
    version = spec["versions"][0]
    if version.get("subresources", {}).get("status") != {}:
        problem(where, "needs the status subresource")
    root = version["schema"]["openAPIV3Schema"]
    check_structural(root, f"{where} schema")
    if root.get("properties", {}).get("metadata") != {"type": "object"}:
        problem(where, "metadata must be left to the API server ({type: object})")
    for column in version.get("additionalPrinterColumns", []):
        if column["jsonPath"] == ".metadata.creationTimestamp":
            continue
        target = find_node(root, column["jsonPath"])
        if target is None or target.get("type") != column["type"]:
            problem(where, f"printer column {column['name']}: {column['jsonPath']} is not a "
                    f"{column['type']} in the schema")

    spec_schema = root["properties"]["spec"]
    field_sets, runtimes = spec_cc_fields()
    crd_sets = object_field_sets(spec_schema, set())
    if not field_sets or crd_sets != field_sets:
        problem(where, f"spec fields {sorted(map(sorted, crd_sets))} differ from what "
                f"src/control/spec.cc accepts {sorted(map(sorted, field_sets))}")
    runtime = find_node(spec_schema["properties"]["served_models"]["items"], ".runtime") or {}
    if set(runtime.get("enum", [])) != runtimes or not runtimes:
        problem(where, f"runtime enum {runtime.get('enum')} differs from spec.cc's {runtimes}")

    status = root["properties"]["status"]["properties"]
    for field in ("observedGeneration", "versions", "conditions"):
        if field not in status:
            problem(where, f"status.{field} missing")
    version_fields = status.get("versions", {}).get("items", {}).get("properties", {})
    for field in ("desiredReplicas", "readyReplicas", "updatedReplicas",
                  "targetConcurrencyPerReplica"):
        if field not in version_fields:
            problem(where, f"status.versions[].{field} missing")
    condition_fields = status.get("conditions", {}).get("items", {}).get("properties", {})
    for field in ("type", "status", "reason", "message", "lastTransitionTime",
                  "observedGeneration"):
        if field not in condition_fields:
            problem(where, f"status.conditions[].{field} missing")
    return spec_schema


def check_specs(spec_schema, sample):
    """Specs spec.cc accepts validate against the schema; a few it refuses do not."""
    accepted = []
    seeds = os.path.join(ROOT, "tests/data/fuzz/spec")
    for name in sorted(os.listdir(seeds)):
        with open(os.path.join(seeds, name)) as f:
            accepted.append((f"tests/data/fuzz/spec/{name}", yaml.safe_load(f)))
    accepted.append(("sample-servingendpoint.yaml", sample["spec"]))
    for where, spec in accepted:
        errors = []
        validate(spec, spec_schema, "spec", errors)
        for error in errors:
            problem(where, f"refused by the CRD schema: {error}")

    base = sample["spec"]
    refused = {
        "unknown field": lambda s: s["served_models"][0].update(modle="/m"),
        "unknown runtime": lambda s: s["served_models"][0].update(runtime="tensorrt"),
        "external without a command": lambda s: s["served_models"][0].update(
            runtime="external", external={"env": {"A": "b"}}),
        "external command as a string": lambda s: s["served_models"][0].update(
            runtime="external", external={"command": "python3 server.py"}),
        "external env value a list": lambda s: s["served_models"][0].update(
            runtime="external", external={"command": ["srv"], "env": {"A": ["b"]}}),
        "external relative workdir": lambda s: s["served_models"][0].update(
            runtime="external", external={"command": ["srv"], "workdir": "srv"}),
        "traffic above 100": lambda s: s["served_models"][0].update(traffic=101),
        "traffic as a string": lambda s: s["served_models"][0].update(traffic="50"),
        "relative model path": lambda s: s["served_models"][0].update(model="models/fraud"),
        "no served models": lambda s: s.update(served_models=[]),
        "no model": lambda s: s["served_models"][0].pop("model"),
        "name with a slash": lambda s: s["served_models"][0].update(name="v/1"),
        "name of 65 characters": lambda s: s.update(name="a" * 65),
        "duplicate version": lambda s: s["served_models"].append(dict(s["served_models"][0])),
        "concurrency.max 0": lambda s: s["served_models"][0].update(concurrency={"max": 0}),
        "per_replica_concurrency.max 4097":
            lambda s: s["served_models"][0].update(per_replica_concurrency={"max": 4097}),
        "per_replica_concurrency.initial 0":
            lambda s: s["served_models"][0].update(per_replica_concurrency={"initial": 0}),
        "unknown resources field":
            lambda s: s["served_models"][0].update(resources={"gpus": 1}),
        "cpus above 1024": lambda s: s["served_models"][0].update(resources={"cpus": 1025}),
        "scale_to_zero as a string":
            lambda s: s["served_models"][0].update(scale_to_zero="yes"),
    }
    for what, change in refused.items():
        spec = copy.deepcopy(base)
        change(spec)
        errors = []
        validate(spec, spec_schema, "spec", errors)
        if not errors:
            problem("CRD schema", f"accepts a spec spec.cc refuses ({what})")


# ---- 3. consistency ---------------------------------------------------------------------------

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def selects(selector, labels):
    """Whether a LabelSelector (matchLabels and matchExpressions) selects `labels`."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, op, values = expression["key"], expression["operator"], expression.get("values", [])
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
    return True


def check_metadata(obj, api_kinds):
    where = where_of(obj)
    meta = obj.get("metadata")
    if not obj.get("apiVersion") or not obj.get("kind") or not isinstance(meta, dict) or \
            not meta.get("name"):
        problem(where, "needs apiVersion, kind and metadata.name")
        return
    if not DNS_SUBDOMAIN.match(meta["name"]) or len(meta["name"]) > 253:
        problem(where, "name is not a DNS subdomain")
    if obj["kind"] in ("Service", "Namespace") and not DNS_LABEL.match(meta["name"]):
        problem(where, "name is not a DNS label")
    for key, value in (meta.get("labels") or {}).items():
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            problem(where, f"label {key}: bad value {value!r}")
    namespaced = api_kinds.get((obj["apiVersion"], obj["kind"]))
    if namespaced is None:
        problem(where, f"{obj['apiVersion']} {obj['kind']} is not in the API versions targeted")
        return
    if namespaced and meta.get("namespace") != NAMESPACE:
        problem(where, f"namespace is {meta.get('namespace')!r}, not {NAMESPACE!r}")
    if not namespaced and obj["kind"] not in CLUSTER_SCOPED_ALLOWED:
        problem(where, "cluster-scoped: only the CRD and the namespace may be")


def check_rbac(objects, api):
    resources = {}
    for gv, plural, _, _, subresources in api:
        group = gv.rpartition("/")[0]
        resources.setdefault(group, set()).add(plural)
        resources[group].update(f"{plural}/{sub}" for sub in subresources)
    roles = {o["metadata"]["name"] for o in objects if o["kind"] == "Role"}
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    for obj in objects:
        where = where_of(obj)
        if obj["kind"] == "Role":
            for rule in obj.get("rules", []):
                for field in ("apiGroups", "resources", "verbs"):
                    if "*" in rule.get(field, []) or not rule.get(field):
                        problem(where, f"rule {rule}: {field} must be listed, no '*'")
                for verb in rule.get("verbs", []):
                    if verb not in VERBS:
                        problem(where, f"unknown verb '{verb}'")
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        if resource not in resources.get(group, set()):
                            problem(where, f"no resource '{resource}' in group '{group}'")
                # The gateway faces the network: it may read named Secrets only (the report
                # key), never list or watch them (that would be every Secret of the namespace,
                # the admin token's plaintext included).
                if obj["metadata"]["name"] == "flotilla-gateway" and \
                        "secrets" in rule.get("resources", []) and \
                        (set(rule.get("verbs", [])) - {"get"} or not rule.get("resourceNames")):
                    problem(where, f"rule {rule}: the gateway may only get named Secrets")
        if obj["kind"] == "RoleBinding":
            ref = obj.get("roleRef", {})
            if ref.get("kind") != "Role" or ref.get("name") not in roles:
                problem(where, f"roleRef {ref} names no Role here")
            for subject in obj.get("subjects", []):
                if subject.get("kind") != "ServiceAccount" or \
                        subject.get("name") not in accounts or \
                        subject.get("namespace") != NAMESPACE:
                    problem(where, f"subject {subject} is not one of this namespace's "
                            "ServiceAccounts")


def dockerfile_user():
    with open(os.path.join(ROOT, "deploy/Dockerfile")) as f:
        text = f.read()
    users = re.findall(r"^USER\s+(\d+)", text, re.M)
    binary = "/usr/local/bin/flotilla" in text
    return (int(users[-1]) if users else None), binary


def check_pod(where, template, accounts, image_user):
    spec = template["spec"]
    if spec.get("serviceAccountName") not in accounts:
        problem(where, f"serviceAccountName {spec.get('serviceAccountName')!r} is not defined")
    pod_security = spec.get("securityContext", {})
    if pod_security.get("runAsNonRoot") is not True:
        problem(where, "pod securityContext.runAsNonRoot must be true")
    if image_user is None or pod_security.get("runAsUser") != image_user:
        problem(where, f"runAsUser {pod_security.get('runAsUser')} is not the Dockerfile's "
                f"USER {image_user}")
    volumes = {v["name"] for v in spec.get("volumes", [])}
    for container in spec["containers"]:
        cwhere = f"{where} container {container['name']}"
        security = container.get("securityContext", {})
        if security.get("readOnlyRootFilesystem") is not True or \
                security.get("allowPrivilegeEscalation") is not False or \
                security.get("capabilities", {}).get("drop") != ["ALL"]:
            problem(cwhere, "needs readOnlyRootFilesystem, no privilege escalation, drop ALL")
        if container.get("command") != ["/usr/local/bin/flotilla"]:
            problem(cwhere, "runs /usr/local/bin/flotilla (the Dockerfile's path)")
        env = {e["name"] for e in container.get("env", [])}
        for arg in container.get("args", []):
            for var in re.findall(r"\$\((\w+)\)", arg):
                if var not in env:
                    problem(cwhere, f"args use $({var}), which env does not define")
        ports = {p["name"] for p in container.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe"):
            port = container.get(probe, {}).get("httpGet", {}).get("port")
            if port is None:
                problem(cwhere, f"needs an httpGet {probe}")
            elif isinstance(port, str) and port not in ports:
                problem(cwhere, f"{probe} port '{port}' is not a container port")
        if "memory" not in container.get("resources", {}).get("limits", {}) or \
                "cpu" not in container.get("resources", {}).get("requests", {}):
            problem(cwhere, "needs cpu requests and a memory limit")
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes:
                problem(cwhere, f"mounts undefined volume {mount['name']}")
        if not container.get("image"):
            problem(cwhere, "no image")


def check_workloads(objects):
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    image_user, binary = dockerfile_user()
    if not binary:
        problem("deploy/Dockerfile", "does not install /usr/local/bin/flotilla")
    templates = {}
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        where = where_of(obj)
        template = obj["spec"]["template"]
        labels = template["metadata"].get("labels", {})
        if not selects(obj["spec"]["selector"], labels):
            problem(where, "selector does not select its own pod template")
        if ENDPOINT_LABEL in labels:
            problem(where, f"{ENDPOINT_LABEL} is for replica pods only")
        templates[obj["metadata"]["name"]] = template
        check_pod(where, template, accounts, image_user)

    for obj in objects:
        where = where_of(obj)
        if obj["kind"] == "Service":
            matched = [t for t in templates.values()
                       if selects({"matchLabels": obj["spec"]["selector"]},
                                  t["metadata"]["labels"])]
            if len(matched) != 1:
                problem(where, f"selects {len(matched)} pod templates, expected 1")
                continue
            containers = matched[0]["spec"]["containers"]
            ports = {p["name"] for c in containers for p in c.get("ports", [])}
            for port in obj["spec"]["ports"]:
                if isinstance(port.get("targetPort"), str) and port["targetPort"] not in ports:
                    problem(where, f"targetPort {port['targetPort']} is not a container port")
        if obj["kind"] == "PodDisruptionBudget" and obj["metadata"]["name"] == "flotilla-gateway":
            if not selects(obj["spec"]["selector"],
                           templates["flotilla-gateway"]["metadata"]["labels"]):
                problem(where, "does not select the gateway pods")

    # A replica pod as the controller labels it (sample-servingendpoint.yaml's comment).
    replica = {ENDPOINT_LABEL: "fraud-scorer", "flotilla.dev/version": "v1",
               "app.kubernetes.io/name": "flotilla"}
    gateway = templates.get("flotilla-gateway", {}).get("metadata", {}).get("labels", {})
    controller = templates.get("flotilla-controller", {}).get("metadata", {}).get("labels", {})
    found = {"NetworkPolicy": 0, "PodDisruptionBudget": 0}
    for obj in objects:
        where = where_of(obj)
        if obj["metadata"]["name"] != "flotilla-replicas" or obj["kind"] not in found:
            continue
        found[obj["kind"]] += 1
        selector = obj["spec"]["podSelector" if obj["kind"] == "NetworkPolicy" else "selector"]
        if not selects(selector, replica):
            problem(where, "does not select replica pods")
        for name, labels in (("gateway", gateway), ("controller", controller)):
            if selects(selector, labels):
                problem(where, f"selects the {name} pods too")
        if obj["kind"] == "NetworkPolicy":
            sources = [peer.get("podSelector") for rule in obj["spec"].get("ingress", [])
                       for peer in rule.get("from", [])]
            if obj["spec"].get("policyTypes") != ["Ingress"] or None in sources or \
                    any(rule.get("from") is None for rule in obj["spec"].get("ingress", [])):
                problem(where, "ingress must come from listed pods only")
            allowed = [labels for labels in (gateway, controller, replica)
                       if any(selects(s, labels) for s in sources)]
            if allowed != [gateway, controller]:
                problem(where, "must admit the gateway and controller pods and nothing else")
    if found != {"NetworkPolicy": 1, "PodDisruptionBudget": 1}:
        problem("replicas.yaml", f"expected one NetworkPolicy and one PodDisruptionBudget "
                f"named flotilla-replicas, found {found}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--rendered", required=True, help="kubectl kustomize's output")
    parser.add_argument("--sample", required=True)
    parser.add_argument("--work", required=True, help="a scratch directory")
    args = parser.parse_args()

    with open(args.rendered) as f:
        objects = [o for o in yaml.safe_load_all(f) if o]
    with open(args.sample) as f:
        samples = [o for o in yaml.safe_load_all(f) if o]
    crds = [o for o in objects if o.get("kind") == "CustomResourceDefinition"]
    if len(crds) != 1 or len(samples) != 1:
        print(f"check_manifests: expected one CRD and one sample, got {len(crds)} and "
              f"{len(samples)}", file=sys.stderr)
        return 1
    crd, sample = crds[0], samples[0]
    names = crd["spec"]["names"]
    api = API + [(f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}",
                  names["plural"], names["kind"], crd["spec"]["scope"] == "Namespaced",
                  list(crd["spec"]["versions"][0].get("subresources", {})))]
    api_kinds = {(gv, kind): namespaced for gv, _, kind, namespaced, _ in api}

    dry_run(args.kubectl, args.work, api, [(args.rendered, objects), (args.sample, samples)])
    for obj in objects:
        check_metadata(obj, api_kinds)
    if sample.get("apiVersion") != api[-1][0] or sample.get("kind") != names["kind"]:
        problem(args.sample, "is not a ServingEndpoint of the CRD's version")
    spec_schema = check_crd(crd)
    check_specs(spec_schema, sample)
    check_rbac(objects, api)
    check_workloads(objects)

    for line in problems:
        print(line)
    if problems:
        print(f"check_manifests: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_manifests: {len(objects)} objects and the sample ServingEndpoint are valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
