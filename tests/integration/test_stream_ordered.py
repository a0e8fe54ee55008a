"""Stream-ordered calls and prepared calls on the CPU daemon (docs/SERVICE.md "Stream-ordered
calls and prepared calls"), through the Python client and host regions: the op runs only after
the test writes `ready` (outputs stay NaN-poisoned and `done` unset until then), a caller that
never signals gets the failure bit and an asynchronous failure while another client's Session
completes its calls, a killed client's prepared calls and regions go with its lease, prepared
calls run many times over new data, and hostile signals and call ids are refused."""

import contextlib
import ctypes
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from attnd_client import AttndError
from attnd_client.stream_ordered import FAILURE_BIT, Signal, SignalWord

from cases import POISON, make_case, region_bytes
from daemon import BACKEND, parse_metrics, sample, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


def stage(region, case, views=None):
    """Copies the case's inputs into `region` (into `views` when given: the same memory again)
    and poisons its output views; returns (arguments, outputs)."""
    if views is None:
        region.reset()
        views = {n: region.put(a, case.input_dtypes[n]) for n, a in case.inputs.items()}
        views.update({n: region.array(dt, shape) for n, (dt, shape) in case.outputs.items()})
    else:
        for name, array in case.inputs.items():
            views[name][...] = array
    outs = {name: views[name] for name in case.outputs}
    for name, (dtype, _) in case.outputs.items():
        outs[name][...] = POISON[dtype]
    args = {n: views[n] for n in case.inputs}
    args.update(case.scalars)
    args.update(outs)
    return args, outs, views


def poisoned(case, outs):
    for name, (dtype, _) in case.outputs.items():
        view = outs[name]
        if dtype == "f32":
            if not np.isnan(view).all():
                return False
        elif not (view == POISON[dtype]).all():
            return False
    return True


@pytest.mark.parametrize("op", ["sparse_mla", "mla_decode", "topk"])
def test_runs_only_after_ready(client, rng, op):
    case = make_case(op, rng)
    with client.create_host_region(f"so-order-{op}", region_bytes(case) + 4096) as region:
        args, outs, _ = stage(region, case)  # (stage resets the region's allocations)
        ready, done = SignalWord(region), SignalWord(region)
        request_id = client.enqueue(
            op, ready=ready.signal(3), done=done.signal(5), timeout=30, **args
        )
        assert request_id > 0
        time.sleep(0.2)
        assert poisoned(case, outs), "the op ran before ready"
        assert done.get() == 0
        ready.set(2)  # not yet
        time.sleep(0.1)
        assert poisoned(case, outs) and done.get() == 0
        ready.set(3)
        assert done.wait(5, timeout=20) == 5
        case.check(outs)


def test_session_calls_run_in_order(client, rng):
    cases = [make_case("sparse_mla", rng) for _ in range(3)]
    size = sum(region_bytes(c) for c in cases) + 4096
    with client.session("so-order") as s:
        region = s.create_host_region("so-seq", size)
        ready = SignalWord(region)
        dones = [SignalWord(region) for _ in cases]
        staged = []
        for case in cases:
            region_views = {n: region.put(a, case.input_dtypes[n]) for n, a in case.inputs.items()}
            region_views.update({n: region.array(d, sh) for n, (d, sh) in case.outputs.items()})
            staged.append(stage(region, case, region_views))
        calls = []
        for i, (args, _, _) in enumerate(staged):
            # Only the first names a ready word; the others wait behind it.
            calls.append(
                s.enqueue(
                    "sparse_mla",
                    ready=ready.signal(1) if i == 0 else None,
                    done=dones[i].signal(i + 1),
                    **args,
                )
            )
        for call in calls:
            assert call.result(30) > 0
        time.sleep(0.2)
        assert all(d.get() == 0 for d in dones)
        assert all(poisoned(c, st[1]) for c, st in zip(cases, staged, strict=True))
        ready.set(1)
        for i, d in enumerate(dones):
            assert d.wait(i + 1, timeout=20) == i + 1
        for case, (_, outs, _) in zip(cases, staged, strict=True):
            case.check(outs)


def test_unsignalled_call_fails_alone(daemon, client, rng):
    case = make_case("sparse_mla", rng)
    other = daemon.client()  # a second client: its own connection and Session
    with client.session("so-stuck") as stuck, other.session("so-busy") as busy:
        region = stuck.create_host_region("so-stuck", region_bytes(case) + 4096)
        args, outs, _ = stage(region, case)  # (stage resets the region's allocations)
        ready, done = SignalWord(region), SignalWord(region)
        start = time.monotonic()
        call = stuck.enqueue(
            "sparse_mla", ready=ready.signal(1), done=done.signal(7), timeout=5.0, **args
        )
        server_id = call.result(30)
        # Meanwhile the other Session's calls complete, stream-ordered and blocking.
        busy_case = make_case("sparse_mla", rng)
        busy_region = busy.create_host_region("so-busy", region_bytes(busy_case) + 4096)
        for _ in range(3):
            b_args, b_outs, _ = stage(busy_region, busy_case)
            b_done = SignalWord(busy_region)
            busy.enqueue("sparse_mla", done=b_done.signal(1), **b_args).result(30)
            b_done.wait(1, timeout=20)
            busy_case.check(b_outs)
            busy_case.check(busy.call("sparse_mla", **busy_case.arguments()).outputs)
        # The stuck call still pending after all of that: the busy session did not wait for it.
        # (Its 5 s deadline is only room for the busy rounds on a loaded machine.)
        assert done.get() == 0, "the busy session waited for the stuck one"
        failure = stuck.failures.get(timeout=10)
        waited = time.monotonic() - start
        assert failure.request_id == call.request_id
        assert failure.server_request_id == server_id
        assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED, failure
        assert failure.op == "sparse_mla"
        assert 4.9 < waited < 8.0
        assert done.get() == 7 | FAILURE_BIT
        with pytest.raises(AttndError):
            done.wait(7, timeout=1)
        assert poisoned(case, outs), "the op ran on unready inputs"
    other.close()
    samples = parse_metrics(daemon.scrape())
    assert sample(samples, "attnd_signal_timeouts_total") >= 1
    assert sample(samples, "attnd_stream_ordered_calls_total", event="enqueued") >= 4
    assert sample(samples, "attnd_stream_ordered_calls_total", event="failed") >= 1


CHILD = """
import json, sys, time
import attnd_client as ac
from attnd_client.stream_ordered import SignalWord
client = ac.Client(sys.argv[1])
client.wait_ready()
s = client.session("so-doomed")
r = s.create_host_region("so-kill", 1 << 22)
T, H, S, K = 2, 16, 64, 8
args = dict(q=r.array("bf16", (T, H, 576)), kv=r.array("bf16", (S, 576)),
            indices=r.array("i32", (T, K)), out=r.array("bf16", (T, H, 512)),
            lse=r.array("f32", (T, H)), sm_scale=0.05)
call_id = s.prepare_call("sparse_mla", **args)
ready, done = SignalWord(r), SignalWord(r)
s.enqueue("sparse_mla", ready=ready.signal(1), done=done.signal(1), **args).result(30)
print(json.dumps({"lease": s.lease_id, "call_id": call_id}), flush=True)
time.sleep(600)
"""


def test_killed_client_prepared_calls_and_regions_go(daemon, client):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, daemon.unix_target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, f"child said nothing: {proc.poll()}"
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        held = json.loads(line)
        assert "so-kill" in {r.name for r in client.list_regions()}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    wait_until(
        lambda: "so-kill" not in {r.name for r in client.list_regions()},
        timeout=60,
        what="the dead client's region to go",
    )
    with pytest.raises(AttndError) as e:
        client.run_prepared(held["call_id"])
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "lease" in str(e.value)


def test_prepared_call_many_runs_and_hostile(daemon, client, rng):
    case = make_case("sparse_mla", rng)
    # Kept linked so that the test can register the object again under the same name.
    region = client.create_host_region("so-prep", region_bytes(case) + 4096, unlink_early=False)
    try:
        args, outs, views = stage(region, case)
        ready, done = SignalWord(region), SignalWord(region)
        call_id = client.prepare_call("sparse_mla", **args)
        for run in range(1, 7):
            case = make_case("sparse_mla", rng)  # the same shapes, new data
            stage(region, case, views)
            if run % 2:
                stats = client.run_prepared(call_id)
                assert not stats.enqueued and stats.impl  # the backend's implementation
            else:
                stats = client.run_prepared(
                    call_id, ready=ready.signal(run), done=done.signal(run), timeout=30
                )
                assert stats.enqueued
                time.sleep(0.05)
                assert poisoned(case, outs)
                ready.set(run)
                done.wait(run, timeout=20)
            case.check(outs)

        def refused(code, text, fn, *a, **kw):
            with pytest.raises(AttndError) as e:
                fn(*a, **kw)
            assert e.value.code == code, e.value
            assert text in str(e.value), e.value

        base = ready.offset
        bad = grpc.StatusCode.INVALID_ARGUMENT
        refused(
            bad, "aligned", client.run_prepared, call_id, ready=Signal(region.name, base + 4, 1)
        )
        refused(bad, "past", client.run_prepared, call_id, done=Signal(region.name, 1 << 40, 1))
        refused(
            bad,
            "past",
            client.run_prepared,
            call_id,
            done=Signal(region.name, region_size(region), 1),
        )
        refused(
            grpc.StatusCode.NOT_FOUND, "nope", client.run_prepared, call_id, Signal("nope", 0, 1)
        )
        refused(grpc.StatusCode.NOT_FOUND, "prepared call", client.run_prepared, call_id + 99999)
        # Values from the failure bit (2^62) up are refused, naming the field; nothing is queued.
        for value in (FAILURE_BIT, FAILURE_BIT | 5, 1 << 63, (1 << 64) - 1):
            ready.set(0)
            done.set(0)
            text = f"ready: value {value}"
            refused(bad, text, client.run_prepared, call_id, ready=ready.signal(value))
            refused(
                bad,
                f"done: value {value}",
                client.run_prepared,
                call_id,
                ready=ready.signal(1),
                done=done.signal(value),
            )
            refused(bad, text, client.enqueue, "sparse_mla", ready=ready.signal(value), **args)
            ready.set(1)
            time.sleep(0.02)
            assert done.get() == 0, hex(done.get())
        refused(bad, "inline", client.prepare_call, "sparse_mla", **case.arguments())
        # Another client (an anonymous TCP caller) can neither use the call nor the region.
        tcp = daemon.client(tcp=True)
        try:
            refused(grpc.StatusCode.NOT_FOUND, "prepared call", tcp.run_prepared, call_id)
            refused(grpc.StatusCode.NOT_FOUND, "prepared call", tcp.release_call, call_id)
            refused(
                grpc.StatusCode.NOT_FOUND,
                "so-prep",
                tcp.enqueue,
                "sparse_mla",
                ready=Signal("so-prep", base, 1),
                **case.arguments(),
            )
        finally:
            tcp.close()
        # The call still works for its owner, then goes with its region.
        client.run_prepared(call_id)
        client.unregister_region("so-prep")
        client.register_host_region("so-prep", region.key, region.byte_size)
        refused(grpc.StatusCode.NOT_FOUND, "unregistered", client.run_prepared, call_id)
        client.unregister_region("so-prep")
    finally:
        region.close(unregister=False)
    second = None
    with client.create_host_region("so-prep2", region_bytes(case) + 4096) as region2:
        args, _, _ = stage(region2, case)
        second = client.prepare_call("sparse_mla", **args)
        client.release_call(second)
        refused(grpc.StatusCode.NOT_FOUND, "ReleaseCall", client.run_prepared, second)


def region_size(region):
    return region.byte_size


def test_session_prepared_calls(client, rng):
    case = make_case("sparse_mla", rng)
    with client.session("so-prep-session") as s:
        region = s.create_host_region("so-sprep", region_bytes(case) + 4096)
        args, outs, views = stage(region, case)
        ready, done = SignalWord(region), SignalWord(region)
        call_id = s.prepare_call("sparse_mla", **args)
        for run in range(1, 5):
            case = make_case("sparse_mla", rng)
            stage(region, case, views)
            if run % 2:
                stats = s.run_prepared(call_id).result(30)
                assert not stats.enqueued and stats.impl  # the backend's implementation
            else:
                stats = s.run_prepared(
                    call_id, ready=ready.signal(run), done=done.signal(run), timeout=30
                ).result(30)
                assert stats.enqueued
                time.sleep(0.05)
                assert poisoned(case, outs)
                ready.set(run)
                done.wait(run, timeout=20)
            case.check(outs)
        s.release_call(call_id)
        with pytest.raises(AttndError) as e:
            s.run_prepared(call_id).result(30)
        assert e.value.code == grpc.StatusCode.NOT_FOUND


class FakeDriver:
    """Stands in for the CUDA driver in attnd_client.cuda_signals: records the calls, maps the
    registered pages at a fake device address."""

    DEVICE_BASE = 0x7F00_0000_0000

    def __init__(self):
        self.calls = []
        self.registered = None

        def register(ptr, size, flags):
            self.registered = (ptr.value, size)
            self.calls.append(("register", ptr.value, size, flags))
            return 0

        def device_pointer(out, ptr, flags):
            out._obj.value = self.DEVICE_BASE
            return 0

        def op(name):
            def f(stream, address, value, flags):
                self.calls.append((name, stream.value, address, value, flags))
                return 0

            return f

        def unregister(ptr):
            self.calls.append(("unregister", ptr.value))
            return 0

        self.register, self.device_pointer, self.unregister = register, device_pointer, unregister
        self.write, self.wait = op("write"), op("wait")


def test_stream_signals_address_words_in_the_registered_pages(client):
    from attnd_client.cuda_signals import CU_STREAM_WAIT_VALUE_GEQ, StreamSignals

    region = client.create_host_region("cuda-signals", 3 * 4096 + 100)
    try:
        ready, done = SignalWord(region), SignalWord(region, offset=4096 + 64)
        driver = FakeDriver()
        with StreamSignals(region, driver=driver) as signals:
            start, size = driver.registered
            assert start % 4096 == 0 and size % 4096 == 0
            assert start <= region.address and region.address + region.byte_size <= start + size
            signals.write(ready, 7, stream=0x1234)
            signals.wait(done, 9, stream=0x1234)
        base = FakeDriver.DEVICE_BASE
        assert driver.calls[1] == (
            "write",
            0x1234,
            base + region.address + ready.offset - start,
            7,
            0,
        )
        assert driver.calls[2] == (
            "wait",
            0x1234,
            base + region.address + done.offset - start,
            9,
            CU_STREAM_WAIT_VALUE_GEQ,
        )
        assert driver.calls[3] == ("unregister", start)
        other = client.create_host_region("cuda-signals-2", 4096)
        try:
            with pytest.raises(ValueError):
                StreamSignals(region, driver=FakeDriver()).write(SignalWord(other), 1, 0)
        finally:
            other.close()
    finally:
        region.close()


@pytest.mark.parametrize("api", ["unary", "session"])
def test_ring_runs_prepared_calls_in_order(client, rng, api):
    """N prepared calls (each over its own inputs and outputs) submitted through a submission
    ring (docs/SERVICE.md "Submission rings"): only the first names a ready word, so until it is
    set every output stays poisoned and no done word is stored; then every call runs in order
    and matches the fp64 reference."""
    n = 5
    with client.session("ring-order") as s:
        owner = s if api == "session" else client
        region, cases, argss, staged = staged_cases(s, "ring-data", rng, n)
        ring_region = s.create_host_region("ring-slots", 1 << 16)
        ready = SignalWord(region)
        dones = [SignalWord(region) for _ in cases]
        call_ids = [
            s.prepare_call("sparse_mla", **args)
            if api == "session"
            else client.prepare_call("sparse_mla", lease_id=s.lease_id, **args)
            for args in argss
        ]
        ring = owner.open_ring(ring_region, offset=64, entries=4, signals=region)
        full = 0
        for i, call_id in enumerate(call_ids):
            ready_offset = ready.offset if i == 0 else None
            while not ring.submit(call_id, ready_offset, 1, dones[i].offset, 10 + i):
                full += 1
                time.sleep(50e-6)
        assert ring.submitted == n
        wait_until(lambda: ring.taken == n, 10)
        time.sleep(0.2)
        assert all(d.get() == 0 for d in dones), "a call ran before the first one's ready"
        assert all(poisoned(c, o) for c, o in zip(cases, staged, strict=True))
        ready.set(1)
        for i, d in enumerate(dones):
            assert d.wait(10 + i, timeout=20) == 10 + i
        for case, outs in zip(cases, staged, strict=True):
            case.check(outs)
        # A refused entry (an unknown call id) gets the failure bit; the ring goes on.
        bad, good = SignalWord(region), SignalWord(region)
        assert ring.submit(max(call_ids) + 999, None, 0, bad.offset, 7)
        assert ring.submit(call_ids[0], None, 0, good.offset, 8)
        with pytest.raises(AttndError) as e:
            bad.wait(7, timeout=20)
        assert e.value.code == grpc.StatusCode.ABORTED
        assert bad.get() == 7 | FAILURE_BIT
        assert good.wait(8, timeout=20) == 8
        # Values from the failure bit up: refused entries too (docs/SERVICE.md "Failure bit").
        high_done, high_ready = SignalWord(region), SignalWord(region)
        high = FAILURE_BIT + 9
        assert ring.submit(call_ids[0], None, 0, high_done.offset, high)
        assert ring.submit(call_ids[0], ready.offset, 1 << 63, high_ready.offset, 11)
        assert ring.submit(call_ids[0], None, 0, good.offset, 12)
        assert good.wait(12, timeout=20) == 12
        assert high_done.get() == high, hex(high_done.get())
        assert high_ready.get() == 11 | FAILURE_BIT, hex(high_ready.get())
        ring.close()
        assert ring.state == 1
        with pytest.raises(AttndError) as e:
            ring.submit(call_ids[0], None, 0, good.offset, 9)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        # Closed: its id is gone.
        with pytest.raises(AttndError) as e:
            owner.close_ring(ring.ring_id)
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_ring_with_signal_words_in_a_region_named_at_open(client, rng):
    """open_ring(signals=<a region's name>): the form for signal words in a device region,
    which the caller's stream writes and waits on. The entries' words lie in the named region
    (here a host region, so that the CPU daemon can serve it and the test can read it): submit()
    runs the call and its done word is stored there; call() refuses, since this process does not
    poll that region; an unknown name is refused at open, naming the field."""
    case = make_case("sparse_mla", rng)
    data = client.create_host_region("named-signals-data", region_bytes(case) + 4096)
    words = client.create_host_region("named-signals-words", 4096)
    slots = client.create_host_region("named-signals-ring", 1 << 16)
    try:
        args, outs, _ = stage(data, case)
        call_id = client.prepare_call("sparse_mla", **args)
        ring = client.open_ring(slots, offset=64, entries=4, signals=words.name)
        assert ring.signals is None and ring.signal_name == words.name
        ready, done = SignalWord(words), SignalWord(words)
        assert ring.submit(call_id, ready.offset, 1, done.offset, 5)
        time.sleep(0.2)
        assert done.get() == 0 and poisoned(case, outs), "ran before its ready word"
        ready.set(1)
        assert done.wait(5, timeout=20) == 5
        case.check(outs)
        with pytest.raises(ValueError, match="does not poll"):
            ring.call(call_id, done, 6, timeout=5)
        ring.close()
        # The signal region unregistered under an open ring: the daemon closes the ring, its
        # CloseRing says why, and the client's close() takes that as closed (it does not raise).
        gone = client.create_host_region("named-signals-gone", 4096)
        ring = client.open_ring(slots, offset=64, entries=4, signals=gone.name)
        client.unregister_region(gone.name)
        gone.close(unregister=False)
        with pytest.raises(AttndError) as e:
            client.close_ring(ring.ring_id)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert "closed already: a region it uses was unregistered" in str(e.value), e.value
        ring.close()
        with pytest.raises(AttndError) as e:
            client.open_ring(slots, offset=64, entries=4, signals="no-such-region")
        assert "signal_region" in str(e.value), e.value
        with pytest.raises(ValueError, match="empty region name"):
            client.open_ring(slots, offset=64, entries=4, signals="")
        client.release_call(call_id)
    finally:
        for r in (slots, words, data):
            r.close()


def test_late_unregistration_spares_a_region_registered_again(client, rng):
    """Unregistering a region frees its name at once but completes only when the calls pinning
    it end (here: a pending stream-ordered call whose signal words lie in it). A ring and a
    prepared call set up meanwhile on a *new* region of the same name are not the old region's:
    the old unregistration's completion must leave them alone (before the fix it closed and
    released them by name)."""
    name = "late-unregister"
    first = make_case("sparse_mla", rng)
    data = client.create_host_region("late-unregister-data", region_bytes(first) + 4096)
    old = client.create_host_region(name, 4096)
    try:
        args, outs, _ = stage(data, first)
        ready, done = SignalWord(old), SignalWord(old)
        client.enqueue("sparse_mla", ready=ready.signal(1), done=done.signal(1), timeout=60, **args)
        pending = client.submit_unregister(name)
        # The name is free once the daemon has taken the request (the unregistration itself
        # completes only after the pending call).
        wait_until(
            lambda: name not in {r.name for r in client.list_regions()},
            30,
            what="the unregistered name free",
        )
        assert not pending.done(), "the unregistration waits for the pending call's signals"

        second = make_case("sparse_mla", rng)
        new = client.create_host_region(name, region_bytes(second) + 4096)
        slots = client.create_host_region("late-unregister-ring", 1 << 16)
        args2, outs2, _ = stage(new, second)
        call_id = client.prepare_call("sparse_mla", **args2)
        ring = client.open_ring(slots, offset=64, entries=4, signals=new)

        ready.set(1)  # the old call runs; its pins go and the old unregistration completes
        assert done.wait(1, timeout=20) == 1
        first.check(outs)
        assert list(pending.result(timeout=20).removed) == [name]
        time.sleep(0.1)
        assert ring.state == 0, "the ring on the new region was closed"
        ran = SignalWord(new)
        assert ring.submit(call_id, None, 0, ran.offset, 3)
        assert ran.wait(3, timeout=20) == 3
        second.check(outs2)
        stage(new, second, {k: v for k, v in args2.items() if hasattr(v, "shape")})
        client.run_prepared(call_id)  # blocking: the prepared call is still there
        second.check(outs2)
        ring.close()
    finally:
        old.close(unregister=False)


@pytest.mark.parametrize("api", ["unary", "session"])
def test_ring_call_blocks_until_its_outputs_are_complete(client, rng, api):
    """SubmissionRing.call (docs/SERVICE.md "Blocking calls through a ring"): each call returns
    once its done word is stored, its poisoned outputs then matching the fp64 reference, with and
    without spinning; an unknown call is ABORTED, an unreached ready word DEADLINE_EXCEEDED
    (outputs untouched; the call runs once the word comes), a word of another region a
    ValueError, a closed ring FAILED_PRECONDITION."""
    case = make_case("sparse_mla", rng)
    with client.session("ring-call") as s:
        owner = s if api == "session" else client
        region = s.create_host_region("ring-call-data", region_bytes(case) + 4096)
        ring_region = s.create_host_region("ring-call-slots", 1 << 16)
        ready, done, other = SignalWord(region), SignalWord(region), SignalWord(region)
        views = {k: region.put(a, case.input_dtypes[k]) for k, a in case.inputs.items()}
        views.update({k: region.array(d, sh) for k, (d, sh) in case.outputs.items()})
        args, outs, _ = stage(region, case, views)
        call_id = (
            s.prepare_call("sparse_mla", **args)
            if api == "session"
            else client.prepare_call("sparse_mla", lease_id=s.lease_id, **args)
        )
        ring = owner.open_ring(ring_region, offset=0, entries=4, signals=region)
        for value in range(1, 11):  # around the ring twice, half of them spinning
            for name, (dtype, _) in case.outputs.items():
                outs[name][...] = POISON[dtype]
            assert poisoned(case, outs)
            spin = 0.002 if value % 2 else 0.0
            assert ring.call(call_id, done, value, timeout=20, spin=spin) == value
            case.check(outs)
        with pytest.raises(AttndError) as e:
            ring.call(call_id + 999, other, 1, timeout=20)
        assert e.value.code == grpc.StatusCode.ABORTED
        for name, (dtype, _) in case.outputs.items():
            outs[name][...] = POISON[dtype]
        with pytest.raises(AttndError) as e:
            ring.call(call_id, done, 11, ready=ready, ready_value=3, timeout=0.05, spin=0.001)
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(0.05)
        assert poisoned(case, outs) and done.get() == 10
        ready.set(3)
        assert done.wait(11, timeout=20) == 11
        case.check(outs)
        elsewhere = client.create_host_region("ring-call-elsewhere", 4096)
        try:
            with pytest.raises(ValueError):
                ring.call(call_id, SignalWord(elsewhere), 1, timeout=1)
        finally:
            elsewhere.close()
        ring.close()
        with pytest.raises(AttndError) as e:
            ring.call(call_id, done, 12, timeout=20)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("api", ["unary", "session"])
def test_ring_caller_runs_prepared_calls_blocking(client, rng, api):
    """Client.ring_caller / Session.ring_caller (rings.RingCaller): run() returns with the call's
    outputs in place (poisoned before each), a failed call is ABORTED and the caller goes on;
    closed, run() is FAILED_PRECONDITION and its region is gone from the daemon."""
    case = make_case("sparse_mla", rng)
    with client.session("ring-caller") as s:
        owner = s if api == "session" else client
        region = s.create_host_region("ring-caller-data", region_bytes(case) + 4096)
        views = {k: region.put(a, case.input_dtypes[k]) for k, a in case.inputs.items()}
        views.update({k: region.array(d, sh) for k, (d, sh) in case.outputs.items()})
        args, outs, _ = stage(region, case, views)
        call_id = owner.prepare_call("sparse_mla", **args)
        with pytest.raises(ValueError):
            owner.ring_caller(entries=3)
        caller = owner.ring_caller(entries=2, spin=0.001 if api == "unary" else 0.0)
        caller_region = caller.region.name
        assert caller_region in {r.name for r in client.list_regions()}
        for _ in range(5):  # around its two slots twice
            for name, (dtype, _) in case.outputs.items():
                outs[name][...] = POISON[dtype]
            caller.run(call_id, timeout=20)
            case.check(outs)
        with pytest.raises(AttndError) as e:
            caller.run(call_id + 999, timeout=20)
        assert e.value.code == grpc.StatusCode.ABORTED
        for name, (dtype, _) in case.outputs.items():
            outs[name][...] = POISON[dtype]
        caller.run(call_id, timeout=20)
        case.check(outs)
        assert caller.calls == 7
        caller.close()
        caller.close()
        with pytest.raises(AttndError) as e:
            caller.run(call_id)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert caller_region not in {r.name for r in client.list_regions()}


def test_ring_calls_see_a_killed_daemon(make_daemon, attnctl_bin, rng):
    """A blocking call through a ring whose daemon dies without a word (SIGKILL: no close, no
    failure bit) ends UNAVAILABLE once the ring's beat word has stood still for a few seconds
    (docs/SERVICE.md "Blocking calls through a ring"), from Python (SubmissionRing.call waiting
    on an unreached ready word) and from C++ (attnctl bench --ring_wait, which then stops)."""
    d = make_daemon()
    c = d.client()
    case = make_case("sparse_mla", rng)
    region = c.create_host_region("ring-kill", region_bytes(case) + 4096)
    slots = c.create_host_region("ring-kill-slots", 1 << 16)
    args, _, _ = stage(region, case)
    call_id = c.prepare_call("sparse_mla", **args)
    ready, done = SignalWord(region), SignalWord(region)
    ring = c.open_ring(slots, entries=4, signals=region)
    wait_until(lambda: ring.beat != 0, what="the poller's first beat")
    killer = threading.Timer(0.5, d.signal, (signal.SIGKILL,))
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(AttndError) as e:
        ring.call(call_id, done, 1, ready=ready, ready_value=1, timeout=60, spin=0.001)
    elapsed = time.monotonic() - t0
    killer.join()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
    assert "has not polled" in str(e.value)
    assert 3.0 <= elapsed < 20, elapsed
    d.wait(30)
    if attnctl_bin is None:
        return
    d2 = make_daemon()
    proc = subprocess.Popen(
        [attnctl_bin, f"--target={d2.unix_target}", "--json", "--progress=true", "bench",
         "topk", "--regions", "--stream_ordered", "--prepared", "--ring", "--ring_wait",
         "--requests=100000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # The progress line (every 5 s off a terminal) starts with the measured ring calls, after
        # the warm-up and the calibration RPCs: the daemon dies under a ring call.
        progress = proc.stderr.readline()
        while progress and "requests" not in progress:
            progress = proc.stderr.readline()
        assert "requests" in progress, proc.communicate(timeout=30)
        d2.signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, out + err
    line = json.loads(out.strip().splitlines()[-1])
    assert line["errors"] >= 1, line
    assert "UNAVAILABLE" in line["first_error"] and "has not polled" in line["first_error"], line
    d2.wait(30)


def test_ring_caller_with_a_stream_waits_for_the_streams_ready_word(client, rng):
    """RingCaller.run(call_id, stream=...): the stream writes the caller's ready word (through
    the CUDA driver: a fake here that records the write and lands it `delay` later, as a busy
    stream would) and the daemon runs the call only once it sees that value: outputs stay
    poisoned until then, and are the reference's when run() returns. No synchronize."""
    case = make_case("sparse_mla", rng)
    region = client.create_host_region("ring-caller-stream", region_bytes(case) + 4096)
    try:
        views = {k: region.put(a, case.input_dtypes[k]) for k, a in case.inputs.items()}
        views.update({k: region.array(d, sh) for k, (d, sh) in case.outputs.items()})
        args, outs, _ = stage(region, case, views)
        call_id = client.prepare_call("sparse_mla", **args)
        driver = FakeDriver()
        landed = []

        def write(stream, address, value, flags):
            driver.calls.append(("write", stream.value, address, value, flags))
            host = address - FakeDriver.DEVICE_BASE + driver.registered[0]

            def land():
                assert poisoned(case, outs), "the call ran before its ready word"
                landed.append(value)  # before the store: the call may end at once after it
                ctypes.c_uint64.from_address(host).value = value

            threading.Timer(0.2, land).start()
            return 0

        driver.write = write
        with client.ring_caller(entries=4, driver=driver) as caller:
            for n in (1, 2):
                for name, (dtype, _) in case.outputs.items():
                    outs[name][...] = POISON[dtype]
                t0 = time.monotonic()
                caller.run(call_id, timeout=20, stream=0x5EED)
                assert time.monotonic() - t0 >= 0.2
                assert landed == list(range(1, n + 1))
                case.check(outs)
            writes = [c for c in driver.calls if c[0] == "write"]
            assert [(c[1], c[3]) for c in writes] == [(0x5EED, 1), (0x5EED, 2)]
            assert writes[0][2] == FakeDriver.DEVICE_BASE + (
                caller.region.address + caller.ready.offset - driver.registered[0]
            )
        assert driver.calls[-1][0] == "unregister"
        client.release_call(call_id)
    finally:
        region.close()


def test_poll_spin_seconds_count_each_polling_thread(make_daemon, daemon, rng):
    """attnd_poll_spin_seconds_total{thread}: zero on a daemon that does not poll (the CPU
    default; a GPU daemon polls unless --worker-spin=0); with --worker-spin=1ms, ring calls make
    the worker and the ring poller spin and a call whose ready word comes later makes the waiter
    spin (docs/SERVICE.md "Metrics")."""
    not_polling = daemon if BACKEND == "cpu" else make_daemon("--worker-spin=0")
    quiet = parse_metrics(not_polling.scrape())
    for thread in ("worker", "ring", "waiter"):
        assert sample(quiet, "attnd_poll_spin_seconds_total", thread=thread) == 0, thread
    d = make_daemon("--worker-spin=1ms")
    c = d.client()
    case = make_case("sparse_mla", rng)
    region = c.create_host_region("spin-metrics", region_bytes(case) + 4096)
    args, _, _ = stage(region, case)
    call_id = c.prepare_call("sparse_mla", **args)
    with c.ring_caller(entries=4, spin=0.0) as caller:
        for _ in range(20):
            caller.run(call_id, timeout=60)
    slots = c.create_host_region("spin-metrics-ring", 1 << 16)
    ring = c.open_ring(slots, entries=4, signals=region)
    ready, done = SignalWord(region), SignalWord(region)
    assert ring.submit(call_id, ready.offset, 1, done.offset, 1)
    # The ready word only once the waiter has spun on it: a word already set when the call is
    # queued starts the call at once, with no wait to spin through.
    wait_until(
        lambda: (
            sample(parse_metrics(d.scrape()), "attnd_poll_spin_seconds_total", thread="waiter") > 0
        ),
        30,
        what="the waiter's spin on the unready call",
    )
    ready.set(1)
    assert done.wait(1, timeout=60) == 1
    ring.close()
    samples = parse_metrics(d.scrape())
    for thread in ("worker", "ring", "waiter"):
        assert sample(samples, "attnd_poll_spin_seconds_total", thread=thread) > 0, thread


# ---- OrderedCaller (attnd_client.ordered): stream-ordered calls with the bookkeeping done ----


def staged_cases(owner, name, rng, n, **kwargs):
    """A host region of `owner` and n sparse_mla cases of one shape staged in it, each in its
    own part: (region, cases, arguments, outputs)."""
    cases = [make_case("sparse_mla", rng, **kwargs) for _ in range(n)]
    region = owner.create_host_region(name, sum(region_bytes(c) for c in cases) + 4096)
    argss, outss = [], []
    for case in cases:
        views = {k: region.put(a, case.input_dtypes[k]) for k, a in case.inputs.items()}
        views.update({k: region.array(d, sh) for k, (d, sh) in case.outputs.items()})
        args, outs, _ = stage(region, case, views)
        argss.append(args)
        outss.append(outs)
    return region, cases, argss, outss


def deferred_driver():
    """A FakeDriver whose stream writes are recorded, not stored: land(k) stores the k-th one,
    as a stream reaching that point would."""
    driver = FakeDriver()
    writes = []

    def write(stream, address, value, flags):
        driver.calls.append(("write", stream.value, address, value, flags))
        writes.append((address - FakeDriver.DEVICE_BASE + driver.registered[0], value))
        return 0

    def land(k):
        host, value = writes[k]
        ctypes.c_uint64.from_address(host).value = value

    driver.write = write
    return driver, land


@pytest.mark.parametrize("api", ["unary", "session"])
def test_ordered_caller_runs_calls_in_order_and_prepares_once(client, rng, api):
    """OrderedCaller.call without a stream (host-ordered): every call returns at once, the calls
    run in order on the caller's queue, wait() returns once all are over, each output matches
    the fp64 reference; the same arguments again use the cached prepared call (no PrepareCall),
    with new data written in place; depth 2 makes calls reuse done words (call() waits for the
    oldest); close() releases the prepared calls and the region."""
    with client.session("ordered") as s:
        owner = s if api == "session" else client
        region, cases, argss, outss = staged_cases(owner, "ordered-data", rng, 3)
        with owner.ordered_caller(entries=4, depth=2, timeout=30) as caller:
            numbers = [caller.call("sparse_mla", **args) for args in argss]
            assert numbers == [1, 2, 3]
            caller.wait(timeout=30)
            assert caller.pending == 0 and caller.prepares == 3 and caller.prepared == 3
            for case, outs in zip(cases, outss, strict=True):
                case.check(outs)
            for _ in range(2):
                for i, args in enumerate(argss):
                    case = make_case("sparse_mla", rng)  # same shapes, new data in place
                    for name, array in case.inputs.items():
                        args[name][...] = array
                    for name, (dtype, _) in case.outputs.items():
                        outss[i][name][...] = POISON[dtype]
                    cases[i] = case
                    caller.call("sparse_mla", **args)
                caller.wait(timeout=30)
                for case, outs in zip(cases, outss, strict=True):
                    case.check(outs)
            assert caller.prepares == 3, "the same arguments prepared again"
            assert caller.calls == 9 and caller.retired == 9
            ids = [entry[0] for entry in caller._prepared.values()]
        for call_id in ids:  # released at close
            with pytest.raises(AttndError) as e:
                owner.run_prepared(call_id) if api == "unary" else s.run_prepared(call_id).result(
                    30
                )
            assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(AttndError) as e:
            caller.call("sparse_mla", **argss[0])
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        region.close()


def test_ordered_caller_with_a_stream_waits_for_its_ready_word(client, rng):
    """With a stream the caller's stream writes the ready word (a fake CUDA driver records the
    write; the test lands it, as the stream reaching that point would) and waits for the call's
    own done word: nothing runs before its ready word, a later call's word releases the earlier
    calls too (values grow), and the waits name each call's done word with its number."""
    region, cases, argss, outss = staged_cases(client, "ordered-stream", rng, 2)
    try:
        driver, land = deferred_driver()
        caller = client.ordered_caller(entries=4, depth=4, timeout=30, driver=driver)
        try:
            assert caller.call("sparse_mla", stream=0x5EED, **argss[0]) == 1
            assert caller.call("sparse_mla", stream=0x5EED, **argss[1]) == 2
            time.sleep(0.2)
            assert all(poisoned(c, o) for c, o in zip(cases, outss, strict=True))
            assert caller.pending == 2
            land(1)  # the stream passed both producers: ready = 2
            caller.wait(timeout=30)
            for case, outs in zip(cases, outss, strict=True):
                case.check(outs)
            ops = [(c[0], c[1], c[3]) for c in driver.calls if c[0] in ("write", "wait")]
            assert ops == [
                ("write", 0x5EED, 1),
                ("wait", 0x5EED, 1),
                ("write", 0x5EED, 2),
                ("wait", 0x5EED, 2),
            ]
            waits = [c[2] for c in driver.calls if c[0] == "wait"]
            base = FakeDriver.DEVICE_BASE + caller.region.address - driver.registered[0]
            assert waits == [base + caller._done[1].offset, base + caller._done[2].offset]
        finally:
            caller.close()
        assert driver.calls[-1][0] == "unregister"
    finally:
        region.close()


def test_ordered_caller_reports_a_failed_call_once(client, rng):
    """A call that fails when it runs (a CSR indptr made to end past the indices after the call
    was prepared: the daemon checks index data at every run) stores the failure bit; the next
    call() raises ABORTED naming it and is not made; the arguments' prepared call is dropped
    and made again, and calls go on. Arguments outside every region are refused by
    PrepareCall (INVALID_ARGUMENT); an argument of no tensor kind by the caller (TypeError)."""
    region, cases, argss, outss = staged_cases(client, "ordered-fail", rng, 1, form="csr")
    try:
        args = argss[0]
        with client.ordered_caller(entries=4, depth=4, timeout=30) as caller:
            caller.call("sparse_mla", **args)
            caller.wait(timeout=30)
            cases[0].check(outss[0])
            good = args["indptr"].copy()
            args["indptr"][-1] = 1 << 30
            caller.call("sparse_mla", **args)
            with pytest.raises(AttndError) as e:
                caller.wait(timeout=30)
            assert e.value.code == grpc.StatusCode.ABORTED
            assert "call 2 (sparse_mla) failed" in str(e.value), e.value
            caller.check()  # reported once
            assert caller.prepared == 0, "the failed call's prepared call was kept"
            args["indptr"][...] = good
            caller.call("sparse_mla", **args)
            caller.call("sparse_mla", **args)
            caller.wait(timeout=30)
            cases[0].check(outss[0])
            assert caller.prepares == 2
            assert not caller._dropped, "the failed call's prepared call was not released"
            # Reported by the next call() when nobody waited.
            args["indptr"][-1] = 1 << 30
            caller.call("sparse_mla", **args)
            wait_until(lambda: caller.pending == 0, 20)
            args["indptr"][...] = good
            with pytest.raises(AttndError) as e:
                caller.call("sparse_mla", **args)
            assert e.value.code == grpc.StatusCode.ABORTED
            assert caller.calls == 5, "a call was made after an unreported failure"
            inline = dict(args, q=np.array(args["q"]))
            with pytest.raises(AttndError) as e:
                caller.call("sparse_mla", **inline)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(TypeError, match="'q' is a list"):
                caller.call("sparse_mla", **dict(args, q=[1, 2]))
            assert caller.calls == 5
    finally:
        region.close()


def test_ordered_caller_evicts_prepared_calls(client, rng):
    """max_prepared bounds the cache: a new argument set past it releases the least recently
    used prepared call (after its last call is over) and every output is still right."""
    region, cases, argss, outss = staged_cases(client, "ordered-evict", rng, 3)
    try:
        with client.ordered_caller(entries=4, depth=8, max_prepared=2, timeout=30) as caller:
            for args in argss + argss:
                caller.call("sparse_mla", **args)
            caller.wait(timeout=30)
            assert caller.prepared == 2 and caller.prepares == 6
            for case, outs in zip(cases, outss, strict=True):
                case.check(outs)
    finally:
        region.close()


def test_ordered_caller_sees_a_killed_daemon(make_daemon, rng):
    """A daemon killed (SIGKILL) while a stream-ordered call waits for its ready word: wait()
    raises UNAVAILABLE once the ring's beat has stood still for a few seconds, and stores the
    failure bit in the pending call's done word, which releases a stream waiting on it."""
    d = make_daemon()
    c = d.client()
    region, _, argss, _ = staged_cases(c, "ordered-kill", rng, 1)
    driver, _ = deferred_driver()
    caller = c.ordered_caller(entries=4, depth=4, timeout=60, driver=driver)
    caller.call("sparse_mla", stream=7, **argss[0])
    wait_until(lambda: caller.ring.beat != 0, what="the poller's first beat")
    d.signal(signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(AttndError) as e:
        caller.wait(timeout=60)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
    assert 2.5 <= time.monotonic() - t0 < 20
    assert caller._done[1].get() == 1 | FAILURE_BIT
    assert caller.pending == 0
    caller.check()  # the UNAVAILABLE reported the call: no ABORTED for it afterwards
    d.wait(30)
    for closer in (caller.close, region.close, c.close):
        with contextlib.suppress(Exception):
            closer()


def test_ordered_caller_of_an_ended_session(client, rng):
    """An ordered caller opened on a Session: once the Session ends, its ring is closed with the
    lease, so the next call() raises FAILED_PRECONDITION without queuing anything, and close()
    still returns quietly (the ring and the region went with the lease)."""
    s = client.session("ordered-ends")
    region, cases, argss, outss = staged_cases(s, "ordered-ends", rng, 1)
    caller = s.ordered_caller(entries=4, depth=4, timeout=30)
    caller.call("sparse_mla", **argss[0])
    caller.wait(timeout=30)
    cases[0].check(outss[0])
    s.close()
    wait_until(lambda: caller.ring.state != 0, 10, what="the ring closed with the lease")
    with pytest.raises(AttndError) as e:
        caller.call("sparse_mla", **argss[0])
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
    assert caller.calls == 1
    caller.close()
    caller.close()  # idempotent
    with pytest.raises(AttndError) as e:
        caller.call("sparse_mla", **argss[0])
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "closed" in str(e.value)


def test_ordered_caller_abort_releases_its_pending_calls(client, rng):
    """abort(): the pending calls' done words get the failure bit from the caller (a stream
    waiting on them would go on), so they count as over and failed: check() raises ABORTED
    once. The daemon's entry still waits for its ready word; once that comes it runs."""
    region, _, argss, _ = staged_cases(client, "ordered-abort", rng, 1)
    driver, land = deferred_driver()
    try:
        with client.ordered_caller(entries=4, depth=4, timeout=30, driver=driver) as caller:
            caller.call("sparse_mla", stream=3, **argss[0])
            time.sleep(0.05)
            assert caller.pending == 1
            caller.abort()
            assert caller.pending == 0 and caller._done[1].get() == 1 | FAILURE_BIT
            with pytest.raises(AttndError) as e:
                caller.check()
            assert e.value.code == grpc.StatusCode.ABORTED
            caller.check()
            land(0)  # the ready word: the daemon's entry runs and stores done = 1 again
            wait_until(lambda: caller._done[1].get() == 1, 20, what="the daemon's done store")
    finally:
        region.close()


def test_ordered_caller_eviction_after_a_refused_stream_write(client, rng):
    """A call whose stream write fails is never submitted, and the next call takes its number:
    evicting its prepared call (max_prepared 1, a new argument set next) must not wait for that
    number (it would until the timeout). The failed call raises the driver's error."""
    from attnd_client.cuda_signals import CudaDriverError

    region, cases, argss, outss = staged_cases(client, "ordered-refused", rng, 1)
    driver = FakeDriver()
    driver.write = lambda *a: 1  # CUDA_ERROR_INVALID_VALUE
    try:
        with client.ordered_caller(
            entries=4, depth=4, max_prepared=1, timeout=60, driver=driver
        ) as caller:
            caller.call("sparse_mla", **argss[0])
            caller.wait(timeout=30)
            with pytest.raises(CudaDriverError):
                caller.call("sparse_mla", stream=9, **argss[0])
            assert caller.calls == 1
            other = dict(argss[0], sm_scale=argss[0]["sm_scale"] * 0.5)
            t0 = time.monotonic()
            assert caller.call("sparse_mla", **other) == 2
            # Waiting for the number never made would take the caller's timeout (60 s).
            assert time.monotonic() - t0 < 30, "the eviction waited for a call never made"
            caller.wait(timeout=30)
            assert caller.prepares == 2 and caller.prepared == 1
    finally:
        region.close()


def batching_driver(result=0):
    """A FakeDriver with cuStreamBatchMemOp: each batch is decoded from its parameter array
    (cuda.h's 48-byte CUstreamBatchMemOpParams: operation, address, value, flags) and recorded
    as ("batch", stream, [(operation, address, value, flags), ...]); its write operations land
    200 ms later, as a busy stream's would (land_checks run first). `result` is what the
    driver returns (then nothing lands)."""
    driver = FakeDriver()
    driver.land_checks = []

    def batch(stream, count, params, flags):
        raw = ctypes.string_at(params, 48 * count)
        ops = []
        for i in range(count):
            op, address, value, op_flags = struct.unpack_from("<I4xQQI", raw, 48 * i)
            ops.append((op, address, value, op_flags))
        driver.calls.append(("batch", stream.value, ops))
        assert flags == 0
        if driver.result:
            return driver.result
        for op, address, value, _ in ops:
            if op == 5:  # CU_STREAM_MEM_OP_WRITE_VALUE_64
                host = address - FakeDriver.DEVICE_BASE + driver.registered[0]

                def land(host=host, value=value):
                    for check in driver.land_checks:
                        check()
                    ctypes.c_uint64.from_address(host).value = value

                threading.Timer(0.2, land).start()
        return 0

    driver.result = result
    driver.batch = batch
    return driver


def test_ordered_caller_enqueues_ready_and_done_in_one_driver_call(client, rng):
    """With cuStreamBatchMemOp, each stream-ordered call makes one driver call: the ready write
    (value n, the default flags: a barrier first) then the done wait (>= n), at the caller's
    words' device addresses; the daemon runs the call only once the write lands (outputs stay
    poisoned until then) and the outputs are the reference's."""
    from attnd_client.cuda_signals import CU_STREAM_WAIT_VALUE_GEQ

    region, cases, argss, outss = staged_cases(client, "ordered-batch", rng, 2)
    driver = batching_driver()
    try:
        with client.ordered_caller(entries=4, depth=4, timeout=30, driver=driver) as caller:
            for i in range(2):
                for name, (dtype, _) in cases[i].outputs.items():
                    outss[i][name][...] = POISON[dtype]
                driver.land_checks = [
                    lambda i=i: (
                        None
                        if poisoned(cases[i], outss[i])
                        else pytest.fail("the call ran before its ready word")
                    )
                ]
                assert caller.call("sparse_mla", stream=0x5EED, **argss[i]) == i + 1
                caller.wait(timeout=30)
                cases[i].check(outss[i])
            base = FakeDriver.DEVICE_BASE - driver.registered[0] + caller.region.address
            batches = [c for c in driver.calls if c[0] == "batch"]
            assert batches == [
                (
                    "batch",
                    0x5EED,
                    [
                        (5, base + caller.ready.offset, n, 0),
                        (4, base + caller._done[n % 4].offset, n, CU_STREAM_WAIT_VALUE_GEQ),
                    ],
                )
                for n in (1, 2)
            ]
            assert not [c for c in driver.calls if c[0] in ("write", "wait")]
    finally:
        region.close()


def test_ordered_caller_without_batch_support_makes_two_driver_calls(client, rng):
    """A driver that answers the batch with CUDA_ERROR_NOT_SUPPORTED (801): the call goes on
    with a write and a wait (the batch is not tried again); the call runs once its ready word
    lands."""
    region, cases, argss, outss = staged_cases(client, "ordered-nobatch", rng, 2)
    driver, land = deferred_driver()
    tries = []

    def batch(stream, count, params, flags):
        tries.append(count)
        return 801

    driver.batch = batch
    try:
        with client.ordered_caller(entries=4, depth=4, timeout=30, driver=driver) as caller:
            for i in range(2):
                assert caller.call("sparse_mla", stream=7, **argss[i]) == i + 1
                land(i)
                caller.wait(timeout=30)
                cases[i].check(outss[i])
            assert tries == [2]
            kinds = [c[0] for c in driver.calls if c[0] in ("write", "wait")]
            assert kinds == ["write", "wait", "write", "wait"]
    finally:
        region.close()


def test_ordered_caller_refused_batch_submits_nothing(client, rng):
    """A batch the driver refuses (an error other than not-supported) enqueues nothing: the
    call raises the driver's error, is not submitted, and the next call takes its number."""
    from attnd_client.cuda_signals import CudaDriverError

    region, cases, argss, outss = staged_cases(client, "ordered-batch-refused", rng, 1)
    driver = batching_driver(result=1)
    try:
        with client.ordered_caller(entries=4, depth=4, timeout=5, driver=driver) as caller:
            with pytest.raises(CudaDriverError, match="cuStreamBatchMemOp failed: CUresult 1"):
                caller.call("sparse_mla", stream=9, **argss[0])
            assert caller.calls == 0 and caller.pending == 0
            assert caller.call("sparse_mla", **argss[0]) == 1
            caller.wait(timeout=30)
            cases[0].check(outss[0])
    finally:
        region.close()


@pytest.mark.parametrize("where", ["wait", "ring"])
def test_ordered_caller_stops_after_a_half_enqueued_call(client, rng, where):
    """A call whose stream got its ready write but whose wait was refused (two driver calls,
    the second failing), or whose entry could not go into the ring after its stream ops were
    enqueued: the daemon never has call n, and a later call n would find its ready word
    reached before its inputs. The call raises, its done word gets the failure bit (which
    releases the stream's wait), the calls already made still end, and later calls raise
    FAILED_PRECONDITION; close() works."""
    from attnd_client.cuda_signals import CudaDriverError

    region, cases, argss, outss = staged_cases(client, f"ordered-half-{where}", rng, 1)
    driver = FakeDriver()
    if where == "wait":
        driver.wait = lambda *a: 1
    try:
        with client.ordered_caller(entries=4, depth=4, timeout=5, driver=driver) as caller:
            assert caller.call("sparse_mla", **argss[0]) == 1
            if where == "wait":
                with pytest.raises(CudaDriverError) as e:
                    caller.call("sparse_mla", stream=3, **argss[0])
                assert e.value.ready_written
            else:

                def refuse(*a):
                    raise AttndError(grpc.StatusCode.FAILED_PRECONDITION, "ring errored")

                caller.ring.submit = refuse
                with pytest.raises(AttndError, match="ring errored"):
                    caller.call("sparse_mla", stream=3, **argss[0])
                del caller.ring.submit
            assert caller._done[2].get() == 2 | FAILURE_BIT
            caller.wait(timeout=30)
            cases[0].check(outss[0])
            with pytest.raises(AttndError, match="takes no more calls") as e:
                caller.call("sparse_mla", **argss[0])
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert caller.calls == 1
    finally:
        region.close()


def test_ordered_caller_bound_calls_run_their_fixed_arguments(client, rng):
    """bind(op, **arguments) prepares once (not in the max_prepared cache); each bound(...)
    runs the op on the arguments' current contents (new data written in place, outputs
    poisoned before each run, checked against the fp64 reference), with numbers shared with
    call(); release() gives the prepared call back once its last call is over (the daemon no
    longer knows it) and a released one refuses to run; close() releases the others."""
    region, cases, argss, outss = staged_cases(client, "ordered-bind", rng, 2)
    try:
        with client.ordered_caller(entries=4, depth=2, max_prepared=1, timeout=30) as caller:
            first = caller.bind("sparse_mla", **argss[0])
            second = caller.bind("sparse_mla", **argss[1])
            assert caller.prepares == 2 and caller.prepared == 0
            numbers = []
            for _ in range(3):
                for bound, args, outs in (
                    (first, argss[0], outss[0]),
                    (second, argss[1], outss[1]),
                ):
                    case = make_case("sparse_mla", rng)  # same shapes, new data in place
                    for name, array in case.inputs.items():
                        args[name][...] = array
                    for name, (dtype, _) in case.outputs.items():
                        outs[name][...] = POISON[dtype]
                    numbers.append(bound())
                    caller.wait(timeout=30)
                    case.check(outs)
            assert numbers == [1, 2, 3, 4, 5, 6] and caller.prepares == 2
            assert caller.call("sparse_mla", **argss[0]) == 7  # the cache's own prepared call
            caller.wait(timeout=30)
            assert caller.prepares == 3 and caller.prepared == 1
            first.release()
            with pytest.raises(AttndError) as e:
                client.release_call(first.call_id)
            assert e.value.code == grpc.StatusCode.NOT_FOUND
            with pytest.raises(ValueError, match="was released"):
                first()
            first.release()  # idempotent
            kept = second.call_id
        with pytest.raises(AttndError) as e:
            client.release_call(kept)
        assert e.value.code == grpc.StatusCode.NOT_FOUND, "close() released the bound call"
        assert second.released
    finally:
        region.close()


def test_ordered_caller_bound_call_fails_once_its_region_is_gone(client, rng):
    """A bound call whose host region is closed: the daemon drops its prepared call, so each
    later run fails (its ring entry refused: ABORTED from wait()), never touching the closed
    region; a new binding over a new region runs."""
    region, cases, argss, outss = staged_cases(client, "ordered-bind-gone", rng, 1)
    with client.ordered_caller(entries=4, depth=4, timeout=30) as caller:
        bound = caller.bind("sparse_mla", **argss[0])
        bound()
        caller.wait(timeout=30)
        cases[0].check(outss[0])
        region.close()
        for _ in range(2):
            bound()
            with pytest.raises(AttndError) as e:
                caller.wait(timeout=30)
            assert e.value.code == grpc.StatusCode.ABORTED
        again, cases, argss, outss = staged_cases(client, "ordered-bind-again", rng, 1)
        try:
            with caller.bind("sparse_mla", **argss[0]) as fresh:
                fresh()
                caller.wait(timeout=30)
                cases[0].check(outss[0])
        finally:
            again.close()
        bound.release()  # its prepared call is gone already: no error


def test_ordered_caller_bound_call_on_a_stream_waits_for_its_ready_word(client, rng):
    """A bound call with a stream: one batched driver call per run (ready write, done wait),
    and the daemon runs it only once the write lands (outputs poisoned until then)."""
    region, cases, argss, outss = staged_cases(client, "ordered-bind-stream", rng, 1)
    driver = batching_driver()
    case, outs = cases[0], outss[0]
    driver.land_checks = [
        lambda: None if poisoned(case, outs) else pytest.fail("ran before its ready word")
    ]
    try:
        with client.ordered_caller(entries=4, depth=4, timeout=30, driver=driver) as caller:
            with caller.bind("sparse_mla", **argss[0]) as bound:
                for n in (1, 2):
                    for name, (dtype, _) in case.outputs.items():
                        outs[name][...] = POISON[dtype]
                    assert bound(stream=0x77) == n
                    caller.wait(timeout=30)
                    case.check(outs)
            assert bound.released
            assert [c[2][0][2] for c in driver.calls if c[0] == "batch"] == [1, 2]
    finally:
        region.close()


def test_ordered_caller_keeps_a_call_prepared_after_an_older_failure(client, rng):
    """Two queued calls of one argument set fail, the first seen before the second runs: the
    set is prepared anew in between, and the second failure (of the old prepared call) must
    not drop the new one. Ready words are landed one at a time through a fake driver."""
    region, cases, argss, outss = staged_cases(client, "ordered-older", rng, 1, form="csr")
    args = argss[0]
    driver, land = deferred_driver()
    try:
        with client.ordered_caller(entries=8, depth=8, timeout=30, driver=driver) as caller:
            good = args["indptr"].copy()
            caller.call("sparse_mla", stream=5, **args)  # 1 (PrepareCall checks indptr)
            caller.call("sparse_mla", stream=5, **args)  # 2
            args["indptr"][-1] = 1 << 30  # both fail when they run
            land(0)  # ready = 1: call 1 runs and fails; call 2 waits
            wait_until(lambda: caller.pending == 1, 20, what="call 1 over")
            with pytest.raises(AttndError, match="call 1 "):
                caller.call("sparse_mla", stream=5, **args)
            assert caller.prepared == 0 and caller.prepares == 1
            args["indptr"][...] = good
            caller.call("sparse_mla", stream=5, **args)  # 3: prepared anew
            assert caller.prepares == 2
            args["indptr"][-1] = 1 << 30
            land(1)  # ready = 2: call 2 (the old prepared call) runs and fails
            wait_until(lambda: caller.pending == 1, 20, what="call 2 over")
            with pytest.raises(AttndError, match="call 2 "):
                caller.check()
            assert caller.prepared == 1, "the old call's failure dropped the new one"
            args["indptr"][...] = good
            land(2)  # ready = 3
            caller.wait(timeout=30)
            cases[0].check(outss[0])
            caller.call("sparse_mla", **args)
            caller.wait(timeout=30)
            assert caller.prepares == 2
    finally:
        region.close()
