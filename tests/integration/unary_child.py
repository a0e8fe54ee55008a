"""A client process for test_concurrency.py's killed-client test: starts a calibrated slow unary
call, prints one JSON line once the call is in flight, then sleeps until it is killed.
    python3 unary_child.py unix:/path/attnd.sock SECONDS
"""

import json
import sys
import time

import attnd_client as ac

from daemon import wait_until
from slow import SlowCall


def main(target, seconds):
    client = ac.Client(target)
    client.wait_ready()
    slow = SlowCall(client, "doomed-unary", seconds=seconds, max_tokens=2048, hold=False)
    call = slow.submit()
    # A GPU daemon may finish the call before a poll sees it in flight.
    wait_until(lambda: slow.in_flight() > 0 or call.done(), what="the slow call in flight")
    print(json.dumps({"expected_seconds": slow.expected_seconds}), flush=True)
    time.sleep(600)
    call.result()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
