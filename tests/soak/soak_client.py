"""One soak client process (started, killed and replaced by soak.py): loops over the soak's op
cases until its stop file exists, each call unary or on its Session, its tensors inline or (on
the unix socket) in a host region, now and then with a tight deadline, a cancellation or a
pipelined burst; registers and unregisters regions and opens and closes sessions (leases) as it
goes. Every reply is checked against the fp64 references (soak_cases.py); region outputs are
poisoned before each call.

Reports JSON lines on stdout: {"k": "stats", ...} count deltas about once a second, and
{"k": "event", ...} at once for every outcome that is not OK or expected by the call's own mode
(a wrong or lost reply, an unexpected status code); soak.py classifies them.
    python3 soak_client.py --target unix:/tmp/x/attnd.sock --memo refs.pkl --seed 7 \
        --key-prefix attnd-soak-123 --region-prefix soak-123 --stop-file /tmp/x/stop
"""

import argparse
import collections
import json
import os
import random
import sys
import time

import grpc
import numpy as np

import attnd_client as ac
from attnd_client.regions import new_key

import cases as case_makers
import soak_cases

REPORT_INTERVAL = 1.0
P_REGION_CYCLE = 0.03  # per loop iteration: replace the host region
P_SESSION_CYCLE = 0.01  # replace the session (its lease and the regions under it end)
P_TIGHT_DEADLINE = 0.05  # a deadline of 1-30 ms: DEADLINE_EXCEEDED is expected, OK is checked
P_CANCEL = 0.04  # cancelled soon after submission: CANCELLED is expected, OK is checked
P_BURST = 0.08  # 3-5 inline calls pipelined on the session at once: queue pressure
# Codes a call may end with whatever its mode (the daemon's queue is deliberately small).
ALWAYS_EXPECTED = {"RESOURCE_EXHAUSTED"}


class Stop(Exception):
    pass


class Runner:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.client_seed)
        self.cases = soak_cases.build_cases(args.seed)
        self.region_size = soak_cases.region_bytes(self.cases)
        self.counts = collections.Counter()
        self.region_cycles = 0
        self.session_cycles = 0
        self.region_count = 0
        self.stopping = False
        self.last_report = time.monotonic()
        self.client = ac.Client(args.target)
        deadline = time.monotonic() + 120
        while True:  # short waits: the daemon may stop while this replacement starts
            try:
                self.client.wait_ready(5)
                break
            except ac.AttndError:
                if os.path.exists(args.stop_file) or time.monotonic() > deadline:
                    raise
        self.session = None
        self.region = None

    # ---- reporting ----

    def emit(self, record):
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    def report(self, force=False):
        now = time.monotonic()
        if not force and now - self.last_report < REPORT_INTERVAL:
            return
        self.last_report = now
        self.emit(
            {
                "k": "stats",
                "counts": dict(self.counts),
                "region_cycles": self.region_cycles,
                "session_cycles": self.session_cycles,
                "memo": dict(soak_cases.stats),
            }
        )
        self.counts.clear()
        self.region_cycles = self.session_cycles = 0
        soak_cases.stats.update(hits=0, misses=0)

    def event(self, kind, what, code="", detail=""):
        self.emit(
            {
                "k": "event",
                "kind": kind,
                "what": what,
                "code": code,
                "t": time.time(),
                "detail": detail[:600],
            }
        )

    # ---- sessions and regions ----

    def drop_region(self):
        region, self.region = self.region, None
        if region is None:
            return
        try:
            region.close()  # unregister: returns once no call uses it; then unmapped here
        except ac.AttndError as e:
            self.event("error", "unregister", e.code.name, e.details)
        except TimeoutError as e:  # a session's unregister reply never came
            self.event("lost", "unregister", "LOST", str(e))

    def new_region(self):
        self.drop_region()
        if not self.args.target.startswith("unix:"):
            return  # host regions need the unix socket (the daemon checks the peer's uid)
        kinds = ["unary"] + (["session", "unary_lease"] if self.session is not None else [])
        kind = self.rng.choice(kinds)
        self.region_count += 1
        name = f"{self.args.region_prefix}-{os.getpid()}-{self.region_count}"
        key = new_key(self.args.key_prefix)
        try:
            if kind == "session":
                self.region = self.session.create_host_region(name, self.region_size, key=key)
            else:
                lease = self.session.lease_id if kind == "unary_lease" else ""
                self.region = self.client.create_host_region(
                    name, self.region_size, key=key, lease_id=lease
                )
            self.region_cycles += 1
        except ac.AttndError as e:
            self.event("error", f"register:{kind}", e.code.name, e.details)
        except TimeoutError as e:
            self.event("lost", f"register:{kind}", "LOST", str(e))

    def drop_session(self, abort=False):
        session, self.session = self.session, None
        if session is None:
            return
        if self.region is not None and self.region.lease_id == session.lease_id:
            self.drop_region()
        try:
            session.abort() if abort else session.close(self.args.lost_after)
        except ac.AttndError as e:
            self.event("error", "session_close", e.code.name, e.details)

    def new_session(self):
        self.drop_session()
        try:
            self.session = self.client.session(f"soak-{os.getpid()}")
            self.session_cycles += 1
        except ac.AttndError as e:
            self.event("error", "session_open", e.code.name, e.details)
        except TimeoutError as e:
            self.event("lost", "session_open", "LOST", str(e))

    # ---- calls ----

    def outcome(self, label, via, placement, mode, code, detail=""):
        self.counts[f"{label}|{via}|{placement}|{mode}|{code}"] += 1
        if code == "OK" or code in ALWAYS_EXPECTED:
            return
        if (mode == "deadline" and code == "DEADLINE_EXCEEDED") or (
            mode == "cancel" and code == "CANCELLED"
        ):
            return
        kind = {"WRONG": "wrong", "LOST": "lost"}.get(code, "error")
        self.event(kind, f"{label}|{via}|{placement}|{mode}", code, detail)

    def region_arguments(self, case):
        region = self.region
        region.reset()
        args = {n: region.put(a, case.input_dtypes[n]) for n, a in case.inputs.items()}
        args.update(case.scalars)
        outs = {}
        for name, (dtype, shape) in case.outputs.items():
            view = region.array(dtype, shape)
            view[...] = case_makers.POISON[dtype]
            outs[name] = view
        return args, outs

    def submit(self, caller, case, args, timeout):
        if caller is self.client:
            return self.client.submit(case.op, timeout=timeout, **args)
        return caller.submit(case.op, timeout=timeout, **args)

    def wait(self, call):
        """The call's OpResult, or the status code name ("LOST" when no reply in time)."""
        try:
            return call.result(self.args.lost_after)
        except ac.AttndError as e:
            return e.code.name, e.details
        except (TimeoutError, grpc.FutureTimeoutError):
            call.cancel()
            return "LOST", f"no reply after {self.args.lost_after} s"

    def check(self, case, result, outs):
        """None when the reply is right, else what is wrong."""
        try:
            if outs is None:
                case.check(result.outputs)
            else:
                case.check(outs)
                if result.stats.copied_bytes_in or result.stats.copied_bytes_out:
                    return "region tensors were copied"
                for name in case.outputs:
                    if result.outputs[name] is not outs[name]:
                        return f"output {name} not the region view"
        except AssertionError as e:
            return f"AssertionError: {e}"
        except Exception as e:  # a malformed reply (missing output, wrong shape) is wrong too
            return f"{type(e).__name__}: {e}"
        return None

    def one_call(self):
        label, case = self.rng.choice(self.cases)
        via = "session" if self.session is not None and self.rng.random() < 0.5 else "unary"
        placement = "region" if self.region is not None and self.rng.random() < 0.5 else "inline"
        r = self.rng.random()
        mode = "normal"
        if r < P_TIGHT_DEADLINE:
            mode = "deadline"
        elif r < P_TIGHT_DEADLINE + P_CANCEL:
            mode = "cancel"
        elif r < P_TIGHT_DEADLINE + P_CANCEL + P_BURST and via == "session":
            return self.burst()
        caller = self.session if via == "session" else self.client
        outs = None
        if placement == "region":
            args, outs = self.region_arguments(case)
            args.update(outs)
        else:
            args = case.arguments(**case_makers.inline_outputs(case))
        timeout = self.rng.uniform(0.001, 0.03) if mode == "deadline" else None
        try:
            call = self.submit(caller, case, args, timeout)
        except ac.AttndError as e:  # a closed session (its stream ended) refuses new calls
            self.outcome(label, via, placement, mode, e.code.name, e.details)
            self.recover(via, placement)
            return
        if mode == "cancel":
            time.sleep(self.rng.uniform(0, 0.005))
            call.cancel()
        got = self.wait(call)
        if isinstance(got, tuple):
            code, detail = got
            self.outcome(label, via, placement, mode, code, detail)
            self.recover(via, placement, lost=code == "LOST")
            return
        wrong = self.check(case, got, outs)
        self.outcome(label, via, placement, mode, "WRONG" if wrong else "OK", wrong or "")

    def burst(self):
        picks = [self.rng.choice(self.cases) for _ in range(self.rng.randint(3, 5))]
        calls = []
        for label, case in picks:
            args = case.arguments(**case_makers.inline_outputs(case))
            try:
                calls.append((label, case, self.session.submit(case.op, **args)))
            except ac.AttndError as e:
                self.outcome(label, "session", "inline", "burst", e.code.name, e.details)
                self.recover("session", "inline")
                break
        lost = False
        for label, case, call in calls:
            got = self.wait(call)
            if isinstance(got, tuple):
                self.outcome(label, "session", "inline", "burst", *got)
                lost = lost or got[0] == "LOST"
                continue
            wrong = self.check(case, got, None)
            self.outcome(
                label, "session", "inline", "burst", "WRONG" if wrong else "OK", wrong or ""
            )
        if lost:
            self.recover("session", "inline", lost=True)

    def recover(self, via, placement, lost=False):
        """After a failed call: a region call may still be running in the daemon (a client-side
        deadline or cancel, a lost reply), so its region is replaced (unregister waits for it);
        a session whose stream ended (or lost a reply) is replaced."""
        if self.stopping:
            return
        if placement == "region":
            self.new_region()
        if via == "session" and (lost or self.session is None or self.session._closed):
            self.drop_session(abort=True)
            self.new_session()

    # ---- main loop ----

    def run(self):
        self.new_session()
        self.new_region()
        while not os.path.exists(self.args.stop_file):
            r = self.rng.random()
            if r < P_REGION_CYCLE:
                self.new_region()
            elif r < P_REGION_CYCLE + P_SESSION_CYCLE:
                self.new_session()
                if self.region is None:
                    self.new_region()
            else:
                self.one_call()
            self.report()
        self.stopping = True
        self.drop_region()
        self.drop_session()
        try:
            self.client.close()
        except ac.AttndError as e:
            self.event("error", "client_close", e.code.name, e.details)
        self.report(force=True)
        self.emit({"k": "bye"})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--memo", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--client-seed", type=int, default=None)
    p.add_argument("--key-prefix", required=True)
    p.add_argument("--region-prefix", required=True)
    p.add_argument("--lost-after", type=float, default=120.0)
    p.add_argument("--stop-file", required=True, help="the client winds down once it exists")
    args = p.parse_args()
    soak_cases.install_memo()
    soak_cases.load_memo(args.memo)
    np.seterr(all="ignore")
    try:
        runner = Runner(args)
    except ac.AttndError:
        if os.path.exists(args.stop_file):  # the daemon stopped before this one connected
            print(json.dumps({"k": "bye"}), flush=True)
            return
        raise
    runner.emit({"k": "hello", "pid": os.getpid(), "target": args.target})
    runner.run()


if __name__ == "__main__":
    main()
