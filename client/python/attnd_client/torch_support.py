"""torch tensors as attnd tensors (imported only when torch is). CPU tensors become their NumPy
views (bf16 -> uint16 bits, float8_e4m3fn -> uint8 bits); CUDA tensors become slices of device
regions: the tensor's storage is exported with its CUDA IPC handle (storage._share_cuda_()),
registered once per storage with RegisterDeviceRegion, and addressed at the tensor's offset
(checked on an H200 with torch 2.11: tests/client/python/test_torch_cuda.py).

    ref = DeviceRegionCache(client).ref(tensor)   # RegionRef into the storage's region

The handle names the base of the caching allocator's block; _share_cuda_() also gives the
storage's offset in that block (the region's offset) and its size (the region's byte_size).
The client synchronises the tensor's device before each blocking call. A stream-ordered call
with a `ready` signal is built inside `ordered_by_ready()` and does not: the caller's stream
writes `ready` after the kernels that produce the inputs (cuda_signals.py), which orders them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import dtypes

if TYPE_CHECKING:
    import torch

    from .tensors import RegionRef

_counter = itertools.count()
_ordering = threading.local()


@contextlib.contextmanager
def ordered_by_ready() -> Iterator[None]:
    """Within it, this thread's tensor references skip the device synchronise: the call being
    built names a `ready` signal that orders its inputs."""
    was = getattr(_ordering, "by_ready", False)
    _ordering.by_ready = True
    try:
        yield
    finally:
        _ordering.by_ready = was


def attnd_dtype(torch_dtype: torch.dtype) -> str:
    """The attnd dtype name of a torch dtype (ValueError when it has none)."""
    import torch

    table = {
        torch.float32: dtypes.F32,
        torch.bfloat16: dtypes.BF16,
        torch.int32: dtypes.I32,
        torch.uint8: dtypes.U8,
    }
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is not None:
        table[fp8] = dtypes.FP8_E4M3
    try:
        return table[torch_dtype]
    except KeyError:
        raise ValueError(f"torch dtype {torch_dtype} has no attnd dtype") from None


def cpu_numpy(tensor: torch.Tensor) -> tuple[np.ndarray, str]:
    """(NumPy view sharing the tensor's memory, attnd dtype) of a CPU tensor."""
    import torch

    name = attnd_dtype(tensor.dtype)
    if name == dtypes.BF16:
        return tensor.detach().view(torch.int16).numpy().view(np.uint16), name
    if name == dtypes.FP8_E4M3:
        return tensor.detach().view(torch.uint8).numpy(), name
    return tensor.detach().numpy(), name


def share_info(share: Sequence[Any]) -> tuple[int, bytes, int, int]:
    """The fields of storage._share_cuda_()'s tuple that a device region needs:
    (device index, handle bytes, storage size bytes, storage offset bytes in the block)."""
    device, handle, size_bytes, offset_bytes = share[0], share[1], share[2], share[3]
    return int(device), bytes(handle), int(size_bytes), int(offset_bytes)


def pick_uuid(raw_uuid: object, daemon_uuids: Iterable[str]) -> str:
    """The daemon's spelling of a device UUID ("GPU-<uuid>" as nvidia-smi writes it, or bare)."""
    bare = str(raw_uuid)
    if bare.startswith("GPU-"):
        bare = bare[4:]
    for u in daemon_uuids:
        if u in (bare, "GPU-" + bare):
            return u
    return "GPU-" + bare


CUDA_IPC_HANDLE_BYTES = 64


def cuda_ipc_handle(shared: bytes) -> bytes:
    """The cudaIpcMemHandle_t bytes in torch's shareable handle: the bare 64 bytes (older torch)
    or, since torch's caching allocator versions them, a version byte (2), a type byte ('c': a
    cudaMalloc block) and the 64 bytes. Expandable segments ('e') export no cudaIpc handle."""
    if len(shared) == CUDA_IPC_HANDLE_BYTES:
        return shared
    if len(shared) == CUDA_IPC_HANDLE_BYTES + 2 and shared[0] == 2:
        if shared[1:2] == b"c":
            return shared[2:]
        if shared[1:2] == b"e":
            raise ValueError(
                "the tensor lives in an expandable segment, which has no CUDA IPC "
                "handle; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
            )
    raise ValueError(
        f"unrecognised torch CUDA IPC handle ({len(shared)} bytes, starting {shared[:2].hex()})"
    )


def region_args(share: Sequence[Any], uuid: str, name: str) -> dict[str, Any]:
    """RegisterDeviceRegion arguments of a storage from its _share_cuda_() tuple: the region is
    the storage's bytes [offset_bytes, offset_bytes + size_bytes) of the handle's block."""
    _, handle, size_bytes, offset_bytes = share_info(share)
    return {
        "name": name,
        "raw_handle": cuda_ipc_handle(handle),
        "device_uuid": uuid,
        "offset": offset_bytes,
        "byte_size": size_bytes,
    }


def tensor_slice(
    region: str,
    dtype: str,
    shape: Iterable[int],
    strides: Iterable[int],
    storage_offset: int,
    element_size: int,
) -> RegionRef:
    """The RegionRef of a tensor (shape, element strides, storage_offset in elements) in the
    region of its storage: offset storage_offset * element_size bytes; strides omitted when
    dense. ValueError for a layout attnd cannot address (negative strides)."""
    from .tensors import RegionRef

    dims, steps = tuple(int(d) for d in shape), tuple(int(s) for s in strides)
    dense, expect = True, 1
    for size, stride in zip(reversed(dims), reversed(steps), strict=True):
        if size > 1 and stride != expect:
            dense = False
        expect *= size
        if size > 1 and stride < 0:
            raise ValueError(f"tensor stride {stride} is negative")
    # A non-contiguous last dimension is described; the daemon says whether the op takes it
    # (lse does: docs/CONTRACTS.md "Strided lse").
    return RegionRef(region, dtype, dims, storage_offset * element_size, None if dense else steps)


class DeviceRegistrar(Protocol):
    """What registers device regions for a DeviceRegionCache (a Client or a Session)."""

    def device_uuids(self) -> list[str]: ...

    def register_device_region(
        self, *, name: str, raw_handle: bytes, device_uuid: str, byte_size: int, offset: int
    ) -> None: ...


class DeviceRegionCache:
    """Registers each CUDA storage once (through `registrar`, a Client or Session) and keeps the
    storage alive while registered. Thread-safe."""

    def __init__(self, registrar: DeviceRegistrar) -> None:
        self._registrar = registrar
        self._lock = threading.Lock()
        # (device, handle, offset) -> (region name, storage)
        self._by_key: dict[tuple[int, bytes, int], tuple[str, Any]] = {}

    def ref(self, tensor: torch.Tensor) -> RegionRef:
        """The RegionRef of a CUDA tensor (its storage registered on first use); synchronises
        the tensor's device unless inside `ordered_by_ready()`."""
        import torch

        name_dtype = attnd_dtype(tensor.dtype)
        storage = tensor.untyped_storage()
        share = storage._share_cuda_()
        device, handle, _, offset_bytes = share_info(share)
        key = (device, handle, offset_bytes)
        with self._lock:
            entry = self._by_key.get(key)
            if entry is None:
                props = torch.cuda.get_device_properties(device)
                uuid = pick_uuid(getattr(props, "uuid", ""), self._registrar.device_uuids())
                name = f"torch-{os.getpid()}-{next(_counter)}"
                self._registrar.register_device_region(**region_args(share, uuid, name))
                entry = (name, storage)
                self._by_key[key] = entry
        if not getattr(_ordering, "by_ready", False):
            torch.cuda.synchronize(device)
        return tensor_slice(
            entry[0],
            name_dtype,
            tensor.shape,
            tensor.stride(),
            tensor.storage_offset(),
            tensor.element_size(),
        )

    def names(self) -> list[str]:
        """The names of the regions registered so far."""
        with self._lock:
            return [name for name, _ in self._by_key.values()]

    def clear(self) -> None:
        """Forgets every registration (and releases the storages)."""
        with self._lock:
            self._by_key.clear()
