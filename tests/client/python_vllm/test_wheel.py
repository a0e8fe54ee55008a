"""The package as vLLM finds it: a wheel built from client/python_vllm (offline, with the
system's setuptools, from a copy so the source tree stays clean), installed into a fresh
directory, its `vllm.general_plugins` entry point loaded through importlib.metadata the way vLLM
loads plugins; without vLLM, calling it registers nothing and returns False."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

PROBE = """
import importlib.metadata as md, sys
sys.modules["vllm"] = None  # vLLM absent even if some site has it
(ep,) = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "attnd"]
print(ep.value, md.version("attnd-vllm"), ep.load()())
"""


def test_wheel_entry_point(tmp_path):
    for tool in ("pip", "setuptools", "wheel"):  # Debian's python3-pip brings all three
        if importlib.util.find_spec(tool) is None:  # not imported here: setuptools patches
            pytest.skip(f"{tool} is not installed")  # distutils on import
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "client", "python_vllm"), src)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-q", "-w", str(tmp_path / "dist"), str(src)], check=True, env=env)
    (wheel,) = (tmp_path / "dist").iterdir()
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "attnd_vllm/py.typed" in names and "attnd_vllm/mapping.py" in names
    assert not [n for n in names if n.startswith(("tests/", "fake_vllm/", "vllm/"))]
    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    subprocess.run([*install, str(wheel)], check=True, env=env)
    env["PYTHONPATH"] = f"{site}{os.pathsep}{os.path.join(ROOT, 'client', 'python')}"
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["attnd_vllm:register", "0.1.0", "False"], out
