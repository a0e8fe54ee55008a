#!/usr/bin/env python3
"""The soak: one CPU attnd kept at saturation for --duration seconds by --clients client
processes (soak_client.py: every op, unary and Session calls, inline and host-region tensors,
tight deadlines, cancellations, pipelined bursts, regions and leases coming and going), one of
them SIGKILLed every few seconds and replaced, then SIGTERM with the clients still calling.

Passes when no reply was wrong or lost, every error code is explained (RESOURCE_EXHAUSTED from
the small queue; DEADLINE_EXCEEDED / CANCELLED only on calls given a tight deadline or
cancelled; UNAVAILABLE / CANCELLED only after the SIGTERM), no client died on its own, the
daemon's RSS stayed flat (RSS_GROWTH_BOUND below), its fds and mappings did not grow, a killed
client's lease took its regions, attnd exited 0 within the drain timeout leaving no socket,
ready file or /dev/shm object of its own, and the clients' shm objects were all cleaned.
Writes a JSON summary (--out) and ends with one readable line; progress every 30 s on stderr.

    PYTHONPATH=client/python /usr/bin/python3 tests/soak/soak.py --duration 60 --clients 3
    nice /usr/bin/python3 tests/soak/soak.py --duration 3600 --clients 6 \
        --daemon /tmp/soak-bin/attnd --out bench/results/soak_cpu_<commit>_<date>.json
"""

import argparse
import collections
import datetime
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
INTEGRATION = os.path.join(ROOT, "tests", "integration")
CLIENT_PY = os.path.join(ROOT, "client", "python")
for path in (HERE, INTEGRATION, CLIENT_PY):
    if path not in sys.path:
        sys.path.insert(0, path)

import attnd_client as ac  # noqa: E402

import cases as case_makers  # noqa: E402
import soak_cases  # noqa: E402
from daemon import Daemon, parse_metrics, sample  # noqa: E402

# Flat RSS: the median RSS of the last 20% of the load must not exceed the median of the 20-40%
# window (after warm-up) by more than max(RSS_GROWTH_MIB, RSS_GROWTH_FRACTION x that median).
# Why this much: glibc keeps freed memory in per-thread arenas (attnd has gRPC, scheduler and CPU
# pool threads, each may hold a few MiB of slack whose touched pages count in RSS) and the peak
# of concurrent inline requests/replies varies with which ops happen to overlap (the largest
# inline reply here is ~1 MiB, times queue + workers + the gRPC buffers of N clients). A leak of
# one small allocation per call is far beyond it over the long run: at ~50 calls/s, 100 bytes
# a call is 18 MiB an hour, 1 KiB a call 180 MiB; a leaked region mapping (MiBs) shows at once.
RSS_GROWTH_MIB = 24
RSS_GROWTH_FRACTION = 0.10
FD_SLACK = 4  # connections of a client being replaced, a metrics scrape, a gRPC wakeup fd
MAPS_SLACK = 64  # regions live at once vary with N clients (each <= 2 regions + in-flight ones)
LEASE_RELEASE_TIMEOUT = 60.0  # a killed client's leased regions must be gone by then
SAMPLE_INTERVAL = 5.0  # at most; short runs sample more often
PROGRESS_INTERVAL = 30.0
DRAIN_TIMEOUT = 30  # --drain-timeout given to attnd, seconds
EXIT_GRACE = 15.0  # beyond the drain timeout: the gRPC server's own shutdown, process exit
AFTER_SIGTERM = {"UNAVAILABLE", "CANCELLED", "FAILED_PRECONDITION"}  # the last: session closed


def log(msg):
    print(f"soak: {msg}", file=sys.stderr, flush=True)


def git(*args):
    try:
        return subprocess.run(
            ["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def find_daemon(explicit):
    for path in (
        explicit,
        os.environ.get("ATTND_BIN"),
        os.path.join(ROOT, "build", "server", "attnd"),
        os.path.join(ROOT, "build", "server", "main", "attnd"),
    ):
        if path and os.path.exists(path):
            return path
    sys.exit("soak: attnd binary not found: --daemon or ATTND_BIN")


class Child:
    def __init__(self, index, proc, log_path):
        self.index = index
        self.proc = proc
        self.pid = proc.pid
        self.log_path = log_path
        self.reader = None
        self.said_bye = False
        self.killed = False


class Soak:
    def __init__(self, args):
        self.args = args
        self.binary = find_daemon(args.daemon)
        self.seed = args.seed if args.seed is not None else secrets.randbits(31)
        self.rng = random.Random(self.seed)
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.region_cycles = 0
        self.session_cycles = 0
        self.memo = collections.Counter()
        self.events = []
        self.children = []
        self.crashed = []
        self.kills = 0
        self.spawned = 0
        self.killed_shm_cleaned = 0
        self.orphan_regions_cleaned = 0
        self.lease_checks = []  # (pid, names, deadline)
        self.lease_release_seconds = []
        self.lease_leaks = []
        self.samples = []
        self.scrape_failures = 0
        self.daemon_maps_shm = set()
        self.key_prefix = f"attnd-soak-{os.getpid()}"
        self.region_prefix = f"soak{os.getpid()}"
        self.t_sigterm = None
        self.failures = []

    # ---- clients ----

    def spawn(self, index):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [HERE, INTEGRATION, CLIENT_PY] + [p for p in [env.get("PYTHONPATH")] if p]
        )
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        target = self.daemon.tcp_target if index % 3 == 2 else self.daemon.unix_target
        self.spawned += 1
        log_path = os.path.join(self.daemon.dir, f"client-{self.spawned}.log")
        with open(log_path, "wb") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    os.path.join(HERE, "soak_client.py"),
                    f"--target={target}",
                    f"--memo={self.memo_path}",
                    f"--seed={self.seed}",
                    f"--client-seed={self.rng.randrange(1 << 31)}",
                    f"--key-prefix={self.key_prefix}",
                    f"--region-prefix={self.region_prefix}",
                    f"--lost-after={self.args.lost_after}",
                    f"--stop-file={self.stop_file}",
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
            )
        child = Child(index, proc, log_path)
        child.reader = threading.Thread(target=self.read, args=(child,), daemon=True)
        child.reader.start()
        return child

    def read(self, child):
        for line in child.proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                kind = record.get("k")
                if kind == "stats":
                    self.counts.update(record["counts"])
                    self.region_cycles += record["region_cycles"]
                    self.session_cycles += record["session_cycles"]
                    self.memo.update(record["memo"])
                elif kind == "event":
                    record["pid"] = child.pid
                    self.events.append(record)
                elif kind == "bye":
                    child.said_bye = True

    def clean_child(self, child):
        """After a client died: its shm objects, its regions outside any lease (a killed client
        cannot unregister them; the daemon keeps them by design), and a later check that the
        daemon released the regions under its lease."""
        prefix = f"{self.key_prefix}-{child.pid}-"
        for name in os.listdir("/dev/shm"):
            if name.startswith(prefix):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                    self.killed_shm_cleaned += 1
                except FileNotFoundError:
                    pass
        mine = f"{self.region_prefix}-{child.pid}-"
        leased = []
        for r in self.control.list_regions(timeout=120):
            if not r.name.startswith(mine):
                continue
            if r.lease_id:
                leased.append(r.name)
                continue
            try:
                self.control.unregister_region(r.name, timeout=120)
                self.orphan_regions_cleaned += 1
            except ac.AttndError as e:
                if e.code.name != "NOT_FOUND":
                    raise
        if leased:
            self.lease_checks.append((time.monotonic(), leased))

    def check_leases(self):
        if not self.lease_checks:
            return
        names = {r.name for r in self.control.list_regions(timeout=120)}
        still = []
        for started, leased in self.lease_checks:
            waited = time.monotonic() - started
            if not names & set(leased):
                self.lease_release_seconds.append(waited)
            elif waited > LEASE_RELEASE_TIMEOUT:
                self.lease_leaks.append(sorted(names & set(leased)))
            else:
                still.append((started, leased))
        self.lease_checks = still

    def kill_one(self):
        child = self.rng.choice(self.children)
        child.killed = True
        child.proc.kill()
        child.proc.wait(60)
        child.reader.join(60)
        self.kills += 1
        self.clean_child_safely(child)
        self.children[self.children.index(child)] = self.spawn(child.index)

    def clean_child_safely(self, child):
        try:
            self.clean_child(child)
        except ac.AttndError as e:
            self.failures.append(f"cleaning up after client {child.pid}: {e.code.name} {e.details}")

    def reap_crashed(self):
        for i, child in enumerate(self.children):
            if child.proc.poll() is not None:
                child.reader.join(60)
                with open(child.log_path, errors="replace") as f:
                    tail = f.read()[-3000:]
                self.crashed.append({"pid": child.pid, "rc": child.proc.returncode, "log": tail})
                log(f"client {child.pid} exited {child.proc.returncode} on its own:\n{tail}")
                self.clean_child_safely(child)
                self.children[i] = self.spawn(child.index)

    # ---- daemon ----

    def sample(self, elapsed):
        d = self.daemon
        s = {
            "t": round(elapsed, 2),
            "rss": d.rss_bytes(),
            "fds": d.fd_count(),
            "threads": d.threads(),
            "maps": len(d.maps()),
            "load1": os.getloadavg()[0],  # the machine's, with whatever else runs on it
        }
        shm = d.shm_mappings()
        s["shm_mappings"] = len(shm)
        for line in shm:
            self.daemon_maps_shm.add(line.split("/dev/shm/", 1)[1].split(" ")[0])
        try:
            s["regions"] = len(self.control.list_regions(timeout=60))
        except ac.AttndError:
            s["regions"] = None
        try:
            m = parse_metrics(d.scrape())
            s["inflight"] = sample(m, "attnd_inflight_requests")
            s["queue_depth"] = sample(m, "attnd_queue_depth")
            s["workers_busy"] = sample(m, "attnd_workers_busy")
            s["workers"] = sample(m, "attnd_workers")
            by_code = collections.Counter()
            for (name, labels), value in m.items():
                if name == "attnd_requests_total":
                    by_code[dict(labels).get("code", "?")] += value
            s["requests_by_code"] = dict(by_code)
        except (OSError, ValueError):
            self.scrape_failures += 1
        self.samples.append(s)
        return s

    def progress(self, elapsed, s):
        with self.lock:
            calls = sum(self.counts.values())
            ok = sum(n for k, n in self.counts.items() if k.endswith("|OK"))
            events = len(self.events)
        log(
            f"{elapsed:6.0f} s: {calls} calls ({ok} ok, {calls / max(elapsed, 1):.0f}/s), "
            f"{events} events, {self.kills} kills, {self.region_cycles} region cycles, "
            f"RSS {s['rss'] / 2**20:.1f} MiB, fds {s['fds']}, regions {s.get('regions')}, "
            f"busy {s.get('workers_busy')}/{s.get('workers')}, queue {s.get('queue_depth')}, "
            f"load {s['load1']:.1f}"
        )

    def warm_references(self):
        """One checked inline call per case: the daemon answers every op right before the load
        starts, and the references the clients will need are computed here, once."""
        soak_cases.install_memo()
        cases = soak_cases.build_cases(self.seed)
        for _label, case in cases:
            res = self.control.call(case.op, **case.arguments(**case_makers.inline_outputs(case)))
            case.check(res.outputs)
        # And once more: every reference must now come from the memo.
        before = soak_cases.stats["misses"]
        for _label, case in cases:
            res = self.control.call(case.op, **case.arguments(**case_makers.inline_outputs(case)))
            case.check(res.outputs)
        self.warm_misses = soak_cases.stats["misses"] - before
        soak_cases.save_memo(self.memo_path)

    # ---- the run ----

    def run(self):
        a = self.args
        self.shm_before = set(os.listdir("/dev/shm"))
        self.daemon = Daemon(
            self.binary,
            f"--queue-capacity={a.queue_capacity}",
            f"--workers={a.workers}",
            f"--drain-timeout={DRAIN_TIMEOUT}s",
            "--log-level=info",
            name="attnd-soak",
        )
        self.daemon.start()
        try:
            return self._run()
        finally:
            for child in self.children:
                if child.proc.poll() is None:
                    child.proc.kill()
                    child.proc.wait(60)
            self.daemon.cleanup()

    def _run(self):
        a = self.args
        d = self.daemon
        self.memo_path = os.path.join(d.dir, "refs.pkl")
        self.stop_file = os.path.join(d.dir, "stop")
        self.control = ac.Client(d.unix_target)
        self.control.wait_ready(60)
        log(f"attnd {d.pid} ({self.binary}), seed {self.seed}, {a.clients} clients, {a.duration} s")
        t0 = time.monotonic()
        self.warm_references()
        log(f"references ready in {time.monotonic() - t0:.1f} s")
        self.sample(0.0)
        start = time.monotonic()
        self.children = [self.spawn(i) for i in range(a.clients)]
        self.next_kill = start + a.kill_interval * self.rng.uniform(0.5, 1.5)
        self.interval = min(SAMPLE_INTERVAL, max(1.0, a.duration / 40))  # >= 8 samples a window
        self.next_sample = start + self.interval
        self.next_progress = start + PROGRESS_INTERVAL
        end = start + a.duration
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if not d.alive():
                self.failures.append(f"attnd died (exit {d.proc.returncode})")
                break
            try:
                self.tick(now, start)
            except ac.AttndError as e:  # a control call (ListRegions) failed: stop, report
                self.failures.append(f"control call failed: {e.code.name} {e.details}")
                break
            time.sleep(0.2)
        self.load_seconds = time.monotonic() - start
        self.final_sample = self.sample(self.load_seconds) if d.alive() else None
        self.check_leases()
        self.control.close()
        return self.shutdown()

    def tick(self, now, start):
        self.reap_crashed()
        if now >= self.next_kill:
            self.kill_one()
            self.next_kill = time.monotonic() + self.args.kill_interval * self.rng.uniform(0.5, 1.5)
        if now >= self.next_sample:
            s = self.sample(now - start)
            self.check_leases()
            self.next_sample += self.interval
            if now >= self.next_progress:
                self.progress(now - start, s)
                self.next_progress += PROGRESS_INTERVAL

    def shutdown(self):
        d = self.daemon
        self.t_sigterm = time.time()
        t = time.monotonic()
        exit_code = None
        if d.alive():
            d.signal(signal.SIGTERM)
        open(self.stop_file, "w").close()  # the clients wind down while attnd drains
        try:
            exit_code = d.wait(DRAIN_TIMEOUT + EXIT_GRACE)
        except subprocess.TimeoutExpired:
            self.failures.append(
                f"attnd still running {DRAIN_TIMEOUT + EXIT_GRACE} s after SIGTERM"
            )
            d.proc.kill()
            d.wait(30)
        self.exit_seconds = time.monotonic() - t
        self.exit_code = exit_code
        hung = []
        for child in self.children:
            try:
                child.proc.wait(120)
            except subprocess.TimeoutExpired:
                hung.append(child.pid)
                child.proc.kill()
                child.proc.wait(60)
            child.reader.join(60)
            if not child.said_bye:
                with open(child.log_path, errors="replace") as f:
                    tail = f.read()[-3000:]
                self.crashed.append({"pid": child.pid, "rc": child.proc.returncode, "log": tail})
        if hung:
            self.failures.append(f"clients still running 120 s after the stop file: {hung}")
        log_text = d.log()
        self.attnd_log = {"bytes": len(log_text), "tail": log_text[-4000:]}
        self.leftover_socket = os.path.exists(d.socket)
        self.leftover_ready = os.path.exists(d.ready_file)
        return self.verdict()

    # ---- verdict ----

    def classify(self):
        wrong, lost, after, unexplained = [], [], collections.Counter(), []
        for e in self.events:
            if e["kind"] == "wrong":
                wrong.append(e)
            elif e["kind"] == "lost":
                lost.append(e)
            elif (
                self.t_sigterm is not None
                and e["t"] >= self.t_sigterm
                and e["code"] in AFTER_SIGTERM
            ):
                after[e["code"]] += 1
            else:
                unexplained.append(e)
        return wrong, lost, after, unexplained

    def rss_check(self):
        load = self.samples  # all taken before the SIGTERM
        T = load[-1]["t"]

        def window(lo, hi):
            return [s for s in load if lo * T <= s["t"] <= hi * T]

        warm, last = window(0.2, 0.4), window(0.8, 1.0)
        if len(warm) < 2 or len(last) < 2:
            return None, "too few samples"
        out = {}
        for key in ("rss", "fds", "maps", "shm_mappings", "threads"):
            out[key] = {
                "start": load[0][key],
                "warm_median": statistics.median(s[key] for s in warm),
                "warm_max": max(s[key] for s in warm),
                "end_median": statistics.median(s[key] for s in last),
                "max": max(s[key] for s in load),
            }
        problems = []
        r = out["rss"]
        bound = max(RSS_GROWTH_MIB << 20, RSS_GROWTH_FRACTION * r["warm_median"])
        r["bound_bytes"] = bound
        r["growth_bytes"] = r["end_median"] - r["warm_median"]
        if r["growth_bytes"] > bound:
            problems.append(f"RSS grew {r['growth_bytes'] / 2**20:.1f} MiB > {bound / 2**20:.1f}")
        if out["fds"]["end_median"] > out["fds"]["warm_max"] + FD_SLACK:
            problems.append(f"fds grew: {out['fds']}")
        if out["maps"]["end_median"] > out["maps"]["warm_max"] + MAPS_SLACK:
            problems.append(f"mappings grew: {out['maps']}")
        return out, "; ".join(problems)

    def verdict(self):
        a = self.args
        wrong, lost, after, unexplained = self.classify()
        footprint, footprint_problem = self.rss_check()
        shm_now = set(os.listdir("/dev/shm"))
        client_left = sorted(n for n in shm_now if n.startswith(self.key_prefix + "-"))
        for name in client_left:
            os.unlink(os.path.join("/dev/shm", name))
        # attnd creates no shm objects (docs/SERVICE.md "Regions"); anything it mapped that is
        # not a client's, or any reserved /attnd-internal name that appeared, would be its own.
        ours = {n for n in self.daemon_maps_shm if not n.startswith(self.key_prefix)}
        attnd_left = sorted(
            n for n in shm_now - self.shm_before if n in ours or n.startswith("attnd-internal")
        )
        if wrong:
            self.failures.append(f"{len(wrong)} wrong replies")
        if lost:
            self.failures.append(f"{len(lost)} lost replies")
        if unexplained:
            self.failures.append(f"{len(unexplained)} unexplained errors")
        if self.crashed:
            self.failures.append(f"{len(self.crashed)} clients died on their own")
        if self.lease_leaks:
            self.failures.append(
                f"leased regions of killed clients not released: {self.lease_leaks}"
            )
        if footprint_problem:
            self.failures.append(footprint_problem)
        if self.exit_code != 0:
            self.failures.append(f"attnd exit code {self.exit_code} after SIGTERM")
        if self.leftover_socket or self.leftover_ready:
            self.failures.append("attnd left its socket or ready file")
        if client_left:
            self.failures.append(f"client shm objects left: {client_left[:5]}")
        if attnd_left:
            self.failures.append(f"attnd shm objects left: {attnd_left[:5]}")
        calls_total = sum(self.counts.values())
        if calls_total == 0:
            self.failures.append("no calls were made")

        per_op = collections.defaultdict(collections.Counter)
        by_code = collections.Counter()
        by_form = collections.Counter()
        for key, n in self.counts.items():
            label, via, placement, mode, code = key.split("|")
            op = dict((c[0], c[1]) for c in soak_cases.CASES)[label]
            per_op[op][code] += n
            by_code[code] += n
            by_form[f"{via}/{placement}/{mode}"] += n
        busy = [
            s["workers_busy"] / s["workers"]
            for s in self.samples
            if s.get("workers") and s["t"] > 0
        ]
        last_metrics = self.final_sample.get("requests_by_code") if self.final_sample else None
        summary = {
            "passed": not self.failures,
            "failures": self.failures,
            "commit": git("rev-parse", "HEAD"),
            # Uncommitted changes to what the soak runs (its driver, the client, the helpers).
            "tree_dirty": bool(
                git("status", "--porcelain", "--", "tests/soak", "tests/integration", "client")
            ),
            "daemon_commit": a.daemon_commit or "",
            "daemon": self.binary,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seed": self.seed,
            "duration_seconds": round(self.load_seconds, 1),
            "clients": a.clients,
            "daemon_flags": self.daemon.argv[1:],
            "kill_interval_seconds": a.kill_interval,
            "load_average_end": list(os.getloadavg()),
            "load1_median": statistics.median(s["load1"] for s in self.samples),
            "cpus": os.cpu_count(),
            "calls": calls_total,
            "calls_ok": by_code.get("OK", 0),
            "calls_per_second": round(calls_total / max(self.load_seconds, 1e-9), 1),
            "calls_per_op": {op: dict(c) for op, c in sorted(per_op.items())},
            "calls_by_code": dict(by_code),
            "calls_by_form": dict(by_form),
            "wrong": len(wrong),
            "lost": len(lost),
            "errors_after_sigterm": dict(after),
            "unexplained_errors": len(unexplained),
            "events": (wrong + lost + unexplained)[:50],
            "daemon_requests_by_code": last_metrics,
            "kills": self.kills,
            "clients_started": self.spawned,
            "clients_crashed": self.crashed,
            "region_cycles": self.region_cycles,
            "session_cycles": self.session_cycles,
            "orphan_regions_cleaned": self.orphan_regions_cleaned,
            "killed_client_shm_cleaned": self.killed_shm_cleaned,
            "lease_release_seconds_max": max(self.lease_release_seconds, default=None),
            "lease_releases_checked": len(self.lease_release_seconds),
            "reference_memo": dict(self.memo),
            "warm_reference_misses": self.warm_misses,
            "workers_busy_fraction_mean": round(statistics.mean(busy), 3) if busy else None,
            "footprint": footprint,
            "rss_bound": f"max({RSS_GROWTH_MIB} MiB, {RSS_GROWTH_FRACTION:.0%} of the warm median)",
            "scrape_failures": self.scrape_failures,
            "exit_code": self.exit_code,
            "exit_seconds_after_sigterm": round(self.exit_seconds, 2),
            "drain_timeout_seconds": DRAIN_TIMEOUT,
            "leftover_socket": self.leftover_socket,
            "leftover_ready_file": self.leftover_ready,
            "client_shm_left": client_left,
            "attnd_shm_left": attnd_left,
            "attnd_log": self.attnd_log,
            "device_handles": "none: CPU backend (no GPU IPC handles exist to leak)",
            "samples": self.samples,
        }
        if a.out:
            with open(a.out, "w") as f:
                json.dump(summary, f, indent=1)
                f.write("\n")
        fp = footprint or {}
        rss = fp.get("rss", {})
        print(
            f"soak: {'PASS' if not self.failures else 'FAIL'} {summary['duration_seconds']:.0f} s, "
            f"{a.clients} clients, {calls_total} calls ({summary['calls_per_second']}/s, "
            f"{summary['calls_ok']} ok), wrong {len(wrong)}, lost {len(lost)}, "
            f"unexplained {len(unexplained)}, expected {dict((k, v) for k, v in by_code.items() if k != 'OK')}, "
            f"after SIGTERM {dict(after)}, kills {self.kills}, region cycles {self.region_cycles}, "
            f"RSS MiB start/warm/end {rss.get('start', 0) / 2**20:.1f}/"
            f"{rss.get('warm_median', 0) / 2**20:.1f}/{rss.get('end_median', 0) / 2**20:.1f}, "
            f"fds {fp.get('fds', {}).get('warm_median')}->{fp.get('fds', {}).get('end_median')}, "
            f"exit {self.exit_code} in {self.exit_seconds:.1f} s"
            + (f"; FAILURES: {self.failures}" if self.failures else "")
        )
        for e in (wrong + lost + unexplained)[:10]:
            log(f"event: {e}")
        return not self.failures


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, required=True, help="seconds of load")
    p.add_argument("--clients", type=int, default=4, help="client processes at once")
    p.add_argument("--daemon", help="attnd binary (default: ATTND_BIN, then build/server/attnd)")
    p.add_argument("--daemon-commit", help="the commit the attnd binary was built from")
    p.add_argument("--out", help="JSON summary path")
    p.add_argument("--seed", type=int, help="case and schedule seed (default: random)")
    p.add_argument("--kill-interval", type=float, default=5.0, help="mean seconds between kills")
    p.add_argument("--queue-capacity", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lost-after", type=float, default=120.0, help="a reply later is lost")
    args = p.parse_args()
    ok = Soak(args).run()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
