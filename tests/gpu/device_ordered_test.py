#!/usr/bin/env python3
"""Device-ordered stream-ordered calls on the CUDA backend (docs/SERVICE.md "Stream-ordered
calls on a CUDA device"), against a running CUDA attnd. Every tensor lies in a device region, so
each call is enqueued wholly on the daemon's device stream (wait ready, gate, op, done): the
metrics' attnd_stream_ordered_calls_total{event="device"} must count them.

  (a) ordering: the caller's stream produces q behind a GPU busy-wait, writes ready
      (cuStreamWriteValue64), waits for done (cuStreamWaitValue64) and copies out, for several
      calls, with no host synchronisation until the end; each copy equals its own step's fp64
      reference (a copy taken before the op ran is NaN-poisoned or the previous step's);
  (b) the watchdog: a call whose ready never comes gets done = value | 2^62 (the failure bit)
      at its deadline, and a caller's stream waiting for done >= value (cuStreamWaitValue64's
      cyclic compare) ends on that word; its outputs stay poisoned,
      attnd_signal_timeouts_total grows, and meanwhile another connection's device calls
      complete;
  (c) signal words in host regions (a) and in device regions (c);
  (d) a caller chain captured into a CUDA graph (q update, write ready, wait done, copy out)
      replayed several times with a daemon call enqueued before each replay;
  (e) a prepared call run through a submission ring whose signal words lie in a device region
      (open_ring(signals=<the region's name>)): no RPC per step, the same per-step checks as
      (c), and the ring's blocking call() refuses (this process cannot poll device words).

    PYTHONPATH=bundle/python python3 device_ordered_test.py --target unix:/tmp/x/attnd.sock \\
        --metrics http://127.0.0.1:9464/metrics

Exit status 0 when every check passed.
"""

import argparse
import ctypes
import math
import re
import sys
import time
import traceback
import urllib.request

import torch

import attnd_client as ac
from attnd_client.stream_ordered import FAILURE_BIT

DEV = torch.device("cuda", 0)
WAIT_GEQ = 0


def scrape(url):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            samples[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return samples


def device_count(url):
    return scrape(url).get(("attnd_stream_ordered_calls_total", '{event="device"}'), 0.0)


def timeouts(url):
    return scrape(url).get(("attnd_signal_timeouts_total", ""), 0.0)


class Driver:
    """cuStreamWriteValue64 / cuStreamWaitValue64 on device addresses (libcuda via ctypes)."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        u64, vp, uint = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint

        def sym(*names):
            for n in names:
                if hasattr(lib, n):
                    f = getattr(lib, n)
                    f.argtypes = [vp, u64, u64, uint]
                    f.restype = ctypes.c_int
                    return f
            raise RuntimeError(f"libcuda has none of {names}")

        self._write = sym("cuStreamWriteValue64_v2", "cuStreamWriteValue64")
        self._wait = sym("cuStreamWaitValue64_v2", "cuStreamWaitValue64")

    def write(self, address, value, stream):
        r = self._write(stream, address, value, 0)
        if r != 0:
            raise RuntimeError(f"cuStreamWriteValue64: CUresult {r}")

    def wait(self, address, value, stream):
        r = self._wait(stream, address, value, WAIT_GEQ)
        if r != 0:
            raise RuntimeError(f"cuStreamWaitValue64: CUresult {r}")


class Checks:
    def __init__(self):
        self.failed = 0

    def expect(self, ok, what):
        print(("  ok    " if ok else "  FAIL  ") + what, flush=True)
        if not ok:
            self.failed += 1

    def close(self, got, ref, what):
        got = got.double()
        finite = bool(torch.isfinite(got).all())
        err = float((got - ref).norm() / ref.norm().clamp_min(1e-30)) if finite else math.inf
        self.expect(finite and err < 2e-2, f"{what}: rel l2 {err:.2e} (finite: {finite})")


def ref_sparse_mla(q, kv, indices, scale):
    """frontend_test.py's fp64 reference (out only)."""
    from frontend_test import ref_sparse_mla as ref

    return ref(q, kv, indices, scale)[0]


def inputs(t=8, h=64, s=2048, k=128):
    q = torch.randn(t, h, 576, device=DEV).bfloat16()
    kv = torch.randn(s, 576, device=DEV).bfloat16()
    indices = torch.randint(0, s, (t, k), dtype=torch.int32, device=DEV)
    out = torch.full((t, h, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse = torch.full((t, h), float("nan"), dtype=torch.float32, device=DEV)
    return dict(q=q, kv=kv, indices=indices, sm_scale=1 / math.sqrt(576), out=out, lse=lse)


def host_words(client, name):
    from attnd_client.stream_ordered import SignalWord

    region = client.create_host_region(name, 4096)
    return region, SignalWord(region), SignalWord(region)


def run_ordering(client, url, checks, drv):
    """(a) + (c, host words): a chain of calls, no host sync until the end."""
    from attnd_client.cuda_signals import StreamSignals

    args = inputs()
    region, ready, done = host_words(client, "h1-host-signals")
    before = device_count(url)
    stream = torch.cuda.current_stream()
    steps, qs, outs = 4, [], []
    torch.cuda.synchronize()
    with StreamSignals(region) as signals:
        for n in range(1, steps + 1):
            torch.cuda._sleep(20_000_000)  # the GPU busy for ms before q is ready
            args["q"].copy_(torch.randn_like(args["q"], dtype=torch.float32).bfloat16())
            qs.append(args["q"].clone())
            client.enqueue("sparse_mla", ready=ready.signal(n), done=done.signal(n), **args)
            signals.write(ready, n, stream.cuda_stream)
            signals.wait(done, n, stream.cuda_stream)
            outs.append(args["out"].clone())
        torch.cuda.synchronize()
    word = done.get()
    checks.expect(word == steps, f"(a) host words: done {word:#x}, want {steps}")
    for n in range(steps):
        ref = ref_sparse_mla(qs[n], args["kv"], args["indices"], args["sm_scale"])
        checks.close(outs[n], ref, f"(a) step {n + 1} out")
    got = device_count(url) - before
    checks.expect(got >= steps, f"(a) device-path calls counted: {got}, want >= {steps}")
    region.close()


def device_word_steps(client, url, checks, drv, args, label, submit, steps=3):
    """The steps of (c) and (e): ready and done in a device region (a torch tensor registered
    as one); per step the caller's stream produces q behind a GPU busy-wait, `submit(region,
    ready_offset, done_offset, n)` queues the daemon's call, the stream writes ready = n, waits
    for done >= n and copies out; then each copy against its step's fp64 reference."""
    words = torch.zeros(16, dtype=torch.uint8, device=DEV)  # two u64 words (attnd has no i64)
    ref_words = client._device_region(words)
    base = ref_words.offset
    stream = torch.cuda.current_stream()
    ptr = words.data_ptr()
    qs, outs = [], []
    torch.cuda.synchronize()
    before = device_count(url)
    for n in range(1, steps + 1):
        torch.cuda._sleep(10_000_000)
        args["q"].copy_(torch.randn_like(args["q"], dtype=torch.float32).bfloat16())
        qs.append(args["q"].clone())
        submit(ref_words.region, base, base + 8, n)
        drv.write(ptr, n, stream.cuda_stream)
        drv.wait(ptr + 8, n, stream.cuda_stream)
        outs.append(args["out"].clone())
    torch.cuda.synchronize()
    word = int(words.view(torch.int64)[1].item()) & ((1 << 64) - 1)
    checks.expect(word == steps, f"{label}: done {word:#x}, want {steps}")
    for n in range(steps):
        ref = ref_sparse_mla(qs[n], args["kv"], args["indices"], args["sm_scale"])
        checks.close(outs[n], ref, f"{label} step {n + 1} out")
    got = device_count(url) - before
    checks.expect(got >= steps, f"{label}: device-path calls counted: {got}, want >= {steps}")


def run_device_words(client, url, checks, drv):
    """(c): ready and done in a device region, each call enqueued by an RPC."""
    from attnd_client.stream_ordered import Signal

    args = inputs()

    def submit(region, ready_at, done_at, n):
        client.enqueue(
            "sparse_mla", ready=Signal(region, ready_at, n), done=Signal(region, done_at, n), **args
        )

    device_word_steps(client, url, checks, drv, args, "(c) device words", submit)


def run_ring_device_words(client, url, checks, drv):
    """(e): a prepared call submitted through a ring whose signal words lie in a device region
    (open_ring(signals=<its name>)); the ring's blocking call() refuses such a ring."""
    from attnd_client.rings import ring_bytes
    from attnd_client.stream_ordered import SignalWord

    args = inputs()
    call_id = client.prepare_call("sparse_mla", **args)
    slots = client.create_host_region("e-ring-slots", ring_bytes(64))
    ring = None

    def submit(region, ready_at, done_at, n):
        nonlocal ring
        if ring is None:
            ring = client.open_ring(slots, 0, 64, signals=region)
        while not ring.submit(call_id, ready_at, n, done_at, n):
            time.sleep(50e-6)

    try:
        device_word_steps(client, url, checks, drv, args, "(e) ring, device words", submit)
        try:
            ring.call(call_id, SignalWord(slots), 1, timeout=1)
            checks.expect(False, "(e) ring.call with device words raised nothing")
        except ValueError as e:
            checks.expect("does not poll" in str(e), f"(e) ring.call refused: {e}")
    finally:
        if ring is not None:
            ring.close()
        client.release_call(call_id)
        slots.close()


def run_watchdog(client, other, url, checks, drv):
    """(b): ready never comes -> failure bit at the deadline; another connection keeps going."""
    from attnd_client.cuda_signals import StreamSignals

    stuck = inputs()
    region, ready, done = host_words(client, "h1-stuck")
    t0_timeouts = timeouts(url)
    torch.cuda.synchronize()
    client.enqueue("sparse_mla", ready=ready.signal(7), done=done.signal(7), timeout=2.0, **stuck)
    # A frontend's stream waits for done >= 7, then sets a marker: the failure bit must end that
    # wait too (docs/SERVICE.md "Failure bit").
    waiter = torch.cuda.Stream()
    marker = torch.zeros(1, dtype=torch.int32, device=DEV)
    signals_stuck = StreamSignals(region)
    with torch.cuda.stream(waiter):
        signals_stuck.wait(done, 7, waiter.cuda_stream)
        marker.fill_(1)
    # Meanwhile another connection (its own queue and device stream) runs calls to the end.
    oargs = inputs()
    oregion, oready, odone = host_words(other, "h1-other")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), StreamSignals(oregion) as signals:
        for n in range(1, 4):
            other.enqueue("sparse_mla", ready=oready.signal(n), done=odone.signal(n), **oargs)
            signals.write(oready, n, stream.cuda_stream)
    t = time.monotonic()
    while odone.get() < 3 and time.monotonic() - t < 10:
        time.sleep(1e-3)
    took = time.monotonic() - t
    checks.expect(
        odone.get() == 3 and took < 1.9,
        f"(b) another connection's calls completed while one waits: done {odone.get()} "
        f"after {took * 1e3:.1f} ms (the stuck call's deadline is 2 s)",
    )
    # The stuck call's done word: its failure bit (wait() raises on it, so poll the word).
    t = time.monotonic()
    while done.get() < 7 and time.monotonic() - t < 15:
        time.sleep(1e-3)
    word = done.get()
    checks.expect(word == 7 | FAILURE_BIT, f"(b) stuck call: done {word:#x}, want 7 | 2^62")
    t = time.monotonic()
    while not waiter.query() and time.monotonic() - t < 5:
        time.sleep(1e-3)
    ended = waiter.query()
    checks.expect(ended, f"(b) a stream waiting for done >= 7 ended on done {word:#x}")
    if not ended:
        done.set(7)  # release it, or the synchronise below hangs
    waiter.synchronize()
    checks.expect(int(marker.item()) == 1, "(b) the waiting stream ran on past its wait")
    signals_stuck.close()
    torch.cuda.synchronize()
    checks.expect(
        bool(torch.isnan(stuck["out"].float()).all()), "(b) stuck call's out stays poisoned"
    )
    grew = timeouts(url) - t0_timeouts
    checks.expect(grew >= 1, f"(b) attnd_signal_timeouts_total grew by {grew}")
    # The watchdog raised the caller's ready word to release the daemon's stream wait.
    checks.expect(ready.get() >= 7, f"(b) ready word raised by the watchdog: {ready.get()}")
    # The queue still works after the timeout.
    ok_args = inputs()
    client.enqueue("sparse_mla", ready=ready.signal(8), done=done.signal(8), **ok_args)
    ready.set(8)
    word = done.wait(8, timeout=10)
    checks.expect(word == 8, f"(b) the next call of the queue runs: done {word:#x}")
    torch.cuda.synchronize()
    ref = ref_sparse_mla(ok_args["q"], ok_args["kv"], ok_args["indices"], ok_args["sm_scale"])
    checks.close(ok_args["out"], ref, "(b) next call out")
    region.close()
    oregion.close()


def run_graph_chain(client, url, checks, drv):
    """(d): the caller's chain captured in a CUDA graph, replayed with daemon calls between."""
    from attnd_client.cuda_signals import StreamSignals

    args = inputs()
    region, ready, done = host_words(client, "h1-graph")
    src = torch.empty_like(args["q"])
    snap = torch.empty_like(args["out"])
    with StreamSignals(region) as signals:
        ready_addr, done_addr = signals.device_address(ready), signals.device_address(done)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                args["q"].copy_(src)
                drv.write(ready_addr, 1, s.cuda_stream)
                drv.wait(done_addr, 1, s.cuda_stream)
                snap.copy_(args["out"])
        torch.cuda.synchronize()
        for rep in range(3):
            ready.set(0)
            done.set(0)
            args["out"].fill_(float("nan"))
            src.copy_(torch.randn_like(src, dtype=torch.float32).bfloat16())
            torch.cuda.synchronize()
            client.enqueue("sparse_mla", ready=ready.signal(1), done=done.signal(1), **args)
            g.replay()
            torch.cuda.synchronize()
            checks.expect(done.get() == 1, f"(d) replay {rep}: done {done.get():#x}")
            ref = ref_sparse_mla(src, args["kv"], args["indices"], args["sm_scale"])
            checks.close(snap, ref, f"(d) replay {rep} out")
    region.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--metrics", required=True)
    a = p.parse_args()
    torch.manual_seed(1)
    checks = Checks()
    drv = Driver()
    with ac.Client(a.target) as client, ac.Client(a.target) as other:
        client.wait_ready(timeout=60)
        for name, fn in (
            ("ordering", lambda: run_ordering(client, a.metrics, checks, drv)),
            ("device words", lambda: run_device_words(client, a.metrics, checks, drv)),
            ("watchdog", lambda: run_watchdog(client, other, a.metrics, checks, drv)),
            ("graph chain", lambda: run_graph_chain(client, a.metrics, checks, drv)),
            ("ring, device words", lambda: run_ring_device_words(client, a.metrics, checks, drv)),
        ):
            print(f"== {name}", flush=True)
            try:
                fn()
            except Exception:  # noqa: BLE001 - report and go on with the next case
                traceback.print_exc()
                checks.expect(False, f"{name} raised")
    print(f"device_ordered_test: {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
