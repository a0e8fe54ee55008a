#!/usr/bin/env python3
"""Issue 15 probes from the Python client (run by bench/service_probe/run.sh; not a test; docs/BENCHMARKS.md "H200 run at 8e55a36").

--parts gap:    SparseMla through the daemon with device regions (CPU mode: host regions, small
               shapes), per variant: median compute_us / client wall / server total, impl, graph
               outcomes, work_count, count_readback_bytes. Variants: the service benchmark's
               shape (T64 H128 K2048 S64K), the kernel benchmark's pool (S 2M), idle gaps between
               calls, FAST vs HIGH, exact count read-back (K4096: 1 MiB) vs upper_bound (K4160),
               alternating output buffers (graph update vs hit), two concurrent callers.
--parts small:  blocking-form overhead (wall - compute) of a tiny SparseMla, unary and Session,
               and the GetInfo round trip.
--parts cpu:    caller CPU per stream-ordered prepared call: RunPrepared RPC vs submission ring.
One JSON line per row to --out (appended); a table on stdout.
"""

import argparse
import datetime
import json
import os
import sys
import threading
import time
import traceback

import grpc
import numpy as np

import attnd_client as ac

sys.path.insert(0, os.environ.get("SERVICE_BENCH_DIR", "."))
import service_bench as sb  # noqa: E402  (tests/gpu/service_bench.py: tensor factories)


def pct(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def us(x):
    return None if x is None else round(x * 1e6, 2)


class Rows:
    def __init__(self, args, device):
        self.args = args
        self.device = device
        self.rows = []

    def add(self, **row):
        row.update(
            client="python",
            commit=self.args.commit,
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            device=self.device,
            backend=self.args.device,
            graphs=self.args.graphs,
        )
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        with open(self.args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


def factory(args, client):
    if args.device == "cuda":
        tf = sb.TorchTensors(args.seed)
        return tf, tf.torch.cuda.get_device_name(0)
    return sb.HostRegionArrays(client, args.seed, 256 << 20), f"cpu: {sb.cpu_name()}"


def sparse_args(tf, shape, precision):
    a = sb.sparse_mla_args(tf, shape)
    if precision:
        a["precision"] = precision
    return a


def timed_calls(caller, a, iters, warmup, gap):
    """Blocking calls one at a time; per call wall and the server's stats."""
    for _ in range(warmup):
        caller(a)
    wall, comp, total, graphs, counts, readback, impl = [], [], [], {}, set(), 0, ""
    prep, queue, run = [], [], []
    for _ in range(iters):
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter()
        st = caller(a)
        t1 = time.perf_counter()
        wall.append(t1 - t0)
        comp.append(st.compute_seconds)
        total.append(st.total_seconds)
        prep.append(st.prepare_seconds)
        queue.append(st.queue_seconds)
        run.append(st.run_seconds)
        graphs[st.graph or "-"] = graphs.get(st.graph or "-", 0) + 1
        counts.add(st.work_count)
        readback = max(readback, st.count_readback_bytes)
        impl = st.impl
    return dict(
        iters=iters,
        gap_ms=gap * 1e3,
        compute_p50_us=us(pct(comp, 50)),
        compute_p10_us=us(pct(comp, 10)),
        compute_min_us=us(min(comp)),
        compute_p90_us=us(pct(comp, 90)),
        wall_p50_us=us(pct(wall, 50)),
        wall_p90_us=us(pct(wall, 90)),
        server_total_p50_us=us(pct(total, 50)),
        server_prepare_p50_us=us(pct(prep, 50)),
        server_queue_p50_us=us(pct(queue, 50)),
        server_run_p50_us=us(pct(run, 50)),
        overhead_p50_us=us(pct([w - c for w, c in zip(wall, comp, strict=True)], 50)),
        transport_overhead_p50_us=us(pct([w - t for w, t in zip(wall, total, strict=True)], 50)),
        overhead_p90_us=us(pct([w - c for w, c in zip(wall, comp, strict=True)], 90)),
        impl=impl,
        graph=graphs,
        work_count=sorted(counts),
        count_readback_bytes=readback,
    )


def preset_of(s):
    return f"T{s['t']}_H{s['h']}_d{s['d_qk']}_K{s['topk']}_S{s['s']}"


def part_gap(args, client, rows, tf):
    full = args.device == "cuda"
    base = sb.PRESETS["sparse_mla"]["full" if full else "small"]
    n = args.iters
    call = lambda a: client.call("sparse_mla", **a).stats  # noqa: E731
    variants = [
        ("base_warm", {}, None, 0.0, n),
        ("base_warm_high", {}, "high", 0.0, n),
        ("base_gap2ms", {}, None, 0.002, n // 2),
        ("base_gap20ms", {}, None, 0.020, max(20, n // 8)),
        ("pool_S2M_warm", {"s": 64 * 32768 if full else 8 * base["s"]}, None, 0.0, n),
        ("pool_S2M_warm_high", {"s": 64 * 32768 if full else 8 * base["s"]}, "high", 0.0, n),
        # 1 MiB of indices is still read back (exact); 4160 slots make it upper_bound.
        ("k4096_exact_readback", {"topk": 4096 if full else 1024}, None, 0.0, n),
        ("k4160_upper_bound", {"topk": 4160 if full else 1040}, None, 0.0, n),
        # The same with K 2048: T128 reads 1 MiB back, T130 is upper_bound (both two waves).
        ("t128_exact_readback", {"t": 128 if full else 16}, None, 0.0, n),
        ("t130_upper_bound", {"t": 130 if full else 17}, None, 0.0, n),
    ]
    for name, over, precision, gap, iters in variants:
        shape = dict(base, **over)
        a = sparse_args(tf, shape, precision)
        tf.sync()
        try:
            r = timed_calls(call, a, iters, args.warmup, gap)
        except ac.AttndError as e:
            r = dict(error=f"{e.code.name}: {e.details}")
        rows.add(
            op="sparse_mla",
            probe="gap",
            variant=name,
            preset=preset_of(shape),
            precision=precision or "fast(default)",
            path="blocking",
            api="unary",
            **r,
        )
        del a
    # Alternating output buffers: every call a new pointer set (graph update, not a hit).
    a1 = sparse_args(tf, base, None)
    a2 = dict(
        a1,
        out=tf.nan((base["t"], base["h"], 512), "bf16"),
        lse=tf.nan((base["t"], base["h"]), "f32"),
    )
    flip = [0]

    def alt(a):
        flip[0] ^= 1
        return client.call("sparse_mla", **(a1 if flip[0] else a2)).stats

    tf.sync()
    rows.add(
        op="sparse_mla",
        probe="gap",
        variant="alternating_outputs",
        preset=preset_of(base),
        precision="fast(default)",
        path="blocking",
        api="unary",
        **timed_calls(alt, None, n, args.warmup, 0.0),
    )
    # Two callers at once on the same client (its regions are registered already), each with
    # its own outputs: the daemon runs them on two streams side by side.
    results = [None, None]

    def worker(i, a):
        call2 = lambda x: client.call("sparse_mla", **x).stats  # noqa: E731
        results[i] = timed_calls(call2, a, n, 5, 0.0)

    tf.sync()
    ths = [threading.Thread(target=worker, args=(i, x)) for i, x in enumerate((a1, a2))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    for i, r in enumerate(results):
        if r:
            rows.add(
                op="sparse_mla",
                probe="gap",
                variant=f"two_callers_{i}",
                preset=preset_of(base),
                precision="fast(default)",
                path="blocking",
                api="unary",
                **r,
            )


def tiny_shape():
    return dict(t=4, h=8, d_qk=576, topk=64, s=512)


def part_small(args, client, rows, tf):
    shape = tiny_shape()
    a = sparse_args(tf, shape, None)
    tf.sync()
    n = args.iters

    def small(api, caller, **extra):
        r = timed_calls(caller, a, n, args.warmup, 0.0)
        rows.add(
            op="sparse_mla",
            probe="small",
            preset=preset_of(shape),
            path="blocking",
            api=api,
            **extra,
            **r,
        )

    small("unary", lambda x: client.call("sparse_mla", **x).stats)
    with client.session("h4-probe") as s:
        small("session", lambda x: s.call("sparse_mla", **x).stats)
    # Where the Python client's time goes: building the request alone (tensor references,
    # device-region look-ups and the one synchronize per device), and the stub call alone on a
    # request built once (gRPC and the daemon, no client code around it).
    spec = ac.ops.spec("sparse_mla")
    for _ in range(args.warmup):
        request, sinks = ac.ops.build_request(spec, client._codec, a)
    t0 = time.perf_counter()
    for _ in range(n):
        request, sinks = ac.ops.build_request(spec, client._codec, a)
    build_us = (time.perf_counter() - t0) / n * 1e6
    method = getattr(client._stub, spec.rpc)
    for _ in range(args.warmup):
        method(request)
    wall, comp, total = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        response = method(request)
        wall.append(time.perf_counter() - t0)
        comp.append(response.stats.compute_seconds)
        total.append(response.stats.total_seconds)
    rows.add(
        op="sparse_mla",
        probe="small_parts",
        preset=preset_of(shape),
        path="blocking",
        api="unary",
        build_request_us=round(build_us, 2),
        stub_call_wall_p50_us=us(pct(wall, 50)),
        stub_call_compute_p50_us=us(pct(comp, 50)),
        stub_call_server_total_p50_us=us(pct(total, 50)),
        stub_call_wall_minus_total_p50_us=us(
            pct([w - t for w, t in zip(wall, total, strict=True)], 50)
        ),
        grpcio=grpc.__version__,
        python=sys.version.split()[0],
        iters=n,
    )
    # The prepared form of the same call, blocking (RunPrepared without signals): no request to
    # build on the client and only the call id sent (the daemon still resolves and checks the
    # tensors on every run).
    try:
        call_id = client.prepare_call("sparse_mla", **a)
        small("unary", lambda x: client.run_prepared(call_id), prepared=True)
        client.release_call(call_id)
        with client.session("h4-probe-prepared") as s:
            call_id = s.prepare_call("sparse_mla", **a)
            small("session", lambda x: s.run_prepared(call_id).result(), prepared=True)
    except ac.AttndError as e:
        rows.add(op="sparse_mla", probe="small", prepared=True, error=f"{e.code.name}: {e}")
    ring_waited(args, client, rows, a, shape, tf)
    # GetInfo on this client's channel, then on channels with fewer client filters (the
    # channel arguments a frontend may pass through Client(options=...)).
    variants = [
        ("default", None),
        ("no_retries", [("grpc.enable_retries", 0)]),
    ]
    for name, options in variants:
        c = client if options is None else ac.Client(args.target, options=options, timeout=60)
        try:
            for _ in range(args.warmup):
                c.info()
            rt = []
            for _ in range(n):
                t0 = time.perf_counter()
                c.info()
                rt.append(time.perf_counter() - t0)
        finally:
            if c is not client:
                c.close()
        rows.add(
            op="get_info",
            probe="small",
            preset="-",
            path="blocking",
            api="unary",
            channel=name,
            grpcio=grpc.__version__,
            round_trip_p50_us=us(pct(rt, 50)),
            round_trip_p90_us=us(pct(rt, 90)),
            iters=n,
        )


def ring_waited(args, client, rows, a, shape, tf):
    """The same call blocking through a submission ring (docs/SERVICE.md "Blocking calls through
    a ring"): SubmissionRing.call per call, no RPC; the caller waits for its done word asleep
    (poll 50 µs) or polling it for 2 ms; on CUDA also a RingCaller whose ready word the caller's
    stream writes (run(stream=...): nothing synchronises). The compute subtracted is the p50 of
    blocking run_prepared calls of the same prepared call, made first."""
    n = args.iters
    words = client.create_host_region("h4-ring-words", 4096)
    slots = client.create_host_region("h4-ring-slots", 1 << 16)

    def measure(call, submit, spin):
        for _ in range(args.warmup):
            call()
        wall = []
        c0 = time.process_time()
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            wall.append(time.perf_counter() - t0)
        cpu = (time.process_time() - c0) / n
        rows.add(
            op="sparse_mla",
            probe="small",
            preset=preset_of(shape),
            path="blocking",
            api="unary",
            prepared=True,
            submit=submit,
            wait_spin_ms=spin * 1e3,
            compute_from="blocking_run_prepared_p50",
            compute_p50_us=us(compute),
            wall_p50_us=us(pct(wall, 50)),
            wall_p90_us=us(pct(wall, 90)),
            overhead_p50_us=us(pct(wall, 50) - compute),
            overhead_p90_us=us(pct(wall, 90) - compute),
            caller_cpu_us_per_call=us(cpu),
            iters=n,
        )

    try:
        call_id = client.prepare_call("sparse_mla", **a)
        comp = [client.run_prepared(call_id).compute_seconds for _ in range(max(20, args.warmup))]
        compute = pct(comp, 50)
        done = ac.SignalWord(words)
        ring = client.open_ring(slots, offset=0, entries=64, signals=words)
        value = [0]

        def ring_call(spin):
            value[0] += 1
            ring.call(call_id, done, value[0], timeout=60, spin=spin)

        for spin in (0.0, 0.002):
            measure(lambda spin=spin: ring_call(spin), "ring_wait", spin)
        ring.close()
        if args.device == "cuda":
            stream = tf.torch.cuda.current_stream().cuda_stream
            with client.ring_caller(entries=64, spin=0.002) as caller:
                measure(
                    lambda: caller.run(call_id, timeout=60, stream=stream),
                    "ring_caller_stream",
                    0.002,
                )
        client.release_call(call_id)
    except (ac.AttndError, RuntimeError) as e:
        error = f"{e.code.name}: {e}" if isinstance(e, ac.AttndError) else repr(e)
        rows.add(op="sparse_mla", probe="small", submit="ring_wait", error=error)
    finally:
        words.close()
        slots.close()


def part_cpu(args, client, rows, tf):
    """Caller CPU per stream-ordered prepared call (process CPU / calls), RPC vs ring."""
    shape = tiny_shape()
    a = sparse_args(tf, shape, None)
    tf.sync()
    words = client.create_host_region("h4-words", 1 << 16)
    ring_region = client.create_host_region("h4-ring", 1 << 20)
    n = args.iters * 4
    try:
        call_id = client.prepare_call("sparse_mla", **a)
        done = ac.SignalWord(words)
        value = 0
        for path in ("rpc", "ring", "rpc", "ring"):
            ring = (
                client.open_ring(ring_region, offset=0, entries=1024, signals=words)
                if path == "ring"
                else None
            )
            # warm-up
            for _ in range(args.warmup):
                value += 1
                if ring:
                    while not ring.submit(call_id, None, 0, done.offset, value):
                        time.sleep(20e-6)
                else:
                    client.run_prepared(call_id, done=done.signal(value))
            done.wait(value, timeout=120)
            c0, w0 = time.process_time(), time.perf_counter()
            full = 0
            for _ in range(n):
                value += 1
                if ring:
                    while not ring.submit(call_id, None, 0, done.offset, value):
                        full += 1
                        time.sleep(20e-6)
                else:
                    client.run_prepared(call_id, done=done.signal(value))
            c1, w1 = time.process_time(), time.perf_counter()
            done.wait(value, timeout=300)
            w2 = time.perf_counter()
            if ring:
                ring.close()
            rows.add(
                op="sparse_mla",
                probe="caller_cpu",
                preset=preset_of(shape),
                path="stream_ordered",
                api="unary",
                submit="ring" if ring else "run_prepared_rpc",
                calls=n,
                caller_cpu_us_per_call=round((c1 - c0) / n * 1e6, 2),
                submit_wall_us_per_call=round((w1 - w0) / n * 1e6, 2),
                end_to_end_us_per_call=round((w2 - w0) / n * 1e6, 2),
                ring_full_retries=full,
            )
        client.release_call(call_id)
    except ac.AttndError as e:
        rows.add(op="sparse_mla", probe="caller_cpu", error=f"{e.code.name}: {e.details}")
    finally:
        words.close()
        ring_region.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default="gap,small,cpu", help="comma-separated: gap, small, cpu")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--graphs", default="on")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--seed", type=int, default=20261202)
    args = p.parse_args()
    with ac.Client(args.target, timeout=600) as client:
        client.wait_ready(timeout=60)
        tf, device = factory(args, client)
        rows = Rows(args, device)
        parts = {"gap": part_gap, "small": part_small, "cpu": part_cpu}
        try:
            for part in args.parts.split(","):
                t0 = time.perf_counter()
                try:
                    parts[part](args, client, rows, tf)
                except Exception as e:  # a failed part is a row, the next part still runs
                    traceback.print_exc()
                    rows.add(op="-", probe=part, error=f"{type(e).__name__}: {e}"[:400])
                print(f"probe: part {part} took {time.perf_counter() - t0:.1f} s", flush=True)
        finally:
            tf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
