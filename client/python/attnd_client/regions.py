"""Host regions: POSIX shared-memory objects the client creates, the daemon maps once at
registration, and NumPy views into them that op calls pass zero-copy.

Who unlinks what: the client creates the shm object (/dev/shm/<key>) and is the only one that
ever unlinks it; the daemon never creates or unlinks shm objects, it only maps them (and unmaps
when the region is unregistered or its lease ends). By default the client unlinks the name right
after a successful registration (unlink_early): both processes keep their mappings, nothing is
left in /dev/shm even if the client is killed, and the memory is freed once both have unmapped.
Pass unlink_early=False to keep the name (e.g. to register it again); close() unlinks it then.

    with client.create_host_region("kv", 64 << 20) as region:
        kv = region.array("bf16", (4096, 576))     # uint16 view, zero-copy
        kv[...] = to_bf16(values)
        out = region.array("bf16", (T, H, 512))
        client.sparse_mla(q=q, kv=kv, indices=idx, sm_scale=s, out=out)  # written into `out`
"""

import itertools
import mmap
import os
import secrets
from collections.abc import Iterable, Sequence
from typing import Protocol, Self

import numpy as np
import numpy.typing as npt

from . import dtypes
from .tensors import RegionRef, array_address

SHM_DIR = "/dev/shm"
_counter = itertools.count()


def new_key(prefix: str = "attnd-py") -> str:
    """A fresh POSIX shm key: "/<prefix>-<pid>-<n>-<random>"."""
    return f"/{prefix}-{os.getpid()}-{next(_counter)}-{secrets.token_hex(4)}"


def shm_path(key: str) -> str:
    """The /dev/shm path of a POSIX shm key ("/name")."""
    if not key.startswith("/") or "/" in key[1:] or len(key) < 2:
        raise ValueError(f"shm key {key!r}: want '/' then a name without slashes")
    return os.path.join(SHM_DIR, key[1:])


class ShmObject:
    """A POSIX shm object of `byte_size` bytes created by this process (shm_open(O_CREAT|O_EXCL)
    + ftruncate, through /dev/shm as glibc does) and mapped read-write."""

    def __init__(self, byte_size: int, key: str | None = None, mode: int = 0o600) -> None:
        if byte_size <= 0:
            raise ValueError(f"byte_size is {byte_size}, want > 0")
        self.key = key or new_key()
        self.byte_size = int(byte_size)
        self._path = shm_path(self.key)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            os.ftruncate(fd, self.byte_size)
            mapping = mmap.mmap(
                fd, self.byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
        except BaseException:
            os.close(fd)
            os.unlink(self._path)
            raise
        os.close(fd)
        self.linked = True
        self._mmap: mmap.mmap | None = mapping
        buffer = np.frombuffer(mapping, dtype=np.uint8)
        self.buffer: npt.NDArray[np.uint8] | None = buffer  # the whole object; None once closed
        self.address = array_address(buffer)

    def unlink(self) -> None:
        """Removes the name from /dev/shm (idempotent); mappings stay valid."""
        if self.linked:
            self.linked = False
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Unlinks the name and unmaps (the mapping stays until the last NumPy view is gone)."""
        self.unlink()
        if self._mmap is None:
            return
        self.buffer = None
        try:
            self._mmap.close()
        except BufferError:
            pass  # views still exported: unmapped when they are garbage-collected
        self._mmap = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RegionOwner(Protocol):
    """What a HostRegion is registered through (a Client or a Session)."""

    def _release_region(self, region: "HostRegion") -> None: ...


class HostRegion:
    """A registered host region over an ShmObject (bytes [offset, offset + byte_size)).

    `owner` is the Client or Session it was registered through; close() unregisters it there
    (unless the session already ended, which removed it), then closes the shm object."""

    def __init__(
        self,
        owner: RegionOwner | None,
        name: str,
        shm: ShmObject,
        offset: int = 0,
        byte_size: int | None = None,
        lease_id: str = "",
    ) -> None:
        self.owner = owner
        self.name = name
        self.shm = shm
        self.key = shm.key
        self.offset = int(offset)
        self.byte_size = int(byte_size if byte_size is not None else shm.byte_size - offset)
        self.lease_id = lease_id
        self.address = shm.address + self.offset
        self.registered = True
        self._next = 0

    def contains(self, address: int, nbytes: int) -> bool:
        """Whether [address, address + nbytes) lies inside this (registered) region."""
        return (
            self.registered
            and self.address <= address
            and address + nbytes <= self.address + self.byte_size
        )

    def array(
        self, dtype: str, shape: int | Sequence[int], offset: int | None = None, align: int = 64
    ) -> np.ndarray:
        """A writable NumPy view of `shape` elements of attnd dtype `dtype` (raw storage:
        bf16 -> uint16, fp8 -> uint8) at `offset` bytes into the region, or, when offset is
        None, at the next free `align`-aligned offset."""
        dt = dtypes.storage_dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if offset is None:
            offset = -(-self._next // align) * align
        if offset < 0 or offset + count * dt.itemsize > self.byte_size:
            raise ValueError(
                f"region {self.name!r}: {count * dt.itemsize} bytes at offset "
                f"{offset} do not fit in {self.byte_size}"
            )
        buffer = self.shm.buffer
        if buffer is None:
            raise ValueError(f"region {self.name!r}: its shm object is closed")
        self._next = max(self._next, offset + count * dt.itemsize)
        start = self.offset + offset
        return buffer[start : start + count * dt.itemsize].view(dt).reshape(shape)

    def put(self, array: npt.ArrayLike, dtype: str, align: int = 64) -> np.ndarray:
        """Copies `array` (encoded to `dtype`) into a fresh view and returns the view."""
        raw = dtypes.encode(array, dtype)
        view = self.array(dtype, raw.shape, align=align)
        view[...] = raw
        return view

    def ref(
        self, dtype: str, shape: Iterable[int], offset: int, strides: Iterable[int] | None = None
    ) -> RegionRef:
        """An explicit RegionRef into this region."""
        return RegionRef(self.name, dtype, shape, offset, strides)

    def reset(self) -> None:
        """Forgets the bump allocations of array() (views stay valid)."""
        self._next = 0

    def close(self, unregister: bool = True) -> None:
        """Unregisters the region (when `unregister` and still registered) and closes its shm."""
        if self.registered and unregister and self.owner is not None:
            self.owner._release_region(self)
        self.registered = False
        self.shm.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
