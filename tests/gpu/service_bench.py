#!/usr/bin/env python3
"""The service overhead on the GPU: the same ops through a running attnd with every
tensor in a device region (PyTorch CUDA tensors registered by their storages' IPC handles), timed
by the caller. Per op, 20 warm-up calls then 300 timed ones, one at a time: the client's wall
time (time.perf_counter around the blocking call) and the server's CallStats (compute_seconds:
the kernels' device time, i.e. the op run directly on the GPU; total_seconds: request received to
reply ready). overhead = wall - compute, per call. Median and p99 of each go to one JSON line per
op in --out (appended), and a table to stdout. A benchmark: it reports numbers; it fails only
when a call fails or copies tensor bytes.

    PYTHONPATH=bundle/python python3 service_bench.py --target unix:/tmp/x/attnd.sock \\
        --out OUT/service_gpu.jsonl --commit "$(cat bundle/COMMIT)" --graphs on

Shapes (DeepSeek-V3.2): SparseMla T 64, H 128, d_qk 576, top-k 2048 over S 64K; MlaDecode B 32,
H 128, ctx 4K (page 64); IndexerLogits M 128, N 8192, H 64 (d 128, causal windows).
--device=cpu is a dry run of the plumbing against a CPU daemon: NumPy arrays in host regions
(POSIX shm) instead of device regions, and small shapes unless --full (the CPU takes seconds per
full-size call). Run by gpu-tests/run_service_bench.sh.
"""

import argparse
import datetime
import json
import math
import platform
import sys
import time

import numpy as np

import attnd_client as ac

COPY_FIELDS = (
    "copied_bytes_in",
    "copied_bytes_out",
    "copied_bytes_host_to_device",
    "copied_bytes_device_to_host",
)

# name: (op, full shape, small shape for the CPU dry run)
PRESETS = {
    "sparse_mla": dict(
        full=dict(t=64, h=128, d_qk=576, topk=2048, s=65536),
        small=dict(t=8, h=16, d_qk=576, topk=256, s=4096),
    ),
    "mla_decode": dict(
        full=dict(b=32, h=128, d_qk=576, ctx=4096, page=64),
        small=dict(b=2, h=16, d_qk=576, ctx=512, page=64),
    ),
    "indexer_logits": dict(
        full=dict(m=128, n=8192, h=64, d=128), small=dict(m=16, n=1024, h=64, d=128)
    ),
}


def preset_name(op, s):
    if op == "sparse_mla":
        return f"T{s['t']}_H{s['h']}_d{s['d_qk']}_K{s['topk']}_S{s['s'] // 1024}K"
    if op == "mla_decode":
        return (
            f"B{s['b']}_H{s['h']}_d{s['d_qk']}_ctx{s['ctx'] // 1024}K_page{s['page']}"
            if s["ctx"] >= 1024
            else f"B{s['b']}_H{s['h']}_d{s['d_qk']}_ctx{s['ctx']}_page{s['page']}"
        )
    return f"M{s['m']}_N{s['n']}_H{s['h']}_d{s['d']}_causal"


class TorchTensors:
    """CUDA tensors from PyTorch: the client registers each storage as a device region."""

    def __init__(self, seed):
        import torch

        self.torch = torch
        self.dev = torch.device("cuda", 0)
        self.gen = torch.Generator(device=self.dev).manual_seed(seed)
        self.transport = "device_regions"

    def normal(self, shape, dtype, scale=1.0):
        t = self.torch.randn(shape, generator=self.gen, device=self.dev) * scale
        return t.to(
            {
                "bf16": self.torch.bfloat16,
                "f32": self.torch.float32,
                "fp8": self.torch.float8_e4m3fn,
            }[dtype]
        )

    def uniform(self, shape, lo, hi):
        return self.torch.rand(shape, generator=self.gen, device=self.dev) * (hi - lo) + lo

    def ints(self, values):
        return self.torch.as_tensor(np.asarray(values, dtype=np.int32), device=self.dev)

    def randint(self, lo, hi, shape):
        return self.torch.randint(
            lo, hi, shape, generator=self.gen, device=self.dev, dtype=self.torch.int32
        )

    def nan(self, shape, dtype):
        return self.torch.full(
            shape,
            float("nan"),
            device=self.dev,
            dtype={"bf16": self.torch.bfloat16, "f32": self.torch.float32}[dtype],
        )

    def perm(self, n):
        return self.torch.randperm(n, generator=self.gen, device=self.dev).int()

    def sync(self):
        self.torch.cuda.synchronize()

    def close(self):
        pass


class HostRegionArrays:
    """The CPU dry run: NumPy arrays placed in one host region (zero copy like device regions)."""

    def __init__(self, client, seed, byte_size):
        self.rng = np.random.default_rng(seed)
        self.region = client.create_host_region("service-bench", byte_size)
        self.transport = "host_regions"

    def _put(self, values, dtype):
        return self.region.put(values, {"fp8": "fp8_e4m3"}.get(dtype, dtype))

    def normal(self, shape, dtype, scale=1.0):
        return self._put(self.rng.standard_normal(shape, dtype=np.float32) * scale, dtype)

    def uniform(self, shape, lo, hi):
        return self._put(self.rng.uniform(lo, hi, shape).astype(np.float32), "f32")

    def ints(self, values):
        return self._put(np.asarray(values, dtype=np.int32), "i32")

    def randint(self, lo, hi, shape):
        return self._put(self.rng.integers(lo, hi, shape, dtype=np.int32), "i32")

    def nan(self, shape, dtype):
        a = self.region.array(dtype, shape)
        a[...] = 0x7FC0 if dtype == "bf16" else np.nan
        return a

    def perm(self, n):
        return self._put(self.rng.permutation(n).astype(np.int32), "i32")

    def sync(self):
        pass

    def close(self):
        self.region.close()


def sparse_mla_args(tf, s):
    return dict(
        q=tf.normal((s["t"], s["h"], s["d_qk"]), "bf16"),
        kv=tf.normal((s["s"], s["d_qk"]), "bf16"),
        indices=tf.randint(0, s["s"], (s["t"], s["topk"])),
        sm_scale=1 / math.sqrt(s["d_qk"]),
        out=tf.nan((s["t"], s["h"], 512), "bf16"),
        lse=tf.nan((s["t"], s["h"]), "f32"),
    )


def mla_decode_args(tf, s):
    pages_per_seq = s["ctx"] // s["page"]
    pages = s["b"] * pages_per_seq
    return dict(
        q=tf.normal((s["b"], 1, s["h"], s["d_qk"]), "bf16"),
        kv_cache=tf.normal((pages, s["page"], s["d_qk"]), "bf16"),
        block_table=tf.perm(pages).reshape(s["b"], pages_per_seq),
        cache_seqlens=tf.ints([s["ctx"]] * s["b"]),
        sm_scale=1 / math.sqrt(s["d_qk"]),
        causal=True,
        out=tf.nan((s["b"], 1, s["h"], 512), "bf16"),
        lse=tf.nan((s["b"], 1, s["h"]), "f32"),
    )


def indexer_logits_args(tf, s):
    m, n = s["m"], s["n"]
    return dict(
        q=tf.normal((m, s["h"], s["d"]), "fp8"),
        k=tf.normal((n, s["d"]), "fp8"),
        k_scale=tf.uniform((n,), 0.5, 1.5),
        weights=tf.normal((m, s["h"]), "f32", 1 / math.sqrt(s["h"])),
        ks=tf.ints([0] * m),
        ke=tf.ints(list(range(n - m + 1, n + 1))),
        logits=tf.nan((m, n), "f32"),
    )


ARGS = {
    "sparse_mla": sparse_mla_args,
    "mla_decode": mla_decode_args,
    "indexer_logits": indexer_logits_args,
}


def percentile(values, q):
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def bench_op(client, tf, op, shape, warmup, iters):
    args = ARGS[op](tf, shape)
    tf.sync()
    for _ in range(warmup):
        client.call(op, **args)
    wall, compute, total, queue = [], [], [], []
    copied = 0
    stats = None
    for _ in range(iters):
        t0 = time.perf_counter()
        res = client.call(op, **args)
        t1 = time.perf_counter()
        stats = res.stats
        wall.append(t1 - t0)
        compute.append(stats.compute_seconds)
        total.append(stats.total_seconds)
        queue.append(stats.queue_seconds)
        copied += sum(getattr(stats, f, 0) for f in COPY_FIELDS)
    overhead = [w - c for w, c in zip(wall, compute, strict=True)]
    server_overhead = [t - c for t, c in zip(total, compute, strict=True)]
    us = 1e6
    return {
        "median_us": percentile(wall, 50) * us,
        "p99_us": percentile(wall, 99) * us,
        "compute_median_us": percentile(compute, 50) * us,
        "compute_p99_us": percentile(compute, 99) * us,
        "server_total_median_us": percentile(total, 50) * us,
        "server_total_p99_us": percentile(total, 99) * us,
        "queue_median_us": percentile(queue, 50) * us,
        "overhead_median_us": percentile(overhead, 50) * us,
        "overhead_p99_us": percentile(overhead, 99) * us,
        "server_overhead_median_us": percentile(server_overhead, 50) * us,
        "server_overhead_p99_us": percentile(server_overhead, 99) * us,
        "impl": stats.impl,
        "graph": getattr(stats, "graph", ""),
        "work_count": getattr(stats, "work_count", ""),
        "flops": stats.flops,
        "logical_bytes": stats.logical_bytes,
        "copied_bytes": copied,
        "tflops_at_compute": stats.flops / percentile(compute, 50) / 1e12
        if percentile(compute, 50) > 0
        else None,
    }


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="attnd address, e.g. unix:/tmp/attnd.sock")
    parser.add_argument("--out", required=True, help="JSON lines file to append to")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--graphs",
        choices=("on", "off"),
        default="on",
        help="whether the daemon runs with graphs (a label in the results)",
    )
    parser.add_argument("--ops", default="sparse_mla,mla_decode,indexer_logits")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--full", action="store_true", help="full shapes on --device=cpu too")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()

    size = "full" if args.device == "cuda" or args.full else "small"
    failures = []
    rows = []
    with ac.Client(args.target, timeout=600) as client:
        client.wait_ready(timeout=60)
        info = client.info()
        if info.backend != args.device:
            print(
                f"service_bench: the daemon's backend is {info.backend!r}, want {args.device!r}",
                file=sys.stderr,
            )
            return 2
        if args.device == "cuda":
            tf = TorchTensors(args.seed)
            device = tf.torch.cuda.get_device_name(0)
        else:
            tf = HostRegionArrays(client, args.seed, 512 << 20)
            device = f"cpu: {cpu_name()}"
        try:
            for op in args.ops.split(","):
                shape = PRESETS[op][size]
                try:
                    r = bench_op(client, tf, op, shape, args.warmup, args.iters)
                except ac.AttndError as e:
                    failures.append(f"{op}: {e.code.name}: {e.details}")
                    print(f"FAIL {op}: {e.code.name}: {e.details}", flush=True)
                    continue
                if r["copied_bytes"]:
                    failures.append(f"{op}: {r['copied_bytes']} tensor bytes copied, want 0")
                row = {
                    "op": op,
                    "preset": preset_name(op, shape),
                    "transport": tf.transport,
                    "graphs": args.graphs if args.device == "cuda" else "n/a",
                    "backend": info.backend,
                    "warmup": args.warmup,
                    "iters": args.iters,
                    **r,
                    "commit": args.commit,
                    "date": datetime.date.today().isoformat(),
                    "device": device,
                }
                rows.append(row)
                print(
                    f"  {op} {row['preset']}: wall {r['median_us']:.1f} us (p99 "
                    f"{r['p99_us']:.1f}), compute {r['compute_median_us']:.1f}, overhead "
                    f"{r['overhead_median_us']:.1f} (p99 {r['overhead_p99_us']:.1f}), "
                    f"impl {r['impl']}, graph {r['graph'] or '-'}",
                    flush=True,
                )
        finally:
            tf.close()
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print()
    print(
        "| op | preset | graphs | wall p50 / p99 µs | compute p50 µs | overhead p50 / p99 µs "
        "| server overhead p50 µs |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['op']} | {r['preset']} | {r['graphs']} | {r['median_us']:.1f} / "
            f"{r['p99_us']:.1f} | {r['compute_median_us']:.1f} | {r['overhead_median_us']:.1f}"
            f" / {r['overhead_p99_us']:.1f} | {r['server_overhead_median_us']:.1f} |"
        )
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
