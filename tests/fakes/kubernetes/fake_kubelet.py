#!/usr/bin/python3
"""A FAKE kubelet and FAKE Deployment and EndpointSlice controllers for Flotilla's tests.
It is not Kubernetes.

Built on the fake API server (fake_apiserver.py), in process: it turns every apps/v1 Deployment
in that server into real processes on 127.0.0.1 (one per replica), writes their v1 Pod objects
and the Deployments' status as the kubelet and the deployment controller would, and keeps an
EndpointSlice per Service port set as the EndpointSlice controller would, with the processes'
real addresses and readiness. Python 3 standard library only.

    kubelet = FakeKubelet(apiserver, {"flotilla": FLOTILLA_BIN}, probe_period_s=0.2,
                          log_dir=DIR)
    kubelet.start()
    ... kubelet.pods(); kubelet.kill_pod_process(name); kubelet.pod_log(name) ...
    kubelet.stop()           # every process gone (SIGTERM, then SIGKILL); Pod objects left

Options: executables (image -> executable, below), probe_period_s (every probe's period; None:
the probes' own), log_dir (default: a temporary directory removed by stop()), resync_s (the
loop's period besides events), restart_backoff_s / max_restart_backoff_s, stop_grace_s.
Hooks: pods() -> [{name, namespace, deployment, hash, port, pid, ready, started, restart_count,
terminating, argv}]; kill_pod_process(name, namespace="default") -> the pid SIGKILLed;
pod_log(name) -> the process's output so far.

Threads: one reconcile loop (woken by the server's subscribe() hook on Deployments, Services
and Pods, and every resync_s), plus one supervisor thread per pod that starts, probes, restarts
and finally stops that pod's process and is the only writer of that Pod's status. One lock
guards the pod table; it is never held while calling into the server (whose subscriber thread
calls back in) or while waiting on a process.

What it does, as the real parts do:
  - Deployment controller (RollingUpdate): pods of the current template (label
    pod-template-hash: FNV-32a of the template, encoded as Kubernetes' SafeEncodeString) are
    scaled up while the non-terminating pods are fewer than replicas + maxSurge; old pods are
    removed as the deployment controller allows (unavailable old pods first, then available ones
    while the available pods stay at least replicas - maxUnavailable). maxSurge/maxUnavailable
    are read from the spec (ints or percentages: surge rounded up, unavailable down, both 0
    means unavailable 1; the fake server's defaults are 25%/25%, which for a few replicas is
    maxSurge 1 / maxUnavailable 0). Recreate: all old pods gone before a new one starts.
    minReadySeconds decides availability. Scale down deletes, as the ReplicaSet controller
    ranks them, not-ready pods first, then the most recently ready, the most restarted, the
    newest. Status: observedGeneration, replicas (non-terminating pods), updatedReplicas,
    readyReplicas, availableReplicas, unavailableReplicas, conditions Available
    (MinimumReplicasAvailable / MinimumReplicasUnavailable) and Progressing
    (NewReplicaSetAvailable / ReplicaSetUpdated / ProgressDeadlineExceeded after
    progressDeadlineSeconds without progress), written through the status subresource only
    when they change.
  - kubelet: the first container of the template runs as a process with restartPolicy Always
    (an exit or a liveness/startup failure restarts it after a backoff that doubles from
    restart_backoff_s to max_restart_backoff_s; restartCount counts the restarts, the waiting
    state in between is CrashLoopBackOff); readiness, liveness and startup probes (httpGet,
    tcpSocket) with their failureThreshold/successThreshold/timeoutSeconds; readiness keeps
    being probed while a pod terminates (the endpoint's `serving`). Deleting a pod: the Pod
    gets metadata.deletionTimestamp, its endpoints turn terminating, the preStop hook runs
    (httpGet: called; sleep: honoured), SIGTERM, up to terminationGracePeriodSeconds (default
    30, counted from the start of the deletion, preStop included), SIGKILL, then the Pod object
    is deleted. A Pod deleted through the API (kubectl delete pod) is stopped the same way and
    replaced; a Deployment deleted (the fake server deletes its Pods at once) stops its pods.
    The deployment controller acts on the readiness the slices last showed, so in a rolling
    update a new pod is in its slice as ready before an old pod is removed for it.
  - EndpointSlice controller: for each Service with a selector, slices labelled
    kubernetes.io/service-name={service} and endpointslice.kubernetes.io/managed-by=
    endpointslice-controller.k8s.io plus the Service's own labels (the real controller copies
    them, all but those reserved labels, since Kubernetes 1.19: setEndpointSliceLabels in
    pkg/controller/endpointslice), service.kubernetes.io/headless for clusterIP None, an owner
    reference to the Service, generateName "{service}-" (the server picks 5 characters),
    addressType IPv4, ports [{name, port, protocol}] with each Service port's targetPort
    resolved on the pod (a name through the container's ports; a pod without the named port
    leaves that port out), endpoints [{addresses [127.0.0.1], conditions {ready, serving,
    terminating}, nodeName, targetRef Pod}] where ready = serving and not terminating (or
    publishNotReadyAddresses). Endpoints are grouped into slices by their port set, as the real
    controller does; a Service with no endpoints keeps one placeholder slice (no ports, no
    endpoints).

Substitutions and differences, on purpose:
  - all pods share 127.0.0.1 (status.podIP, hostIP, slice addresses), so each pod gets its own
    port, picked by this kubelet (never handed out twice in a process; below the ephemeral port
    range, so that nothing else is given it before the process binds it): in the argv, the value
    of `--port V` / `--port=V` becomes that port, `--host H` / `--host=H` becomes 127.0.0.1
    and `--listen H:P` becomes 127.0.0.1:PORT; the Pod object's first containerPort is
    rewritten to it. Probes, httpGet preStop hooks and Service targetPorts that resolve to the
    template's port (its first containerPort or its `--port` value; any port when it declares
    neither) go to the pod's port; other port numbers are used as they are, on 127.0.0.1. The
    process must take --port or --listen to listen where its probes look. A consequence: since
    every pod has its own port, every pod gets its own EndpointSlice (one port set each); in a
    real cluster the pods share the targetPort and share slices (up to 100 endpoints each).
  - the image is not pulled or used: `executables` maps an image (exactly, or its name without
    registry and tag: "registry/flotilla:0.1.0" -> "flotilla") to a local executable, which
    replaces the command's first element (or is the whole command when the container has none:
    the image's entrypoint); without a mapping the command's first element is run as it is when
    it is an absolute path. args and command get Kubernetes' $(VAR) expansion ($$ escapes) from
    the container's env: value, and valueFrom.fieldRef metadata.name, metadata.namespace,
    metadata.uid, spec.nodeName, status.podIP, status.hostIP, metadata.labels['k'],
    metadata.annotations['k']; envFrom, secretKeyRef, configMapKeyRef and resourceFieldRef are
    not read. The process environment is that env plus PATH and HOSTNAME (the pod name), not
    the test's environment (no KUBERNETES_SERVICE_HOST: in-cluster configuration is not faked).
  - emptyDir volumes: an argv element that is a mount path of one (or starts with it and "/",
    or is `--flag=PATH`) is rewritten into a directory of the pod under log_dir; other volumes
    are ignored. The process runs in its pod directory (log_dir/{pod}/), its stdout and stderr
    go to log_dir/{pod}.log (appended across restarts).
  - only the first container runs (init containers, sidecars and the rest are ignored); exec
    probes and grpc probes always succeed (their command would run inside the image); an exec
    preStop hook is skipped for the same reason, but for a plain `sleep N` (`/bin/sleep`,
    `/usr/bin/sleep`), which waits N seconds as it would in the image; a liveness kill sends SIGTERM with the grace
    period but does not run preStop. With probe_period_s set (the default, for tests) every
    probe runs at that period and initialDelaySeconds is ignored, but a liveness or startup
    probe kills only after failing for failureThreshold x periodSeconds seconds (and
    failureThreshold times), the time its spec gives a container; probe_period_s=None keeps
    periodSeconds and initialDelaySeconds.
  - no ReplicaSet objects (the fake server serves none): Pods are named
    {deployment}-{pod-template-hash}-{5 characters} and owned directly by the Deployment (the
    fake server deletes them with it). revisionHistoryLimit, paused, rollback and
    collisionCount are ignored; nodeName is "fake-node"; the restart backoff starts at 0.5 s
    (the kubelet: 10 s, up to 5 min); no annotations such as
    endpoints.kubernetes.io/last-change-trigger-time.
  - ordering: the real kubelet and EndpointSlice controller act on a deletion independently;
    here the kubelet waits (up to a second, within the grace period) until the slices show the
    pod terminating before it runs preStop and sends SIGTERM, so a test always sees the
    terminating (and still serving) endpoint before the process stops serving or goes.
  - every Pod it makes carries the annotation fake-kubelet.flotilla.dev/port (its port); such a
    Pod with no process of this kubelet (left by an earlier FakeKubelet on the same server) is
    deleted, as if its node had gone.
  - stop() stops every process quickly (SIGTERM, stop_grace_s, SIGKILL) without preStop hooks or
    API writes, so it also works after the server has stopped. Processes are started through
    setpriv --pdeathsig KILL where /usr/bin/setpriv exists, so they die with their supervisor
    thread if the test process is killed.
"""

import copy
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apiserver_wire import ApiError  # noqa: E402

POD_IP = "127.0.0.1"
NODE_NAME = "fake-node"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.k8s.io"
HEADLESS_LABEL = "service.kubernetes.io/headless"
HASH_LABEL = "pod-template-hash"
POD_PORT_ANNOTATION = "fake-kubelet.flotilla.dev/port"  # on every Pod this fake makes
_RESERVED_SLICE_LABELS = (SERVICE_NAME_LABEL, MANAGED_BY_LABEL, HEADLESS_LABEL)
_SAFE_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' rand.SafeEncodeString alphabet
_SETPRIV = "/usr/bin/setpriv"
# Ports handed to pods by every FakeKubelet of this process, never handed out again.
_used_ports = set()
_used_ports_lock = threading.Lock()


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --------------------------------------------------------------------------------------------
# Pure helpers (tested on their own).


def template_hash(template):
    """pod-template-hash: FNV-32a of the template, its decimal digits SafeEncodeString'd."""
    h = 0x811C9DC5
    for b in json.dumps(template, sort_keys=True, separators=(",", ":")).encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE_CHARS[ord(c) % len(_SAFE_CHARS)] for c in str(h))


def expand(text, env):
    """Kubernetes' $(VAR) expansion: $(NAME) of a defined variable becomes its value, $$ becomes
    $, anything else stays as written."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if text.startswith("$(", i):
            end = text.find(")", i + 2)
            if end != -1 and text[i + 2:end] in env:
                out.append(env[text[i + 2:end]])
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _field_ref(path, pod_meta):
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']*)'\]", path)
    if m:
        return (pod_meta.get(m.group(1)) or {}).get(m.group(2), "")
    return {"metadata.name": pod_meta.get("name", ""),
            "metadata.namespace": pod_meta.get("namespace", ""),
            "metadata.uid": pod_meta.get("uid", ""),
            "spec.nodeName": NODE_NAME, "status.podIP": POD_IP,
            "status.hostIP": POD_IP}.get(path, "")


def container_env(container, pod_meta):
    """The container's env as a dict, each value expanded with the variables before it."""
    env = {}
    for entry in container.get("env") or []:
        name = entry.get("name")
        if not name:
            continue
        if "value" in entry:
            env[name] = expand(str(entry["value"]), env)
        elif (entry.get("valueFrom") or {}).get("fieldRef"):
            env[name] = _field_ref(entry["valueFrom"]["fieldRef"].get("fieldPath", ""), pod_meta)
    return env


def template_port(container):
    """The port the template listens on: its first containerPort, else its --port value."""
    ports = container.get("ports") or []
    if ports and isinstance(ports[0].get("containerPort"), int):
        return ports[0]["containerPort"]
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    for i, a in enumerate(argv):
        value = argv[i + 1] if a == "--port" and i + 1 < len(argv) else (
            a[len("--port="):] if a.startswith("--port=") else None)
        if value is not None and value.isdigit():
            return int(value)
    return None


def substitute_argv(argv, port):
    """--port V / --port=V -> the pod's port, --host H / --host=H -> 127.0.0.1, --listen H:P ->
    127.0.0.1:port."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("--port", "--host", "--listen") and i + 1 < len(argv):
            out += [a, {"--port": str(port), "--host": POD_IP,
                        "--listen": f"{POD_IP}:{port}"}[a]]
            i += 2
            continue
        if a.startswith("--port="):
            a = f"--port={port}"
        elif a.startswith("--host="):
            a = f"--host={POD_IP}"
        elif a.startswith("--listen="):
            a = f"--listen={POD_IP}:{port}"
        out.append(a)
        i += 1
    return out


def _rewrite_mounts(argv, mounts):
    """mounts: [(mountPath, local dir)], longest first."""
    out = []
    for a in argv:
        prefix, path = (a.split("=", 1)[0] + "=", a.split("=", 1)[1]) \
            if a.startswith("-") and "=" in a else ("", a)
        for mount, local in mounts:
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                path = local + path[len(mount.rstrip("/")):]
                break
        out.append(prefix + path)
    return out


def _scaled(value, replicas, round_up):
    """An IntOrString of a rolling update against replicas."""
    if isinstance(value, str) and value.endswith("%"):
        frac = int(value[:-1]) * replicas
        return -(-frac // 100) if round_up else frac // 100
    return int(value or 0)


def rolling_params(spec, replicas):
    """(maxSurge, maxUnavailable) as the deployment controller resolves them."""
    rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
    surge = _scaled(rolling.get("maxSurge", "25%"), replicas, True)
    unavailable = _scaled(rolling.get("maxUnavailable", "25%"), replicas, False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def _labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --------------------------------------------------------------------------------------------
# One pod.


class _Pod:
    """A pod's state. Set once at creation: name, namespace, uid, owner, hash, template, port,
    grace_s, labels. The rest is guarded by FakeKubelet._lock and written by the pod's
    supervisor thread (terminating and object_gone also by the loop and the subscriber)."""

    def __init__(self, namespace, owner_name, owner_uid, hash_, template, port, min_ready_s):
        self.namespace, self.owner_name, self.owner_uid = namespace, owner_name, owner_uid
        self.hash, self.template, self.port = hash_, template, port
        self.min_ready_s = min_ready_s
        self.container = template["spec"]["containers"][0]
        self.labels = dict((template.get("metadata") or {}).get("labels") or {})
        self.labels[HASH_LABEL] = hash_
        grace = template["spec"].get("terminationGracePeriodSeconds")
        self.grace_s = 30.0 if grace is None else float(grace)
        self.original_port = template_port(self.container)
        self.name = self.uid = None
        self.created = time.monotonic()
        self.start_time = _now()
        self.wake = threading.Event()
        self.thread = None
        # guarded by the lock
        self.proc = None
        self.argv = None
        self.phase = "Pending"
        self.started = False       # startup probe passed (or none) for the current container
        self.ready = False
        self.ready_since = None    # monotonic, for minReadySeconds and the scale-down rank
        self.ready_transition = _now()
        self.restart_count = 0
        self.running_since = None  # wall time of the current container's start
        self.waiting = ("ContainerCreating", "")
        self.last_terminated = None
        self.terminating = False
        self.terminating_published = False  # the slices show it terminating
        self.object_gone = False   # the Pod object was deleted through the API
        self.done = False

    def available(self, now):
        return self.ready and now - self.ready_since >= self.min_ready_s

    def map_port(self, port):
        """A template port (number or containerPort name) as this pod serves it."""
        if isinstance(port, str) and not port.isdigit():
            named = [p.get("containerPort") for p in self.container.get("ports") or []
                     if p.get("name") == port]
            if not named:
                return None
            port = named[0]
        port = int(port)
        if self.original_port is None or port == self.original_port:
            return self.port
        return port


# --------------------------------------------------------------------------------------------
# The kubelet.


def _exec_sleep_seconds(hook):
    """N for an exec hook whose command is `sleep N`, else None."""
    command = (hook.get("exec") or {}).get("command") or []
    if len(command) == 2 and command[0] in ("sleep", "/bin/sleep", "/usr/bin/sleep"):
        try:
            return max(0.0, float(command[1]))
        except ValueError:
            return None
    return None


class FakeKubelet:
    """See the header. Thread-safe; start() once, stop() once."""

    def __init__(self, apiserver, executables=None, probe_period_s=0.2, log_dir=None,
                 resync_s=0.5, restart_backoff_s=0.5, max_restart_backoff_s=10.0,
                 stop_grace_s=5.0):
        self.server = apiserver
        self.executables = dict(executables or {})
        self.probe_period_s = probe_period_s
        self.resync_s = resync_s
        self.restart_backoff_s = restart_backoff_s
        self.max_restart_backoff_s = max_restart_backoff_s
        self.stop_grace_s = stop_grace_s
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="fake-kubelet-")
        os.makedirs(self.log_dir, exist_ok=True)
        self._lock = threading.Lock()
        self._pods = {}              # (namespace, name) -> _Pod; guarded by _lock
        self._progress = {}          # deployment uid -> (counts, monotonic); loop thread only
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = None
        self._unsubscribe = None

    # ---- lifecycle

    def start(self):
        self._unsubscribe = self.server.subscribe(self._on_event,
                                                  ["deployments", "services", "pods"])
        self._thread = threading.Thread(target=self._loop, daemon=True, name="fake-kubelet")
        self._thread.start()
        return self

    def stop(self):
        """Stops every pod's process (SIGTERM, stop_grace_s, SIGKILL) and waits for them."""
        self._stopping.set()
        self._wake.set()
        if self._unsubscribe:
            self._unsubscribe()
        if self._thread:
            self._thread.join(timeout=30)
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            pod.wake.set()
        for pod in pods:
            if pod.thread:
                pod.thread.join(timeout=self.stop_grace_s + 10)
        for pod in pods:  # a supervisor that did not finish: its process goes anyway
            with self._lock:
                proc = pod.proc
            if proc is not None and proc.poll() is None:
                _signal(proc, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- test hooks

    def pods(self):
        """[{name, namespace, deployment, hash, port, pid (None when no process runs), ready,
        started, restart_count, terminating, argv}], by name."""
        with self._lock:
            return sorted(({"name": p.name, "namespace": p.namespace,
                            "deployment": p.owner_name, "hash": p.hash, "port": p.port,
                            "pid": p.proc.pid if p.proc and p.proc.returncode is None else None,
                            "ready": p.ready, "started": p.started,
                            "restart_count": p.restart_count, "terminating": p.terminating,
                            "argv": list(p.argv or [])}
                           for p in self._pods.values() if not p.done),
                          key=lambda p: p["name"])

    def kill_pod_process(self, name, namespace="default"):
        """SIGKILLs the pod's process (as an OOM kill or a crash would); returns its pid, or None
        when none runs. The supervisor restarts it after the backoff."""
        with self._lock:
            pod = self._pods.get((namespace, name))
            proc = pod.proc if pod else None
        if proc is None or proc.poll() is not None:
            return None
        _signal(proc, signal.SIGKILL)
        pod.wake.set()
        return proc.pid

    def pod_log(self, name):
        try:
            with open(os.path.join(self.log_dir, f"{name}.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # ---- events and the loop

    def _on_event(self, type_, obj, prev):
        # On the server's subscriber thread: only bookkeeping, no calls into the server.
        if obj.get("kind") == "Pod" and type_ == "DELETED":
            meta = obj["metadata"]
            with self._lock:
                pod = self._pods.get((meta.get("namespace"), meta["name"]))
                if pod is not None and pod.uid == meta.get("uid"):
                    pod.object_gone = True
                    pod.terminating = True
            if pod is not None:
                pod.wake.set()
        self._wake.set()

    def _loop(self):
        while not self._stopping.is_set():
            self._wake.wait(self.resync_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self._reconcile()
            except ApiError as e:  # a conflict or a race with a delete: next pass
                print(f"fake_kubelet: {e}", file=sys.stderr)
            except Exception:  # an object this fake cannot read: say so, keep the loop alive
                traceback.print_exc()

    def _reconcile(self):
        deployments = self.server.list("deployments")
        services = self.server.list("services")
        # Slices first, and the deployment controller acts on the readiness they published: a
        # pod that just became ready is in its slice before an old pod is removed for it, so
        # the count of ready endpoints never dips in a rolling update.
        published = self._sync_slices(services)
        live = {d["metadata"]["uid"] for d in deployments}
        with self._lock:
            for pod in self._pods.values():
                if pod.owner_uid not in live and not pod.terminating:
                    pod.terminating = True
                    pod.wake.set()
        for d in deployments:
            self._sync_deployment(d, published)
        self._sync_slices(services)
        for d in deployments:
            self._write_deployment_status(d)
        self._collect_stale_pods()

    def _collect_stale_pods(self):
        """Deletes Pod objects a kubelet of this kind made that have no process here (left by
        an earlier FakeKubelet that stopped): as if their node had gone. Only this thread creates
        pods, and it adds them to the table before it gets here, so none of ours is taken."""
        for obj in self.server.list("pods"):
            meta = obj["metadata"]
            if POD_PORT_ANNOTATION not in (meta.get("annotations") or {}):
                continue
            with self._lock:
                ours = (meta.get("namespace"), meta["name"]) in self._pods
            if not ours:
                self._api(lambda: self.server.delete("pods", meta["namespace"], meta["name"]))

    # ---- the deployment controller

    def _owned(self, uid):
        with self._lock:
            return [p for p in self._pods.values() if p.owner_uid == uid and not p.done]

    def _sync_deployment(self, d, published):
        """published: {pod: ready} as the slices last showed it."""
        meta, spec = d["metadata"], d.get("spec") or {}
        desired = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        if not (template.get("spec") or {}).get("containers"):
            return
        h = template_hash(template)
        now = time.monotonic()
        owned = self._owned(meta["uid"])
        with self._lock:
            active = [p for p in owned if not p.terminating]
            new = [p for p in active if p.hash == h]
            old = [p for p in active if p.hash != h]
            any_old = any(p.hash != h for p in owned)
            available = {id(p): p.available(now) and published.get(p, False) for p in active}
            rank = {id(p): (p.ready, -(p.ready_since or 0), -p.restart_count, -p.created)
                    for p in active}
        ranked = lambda pods: sorted(pods, key=lambda p: rank[id(p)])  # noqa: E731
        to_delete, to_create = [], 0
        if (spec.get("strategy") or {}).get("type") == "Recreate":
            if old:
                to_delete = old
            elif not any_old:
                to_create = max(0, desired - len(new))
                to_delete = ranked(new)[:max(0, len(new) - desired)]
        else:
            surge, unavailable = rolling_params(spec, desired)
            total = len(new) + len(old)
            if len(new) < desired:
                to_create = min(desired - len(new), max(0, desired + surge - total))
            elif len(new) > desired:
                to_delete = ranked(new)[:len(new) - desired]
            if old:
                min_available = desired - unavailable
                new_unavailable = sum(1 for p in new if not available[id(p)])
                room = total - min_available - new_unavailable
                unhealthy = ranked([p for p in old if not available[id(p)]])
                to_delete += unhealthy[:max(0, room)]
                healthy = ranked([p for p in old if available[id(p)]])
                available_now = sum(1 for p in new + old if available[id(p)])
                to_delete += healthy[:max(0, available_now - min_available)]
        with self._lock:
            for pod in to_delete:
                pod.terminating = True
                pod.wake.set()
        for _ in range(to_create):
            self._create_pod(d, template, h)

    def _free_port(self):
        """A port free now, below the kernel's ephemeral range: the pod binds it only when its
        process starts (and again on each restart), and no `--port 0` server or outgoing
        connection elsewhere on the machine is handed one of these meanwhile."""
        low = 32768
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
                low = min(low, int(f.read().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
        while True:
            port = random.randrange(max(1024, low - 12000), low)
            with _used_ports_lock:
                if port in _used_ports:
                    continue
            try:
                with socket.socket() as s:
                    s.bind((POD_IP, port))
            except OSError:
                continue
            with _used_ports_lock:
                if port not in _used_ports:
                    _used_ports.add(port)
                    return port

    def _create_pod(self, d, template, h):
        meta = d["metadata"]
        pod = _Pod(meta["namespace"], meta["name"], meta["uid"], h, copy.deepcopy(template),
                   self._free_port(), float(d["spec"].get("minReadySeconds") or 0))
        spec = copy.deepcopy(template["spec"])
        spec["nodeName"] = NODE_NAME
        first = spec["containers"][0]
        if first.get("ports"):
            first["ports"][0]["containerPort"] = pod.port
        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": f"{meta['name']}-{h}-", "namespace": pod.namespace,
                            "labels": dict(pod.labels),
                            "annotations": dict((template.get("metadata") or {})
                                                .get("annotations") or {},
                                                **{POD_PORT_ANNOTATION: str(pod.port)}),
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                 "name": meta["name"], "uid": meta["uid"],
                                                 "controller": True,
                                                 "blockOwnerDeletion": True}]},
               "spec": spec}
        created = self.server.create(obj)
        pod.name, pod.uid = created["metadata"]["name"], created["metadata"]["uid"]
        pod.thread = threading.Thread(target=self._supervise, args=(pod,), daemon=True,
                                      name=f"fake-kubelet-{pod.name}")
        with self._lock:
            self._pods[(pod.namespace, pod.name)] = pod
        pod.thread.start()

    def _write_deployment_status(self, d):
        meta, spec = d["metadata"], d.get("spec") or {}
        desired = int(spec.get("replicas", 1))
        h = template_hash(spec.get("template") or {})
        now = time.monotonic()
        owned = self._owned(meta["uid"])
        with self._lock:
            active = [p for p in owned if not p.terminating]
            counts = {"replicas": len(active),
                      "updatedReplicas": sum(1 for p in active if p.hash == h),
                      "readyReplicas": sum(1 for p in active if p.ready),
                      "availableReplicas": sum(1 for p in active if p.available(now))}
            old_left = any(p.hash != h for p in owned)
        _, unavailable = rolling_params(spec, desired)
        if (spec.get("strategy") or {}).get("type") == "Recreate":
            unavailable = desired
        old = d.get("status") or {}
        conditions = {c.get("type"): c for c in old.get("conditions") or []}
        rs = f"{meta['name']}-{h}"
        wall = _now()

        def condition(type_, status, reason, message, progress=False):
            prev = conditions.get(type_) or {}
            same = prev.get("status") == status and prev.get("reason") == reason
            return {"type": type_, "status": status,
                    "lastUpdateTime": prev.get("lastUpdateTime", wall)
                    if same and not progress else wall,
                    "lastTransitionTime": prev.get("lastTransitionTime", wall)
                    if prev.get("status") == status else wall,
                    "reason": reason, "message": message}

        ok = counts["availableReplicas"] >= desired - unavailable
        available = condition("Available", "True" if ok else "False",
                              "MinimumReplicasAvailable" if ok else "MinimumReplicasUnavailable",
                              "Deployment has minimum availability." if ok else
                              "Deployment does not have minimum availability.")
        key = (h, tuple(sorted(counts.items())), meta.get("generation"))
        last_key, last_progress = self._progress.get(meta["uid"], (None, now))
        moved = key != last_key
        if moved:
            self._progress[meta["uid"]] = (key, now)
            last_progress = now
        complete = (counts["updatedReplicas"] == desired and counts["replicas"] == desired
                    and counts["availableReplicas"] == desired and not old_left)
        deadline = float(spec.get("progressDeadlineSeconds") or 600)
        if complete:
            progressing = condition("Progressing", "True", "NewReplicaSetAvailable",
                                    f'ReplicaSet "{rs}" has successfully progressed.')
        elif now - last_progress > deadline:
            progressing = condition("Progressing", "False", "ProgressDeadlineExceeded",
                                    f'ReplicaSet "{rs}" has timed out progressing.')
        else:
            progressing = condition("Progressing", "True", "ReplicaSetUpdated",
                                    f'ReplicaSet "{rs}" is progressing.', progress=moved)
        status = dict(counts, observedGeneration=meta.get("generation", 1),
                      unavailableReplicas=max(0, desired - counts["availableReplicas"]),
                      conditions=[available, progressing])
        if status != old:
            try:
                self.server.update_status("deployments", meta["namespace"], meta["name"],
                                          status)
            except ApiError as e:
                if e.code != 404:
                    raise

    # ---- the EndpointSlice controller

    def _sync_slices(self, services):
        """Writes every Service's slices; returns {pod: ready} as written."""
        with self._lock:
            pods = [(p.namespace, p.name, p.uid, dict(p.labels), p.ready, p.terminating, p)
                    for p in self._pods.values() if not p.done and p.uid]
        complete = True
        for svc in services:
            selector = (svc.get("spec") or {}).get("selector")
            if not selector:
                continue  # a Service without a selector: its slices are someone else's
            try:
                self._sync_service_slices(svc, [p for p in pods if p[0] ==
                                                svc["metadata"]["namespace"]
                                                and _labels_match(selector, p[3])])
            except ApiError as e:
                if e.code not in (404, 409):
                    raise
                complete = False
        if complete:
            # Each terminating pod's endpoints are out as terminating (or it is in no slice):
            # its supervisor may go on to stop it (see _terminate).
            with self._lock:
                for *_, terminating, pod in pods:
                    if terminating and not pod.terminating_published:
                        pod.terminating_published = True
                        pod.wake.set()
        return {pod: ready for *_, ready, _, pod in pods}

    def _sync_service_slices(self, svc, pods):
        meta, spec = svc["metadata"], svc.get("spec") or {}
        groups = {}
        for _, name, uid, _, ready, terminating, pod in sorted(pods, key=lambda p: p[1]):
            ports = []
            for sp in spec.get("ports") or []:
                port = pod.map_port(sp.get("targetPort", sp.get("port")))
                if port is None:
                    continue
                entry = {"name": sp.get("name", ""), "port": port,
                         "protocol": sp.get("protocol", "TCP")}
                if sp.get("appProtocol"):
                    entry["appProtocol"] = sp["appProtocol"]
                ports.append(entry)
            serving = ready
            endpoint = {"addresses": [POD_IP],
                        "conditions": {"ready": bool(spec.get("publishNotReadyAddresses"))
                                       or (serving and not terminating),
                                       "serving": serving, "terminating": terminating},
                        "nodeName": NODE_NAME,
                        "targetRef": {"kind": "Pod", "namespace": meta["namespace"],
                                      "name": name, "uid": uid}}
            key = json.dumps(ports, sort_keys=True)
            groups.setdefault(key, (ports, []))[1].append(endpoint)
        if not groups:
            groups[json.dumps(None)] = (None, [])  # the placeholder slice
        labels = {k: v for k, v in (meta.get("labels") or {}).items()
                  if k not in _RESERVED_SLICE_LABELS}
        labels[SERVICE_NAME_LABEL] = meta["name"]
        labels[MANAGED_BY_LABEL] = MANAGED_BY
        if spec.get("clusterIP") == "None":
            labels[HEADLESS_LABEL] = ""
        existing = self.server.list(
            "endpointslices", meta["namespace"],
            f"{SERVICE_NAME_LABEL}={meta['name']},{MANAGED_BY_LABEL}={MANAGED_BY}")
        by_ports = {}
        for s in existing:
            by_ports.setdefault(json.dumps(s.get("ports") or None, sort_keys=True), []).append(s)
        for key, (ports, endpoints) in sorted(groups.items()):
            matches = by_ports.get(key) or []
            body = {"addressType": "IPv4", "endpoints": endpoints}
            if ports is not None:
                body["ports"] = ports
            if matches:
                s = matches.pop(0)
                current = {k: s.get(k) for k in body}
                if current == body and s["metadata"].get("labels") == labels \
                        and ("ports" in s) == ("ports" in body):
                    continue
                new = copy.deepcopy(s)
                new.pop("ports", None)
                new.update(copy.deepcopy(body))
                new["metadata"]["labels"] = labels
                self.server.update(new)
            else:
                self.server.create(dict(
                    apiVersion="discovery.k8s.io/v1", kind="EndpointSlice",
                    metadata={"generateName": f"{meta['name']}-",
                              "namespace": meta["namespace"], "labels": labels,
                              "ownerReferences": [{"apiVersion": "v1", "kind": "Service",
                                                   "name": meta["name"], "uid": meta["uid"],
                                                   "controller": True,
                                                   "blockOwnerDeletion": True}]},
                    **copy.deepcopy(body)))
        for left in by_ports.values():
            for s in left:
                self.server.delete("endpointslices", meta["namespace"], s["metadata"]["name"])

    # ---- the kubelet proper: one supervisor thread per pod

    def _supervise(self, pod):
        try:
            self._supervise_pod(pod)
        except Exception as e:  # a bug here must not leave a process behind
            print(f"fake_kubelet: supervisor of {pod.name} failed: {e!r}", file=sys.stderr)
            with self._lock:
                proc = pod.proc
            if proc is not None and proc.poll() is None:
                _signal(proc, signal.SIGKILL)
                proc.wait()
            raise

    def _supervise_pod(self, pod):
        backoff = self.restart_backoff_s
        first = True
        while True:
            if self._stopping.is_set():
                return self._stop_now(pod)
            if pod.terminating:
                return self._terminate(pod)
            if not first:
                with self._lock:
                    pod.restart_count += 1
            first = False
            proc = self._start_process(pod)
            if proc is None:
                outcome, ran = "failed", 0.0
            else:
                began = time.monotonic()
                outcome = self._run_container(pod, proc)
                ran = time.monotonic() - began
                if outcome in ("stopping", "terminating"):
                    continue  # the loop head stops it
                self._record_exit(pod, proc)
            if ran >= 2 * self.max_restart_backoff_s:
                backoff = self.restart_backoff_s
            with self._lock:
                pod.waiting = ("CrashLoopBackOff", f"back-off {backoff:g}s restarting failed "
                                                   f"container={pod.container.get('name')} pod="
                                                   f"{pod.name}")
            self._publish(pod)
            end = time.monotonic() + backoff
            while not (self._stopping.is_set() or pod.terminating) and time.monotonic() < end:
                pod.wake.wait(end - time.monotonic())
                pod.wake.clear()
            backoff = min(backoff * 2, self.max_restart_backoff_s)

    def _argv_env(self, pod):
        c = pod.container
        meta = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                "labels": pod.labels,
                "annotations": (pod.template.get("metadata") or {}).get("annotations") or {}}
        env = container_env(c, meta)
        command = [expand(str(a), env) for a in c.get("command") or []]
        args = [expand(str(a), env) for a in c.get("args") or []]
        exe = self._executable(c.get("image", ""))
        if exe:
            argv = [exe] + command[1:] + args
        elif command and os.path.isabs(command[0]):
            argv = command + args
        else:
            return None, None, (f"no executable for image {c.get('image')!r} and no absolute "
                                "command")
        pod_dir = os.path.join(self.log_dir, pod.name)
        volumes = {v.get("name"): v for v in pod.template["spec"].get("volumes") or []}
        mounts = []
        for m in c.get("volumeMounts") or []:
            if "emptyDir" in (volumes.get(m.get("name")) or {}):
                local = os.path.join(pod_dir, "volumes", m["name"])
                os.makedirs(local, exist_ok=True)
                mounts.append((m["mountPath"], local))
        mounts.sort(key=lambda m: -len(m[0]))
        argv = substitute_argv(argv[:1] + _rewrite_mounts(argv[1:], mounts), pod.port)
        env = dict(env, HOSTNAME=pod.name)
        env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
        return argv, env, None

    def _executable(self, image):
        name = image.split("@")[0]
        base = name.rsplit("/", 1)[-1]
        for key in (image, name, name.rsplit(":", 1)[0] if ":" in base else name,
                    base.split(":")[0]):
            if key in self.executables:
                return self.executables[key]
        return None

    def _start_process(self, pod):
        argv, env, error = self._argv_env(pod)
        proc = None
        if argv is not None:
            pod_dir = os.path.join(self.log_dir, pod.name)
            os.makedirs(pod_dir, exist_ok=True)
            # Forked by this supervisor thread, which outlives the process: the parent-death
            # signal (tied to the forking thread) fires only when the test process dies.
            wrap = [_SETPRIV, "--pdeathsig", "KILL", "--"] if os.access(_SETPRIV, os.X_OK) \
                else []
            try:
                with open(os.path.join(self.log_dir, f"{pod.name}.log"), "ab") as log:
                    proc = subprocess.Popen(wrap + argv, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=pod_dir, env=env,
                                            start_new_session=True)
            except OSError as e:
                error = f"starting {argv[0]}: {e}"
        with self._lock:
            pod.argv = argv
            if proc is None:
                pod.waiting = ("RunContainerError", error)
            else:
                pod.proc = proc
                pod.phase = "Running"
                pod.running_since = _now()
                pod.waiting = None
                pod.started = "startupProbe" not in pod.container
        self._publish(pod)
        return proc

    def _record_exit(self, pod, proc):
        if proc.poll() is None:
            _signal(proc, signal.SIGKILL)
        proc.wait()
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        with self._lock:
            pod.last_terminated = {"exitCode": code,
                                   "reason": "Completed" if code == 0 else "Error",
                                   "startedAt": pod.running_since, "finishedAt": _now()}
            pod.running_since = None
            pod.started = False
            self._set_ready(pod, False)

    def _set_ready(self, pod, ready):  # REQUIRES self._lock
        if pod.ready != ready:
            pod.ready = ready
            pod.ready_since = time.monotonic() if ready else None
            pod.ready_transition = _now()

    def _probes(self, pod):
        """{kind: state} for the container's probes."""
        probes = {}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            spec = pod.container.get(kind)
            if not spec:
                continue
            fast = self.probe_period_s is not None
            probes[kind] = {
                "spec": spec,
                "period": self.probe_period_s if fast else float(spec.get("periodSeconds", 10)),
                "due": time.monotonic() + (0 if fast else float(spec.get("initialDelaySeconds",
                                                                         0))),
                "ok": 0, "failed": 0, "failing_since": None,
                # Liveness and startup probes kill: with the fast period they still give a
                # failing container the seconds its spec gives it (failureThreshold x
                # periodSeconds), so a slow start is not killed for answering late.
                "budget": float(spec.get("failureThreshold", 3)) *
                float(spec.get("periodSeconds", 10)) if fast and kind != "readinessProbe"
                else 0.0}
        return probes

    def _probe(self, pod, state):
        """Runs the probe if due; True/False for a result, None when not due."""
        now = time.monotonic()
        if now < state["due"]:
            return None
        state["due"] = now + state["period"]
        spec = state["spec"]
        ok = self._check(pod, spec, float(spec.get("timeoutSeconds", 1)))
        state["ok"], state["failed"] = (state["ok"] + 1, 0) if ok else (0, state["failed"] + 1)
        if ok:
            state["failing_since"] = None
            return True if state["ok"] >= int(spec.get("successThreshold", 1)) else None
        if state["failing_since"] is None:
            state["failing_since"] = now
        if state["failed"] >= int(spec.get("failureThreshold", 3)) and \
                now - state["failing_since"] >= state["budget"]:
            return False
        return None

    def _check(self, pod, spec, timeout):
        if "httpGet" in spec:
            return _http_get(pod, spec["httpGet"], timeout) is not None
        if "tcpSocket" in spec:
            port = pod.map_port(spec["tcpSocket"].get("port"))
            try:
                with socket.create_connection((POD_IP, port), timeout=timeout):
                    return True
            except (OSError, TypeError):
                return False
        return True  # exec and grpc probes: not run (see the header)

    def _run_container(self, pod, proc):
        """Probes until the process exits ('exited'), a liveness or startup probe kills it
        ('killed'), or the pod terminates or the kubelet stops."""
        probes = self._probes(pod)
        if "readinessProbe" not in probes:
            with self._lock:
                self._set_ready(pod, pod.started)
            self._publish(pod)
        while True:
            if self._stopping.is_set():
                return "stopping"
            if pod.terminating:
                return "terminating"
            if proc.poll() is not None:
                return "exited"
            with self._lock:
                started = pod.started
            if not started:
                result = self._probe(pod, probes["startupProbe"])
                if result is False:
                    self._stop_process(pod, proc, pod.grace_s)
                    return "killed"
                if result:
                    with self._lock:
                        pod.started = True
                        if "readinessProbe" not in probes:
                            self._set_ready(pod, True)
                    self._publish(pod)
            else:
                if "readinessProbe" in probes:
                    self._readiness(pod, probes["readinessProbe"])
                if "livenessProbe" in probes and \
                        self._probe(pod, probes["livenessProbe"]) is False:
                    self._stop_process(pod, proc, pod.grace_s)
                    return "killed"
            pod.wake.wait(min(0.05, self.probe_period_s or 0.05))
            pod.wake.clear()

    def _readiness(self, pod, state):
        result = self._probe(pod, state)
        if result is not None:
            with self._lock:
                changed = pod.ready != result
                self._set_ready(pod, result)
            if changed:
                self._publish(pod)
                self._wake.set()

    def _wait(self, pod, proc, until, probes):
        """Waits until the process exits, until passes or the kubelet stops, probing readiness
        meanwhile; returns 'exited', 'timeout' or 'stopping'."""
        while True:
            if proc.poll() is not None:
                return "exited"
            if self._stopping.is_set():
                return "stopping"
            if time.monotonic() >= until:
                return "timeout"
            if probes and "readinessProbe" in probes:
                self._readiness(pod, probes["readinessProbe"])
            pod.wake.wait(max(0.0, min(0.05, until - time.monotonic())))
            pod.wake.clear()

    def _stop_process(self, pod, proc, grace_s, until=None, probes=None):
        """SIGTERM, up to grace_s (or until), SIGKILL; returns once the process is reaped."""
        if proc.poll() is None:
            _signal(proc, signal.SIGTERM)
        self._wait(pod, proc, until or time.monotonic() + grace_s, probes)
        if self._stopping.is_set() and proc.poll() is None:
            self._wait(pod, proc, time.monotonic() + self.stop_grace_s, None)
        if proc.poll() is None:
            _signal(proc, signal.SIGKILL)
        proc.wait()

    def _stop_now(self, pod):
        with self._lock:
            proc = pod.proc
        if proc is not None:
            self._stop_process(pod, proc, self.stop_grace_s)

    def _terminate(self, pod):
        """A pod's deletion: deletionTimestamp, preStop, SIGTERM, grace, SIGKILL, Pod deleted."""
        start = time.monotonic()
        deadline = start + pod.grace_s
        self._wake.set()  # its endpoints turn terminating now
        # The real kubelet and EndpointSlice controller act on the deletion independently; this
        # fake lets the slices show the pod terminating first (for at most a second), so a test
        # always sees the terminating endpoint before the process stops serving or goes.
        until = min(deadline, start + 1.0)
        while not (pod.terminating_published or self._stopping.is_set()) and \
                time.monotonic() < until:
            pod.wake.wait(until - time.monotonic())
            pod.wake.clear()
        self._api(lambda: self.server.patch(
            "pods", pod.namespace, pod.name,
            {"metadata": {"deletionTimestamp": _now(),
                          "deletionGracePeriodSeconds": int(pod.grace_s)}}))
        with self._lock:
            proc = pod.proc if pod.proc is not None and pod.proc.poll() is None else None
        if proc is not None:
            probes = self._probes(pod) if pod.started else None
            hook = (pod.container.get("lifecycle") or {}).get("preStop") or {}
            if "httpGet" in hook and proc.poll() is None:
                _http_get(pod, hook["httpGet"], max(0.1, deadline - time.monotonic()))
            elif "sleep" in hook:
                self._wait(pod, proc, min(deadline, start + float(hook["sleep"].get(
                    "seconds", 0))), probes)
            elif _exec_sleep_seconds(hook) is not None:
                self._wait(pod, proc, min(deadline, start + _exec_sleep_seconds(hook)), probes)
            # Any other exec preStop hook would run inside the image: skipped (see the header).
            self._stop_process(pod, proc, 0, until=deadline, probes=probes)
            self._record_exit(pod, proc)
        if not self._stopping.is_set():
            self._api(lambda: self.server.delete("pods", pod.namespace, pod.name))
        with self._lock:
            pod.done = True
            self._pods.pop((pod.namespace, pod.name), None)
        self._wake.set()

    def _api(self, call):
        """A call into the server whose 404 (the object went meanwhile) is no error."""
        if self._stopping.is_set():
            return None
        try:
            return call()
        except ApiError as e:
            if e.code != 404:
                print(f"fake_kubelet: {e}", file=sys.stderr)
            return None

    def _publish(self, pod):
        """Writes the Pod's status (this pod's supervisor thread only)."""
        with self._lock:
            if pod.done or pod.object_gone:
                return
            status = self._pod_status(pod)
        self._api(lambda: self.server.update_status("pods", pod.namespace, pod.name, status))
        self._wake.set()  # its endpoints and its Deployment's status may change

    def _pod_status(self, pod):  # REQUIRES self._lock
        ready = "True" if pod.ready else "False"
        c = pod.container
        if pod.waiting:
            state = {"waiting": {"reason": pod.waiting[0], "message": pod.waiting[1]}}
        elif pod.running_since:
            state = {"running": {"startedAt": pod.running_since}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        container = {"name": c.get("name", ""), "image": c.get("image", ""), "imageID": "",
                     "ready": pod.ready, "started": pod.started,
                     "restartCount": pod.restart_count, "state": state,
                     "lastState": {"terminated": pod.last_terminated}
                     if pod.last_terminated else {}}
        if pod.proc is not None:
            container["containerID"] = f"fake://{pod.proc.pid}"

        def cond(type_, status, reason=None):
            out = {"type": type_, "status": status, "lastProbeTime": None,
                   "lastTransitionTime": pod.ready_transition if type_ in
                   ("Ready", "ContainersReady") else pod.start_time}
            if reason:
                out["reason"] = reason
            return out

        not_ready = None if pod.ready else "ContainersNotReady"
        return {"phase": pod.phase, "hostIP": POD_IP, "hostIPs": [{"ip": POD_IP}],
                "podIP": POD_IP, "podIPs": [{"ip": POD_IP}], "startTime": pod.start_time,
                "conditions": [cond("Initialized", "True"), cond("Ready", ready, not_ready),
                               cond("ContainersReady", ready, not_ready),
                               cond("PodScheduled", "True")],
                "containerStatuses": [container]}


def _signal(proc, sig):
    """Signals the process's group (its own session), or the process where that is gone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def _http_get(pod, get, timeout):
    """An httpGet probe or hook against the pod: the status code for 200-399, else None."""
    port = pod.map_port(get.get("port"))
    if port is None:
        return None
    host = get.get("host") or POD_IP
    headers = {"User-Agent": "kube-probe/1.30", "Accept": "*/*"}
    for h in get.get("httpHeaders") or []:
        headers[h.get("name")] = h.get("value", "")
    try:
        if (get.get("scheme") or "HTTP").upper() == "HTTPS":
            conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                               context=ssl._create_unverified_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("GET", get.get("path") or "/", headers=headers)
            r = conn.getresponse()
            r.read()
            return r.status if 200 <= r.status < 400 else None
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return None
