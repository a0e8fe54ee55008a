"""deploy/grafana: the dashboard is valid JSON with a sound layout, its queries name only
metrics that a running attnd exports (read from the daemon's own /metrics after a call, not
from a list kept here), every variable it uses is defined, and it shows what the issue asks for.
The provisioning files point at it. The PromQL itself is evaluated by a real Prometheus in
test_prometheus_e2e.py."""

import json
import os
import re

import pytest
import yaml

from deploy_util import (
    DEPLOY,
    SCRAPE_SERIES,
    Daemon,
    dashboard_queries,
    exported_names,
    grafana_variable_metric_names,
    promql_metric_names,
)

DASHBOARD = os.path.join(DEPLOY, "grafana", "attnd.json")
BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}


@pytest.fixture(scope="module")
def dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def exported():
    """The series names of a real daemon's /metrics, after one call of each of two ops (the
    compute histogram's family appears once something ran)."""
    with Daemon() as d:
        for op in ("topk", "sparse_mla"):
            r = d.attnctl("run", op, "--preset=tiny", "--local-threads=1")
            assert r.returncode == 0, f"attnctl run {op}: {r.stdout}\n{r.stderr}\n{d.log()}"
        return exported_names(d.scrape())


def unknown_metrics(dashboard, exported):
    known = exported | SCRAPE_SERIES
    bad = []
    for where, expr in dashboard_queries(dashboard):
        bad += [f"{where}: {n}" for n in sorted(promql_metric_names(expr) - known)]
    for v in dashboard["templating"]["list"]:
        if v.get("type") == "query":
            bad += [
                f"variable {v['name']}: {n}"
                for n in sorted(grafana_variable_metric_names(v["query"]) - known)
            ]
    return bad


def test_layout(dashboard):
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = []

    def walk(panels):
        for p in panels:
            ids.append(p["id"])
            g = p["gridPos"]
            assert 0 <= g["x"] and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
            if p["type"] != "row":
                assert p["targets"], f"panel {p['title']} has no query"
                assert p["datasource"]["uid"] == "${datasource}", p["title"]
                for t in p["targets"]:
                    assert t["datasource"]["uid"] == "${datasource}", p["title"]
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_variables_defined(dashboard):
    defined = {v["name"] for v in dashboard["templating"]["list"]} | BUILTIN_VARS
    texts = [expr for _, expr in dashboard_queries(dashboard)]
    texts += [json.dumps(v.get("query")) for v in dashboard["templating"]["list"]]
    used = set()
    for t in texts:
        used |= set(re.findall(r"\$\{?(\w+)", t))
    assert used <= defined, f"undefined variables: {sorted(used - defined)}"
    # The ceilings are numbers a query can divide by.
    for name in ("bw_ceiling", "flops_ceiling"):
        var = next(v for v in dashboard["templating"]["list"] if v["name"] == name)
        for o in var["options"]:
            assert float(o["value"]) > 1e11, (name, o)


def test_queries_name_only_exported_metrics(dashboard, exported):
    assert (
        "attnd_requests_total" in exported and "attnd_request_duration_seconds_bucket" in exported
    )
    bad = unknown_metrics(dashboard, exported)
    assert not bad, "the dashboard names metrics attnd does not export:\n" + "\n".join(bad)


def test_shows_what_operators_need(dashboard):
    used = set()
    for _, expr in dashboard_queries(dashboard):
        used |= promql_metric_names(expr)
    need = {
        "requests and errors per op": "attnd_requests_total",
        "latency percentiles": "attnd_request_duration_seconds_bucket",
        "queue wait": "attnd_queue_duration_seconds_bucket",
        "compute time per impl": "attnd_compute_duration_seconds_bucket",
        "achieved GB/s": "attnd_logical_bytes_total",
        "per-call bandwidth": "attnd_achieved_bandwidth_bytes_per_second_bucket",
        "achieved FLOP/s": "attnd_flops_total",
        "per-call FLOP/s": "attnd_achieved_flops_per_second_bucket",
        "pool reserved": "attnd_pool_reserved_bytes",
        "pool usage": "attnd_pool_used_bytes",
        "pool free": "attnd_pool_free_bytes",
        "regions": "attnd_regions",
        "region bytes": "attnd_region_bytes",
        "graph-cache hit rate": "attnd_graph_cache_total",
        "in flight": "attnd_inflight_requests",
        "queue depth": "attnd_queue_depth",
        "queue capacity": "attnd_queue_capacity",
        "busy workers": "attnd_workers_busy",
        "copied bytes": "attnd_copied_bytes_total",
    }
    missing = [f"{what} ({metric})" for what, metric in need.items() if metric not in used]
    assert not missing, f"no panel shows: {missing}"
    exprs = " ".join(e for _, e in dashboard_queries(dashboard))
    assert "$bw_ceiling" in exprs and "$flops_ceiling" in exprs, "no comparison with the ceilings"
    assert "histogram_quantile(0.99" in exprs


def test_checker_catches_a_wrong_name(dashboard, exported):
    """The name check can fail: a misspelt metric and a renamed histogram are reported."""
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][1]["targets"][0]["expr"] = 'sum(rate(attnd_request_total{op="x"}[5m]))'
    broken["panels"][2]["targets"][0]["expr"] = (
        "histogram_quantile(0.9, rate(attnd_request_latency_seconds_bucket[5m]))"
    )
    bad = unknown_metrics(broken, exported)
    assert any("attnd_request_total" in b for b in bad), bad
    assert any("attnd_request_latency_seconds_bucket" in b for b in bad), bad


@pytest.mark.parametrize(
    "expr,names",
    [
        (
            'sum by (op, le) (rate(a_bucket{job=~"$job", le!="+Inf"}[$__rate_interval]))',
            {"a_bucket"},
        ),
        ("histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m]))) > 1e6", {"x_bucket"}),
        ("a / on (instance) group_left (version) b offset 5m", {"a", "b"}),
        ("(x > 0) or vector($bw_ceiling) and on() y", {"x", "y"}),
        ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
        ("max_over_time(m[1h:5m]) unless bool 2", {"m"}),
    ],
)
def test_promql_metric_names(expr, names):
    assert promql_metric_names(expr) == names


def test_provisioning_points_at_the_dashboard():
    base = os.path.join(DEPLOY, "grafana", "provisioning")
    with open(os.path.join(base, "dashboards", "attnd.yaml")) as f:
        dash = yaml.safe_load(f)
    assert dash["apiVersion"] == 1
    (provider,) = dash["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    with open(os.path.join(base, "datasources", "prometheus.yaml")) as f:
        ds = yaml.safe_load(f)
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http")
