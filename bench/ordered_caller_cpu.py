#!/usr/bin/python3
"""Caller CPU per stream-ordered call from Python (docs/BENCHMARKS.md "Ordered callers: caller
CPU"): the client's OrderedCaller (`caller.call(op, **arguments)`: the arguments keyed, the
cached prepared call found, one ring entry) against a hand-written submission-ring entry of a
call prepared once (`ring.submit`, the floor of the ring path) and a `RunPrepared` RPC with
signals per call, for a small sparse_mla and a paged dsa_attention (ten tensors) whose tensors
lie in a host region, on a CPU daemon of its own. The calls are host-ordered (no GPU stream:
no ready word); the figure is this thread's CPU time around the call (time.thread_time_ns),
median and p90 over `--calls` calls after a warm-up, configurations interleaved in `--rounds`
rounds. A benchmark, not a test: it reports numbers.
    /usr/bin/python3 bench/ordered_caller_cpu.py [--attnd build/server/attnd] [--out FILE]
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# After PYTHONPATH: a device bundle's client (bundle/python, with its generated stubs) wins
# over the repository's, which has them only where they were built.
sys.path.append(os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))  # daemon.py, cases.py

from attnd_client.rings import ring_bytes  # noqa: E402
from attnd_client.stream_ordered import Signal, SignalWord  # noqa: E402

from cases import make_case, region_bytes  # noqa: E402
from daemon import Daemon  # noqa: E402

CASES = {
    "sparse_mla": dict(op="sparse_mla", tokens=1, rows=64, k=8),
    "dsa_attention_paged": dict(op="dsa_attention", paged=True),
}


def staged(client, name, case):
    region = client.create_host_region(name, region_bytes(case) + 4096)
    args = {k: region.put(a, case.input_dtypes[k]) for k, a in case.inputs.items()}
    args.update({k: region.array(d, sh) for k, (d, sh) in case.outputs.items()})
    args.update(case.scalars)
    return region, args


def host_fields(device):
    """The fields naming where a line was measured."""
    return {"host": platform.node(), "cpus": os.cpu_count(), "device": device}


def emit(line, row, out):
    """Prints the table row `row` and appends `line` as a JSON line to `out` (when given)."""
    print(row)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(line) + "\n")


def measure(call, calls, settle):
    """Thread CPU ns of each call (after `calls // 10` warm-up calls); `settle()` every 256."""
    for _ in range(max(1, calls // 10)):
        call()
    settle()
    cpu = []
    for i in range(calls):
        t0 = time.thread_time_ns()
        call()
        cpu.append(time.thread_time_ns() - t0)
        if i % 256 == 255:
            settle()
    settle()
    return cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attnd", default=os.path.join(ROOT, "build", "server", "attnd"))
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="append one JSON line per configuration here")
    p.add_argument("--seed", type=int, default=20261204)
    a = p.parse_args()
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    rng = np.random.default_rng(a.seed)
    d = Daemon(a.attnd, name="attnd-ordered-bench").start()
    results = {}
    try:
        client = d.client()
        client.wait_ready(timeout=60)
        for preset, spec in CASES.items():
            kwargs = dict(spec)
            op = kwargs.pop("op")
            case = make_case(op, rng, **kwargs)
            region, args = staged(client, f"ob-{preset}", case)
            words = client.create_host_region(f"ob-words-{preset}", 1 << 16)
            slots = client.create_host_region(f"ob-ring-{preset}", ring_bytes(256))
            call_id = client.prepare_call(op, **args)
            ring = client.open_ring(slots, 0, 256, signals=words)
            done = SignalWord(words)
            count = [0]

            def ring_submit(ring=ring, call_id=call_id, done=done, count=count):
                count[0] += 1
                while not ring.submit(call_id, None, 0, done.offset, count[0]):
                    time.sleep(20e-6)

            def rpc(call_id=call_id, done=done, count=count, name=words.name):
                count[0] += 1
                client.run_prepared(call_id, done=Signal(name, done.offset, count[0]))

            def settle(done=done, count=count):
                done.wait(count[0], timeout=120)

            caller = client.ordered_caller(depth=4096)
            forms = {
                "ordered_caller": (lambda caller=caller, op=op, args=args: caller.call(op, **args),
                                   lambda caller=caller: caller.wait(timeout=120)),
                "ring_submit": (ring_submit, settle),
                "run_prepared_rpc": (rpc, settle),
            }  # fmt: skip
            for _ in range(a.rounds):
                for form, (call, wait) in forms.items():
                    cpu = measure(call, a.calls, wait)
                    results.setdefault((preset, form), []).extend(cpu)
            caller.close()
            ring.close()
            client.release_call(call_id)
            for r in (slots, words, region):
                r.close()
    finally:
        d.stop()
        d.cleanup()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    print("| preset | form | caller CPU µs p50 | p90 |")
    print("|---|---|---|---|")
    for (preset, form), cpu in results.items():
        us = sorted(c / 1e3 for c in cpu)
        line = {
            "op": "ordered_caller_cpu",
            "preset": preset,
            "form": form,
            "client": "python",
            "calls": len(us),
            "caller_cpu_us_p50": round(statistics.median(us), 2),
            "caller_cpu_us_p90": round(us[int(0.9 * len(us))], 2),
            "commit": commit,
            "date": date,
            **host_fields("cpu"),
        }
        p50, p90 = line["caller_cpu_us_p50"], line["caller_cpu_us_p90"]
        emit(line, f"| {preset} | {form} | {p50} | {p90} |", a.out)


if __name__ == "__main__":
    main()
