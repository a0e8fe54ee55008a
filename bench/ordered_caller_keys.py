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
then the same caller.call), arguments built once per layer.
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
    c._failures, c._dropped = [], []
    c.ring, c.ready = Ring(), Word(0)
    c._done = [Word(64 * (i + 1)) for i in range(depth)]
    return c


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--out", help="append one JSON line per configuration here")
    a = p.parse_args()
    ordered._is_cuda_tensor = lambda v: isinstance(v, torch.Tensor)
    L, T = a.layers, 64
    t = dict(
        index_q=torch.empty(L, T, 1, 64, 128, dtype=torch.uint8),
        index_weights=torch.empty(L, T, 64),
        q=torch.empty(L, T, 128, 576, dtype=torch.bfloat16),
        out=torch.empty(L, T, 128, 512, dtype=torch.bfloat16),
        lse=torch.empty(L, T, 128),
    )
    shared = dict(
        kv=torch.empty(4096, 656, dtype=torch.uint8),
        index_cache=torch.empty(4096, 64 * 132, dtype=torch.uint8),
        index_block_table=torch.empty(T, 512, dtype=torch.int32),
        context_lens=torch.empty(T, dtype=torch.int32),
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

    def step(form, times):
        for layer in range(L):
            t0 = time.thread_time_ns()
            if form == "torch_op":
                torch.ops.attnd.dsa_attention(**prebuilt[layer])
            else:
                c.call(
                    "dsa_attention",
                    stream=1,
                    **(args(layer) if form == "per_call" else prebuilt[layer]),
                )
            times.append(time.thread_time_ns() - t0)
        for n, *_ in c._pending:  # the "GPU" ends the step's calls
            c._done[n % c.depth].value = n

    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    print("| form | caller CPU µs p50 | p90 |\n|---|---|---|")
    for form in ("per_call", "prebuilt", "torch_op"):
        for _ in range(5):
            step(form, [])
        times = []
        for _ in range(a.steps):
            step(form, times)
        times.sort()
        line = {
            "op": "ordered_caller_cpu",
            "preset": "dsa_attention_paged",
            "form": "torch_op_cuda_standin"
            if form == "torch_op"
            else "ordered_caller_cuda_standin",
            "arguments": "per_call" if form == "per_call" else "prebuilt",
            "client": "python",
            "calls": len(times),
            "caller_cpu_us_p50": round(statistics.median(times) / 1e3, 2),
            "caller_cpu_us_p90": round(times[int(0.9 * len(times))] / 1e3, 2),
            "prepares": c.prepares,
            "commit": commit,
            "date": date,
            **host_fields("cpu (stand-ins)"),
            "torch": torch.__version__,
        }
        emit(line, f"| {form} | {line['caller_cpu_us_p50']} | {line['caller_cpu_us_p90']} |", a.out)


if __name__ == "__main__":
    main()
