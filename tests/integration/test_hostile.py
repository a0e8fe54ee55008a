"""A hostile client against a real CPU daemon (docs/SERVICE.md "Trust model"): index tensors in
shared memory flipped while calls run, shm objects truncated under registered regions, inline
outputs far larger than their request, thousands of idle connections, slow /metrics clients, a
squatted socket path, a symlinked ready file, oversized log fields, unparsable requests and a
health check during the drain. Each test reproduces what a hostile client did to the daemon and
checks that it now gets a clean answer while the daemon keeps serving everyone else.

Tests that need another OS user run only as root (they chown to an unused uid) and skip
otherwise."""

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

import attnd_client as ac
from attnd_client import regions as ac_regions
from attnd_client import rings as ac_rings
from attnd_client.stream_ordered import FAILURE_BIT, SignalWord

import cases
from daemon import Daemon, parse_metrics, sample, wait_until
from slow import SlowCall

PAGE = 4096
OTHER_UID = 65534  # "nobody": an owner that is not attnd's

# Flips one int32 of a shm object between two values until killed (or `seconds` pass), from its
# own process so that the flips race the daemon's reads at full speed.
FLIPPER = r"""
import mmap, os, struct, sys, time
path, offset, a, b, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
fd = os.open(path, os.O_RDWR)
m = mmap.mmap(fd, 0)
va, vb = struct.pack("<i", a), struct.pack("<i", b)
print("flipping", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(2000):
        m[offset:offset + 4] = vb
        m[offset:offset + 4] = va
m[offset:offset + 4] = va
"""


def code_of(fn, *args, **kwargs):
    with pytest.raises(ac.AttndError) as e:
        fn(*args, **kwargs)
    return e.value.code, e.value.details


def alive_and_serving(d):
    assert d.alive(), f"attnd died ({d.proc.returncode}):\n{d.log()}"
    c = d.client()
    assert c.health() == "SERVING"


# ---- row 3: index tensors in shared memory are snapshotted before they are validated ----------


class Flipper:
    def __init__(self, region, array, index, good, bad, seconds=30.0):
        offset = array.ctypes.data + 4 * index - region.shm.address
        path = ac_regions.shm_path(region.key)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FLIPPER, path, str(offset), str(good), str(bad), str(seconds)],
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout.readline().strip() == b"flipping"

    def stop(self):
        self.proc.kill()
        self.proc.wait(30)


def _race(d, client, case, region_name, flip_name, flip_index, bad, calls=300, seconds=8.0):
    """Puts the case's inputs in a host region, flips inputs[flip_name][flip_index] between its
    true value and `bad` while calls run, and checks every call: OK with exactly the output of
    the same call made before the flipping (the daemon used one consistent snapshot), or
    INVALID_ARGUMENT (it saw the bad value)."""
    size = cases.region_bytes(case) + PAGE
    region = client.create_host_region(region_name, size, unlink_early=False)
    try:
        args = {n: region.put(a, case.input_dtypes[n]) for n, a in case.inputs.items()}
        args.update(case.scalars)
        good = int(case.inputs[flip_name].reshape(-1)[flip_index])
        baseline = client.call(case.op, timeout=60, **args).outputs
        flipper = Flipper(region, args[flip_name], flip_index, good, bad)
        ok = refused = 0
        try:
            deadline = time.monotonic() + seconds
            for _ in range(calls):
                if time.monotonic() > deadline:
                    break
                try:
                    res = client.call(case.op, timeout=60, **args)
                except ac.AttndError as e:
                    assert d.alive(), f"attnd died ({d.proc.returncode}):\n{d.log()}"
                    assert e.code == grpc.StatusCode.INVALID_ARGUMENT, (e.code, e.details)
                    refused += 1
                    continue
                for name in case.outputs:
                    np.testing.assert_array_equal(res.outputs[name], baseline[name], name)
                ok += 1
        finally:
            flipper.stop()
        print(f"{case.op}: {ok} ok, {refused} refused")
        assert ok + refused > 0
    finally:
        region.close(unregister=d.alive())
    alive_and_serving(d)


def test_mla_prefill_cu_seqlens_flipped_in_shm(make_daemon, rng):
    d = make_daemon()
    c = d.client()
    case = cases.make_case("mla_prefill", rng)
    # cu_seqlens_q[1] between 5 and a row far past q: read after validation, it addresses
    # q and out rows 2^28 tokens away.
    _race(d, c, case, "flip-prefill-q", "cu_seqlens_q", 1, 1 << 28)
    # The last entry between total_q and a negative value: the rows past it are zero-filled.
    case = cases.make_case("mla_prefill", rng)
    _race(d, c, case, "flip-prefill-last", "cu_seqlens_q", 2, -(1 << 26))


def test_sparse_mla_indptr_flipped_in_shm(make_daemon, rng):
    d = make_daemon()
    c = d.client()
    case = cases.make_case("sparse_mla", rng, form="csr")
    _race(d, c, case, "flip-indptr", "indptr", 2, 1 << 29)


# ---- row 4: a truncated shm object fails the call, never the daemon --------------------------


def _truncate(region, size=0):
    os.truncate(ac_regions.shm_path(region.key), size)


def _truncated_code(fn):
    code, details = code_of(fn)
    assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
    assert "truncated" in details, details
    return details


def _region_case(client, rng, name, placed):
    """A sparse MLA case whose tensors named in `placed` live in a fresh host region (kept
    linked so that the test can truncate it); the others are inline."""
    case = cases.make_case("sparse_mla", rng)
    region = client.create_host_region(name, cases.region_bytes(case) + PAGE, unlink_early=False)
    args = dict(case.inputs)
    args.update(case.scalars)
    for n in placed:
        if n in case.inputs:
            args[n] = region.put(case.inputs[n], case.input_dtypes[n])
        else:
            dtype, shape = case.outputs[n]
            args[n] = region.array(dtype, shape)
    return case, region, args


@pytest.mark.parametrize(
    "placed",
    [("q", "kv"), ("indices",), ("out", "lse")],
    ids=["inputs", "index-snapshot", "outputs"],
)
def test_truncated_region_fails_the_call(make_daemon, rng, placed):
    d = make_daemon()
    c = d.client()
    case, region, args = _region_case(c, rng, "trunc", placed)
    try:
        _truncate(region)
        details = _truncated_code(lambda: c.call(case.op, timeout=60, **args))
        assert "'trunc'" in details, details
        # Later calls on the region fail the same way before touching it.
        _truncated_code(lambda: c.call(case.op, timeout=60, **args))
        assert d.alive(), f"attnd died:\n{d.log()}"
        assert "truncated" in d.log()
        # Everyone else is served: an inline call is right.
        fresh = cases.make_case("sparse_mla", rng)
        fresh.check(c.call(fresh.op, timeout=60, **fresh.arguments()).outputs)
        assert c.unregister_region("trunc") == ["trunc"]
    finally:
        region.close(unregister=False)
    alive_and_serving(d)


def test_region_truncated_mid_call(make_daemon):
    d = make_daemon("--workers=1", "--cpu-threads=2")
    c = d.client()

    class KeepLinked:
        def create_host_region(self, name, size):
            return c.create_host_region(name, size, unlink_early=False)

    slow = SlowCall(c, "trunc-mid", seconds=2.0, owner=KeepLinked(), hold=False)
    try:
        futures = [slow.submit(timeout=120) for _ in range(3)]
        wait_until(lambda: slow.in_flight() > 0, what="a call in flight")
        time.sleep(0.3)
        _truncate(slow.region, PAGE)
        for f in futures:
            e = f.exception(timeout=120)
            if e is not None:
                assert e.code == grpc.StatusCode.FAILED_PRECONDITION, (e.code, e.details)
                assert "truncated" in e.details
        assert d.alive(), f"attnd died:\n{d.log()}"
    finally:
        slow.region.close(unregister=False)
    alive_and_serving(d)


# ---- row 6: a memory budget for inline outputs, checked before anything is allocated ---------


def _huge_topk(rows_stride):
    """A 5 KB TopK request whose inline `indices` output, with a row stride of rows_stride
    elements, spans rows_stride + 64 int32."""
    logits = np.random.default_rng(1).standard_normal((2, 1000)).astype(np.float32)
    return ac.pb.TopKRequest(
        logits=ac.pb.Tensor(dtype=ac.pb.DTYPE_F32, shape=[2, 1000], inline_data=logits.tobytes()),
        lengths=ac.pb.Tensor(
            dtype=ac.pb.DTYPE_I32,
            shape=[2],
            inline_data=np.array([1000, 1000], np.int32).tobytes(),
        ),
        k=64,
        indices=ac.pb.Tensor(dtype=ac.pb.DTYPE_I32, shape=[2, 64], strides=[rows_stride, 1]),
    )


def test_inline_outputs_within_the_default_budget(make_daemon):
    """Four queued requests of 5 KB, each asking for a 400 MiB inline output, from one client:
    the daemon accepts what fits its per-client budget (1 GiB by default) and refuses the rest
    with RESOURCE_EXHAUSTED before allocating anything."""
    d = make_daemon("--workers=1", "--cpu-threads=1")
    c = d.client()
    slow = SlowCall(c, "budget-busy", seconds=6.0, hold=False)
    request = _huge_topk((400 << 20) // 4)
    assert request.ByteSize() < 8192
    rss_before = d.rss_bytes()
    blocker = slow.submit(timeout=300)
    wait_until(lambda: slow.in_flight() > 0, what="the worker busy")
    futures = [c._stub.TopK.future(request, timeout=300) for _ in range(4)]
    # The requests are resolved (outputs refused or allocated) before they queue: watch the
    # RSS while they wait behind the busy worker.
    rss_queued = rss_before
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline and not any(f.done() for f in futures):
        rss_queued = max(rss_queued, d.rss_bytes())
        time.sleep(0.05)
    codes = []
    for f in futures:
        try:
            f.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
            assert "--call-memory-bytes-per-client" in e.details(), e.details()
    slow.check(blocker.result(timeout=300))
    grown = rss_queued - rss_before
    print(f"codes {codes}; RSS grew {grown >> 20} MiB while queued")
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 2, codes
    assert grown < (1100 << 20), f"RSS grew {grown >> 20} MiB for queued inline outputs"
    alive_and_serving(d)


def test_call_memory_budget_total_and_per_client(make_daemon):
    """The budget is held by a stream-ordered TopK whose 56 MiB of inline logits wait in the
    daemon until its ready word is written (a pending call's request counts against the budget),
    so the test needs no call that lasts: it runs the same on a CPU and a GPU daemon."""
    d = make_daemon("--call-memory-bytes=96MiB", "--call-memory-bytes-per-client=64MiB")
    unix, tcp = d.client(), d.client(tcp=True)
    region = unix.create_host_region("budget-hold", 1 << 20)
    try:
        ready, done = SignalWord(region), SignalWord(region)
        cols = (28 << 20) // 4  # two rows of 28 MiB of f32 logits
        logits = np.random.default_rng(2).standard_normal((2, cols), dtype=np.float32)
        held = region.array("i32", (2, 64))
        held[...] = -7
        unix.enqueue(
            "topk",
            ready=ready.signal(1),
            done=done.signal(1),
            timeout=120,
            logits=logits,
            lengths=np.array([cols, cols], np.int32),
            k=64,
            indices=held,
        )
        request = _huge_topk((48 << 20) // 4)  # 48 MiB inline output
        code, details = code_of(lambda: unix._rpc(unix._stub.TopK, request, 300))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "--call-memory-bytes-per-client" in details, details
        # Another client has its own share, but the total (96 MiB) leaves it less than 48 MiB.
        code, details = code_of(lambda: tcp._rpc(tcp._stub.TopK, request, 300))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "--call-memory-bytes)" in details, details
        tcp._rpc(tcp._stub.TopK, _huge_topk(1000), 300)  # small outputs still fit
        ready.set(1)
        done.wait(1, timeout=120)
        for row in range(2):  # the held call ran on its own logits
            want = np.argpartition(-logits[row], 64)[:64]
            assert set(held[row].tolist()) == set(want.tolist())

        # Released: fits again. The held call's share returns just after its done word is
        # stored (docs/SERVICE.md "Call memory budget"), so the first try may still miss it.
        def fits():
            try:
                unix._rpc(unix._stub.TopK, request, 300)
            except ac.AttndError as e:
                assert e.code == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                return False
            return True

        wait_until(fits, 30, interval=0.1, what="the held call's budget returned")
    finally:
        region.close()
    alive_and_serving(d)


# ---- row 7: accept() recovers from EMFILE; the fd limit is raised at start --------------------


def _limits(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no Max open files line")


def _limited_daemon(attnd_bin, soft, hard, *flags):
    d = Daemon(attnd_bin, *flags, name="attnd-fd")
    d.argv = ["prlimit", f"--nofile={soft}:{hard}", "--"] + d.argv
    return d


def test_fd_soft_limit_raised_to_hard(attnd_bin):
    hard = min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    with _limited_daemon(attnd_bin, 256, hard) as d:
        assert _limits(d.pid) == (hard, hard)


def test_accept_recovers_after_emfile(attnd_bin):
    limit = 128
    with _limited_daemon(attnd_bin, limit, limit) as d:
        assert _limits(d.pid) == (limit, limit)
        idle = []
        try:
            # Idle gRPC connections until the daemon runs out of descriptors (accept4 fails
            # with EMFILE) and a connection is no longer taken.
            for _ in range(limit + 32):
                ch = grpc.insecure_channel(
                    d.unix_target, options=[("grpc.use_local_subchannel_pool", 1)]
                )
                idle.append(ch)
                try:
                    grpc.channel_ready_future(ch).result(timeout=3)
                except grpc.FutureTimeoutError:
                    break
            assert d.fd_count() >= limit - 2, d.fd_count()
        finally:
            for ch in idle:
                ch.close()
        assert d.alive(), d.log()
        # Once the idle connections are gone the listener accepts again.
        wait_until(lambda: d.fd_count() < limit // 2, what="the idle connections closed")
        fresh = ac.Client(d.unix_target)
        try:
            fresh.wait_ready(timeout=20)
            assert fresh.health() == "SERVING"
        finally:
            fresh.close()


# ---- row 10: slow /metrics clients cannot block scrapes ---------------------------------------


class SlowMetricsClients:
    """`n` connections to /metrics that send half a request and then nothing; each is reopened
    as soon as the server drops it, until stop()."""

    def __init__(self, address, n):
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))
        self.stop_flag = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _run(self):
        while not self.stop_flag.is_set():
            try:
                with socket.create_connection(self.target, timeout=5) as s:
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    s.settimeout(0.2)
                    while not self.stop_flag.is_set():
                        try:
                            if s.recv(1024) == b"":
                                break  # dropped by the server: reconnect
                        except TimeoutError:
                            continue
            except OSError:
                time.sleep(0.05)

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(10)


@pytest.mark.parametrize("slow_clients", [4, 16])
def test_slow_metrics_clients_do_not_block_scrapes(make_daemon, slow_clients):
    d = make_daemon()
    d.scrape()
    slow = SlowMetricsClients(d.metrics_address, slow_clients)
    try:
        time.sleep(0.5)
        took = []
        for _ in range(5):
            start = time.monotonic()
            text = d.scrape()
            took.append(time.monotonic() - start)
            assert "attnd_build_info" in text
        print("scrapes took " + ", ".join(f"{t:.3f}" for t in took) + " s")
        assert max(took) < 1.0, took
    finally:
        slow.stop()


# ---- row 11: safe defaults ---------------------------------------------------------------------


def test_ready_file_never_follows_a_symlink(attnd_bin, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    d = Daemon(attnd_bin, name="attnd-ready")
    try:
        # The temporary file beside --ready-file is planted as a symlink to the victim, under
        # the name an attnd with this pid would use; exec keeps the shell's pid.
        shell = f'ln -s {victim} "{d.ready_file}.tmp.$$" && exec "$@"'
        d.argv = ["/bin/sh", "-c", shell, "sh"] + d.argv
        d.start()
        assert victim.read_text() == "precious\n"
        assert not os.path.islink(d.ready_file)
        with open(d.ready_file) as f:
            assert f.read().startswith("grpc unix:")
    finally:
        d.stop()
        d.cleanup()


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: plants a file owned by another uid (chown)"
)


@needs_root
def test_foreign_owned_socket_path_is_refused(attnd_bin):
    d = Daemon(attnd_bin, tcp=False, metrics=False, name="attnd-squat")
    try:
        squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        squatter.bind(d.socket)  # a stale socket (nothing listening) owned by another user
        squatter.close()
        os.chown(d.socket, OTHER_UID, OTHER_UID)
        with pytest.raises(RuntimeError) as e:
            d.start()
        assert "exited with 1" in str(e.value), str(e.value)
        assert f"uid {OTHER_UID}" in str(e.value), str(e.value)
    finally:
        d.cleanup()


def test_log_fields_are_bounded(make_daemon):
    d = make_daemon()
    c = d.client()
    with c.session(client_name="n" * (16 << 20)):
        pass
    wait_until(lambda: "session closed" in d.log(), what="the session logged")
    longest = max(len(line) for line in d.log().splitlines())
    assert longest < 8192, f"a log line of {longest} bytes"
    alive_and_serving(d)


def test_unparsable_request_is_invalid_argument(daemon):
    channel = grpc.insecure_channel(daemon.unix_target)
    try:
        for method in ["TopK", "SparseMla", "RegisterHostRegion", "GetInfo"]:
            call = channel.unary_unary(f"/attnd.v1.Attention/{method}")
            with pytest.raises(grpc.RpcError) as e:
                call(b"\xff\xff\xff\xff\x0f", timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, e.value.code())
            assert "attnd.v1." in e.value.details(), e.value.details()
    finally:
        channel.close()
    assert daemon.client().health() == "SERVING"


def _probe_draining(d):
    """A fresh connection during the drain: health NOT_SERVING, a new call UNAVAILABLE."""
    probe = ac.Client(d.unix_target)
    try:
        # A fresh connection and a fresh health check, not a Watch opened before the signal.
        # The signal is handled asynchronously (its thread, then the shutdown that sets the
        # status): NOT_SERVING comes within moments, later on a loaded machine.
        wait_until(
            lambda: probe.health(timeout=10) == "NOT_SERVING",
            30,
            interval=0.02,
            what="health NOT_SERVING during the drain",
        )
        case = cases.make_case("topk", np.random.default_rng(0))
        code, details = code_of(lambda: probe.call(case.op, timeout=10, **case.arguments()))
        assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
    finally:
        probe.close()


def test_not_serving_visible_while_draining(make_daemon):
    d = make_daemon("--workers=1", "--cpu-threads=1", "--drain-timeout=120s")
    c = d.client()
    if c.info().backend != "cpu":
        # No call this test can build computes for seconds on a GPU (the largest SlowCall takes
        # ~0.4 ms on the H200); the stream-ordered variant below holds the drain on every backend.
        pytest.skip("needs a call that holds a worker for seconds: CPU daemon only")
    slow = SlowCall(c, "drain-busy", seconds=3.0)
    # The calibration calls' worker reports idle only after their replies (and their pins go
    # with them): wait for both, so what is counted below is the slow call's.
    wait_until(
        lambda: (
            sample(parse_metrics(d.scrape()), "attnd_workers_busy") == 0 and slow.in_flight() == 0
        ),
        interval=0.02,
        what="the calibration calls finished",
    )
    running = slow.submit(timeout=300)
    wait_until(lambda: slow.in_flight() > 0, what="a call in flight")
    # Running on the worker, not only resolving its regions: the drain then has work to wait for.
    wait_until(
        lambda: sample(parse_metrics(d.scrape()), "attnd_workers_busy") >= 1,
        what="the call running on a worker",
    )
    d.signal(signal.SIGTERM)
    _probe_draining(d)
    slow.check(running.result(timeout=300))
    assert d.wait(120) == 0, d.log()


def _enqueue_unready(c, rng, name):
    """A stream-ordered top-k call whose ready word (3) is not reached yet: (case, outs, ready,
    done, region). Accepted work the drain must wait for, on any backend."""
    case = cases.make_case("topk", rng)
    region = c.create_host_region(name, cases.region_bytes(case) + 4096)
    views = {n: region.put(a, case.input_dtypes[n]) for n, a in case.inputs.items()}
    outs = {n: region.array(dt, shape) for n, (dt, shape) in case.outputs.items()}
    for n, (dt, _) in case.outputs.items():
        outs[n][...] = cases.POISON[dt]
    args = dict(views)
    args.update(case.scalars)
    args.update(outs)
    ready, done = SignalWord(region), SignalWord(region)
    c.enqueue(case.op, ready=ready.signal(3), done=done.signal(7), timeout=300, **args)
    return case, outs, ready, done, region


def _still_poisoned(case, outs):
    for n, (dt, _) in case.outputs.items():
        ok = np.isnan(outs[n]).all() if dt == "f32" else (outs[n] == cases.POISON[dt]).all()
        if not ok:
            return False
    return True


def test_drain_runs_stream_ordered_call_signalled_in_time(make_daemon, rng):
    """Every backend: an accepted stream-ordered call holds the drain (NOT_SERVING visible, new
    calls refused) and still runs when its ready word comes; attnd then exits 0 at once."""
    d = make_daemon("--drain-timeout=120s")
    c = d.client()
    case, outs, ready, done, _ = _enqueue_unready(c, rng, "drain-so")
    d.signal(signal.SIGTERM)
    time.sleep(0.3)
    assert d.proc.poll() is None, "attnd exited with an accepted call pending: " + d.log()
    _probe_draining(d)
    assert done.get() == 0 and _still_poisoned(case, outs)
    start = time.monotonic()
    ready.set(3)
    assert done.wait(7, timeout=60) == 7, "the accepted call did not run during the drain"
    case.check(outs)
    assert d.wait(60) == 0, d.log()
    assert time.monotonic() - start < 30, "the drain outlived its last call"


def test_drain_timeout_fails_unsignalled_stream_ordered_call(make_daemon, rng):
    """Every backend: a call whose ready word never comes holds the drain until --drain-timeout
    and no longer (the timeout is a hard limit); it fails without running."""
    d = make_daemon("--drain-timeout=2s")
    c = d.client()
    case, outs, ready, done, _ = _enqueue_unready(c, rng, "drain-so-never")
    start = time.monotonic()
    d.signal(signal.SIGTERM)
    assert d.wait(60) == 0, d.log()
    took = time.monotonic() - start
    assert 1.5 <= took < 2 + 2 + 6, f"exited after {took:.2f} s with --drain-timeout=2s"
    assert done.get() == 7 | FAILURE_BIT, hex(done.get())
    assert _still_poisoned(case, outs)
    ready.set(3)  # too late: nothing runs any more
    time.sleep(0.2)
    assert _still_poisoned(case, outs)


def test_garbage_ring_entries_stay_in_their_ring(daemon, rng):
    """One client fills its submission ring with garbage (random slot bytes rewritten while the
    daemon reads them, then a head overrun); another client's ring and its prepared calls on the
    same daemon keep running, in order and correct (docs/SERVICE.md "Submission rings")."""
    hostile, good = daemon.client(), daemon.client()
    case = cases.make_case("sparse_mla", rng)
    with (
        good.create_host_region("ring-good", cases.region_bytes(case) + (1 << 16)) as region,
        hostile.create_host_region("ring-bad", 1 << 16) as bad_region,
    ):
        views = {k: region.put(a, case.input_dtypes[k]) for k, a in case.inputs.items()}
        views.update({k: region.array(d, sh) for k, (d, sh) in case.outputs.items()})
        args = {k: views[k] for k in case.inputs}
        args.update(case.scalars)
        args.update({k: views[k] for k in case.outputs})
        call_id = good.prepare_call("sparse_mla", **args)
        slots = region.array("u8", ac_rings.ring_bytes(8))
        ring_offset = slots.__array_interface__["data"][0] - region.address
        good_ring = good.open_ring(region, offset=ring_offset, entries=8)
        bad_ring = hostile.open_ring(bad_region, offset=0, entries=64)
        words = bad_ring._words  # the hostile client's own view of its ring
        stop = threading.Event()

        def storm():
            r = np.random.default_rng(7)
            head = 0
            while not stop.is_set():
                for _ in range(64):
                    i = 24 + int(r.integers(0, 64 * 8))
                    words[i] = int(r.integers(0, 1 << 63)) if r.random() < 0.8 else head + 1
                if words[8] == head:  # the daemon caught up: a new lap of garbage
                    head += int(r.integers(1, 65))
                    words[0] = head

        thread = threading.Thread(target=storm)
        thread.start()
        try:
            for k in range(6):
                fresh = cases.make_case("sparse_mla", rng)  # same shapes, new data
                for name, array in fresh.inputs.items():
                    views[name][...] = array
                outs = {name: views[name] for name in case.outputs}
                for name, (dtype, _) in case.outputs.items():
                    outs[name][...] = cases.POISON[dtype]
                ready, done = SignalWord(region), SignalWord(region)
                assert good_ring.submit(call_id, ready.offset, 1, done.offset, 100 + k)
                time.sleep(0.05)
                assert done.get() == 0
                ready.set(1)
                assert done.wait(100 + k, timeout=20) == 100 + k
                fresh.check(outs)
        finally:
            stop.set()
            thread.join()
        # Then an overrun: the hostile ring errors, the good one goes on. 65 past the last head,
        # not past the tail read here: the daemon may still be taking that lap's entries, and a
        # tail that moves after it was read would leave the new head only 64 or fewer past it.
        words[0] = int(words[0]) + 65
        wait_until(lambda: bad_ring.state == 2, 10, what="the overrun ring errored")
        done = SignalWord(region)
        assert good_ring.submit(call_id, None, 0, done.offset, 7)
        assert done.wait(7, timeout=20) == 7
        # An anonymous TCP caller can neither close these rings nor open one on these regions.
        tcp = daemon.client(tcp=True)
        with pytest.raises(ac.AttndError) as e:
            tcp.close_ring(good_ring.ring_id)
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as rpc:
            tcp._stub.OpenRing(
                ac.pb.OpenRingRequest(region="ring-good", offset=ring_offset, entries=8)
            )
        assert rpc.value.code() == grpc.StatusCode.NOT_FOUND
        tcp.close()
        good_ring.close()
    assert daemon.alive()
    counts = parse_metrics(daemon.scrape())
    assert sample(counts, "attnd_ring_entries_total", result="invalid") > 0
    assert sample(counts, "attnd_ring_entries_total", result="overrun") >= 1
