"""Identity and ownership (docs/SERVICE.md "Trust model"): a second OS user (a child process
running as uid/gid 65534) and this process (root) share one daemon running as root. Neither may
register the other's shm objects; each sees, uses and removes only its own regions and leases;
region names are scoped per user; TCP callers cannot register host memory; a client's regions are
capped by --max-regions-per-client.

Needs root (to start the child as another user): skipped otherwise.
"""

import json
import os
import select
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from ownership_child import code_of

import attnd_client as ac

HERE = os.path.dirname(os.path.abspath(__file__))
NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the second client runs as uid 65534"
)


def open_to_others(daemon):
    """The test daemon's socket lives in a 0700 directory: let the other user reach it."""
    os.chmod(daemon.dir, 0o755)
    os.chmod(daemon.socket, 0o666)


def demote():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def read_json(proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line:
                return json.loads(line)
        if proc.poll() is not None:
            break
    raise AssertionError(f"child said nothing (exit {proc.poll()}): {proc.stderr.read()}")


def start_child(daemon, foreign_key):
    pythonpath = os.pathsep.join([HERE] + [p for p in sys.path if p])
    env = dict(os.environ, PYTHONPATH=pythonpath, HOME="/tmp")
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "ownership_child.py"), daemon.unix_target, foreign_key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        preexec_fn=demote,
        cwd="/",
    )


def topk_of(client, region):
    """The 4 largest of the 1024 f32 values at the start of `region` (a TopK call)."""
    request = ac.pb.TopKRequest(
        logits=ac.pb.Tensor(
            dtype=ac.pb.DTYPE_F32, shape=[1, 1024], region=ac.pb.RegionSlice(region=region)
        ),
        lengths=ac.pb.Tensor(
            dtype=ac.pb.DTYPE_I32,
            shape=[1],
            inline_data=np.array([1024], dtype=np.int32).tobytes(),
        ),
        k=4,
        values=ac.pb.Tensor(),
    )
    reply = client._rpc(client._stub.TopK, request, 60)
    return np.frombuffer(reply.values.inline_data, dtype=np.float32)


class OtherUser:
    """A daemon reachable by uid 65534, a 0600 shm object of root's holding 1024 random f32
    values, and the child client (ownership_child.py) running as uid 65534 against it."""

    def __init__(self, make_daemon):
        self.daemon = make_daemon(tcp=True)
        open_to_others(self.daemon)
        self.root = self.daemon.client()
        self.secret = ac.ShmObject(1 << 16)  # root's, mode 0600
        self.values = np.random.default_rng().standard_normal(1024).astype(np.float32)
        with open("/dev/shm" + self.secret.key, "r+b") as f:
            f.write(self.values.tobytes())
        self.child = start_child(self.daemon, self.secret.key)
        self.seen = read_json(self.child)

    def finish(self):
        """Lets the child list what it still has, clean up and exit; returns its regions."""
        self.child.stdin.write("\n")
        self.child.stdin.flush()
        left = read_json(self.child)["left"]
        self.child.wait(60)
        assert self.child.returncode == 0, self.child.stderr.read()
        return left

    def close(self):
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait(30)
        self.secret.unlink()


@pytest.fixture
def other_user(make_daemon):
    o = OtherUser(make_daemon)
    yield o
    o.close()


def test_only_objects_of_ones_own_uid_are_mapped(other_user):
    seen = other_user.seen
    assert seen["stolen"] == "PERMISSION_DENIED", seen  # root's 0600 object
    assert seen["mine"] == "OK", seen  # its own 0600 object
    assert seen["leased"] == "OK", seen
    assert seen["listed"] == ["leased", "mine"], seen
    # A TCP caller (whoever it is) cannot register host memory at all.
    tcp = other_user.daemon.client(tcp=True)
    code = code_of(lambda: tcp.register_host_region("tcp", other_user.secret.key, 4096))
    assert code == "PERMISSION_DENIED"
    assert other_user.finish() == ["leased", "mine"]


def test_regions_and_leases_belong_to_their_user(other_user):
    root, seen, secret = other_user.root, other_user.seen, other_user.secret
    # Root neither sees nor uses nor removes the other user's regions, nor touches its lease.
    assert [r.name for r in root.list_regions()] == []
    assert code_of(lambda: root.unregister_region("mine")) == "NOT_FOUND"
    assert code_of(lambda: topk_of(root, "mine")) == "NOT_FOUND"
    lease = seen["lease"]
    code = code_of(lambda: root.register_host_region("join", secret.key, 4096, lease_id=lease))
    assert code == "NOT_FOUND"
    assert code_of(lambda: root.unregister_region(lease_id=lease)) == "NOT_FOUND"
    # Names are per user: root takes "mine" for its own object and reads its own values; an
    # unregister-all removes only root's unleased regions.
    root.register_host_region("mine", secret.key, 4096)
    assert [r.name for r in root.list_regions()] == ["mine"]
    got = topk_of(root, "mine")
    np.testing.assert_array_equal(np.sort(got), np.sort(other_user.values)[-4:])
    assert root.unregister_region() == ["mine"]
    assert other_user.finish() == ["leased", "mine"]


def test_regions_per_client_are_capped(make_daemon):
    d = make_daemon("--max-regions-per-client=3", tcp=False)
    client = d.client()
    shm = ac.ShmObject(1 << 16)
    try:
        for i in range(3):
            client.register_host_region(f"cap-{i}", shm.key, 4096, offset=i * 4096)
        with pytest.raises(ac.AttndError) as e:
            client.register_host_region("cap-3", shm.key, 4096)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-regions-per-client=3" in e.value.details
        client.unregister_region("cap-0")
        client.register_host_region("cap-3", shm.key, 4096)
        assert client.health() == "SERVING"
    finally:
        client.unregister_region()
        shm.unlink()
