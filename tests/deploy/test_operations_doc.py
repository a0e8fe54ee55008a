"""docs/OPERATIONS.md and deploy/docker/README.md stay true: every metric family a running attnd
exports is explained, every alert has the section its runbook link points at, the walk from
image to dashboard names the deploy files it uses, and the documented `docker run` lines carry
the flags IPC needs and only flags attnd knows."""

import os
import re
import shlex
import subprocess

import pytest
import yaml

from deploy_util import DEPLOY, ROOT, Daemon, attnd_bin

OPERATIONS = os.path.join(ROOT, "docs", "OPERATIONS.md")
DOCKER_README = os.path.join(DEPLOY, "docker", "README.md")


def read(path):
    with open(path) as f:
        return f.read()


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.fixture(scope="module")
def families():
    with Daemon() as d:
        r = d.attnctl("run", "topk", "--preset=tiny", "--local-threads=1")
        assert r.returncode == 0, r.stdout + r.stderr
        text = d.scrape()
    return set(re.findall(r"^# TYPE (attnd_\w+) ", text, re.M))


def test_every_exported_metric_is_explained(families):
    doc = read(OPERATIONS)
    assert len(families) >= 15
    missing = sorted(f for f in families if f"`{f}`" not in doc)
    assert not missing, f"docs/OPERATIONS.md does not explain: {missing}"


def test_every_alert_has_its_runbook_section():
    doc = read(OPERATIONS)
    anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", doc, re.M)}
    with open(os.path.join(DEPLOY, "prometheus", "alerts.yml")) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    for rule in rules:
        assert rule["alert"] in doc, f"{rule['alert']} is not described"
        link = rule["annotations"]["runbook"]
        path, _, anchor = link.partition("#")
        assert path == "docs/OPERATIONS.md" and anchor in anchors, f"{rule['alert']}: {link}"


def test_walkthrough_names_the_deploy_files():
    doc = read(OPERATIONS)
    for path in (
        "deploy/docker/Dockerfile.cuda",
        "deploy/docker/Dockerfile.rocm",
        "deploy/k8s/overlays/nvidia",
        "deploy/k8s/monitoring",
        "deploy/prometheus/prometheus.yml",
        "deploy/prometheus/prometheus-static.yml",
        "deploy/prometheus/alerts.yml",
        "deploy/grafana/attnd.json",
        "deploy/grafana/provisioning/",
        "examples/frontend-sidecar.yaml",
    ):
        assert path in doc, f"docs/OPERATIONS.md never mentions {path}"
    for overlay in os.listdir(os.path.join(DEPLOY, "k8s", "overlays")):
        assert overlay in doc, f"overlay {overlay} is not explained"


def docker_run_lines(text):
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    lines = []
    for b in blocks:
        for cmd in b.replace("\\\n", " ").splitlines():
            if cmd.strip().startswith("docker run"):
                lines.append(shlex.split(cmd))
    return lines


def test_docker_run_lines():
    runs = docker_run_lines(read(DOCKER_README))
    assert len(runs) == 2
    help_text = subprocess.run(
        [attnd_bin(), "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    known = set(re.findall(r"^\s+--(\w+) \(", help_text, re.M))
    for argv in runs:
        (i,) = [i for i, a in enumerate(argv) if re.fullmatch(r"attnd:(cuda|rocm)", a)]
        docker, image, flags = argv[:i], argv[i], argv[i + 1 :]
        assert "--pid=host" in docker and "--ipc=host" in docker, argv
        assert "-v" in docker and "/run/attnd:/run/attnd" in docker
        if image.endswith("cuda"):
            assert "--gpus" in docker
        else:
            assert "--device=/dev/kfd" in docker and "--device=/dev/dri" in docker
            assert docker.count("--group-add") == 2
        assert "--stop-timeout" in docker
        names = {f[2:].split("=", 1)[0].replace("-", "_") for f in flags}
        assert names <= known, f"unknown attnd flags: {names - known}"
        assert "allow_client_shm" in names and "listen" in names
