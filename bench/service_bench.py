#!/usr/bin/python3
"""Service benchmark of attnd: round-trip latency and throughput over the unix socket
for a decode-sized SparseMla call (T=64, H=16, K=2048, d_qk 512: attnctl's `decode` preset) and a
tiny one, inline vs host regions, unary and Session; the added service overhead (client round
trip minus the server's compute time, from CallStats) and the bytes copied per call.

Starts its own daemon (CPU backend) on a unix socket in a temporary directory, drives it with
`attnctl ping` (the gRPC floor: GetInfo) and `attnctl bench --json --samples` in interleaved
rounds (so load changes on a shared machine hit every configuration alike), appends one JSON line
per configuration to bench/results/ and prints a Markdown table for docs/BENCHMARKS.md. A
benchmark, not a test: it reports numbers.
    /usr/bin/python3 bench/service_bench.py [--build build] [--rounds 4] [--nice -10]
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# (op, preset, transport, api, requests flag): the two calls, inline vs regions, unary
# and Session, and one whole DSA layer (the README's call).
CASES = [
    ("sparse_mla", "decode", "inline", "unary", "decode_requests"),
    ("sparse_mla", "decode", "regions", "unary", "decode_requests"),
    ("sparse_mla", "decode", "inline", "session", "decode_requests"),
    ("sparse_mla", "decode", "regions", "session", "decode_requests"),
    ("sparse_mla", "tiny", "inline", "unary", "tiny_requests"),
    ("sparse_mla", "tiny", "regions", "unary", "tiny_requests"),
    ("sparse_mla", "tiny", "inline", "session", "tiny_requests"),
    ("sparse_mla", "tiny", "regions", "session", "tiny_requests"),
    ("dsa_attention", "decode", "inline", "unary", "dsa_requests"),
    ("dsa_attention", "decode", "regions", "unary", "dsa_requests"),
]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def git(*args):
    try:
        return subprocess.run(
            ["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


class Daemon:
    """attnd on a unix socket in a fresh temporary directory; stop() always cleans up."""

    def __init__(self, attnd, extra_flags, prefix):
        self.dir = tempfile.mkdtemp(prefix="attnd-bench-")
        self.socket = os.path.join(self.dir, "attnd.sock")
        ready = os.path.join(self.dir, "ready")
        self.log = open(os.path.join(self.dir, "attnd.log"), "w")
        self.proc = subprocess.Popen(
            [
                *prefix,
                attnd,
                f"--listen=unix:{self.socket}",
                "--metrics-listen=",
                "--allow-client-shm",
                f"--ready-file={ready}",
                "--log-level=warning",
                *extra_flags,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("attnd did not become ready")
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_attnctl(prefix, attnctl, args):
    cmd = [*prefix, attnctl, "--json", "--samples", "--progress=false", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def percentile(sorted_values, p):
    """Nearest rank, as attnctl computes it."""
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[min(len(sorted_values), int(rank)) - 1]


def median(sorted_values):
    n = len(sorted_values)
    return (
        sorted_values[n // 2]
        if n % 2
        else 0.5 * (sorted_values[n // 2 - 1] + sorted_values[n // 2])
    )


def summarize(rt, compute=None):
    rt_sorted = sorted(rt)
    row = {
        "median_us": median(rt_sorted),
        "p50_us": percentile(rt_sorted, 50),
        "p90_us": percentile(rt_sorted, 90),
        "p99_us": percentile(rt_sorted, 99),
    }
    if compute is not None:
        overhead = sorted(r - c for r, c in zip(rt, compute, strict=True))
        row.update(
            {
                "overhead_p50_us": percentile(overhead, 50),
                "overhead_p90_us": percentile(overhead, 90),
                "overhead_p99_us": percentile(overhead, 99),
                "server_compute_p50_us": percentile(sorted(compute), 50),
            }
        )
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--decode-requests", type=int, default=200)
    ap.add_argument("--tiny-requests", type=int, default=2000)
    ap.add_argument("--dsa-requests", type=int, default=40)
    ap.add_argument("--ping-requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument(
        "--out",
        default=None,
        help="JSON-lines file (default bench/results/service_<date>.jsonl, appended)",
    )
    ap.add_argument(
        "--device",
        default=None,
        help="label of the machine (default: the CPU model and core count)",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run attnd and attnctl under `nice -n N` (negative needs root): on a "
        "shared machine, keeps other work from dominating the latencies",
    )
    ap.add_argument(
        "--attnd-flag",
        action="append",
        default=[],
        help="extra attnd flag, e.g. --attnd-flag=--cpu-threads=2",
    )
    args = ap.parse_args()

    attnd = os.path.join(args.build, "server", "attnd")
    attnctl = os.path.join(args.build, "client", "attnctl")
    for b in (attnd, attnctl):
        if not os.access(b, os.X_OK):
            sys.exit(f"service_bench: {b} not built (ninja attnd attnctl)")
    now = datetime.datetime.now(datetime.UTC)
    date = now.strftime("%Y-%m-%d")
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    device = args.device or f"cpu: {cpu_name()} ({os.cpu_count()} cores)"
    out_path = args.out or os.path.join(ROOT, "bench", "results", f"service_{date}.jsonl")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)

    # Interleaved rounds: every configuration runs a share of its requests in each round, so a
    # change of the machine's load (other work on a shared 2-core box) hits all of them alike.
    acc = {
        c: {
            "rt": [],
            "compute": [],
            "total": [],
            "copied": 0,
            "wall": 0.0,
            "errors": 0,
            "shape": "",
        }
        for c in CASES
    }
    ping = []
    load_before = os.getloadavg()[0]
    prefix = ["nice", "-n", str(args.nice)] if args.nice else []
    daemon = Daemon(attnd, args.attnd_flag, prefix)
    target = f"--target=unix:{daemon.socket}"
    try:
        for rnd in range(args.rounds):
            print(f"[service_bench] round {rnd + 1}/{args.rounds}", file=sys.stderr, flush=True)
            r = run_attnctl(
                prefix,
                attnctl,
                [
                    target,
                    f"--requests={args.ping_requests // args.rounds}",
                    f"--warmup={args.warmup}",
                    "ping",
                ],
            )
            ping += r["round_trip_us_samples"]
            for case in CASES:
                op, preset, transport, api, requests_arg = case
                requests = max(1, getattr(args, requests_arg) // args.rounds)
                flags = [
                    target,
                    f"--preset={preset}",
                    f"--requests={requests}",
                    f"--warmup={args.warmup if preset == 'tiny' else 2}",
                    f"--verify={'true' if rnd == 0 else 'false'}",
                ]
                if transport == "regions":
                    flags.append("--regions")
                if api == "session":
                    flags.append("--session")
                r = run_attnctl(prefix, attnctl, [*flags, "bench", op])
                a = acc[case]
                a["rt"] += r["round_trip_us_samples"]
                a["compute"] += r["compute_us_samples"]
                a["total"] += r["total_us_samples"]
                a["copied"] = max(a["copied"], r["copied_bytes"])
                a["wall"] += r["wall_s"]
                a["errors"] += r["errors"]
                a["shape"] = r["shape"]
    finally:
        daemon.stop()
    load_after = os.getloadavg()[0]

    common = {
        "commit": commit,
        "dirty": dirty,
        "date": date,
        "device": device,
        "load_avg_1m": [round(load_before, 2), round(load_after, 2)],
        "nice": args.nice,
    }
    rows = [
        {
            "op": "get_info",
            "preset": "-",
            "transport": "ping",
            "api": "unary",
            **summarize(ping),
            "overhead_p50_us": None,
            "copied_bytes": 0,
            "requests": len(ping),
            "errors": 0,
            **common,
        }
    ]
    for case, a in acc.items():
        op, preset, transport, api, _ = case
        total_sorted = sorted(t for t in a["total"])
        rows.append(
            {
                "op": op,
                "preset": preset,
                "transport": transport,
                "api": api,
                **summarize(a["rt"], a["compute"]),
                "server_total_p50_us": percentile(total_sorted, 50),
                "throughput_rps": len(a["rt"]) / a["wall"] if a["wall"] > 0 else None,
                "requests": len(a["rt"]),
                "errors": a["errors"],
                "copied_bytes": a["copied"],
                "shape": a["shape"],
                **common,
            }
        )

    with open(out_path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"{len(rows)} results appended to {os.path.relpath(out_path, ROOT)}\n")
    print(
        f"commit {commit}{' (dirty tree)' if dirty else ''}, {date}, {device}, nice "
        f"{args.nice}, load average {load_before:.1f} -> {load_after:.1f}\n"
    )
    print(
        "| call | transport | API | calls | p50 round trip | p90 | p99 | server compute p50 | "
        "overhead p50 (round trip − compute) | overhead p99 | throughput | copied bytes / call |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def us(v):
        return "–" if v is None else (f"{v / 1000:.1f} ms" if v >= 10000 else f"{v:.0f} µs")

    for r in rows:
        call = (
            "GetInfo (no op: the gRPC floor)"
            if r["op"] == "get_info"
            else f"{r['op']} `{r['preset']}` ({r['shape']})"
        )
        thr = f"{r['throughput_rps']:.0f}/s" if r.get("throughput_rps") else "–"
        print(
            f"| {call} | {r['transport']} | {r['api']} | {r['requests']} | {us(r['p50_us'])} | "
            f"{us(r['p90_us'])} | {us(r['p99_us'])} | {us(r.get('server_compute_p50_us'))} | "
            f"{us(r['overhead_p50_us'])} | {us(r.get('overhead_p99_us'))} | {thr} | "
            f"{r['copied_bytes']} |"
        )


if __name__ == "__main__":
    main()
