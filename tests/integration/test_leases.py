"""A client process killed (SIGKILL) mid-session, with a call in flight: the daemon ends its
lease, so its regions are gone (ListRegions), the daemon unmaps them once the call ends and its
fds return to where they were; nothing is left in /dev/shm (the client unlinked its objects right
after registering them: regions.py says who unlinks what)."""

import json
import os
import select
import signal
import subprocess
import sys
import time

from daemon import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


def read_line(proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            return proc.stdout.readline()
        if proc.poll() is not None:
            break
    raise AssertionError(f"child said nothing (exit {proc.poll()}): {proc.stderr.read()}")


def test_killed_client_leaves_nothing(daemon, client):
    """Over the unix socket: TCP callers cannot register host memory (test_ownership.py)."""
    fds_before = daemon.fd_count()
    address = daemon.unix_target
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "child_client.py"), address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        held = json.loads(read_line(proc, 180))
        regions = {r.name: r for r in client.list_regions()}
        for name in held["regions"]:
            assert regions[name].lease_id == held["lease"], regions[name]
        if held["expected_seconds"] >= 1.0:  # (a GPU daemon finishes the call in milliseconds)
            assert regions["kill-slow"].in_flight >= 1
        for key in held["keys"]:
            assert not os.path.exists("/dev/shm" + key), f"{key} still linked"
        assert [m for m in daemon.shm_mappings() if held["keys"][0][1:] in m]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    wait_until(
        lambda: not ({r.name for r in client.list_regions()} & set(held["regions"])),
        timeout=60,
        what="the dead client's regions to go",
    )
    wait_until(
        lambda: not [m for m in daemon.shm_mappings() if any(k[1:] in m for k in held["keys"])],
        timeout=60 + 4 * held["expected_seconds"],
        what="the daemon to unmap them",
    )
    wait_until(
        lambda: daemon.fd_count() <= fds_before, timeout=60, what=f"daemon fds back to {fds_before}"
    )
    assert not [n for n in os.listdir("/dev/shm") if f"attnd-py-{proc.pid}-" in n]
    assert client.health() == "SERVING"
