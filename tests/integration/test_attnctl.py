"""The C++ client against a real daemon through its CLI: `attnctl run <op> --json` for every
operator inline and through host regions (unary and on a Session), each checked by attnctl
against the local CPU implementation, zero bytes copied for regions; info / health / regions;
mutual TLS; attnctl processes running alongside Python clients. ATTNCTL_BIN (set by CMake when
the attnctl target exists) names the binary; without it these tests skip."""

import json
import subprocess

import numpy as np
import pytest

import cases
from pki import tls_flags

OPS = [
    "indexer_logits",
    "indexer_logits_paged",
    "topk",
    "sparse_mla",
    "mla_decode",
    "mla_prefill",
    "dsa_attention",
]
MODES = {
    "inline": [],
    "regions": ["--regions"],
    "session-regions": ["--regions", "--session"],
    "session-inline": ["--session"],
}


@pytest.fixture(scope="module")
def attnctl(attnctl_bin):
    if attnctl_bin is None:
        pytest.skip("attnctl is not built (client/attnctl); set ATTNCTL_BIN")
    return attnctl_bin


def run(attnctl, target, *args, timeout=300, check_exit=0):
    p = subprocess.run(
        [attnctl, f"--target={target}", "--json", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == check_exit, (
        f"attnctl {args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    )
    return json.loads(p.stdout) if p.stdout.strip() else None


@pytest.fixture(scope="module")
def built_ops(client):
    return {op.name for op in client.info().ops}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("op", OPS)
def test_run(attnctl, daemon, built_ops, op, mode):
    if op not in built_ops:
        pytest.skip(f"{op} is not built into this attnd")
    out = run(attnctl, daemon.unix_target, "run", op, *MODES[mode])
    assert out["pass"] is True and out["op"] == op, out
    assert out["checks"], out
    assert out["transport"] == ("regions" if "regions" in mode else "inline")
    assert out["api"] == ("session" if "session" in mode else "unary")
    if "regions" in mode:
        assert out["copied_bytes"] == 0, out
    else:
        assert out["copied_bytes"] > 0, out


def test_run_over_tcp_with_a_bigger_preset(attnctl, daemon):
    out = run(attnctl, daemon.tcp_target, "run", "sparse_mla", "--preset=decode")
    assert out["pass"] is True, out


@pytest.mark.parametrize("mode", ["inline", "regions"])
def test_run_paged_dsa_attention(attnctl, daemon, built_ops, mode):
    """The paged decode form (one block table for both caches, next_n 2) against the CPU."""
    if "dsa_attention" not in built_ops:
        pytest.skip("dsa_attention is not built into this attnd")
    out = run(
        attnctl, daemon.unix_target, "run", "dsa_attention", "--preset=paged_tiny", *MODES[mode]
    )
    assert out["pass"] is True and out["op"] == "dsa_attention", out
    assert any(c["name"] == "indices" for c in out["checks"]), out


@pytest.mark.parametrize(
    "op,args,field,want",
    [
        ("indexer_logits_paged", ["--precision=fast"], "precision", "fast"),
        ("indexer_logits_paged", [], "precision", "high"),
        ("dsa_attention", ["--index-precision=fast"], "index_precision", "fast"),
        (
            "dsa_attention",
            ["--preset=paged_tiny", "--index_precision=fast"],
            "index_precision",
            "fast",
        ),
        ("dsa_attention", [], "index_precision", "high"),
    ],
)
def test_run_indexer_precisions(attnctl, daemon, built_ops, op, args, field, want):
    """indexer_logits_paged's --precision and dsa_attention's --index-precision reach the call
    (the reply's stats name what ran; unset: high) and the check passes against the CPU."""
    if op not in built_ops:
        pytest.skip(f"{op} is not built into this attnd")
    out = run(attnctl, daemon.unix_target, "run", op, *args)
    assert out["pass"] is True and out["stats"][field] == want, out
    if op == "dsa_attention":
        assert out["stats"]["precision"] == "fast", out  # the attention output's, unchanged


def test_index_precision_is_refused_elsewhere(attnctl, daemon):
    out = run(
        attnctl,
        daemon.unix_target,
        "run",
        "sparse_mla",
        "--index-precision=fast",
        check_exit=2,
    )
    assert "index_precision" in out["error"], out
    out = run(
        attnctl, daemon.unix_target, "run", "dsa_attention", "--index-precision=slow", check_exit=2
    )
    assert "index_precision" in out["error"], out


def test_admin_commands(attnctl, daemon, client):
    info = run(attnctl, daemon.unix_target, "info")
    assert "cpu" in json.dumps(info)
    run(attnctl, daemon.unix_target, "health")
    with client.create_host_region("attnctl-listed", 4096):
        listed = run(attnctl, daemon.unix_target, "regions")
        assert "attnctl-listed" in json.dumps(listed)
    run(attnctl, "unix:/nonexistent/attnd.sock", "--connect-timeout=2s", "health", check_exit=3)


def test_mutual_tls(attnctl, make_daemon, pki):
    d = make_daemon(*tls_flags(pki, mutual=True), metrics=False)
    out = run(
        attnctl,
        d.tcp_target,
        f"--tls-ca={pki('ca.pem')}",
        f"--tls-cert={pki('client.pem')}",
        f"--tls-key={pki('client.key')}",
        "run",
        "topk",
    )
    assert out["pass"] is True
    run(
        attnctl,
        d.tcp_target,
        f"--tls-ca={pki('ca.pem')}",
        "--connect-timeout=5s",
        "run",
        "topk",
        check_exit=3,
    )


def test_alongside_python_clients(attnctl, daemon, client, rng):
    procs = [
        subprocess.Popen(
            [attnctl, f"--target={daemon.unix_target}", "--json", "run", op, "--regions"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for op in ["sparse_mla", "mla_decode", "topk"]
    ]
    try:
        for _ in range(3):
            case = cases.make_case("indexer_logits", rng)
            case.check(client.call(case.op, **case.arguments()).outputs)
        for p in procs:
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, stderr
            assert json.loads(stdout)["pass"] is True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert np.all([r.in_flight == 0 for r in client.list_regions()])


@pytest.mark.parametrize("ring", [False, True])
def test_bench_prepared_stream_ordered(attnctl, daemon, ring):
    """bench --stream_ordered --prepared, by RunPrepared RPCs or through a submission ring: every
    call's done word comes (the run waits for the last one) and the caller's CPU is reported."""
    args = ["bench", "topk", "--regions", "--stream_ordered", "--prepared", "--requests=300"]
    out = run(attnctl, daemon.unix_target, *args, *(["--ring"] if ring else []))
    assert out["errors"] == 0 and out["first_error"] == "", out
    assert out["path"] == "stream_ordered" and out["prepared"] is True, out
    assert out["ring"] is ring, out
    assert out["caller_cpu_us_per_call"] > 0, out
    assert out["verified"] is True, out


def test_bench_ring_needs_prepared_stream_ordered(attnctl, daemon):
    run(attnctl, daemon.unix_target, "bench", "topk", "--regions", "--ring", check_exit=2)
    run(attnctl, daemon.unix_target, "bench", "topk", "--regions", "--ring_wait", check_exit=2)


def test_bench_ring_wait_is_a_blocking_call(attnctl, daemon):
    """bench --ring --ring_wait: each call waited for through its done word; the overhead
    subtracts the compute of blocking RunPrepared calls made first."""
    args = ["bench", "sparse_mla", "--regions", "--stream_ordered", "--prepared", "--ring"]
    out = run(attnctl, daemon.unix_target, *args, "--ring_wait", "--requests=50", "--wait_spin=1ms")
    assert out["errors"] == 0 and out["first_error"] == "", out
    assert out["path"] == "blocking" and out["ring"] is True and out["ring_wait"] is True, out
    assert out["wait_spin_us"] == 1000, out
    assert out["compute_from"] == "blocking_run_prepared_p50", out
    assert out["calibration_calls"] >= 20, out
    assert out["server_compute_p50_us"] > 0, out
    assert out["p50_us"] > 0, out
    assert out["overhead_p50_us"] == pytest.approx(out["p50_us"] - out["server_compute_p50_us"])
    assert out["verified"] is True, out
