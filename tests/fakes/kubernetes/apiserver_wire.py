"""Wire-level helpers of the fake Kubernetes API server (fake_apiserver.py): Status errors,
label and field selectors, and the three patch formats. Pure functions, no state."""

import copy
import re

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
