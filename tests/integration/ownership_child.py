"""A client of another user for test_ownership.py, started as uid/gid 65534 (nobody). It creates
a 0600 shm object of its own, registers it unleased as "mine" and, in a Session, as "leased";
tries to register the shm object `foreign_key` (the parent's, 0600) as "stolen"; prints one JSON
line (its lease, the code of each step) and waits for a line on stdin; then reports what it sees
of its own regions ("left"), unregisters them and exits.
    python3 ownership_child.py unix:/path/attnd.sock /foreign-key
"""

import json
import sys

import attnd_client as ac


def code_of(fn):
    try:
        fn()
        return "OK"
    except ac.AttndError as e:
        return e.code.name


def main(target, foreign_key):
    client = ac.Client(target)
    client.wait_ready()
    own = ac.ShmObject(1 << 16)
    out = {
        "stolen": code_of(lambda: client.register_host_region("stolen", foreign_key, 4096)),
        "mine": code_of(lambda: client.register_host_region("mine", own.key, 1 << 16)),
    }
    session = client.session("ownership-child")
    out["leased"] = code_of(
        lambda: client.register_host_region("leased", own.key, 4096, lease_id=session.lease_id)
    )
    out["lease"] = session.lease_id
    out["listed"] = sorted(r.name for r in client.list_regions())
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    print(json.dumps({"left": sorted(r.name for r in client.list_regions())}), flush=True)
    session.close()
    client.unregister_region("mine")
    own.unlink()
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
