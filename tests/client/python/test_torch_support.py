"""attnd_client.torch_support without a GPU: the device-region request built from a
storage._share_cuda_() tuple, tensor slices (offset, strides, refusals), the UUID spelling; and
the CPU-tensor path when torch is importable."""

import numpy as np
import pytest

from attnd_client import torch_support

HANDLE = bytes(range(64))


def test_region_args_from_share_tuple():
    # (device, handle, storage size bytes, storage offset bytes, ref counter handle, ref counter
    #  offset, event handle, event sync required): torch/multiprocessing/reductions.py
    share = (1, HANDLE, 1 << 20, 4096, b"ref", 0, b"ev", True)
    args = torch_support.region_args(share, "GPU-abc", "torch-1")
    assert args == {
        "name": "torch-1",
        "raw_handle": HANDLE,
        "device_uuid": "GPU-abc",
        "offset": 4096,
        "byte_size": 1 << 20,
    }
    with pytest.raises(ValueError, match="60 bytes"):
        torch_support.region_args((0, HANDLE[:60], 10, 0), "u", "n")


def test_versioned_torch_handles():
    # torch >= 2.5 (caching allocator): version 2, type 'c' (cudaMalloc block), then the handle.
    assert torch_support.cuda_ipc_handle(b"\x02c" + HANDLE) == HANDLE
    assert torch_support.region_args((0, b"\x02c" + HANDLE, 8, 0), "u", "n")["raw_handle"] == HANDLE
    with pytest.raises(ValueError, match="expandable"):
        torch_support.cuda_ipc_handle(b"\x02e" + HANDLE)
    with pytest.raises(ValueError, match="unrecognised"):
        torch_support.cuda_ipc_handle(b"\x07c" + HANDLE)


def test_tensor_slices():
    ref = torch_support.tensor_slice("r", "bf16", (4, 576), (576, 1), 100, 2)
    assert (ref.offset, ref.strides, ref.shape) == (200, None, (4, 576))
    ref = torch_support.tensor_slice("r", "bf16", (4, 576), (640, 1), 0, 2)
    assert ref.strides == (640, 1)
    ref = torch_support.tensor_slice("r", "f32", (1, 8), (99, 1), 3, 4)  # size-1 dims: dense
    assert ref.strides is None and ref.offset == 12
    ref = torch_support.tensor_slice("r", "f32", (4, 8), (1, 4), 0, 4)  # a transposed view
    assert ref.strides == (1, 4)
    with pytest.raises(ValueError, match="negative"):
        torch_support.tensor_slice("r", "f32", (4, 8), (-8, 1), 0, 4)


def test_uuid_spelling():
    assert torch_support.pick_uuid("1234-ab", []) == "GPU-1234-ab"
    assert torch_support.pick_uuid("1234-ab", ["1234-ab"]) == "1234-ab"
    assert torch_support.pick_uuid("GPU-1234-ab", ["x", "GPU-1234-ab"]) == "GPU-1234-ab"


def test_cpu_tensors():
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 4).to(torch.bfloat16)
    arr, name = torch_support.cpu_numpy(t)
    assert name == "bf16" and arr.dtype == np.uint16
    assert (arr == t.view(torch.int16).numpy().view(np.uint16)).all()
    arr[0, 0] = 0x3F80
    assert t[0, 0].item() == 1.0  # a view, not a copy
