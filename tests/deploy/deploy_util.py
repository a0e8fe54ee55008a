"""Helpers of the deploy/ checks: a real attnd on a private unix socket and loopback port 0
(addresses read from --ready-file), its /metrics, the metric names it exports, and the paths of
the repository and the tools (ATTND_BIN, ATTNCTL_BIN, PROMTOOL, PROMETHEUS, KUBECTL, YAMLLINT
override them).

    with Daemon() as d:
        names = exported_names(d.scrape())
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
READY_TIMEOUT = 30.0


def tool(env_name, name, required=True):
    """The path of a tool: $env_name, else `name` on PATH. Fails the test when missing."""
    path = os.environ.get(env_name) or shutil.which(name)
    if path is None and required:
        raise AssertionError(
            f"{name} not found (scripts/setup.sh installs it; {env_name} overrides the path)"
        )
    return path


def attnd_bin():
    path = os.environ.get("ATTND_BIN") or os.path.join(ROOT, "build", "server", "attnd")
    assert os.access(path, os.X_OK), f"attnd binary {path} missing (ATTND_BIN)"
    return path


def attnctl_bin():
    path = os.environ.get("ATTNCTL_BIN") or os.path.join(ROOT, "build", "client", "attnctl")
    assert os.access(path, os.X_OK), f"attnctl binary {path} missing (ATTNCTL_BIN)"
    return path


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers without port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """attnd on a temporary unix socket, TCP 127.0.0.1:0 and metrics 127.0.0.1:0 (override any
    flag by passing it; later flags win). Stopped with SIGTERM (then SIGKILL) on exit."""

    def __init__(self, *flags, binary=None):
        self.dir = tempfile.mkdtemp(prefix="attnd-deploy-")
        self.socket = os.path.join(self.dir, "attnd.sock")
        self.ready_file = os.path.join(self.dir, "ready")
        self.log_path = os.path.join(self.dir, "attnd.log")
        self.argv = [
            binary or attnd_bin(),
            f"--listen=unix:{self.socket},127.0.0.1:0",
            "--metrics-listen=127.0.0.1:0",
            "--cpu-threads=1",
            *flags,
            f"--ready-file={self.ready_file}",
        ]
        self.unix_target = f"unix:{self.socket}"
        self.tcp_target = None
        self.metrics_address = None
        self.proc = None

    def __enter__(self):
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT
        while not os.path.exists(self.ready_file):
            if self.proc.poll() is not None:
                raise AssertionError(f"attnd exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise AssertionError(f"attnd not ready after {READY_TIMEOUT} s")
            time.sleep(0.02)
        with open(self.ready_file) as f:
            for line in f:
                kind, address = line.split()
                if kind == "grpc" and not address.startswith("unix"):
                    self.tcp_target = address
                elif kind == "metrics":
                    self.metrics_address = address
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return False

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def scrape(self):
        assert self.metrics_address, "attnd runs without a metrics endpoint"
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10) as r:
            return r.read().decode()

    def attnctl(self, *args, timeout=60):
        """Runs attnctl against the unix socket; returns the CompletedProcess."""
        return subprocess.run(
            [attnctl_bin(), f"--target={self.unix_target}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)$", re.M)


def exported_names(exposition):
    """Every series name a Prometheus scrape of this text can hold: counters and gauges by
    name, histograms and summaries with their _bucket/_sum/_count (and the bare family name,
    which PromQL's native-histogram functions accept)."""
    names = set()
    for family, kind in _TYPE.findall(exposition):
        names.add(family)
        if kind == "histogram":
            names.update({family + "_bucket", family + "_sum", family + "_count"})
        elif kind == "summary":
            names.update({family + "_sum", family + "_count"})
    return names


# Series Prometheus adds to every target itself (not the daemon's).
SCRAPE_SERIES = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
}

_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "le",
}


def promql_metric_names(expr):
    """The metric names a PromQL expression selects. Grafana variables ($x, ${x}, [[x]]) are
    neutralised first; strings, label matchers, grouping clauses, durations and function
    names are not metric names."""
    e = re.sub(r"\[\[\w+\]\]|\$\{[^}]*\}|\$\w+", "1", expr)  # variables (ranges too)
    e = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', e)  # strings
    e = re.sub(r"\{[^{}]*\}", " ", e)  # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges, subqueries
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end() :].lstrip()
        if rest.startswith("("):  # a function call
            continue
        if word.lower() in _PROMQL_WORDS:
            continue
        if re.fullmatch(r"\d", e[m.start() - 1 : m.start()] or " "):  # 1e6, 5m inside a number
            continue
        names.add(word)
    return names


def grafana_variable_metric_names(query):
    """Metric names in a Grafana Prometheus variable query: label_values(selector, label),
    query_result(expr), or plain PromQL; label_values(label) and metrics(regex) name none."""
    if isinstance(query, dict):
        query = query.get("query", "")
    q = query.strip()
    m = re.fullmatch(r"label_values\((.*),\s*[a-zA-Z_]\w*\s*\)", q, re.S)
    if m:
        return promql_metric_names(m.group(1))
    if re.fullmatch(r"label_values\(\s*[a-zA-Z_]\w*\s*\)|metrics\(.*\)|label_names\(.*\)", q, re.S):
        return set()
    m = re.fullmatch(r"query_result\((.*)\)", q, re.S)
    return promql_metric_names(m.group(1) if m else q)


def dashboard_queries(dashboard):
    """(where, expr) of every panel target of a dashboard, rows' nested panels included."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append(
                        (f"panel {p.get('id')} '{p.get('title')}' {t.get('refId')}", t["expr"])
                    )
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    return out
