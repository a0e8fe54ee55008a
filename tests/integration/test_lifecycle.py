"""The daemon's life: health SERVING once ready (unix and TCP; the ready file names the bound
ports); SIGTERM drains in-flight work (it finishes correctly), health turns NOT_SERVING, new calls
are refused, and attnd exits 0 removing its socket and ready file; a drain timeout fails what is
still queued and stops what is running (a hard limit); a second signal exits at once."""

import os
import re
import signal
import socket
import subprocess
import threading
import time

import grpc
import pytest

import attnd_client as ac

from daemon import BACKEND, parse_metrics, sample, wait_until
from slow import SlowCall


def test_ready_file_and_health(daemon, client):
    with open(daemon.ready_file) as f:
        lines = f.read().split("\n")
    assert f"grpc {daemon.unix_target}" in lines
    host, port = daemon.tcp_target.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert socket.create_connection((host, int(port)), timeout=10)
    assert oct(os.stat(daemon.socket).st_mode & 0o777) == oct(0o660)
    assert client.health() == "SERVING"
    assert daemon.client(tcp=True).health() == "SERVING"
    with pytest.raises(ac.AttndError) as e:
        client.health("no.such.Service")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    m = parse_metrics(daemon.scrape())
    assert sample(m, "attnd_inflight_requests") == 0


def _drain_daemon(make_daemon, *flags):
    d = make_daemon("--workers=1", "--cpu-threads=1", *flags)
    c = d.client()
    return d, c, SlowCall(c, "drain", seconds=2.0)


def test_sigterm_drains_and_exits_zero(make_daemon):
    d, c, slow = _drain_daemon(make_daemon, "--drain-timeout=120s")
    watch = c.watch_health(timeout=120)
    statuses = []
    watcher = threading.Thread(target=_consume, args=(watch, statuses), daemon=True)
    watcher.start()
    wait_until(lambda: statuses == ["SERVING"], what="the health watch to start")
    session = c.session("drain")
    running = slow.submit()
    wait_until(lambda: slow.in_flight() > 0, what="in flight")
    queued = slow.submit(caller=session)
    # Admitted (its tensors pinned) before the drain starts: a call that reaches the daemon
    # after SIGTERM is refused, which is not what this test is about.
    wait_until(lambda: slow.in_flight() >= 2 * SlowCall.PINS, what="the queued call admitted")
    d.signal(signal.SIGTERM)
    wait_until(lambda: "NOT_SERVING" in statuses, what="health NOT_SERVING while draining")
    watch.cancel()  # an open Watch stream would hold the shutdown until --drain-timeout
    slow.check(running.result(timeout=300))  # in-flight work finishes...
    slow.check(queued.result(timeout=300))  # ... queued work too (within the timeout)
    session.close()
    assert d.wait(120) == 0, d.log()
    watcher.join(30)
    assert statuses[:2] == ["SERVING", "NOT_SERVING"], statuses
    assert not os.path.exists(d.socket) and not os.path.exists(d.ready_file)
    log = d.log()
    assert "draining" in log and "drained=true" in log, log
    with pytest.raises(ac.AttndError) as e:
        c.info(timeout=5)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def _consume(call, out):
    try:
        for status in call:
            out.append(status)
    except grpc.RpcError:
        pass


def test_drain_timeout_fails_queued_work(make_daemon):
    d, c, slow = _drain_daemon(make_daemon, "--drain-timeout=0.3s")
    running = slow.submit()
    wait_until(lambda: slow.in_flight() > 0, what="in flight")
    queued = slow.submit()
    wait_until(
        lambda: sample(parse_metrics(d.scrape()), "attnd_inflight_requests") >= 2, what="queued"
    )
    started = time.monotonic()
    d.signal(signal.SIGTERM)
    e = queued.exception(timeout=300)
    assert e is not None and e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), e
    running.exception(timeout=300)  # finished or cut off: either is fine
    assert d.wait(120) == 0, d.log()
    assert time.monotonic() - started < 60
    assert "drained=false" in d.log()


def test_drain_timeout_is_a_hard_limit(make_daemon):
    """--drain-timeout=2s with a call running for about 10 s: at the timeout the call is stopped
    (UNAVAILABLE) and attnd exits 0 within the timeout and its grace, not when the call would have
    ended; health is NOT_SERVING for the drain's duration."""
    d = make_daemon("--workers=1", "--cpu-threads=1", "--drain-timeout=2s")
    c = d.client()
    slow = SlowCall(c, "hard-drain", seconds=10.0, max_tokens=2048)
    if slow.expected_seconds < 6.0:
        pytest.skip(f"the slow call computes for {slow.expected_seconds:.1f} s only here")
    # The calibration calls' worker reports idle only after their replies: wait for it, so the
    # busy worker below is the slow call's.
    wait_until(
        lambda: sample(parse_metrics(d.scrape()), "attnd_workers_busy") == 0,
        interval=0.02,
        what="the calibration calls off the worker",
    )
    running = slow.submit(timeout=300)
    wait_until(
        lambda: sample(parse_metrics(d.scrape()), "attnd_workers_busy") >= 1,
        interval=0.02,
        what="the call running on a worker",
    )
    started = time.monotonic()
    d.signal(signal.SIGTERM)
    probe = ac.Client(d.unix_target)
    try:
        # The signal is handled asynchronously: NOT_SERVING comes within moments.
        wait_until(
            lambda: probe.health(timeout=10) == "NOT_SERVING",
            timeout=1.5,
            interval=0.02,
            what="health NOT_SERVING during the drain",
        )
    finally:
        probe.close()
    e = running.exception(timeout=300)
    assert e is not None and e.code == grpc.StatusCode.UNAVAILABLE, e
    assert d.wait(120) == 0, d.log()
    took = time.monotonic() - started
    # 2 s of drain + at most 2 s of grace + process exit; the call alone needed expected_seconds.
    assert took < max(5.0, 0.6 * slow.expected_seconds), (took, slow.expected_seconds)
    assert took < slow.expected_seconds, (took, slow.expected_seconds)
    log = d.log()
    assert "drained=false" in log, log
    assert "exiting without them" not in log, log


def test_second_signal_exits_at_once(make_daemon):
    d, c, slow = _drain_daemon(make_daemon, "--drain-timeout=300s")
    futures = [slow.submit() for _ in range(3)]
    wait_until(lambda: slow.in_flight() > 0, what="in flight")
    d.signal(signal.SIGINT)
    time.sleep(0.3)
    d.signal(signal.SIGTERM)
    assert d.wait(60) == 1
    for f in futures:
        f.exception(timeout=60)


def test_worker_spin_flag(attnd_bin, make_daemon, tmp_path):
    """--worker-spin: auto (the default) is 0 on the CPU backend and 1 ms on a GPU one
    (docs/OPERATIONS.md "CPU"), a duration is taken as given
    (the log and GetInfo's limits.worker_spin_ns say which), anything else stops attnd at start
    (exit 2) with the flag named."""

    def serving_spin(d):
        line = next(x for x in d.log().splitlines() if "attnd serving" in x)
        return re.search(r"worker_spin=(\S+)", line).group(1)

    auto = make_daemon("--workers=1", "--cpu-threads=1")
    want = ("0", 0) if BACKEND == "cpu" else ("1ms", 1_000_000)
    assert serving_spin(auto) == want[0]
    assert auto.client().info().limits.worker_spin_ns == want[1]
    quiet = make_daemon("--workers=1", "--cpu-threads=1", "--worker-spin=0")
    assert serving_spin(quiet) == "0"
    assert quiet.client().info().limits.worker_spin_ns == 0
    d = make_daemon("--workers=1", "--cpu-threads=1", "--worker-spin=250us")
    assert serving_spin(d) == "250us"
    assert d.client().health() == "SERVING"
    assert d.client().info().limits.worker_spin_ns == 250_000  # GetInfo says it too
    sock = f"unix:{tmp_path}/s.sock"
    for value in ("fast", "20ms", "-1ms"):
        p = subprocess.run(
            [attnd_bin, f"--listen={sock}", "--metrics-listen=", f"--worker-spin={value}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and "--worker-spin" in p.stderr, (value, p.returncode, p.stderr)
