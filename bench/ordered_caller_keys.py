#!/usr/bin/env python3
"""The Python OrderedCaller's own CPU cost per call with CUDA-tensor arguments, on a machine
without a GPU (docs/BENCHMARKS.md "Ordered callers: caller CPU"): CPU torch tensors stand in for
CUDA ones (the caller's CUDA test is patched to accept them), the device-region cache registers
through a fake registrar and share function, the ring and the stream signals are stand-ins that
take an entry and return at once. So the figure is the library's bookkeeping alone — the key of
the prepared call (regions, addresses, shapes, strides, dtypes of the ten tensors of a paged
dsa_attention plus its scalars), the cache look-ups, the pending-call records — with no driver
call, ring write or RPC in it. Thread CPU time (time.thread_time_ns) per call.caller.call(),
61 layers a step, median and p90 over --steps steps after 5 warm-up steps; the arguments either
built per call (five per-layer views, as bench/decode_step builds them) or once per layer.
Form "torch_op": the same call made as `torch.ops.attnd.dsa_attention(**arguments)` with the
ordered binding (attnd_client.torch_ops: the dispatcher, the op's checks, the version bumps,
then the same caller.call), arguments built once per layer. Form "bound": each layer's call
bound once (OrderedCaller.bind) and run by `bound(stream)`: no key per call.
--torch-op-parts times the torch op in nested parts (dispatcher, kernel, _call, caller, checks).
--between runs untimed work before each call (a frontend's own ops between its calls leave
other data in the caches; the call's cost depends on it).
--device cuda (on a GPU host) makes the ten tensors real CUDA tensors (everything else stays a
stand-in), so the two runs differ only in what torch does per CUDA tensor. --micro adds the
per-operation costs the key is made of (data_ptr, shape, stride, untyped_storage, a view, ...)
on each device, the driver's stream memory operations through ctypes (CUDA only) and a pure
Python loop, to tell a slower host from a costlier CUDA tensor.
    /work/venv-torch/bin/python bench/ordered_caller_keys.py [--steps 100] [--out FILE]
    # on a GPU host from a device bundle: PYTHONPATH=bundle/python python3 bench/ordered_caller_keys.py
"""

import argparse
import collections
import datetime
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# After PYTHONPATH: a device bundle's client (bundle/python, with its generated stubs) wins
# over the repository's, which has them only where they were built.
sys.path.append(os.path.join(ROOT, "client", "python"))

from attnd_client import ordered  # noqa: E402
from attnd_client.torch_support import DeviceRegionCache  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ordered_caller_cpu import emit, host_fields  # noqa: E402


class Registrar:
    def device_uuids(self):
        return ["GPU-standin"]

    def register_device_region(self, **kwargs):
        pass

    def unregister_region(self, name):
        return [name]


def share(storage):
    handle = storage.data_ptr().to_bytes(8, "little") * 8
    return (0, handle, storage.nbytes(), 0, b"ref", 0, b"ev", False)


class Ring:
    ring_id = 1

    def submit(self, *entry):
        return True


class Word:
    def __init__(self, offset):
        self.offset, self.value = offset, 0

    def get(self):
        return self.value


class Signals:
    def write(self, word, value, stream):
        word.value = value

    def wait(self, word, value, stream):
        pass

    def write_then_wait(self, ready, ready_value, done, done_value, stream):
        ready.value = ready_value


class Owner:
    def __init__(self):
        self.cache = DeviceRegionCache(
            Registrar(), share=share, device_uuid=lambda d: "GPU-standin", synchronize=lambda d: 0
        )

    def device_regions(self):
        return self.cache

    def prepare_call(self, op, timeout=None, **arguments):
        return 7

    def release_call(self, call_id, timeout=None):
        pass


def caller(depth):
    """An OrderedCaller over the stand-ins (its constructor would open a host region and a
    ring through a daemon)."""
    c = ordered.OrderedCaller.__new__(ordered.OrderedCaller)
    c.owner, c.depth, c.max_prepared, c.timeout, c.spin = Owner(), depth, 1024, 5.0, 0.0
    c.calls = c.retired = c.prepares = 0
    c._lock, c._driver, c._signals, c._used_streams = threading.RLock(), None, Signals(), False
    c._pending, c._prepared = collections.deque(), collections.OrderedDict()
    c._failures, c._dropped, c._broken, c._bound = [], [], None, set()
    c.ring, c.ready = Ring(), Word(0)
    c._done = [Word(64 * (i + 1)) for i in range(depth)]
    return c


BETWEEN = ("none", "torch_small", "matmul", "sweep")


def between_work():
    """The untimed work of --between, by name (on this thread, one torch thread: what a
    frontend's own ops leave in the caches, without other threads competing for the core)."""
    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    big = torch.randn(4 << 20)

    def torch_small():
        for _ in range(4):
            a.add_(1.0)

    return {
        "none": lambda: None,
        "torch_small": torch_small,
        "matmul": lambda: torch.mm(a, b),
        "sweep": lambda: big.mul_(1.0),
    }


def per_op_ns(fn, n=20000):
    """Median over 5 rounds of thread CPU ns per fn() call (n calls a round)."""
    rounds = []
    for _ in range(5):
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        rounds.append((time.thread_time_ns() - t0) / n)
    return statistics.median(rounds)


def micro(a, commit, date):
    """The key's ingredients one by one (module docstring), one JSON line per (device, item)."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    items = []
    for dev in devices:
        x = torch.empty(61, 64, 128, 576, dtype=torch.bfloat16, device=dev)
        v = x[3]
        items += [
            (dev, "view x[i]", lambda x=x: x[3]),
            (dev, "data_ptr()", v.data_ptr),
            (dev, "shape", lambda v=v: v.shape),
            (dev, "stride()", v.stride),
            (dev, "dtype", lambda v=v: v.dtype),
            (dev, "is_cuda", lambda v=v: v.is_cuda),
            (dev, "untyped_storage()", v.untyped_storage),
            (dev, "type(v).__module__", lambda v=v: type(v).__module__.startswith("torch")),
        ]
    if torch.cuda.is_available():
        from attnd_client.cuda_signals import StreamMemOps

        ops = StreamMemOps()
        word = torch.zeros(8, dtype=torch.int64, device="cuda")
        address = word.data_ptr()
        stream = torch.cuda.current_stream()
        handle = stream.cuda_stream
        import ctypes
        import struct

        params = ctypes.create_string_buffer(96)
        struct.pack_into(
            "<" + "I4xQQI4xQ8x" * 2, params, 0, 5, address, 0, 0, 0, 4, address, 0, 0, 0
        )
        batch, params_address = ops._driver.batch, ctypes.c_void_p(ctypes.addressof(params))
        if batch is not None and batch(ctypes.c_void_p(handle), 2, params_address, 0) == 0:
            items.append(
                (
                    "cuda",
                    "cuStreamBatchMemOp write+wait (ctypes)",
                    lambda: batch(ctypes.c_void_p(handle), 2, params_address, 0),
                )
            )
        items += [
            ("cuda", "torch.cuda.current_stream()", torch.cuda.current_stream),
            ("cuda", "stream.cuda_stream", lambda: stream.cuda_stream),
            ("cuda", "cuStreamWriteValue64 (ctypes)", lambda: ops.write(address, 0, handle)),
            ("cuda", "cuStreamWaitValue64 (ctypes)", lambda: ops.wait(address, 0, handle)),
        ]
    items.append(("python", "dict of 9 + sorted + tuple hash", _pure_python))
    print("| device | item | ns per call |\n|---|---|---|")
    for dev, item, fn in items:
        driver_call = "(ctypes)" in item
        ns = per_op_ns(fn, 2000 if driver_call else 20000)
        if driver_call:
            torch.cuda.synchronize()
        line = {
            "op": "python_micro",
            "device_of_item": dev,
            "item": item,
            "ns_per_call": round(ns, 1),
            "commit": commit,
            "date": date,
            **host_fields("micro"),
            "torch": torch.__version__,
        }
        emit(line, f"| {dev} | {item} | {ns:.0f} |", a.out)


def _pure_python():
    d = {"q": 1, "kv": 2, "out": 3, "lse": 4, "topk": 5, "a": 6, "b": 7, "c": 8, "e": 9}
    return hash(tuple((k, d[k]) for k in sorted(d)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--out", help="append one JSON line per configuration here")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the tensors live"
    )
    p.add_argument("--micro", action="store_true", help="also the per-operation costs")
    p.add_argument(
        "--torch-op-parts",
        action="store_true",
        help="also the torch op's cost in parts: the op through the dispatcher, its Python "
        "kernel called directly, its _call, the caller's call alone, its checks alone",
    )
    p.add_argument(
        "--between",
        nargs="+",
        default=["none"],
        choices=BETWEEN,
        help="work run (untimed) before each call, as a frontend's own ops would: none, "
        "torch_small (four in-place adds on a 256x256 tensor), matmul (one 256x256 mm), "
        "sweep (a 16 MiB in-place multiply: the caches emptied)",
    )
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device")
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if a.micro:
        micro(a, commit, date)
    ordered._is_cuda_tensor = lambda v: isinstance(v, torch.Tensor)
    L, T, dev = a.layers, 64, a.device
    t = dict(
        index_q=torch.empty(L, T, 1, 64, 128, dtype=torch.uint8, device=dev),
        index_weights=torch.empty(L, T, 64, device=dev),
        q=torch.empty(L, T, 128, 576, dtype=torch.bfloat16, device=dev),
        out=torch.empty(L, T, 128, 512, dtype=torch.bfloat16, device=dev),
        lse=torch.empty(L, T, 128, device=dev),
    )
    shared = dict(
        kv=torch.empty(4096, 656, dtype=torch.uint8, device=dev),
        index_cache=torch.empty(4096, 64 * 132, dtype=torch.uint8, device=dev),
        index_block_table=torch.empty(T, 512, dtype=torch.int32, device=dev),
        context_lens=torch.empty(T, dtype=torch.int32, device=dev),
    )

    def args(layer):
        return dict(
            {k: v[layer] for k, v in t.items()},
            **shared,
            index_block_size=64,
            topk=2048,
            sm_scale=0.1,
        )

    prebuilt = [args(layer) for layer in range(L)]
    c = caller(4 * L)

    from attnd_client import torch_ops

    torch_ops._bound, torch_ops._ordered = c.owner, c  # bind(..., ordered=True) without a daemon
    torch_ops._on_cuda = lambda tensor: True
    stream = type("Stream", (), {"cuda_stream": 1})()
    torch.cuda.current_stream = lambda device=None: stream

    work = between_work()
    # An older library (no bind) still runs the other forms.
    binds = hasattr(ordered.OrderedCaller, "bind")
    bound = [c.bind("dsa_attention", **prebuilt[layer]) for layer in range(L)] if binds else []

    def step(form, times, between="none"):
        run_between = work[between]
        for layer in range(L):
            run_between()
            t0 = time.thread_time_ns()
            if form == "torch_op":
                torch.ops.attnd.dsa_attention(**prebuilt[layer])
            elif form == "bound":
                bound[layer](stream=1)
            else:
                c.call(
                    "dsa_attention",
                    stream=1,
                    **(args(layer) if form == "per_call" else prebuilt[layer]),
                )
            times.append(time.thread_time_ns() - t0)
        for n, *_ in c._pending:  # the "GPU" ends the step's calls
            c._done[n % c.depth].value = n

    print("| form | between | caller CPU µs p50 | p90 |\n|---|---|---|---|")
    forms = ("prebuilt", "bound") if binds else ("prebuilt",)
    runs = [(form, "none") for form in ("per_call", *forms, "torch_op")]
    runs += [(form, b) for b in a.between if b != "none" for form in forms]
    for form, between in runs:
        for _ in range(5):
            step(form, [], between)
        times = []
        for _ in range(a.steps):
            step(form, times, between)
        times.sort()
        line = {
            "op": "ordered_caller_cpu",
            "preset": "dsa_attention_paged",
            "form": "torch_op_cuda_standin"
            if form == "torch_op"
            else "ordered_caller_cuda_standin",
            "tensors": dev,
            "arguments": {"per_call": "per_call", "bound": "bound"}.get(form, "prebuilt"),
            "between": between,
            "client": "python",
            "calls": len(times),
            "caller_cpu_us_p50": round(statistics.median(times) / 1e3, 2),
            "caller_cpu_us_p90": round(times[int(0.9 * len(times))] / 1e3, 2),
            "prepares": c.prepares,
            "commit": commit,
            "date": date,
            **host_fields("cpu (stand-ins)" if dev == "cpu" else "cuda tensors, stand-ins"),
            "torch": torch.__version__,
        }
        row = f"| {form} | {between} | {line['caller_cpu_us_p50']} | {line['caller_cpu_us_p90']} |"
        emit(line, row, a.out)
    if a.torch_op_parts:
        torch_op_parts(c, prebuilt, L, a.steps, a.out, commit, date)


def torch_op_parts(c, prebuilt, layers, steps, out, commit, date):
    """The torch op's cost in nested parts (--torch-op-parts), prebuilt arguments, µs p50."""
    from attnd_client import torch_ops

    unset = ("lse", "indices", "logits", "kv_block_table", "kv_block_size", "kv_block_stride")
    unset += ("index_cache_layout", "precision", "kv_layout", "kv_scale")
    parts = {
        "torch.ops.attnd.dsa_attention": lambda a: torch.ops.attnd.dsa_attention(**a),
        "its Python kernel, called directly": lambda a: torch_ops._dsa_attention(**a),
        "torch_ops._call": lambda a: torch_ops._call("dsa_attention", dict(a)),
        "caller.call": lambda a: c.call("dsa_attention", stream=1, **a),
        "the op's checks": lambda a: torch_ops._check_dsa_attention(
            **dict(dict.fromkeys(unset), **a)
        ),
    }
    print("| part | caller CPU µs p50 |\n|---|---|")
    for name, fn in parts.items():
        times = []
        for step in range(steps + 5):
            for layer in range(layers):
                t0 = time.thread_time_ns()
                fn(prebuilt[layer])
                if step >= 5:
                    times.append(time.thread_time_ns() - t0)
            for n, *_ in c._pending:
                c._done[n % c.depth].value = n
        line = {
            "op": "torch_op_parts",
            "preset": "dsa_attention_paged",
            "part": name,
            "caller_cpu_us_p50": round(statistics.median(times) / 1e3, 2),
            "calls": len(times),
            "commit": commit,
            "date": date,
            **host_fields("cpu (stand-ins)"),
            "torch": torch.__version__,
        }
        emit(line, f"| {name} | {line['caller_cpu_us_p50']} |", out)


if __name__ == "__main__":
    main()
