"""Concurrency through a real daemon: many clients (unix and TCP, unary and sessions, inline and
regions) running mixed ops at once, each result checked; a full queue (RESOURCE_EXHAUSTED);
deadlines and cancellation honoured by the daemon's scheduler, seen in its metrics."""

import concurrent.futures
import itertools

import grpc
import pytest

import attnd_client as ac

import cases
from daemon import parse_metrics, sample, wait_until
from slow import SlowCall

MIXED = [
    "indexer_logits",
    "topk",
    "sparse_mla",
    "mla_decode",
    "mla_prefill",
    "indexer_logits_paged",
    "dsa_attention",
]


def _worker(daemon, index, built, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    ops = [op for op in MIXED if op in built]
    client = ac.Client(daemon.tcp_target if index % 2 else daemon.unix_target)
    try:
        client.wait_ready()
        region = client.create_host_region(f"conc-{index}", 8 << 20)
        session = client.session(f"conc-{index}") if index % 3 == 0 else None
        for i in range(4):
            case = cases.make_case(ops[(index + i) % len(ops)], rng)
            caller = session or client
            if i % 2:
                cases.run_in_region(client, region, case)
            else:
                case.check(
                    caller.call(case.op, **case.arguments(**cases.inline_outputs(case))).outputs
                )
        if session:
            session.close()
        region.close()
        return index
    finally:
        client.close()


def test_many_clients_mixed_ops(daemon, client):
    built = {op.name for op in client.info().ops}
    seeds = itertools.count(12345)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_worker, daemon, i, built, next(seeds)) for i in range(8)]
        assert sorted(f.result(timeout=300) for f in futures) == list(range(8))
    wait_until(
        lambda: not [r for r in client.list_regions() if r.name.startswith("conc-")],
        timeout=10,
        what="the sessions' regions to go",
    )


@pytest.fixture
def one_worker(make_daemon):
    """A daemon with one worker, one CPU thread and a queue of two (room for the call under
    test even while the worker has not yet dequeued the slow call ahead of it)."""
    d = make_daemon("--workers=1", "--cpu-threads=1", "--queue-capacity=2", tcp=False)
    c = d.client()
    slow = SlowCall(c, "busy", seconds=2.0)
    yield d, c, slow
    slow.close()


def codes(daemon, op="sparse_mla"):
    m = parse_metrics(daemon.scrape())
    return {
        code: sample(m, "attnd_requests_total", code=code, op=op)
        for code in ["OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "CANCELLED"]
    }


def inflight(daemon):
    return sample(parse_metrics(daemon.scrape()), "attnd_inflight_requests")


def test_queue_full_resource_exhausted(one_worker):
    d, c, slow = one_worker
    before = codes(d)
    futures = [slow.submit() for _ in range(8)]  # at most 1 running + 2 queued fit
    outcomes = []
    for f in futures:
        e = f.exception(timeout=300)
        outcomes.append(e.code if e else grpc.StatusCode.OK)
    full = outcomes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    ok = outcomes.count(grpc.StatusCode.OK)
    assert full >= 1 and 1 <= ok <= 4, outcomes  # 3 fit at once (+1 if one ended meanwhile)
    assert set(outcomes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, outcomes
    slow.check(futures[0].result())
    after = codes(d)
    assert after["RESOURCE_EXHAUSTED"] - before["RESOURCE_EXHAUSTED"] == full
    assert c.health() == "SERVING"


def test_deadline_exceeded_while_queued(one_worker):
    d, c, slow = one_worker
    before = codes(d)
    running = slow.submit()
    wait_until(lambda: slow.in_flight() > 0, what="the first call running")
    late = slow.submit(timeout=0.3)
    e = late.exception(timeout=300)
    assert e is not None and e.code == grpc.StatusCode.DEADLINE_EXCEEDED
    slow.check(running.result(timeout=300))
    # The daemon itself failed the queued call at its deadline, without running it.
    wait_until(
        lambda: codes(d)["DEADLINE_EXCEEDED"] > before["DEADLINE_EXCEEDED"],
        what="attnd_requests_total{code=DEADLINE_EXCEEDED}",
    )


def test_session_deadline_is_the_daemons(one_worker):
    d, c, slow = one_worker
    with c.session("deadline") as s:
        running = slow.submit(caller=s)
        wait_until(lambda: slow.in_flight() > 0, what="running")
        late = slow.submit(caller=s, timeout=0.2)  # timeout_seconds: enforced server-side
        e = late.exception(timeout=300)
        assert e is not None and e.code == grpc.StatusCode.DEADLINE_EXCEEDED, e
        slow.check(running.result(timeout=300))


def test_unary_cancellation(one_worker):
    d, c, slow = one_worker
    before = codes(d)
    running = slow.submit()
    wait_until(lambda: slow.in_flight() > 0, what="running")
    queued = slow.submit()
    wait_until(lambda: inflight(d) >= 2, what="the second call queued in the daemon")
    assert queued.cancel()
    e = queued.exception(timeout=60)
    assert e is not None and e.code == grpc.StatusCode.CANCELLED
    slow.check(running.result(timeout=300))
    wait_until(
        lambda: codes(d)["CANCELLED"] > before["CANCELLED"],
        what="attnd_requests_total{code=CANCELLED}",
    )
    assert codes(d)["OK"] - before["OK"] == 1, "the cancelled call ran"


def test_session_cancellation(one_worker):
    d, c, slow = one_worker
    before = codes(d)
    with c.session("cancel") as s:
        running = slow.submit(caller=s)
        wait_until(lambda: slow.in_flight() > 0, what="running")
        queued = slow.submit(caller=s)
        queued.cancel()
        e = queued.exception(timeout=300)
        assert e is not None and e.code == grpc.StatusCode.CANCELLED, e
        slow.check(running.result(timeout=300))
    assert codes(d)["OK"] - before["OK"] == 1, "the cancelled call ran"
