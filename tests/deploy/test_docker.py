"""deploy/docker without a Docker engine: the build script is shellcheck-clean; its cpu variant
runs for real (the build folder's attnd and attnctl staged with their ldd closure, checked by
the script's own verify step and again here); the staged prefix then runs as the image's
runtime stage would, in a chroot holding nothing but the C runtime, with the Dockerfile's ENV,
USER, ENTRYPOINT + CMD (listen addresses moved to loopback) and HEALTHCHECK. The cuda and hip
variants are dry-run (and the cuda one configured for real where nvcc is installed). Both
Dockerfiles are checked for the structure the issue asks for."""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from deploy_util import DEPLOY, ROOT, attnd_bin, tool

DOCKER = os.path.join(DEPLOY, "docker")
BUILD_SH = os.path.join(DOCKER, "build.sh")
BUILD_DIR = os.environ.get("ATTND_BUILD_DIR") or os.path.join(ROOT, "build")
VARIANTS = {"cuda": "Dockerfile.cuda", "rocm": "Dockerfile.rocm"}
C_RUNTIME = [
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libresolv.so.2",
]


# ---- Dockerfile parsing ----


def parse_dockerfile(path):
    """[(stage name, [(INSTRUCTION, text)])] with continuation lines joined and ARG defaults
    from before the first FROM substituted into FROM lines."""
    with open(path) as f:
        lines = f.read().splitlines()
    joined, cur = [], ""
    for line in lines:
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        joined.append(cur + line)
        cur = ""
    args, stages = {}, []
    for text in joined:
        op, _, rest = text.strip().partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k] = v
            continue
        if op == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
            name = rest.split()[2] if " AS " in rest.upper() else str(len(stages))
            stages.append((name, [("FROM", image)]))
            continue
        stages[-1][1].append((op, rest))
    return stages


def instr(stage, op):
    return [t for o, t in stage[1] if o == op]


def exec_form(text):
    return json.loads(text) if text.startswith("[") else ["/bin/sh", "-c", text]


def env_of(stage):
    env = {}
    for text in instr(stage, "ENV"):
        for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', text):
            env[k] = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), v.strip('"'))
    return env


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def dockerfile(request):
    return request.param, parse_dockerfile(os.path.join(DOCKER, VARIANTS[request.param]))


# ---- the build script ----


def test_shellcheck():
    shellcheck = tool("SHELLCHECK", "shellcheck")
    here = os.path.dirname(os.path.abspath(__file__))
    gpu_host = os.path.join(ROOT, "tests", "gpu")  # the bundle's GPU-host scripts
    scripts = [
        os.path.join(d, f)
        for top in (DEPLOY, here, gpu_host)
        for d, _, fs in os.walk(top)
        for f in fs
        if f.endswith(".sh")
    ]
    scripts += [
        os.path.join(ROOT, "scripts", f) for f in ("test.sh", "hip-check.sh", "run-gpu-suite.sh")
    ]
    assert BUILD_SH in scripts and os.path.join(here, "promtool_check.sh") in scripts
    r = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = subprocess.run(
        [shellcheck, "-s", "bash", "-"],
        input='rm -rf $1/bin\n',
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0, "shellcheck accepted an unquoted rm -rf"


@pytest.fixture(scope="module")
def staged():
    """The cpu variant for real, into <tmp>/root/opt/attnd (root/ becomes the chroot)."""
    tmp = tempfile.mkdtemp(prefix="attnd-image-")
    prefix = os.path.join(tmp, "root", "opt", "attnd")
    # The build step runs when it has nothing to do (CI: setup.sh built everything first). In a
    # stale tree it is left out: relinking attnd here would pull it from under the other tests
    # that run it at the same time.
    plan = subprocess.run(
        ["ninja", "-C", BUILD_DIR, "-n", "attnd", "attnctl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    steps = "configure,build,stage,verify"
    if "no work to do" not in plan.stdout:
        print(f"{BUILD_DIR} is stale: build.sh runs without its build step")
        steps = "configure,stage,verify"
    r = subprocess.run(
        [BUILD_SH, "cpu", "--build-dir", BUILD_DIR, "--prefix", prefix, "--steps", steps],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0 and "verify: ok" in r.stdout, r.stdout + r.stderr
    yield tmp, prefix
    shutil.rmtree(tmp, ignore_errors=True)


def test_staged_file_list(staged):
    _, prefix = staged
    files = sorted(
        os.path.relpath(os.path.join(d, f), prefix) for d, _, fs in os.walk(prefix) for f in fs
    )
    assert {"bin/attnd", "bin/attnctl", "share/attnd/BUILD_INFO"} <= set(files)
    others = [f for f in files if f not in ("bin/attnd", "bin/attnctl", "share/attnd/BUILD_INFO")]
    assert others and all(re.fullmatch(r"lib/[^/]+\.so(\.[\w.]+)?", f) for f in others), others
    for c in C_RUNTIME + ["ld-linux-x86-64.so.2"]:
        assert f"lib/{c}" not in files, f"{c} belongs to the base image"
    with open(os.path.join(prefix, "share", "attnd", "BUILD_INFO")) as f:
        info = dict(line.strip().split("=", 1) for line in f if "=" in line)
    assert info["variant"] == "cpu" and info["gpu"] == "off" and info["version"]


def make_root(tmp):
    """A root filesystem with only the C runtime (what the runtime stage's base image adds
    besides the prefix), a shell for HEALTHCHECK's shell form, /tmp and /run/attnd."""
    root = os.path.join(tmp, "root")
    libdir = os.path.join(root, "lib", "x86_64-linux-gnu")
    os.makedirs(libdir, exist_ok=True)
    os.makedirs(os.path.join(root, "lib64"), exist_ok=True)
    os.makedirs(os.path.join(root, "bin"), exist_ok=True)
    shutil.copy("/lib64/ld-linux-x86-64.so.2", os.path.join(root, "lib64"))
    for lib in C_RUNTIME:
        shutil.copy(os.path.join("/lib/x86_64-linux-gnu", lib), libdir)
    shutil.copy(os.path.realpath("/bin/sh"), os.path.join(root, "bin", "sh"))
    for d, mode in (("tmp", 0o1777), ("run/attnd", 0o770)):
        os.makedirs(os.path.join(root, d), exist_ok=True)
        os.chmod(os.path.join(root, d), mode)
    os.chown(os.path.join(root, "run", "attnd"), 10001, 10001)
    return root


def test_runtime_stage_in_a_chroot(staged, dockerfile):
    """ENTRYPOINT + CMD of the runtime stage (TCP and metrics moved to loopback port 0) as its
    USER, with its ENV, in a root holding only the C runtime and the staged prefix; then its
    HEALTHCHECK command must pass, and SIGTERM must drain to exit 0."""
    if os.geteuid() != 0:
        pytest.skip("chroot needs root (CI runs as root)")
    tmp, _ = staged
    _, stages = dockerfile
    runtime = stages[-1]
    root = make_root(tmp)
    env = env_of(runtime)
    user = instr(runtime, "USER")[-1]
    cmd = exec_form(instr(runtime, "ENTRYPOINT")[-1]) + exec_form(instr(runtime, "CMD")[-1])
    cmd = [re.sub(r"^--listen=(unix:[^,]+).*", r"--listen=\1,127.0.0.1:0", a) for a in cmd]
    cmd = ["--metrics-listen=127.0.0.1:0" if a.startswith("--metrics-listen=") else a for a in cmd]
    cmd += ["--ready-file=/tmp/ready", "--cpu-threads=1"]
    chroot_bin = shutil.which("chroot") or "/usr/sbin/chroot"
    assert os.access(chroot_bin, os.X_OK), "chroot (coreutils) not found"
    chroot = [chroot_bin, f"--userspec={user}", root]
    clean_env = {k: v for k, v in env.items()}
    # The container's PATH finds the programs, as `attnd` in ENTRYPOINT and HEALTHCHECK.
    daemon = subprocess.Popen(
        chroot + cmd, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        ready = os.path.join(root, "tmp", "ready")
        deadline = time.monotonic() + 30
        while not os.path.exists(ready) and daemon.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(ready), daemon.communicate(timeout=30)[0].decode()
        socket = os.path.join(root, env["ATTND_HEALTH_TARGET"][len("unix:") :].lstrip("/"))
        st = os.stat(socket)
        assert st.st_uid == 10001 and (st.st_mode & 0o777) == 0o660
        health = instr(runtime, "HEALTHCHECK")[-1]
        health_cmd = exec_form(health[health.index("CMD ") + 4 :].strip())
        r = subprocess.run(
            chroot + health_cmd, env=clean_env, capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 0 and "SERVING" in r.stdout, r.stdout + r.stderr
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        out = daemon.communicate(timeout=60)[0].decode()
    assert daemon.returncode == 0, out
    assert "drained=true" in out


def test_dockerfile_structure(dockerfile):
    variant, stages = dockerfile
    assert [s[0] for s in stages] == ["build", "runtime"], "two stages: build, runtime"
    build, runtime = stages
    gpu = {"cuda": "cuda", "rocm": "hip"}[variant]
    runs = instr(build, "RUN")
    assert any(re.match(rf"deploy/docker/build\.sh {gpu} --steps deps$", r) for r in runs), runs
    (main,) = [r for r in runs if "--steps configure,build,stage,verify" in r]
    assert main.startswith(f"deploy/docker/build.sh {gpu} ") and "--prefix /opt/attnd" in main
    base_build, base_run = instr(build, "FROM")[0], instr(runtime, "FROM")[0]
    if variant == "cuda":
        m = re.fullmatch(r"nvidia/cuda:(\d+)\.[\d.]+-devel-(\w+\d+\.\d+)", base_build)
        assert m and int(m.group(1)) >= 13, base_build
        assert base_run == base_build.replace("-devel-", "-base-"), "runtime: the CUDA base flavour"
    else:
        m = re.fullmatch(r"rocm/dev-ubuntu-(\d+\.\d+):(\d+)\.[\d.]+", base_build)
        assert m and int(m.group(2)) >= 7 or (m and m.group(2) == "6"), base_build
        assert base_run == f"ubuntu:{m.group(1)}", "runtime: the build image's Ubuntu"
        assert "ARG HIP_ARCH=gfx950" in [f"ARG {t}" for t in instr(build, "ARG")]
    # The runtime stage takes only the staged prefix.
    copies = instr(runtime, "COPY")
    assert copies == ["--from=build /opt/attnd /opt/attnd"], copies
    env = env_of(runtime)
    assert env["LD_LIBRARY_PATH"] == "/opt/attnd/lib"
    assert env["PATH"].split(":")[0] == "/opt/attnd/bin"
    user = instr(runtime, "USER")[-1]
    uid = int(user.split(":")[0])
    assert uid != 0 and any(f"--uid {uid}" in r for r in instr(runtime, "RUN")), user
    assert any("attnd --version" in r for r in instr(runtime, "RUN")), "runtime stage load check"
    health = instr(runtime, "HEALTHCHECK")[-1]
    assert re.search(r"CMD attnctl .*--target=\"\$\{ATTND_HEALTH_TARGET\}\".* health$", health)
    assert exec_form(instr(runtime, "ENTRYPOINT")[-1]) == ["attnd"]
    flags = dict(a[2:].split("=", 1) for a in exec_form(instr(runtime, "CMD")[-1]))
    unix = [a for a in flags["listen"].split(",") if a.startswith("unix:")]
    assert unix == [env["ATTND_HEALTH_TARGET"]], "HEALTHCHECK must dial the daemon's socket"
    tcp_ports = {
        a.rsplit(":", 1)[1] for a in flags["listen"].split(",") if not a.startswith("unix")
    }
    tcp_ports.add(flags["metrics-listen"].rsplit(":", 1)[1])
    exposed = set(" ".join(instr(runtime, "EXPOSE")).split())
    assert exposed == tcp_ports, (exposed, tcp_ports)
    assert instr(runtime, "STOPSIGNAL") == ["SIGTERM"]
    if variant == "cuda":
        assert (
            env["NVIDIA_VISIBLE_DEVICES"] == "all"
            and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
        )
    help_text = subprocess.run(
        [attnd_bin(), "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    known = set(re.findall(r"^\s+--(\w+) \(", help_text, re.M))
    assert {f.replace("-", "_") for f in flags} <= known, flags


def test_dockerignore_keeps_builds_out():
    for name in VARIANTS.values():
        with open(os.path.join(DOCKER, name + ".dockerignore")) as f:
            patterns = {line.strip() for line in f if line.strip() and not line.startswith("#")}
        assert {".git", "build*", "bundle"} <= patterns, name


def test_gpu_variants_dry_run():
    for variant, gpu in (("cuda", "cuda"), ("hip", "hip")):
        r = subprocess.run(
            [BUILD_SH, variant, "--dry-run"], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"-DATTND_GPU={gpu}" in r.stdout and "--target attnd attnctl" in r.stdout
        assert "(dry run)" in r.stdout
    r = subprocess.run(
        [BUILD_SH, "cuda", "--steps", "nope"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, "an unknown step must be refused"


def test_cuda_variant_configures_where_nvcc_exists():
    """The CUDA variant's CMake configuration, for real, where the toolkit is installed (the
    build machines): configure only, then ninja's plan for attnd and attnctl."""
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )
    if nvcc is None:
        pytest.skip("no CUDA toolkit here: the cuda variant was dry-run only")
    tmp = tempfile.mkdtemp(prefix="attnd-cuda-configure-")
    try:
        r = subprocess.run(
            [BUILD_SH, "cuda", "--build-dir", os.path.join(tmp, "b"), "--steps", "configure"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        with open(os.path.join(tmp, "b", "CMakeCache.txt")) as f:
            cache = f.read()
        assert "ATTND_GPU:STRING=cuda" in cache and "ATTND_BUILD_TESTS:BOOL=OFF" in cache
        plan = subprocess.run(
            ["ninja", "-C", os.path.join(tmp, "b"), "-n", "attnd", "attnctl"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert plan.returncode == 0 and "server/attnd" in plan.stdout, plan.stdout + plan.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_hip_variant_configures_where_hipcc_exists():
    """The hip variant's CMake configuration, for real, where a HIP toolchain is installed
    (Debian's hipcc: scripts/hip-check.sh installs it): configure only, for gfx90a (Debian's
    clang 15 does not know the image's default gfx950), then ninja's plan for attnd and attnctl
    with the kernels compiled as HIP."""
    if shutil.which("hipcc") is None and not os.path.exists("/opt/rocm/llvm/bin/clang++"):
        pytest.skip("no HIP toolchain here: the hip variant was dry-run only")
    tmp = tempfile.mkdtemp(prefix="attnd-hip-configure-")
    try:
        r = subprocess.run(
            [
                BUILD_SH,
                "hip",
                "--build-dir",
                os.path.join(tmp, "b"),
                "--hip-arch",
                "gfx90a",
                "--steps",
                "configure",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        with open(os.path.join(tmp, "b", "CMakeCache.txt")) as f:
            cache = f.read()
        assert "ATTND_GPU:STRING=hip" in cache and "ATTND_HIP_ARCH:STRING=gfx90a" in cache
        plan = subprocess.run(
            ["ninja", "-C", os.path.join(tmp, "b"), "-t", "commands", "attnd"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert plan.returncode == 0 and "server/attnd" in plan.stdout, plan.stdout + plan.stderr
        hip = [c for c in plan.stdout.splitlines() if "topk/gpu/simt.cu" in c and " -c " in c]
        assert hip and "-x hip" in hip[0] and "--offload-arch=gfx90a" in hip[0], hip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
