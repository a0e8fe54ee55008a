"""A client process for test_leases.py: opens a Session, registers host regions under its lease
(two through the stream, one by a unary call naming the lease), starts a slow call on the stream,
prints one JSON line describing what it holds, then sleeps until it is killed.
    python3 child_client.py unix:/path/attnd.sock
"""

import json
import sys
import time

import attnd_client as ac

from daemon import wait_until
from slow import SlowCall


def main(target):
    client = ac.Client(target)
    client.wait_ready()
    session = client.session("doomed-child")
    slow = SlowCall(client, "kill-slow", seconds=3.0, owner=session, hold=False)
    other = session.create_host_region("kill-b", 1 << 16)
    unary = ac.ShmObject(1 << 16)
    client.register_host_region("kill-c", unary.key, 1 << 16, lease_id=session.lease_id)
    unary.unlink()  # the daemon has it mapped; a crash now leaves nothing in /dev/shm
    call = slow.submit(caller=session)
    # A GPU daemon may finish the call before a poll sees it in flight.
    wait_until(lambda: slow.in_flight() > 0 or call.done(), what="the slow call in flight")
    print(
        json.dumps(
            {
                "lease": session.lease_id,
                "regions": ["kill-slow", "kill-b", "kill-c"],
                "keys": [slow.region.key, other.key, unary.key],
                "expected_seconds": slow.expected_seconds,
            }
        ),
        flush=True,
    )
    time.sleep(600)
    call.result()


if __name__ == "__main__":
    main(sys.argv[1])
