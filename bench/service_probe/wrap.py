#!/usr/bin/env python3
"""Helpers of bench/service_probe/run.sh (standard library only).

wrap OUT.jsonl KEY=VALUE...   one attnctl --json document on stdin -> one JSON line appended to
                              OUT.jsonl with the given fields added (samples arrays dropped)
summary OUT_DIR               a Markdown table of every *.jsonl in OUT_DIR on stdout
"""

import datetime
import glob
import json
import os
import sys


def wrap(out, pairs):
    text = sys.stdin.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = {"error": "not JSON", "text": text[-400:]}
    doc = {k: v for k, v in doc.items() if not k.endswith("_samples")}
    for p in pairs:
        k, _, v = p.partition("=")
        doc[k] = v
    doc.setdefault("client", "cpp")
    doc["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with open(out, "a") as f:
        f.write(json.dumps(doc) + "\n")
    keys = (
        "command", "op", "api", "path", "prepared", "ring", "ring_wait", "p50_us", "p90_us",
        "server_compute_p50_us", "overhead_p50_us", "overhead_p90_us", "caller_cpu_us_per_call",
        "calls_wall_s", "requests", "errors", "first_error", "error",
    )  # fmt: skip
    print(json.dumps({k: doc[k] for k in keys if k in doc}))


def f(v):
    if isinstance(v, float):
        return f"{v:.1f}"
    return "-" if v is None else str(v)


def summary(out_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, "*.jsonl"))):
        with open(path) as fh:
            for line in fh:
                try:
                    rows.append((os.path.basename(path), json.loads(line)))
                except json.JSONDecodeError:
                    pass
    print("## Kernel benchmark (attn_gpu_bench, graph replays of 10 launches)\n")
    print("| case | precision | cache | median µs | error |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        if name.startswith("kernel"):
            case = f"{r.get('op')}/{r.get('preset')}/{r.get('impl')}"
            print(
                f"| {case} | {r.get('precision')} | {r.get('cache')} | {f(r.get('median_us'))} "
                f"| {r.get('error', '')} |"
            )
    print("\n## SparseMla through the daemon (Python client, device regions)\n")
    print(
        "| graphs | variant | preset | precision | gap ms | compute p50 (p10/min) µs | wall p50 µs "
        "| server total p50 µs | impl | graph | work_count | readback B |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for _, r in rows:
        if r.get("probe") == "gap":
            if "error" in r:
                print(
                    f"| {r.get('graphs')} | {r.get('variant')} | {r.get('preset')} | error: {r['error']} |"
                )
                continue
            print(
                f"| {r['graphs']} | {r['variant']} | {r['preset']} | {r['precision']} | "
                f"{f(r['gap_ms'])} | {f(r['compute_p50_us'])} ({f(r['compute_p10_us'])}/"
                f"{f(r['compute_min_us'])}) | {f(r['wall_p50_us'])} | {f(r['server_total_p50_us'])} "
                f"| {r['impl']} | {r['graph']} | {','.join(r['work_count'])} | "
                f"{r['count_readback_bytes']} |"
            )
    print("\n## Blocking-form overhead, small call (wall − compute), GetInfo\n")
    print(
        "wall: the caller's wall around one call; daemon: `--worker-spin` (0 or 1 ms); caller "
        "polls: attnctl `--wait-spin=2ms`; caller CPU: every thread of the client process.\n"
    )
    print(
        "| client | daemon spin | caller polls | op | api | prepared | wall p50 / p90 µs "
        "| compute p50 µs | overhead p50 / p90 µs | wall − server total p50 µs | caller CPU µs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for _name, r in rows:
        if r.get("probe") in ("small", "small_parts"):
            spin = "1 ms" if r.get("graphs") == "worker_spin" else "0"
            if "error" in r:
                print(f"| python | {spin} | no | {r.get('op')} | error: {r['error']} | | | | | | |")
            elif r.get("probe") == "small_parts":
                print(
                    f"| python | {spin} | no | sparse_mla parts: build_request "
                    f"{f(r.get('build_request_us'))} µs; stub call on a built request | unary | "
                    f"no | {f(r.get('stub_call_wall_p50_us'))} / - | "
                    f"{f(r.get('stub_call_compute_p50_us'))} | - | "
                    f"{f(r.get('stub_call_wall_minus_total_p50_us'))} | - |"
                )
            elif r.get("op") == "get_info":
                print(
                    f"| python | {spin} | no | GetInfo (channel {r.get('channel', 'default')}, "
                    f"grpcio {r.get('grpcio', '?')}) | unary | - | "
                    f"{f(r['round_trip_p50_us'])} / {f(r['round_trip_p90_us'])} | - | - | - | - |"
                )
            elif r.get("submit") in ("ring_wait", "ring_caller_stream"):
                polls = "yes" if r.get("wait_spin_ms") else "no"
                form = "ring, waited" if r["submit"] == "ring_wait" else "ring caller, stream"
                print(
                    f"| python | {spin} | {polls} | {r['op']} {r['preset']} | {r['api']} | "
                    f"{form} | {f(r['wall_p50_us'])} / {f(r['wall_p90_us'])} | "
                    f"{f(r['compute_p50_us'])} (blocking calls) | "
                    f"{f(r['overhead_p50_us'])} / {f(r['overhead_p90_us'])} | - | "
                    f"{f(r.get('caller_cpu_us_per_call'))} |"
                )
            else:
                print(
                    f"| python | {spin} | no | {r['op']} {r['preset']} | {r['api']} | "
                    f"{'yes' if r.get('prepared') else 'no'} | {f(r['wall_p50_us'])} / "
                    f"{f(r['wall_p90_us'])} | {f(r['compute_p50_us'])} | "
                    f"{f(r['overhead_p50_us'])} / {f(r['overhead_p90_us'])} | "
                    f"{f(r.get('transport_overhead_p50_us'))} | - |"
                )
    for name, r in rows:
        tag = r.get("h4_probe")
        if name.startswith("attnctl") and tag in ("small", "ping", "small_spin", "worker_spin"):
            args = r.get("args", "")
            spin = "1 ms" if tag == "worker_spin" else "0"
            polls = "yes" if "--wait-spin=2ms" in args else "no"
            if r.get("command") == "ping":
                print(
                    f"| cpp | {spin} | {polls} | GetInfo (ping) | unary | - | "
                    f"{f(r.get('p50_us'))} / {f(r.get('p90_us'))} | - | - | - | - |"
                )
            else:
                print(
                    f"| cpp | {spin} | {polls} | {r.get('op')} {r.get('preset')} "
                    f"({r.get('transport')}) | {r.get('api')} | "
                    f"{'ring, waited' if r.get('ring_wait') else 'yes' if r.get('prepared') else 'no'} | "
                    f"{f(r.get('p50_us'))} / {f(r.get('p90_us'))} | "
                    f"{f(r.get('server_compute_p50_us'))}{' (blocking calls)' if r.get('ring_wait') else ''} | "
                    f"{f(r.get('overhead_p50_us'))} / {f(r.get('overhead_p90_us'))} | "
                    f"{'-' if r.get('ring_wait') else f(r.get('transport_overhead_p50_us'))} | "
                    f"{f(r.get('caller_cpu_us_per_call'))} |"
                )
    print("\n## Caller CPU per stream-ordered prepared call\n")
    print("| client | op | submit | calls | caller CPU µs/call | submit wall µs/call | error |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows:
        if r.get("probe") == "caller_cpu":
            print(
                f"| python | {r.get('op')} | {r.get('submit')} | {r.get('calls')} | "
                f"{f(r.get('caller_cpu_us_per_call'))} | {f(r.get('submit_wall_us_per_call'))} | "
                f"{r.get('error', '')} |"
            )
        if name.startswith("attnctl") and r.get("h4_probe") == "caller_cpu":
            calls = r.get("requests")
            wall = r.get("calls_wall_s")
            per = wall / calls * 1e6 if isinstance(wall, (int, float)) and calls else None
            print(
                f"| cpp | {r.get('op')} | {'ring' if r.get('ring') else 'run_prepared_rpc'} | "
                f"{calls} | {f(r.get('caller_cpu_us_per_call'))} | {f(per)} | "
                f"{r.get('first_error') or r.get('error') or ''} |"
            )


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "wrap":
        wrap(sys.argv[2], sys.argv[3:])
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
