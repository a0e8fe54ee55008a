"""The Python package as a user installs it: a fresh virtual environment (python3 -m venv),
`pip install ./client/python[ml-dtypes]` from PyPI (the build generates the stubs with
grpcio-tools), then venv_client.py run with that environment's Python against a real daemon.
The install must stay under INSTALL_LIMIT seconds (its time is printed; about a minute with an
empty pip cache on the CI machine)."""

import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INSTALL_LIMIT = 180.0


def clean_env():
    """The environment without the source tree on PYTHONPATH (ctest sets it)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_pip_install_into_a_fresh_venv(daemon, tmp_path):
    venv = tmp_path / "venv"
    env = clean_env()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    python = str(venv / "bin" / "python")
    start = time.monotonic()
    install = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            os.path.join(ROOT, "client", "python") + "[ml-dtypes]",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=2 * INSTALL_LIMIT,
    )
    took = time.monotonic() - start
    print(f"pip install ./client/python[ml-dtypes]: {took:.1f} s")
    assert install.returncode == 0, install.stdout + install.stderr
    assert took < INSTALL_LIMIT, f"pip install took {took:.1f} s, over {INSTALL_LIMIT} s"
    assert not os.path.exists(os.path.join(ROOT, "client", "python", "attnd_client.egg-info"))
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], env=env, capture_output=True, text=True
    )
    print(listed.stdout)
    check = subprocess.run(
        [python, os.path.join(ROOT, "tests", "integration", "venv_client.py"), daemon.unix_target],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    print(check.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.rstrip().endswith("venv client ok")
