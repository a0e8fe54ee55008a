"""deploy/k8s, offline (no cluster): yamllint; `kubectl kustomize` renders every overlay (kubectl's
`apply/create --dry-run=client` needs an API server for discovery even with --validate=false,
so it cannot run here); every rendered object and the example is checked against the
Kubernetes API schema of Debian's python3-kubernetes models (unknown fields, types, required
fields; the gRPC probe action is newer than those models and is checked here), the
ServiceMonitor against the Prometheus Operator CRD's fields it uses; then the settings zero-copy
and operations depend on; and the ConfigMap's flags are given to a real attnd, which must start,
answer grpc.health.v1 SERVING and drain on SIGTERM."""

import os
import re
import signal
import subprocess

import pytest
import yaml

from deploy_util import DEPLOY, ROOT, Daemon, attnd_bin, tool

K8S = os.path.join(DEPLOY, "k8s")
OVERLAYS = ["nvidia", "amd", "nvidia-exclusive", "amd-exclusive", "nvidia-mps"]
YAMLLINT_CONFIG = os.path.join(ROOT, "tests", "deploy", "yamllint.yaml")


def render(path):
    r = subprocess.run(
        [tool("KUBECTL", "kubectl"), "kustomize", path], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"kubectl kustomize {path}:\n{r.stderr}"
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def rendered():
    return {name: render(os.path.join(K8S, "overlays", name)) for name in OVERLAYS}


def example():
    with open(os.path.join(K8S, "examples", "frontend-sidecar.yaml")) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(objs, kind, name=None):
    found = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"want one {kind} {name or ''}, found {len(found)}"
    return found[0]


# ---- lint ----


def test_yamllint():
    yamllint = tool("YAMLLINT", "yamllint")
    r = subprocess.run(
        [yamllint, "-s", "-c", YAMLLINT_CONFIG, DEPLOY, os.path.join(ROOT, "tests", "deploy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    bad = subprocess.run(
        [yamllint, "-s", "-c", YAMLLINT_CONFIG, "-"],
        input="a: 1\na: 2\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0, "yamllint accepted a duplicated key"


# ---- schema ----


def _kube():
    import kubernetes.client as client

    return client


# Fields newer than the python3-kubernetes models (Kubernetes 1.22 API): model -> {json key:
# {field: type}}. Probe.grpc is GA since Kubernetes 1.27.
NEWER_FIELDS = {"V1Probe": {"grpc": {"port": "int", "service": "str"}}}
# Quantities are strings in the models; YAML may write them as numbers (nvidia.com/gpu: 8).
QUANTITY_PARENTS = {"limits", "requests", "size_limit"}


def check_type(value, typ, path, errors, parent=""):
    client = _kube()
    if isinstance(typ, dict):  # a field table (NEWER_FIELDS, RELABEL)
        if not isinstance(value, dict):
            errors.append(f"{path}: want an object, got {value!r}")
            return
        for k, v in value.items():
            if k not in typ:
                errors.append(f"{path}.{k}: unknown field")
            else:
                check_type(v, typ[k], f"{path}.{k}", errors)
    elif typ == "str":
        ok = isinstance(value, str) or (
            parent in QUANTITY_PARENTS
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        )
        if not ok:
            errors.append(f"{path}: want a string, got {value!r}")
    elif typ == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{path}: want an integer, got {value!r}")
    elif typ == "bool":
        if not isinstance(value, bool):
            errors.append(f"{path}: want true/false, got {value!r}")
    elif typ == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            errors.append(f"{path}: want a number, got {value!r}")
    elif typ == "object":
        pass  # IntOrString and friends
    elif typ.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: want a list, got {value!r}")
            return
        for i, v in enumerate(value):
            check_type(v, typ[5:-1], f"{path}[{i}]", errors, parent)
    elif typ.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: want a map, got {value!r}")
            return
        inner = typ[typ.index(",") + 1 : -1].strip()
        for k, v in value.items():
            check_type(v, inner, f"{path}.{k}", errors, parent)
    else:
        model = getattr(client, typ)
        if not isinstance(value, dict):
            errors.append(f"{path}: want a {typ} object, got {value!r}")
            return
        by_json = {j: a for a, j in model.attribute_map.items()}
        for k, v in value.items():
            if k in NEWER_FIELDS.get(typ, {}):
                check_type(v, NEWER_FIELDS[typ][k], f"{path}.{k}", errors)
            elif k not in by_json:
                errors.append(f"{path}.{k}: unknown field of {typ}")
            else:
                attr = by_json[k]
                check_type(v, model.openapi_types[attr], f"{path}.{k}", errors, attr)


def model_name(obj):
    version = obj["apiVersion"].split("/")[-1]
    return version[0].upper() + version[1:] + obj["kind"]


def schema_errors(obj):
    client = _kube()
    name = model_name(obj)
    assert hasattr(client, name), f"{obj['apiVersion']} {obj['kind']} is not a Kubernetes kind"
    errors = []
    check_type(obj, name, f"{obj['kind']}/{obj['metadata'].get('name')}", errors)
    try:  # the models' own required-field checks
        client.ApiClient()._ApiClient__deserialize(obj, name)
    except (ValueError, TypeError) as e:
        errors.append(f"{obj['kind']}/{obj['metadata'].get('name')}: {e}")
    return errors


# The ServiceMonitor fields used here, from the Prometheus Operator's monitoring.coreos.com/v1 CRD.
RELABEL = {
    "sourceLabels": "list[str]",
    "separator": "str",
    "targetLabel": "str",
    "regex": "str",
    "replacement": "str",
    "action": "str",
    "modulus": "int",
}
SERVICE_MONITOR_SPEC = {
    "selector": "V1LabelSelector",
    "jobLabel": "str",
    "targetLabels": "list[str]",
    "podTargetLabels": "list[str]",
    "namespaceSelector": {"any": "bool", "matchNames": "list[str]"},
    "endpoints": "endpoints",
    "sampleLimit": "int",
}
ENDPOINT = {
    "port": "str",
    "targetPort": "object",
    "path": "str",
    "scheme": "str",
    "interval": "str",
    "scrapeTimeout": "str",
    "honorLabels": "bool",
    "relabelings": "list[relabel]",
    "metricRelabelings": "list[relabel]",
}


def service_monitor_errors(obj):
    errors = []
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj) <= {"apiVersion", "kind", "metadata", "spec"}, set(obj)
    check_type(obj["metadata"], "V1ObjectMeta", "ServiceMonitor.metadata", errors)
    spec = obj["spec"]
    for k, v in spec.items():
        path = f"ServiceMonitor.spec.{k}"
        if k not in SERVICE_MONITOR_SPEC:
            errors.append(f"{path}: unknown field")
        elif k == "endpoints":
            for i, ep in enumerate(v):
                if "port" not in ep and "targetPort" not in ep:
                    errors.append(f"{path}[{i}]: needs port or targetPort")
                for ek, ev in ep.items():
                    if ek not in ENDPOINT:
                        errors.append(f"{path}[{i}].{ek}: unknown field")
                    elif ENDPOINT[ek] == "list[relabel]":
                        for j, r in enumerate(ev):
                            check_type(r, RELABEL, f"{path}[{i}].{ek}[{j}]", errors)
                    else:
                        check_type(ev, ENDPOINT[ek], f"{path}[{i}].{ek}", errors)
        else:
            check_type(v, SERVICE_MONITOR_SPEC[k], path, errors)
    if "selector" not in spec or "endpoints" not in spec:
        errors.append("ServiceMonitor.spec: needs selector and endpoints")
    return errors


def test_every_object_matches_the_api_schema(rendered):
    errors = []
    for name, objs in rendered.items():
        for obj in objs:
            errors += [f"{name}: {e}" for e in schema_errors(obj)]
    for obj in example():
        errors += [f"example: {e}" for e in schema_errors(obj)]
    (monitor,) = render(os.path.join(K8S, "monitoring"))
    errors += service_monitor_errors(monitor)
    assert not errors, "\n".join(errors)


def test_schema_check_can_fail():
    ds = find(render(os.path.join(K8S, "overlays", "nvidia")), "DaemonSet")
    c = ds["spec"]["template"]["spec"]["containers"][0]
    c["livenessProbe"]["grpc"]["prot"] = 1  # misspelt field
    c["ports"][0]["containerPort"] = "50051"  # string for an integer
    c["hostPID"] = True  # pod field on the container
    del c["name"]  # required
    errors = "\n".join(schema_errors(ds))
    for needle in (
        "grpc.prot: unknown field",
        "containerPort: want an integer",
        "hostPID: unknown field",
        "`name`, must not be `None`",
    ):
        assert needle in errors, f"{needle!r} not reported:\n{errors}"
    monitor = yaml.safe_load(
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\n"
        "metadata: {name: x}\nspec: {selector: {}, endpoints: [{path: /m}],"
        " interval: 5s}\n"
    )
    errors = "\n".join(service_monitor_errors(monitor))
    assert "needs port or targetPort" in errors and "spec.interval: unknown field" in errors


# ---- what the daemon and zero-copy need ----


def flags_of(objs):
    cm = find(objs, "ConfigMap", "attnd-flags")["data"]
    ds = find(objs, "DaemonSet", "attnd")
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "attnd"]
    expanded = []
    for a in c["args"]:
        for var in re.findall(r"\$\((\w+)\)", a):
            assert var in cm, f"{a}: {var} is not in the ConfigMap"
            a = a.replace(f"$({var})", cm[var])
        expanded.append(a)
    assert set(cm) == {v for a in c["args"] for v in re.findall(r"\$\((\w+)\)", a)}, (
        "a ConfigMap variable no flag uses"
    )
    return dict(a[2:].split("=", 1) for a in expanded), expanded


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_daemonset_settings(rendered, overlay):
    objs = rendered[overlay]
    ds = find(objs, "DaemonSet", "attnd")
    pod = ds["spec"]["template"]
    spec = pod["spec"]
    assert spec["hostPID"] is True and spec["hostIPC"] is True
    (c,) = [c for c in spec["containers"] if c["name"] == "attnd"]
    flags, _ = flags_of(objs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    listen = flags["listen"].split(",")
    unix = [a[len("unix:") :] for a in listen if a.startswith("unix:")]
    tcp = [a for a in listen if not a.startswith("unix")]
    assert tcp and int(tcp[0].rsplit(":", 1)[1]) == ports["grpc"]
    assert int(flags["metrics-listen"].rsplit(":", 1)[1]) == ports["metrics"]
    assert flags["metrics-listen"].startswith("0.0.0.0:"), "metrics must be reachable off-pod"
    # The kubelet's gRPC probes (grpc.health.v1) on the gRPC port.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    # The socket's directory is the shared hostPath.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    (sock,) = unix
    (vol,) = [n for n, p in mounts.items() if os.path.dirname(sock) == p]
    assert volumes[vol]["hostPath"]["path"] == os.path.dirname(sock)
    # Scrape annotations name the metrics port.
    ann = pod["metadata"]["annotations"]
    assert (
        ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["metrics"]
    )
    # Drain finishes inside the grace period.
    drain = flags["drain-timeout"]
    assert drain.endswith("s") and int(drain[:-1]) < spec["terminationGracePeriodSeconds"]
    # Non-root as the image's user; privileged only where AMD's shared layout needs it, and
    # never together with allowPrivilegeEscalation: false (the API server refuses that).
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    sc = c["securityContext"]
    assert sc.get("privileged", False) == (overlay == "amd")
    if sc.get("privileged"):
        assert sc.get("allowPrivilegeEscalation") is not False
    # Vendor specifics.
    image = c["image"]
    resources = c.get("resources", {}).get("limits", {})
    if overlay.startswith("nvidia"):
        assert image.endswith(":cuda") and spec["runtimeClassName"] == "nvidia"
        assert ("nvidia.com/gpu" in resources) == overlay.endswith("exclusive")
        if not overlay.endswith("exclusive"):
            env = {e["name"]: e["value"] for e in c["env"]}
            assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    else:
        assert image.endswith(":rocm")
        assert ("amd.com/gpu" in resources) == overlay.endswith("exclusive")
        if not overlay.endswith("exclusive"):
            assert {"/dev/kfd", "/dev/dri"} <= set(mounts.values())
        assert spec["securityContext"]["supplementalGroups"], "video/render groups"
    # Init container hands the socket directory to the daemon's user.
    (init,) = spec["initContainers"]
    assert "10001:10001" in " ".join(init["command"]) and init["image"] == image


@pytest.mark.parametrize("overlay", ["nvidia"])
def test_services_and_monitoring(rendered, overlay):
    objs = rendered[overlay]
    ds = find(objs, "DaemonSet", "attnd")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "attnd"]
    port_names = {p["name"] for p in c["ports"]}
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for svc in [o for o in objs if o["kind"] == "Service"]:
        assert svc["spec"]["selector"].items() <= pod_labels.items(), svc["metadata"]["name"]
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in port_names, (svc["metadata"]["name"], p)
    api = find(objs, "Service", "attnd")
    assert api["spec"]["internalTrafficPolicy"] == "Local"
    headless = find(objs, "Service", "attnd-pods")
    assert headless["spec"]["clusterIP"] == "None"
    ns = find(objs, "Namespace")["metadata"]["name"]
    # deploy/prometheus/prometheus.yml resolves the headless Service's DNS name.
    with open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")) as f:
        prom = yaml.safe_load(f)
    (job,) = prom["scrape_configs"]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == [f"attnd-pods.{ns}.svc.cluster.local"]
    assert sd["port"] == headless["spec"]["ports"][0]["port"]
    # The ServiceMonitor picks the API Service only (not the headless one: no double scrape).
    (monitor,) = render(os.path.join(K8S, "monitoring"))
    sel = monitor["spec"]["selector"]["matchLabels"]
    picked = [
        s["metadata"]["name"]
        for s in objs
        if s["kind"] == "Service" and sel.items() <= s["metadata"]["labels"].items()
    ]
    assert picked == ["attnd"]
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in api["spec"]["ports"]}
    assert monitor["metadata"]["namespace"] == ns and monitor["spec"]["namespaceSelector"][
        "matchNames"
    ] == [ns]


def test_shared_pod_example():
    (dep,) = example()
    spec = dep["spec"]["template"]["spec"]
    assert spec["shareProcessNamespace"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    shm = [n for n, v in volumes.items() if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert len(shm) == 1
    containers = {c["name"]: c for c in spec["containers"]}
    assert set(containers) == {"frontend", "attnd"}
    for c in containers.values():
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/dev/shm"] == shm[0], f"{c['name']}: /dev/shm is not the shared emptyDir"
        assert mounts["/run/attnd"] == "run-attnd"
    attnd = containers["attnd"]
    assert any(a == "--allow-client-shm=true" for a in attnd["args"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = attnd[probe]["exec"]["command"]
        assert cmd[0] == "attnctl" and cmd[-1] == "health"


def run_daemon_with(flags):
    """Starts the real attnd with `flags` (listen addresses replaced by private ones), checks
    grpc.health.v1 SERVING through attnctl, then SIGTERM and exit status 0 (drained)."""
    kept = [f for f in flags if not f.startswith(("--listen=", "--metrics-listen="))]
    with Daemon(*kept, binary=attnd_bin()) as d:
        r = d.attnctl("--connect-timeout=5s", "health")
        assert r.returncode == 0 and "SERVING" in r.stdout, r.stdout + r.stderr + d.log()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(60) == 0, d.log()


def test_configmap_flags_run_the_daemon(rendered):
    _, args = flags_of(rendered["nvidia"])
    help_text = subprocess.run(
        [attnd_bin(), "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    known = set(re.findall(r"^\s+--(\w+) \(", help_text, re.M))
    assert "listen" in known and "drain_timeout" in known
    for a in args:
        name = a[2:].split("=", 1)[0].replace("-", "_")
        assert name in known, f"{a}: attnd has no flag --{name}"
    run_daemon_with(args)


def test_example_flags_run_the_daemon():
    (dep,) = example()
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "attnd"]
    run_daemon_with(c["args"])
