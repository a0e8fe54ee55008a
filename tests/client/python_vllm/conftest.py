"""Fixtures of the vLLM plugin tests: a CPU attnd (started as tests/integration does, through its
Daemon helper), a client, and fresh random generators. Run by ctest (vllm_plugin_fixtures) or:
    ATTND_BIN=build/server/attnd PYTHONPATH=client/python:client/python_vllm \
        /usr/bin/python3 -m pytest tests/client/python_vllm
"""

import os
import secrets
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))  # daemon.py


@pytest.fixture(scope="module")
def daemon():
    from daemon import Daemon

    path = os.environ.get("ATTND_BIN") or os.path.join(ROOT, "build", "server", "attnd")
    if not os.path.exists(path):
        pytest.fail("attnd binary not found: set ATTND_BIN (ctest does)")
    d = Daemon(path, name="attnd-vllm").start()
    yield d
    crashed = not d.alive()
    code = d.stop()
    log = d.log()
    d.cleanup()
    assert not crashed, f"attnd died:\n{log}"
    assert code == 0, f"attnd exited {code}:\n{log}"


@pytest.fixture(scope="module")
def client(daemon):
    c = daemon.client()
    c.wait_ready()
    return c


@pytest.fixture
def rng():
    # ATTND_TEST_SEED replays a failed run's inputs (its seed is printed).
    seed = int(os.environ.get("ATTND_TEST_SEED") or secrets.randbits(63))
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
