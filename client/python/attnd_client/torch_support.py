"""torch tensors as attnd tensors (imported only when torch is). CPU tensors become their NumPy
views (bf16 -> uint16 bits, float8_e4m3fn -> uint8 bits); CUDA tensors become slices of device
regions: the tensor's storage is exported with its CUDA IPC handle (storage._share_cuda_()),
registered once per storage with RegisterDeviceRegion, and addressed at the tensor's offset
(checked on an H200 with torch 2.11: tests/client/python/test_torch_cuda.py).

    ref = DeviceRegionCache(client).ref(tensor)   # RegionRef into the storage's region
    words = torch.zeros(8, dtype=torch.int64, device="cuda")  # u64 signal words, any dtype
    ready = client.device_regions().signal(words[0], n)      # Signal for ready= / done=

A registration lives as long as its storage: DeviceRegionCache holds storages weakly and
unregisters the region of a dead one on its next call (never from the garbage collector); a new
storage at the same place of the same allocation, of the same size, re-uses the registration;
keep_alive=True pins storages instead; at most max_regions live ones (DeviceRegionCache's
docstring says why each). Sharing once per storage, the cache releases the IPC reference counter
torch hands out (share_storage), so a dead storage's memory goes back to the caching allocator.

The handle names the base of the caching allocator's block; _share_cuda_() also gives the
storage's offset in that block (the region's offset) and its size (the region's byte_size).
The client synchronises the tensor's device before each blocking call. A stream-ordered call
with a `ready` signal is built inside `ordered_by_ready()` and does not: the caller's stream
writes `ready` after the kernels that produce the inputs (cuda_signals.py), which orders them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import itertools
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import dtypes

if TYPE_CHECKING:
    import torch

    from .stream_ordered import Signal
    from .tensors import RegionRef

_counter = itertools.count()
_ordering = threading.local()


class ordered_by_ready:  # noqa: N801 (used as a function: `with ordered_by_ready():`)
    """Within it, this thread's tensor references skip the device synchronise: the call being
    built names a `ready` signal that orders its inputs. A class rather than a generator
    context manager: it is entered on every stream-ordered call (a third of the cost)."""

    __slots__ = ("_was",)

    def __enter__(self) -> None:
        self._was = getattr(_ordering, "by_ready", False)
        _ordering.by_ready = True

    def __exit__(self, *exc: object) -> None:
        _ordering.by_ready = self._was


@contextlib.contextmanager
def one_synchronize_per_device() -> Iterator[None]:
    """Within it, this thread's tensor references synchronise each device once, at the first
    reference to a tensor of it: the references of one blocking call's request are taken one
    after another with no GPU work enqueued between them, so the first synchronise covers the
    rest (each costs a device-wide wait on the caller's thread)."""
    was = getattr(_ordering, "synced", None)
    _ordering.synced = set()
    try:
        yield
    finally:
        _ordering.synced = was


@functools.cache
def _dtype_table() -> dict[Any, str]:
    """torch dtype -> attnd dtype name, built once (attnd_dtype runs per tensor per call)."""
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
    return table


def attnd_dtype(torch_dtype: torch.dtype) -> str:
    """The attnd dtype name of a torch dtype (ValueError when it has none)."""
    try:
        return _dtype_table()[torch_dtype]
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
    """What registers device regions for a DeviceRegionCache (a Client or a Session). A
    registrar that also has `submit_unregister(name)` (returning a future with done() and
    result()) gets the unregistrations of dead storages without waiting for their replies."""

    def device_uuids(self) -> list[str]: ...

    def register_device_region(
        self, *, name: str, raw_handle: bytes, device_uuid: str, byte_size: int, offset: int
    ) -> None: ...

    def unregister_region(self, name: str) -> Any: ...


DEFAULT_MAX_REGIONS = 1024


class DeviceRegionLimitError(RuntimeError):
    """A DeviceRegionCache would hold more than its `max_regions` live registrations."""


def share_storage(storage: Any) -> tuple[Any, ...]:
    """storage._share_cuda_(), with the IPC reference counter it hands out released at once.
    Each share puts the storage's memory behind a counter that the consumer (a torch process
    rebuilding the tensor) decrements when done; attnd never does, and a storage that dies with
    the counter above zero keeps its memory out of the caching allocator for good (torch's
    "limbo"). The cache instead ends the registration when the storage dies (see
    DeviceRegionCache), so the memory goes back to the allocator as any tensor's does."""
    import torch

    share = storage._share_cuda_()
    if len(share) >= 6 and share[4] is not None:
        torch.UntypedStorage._release_ipc_counter_cuda(share[4], share[5])
    return tuple(share)


def _cuda_uuid(device: int) -> object:
    import torch

    return getattr(torch.cuda.get_device_properties(device), "uuid", "")


def _cuda_synchronize(device: int) -> None:
    import torch

    torch.cuda.synchronize(device)


# A registration's key: (device index, allocation handle bytes, offset in it, byte size).
_Key = tuple[int, bytes, int, int]


class _Entry:
    """Region `name` over bytes [offset, offset + size) of the allocation `key` names, and the
    storages that address it: weakly (users, (id, weakref) pairs), also strongly when pinned."""

    __slots__ = ("key", "name", "pinned", "users")

    def __init__(self, key: _Key, name: str) -> None:
        self.key = key
        self.name = name
        self.users: list[tuple[int, weakref.ref[Any]]] = []
        self.pinned: list[Any] = []

    def alive(self) -> bool:
        return bool(self.pinned) or any(r() is not None for _, r in self.users)

    def holds(self, storage: Any) -> bool:
        for _, r in self.users:
            if r() is storage:
                return True
        return False


class DeviceRegionCache:
    """Device regions of CUDA storages, registered once each through `registrar` (a Client or
    Session). Thread-safe.

    Lifetime. By default the cache holds storages weakly (a weakref to the UntypedStorage, whose
    Python object torch keeps for as long as the storage lives): a static buffer stays registered
    for as long as it lives, and a storage that dies (a fresh activation each step, a functional
    output, a copy torch.compile made) has its region unregistered on the next call through the
    cache (ref(), collect(), clear()). The weakref callback only queues the dead storage's key;
    no RPC runs inside the garbage collector. Unregistering through a registrar with
    `submit_unregister` (Client, Session) does not wait for the reply. With keep_alive=True the
    cache also holds each storage strongly (pinned until clear()), as it did before.

    The caller keeps a tensor alive while a call that uses it runs: a blocking call does by
    itself; for a stream-ordered or prepared call, until its done signal (or the prepared call
    is released). A storage that dies earlier has its memory back in torch's caching allocator
    at once, as with any tensor used on another stream.

    Re-use. The key of a registration is (device, the allocation's IPC handle, the storage's
    offset in it, its size). A new storage with the same key (the caching allocator handing the
    block of a dead storage out again) re-uses the registration, whether or not the old
    storage's death has been collected: the handle names a cudaMalloc allocation that is still
    allocated (the new storage lives in it), so the region addresses exactly the new storage's
    bytes. A storage of another size at the same place gets its own region.

    Bound. At most `max_regions` registrations are live at once; one more (after collecting
    dead storages and a gc.collect()) raises DeviceRegionLimitError rather than unregistering a
    live one that a queued call may still use. The daemon also caps regions per client
    (--max-regions-per-client, docs/FLAGS.md).

    `share(storage)`, `device_uuid(device)` and `synchronize(device)` default to CUDA through
    torch (share_storage, the device's UUID, torch.cuda.synchronize); tests pass their own."""

    def __init__(
        self,
        registrar: DeviceRegistrar,
        *,
        keep_alive: bool = False,
        max_regions: int = DEFAULT_MAX_REGIONS,
        share: Callable[[Any], Sequence[Any]] | None = None,
        device_uuid: Callable[[int], object] | None = None,
        synchronize: Callable[[int], None] | None = None,
    ) -> None:
        if max_regions < 1:
            raise ValueError(f"max_regions is {max_regions}, want >= 1")
        self._registrar = registrar
        self.keep_alive = keep_alive
        self.max_regions = max_regions
        self._share = share or share_storage
        self._device_uuid = device_uuid or _cuda_uuid
        self._synchronize = synchronize or _cuda_synchronize
        self._lock = threading.Lock()
        self._by_key: dict[_Key, _Entry] = {}
        self._by_storage: dict[int, _Entry] = {}  # id(storage) -> its entry (checked by identity)
        # Keys of registrations whose storage died, appended by weakref callbacks (no lock).
        self._dead: collections.deque[_Key] = collections.deque()
        self._pending: list[Any] = []  # unregistrations sent, reply not seen

    def ref(self, tensor: torch.Tensor) -> RegionRef:
        """The RegionRef of a CUDA tensor (its storage registered on first use); synchronises
        the tensor's device unless inside `ordered_by_ready()` (inside
        `one_synchronize_per_device()`, once per device). ValueError for a dtype attnd
        has none of (signal words: `signal()` and `region_slice()` take any dtype)."""
        try:
            name_dtype = attnd_dtype(tensor.dtype)
        except ValueError as e:
            raise ValueError(
                f"{e}: an op tensor must have one; for signal words in a device region use "
                "DeviceRegionCache.signal() or region_slice()"
            ) from None
        entry = self._entry(tensor)
        return tensor_slice(
            entry.name,
            name_dtype,
            tensor.shape,
            tensor.stride(),
            tensor.storage_offset(),
            tensor.element_size(),
        )

    def region_slice(self, tensor: torch.Tensor) -> tuple[str, int]:
        """(region name, byte offset) of a CUDA tensor's first element in the region of its
        storage, registered on first use as ref() does, for memory that is not an op tensor
        (any dtype: a buffer of u64 signal words may be int64 or uint64). Synchronises the
        tensor's device only when it registers the storage (outside `ordered_by_ready()`), so
        that the buffer's initial contents (zeroed words) are in place before the daemon can
        read them; later calls never do (they may run in a stream-ordered loop)."""
        entry = self._entry(tensor, first_use_only=True)
        return entry.name, tensor.storage_offset() * tensor.element_size()

    def known_name(self, tensor: torch.Tensor) -> str | None:
        """The region name of a CUDA tensor's storage when that storage is registered already,
        else None (then region_slice() registers it). No lock, RPC, synchronise or collect():
        for a per-call path that calls collect() once itself (OrderedCaller). Identity-checked
        as region_slice() is: a dead storage's entry never answers for a new storage that took
        its id."""
        storage = tensor.untyped_storage()
        entry = self._by_storage.get(id(storage))
        if entry is None or self._by_key.get(entry.key) is not entry or not entry.holds(storage):
            return None
        return entry.name

    def key_parts(self, tensors: Sequence[torch.Tensor]) -> list[tuple[Any, ...]]:
        """For each CUDA tensor, what names it in a prepared call: (region name, address,
        shape, strides, dtype) — the region and the address fix the offset (a registration's
        storage starts at one address); torch.Size and torch.dtype hash as they are. A storage
        registered already costs no lock, RPC, synchronise or collect() (known_name(), for all
        the tensors of a call in one call: the per-call path of OrderedCaller, which calls
        collect() once itself); an unknown one is registered (region_slice())."""
        known = self.known_name
        parts = []
        for tensor in tensors:
            name = known(tensor)
            if name is None:
                name = self.region_slice(tensor)[0]
            parts.append((name, tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype))
        return parts

    def signal(self, word: torch.Tensor, value: int) -> Signal:
        """The Signal (for ready= / done=, docs/SERVICE.md "Stream-ordered calls and prepared
        calls") naming `word`, one 8-byte element of a CUDA tensor (e.g. `words[i]` of an int64
        or uint64 tensor), with `value`: its storage is registered as a device region once
        (region_slice(), which synchronises only then). ValueError unless `word` is 8 contiguous
        bytes at an 8-byte aligned address. A stream writes and waits on the word at
        `word.data_ptr()` (cuda_signals.StreamMemOps)."""
        from .stream_ordered import Signal

        if word.numel() * word.element_size() != 8 or not word.is_contiguous():
            raise ValueError(
                f"a signal word is 8 contiguous bytes, not a {word.dtype} tensor of shape "
                f"{tuple(word.shape)}"
            )
        if word.data_ptr() % 8:
            raise ValueError(f"signal word at {word.data_ptr():#x} is not 8-byte aligned")
        region, offset = self.region_slice(word)
        return Signal(region, offset, int(value))

    def _entry(self, tensor: torch.Tensor, first_use_only: bool = False) -> _Entry:
        """The registration of a CUDA tensor's storage (registered on first use), after
        collecting dead storages; outside `ordered_by_ready()` it synchronises the tensor's
        device (with `first_use_only`, only when the storage was not known yet)."""
        storage = tensor.untyped_storage()
        with self._lock:
            entry = self._by_storage.get(id(storage))
            if entry is None or self._by_key.get(entry.key) is not entry:
                entry = None
            elif not entry.holds(storage):
                entry = None
        known = entry is not None
        if entry is None:
            entry = self._register(storage)
        # After the look-up, so a dead storage's registration that the new one re-uses (same
        # key) is kept rather than unregistered and registered again.
        self.collect()
        if not getattr(_ordering, "by_ready", False) and not (first_use_only and known):
            synced = getattr(_ordering, "synced", None)
            if synced is None:
                self._synchronize(entry.key[0])
            elif entry.key[0] not in synced:
                self._synchronize(entry.key[0])
                synced.add(entry.key[0])
        return entry

    def _register(self, storage: Any) -> _Entry:
        """The entry of a storage seen for the first time: an existing registration with its key
        (re-used), else a new one."""
        share = self._share(storage)
        device, handle, size_bytes, offset_bytes = share_info(share)
        key = (device, cuda_ipc_handle(handle), offset_bytes, size_bytes)
        for attempt in range(2):
            with self._lock:
                entry = self._by_key.get(key)
                if entry is not None:
                    self._adopt(entry, storage)
                    return entry
                if len(self._by_key) < self.max_regions:
                    uuid = pick_uuid(self._device_uuid(device), self._registrar.device_uuids())
                    entry = _Entry(key, f"torch-{os.getpid()}-{next(_counter)}")
                    self._registrar.register_device_region(**region_args(share, uuid, entry.name))
                    self._by_key[key] = entry
                    self._adopt(entry, storage)
                    return entry
            if attempt == 0:
                gc.collect()  # storages in reference cycles die here
                self.collect()
        raise DeviceRegionLimitError(
            f"{self.max_regions} device regions are registered for live storages already "
            f"(DeviceRegionCache max_regions{', keep_alive' if self.keep_alive else ''}); "
            f"drop tensors that are done with, clear() the cache or raise max_regions"
        )

    def _adopt(self, entry: _Entry, storage: Any) -> None:
        """Adds `storage` to the users of `entry` (under the lock), dropping dead users."""
        kept = []
        for sid, r in entry.users:
            if r() is not None:
                kept.append((sid, r))
            elif self._by_storage.get(sid) is entry:
                del self._by_storage[sid]
        kept.append(
            (id(storage), weakref.ref(storage, functools.partial(_queue, self._dead, entry.key)))
        )
        entry.users = kept
        self._by_storage[id(storage)] = entry
        if self.keep_alive:
            entry.pinned.append(storage)

    def _forget(self, entry: _Entry) -> None:
        """Removes `entry` from the tables (under the lock)."""
        if self._by_key.get(entry.key) is entry:
            del self._by_key[entry.key]
        for sid, _ in entry.users:
            if self._by_storage.get(sid) is entry:
                del self._by_storage[sid]

    def collect(self) -> list[str]:
        """Unregisters the regions of storages that died; returns their names. Runs on every
        ref(); call it to release them sooner."""
        names = []
        if self._dead:
            with self._lock:
                while self._dead:
                    entry = self._by_key.get(self._dead.popleft())
                    if entry is not None and not entry.alive():
                        self._forget(entry)
                        names.append(entry.name)
        self._unregister(names, wait=False)
        if self._pending:
            with self._lock:
                self._pending = [f for f in self._pending if not f.done()]
        return names

    def _unregister(self, names: list[str], wait: bool) -> None:
        submit = None if wait else getattr(self._registrar, "submit_unregister", None)
        for name in names:
            try:
                if submit is not None:
                    future = submit(name)
                    with self._lock:
                        self._pending.append(future)
                else:
                    self._registrar.unregister_region(name)
            except Exception as e:  # best effort, as a closing client's
                warnings.warn(f"attnd: unregistering device region {name!r}: {e}", stacklevel=3)

    def names(self) -> list[str]:
        """The names of the regions registered now (dead storages not yet collected included)."""
        with self._lock:
            return [entry.name for entry in self._by_key.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)

    def clear(self, unregister: bool = True) -> None:
        """Forgets every registration and releases the storages; with `unregister` (the default)
        unregisters their regions and waits for the unregistrations sent before."""
        with self._lock:
            entries = list(self._by_key.values())
            self._by_key.clear()
            self._by_storage.clear()
            self._dead.clear()
            pending, self._pending = self._pending, []
        if not unregister:
            return
        for future in pending:
            with contextlib.suppress(Exception):
                future.result()
        self._unregister([entry.name for entry in entries], wait=True)

    close = clear


def _queue(dead: collections.deque[_Key], key: _Key, _ref: object) -> None:
    """The weakref callback of a cached storage: queues its key for the next collect()."""
    dead.append(key)
