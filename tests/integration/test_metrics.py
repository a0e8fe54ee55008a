"""/metrics of a real daemon: the exposition passes Prometheus's own `promtool check metrics`
(Debian's prometheus package; PROMTOOL overrides the path) before and after traffic, every family
of docs/SERVICE.md "Metrics" is there, and the counters move exactly as calls are made: requests by op and
code, duration histograms, logical bytes and FLOPs equal to the calls' own stats, copied bytes
equal to the inline bytes and zero for region calls, region gauges."""

import os
import shutil
import subprocess

import grpc
import pytest

import attnd_client as ac

import cases
from daemon import parse_metrics, sample

FAMILIES = [
    "attnd_requests_total",
    "attnd_request_duration_seconds",
    "attnd_queue_duration_seconds",
    "attnd_compute_duration_seconds",
    "attnd_logical_bytes_total",
    "attnd_flops_total",
    "attnd_achieved_bandwidth_bytes_per_second",
    "attnd_achieved_flops_per_second",
    "attnd_copied_bytes_total",
    "attnd_pool_reserved_bytes",
    "attnd_pool_used_bytes",
    "attnd_pool_free_bytes",
    "attnd_device_up",
    "attnd_gpu_mps",
    "attnd_regions",
    "attnd_region_bytes",
    "attnd_graph_cache_total",
    "attnd_inflight_requests",
    "attnd_build_info",
]
HISTOGRAMS = [
    "attnd_request_duration_seconds",
    "attnd_queue_duration_seconds",
    "attnd_achieved_bandwidth_bytes_per_second",
    "attnd_achieved_flops_per_second",
]


@pytest.fixture(scope="module")
def promtool():
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found (Debian package prometheus; scripts/setup.sh installs it)")
    return path


def promtool_check(promtool, text):
    p = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, f"promtool check metrics:\n{p.stdout}\n{p.stderr}"


def test_promtool_accepts_exposition(daemon, client, promtool, rng):
    text = daemon.scrape()
    promtool_check(promtool, text)
    m = parse_metrics(text)
    info = client.info()
    assert sample(m, "attnd_build_info", backend=info.backend, version=info.version) == 1
    assert sample(m, "attnd_inflight_requests") == 0
    case = cases.make_case("sparse_mla", rng)
    client.call("sparse_mla", **case.arguments())
    with pytest.raises(ac.AttndError):
        client.sparse_mla(
            q=case.inputs["q"][:, :, :500],
            kv=case.inputs["kv"],
            indices=case.inputs["indices"],
            sm_scale=0.1,
        )
    text = daemon.scrape()
    promtool_check(promtool, text)  # with histogram buckets and an error code
    for family in FAMILIES:  # (compute's impl label exists once a call ran)
        assert f"# TYPE {family} " in text, f"{family} missing"


def _counts(m, op):
    return {
        "ok": sample(m, "attnd_requests_total", code="OK", op=op),
        "invalid": sample(m, "attnd_requests_total", code="INVALID_ARGUMENT", op=op),
        "duration": sample(m, "attnd_request_duration_seconds_count", op=op),
        "queue": sample(m, "attnd_queue_duration_seconds_count", op=op),
        # Summed over the implementations that ran ("cpu", or a GPU kernel's name).
        "compute": sum(
            v
            for (name, labels), v in m.items()
            if name == "attnd_compute_duration_seconds_count" and ("op", op) in labels
        ),
        "bandwidth": sample(m, "attnd_achieved_bandwidth_bytes_per_second_count", op=op),
        "bytes": sample(m, "attnd_logical_bytes_total", op=op),
        "flops": sample(m, "attnd_flops_total", op=op),
        "in": sample(m, "attnd_copied_bytes_total", direction="in"),
        "out": sample(m, "attnd_copied_bytes_total", direction="out"),
        "regions": sample(m, "attnd_regions", kind="host"),
        "region_bytes": sample(m, "attnd_region_bytes", kind="host"),
    }


def delta(before, after):
    return {k: after[k] - before[k] for k in before}


@pytest.mark.parametrize("op", ["sparse_mla", "mla_decode", "indexer_logits", "topk"])
def test_counters_move_with_calls(daemon, client, rng, op):
    case = cases.make_case(op, rng)
    before = _counts(parse_metrics(daemon.scrape()), op)
    stats = [client.call(op, **case.arguments()).stats for _ in range(3)]
    d = delta(before, _counts(parse_metrics(daemon.scrape()), op))
    assert d["ok"] == 3 and d["invalid"] == 0
    assert d["duration"] == d["queue"] == d["compute"] == d["bandwidth"] == 3
    assert d["bytes"] == pytest.approx(sum(s.logical_bytes for s in stats), rel=1e-9)
    assert d["bytes"] > 0
    assert d["flops"] == pytest.approx(sum(s.flops for s in stats), rel=1e-9)
    inline_in = sum(a.nbytes for a in case.inputs.values())
    assert d["in"] == 3 * inline_in == sum(s.copied_bytes_in for s in stats)
    assert d["out"] == sum(s.copied_bytes_out for s in stats) > 0

    # The same calls zero-copy: nothing copied, the region gauges count the region.
    size = cases.region_bytes(case)
    with client.create_host_region(f"metrics-{op}", size) as region:
        during = _counts(parse_metrics(daemon.scrape()), op)
        assert during["regions"] - before["regions"] == 1
        assert during["region_bytes"] - before["region_bytes"] == size
        for _ in range(2):
            cases.run_in_region(client, region, case)
        d = delta(during, _counts(parse_metrics(daemon.scrape()), op))
        assert d["ok"] == 2 and d["in"] == 0 and d["out"] == 0
    after = _counts(parse_metrics(daemon.scrape()), op)
    assert after["regions"] == before["regions"]
    assert after["region_bytes"] == before["region_bytes"]


def test_errors_counted_by_code(daemon, client, rng):
    case = cases.make_case("topk", rng)
    before = _counts(parse_metrics(daemon.scrape()), "topk")
    for k in [0, 5000]:
        with pytest.raises(ac.AttndError) as e:
            client.call("topk", **case.arguments(k=k))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    d = delta(before, _counts(parse_metrics(daemon.scrape()), "topk"))
    assert d["invalid"] == 2 and d["ok"] == 0 and d["compute"] == 0


def test_inflight_gauge_counts_running_calls(daemon, client):
    from daemon import wait_until
    from slow import SlowCall

    slow = SlowCall(client, "metrics-slow", seconds=1.0)
    try:
        future = slow.submit()
        wait_until(
            lambda: sample(parse_metrics(daemon.scrape()), "attnd_inflight_requests") == 1,
            what="inflight 1",
        )
        slow.check(future.result(timeout=300))
        assert sample(parse_metrics(daemon.scrape()), "attnd_inflight_requests") == 0
    finally:
        slow.close()


def test_metrics_disabled(make_daemon):
    d = make_daemon(metrics=False, tcp=False)
    assert d.metrics_address is None
    with open(d.ready_file) as f:
        assert "metrics" not in f.read()
    assert d.client().health() == "SERVING"


def test_renamed_and_split_families(daemon, client):
    """FLOP/s is attnd_achieved_flops_per_second; the pools are one family per kind of bytes,
    labelled by device only (so a sum over devices is a total); attnd_device_up is 1 per device;
    the old names are gone."""
    client.info()
    text = daemon.scrape()
    assert "attnd_achieved_flops " not in text and "attnd_achieved_flops_bucket" not in text
    assert "attnd_pool_bytes" not in text
    m = parse_metrics(text)
    for kind in ("reserved", "used", "free"):
        keys = [labels for name, labels in m if name == f"attnd_pool_{kind}_bytes"]
        assert keys, f"attnd_pool_{kind}_bytes has no sample"
        assert all({k for k, _ in labels} == {"device"} for labels in keys), keys
        if client.info().backend == "cpu":
            assert sample(m, f"attnd_pool_{kind}_bytes", device="cpu") == 0
    device = client.info().devices[0].uuid
    assert sample(m, "attnd_device_up", device=device) == 1


def test_mps_in_info_and_gauge(daemon, client):
    """docs/OPERATIONS.md "MPS": every device's GetInfo `mps` is a bool that attnd_gpu_mps{device}
    shows as 1/0; false on the CPU and HIP backends. On a CUDA daemon ATTND_EXPECT_MPS=1 or 0
    (scripts/run-gpu-suite.sh sets it) says which it must be."""
    info = client.info()
    m = parse_metrics(daemon.scrape())
    expect = os.environ.get("ATTND_EXPECT_MPS", "")
    assert info.devices
    for d in info.devices:
        assert isinstance(d.mps, bool), d
        if info.backend != "cuda":
            assert d.mps is False, f"{d.uuid}: MPS is CUDA's, backend {info.backend}"
        elif expect == "1":
            assert d.mps is True, f"{d.uuid}: ATTND_EXPECT_MPS=1 but the daemon is no MPS client"
        elif expect == "0":
            assert d.mps is False, f"{d.uuid}: ATTND_EXPECT_MPS=0 but an MPS server serves it"
        key = ("attnd_gpu_mps", frozenset({"device": d.uuid}.items()))
        assert key in m, f"attnd_gpu_mps has no series for {d.uuid}"
        assert m[key] == (1 if d.mps else 0), d.uuid
