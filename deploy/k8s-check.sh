#!/usr/bin/env bash
# Renders the kustomize overlays (k8s/overlays/dev and prod) with `kubectl kustomize` and
# validates every object they hold:
#   - built-in kinds with kubernetes-validate (PyPI) in strict mode (unknown fields are
#     errors), against the oldest Kubernetes the manifests need (1.30: the preStop sleep
#     action) and the newest the validator knows. A built-in kind without a schema fails too.
#   - KEDA's ScaledObject, a CRD that kubernetes-validate has no schema for, against a
#     hand-written strict schema of the fields used here, and for what KEDA would refuse or
#     mis-scale on: its target Deployment exists and has no other autoscaler, its streams are
#     {POSTMESH_NAMESPACE}_{STREAM} and its consumers are durable names found in the code.
#     Any other kind outside Kubernetes fails: add it here first.
#   - Postmesh's own rules: each of the seven services has a ServiceAccount without a token, a
#     Deployment with probes (/readyz, /healthz) on its admin port, requests and limits, a
#     preStop and a grace period covering SHUTDOWN_DRAIN_SECS, a restricted securityContext,
#     scrape annotations, an autoscaler (HPA or ScaledObject), a PDB and a Service; every
#     variable name is one of docs/configuration.md's settings table; the dev overlay's NATS
#     configuration is deploy/nats.conf.
# kubernetes-validate is installed with pip into the tools cache outside the checkout when
# missing (deploy/pytool.sh). Needs kubectl
# (with its built-in kustomize) and python3.
set -euo pipefail

cd "$(dirname "$0")/.."
KUBERNETES_VALIDATE_VERSION=${KUBERNETES_VALIDATE_VERSION:-1.37.0}
# The oldest Kubernetes the manifests are for; the validator's newest is added.
K8S_MIN_VERSION=${K8S_MIN_VERSION:-1.30.0}
OVERLAYS=${OVERLAYS:-"dev prod"}

log() { echo "k8s-check: $*" >&2; }

ensure_kubectl() {
  if command -v kubectl >/dev/null 2>&1; then return 0; fi
  log "kubectl is missing: install it (its built-in kustomize renders the overlays)"
  exit 1
}

# shellcheck source=deploy/pytool.sh
. deploy/pytool.sh
ensure_validator() {
  pytool kubernetes-validate "$KUBERNETES_VALIDATE_VERSION"
}

# promtool checks the alert rules' PromQL when it is there or installs (Debian's prometheus).
ensure_promtool() {
  if command -v promtool >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing promtool (the Debian package prometheus)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 &&
        apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; } || true
  fi
  command -v promtool >/dev/null 2>&1
}

ensure_kubectl
ensure_validator
VENV="$(dirname "$PYTOOL_BIN")"

# The dev overlay's NATS runs with the users and permissions of deploy/nats.conf: a copy,
# since kustomize reads only files below the overlay.
if ! cmp -s deploy/nats.conf k8s/overlays/dev/nats.conf; then
  log "k8s/overlays/dev/nats.conf differs from deploy/nats.conf: copy it over"
  exit 1
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

latest=$("$VENV/bin/python" -c 'import kubernetes_validate.utils as u; print(u.latest_version())')
versions=("$K8S_MIN_VERSION")
[ "$latest" != "$K8S_MIN_VERSION" ] && versions+=("$latest")

failed=0
for overlay in $OVERLAYS; do
  out="$WORK/$overlay"
  mkdir -p "$out"
  log "$overlay: kubectl kustomize k8s/overlays/$overlay"
  kubectl kustomize "k8s/overlays/$overlay" >"$out/rendered.yaml"

  # Splits the render (built-in kinds to builtin.yaml) and checks everything that is not a
  # built-in schema's business: the CRDs and Postmesh's own rules.
  if ! "$VENV/bin/python" - "$overlay" "$out" <<'PY'; then
import json
import pathlib
import re
import sys

import jsonschema
import yaml

overlay, out = sys.argv[1], pathlib.Path(sys.argv[2])
docs = [d for d in yaml.safe_load_all((out / "rendered.yaml").read_text()) if d]
errors = []
notes = []


def err(msg):
    errors.append(msg)


# Kinds from outside Kubernetes that this script checks itself.
CRDS = {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "PrometheusRule")}
BUILTIN_GROUPS = re.compile(
    r"^(v1|(apps|batch|autoscaling|policy|networking\.k8s\.io|rbac\.authorization\.k8s\.io"
    r"|storage\.k8s\.io|scheduling\.k8s\.io|coordination\.k8s\.io|discovery\.k8s\.io)/v\w+)$")
builtin, crds = [], []
for d in docs:
    key = (d.get("apiVersion"), d.get("kind"))
    if key in CRDS:
        crds.append(d)
    elif BUILTIN_GROUPS.match(key[0] or ""):
        builtin.append(d)
    else:
        err(f"{key[1]} ({key[0]}) is neither a built-in kind nor a CRD this script checks")
(out / "builtin.yaml").write_text(yaml.safe_dump_all(builtin, sort_keys=False))


def objs(kind):
    return [d for d in docs if d["kind"] == kind]


def named(kind, name):
    return next((d for d in objs(kind) if d["metadata"]["name"] == name), None)


# docs/configuration.md's settings table: every variable name the manifests may use.
section = pathlib.Path("docs/configuration.md").read_text()
allowed = set()
for line in section.splitlines():
    if line.startswith("| `"):
        allowed.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
if len(allowed) < 50:
    err(f"found only {len(allowed)} settings in docs/configuration.md's table")

# The seven services and their admin ports, as contracts/src/service.rs has them.
service_rs = pathlib.Path("contracts/src/service.rs").read_text()
ports = {
    re.sub(r"(?<!^)([A-Z])", r"-\1", variant).lower(): int(port)
    for variant, port in re.findall(r"Service::(\w+) => (\d{4}),", service_rs)
}
if len(ports) != 7:
    err(f"expected seven services with admin ports in contracts/src/service.rs, found {ports}")

configmaps = objs("ConfigMap")
config = {}
for cm in configmaps:
    if cm["metadata"]["name"].startswith("postmesh-config"):
        config = cm.get("data", {})
        for key in config:
            if key not in allowed:
                err(f"ConfigMap {cm['metadata']['name']}: {key} is not in docs/configuration.md's settings table")
if not config:
    err("no postmesh-config ConfigMap")
namespace = config.get("POSTMESH_NAMESPACE", "pm")
drain = float(config.get("SHUTDOWN_DRAIN_SECS", "30"))

secrets = {s["metadata"]["name"]: s for s in objs("Secret")}
for s in secrets.values():
    if s["metadata"]["name"].startswith("postmesh-secrets"):
        for key in list(s.get("data", {})) + list(s.get("stringData", {})):
            if key not in allowed:
                err(f"Secret {s['metadata']['name']}: {key} is not in docs/configuration.md's settings table")
# A Secret the overlay leaves out must be the documented external one.
external_keys = {
    line.split("=", 1)[0]
    for line in pathlib.Path("k8s/base/secrets.env").read_text().splitlines()
    if line and not line.startswith("#")
}
external_used = set()

autoscaled = {}
for hpa in objs("HorizontalPodAutoscaler"):
    ref = hpa["spec"]["scaleTargetRef"]
    autoscaled.setdefault((ref["kind"], ref["name"]), []).append(f"HPA {hpa['metadata']['name']}")


def crd_schema(api_version, kind, spec, metadata=None):
    """A strict schema of one object of a CRD: apiVersion, kind, metadata and spec."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": metadata or {"type": "object"},
            "spec": spec,
        },
    }


def check_scaledobjects():
    trigger_meta = {
        "nats-jetstream": {
            "type": "object",
            "additionalProperties": False,
            "required": ["natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"],
            "properties": {k: {"type": "string", "minLength": 1} for k in [
                "natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold",
                "activationLagThreshold", "useHttps"]},
        },
        "cpu": {
            "type": "object",
            "additionalProperties": False,
            "required": ["value"],
            "properties": {"value": {"type": "string", "pattern": "^[0-9]+$"}},
        },
    }
    # A strict subset of KEDA's keda.sh/v1alpha1 ScaledObject: the fields used here. KEDA
    # wants trigger metadata values as strings.
    schema = crd_schema(
        "keda.sh/v1alpha1",
        "ScaledObject",
        spec={
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"enum": sorted(trigger_meta)},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["Utilization", "AverageValue", "Value"]},
                            "metadata": {"type": "object"},
                        },
                        "allOf": [
                            {"if": {"properties": {"type": {"const": t}}},
                             "then": {"properties": {"metadata": m}}}
                            for t, m in trigger_meta.items()
                        ],
                    },
                },
            },
        },
        metadata={
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    )
    jetstream_rs = pathlib.Path("shared/src/jetstream/mod.rs").read_text()
    streams = set(re.findall(r'name: "([A-Z]+)"', jetstream_rs))
    for so in (d for d in crds if d["kind"] == "ScaledObject"):
        name = so["metadata"]["name"]
        for e in jsonschema.Draft202012Validator(schema).iter_errors(so):
            where = ".".join(str(p) for p in e.absolute_path)
            err(f"ScaledObject {name}: {where}: {e.message}")
        spec = so.get("spec", {})
        ref = spec.get("scaleTargetRef", {})
        kind = ref.get("kind", "Deployment")
        if not named(kind, ref.get("name")):
            err(f"ScaledObject {name}: its target {kind} {ref.get('name')} is not in the render")
        autoscaled.setdefault((kind, ref.get("name")), []).append(f"ScaledObject {name}")
        if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
            err(f"ScaledObject {name}: minReplicaCount > maxReplicaCount")
        sources = "\n".join(p.read_text() for p in
                            pathlib.Path("services", ref.get("name", "-"), "src").rglob("*.rs"))
        for trig in spec.get("triggers", []):
            meta = trig.get("metadata", {})
            if trig.get("type") == "cpu" and trig.get("metricType") is None:
                err(f"ScaledObject {name}: a cpu trigger needs metricType")
            if trig.get("type") != "nats-jetstream":
                continue
            stream, consumer = meta.get("stream", ""), meta.get("consumer", "")
            prefix, _, base = stream.partition("_")
            if prefix != namespace or base not in streams:
                err(f"ScaledObject {name}: stream {stream} is not {namespace}_<one of {sorted(streams)}>")
            if f'"{consumer}"' not in sources:
                err(f"ScaledObject {name}: consumer {consumer!r} is no durable name in services/{ref.get('name')}/src")
        notes.append(f"ScaledObject {name} (KEDA CRD): checked by this script's own schema, not kubernetes-validate")


check_scaledobjects()

# Every series a rule or the dashboard may name: the services' own (metrics::counter! etc.
# in the code; a *_seconds histogram also as _bucket, _sum and _count) and the NATS
# exporter's that k8s/overlays/prod/nats.yaml runs (-varz -jsz=all -healthz).
code = "\n".join(p.read_text() for d in ("services", "shared") for p in pathlib.Path(d).rglob("*.rs"))
own = set(re.findall(r'metrics::(?:counter|histogram|gauge)!\(\s*"(postmesh_[a-z_]+)"', code))
series = set(own)
for name in own:
    if name.endswith("_seconds"):
        series.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
series.update({"jetstream_consumer_num_pending", "jetstream_server_total_streams",
               "gnatsd_healthz_status", "gnatsd_varz_routes"})
if len(own) < 5:
    err(f"found only {len(own)} metrics in the code: {sorted(own)}")


def check_expr(where, expr):
    """A PromQL expression's brackets balance and each series it names exists."""
    depth = []
    pairs = {")": "(", "]": "[", "}": "{"}
    quoted = None
    for ch in expr:
        if quoted:
            quoted = None if ch == quoted else quoted
        elif ch in "\"'`":
            quoted = ch
        elif ch in "([{":
            depth.append(ch)
        elif ch in pairs:
            if not depth or depth.pop() != pairs[ch]:
                err(f"{where}: unbalanced {ch!r} in {expr}")
                return
    if depth or quoted:
        err(f"{where}: unclosed brackets or quotes in {expr}")
    unquoted = re.sub(r'"[^"]*"', '""', expr)
    for name in set(re.findall(r"\b((?:postmesh|jetstream|gnatsd)_[a-z_]+)\b", unquoted)):
        if name not in series:
            err(f"{where}: no service or exporter produces {name}")


def check_prometheusrules():
    rule = {
        "type": "object",
        "additionalProperties": False,
        "required": ["alert", "expr", "labels", "annotations"],
        "properties": {
            "alert": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]+$"},
            "expr": {"type": "string", "minLength": 1},
            "for": {"type": "string", "pattern": "^[0-9]+[smh]$"},
            "labels": {
                "type": "object",
                "required": ["severity"],
                "properties": {"severity": {"enum": ["warning", "critical"]}},
                "additionalProperties": {"type": "string"},
            },
            "annotations": {
                "type": "object",
                "required": ["summary", "description"],
                "additionalProperties": {"type": "string"},
            },
        },
    }
    schema = crd_schema(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        spec={
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "rules"],
                "properties": {
                    "name": {"type": "string"},
                    "interval": {"type": "string"},
                    "rules": {"type": "array", "minItems": 1, "items": rule},
                },
            }}},
        },
    )
    groups = []
    for pr in (d for d in crds if d["kind"] == "PrometheusRule"):
        name = pr["metadata"]["name"]
        for e in jsonschema.Draft202012Validator(schema).iter_errors(pr):
            where = ".".join(str(p) for p in e.absolute_path)
            err(f"PrometheusRule {name}: {where}: {e.message}")
        for g in pr.get("spec", {}).get("groups", []):
            groups.append(g)
            for r in g.get("rules", []):
                check_expr(f"PrometheusRule {name}: {r.get('alert')}", r.get("expr", ""))
        notes.append(f"PrometheusRule {name} (Prometheus Operator CRD): checked by this script's own schema and series")
    # For promtool, when the machine has it (the shell part runs it).
    (out / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False) if groups else "")
    return groups


def check_dashboards():
    for cm in objs("ConfigMap"):
        if cm["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
            continue
        for key, text in cm.get("data", {}).items():
            where = f"ConfigMap {cm['metadata']['name']}: {key}"
            try:
                dash = json.loads(text)
            except ValueError as e:
                err(f"{where}: not JSON: {e}")
                continue
            for field in ("uid", "title", "panels", "schemaVersion"):
                if field not in dash:
                    err(f"{where}: no {field}")
            ids = [p.get("id") for p in dash.get("panels", [])]
            if len(ids) != len(set(ids)) or None in ids:
                err(f"{where}: panel ids must be present and unique")
            for p in dash.get("panels", []):
                if not {"title", "type", "gridPos", "targets"} <= set(p):
                    err(f"{where}: panel {p.get('id')} needs title, type, gridPos and targets")
                for t in p.get("targets", []):
                    check_expr(f"{where}: panel {p.get('title')!r}", t.get("expr", ""))
            notes.append(f"{where}: Grafana dashboard, {len(ids)} panels checked")


def check_cluster():
    """The prod overlay's NATS cluster, its disruption budget, spreads and scalers."""
    sts = named("StatefulSet", "nats")
    if not sts:
        err("prod: no StatefulSet nats")
        return
    replicas = sts["spec"].get("replicas", 1)
    if replicas != 3:
        err(f"StatefulSet nats: {replicas} replicas, a JetStream cluster here has 3")
    if sts["spec"].get("podManagementPolicy") != "Parallel":
        err("StatefulSet nats: podManagementPolicy must be Parallel (a quorum needs two to start)")
    pod = sts["spec"]["template"]
    args = next(c for c in pod["spec"]["containers"] if c["name"] == "nats").get("args", [])
    opts = dict(a.split("=", 1) for a in args if "=" in a)
    routes = set(opts.get("--routes", "").split(","))
    want = {f"nats://nats-{i}.nats:6222" for i in range(replicas)}
    if routes != want:
        err(f"StatefulSet nats: --routes {sorted(routes)}, not every pod's {sorted(want)}")
    for flag in ("--cluster", "--cluster_name", "--store_dir"):
        if flag not in opts:
            err(f"StatefulSet nats: no {flag}")
    if "--jetstream" not in args or opts.get("--name") != "$(POD_NAME)":
        err("StatefulSet nats: needs --jetstream and --name=$(POD_NAME) (KEDA asks leaders by server name)")
    svc = named("Service", "nats")
    if not svc or svc["spec"].get("clusterIP") != "None":
        err("Service nats must be headless (the routes and KEDA resolve each pod's name)")
    nats_labels = pod["metadata"]["labels"]

    def zone_spread(spec, labels, strict):
        for t in spec.get("topologySpreadConstraints", []):
            if t.get("topologyKey") != "topology.kubernetes.io/zone":
                continue
            if strict and t.get("whenUnsatisfiable") != "DoNotSchedule":
                continue
            sel = t.get("labelSelector", {})
            keys = t.get("matchLabelKeys", [])
            plain = all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items())
            exprs = all(e.get("operator") == "Exists" and e["key"] in labels
                        for e in sel.get("matchExpressions", []))
            if plain and exprs and (sel.get("matchLabels") or keys) and all(k in labels for k in keys):
                return True
        return False

    if not zone_spread(pod["spec"], nats_labels, True):
        err("StatefulSet nats: needs a zone spread with DoNotSchedule that selects its pods")
    budgets = [p for p in objs("PodDisruptionBudget")
               if all(nats_labels.get(k) == v for k, v in p["spec"]["selector"].get("matchLabels", {}).items())]
    if not any(p["spec"].get("maxUnavailable") == 1 for p in budgets):
        err("StatefulSet nats: needs a PodDisruptionBudget with maxUnavailable: 1 (a drain takes one server)")
    if config.get("NATS_STREAM_REPLICAS") != str(replicas):
        err(f"NATS_STREAM_REPLICAS is {config.get('NATS_STREAM_REPLICAS')!r}, not the {replicas} NATS servers")
    endpoint = f"nats.{sts['metadata'].get('namespace')}.svc.cluster.local:8222"
    for so in (d for d in crds if d["kind"] == "ScaledObject"):
        for trig in so["spec"].get("triggers", []):
            got = trig.get("metadata", {}).get("natsServerMonitoringEndpoint")
            if trig.get("type") == "nats-jetstream" and got != endpoint:
                err(f"ScaledObject {so['metadata']['name']}: natsServerMonitoringEndpoint {got}, not {endpoint}")
    for svc_name in sorted(ports):
        dep = named("Deployment", svc_name)
        if not dep:
            continue
        labels = dep["spec"]["template"]["metadata"].get("labels", {})
        if not zone_spread(dep["spec"]["template"]["spec"], labels, False):
            err(f"Deployment {svc_name}: needs a zone spread that selects its own pods")
        for p in objs("PodDisruptionBudget"):
            sel = p["spec"]["selector"].get("matchLabels", {})
            if sel and all(labels.get(k) == v for k, v in sel.items()) and p["spec"].get("maxUnavailable") != 1:
                err(f"PodDisruptionBudget {p['metadata']['name']}: maxUnavailable must be 1")
        least = [h["spec"].get("minReplicas", 1) for h in objs("HorizontalPodAutoscaler")
                 if h["spec"]["scaleTargetRef"]["name"] == svc_name]
        least += [so["spec"].get("minReplicaCount", 0) for so in crds
                  if so["kind"] == "ScaledObject" and so["spec"]["scaleTargetRef"]["name"] == svc_name]
        if not least or min(least) < 2:
            err(f"Deployment {svc_name}: its autoscaler must keep at least 2 replicas (a drain takes one)")
    for worker in ("sender", "webhook-dispatcher"):
        if not any(so["kind"] == "ScaledObject" and so["spec"]["scaleTargetRef"]["name"] == worker
                   and any(t["type"] == "nats-jetstream" for t in so["spec"]["triggers"]) for so in crds):
            err(f"Deployment {worker}: a queue worker needs a ScaledObject on its consumer's lag")


check_prometheusrules()
check_dashboards()
if overlay == "prod":
    check_cluster()

restricted = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
}
for svc, port in sorted(ports.items()):
    dep = named("Deployment", svc)
    if not dep:
        err(f"{svc}: no Deployment")
        continue
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    where = f"Deployment {svc}"
    sa = named("ServiceAccount", spec.get("serviceAccountName", ""))
    if not sa or sa.get("automountServiceAccountToken") is not False:
        err(f"{where}: needs its own ServiceAccount with automountServiceAccountToken: false")
    if spec.get("automountServiceAccountToken") is not False:
        err(f"{where}: the pod must not mount a service account token")
    psc = spec.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True or psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        err(f"{where}: pod securityContext needs runAsNonRoot and seccompProfile RuntimeDefault")
    ann = pod["metadata"].get("annotations", {})
    if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(port) \
            or ann.get("prometheus.io/path") != "/metrics":
        err(f"{where}: Prometheus annotations must scrape /metrics on {port}")
    containers = spec["containers"]
    if len(containers) != 1:
        err(f"{where}: expected one container")
    c = containers[0]
    csc = c.get("securityContext", {})
    for k, v in restricted.items():
        if csc.get(k) is not v:
            err(f"{where}: container securityContext.{k} must be {v}")
    if csc.get("capabilities", {}).get("drop") != ["ALL"]:
        err(f"{where}: container must drop ALL capabilities")
    if csc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        err(f"{where}: container seccompProfile must be RuntimeDefault")
    named_ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if named_ports.get("admin") != port:
        err(f"{where}: container port 'admin' must be {port}")
    env = {e["name"]: e for e in c.get("env", [])}
    if env.get("ADMIN_ADDR", {}).get("value") != f"0.0.0.0:{port}":
        err(f"{where}: ADMIN_ADDR must be 0.0.0.0:{port}")
    for name, e in env.items():
        if name not in allowed:
            err(f"{where}: {name} is not in docs/configuration.md's settings table")
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            s = secrets.get(ref["name"])
            if s is None:
                if ref["name"] != "postmesh-secrets":
                    err(f"{where}: {name} refers to a Secret {ref['name']} that does not exist")
                elif ref["key"] not in external_keys:
                    err(f"{where}: {name}: key {ref['key']} is not in k8s/base/secrets.env")
                external_used.add(ref["key"])
            elif ref["key"] not in s.get("data", {}) and ref["key"] not in s.get("stringData", {}):
                err(f"{where}: {name}: Secret {ref['name']} has no key {ref['key']}")
    for source in c.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref and not named("ConfigMap", ref["name"]):
            err(f"{where}: envFrom names a ConfigMap {ref['name']} that is not in the render")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ("admin", port):
            err(f"{where}: {probe} must GET {path} on the admin port")
    res = c.get("resources", {})
    for part in ("requests", "limits"):
        if not {"cpu", "memory"} <= set(res.get(part, {})):
            err(f"{where}: resources.{part} needs cpu and memory")
    pre = c.get("lifecycle", {}).get("preStop", {})
    pre_secs = pre.get("sleep", {}).get("seconds")
    if pre_secs is None:
        err(f"{where}: needs a preStop sleep")
        pre_secs = 0
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < pre_secs + drain:
        err(f"{where}: terminationGracePeriodSeconds {grace} < preStop {pre_secs} + SHUTDOWN_DRAIN_SECS {drain:g}")
    labels = pod["metadata"].get("labels", {})

    def selects(obj):
        sel = obj["spec"].get("selector", {})
        sel = sel.get("matchLabels", sel) if obj["kind"] == "PodDisruptionBudget" else sel
        return sel and all(labels.get(k) == v for k, v in sel.items())

    if not any(selects(p) for p in objs("PodDisruptionBudget")):
        err(f"{where}: no PodDisruptionBudget selects its pods")
    if not any(selects(s) for s in objs("Service")):
        err(f"{where}: no Service selects its pods")
    scalers = autoscaled.get(("Deployment", svc), [])
    if len(scalers) != 1:
        err(f"{where}: needs exactly one autoscaler (HPA or ScaledObject), has {scalers or 'none'}")
    elif scalers[0].startswith("HPA"):
        hpa = named("HorizontalPodAutoscaler", scalers[0].split(" ", 1)[1])
        if not any(m.get("resource", {}).get("name") == "cpu" for m in hpa["spec"].get("metrics", [])):
            err(f"{where}: its HPA must scale on CPU")
    if "replicas" in dep["spec"]:
        err(f"{where}: leave replicas to the autoscaler")

if external_used:
    notes.append("the Secret postmesh-secrets is not rendered (created outside git); it must hold: "
                 + " ".join(sorted(external_keys)))

(out / "summary").write_text(f"{len(docs)} objects: {len(builtin)} built-in, {len(crds)} CRD\n")
for n in notes:
    print(f"k8s-check: {overlay}: note: {n}", file=sys.stderr)
for e in errors:
    print(f"k8s-check: {overlay}: ERROR {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
PY
    failed=1
  fi
  if [ -s "$out/rules.yaml" ]; then
    if ensure_promtool; then
      if promtool check rules "$out/rules.yaml" >"$out/promtool.log" 2>&1; then
        log "$overlay: promtool check rules: $(grep -c 'SUCCESS' "$out/promtool.log") file(s) valid"
      else
        sed "s|$out/||" "$out/promtool.log" >&2
        log "$overlay: promtool check rules: FAILED"
        failed=1
      fi
    else
      log "$overlay: note: promtool is not available: the rules were checked by schema and series only"
    fi
  fi
  [ -s "$out/builtin.yaml" ] || continue

  for version in "${versions[@]}"; do
    # Strict: unknown fields are errors. A WARN means a built-in kind had no schema: that fails
    # too, as kubernetes-validate would otherwise pass it unchecked.
    if ! "$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" "$out/builtin.yaml" >"$out/validate.log" 2>&1 ||
      grep -q . "$out/validate.log"; then
      sed "s|$out/||" "$out/validate.log" >&2
      log "$overlay: kubernetes-validate --strict -k $version: FAILED"
      failed=1
    else
      log "$overlay: kubernetes-validate --strict -k $version: every built-in object valid"
    fi
  done
  [ -f "$out/summary" ] && log "$overlay: $(cat "$out/summary")"
done

if [ "$failed" != 0 ]; then
  log "FAILED"
  exit 1
fi
log "both overlays render and validate"
