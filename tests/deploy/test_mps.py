"""CUDA MPS in deploy/ and the GPU suite (docs/OPERATIONS.md "MPS"), without a GPU: the image's
entrypoint deploy/docker/attnd-mps.sh and scripts/run-gpu-suite.sh ATTND_MPS=1 run against a
fake nvidia-cuda-mps-control (a shell script keeping the control daemon's state in its pipe
directory) and a fake attnd; overlays/nvidia-mps renders with the MPS wiring; build.sh stages
the script into the cuda image only; the Docker line of docs/OPERATIONS.md "MPS" holds. Also the
suite's ATTND_SUITE_TESTS (a subset of the bundle's test binaries, each one's seconds recorded)."""

import os
import re
import shlex
import signal
import subprocess
import tempfile
import time

import pytest
import yaml

from deploy_util import DEPLOY, ROOT, attnd_bin, tool

ATTND_MPS = os.path.join(DEPLOY, "docker", "attnd-mps.sh")
SUITE = os.path.join(ROOT, "scripts", "run-gpu-suite.sh")

# Up (-d) touches $CUDA_MPS_PIPE_DIRECTORY/control; a command on stdin fails without it; quit
# removes it. Every call is logged to $FAKE_LOG.
FAKE_CONTROL = """#!/bin/sh
m="$CUDA_MPS_PIPE_DIRECTORY/control"
if [ "${1:-}" = -d ]; then
  [ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -d "$CUDA_MPS_LOG_DIRECTORY" ] || exit 1
  touch "$m"; echo "control -d" >> "$FAKE_LOG"; exit 0
fi
read -r cmd
[ -e "$m" ] || exit 1
[ "$cmd" = quit ] && rm -f "$m" && echo "control quit" >> "$FAKE_LOG"
exit 0
"""
# Logs its arguments and MPS pipe directory; on SIGTERM "drains" for 0.3 s and exits 0; else
# exits $FAKE_ATTND_EXIT after $FAKE_ATTND_SECONDS.
FAKE_ATTND = """#!/bin/sh
echo "attnd $* pipe=${CUDA_MPS_PIPE_DIRECTORY:-none}" >> "$FAKE_LOG"
trap 'sleep 0.3; echo "attnd drained" >> "$FAKE_LOG"; exit 0' TERM
i=0
while [ "$i" -lt "$((FAKE_ATTND_SECONDS * 10))" ]; do sleep 0.1; i=$((i + 1)); done
exit "$FAKE_ATTND_EXIT"
"""


@pytest.fixture
def fake(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-cuda-mps-control", FAKE_CONTROL), ("attnd", FAKE_ATTND)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "events"
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        FAKE_LOG=str(log),
        FAKE_ATTND_SECONDS="30",
        FAKE_ATTND_EXIT="0",
        CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "mps" / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "mps" / "log"),
    )
    env.pop("ATTND_MPS", None)
    env.pop("ATTND_EXPECT_MPS", None)

    def events():
        return log.read_text().splitlines() if log.exists() else []

    return env, events, tmp_path


def wait_for(predicate, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_shellcheck():
    shellcheck = tool("SHELLCHECK", "shellcheck")
    r = subprocess.run([shellcheck, "-x", ATTND_MPS, SUITE], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_entrypoint_starts_mps_passes_sigterm_and_quits(fake):
    env, events, _ = fake
    p = subprocess.Popen(
        [ATTND_MPS, "--listen=unix:/x.sock"], env=env, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: any(e.startswith("attnd ") for e in events()), "attnd to start")
    assert os.path.exists(os.path.join(env["CUDA_MPS_PIPE_DIRECTORY"], "control"))
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0, p.stderr.read()
    assert events() == [
        "control -d",
        f"attnd --listen=unix:/x.sock pipe={env['CUDA_MPS_PIPE_DIRECTORY']}",
        "attnd drained",
        "control quit",
    ]
    assert "started an MPS control daemon" in p.stderr.read()


def test_entrypoint_joins_a_running_daemon_and_leaves_it(fake):
    env, events, _ = fake
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
    control = os.path.join(env["CUDA_MPS_PIPE_DIRECTORY"], "control")
    open(control, "w").close()
    env.update(FAKE_ATTND_SECONDS="0", FAKE_ATTND_EXIT="3")
    r = subprocess.run([ATTND_MPS, "--x"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 3, "attnd's exit status is the entrypoint's"
    assert events() == [f"attnd --x pipe={env['CUDA_MPS_PIPE_DIRECTORY']}"]
    assert os.path.exists(control), "a control daemon it did not start stays up"
    assert "joining" in r.stderr


def test_entrypoint_without_mps_only_runs_attnd(fake):
    env, events, _ = fake
    env.update(ATTND_MPS="0", FAKE_ATTND_SECONDS="0", FAKE_ATTND_EXIT="0")
    r = subprocess.run([ATTND_MPS, "--y"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and events() == [f"attnd --y pipe={env['CUDA_MPS_PIPE_DIRECTORY']}"]
    env["ATTND_MPS"] = "yes"
    r = subprocess.run([ATTND_MPS], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "want 1 or 0" in r.stderr


def test_gpu_suite_runs_under_its_own_mps_daemon(fake):
    env, events, tmp = fake
    # A bundle with one "test" that records what it was given.
    bundle = tmp / "bundle"
    (bundle / "bin").mkdir(parents=True)
    os.symlink(SUITE, bundle / "run-gpu-suite.sh")
    probe = bundle / "bin" / "probe_test"
    probe.write_text(
        '#!/bin/sh\necho "test pipe=$CUDA_MPS_PIPE_DIRECTORY expect=$ATTND_EXPECT_MPS" '
        '>> "$FAKE_LOG"\n[ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]\n'
    )
    probe.chmod(0o755)
    del env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"]
    env["ATTND_MPS"] = "1"
    env["TMPDIR"] = str(tmp)
    out = tmp / "out"
    r = subprocess.run(
        ["bash", str(bundle / "run-gpu-suite.sh"), str(out), "tests"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    got = events()
    assert got[0] == "control -d" and got[-1] == "control quit", got
    (line,) = [e for e in got if e.startswith("test ")]
    assert line.startswith(f"test pipe={tmp}/attnd-mps.") and line.endswith("expect=1"), line
    assert not [p for p in os.listdir(tmp) if p.startswith("attnd-mps.")], "temp dir removed"
    assert (out / "mps-state.txt").exists()


def test_gpu_suite_quits_mps_when_a_test_fails(fake):
    env, events, tmp = fake
    bundle = tmp / "bundle"
    (bundle / "bin").mkdir(parents=True)
    os.symlink(SUITE, bundle / "run-gpu-suite.sh")
    (bundle / "bin" / "bad_test").write_text("#!/bin/sh\nexit 1\n")
    (bundle / "bin" / "bad_test").chmod(0o755)
    env.update(ATTND_MPS="1", TMPDIR=str(tmp))
    r = subprocess.run(
        ["bash", str(bundle / "run-gpu-suite.sh"), str(tmp / "out"), "tests"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert events()[-1] == "control quit"


def test_gpu_suite_runs_only_the_named_test_binaries(fake):
    env, events, tmp = fake
    bundle = tmp / "bundle"
    (bundle / "bin").mkdir(parents=True)
    os.symlink(SUITE, bundle / "run-gpu-suite.sh")
    for name in ("a_test", "b_test", "c_test"):
        (bundle / "bin" / name).write_text(f'#!/bin/sh\necho "ran {name}" >> "$FAKE_LOG"\n')
        (bundle / "bin" / name).chmod(0o755)

    def run(names, out):
        env["ATTND_SUITE_TESTS"] = names
        return subprocess.run(
            ["bash", str(bundle / "run-gpu-suite.sh"), str(out), "tests"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    r = run("c_test a_test", tmp / "out1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [e for e in events() if e.startswith("ran ")] == ["ran c_test", "ran a_test"]
    times = (tmp / "out1" / "tests-times.txt").read_text().splitlines()
    assert [t.split()[0] for t in times] == ["c_test", "a_test"], times
    assert all(re.fullmatch(r"\S+ \d+ s", t) for t in times), times

    r = run("b_test missing_test", tmp / "out2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED: missing_test is not in the bundle's bin/" in r.stdout
    assert events()[-1] == "ran b_test"


def render(overlay):
    r = subprocess.run(
        [tool("KUBECTL", "kubectl"), "kustomize", os.path.join(DEPLOY, "k8s", "overlays", overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_nvidia_mps_overlay():
    (ds,) = [o for o in render("nvidia-mps") if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostIPC"] is True and spec["hostPID"] is True
    (c,) = [c for c in spec["containers"] if c["name"] == "attnd"]
    assert c["command"] == ["attnd-mps"] and c["image"] == "attnd:cuda"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["ATTND_MPS"] == "1" and env["NVIDIA_VISIBLE_DEVICES"] == "all"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for var in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        (vol,) = [n for n, p in mounts.items() if env[var].startswith(p + "/")]
        assert volumes[vol]["hostPath"]["path"] == mounts[vol], var
    (init,) = spec["initContainers"]
    init_mounts = {m["mountPath"] for m in init["volumeMounts"]}
    script = " ".join(init["command"])
    for path in ("/run/attnd", mounts["nvidia-mps"]):
        assert path in init_mounts and path in script
    assert "chown 10001:10001" in script
    # The plain overlay stays without MPS.
    (plain,) = [o for o in render("nvidia") if o["kind"] == "DaemonSet"]
    (pc,) = plain["spec"]["template"]["spec"]["containers"]
    assert "command" not in pc


def test_build_stages_the_entrypoint_for_cuda_only():
    build = os.path.join(DEPLOY, "docker", "build.sh")
    for variant, staged in (("cuda", True), ("hip", False)):
        r = subprocess.run(
            [build, variant, "--dry-run", "--prefix", tempfile.gettempdir() + "/p"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert ("attnd-mps.sh" in r.stdout and "bin/attnd-mps" in r.stdout) == staged, r.stdout


def test_operations_doc_mps_run_line():
    """The Docker line of docs/OPERATIONS.md "MPS": the entrypoint, the MPS directory and the
    namespaces MPS and IPC need, and only flags attnd knows."""
    with open(os.path.join(ROOT, "docs", "OPERATIONS.md")) as f:
        doc = f.read()
    section = doc.split("\n### MPS\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    runs = [
        shlex.split(line)
        for b in blocks
        for line in b.replace("\\\n", " ").splitlines()
        if line.strip().startswith("docker run")
    ]
    assert len(runs) == 1, runs
    (argv,) = runs
    i = argv.index("attnd:cuda")
    docker, flags = argv[:i], argv[i + 1 :]
    assert docker[docker.index("--entrypoint") + 1] == "attnd-mps"
    assert "--pid=host" in docker and "--ipc=host" in docker and "--gpus" in docker
    assert "/run/nvidia-mps:/run/nvidia-mps" in docker and "/run/attnd:/run/attnd" in docker
    help_text = subprocess.run(
        [attnd_bin(), "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    known = set(re.findall(r"^\s+--(\w+) \(", help_text, re.M))
    names = {f[2:].split("=", 1)[0].replace("-", "_") for f in flags}
    assert names <= known and {"listen", "allow_client_shm"} <= names, names
    for word in ("280 µs", "0.1–6 µs", "attnd_gpu_mps", "nvidia-cuda-mps-server", "mps"):
        assert word in section, word
