"""Fixtures of the integration tests: the attnd binary (ATTND_BIN, set by CMake), a daemon per
module, clients, fresh random generators, and a /dev/shm leak check around every test.
Run by ctest (tests/integration/CMakeLists.txt) or by hand:
    ATTND_BIN=build/server/attnd PYTHONPATH=client/python \
        /usr/bin/python3 -m pytest tests/integration
"""

import os
import secrets

import numpy as np
import pytest

from daemon import Daemon

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _binary(env, default):
    path = os.environ.get(env) or os.path.join(ROOT, default)
    return path if os.path.exists(path) else None


@pytest.fixture(scope="session")
def attnd_bin():
    path = _binary("ATTND_BIN", "build/server/attnd")
    if path is None:
        pytest.fail("attnd binary not found: set ATTND_BIN (ctest does)")
    return path


@pytest.fixture(scope="session")
def attnctl_bin():
    return _binary("ATTNCTL_BIN", "build/client/attnctl")


@pytest.fixture(scope="module")
def daemon(attnd_bin):
    d = Daemon(attnd_bin, name="attnd-it").start()
    yield d
    crashed = not d.alive()
    code = d.stop()
    log = d.log()
    d.cleanup()
    assert not crashed, f"attnd died during the module:\n{log}"
    assert code == 0, f"attnd exited {code} on SIGTERM:\n{log}"


@pytest.fixture(scope="module")
def client(daemon):
    return daemon.client()


@pytest.fixture
def make_daemon(attnd_bin):
    """Starts extra daemons with given flags; every one is stopped at the end of the test."""
    started = []

    def make(*flags, **kwargs):
        d = Daemon(attnd_bin, *flags, **kwargs).start()
        started.append(d)
        return d

    yield make
    for d in started:
        try:
            d.stop()
        finally:
            d.cleanup()


@pytest.fixture
def rng():
    seed = secrets.randbits(63)
    print(f"rng seed {seed}")  # shown by pytest when the test fails
    return np.random.default_rng(seed)


def _our_shm():
    prefix = f"attnd-py-{os.getpid()}-"
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


@pytest.fixture(autouse=True)
def no_shm_leak():
    """Every shm object a test creates in this process is unlinked by its end."""
    before = _our_shm()
    yield
    left = _our_shm() - before
    for name in left:
        os.unlink(os.path.join("/dev/shm", name))
    assert not left, f"shm objects left in /dev/shm: {sorted(left)}"


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """pki(name) -> path of a PEM made by pki.make_pki (CA, server, client, rogue client)."""
    import pki as pki_module

    return pki_module.make_pki(str(tmp_path_factory.mktemp("pki")))
