"""A real attnd process for the integration tests: started on a temporary unix socket, TCP
127.0.0.1 port 0 and a metrics port 0, with the bound addresses read from --ready-file; its fds,
RSS and mappings read from /proc; stopped (SIGTERM, then SIGKILL) at the end.

    with Daemon(binary, "--queue-capacity=1") as d:
        client = d.client()              # unix socket; d.tcp_target for TCP
        text = d.scrape()                # /metrics
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import attnd_client

READY_TIMEOUT = 60.0
# The backend the daemon under test serves with: "cpu" (ctest's build), or what a GPU host's run
# sets (scripts/run-gpu-suite.sh: "cuda"); the tests of backend-dependent defaults read it.
BACKEND = os.environ.get("ATTND_EXPECT_BACKEND", "cpu")


class Daemon:
    def __init__(self, binary, *flags, allow_shm=True, tcp=True, metrics=True, name="attnd"):
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix=f"{name}-")
        self.socket = os.path.join(self.dir, "attnd.sock")
        self.ready_file = os.path.join(self.dir, "ready")
        self.log_path = os.path.join(self.dir, "attnd.log")
        listen = f"unix:{self.socket}" + (",127.0.0.1:0" if tcp else "")
        self.argv = [binary, f"--listen={listen}", f"--ready-file={self.ready_file}"]
        self.argv.append("--metrics-listen=127.0.0.1:0" if metrics else "--metrics-listen=")
        if allow_shm:
            self.argv.append("--allow-client-shm")
        self.argv.extend(flags)
        self.proc = None
        self.unix_target = f"unix:{self.socket}"
        self.tcp_target = None
        self.metrics_address = None
        self._clients = []

    # ---- process ----

    def start(self):
        """Starts attnd and waits for its ready file; on failure nothing is left behind."""
        try:
            return self._start()
        except BaseException:
            self.cleanup()
            raise

    def _start(self):
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT
        while not os.path.exists(self.ready_file):
            if self.proc.poll() is not None:
                raise RuntimeError(f"attnd exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"attnd not ready after {READY_TIMEOUT} s:\n{self.log()}")
            time.sleep(0.02)
        with open(self.ready_file) as f:
            for line in f:
                kind, address = line.split()
                if kind == "grpc" and not address.startswith("unix"):
                    self.tcp_target = address
                elif kind == "metrics":
                    self.metrics_address = address
        return self

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout=60):
        return self.proc.wait(timeout)

    def stop(self, timeout=60):
        """SIGTERM (graceful drain), SIGKILL after `timeout`; returns the exit code."""
        for c in self._clients:
            c.close(unregister=False)
        self._clients = []
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._log.close()
        return self.proc.returncode

    def cleanup(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if getattr(self, "_log", None) is not None:
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        try:
            self.stop()
        finally:
            self.cleanup()

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    # ---- clients ----

    def client(self, tcp=False, **kwargs):
        """A connected Client (closed by stop()); unix socket unless tcp."""
        c = attnd_client.Client(self.tcp_target if tcp else self.unix_target, **kwargs)
        c.wait_ready()
        self._clients.append(c)
        return c

    # ---- /proc ----

    def fd_count(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss_bytes(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def maps(self):
        with open(f"/proc/{self.pid}/maps") as f:
            return f.read().splitlines()

    def shm_mappings(self):
        return [line for line in self.maps() if "/dev/shm/" in line]

    def threads(self):
        return len(os.listdir(f"/proc/{self.pid}/task"))

    # ---- metrics ----

    def scrape(self):
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=30) as r:
            return r.read().decode()


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """{(name, frozenset(labels.items())): value} of a Prometheus text exposition."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"unparsable metrics line: {line!r}")
        labels = frozenset(_LABEL.findall(m.group(3) or ""))
        samples[(m.group(1), labels)] = float(m.group(4))
    return samples


def sample(samples, name, **labels):
    """The value of one sample (0 when absent: prometheus-cpp creates label sets lazily)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def wait_until(predicate, timeout=30.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
