"""The decode-step benchmark's Python parts (bench/decode_step/decode_step.py) against the CPU
daemon at a tiny shape: the stream-ordered path through a submission ring, through
RunPrepared with signals and through the client's OrderedCaller, and the blocking path, each writing its JSON line with the fields
docs/BENCHMARKS.md "Decode step" lists and an out that matches a blocking call bitwise. The
script needs torch: it runs under ATTND_TORCH_PYTHON (a python with torch), else under this
python when it has torch, else the test is skipped (CI's python3 has no torch)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "decode_step", "decode_step.py")
FIELDS = (
    "op preset client mps path step_us baseline_step_us added_us_per_layer "
    "caller_cpu_us_per_call commit date device layers steps signals"
).split()


def _torch_python():
    python = os.environ.get("ATTND_TORCH_PYTHON")
    if python:
        return python
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def _run(daemon, tmp_path, *args):
    """Runs the script on the CPU daemon at the tiny shape with `args`; its JSON lines (the test
    is skipped without a python with torch, failed when the script exits non-zero)."""
    python = _torch_python()
    if python is None:
        pytest.skip("no python with torch (set ATTND_TORCH_PYTHON)")
    out = tmp_path / "decode_step.jsonl"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    proc = subprocess.run(
        [python, SCRIPT, "--target", daemon.unix_target, "--device", "cpu", "--tiny",
         "--batch", "64", *args, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [json.loads(s) for s in out.read_text().splitlines()]


@pytest.mark.parametrize("submit", ["ring", "rpc", "ordered", "bound"])
def test_decode_step_cpu_smoke(daemon, tmp_path, submit):
    lines = _run(daemon, tmp_path, "--submit", submit)
    assert [x["path"] for x in lines] == ["stream_ordered", "blocking"]
    for line in lines:
        missing = [f for f in FIELDS if f not in line]
        assert not missing, f"{line['path']}: missing {missing}"
        assert line["op"] == "decode_step" and line["client"] == "python"
        assert "error" not in line, line["error"]
        assert line["check"] == "bitwise", line
        assert line["step_us"] > 0 and line["caller_cpu_us_per_call"] > 0
    assert lines[0]["done_words_ok"] and lines[0]["signals"] == "host"
    if submit in ("ordered", "bound"):
        assert lines[0]["arguments"] == ("bound" if submit == "bound" else "prebuilt")


def test_decode_step_ordered_profile_on_cpu(daemon, tmp_path):
    """--submit ordered with --profile-calls: the line says its arguments were built once per
    layer and what building them per call costs, and the profile names the library's call."""
    profile = tmp_path / "profile.txt"
    lines = _run(
        daemon, tmp_path, "--submit", "ordered", "--paths", "stream_ordered",
        "--profile-calls", str(profile),
    )  # fmt: skip
    (line,) = lines
    assert "error" not in line and line["check"] == "bitwise", line
    assert line["arguments"] == "prebuilt" and line["args_cpu_us_per_call"] > 0
    text = profile.read_text()
    assert "# decode_step ordered caller, batch" in text
    assert "ordered.py" in text and "(call)" in text, text[:2000]


def test_decode_step_device_signals_line_on_cpu(daemon, tmp_path):
    """--signals device on a CPU frontend is refused before any call, as a line that still has
    every field (the measured ones null) after the host-signal and blocking lines; exit 0."""
    lines = _run(daemon, tmp_path, "--paths", "stream_ordered", "--signals", "device", "host")
    assert [x["signals"] for x in lines] == ["host", "device"], "device words last"
    for line in lines:
        missing = [f for f in FIELDS if f not in line]
        assert not missing, f"{line['signals']}: missing {missing}"
    host, device = lines
    assert "error" not in host and host["step_us"] > 0 and host["done_words_ok"]
    assert "device signals need CUDA" in device["error"]
    assert device["step_us"] is None and device["caller_cpu_us_per_call"] is None
    assert device["added_us_per_layer"] is None


def test_decode_step_blocking_via_ring_on_cpu(daemon, tmp_path):
    """--blocking-via call ring: the blocking path as DsaAttention calls and as prepared calls
    through a submission ring waited for by their done words (SubmissionRing.call); both lines
    have every field, no error, and an out equal to a blocking call's bitwise."""
    lines = _run(
        daemon, tmp_path, "--paths", "blocking", "--blocking-via", "call", "ring",
        "--wait-spin", "0.0005",
    )  # fmt: skip
    assert [(x["path"], x["blocking_via"]) for x in lines] == [
        ("blocking", "call"),
        ("blocking", "ring"),
    ]
    for line in lines:
        missing = [f for f in FIELDS if f not in line]
        assert not missing, f"{line['blocking_via']}: missing {missing}"
        assert "error" not in line, line["error"]
        assert line["check"] == "bitwise", line
        assert line["step_us"] > 0 and line["caller_cpu_us_per_call"] > 0
    assert lines[1]["client_wall_us_per_call_p50"] > 0
    assert lines[1]["wait_spin_us"] == pytest.approx(500)
