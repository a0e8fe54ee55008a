"""End to end: a real attnd, a real Prometheus server (Debian's `prometheus`) on loopback
scraping it every second with deploy/prometheus/prometheus-static.yml (its target replaced by
the test daemon) and the alert rules loaded, traffic from attnctl, and Prometheus's HTTP API
queried until the request counter and the latency histogram hold exactly the calls made.
Then: every alert rule evaluates without error against the live series, every dashboard query
runs, and stopping the daemon turns AttndDown pending."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from deploy_util import DEPLOY, Daemon, dashboard_queries, free_port, tool

SCRAPE = "1s"
WAIT = 40.0  # seconds any one condition may take to show up in Prometheus


def parse_samples(exposition, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in exposition.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{(.*)\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:\\.|[^"\\])*)"', m.group(3) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(4))
    return total


class Prometheus:
    def __init__(self, config_text):
        self.dir = tempfile.mkdtemp(prefix="attnd-prom-")
        self.config = os.path.join(self.dir, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.proc = None
        self.url = None

    def start(self):
        binary = tool("PROMETHEUS", "prometheus")
        for _ in range(5):  # a free port can be taken before we bind it
            port = free_port()
            self.log = open(os.path.join(self.dir, "prometheus.log"), "wb")
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=self.log,
                stderr=subprocess.STDOUT,
            )
            self.url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                        if r.status == 200:
                            return self
                except OSError:
                    time.sleep(0.2)
            self.stop()
        raise AssertionError(f"prometheus did not start:\n{self.log_text()}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self):
        try:
            with open(os.path.join(self.dir, "prometheus.log"), errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def api(self, path, **params):
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def wait_for(self, what, predicate, timeout=WAIT):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(0.25)
        raise AssertionError(f"Prometheus never showed {what} (last: {last})\n{self.log_text()}")


def scalar(result):
    return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def stack():
    daemon = Daemon("--workers=2").__enter__()
    with open(os.path.join(DEPLOY, "prometheus", "prometheus-static.yml")) as f:
        config = yaml.safe_load(f)
    config["global"].update(scrape_interval=SCRAPE, evaluation_interval=SCRAPE)
    config["rule_files"] = [os.path.join(DEPLOY, "prometheus", "alerts.yml")]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "attnd"]
    job["static_configs"] = [{"targets": [daemon.metrics_address]}]
    prom = Prometheus(yaml.safe_dump(config))
    try:
        check = subprocess.run(
            [tool("PROMTOOL", "promtool"), "check", "config", prom.config],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        prom.start()
        yield daemon, prom
    finally:
        prom.cleanup()
        daemon.__exit__(None, None, None)


@pytest.fixture(scope="module")
def traffic(stack):
    """Calls through attnctl: one checked `run` each of topk and sparse_mla (their compute
    series appear with the first call), and once Prometheus has scraped those, a `bench` of
    sparse_mla (warm-up + measured calls), so rates over the window see it. Returns the
    daemon's own counts of OK calls."""
    daemon, prom = stack
    prom.wait_for("the attnd target up", lambda: scalar(prom.query('up{job="attnd"}')) == 1)
    for op in ("topk", "sparse_mla"):
        r = daemon.attnctl("run", op, "--preset=tiny", "--local-threads=1")
        assert r.returncode == 0, r.stdout + r.stderr
    prom.wait_for(
        "the first sparse_mla call",
        lambda: (
            scalar(prom.query('attnd_compute_duration_seconds_count{job="attnd", op="sparse_mla"}'))
            == 1
        ),
    )
    r = daemon.attnctl(
        "bench",
        "sparse_mla",
        "--preset=tiny",
        "--requests=20",
        "--warmup=3",
        "--concurrency=2",
        "--progress=false",
        "--local-threads=1",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    text = daemon.scrape()
    counts = {
        op: parse_samples(text, "attnd_requests_total", op=op, code="OK")
        for op in ("topk", "sparse_mla")
    }
    assert counts == {"topk": 1, "sparse_mla": 24}, counts
    return counts


def test_request_counter_reaches_prometheus(stack, traffic):
    _, prom = stack
    for op, n in traffic.items():
        expr = f'sum(attnd_requests_total{{job="attnd", op="{op}", code="OK"}})'
        prom.wait_for(f"{n} {op} calls", lambda e=expr, n=n: scalar(prom.query(e)) == n)
    rate = prom.wait_for(
        "a request rate",
        lambda: (
            scalar(prom.query('sum(rate(attnd_requests_total{job="attnd", op="sparse_mla"}[30s]))'))
            or None
        ),
    )
    assert rate > 0


def test_latency_histogram_reaches_prometheus(stack, traffic):
    _, prom = stack
    n = traffic["sparse_mla"]
    count = 'attnd_request_duration_seconds_count{job="attnd", op="sparse_mla"}'
    prom.wait_for(f"{n} observations", lambda: scalar(prom.query(count)) == n)
    inf = 'attnd_request_duration_seconds_bucket{job="attnd", op="sparse_mla", le="+Inf"}'
    assert scalar(prom.query(inf)) == n
    buckets = prom.query('attnd_request_duration_seconds_bucket{job="attnd", op="sparse_mla"}')
    assert len(buckets) >= 10, "the histogram's buckets are not all there"
    p99 = prom.wait_for(
        "a p99 latency",
        lambda: scalar(
            prom.query(
                'histogram_quantile(0.99, sum by (le) (rate('
                'attnd_request_duration_seconds_bucket{job="attnd", op="sparse_mla"}[30s])))'
            )
        ),
    )
    assert 0 < p99 < 60


def test_alert_rules_evaluate_cleanly(stack, traffic):
    _, prom = stack

    def evaluated():
        groups = prom.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        done = [r for r in rules if not r.get("lastEvaluation", "").startswith("0001")]
        return rules if rules and len(done) == len(rules) else None

    rules = prom.wait_for("every rule evaluated", evaluated)
    names = {r["name"] for r in rules}
    assert {
        "AttndDown",
        "AttndHighErrorRate",
        "AttndP99LatencyHigh",
        "AttndPoolNearLimit",
        "AttndQueueFull",
    } <= names
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, f"rules failing against live series: {bad}"
    firing = prom.api("alerts")["alerts"]  # pending ones included
    assert not firing, f"alerts on a healthy daemon: {firing}"


def test_dashboard_queries_run(stack, traffic):
    _, prom = stack
    with open(os.path.join(DEPLOY, "grafana", "attnd.json")) as f:
        dashboard = json.load(f)
    values = {
        "job": ".*",
        "instance": ".*",
        "op": ".*",
        "__rate_interval": "30s",
        "bw_ceiling": "4.3e12",
        "flops_ceiling": "7.9e14",
    }
    prom.wait_for(
        "the bench in the compute histogram",
        lambda: (
            scalar(prom.query('attnd_compute_duration_seconds_count{job="attnd", op="sparse_mla"}'))
            == traffic["sparse_mla"]
        ),
    )
    results = {}
    for where, expr in dashboard_queries(dashboard):
        q = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)
        try:
            results[where] = prom.query(q)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{where}: Prometheus refused {q}: {e.read().decode()}") from e

    def value(title, ref="A", op="sparse_mla"):
        (where,) = [w for w in results if f"'{title}' {ref}" in w]
        for sample in results[where]:
            if sample["metric"].get("op", op) == op:
                return float(sample["value"][1])
        return None

    # The panels that must show the traffic just made, with finite positive values. (The
    # graph cache is GPU-only, the pool's used fraction is 0/0 on the CPU backend, the error
    # panels need errors.)
    for title, ref in (
        ("Calls/s by op", "A"),
        ("Request latency by op (p50, p90, p99)", "C"),
        ("Queue wait by op (p50, p99)", "B"),
        ("Compute by op and implementation (p50, p99)", "A"),
        ("Achieved bandwidth by op", "A"),
        ("Achieved bandwidth by op", "B"),
        ("Achieved FLOP/s by op", "A"),
        ("Achieved FLOP/s by op", "B"),
        ("Fraction of the bandwidth ceiling by op", "A"),
    ):
        v = value(title, ref)
        assert v is not None and 0 < v < float("inf"), f"'{title}' {ref}: {v}"
    assert value("Achieved bandwidth by op", "C", op=None) == 4.3e12  # the ceiling line
    assert value("Daemons up") == 1


def test_daemon_down_turns_attnd_down_pending(stack, traffic):
    daemon, prom = stack
    daemon.__exit__(None, None, None)  # SIGTERM: drain and exit
    prom.wait_for("up == 0", lambda: scalar(prom.query('up{job="attnd"}')) == 0)
    alert = prom.wait_for(
        "AttndDown pending",
        lambda: [
            a
            for a in prom.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "AttndDown" and a["state"] in ("pending", "firing")
        ],
    )
    assert alert[0]["labels"]["instance"] == daemon.metrics_address
