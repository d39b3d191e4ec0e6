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
#   - Postmesh's own rules: each of the six services has a ServiceAccount without a token, a
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
CRDS = {("keda.sh/v1alpha1", "ScaledObject")}
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

# The six services and their admin ports, as contracts/src/service.rs has them.
service_rs = pathlib.Path("contracts/src/service.rs").read_text()
ports = {
    re.sub(r"(?<!^)([A-Z])", r"-\1", variant).lower(): int(port)
    for variant, port in re.findall(r"Service::(\w+) => (\d{4}),", service_rs)
}
if len(ports) != 6:
    err(f"expected six services with admin ports in contracts/src/service.rs, found {ports}")

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
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "kind": {"const": "ScaledObject"},
            "metadata": {
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
            "spec": {
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
        },
    }
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
