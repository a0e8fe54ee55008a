"""attnd_client.torch_support on a real GPU (skipped without torch + CUDA): CUDA tensors become
device-region slices whose IPC handle, region offset and slice offset address exactly the
tensor's bytes, checked by opening the handle in another process (cudaIpcOpenMemHandle through
ctypes, as the daemon will) and reading them back. No daemon: registration goes to a recorder.
    python3 -m pytest tests/client/python/test_torch_cuda.py   # on the GPU machine
"""

import glob
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from attnd_client import torch_support  # noqa: E402

READER = r"""
import ctypes, sys
lib, handle_hex, offset, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cudart = ctypes.CDLL(lib)
class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]
h = Handle()
ctypes.memmove(ctypes.byref(h), bytes.fromhex(handle_hex), 64)
ptr = ctypes.c_void_p()
rc = cudart.cudaIpcOpenMemHandle(ctypes.byref(ptr), h, ctypes.c_uint(1))
assert rc == 0, f"cudaIpcOpenMemHandle: {rc}"
buf = ctypes.create_string_buffer(nbytes)
rc = cudart.cudaMemcpy(buf, ctypes.c_void_p(ptr.value + offset), ctypes.c_size_t(nbytes), 2)
assert rc == 0, f"cudaMemcpy: {rc}"
sys.stdout.write(buf.raw.hex())
cudart.cudaIpcCloseMemHandle(ptr)
"""


def cudart_path():
    names = []
    for root in sys.path + [os.path.dirname(torch.__file__)]:
        names += glob.glob(os.path.join(root, "nvidia", "**", "libcudart.so*"), recursive=True)
        names += glob.glob(os.path.join(root, "lib", "libcudart.so*"))
    names += glob.glob("/usr/local/cuda/lib64/libcudart.so*")
    if not names:
        pytest.skip("libcudart not found for the reader process")
    return sorted(names)[0]


class Recorder:
    def __init__(self):
        self.registered = []
        self.unregistered = []

    def register_device_region(self, **kwargs):
        self.registered.append(kwargs)

    def unregister_region(self, name):
        self.unregistered.append(name)
        return [name]

    def device_uuids(self):
        return []


def read_back(region, ref, nbytes):
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            READER,
            cudart_path(),
            region["raw_handle"].hex(),
            str(region["offset"] + ref.offset),
            str(nbytes),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return bytes.fromhex(out.stdout)


def test_cuda_tensor_slices_address_the_tensor():
    rec = Recorder()
    cache = torch_support.DeviceRegionCache(rec)
    base = torch.randn(64, 40, device="cuda").to(torch.bfloat16)
    view = base[5:9]  # storage offset 5 rows
    ref = cache.ref(view)
    assert len(rec.registered) == 1
    region = rec.registered[0]
    assert len(region["raw_handle"]) == 64
    assert region["byte_size"] >= base.numel() * 2
    assert ref.dtype == "bf16" and ref.shape == (4, 40) and ref.strides is None
    assert ref.offset == 5 * 40 * 2
    got = read_back(region, ref, view.numel() * 2)
    want = view.cpu().view(torch.int16).numpy().tobytes()
    assert got == want
    strided = base[:, :16]
    sref = cache.ref(strided)
    assert len(rec.registered) == 1, "one storage, one region"
    assert sref.strides == (40, 1) and sref.offset == 0
    row1 = read_back(region, torch_support.tensor_slice("x", "bf16", (16,), (1,), 40, 2), 32)
    assert row1 == strided[1].cpu().view(torch.int16).numpy().tobytes()


def test_dead_storages_give_back_their_memory_and_regions():
    # A storage shared once per cache, its IPC reference counter released: when it dies its
    # memory goes back to the caching allocator (not into torch's IPC limbo) and its region is
    # unregistered on the next call (or its registration re-used by the next storage in its block).
    rec = Recorder()
    cache = torch_support.DeviceRegionCache(rec)
    keep = torch.zeros(1024, device="cuda")
    cache.ref(keep)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for step in range(200):
        t = torch.full((1 << 18,), step, dtype=torch.int32, device="cuda")  # 1 MiB
        cache.ref(t)
        cache.ref(t[7:])
        del t
    cache.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before, "memory of dead storages held"
    assert len(cache) == 1 and cache.names() == [rec.registered[0]["name"]]
    live = len(rec.registered) - len(rec.unregistered)
    assert live == 1, (len(rec.registered), len(rec.unregistered))
    print(f"{len(rec.registered)} registrations for 200 fresh storages (blocks re-used)")
    cache.clear()
    assert len(rec.unregistered) == len(rec.registered)


def test_uuid_matches_nvidia_smi():
    props = torch.cuda.get_device_properties(0)
    uuid = torch_support.pick_uuid(getattr(props, "uuid", ""), [])
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if smi.returncode != 0:
        pytest.skip("nvidia-smi unavailable")
    assert uuid == smi.stdout.strip()


def test_cpu_and_fp8_tensors():
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        pytest.skip("torch without float8_e4m3fn")
    t = torch.tensor([1.0, -2.0, 448.0]).to(fp8)
    arr, name = torch_support.cpu_numpy(t)
    assert name == "fp8_e4m3" and arr.dtype == np.uint8
    assert arr.tolist() == [0x38, 0xC0, 0x7E]
