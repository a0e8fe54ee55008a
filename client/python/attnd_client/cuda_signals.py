"""Signal words written and waited on by the caller's own CUDA stream (docs/SERVICE.md
"Stream-ordered calls and prepared calls", "On a GPU backend"): the frontend's stream stores
`ready` after the kernels that produce a call's inputs and waits for `done` before the kernels
that read its outputs, so the calling thread never synchronises and the whole chain can sit in a
CUDA graph. The words are SignalWords of a HostRegion (StreamSignals maps the region into the
caller's CUDA context, cuMemHostRegister, once) or words of a CUDA buffer registered as a device
region (StreamMemOps, by address; torch_support.DeviceRegionCache.signal()); the stream memory
operations (cuStreamWriteValue64, cuStreamWaitValue64) go through the driver API with ctypes: no
torch or cuda-python needed, any stream handle works (torch:
`torch.cuda.current_stream().cuda_stream`).

    signals = StreamSignals(region)                  # once per region, with a CUDA context current
    client.enqueue("sparse_mla", ready=ready.signal(n), done=done.signal(n), q=q, ..., out=out)
    signals.write(ready, n, stream)                  # after the producer of q, on its stream
    signals.wait(done, n, stream)                    # before the consumer of out
    # a failed call stores n | FAILURE_BIT, which also ends the wait (StreamSignals.wait):
    # check done.get() & FAILURE_BIT from the host to see failures
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .regions import HostRegion
    from .stream_ordered import SignalWord

PAGE = 4096
CU_MEMHOSTREGISTER_PORTABLE = 0x01
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02
CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0  # a memory barrier before the write: prior work is visible
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
CUDA_ERROR_NOT_SUPPORTED = 801
CU_STREAM_MEM_OP_WAIT_VALUE_64 = 4
CU_STREAM_MEM_OP_WRITE_VALUE_64 = 5
# Two CUstreamBatchMemOpParams (cuda.h: a 48-byte union; for a 64-bit wait or write: the
# operation u32 at 0, the address at 8, the value at 16, the flags u32 at 24, the driver's
# `alias` at 32): a write, then a wait.
_WRITE_THEN_WAIT = struct.Struct("<" + "I4xQQI4xQ8x" * 2)


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed: its name and CUresult. `ready_written`: raised by
    StreamSignals.write_then_wait after the write was enqueued (only its wait was refused)."""

    ready_written = False


def _load_driver() -> ctypes.CDLL:
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda") or "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise CudaDriverError("libcuda.so.1 not found: stream signals need the NVIDIA driver")


def _symbol(lib: ctypes.CDLL, *names: str) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """The first of `names` the driver exports (CUDA 12+ versions some entry points `_v2`)."""
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    raise CudaDriverError(f"the driver exports none of {names}")


class _Driver:
    def __init__(self, lib: ctypes.CDLL) -> None:
        u64, vp, uint = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint
        self.register = _symbol(lib, "cuMemHostRegister_v2", "cuMemHostRegister")
        self.register.argtypes = [vp, ctypes.c_size_t, uint]
        self.unregister = _symbol(lib, "cuMemHostUnregister")
        self.unregister.argtypes = [vp]
        self.device_pointer = _symbol(
            lib, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"
        )
        self.device_pointer.argtypes = [ctypes.POINTER(u64), vp, uint]
        self.write = _symbol(lib, "cuStreamWriteValue64_v2", "cuStreamWriteValue64")
        self.write.argtypes = [vp, u64, u64, uint]
        self.wait = _symbol(lib, "cuStreamWaitValue64_v2", "cuStreamWaitValue64")
        self.wait.argtypes = [vp, u64, u64, uint]
        for f in (self.register, self.unregister, self.device_pointer, self.write, self.wait):
            f.restype = ctypes.c_int
        # Both of a call's operations in one driver call (StreamSignals.write_then_wait); None
        # where the driver lacks it (then two calls).
        try:
            self.batch = _symbol(lib, "cuStreamBatchMemOp_v2", "cuStreamBatchMemOp")
        except CudaDriverError:
            self.batch = None
        else:
            self.batch.argtypes = [vp, uint, vp, uint]
            self.batch.restype = ctypes.c_int


def _check(result: int, what: str) -> None:
    if result != 0:
        raise CudaDriverError(f"{what} failed: CUresult {result}")


class StreamMemOps:
    """The stream memory operations on device addresses, for signal words in a CUDA tensor
    registered as a device region (torch_support.DeviceRegionCache.signal(words[i], n) names
    the word to the daemon; `words[i].data_ptr()` is its address here):

        ops = StreamMemOps()
        ops.write(words[i].data_ptr(), n, stream)     # after the producers, on their stream
        ops.wait(words[j].data_ptr(), n, stream)      # before the consumers
    """

    def __init__(self, driver: _Driver | None = None) -> None:
        self._driver = driver or _Driver(_load_driver())

    def write(self, address: int, value: int, stream: int) -> None:
        """Enqueues `*address = value` (u64) on `stream` after a memory barrier, as
        StreamSignals.write does."""
        _check(
            self._driver.write(
                ctypes.c_void_p(stream), int(address), int(value), CU_STREAM_WRITE_VALUE_DEFAULT
            ),
            "cuStreamWriteValue64",
        )

    def wait(self, address: int, value: int, stream: int) -> None:
        """Enqueues a wait on `stream` until the u64 at `address` is >= `value` as the driver
        compares (StreamSignals.wait says how)."""
        _check(
            self._driver.wait(
                ctypes.c_void_p(stream), int(address), int(value), CU_STREAM_WAIT_VALUE_GEQ
            ),
            "cuStreamWaitValue64",
        )


class StreamSignals:
    """The caller's CUDA view of one HostRegion's signal words. Construct it with a CUDA context
    current on this thread (with torch: after the first CUDA op on the device); `close()` (or
    the end of a `with` block) unregisters the pages from CUDA."""

    def __init__(self, region: HostRegion, driver: _Driver | None = None) -> None:
        self._driver = driver or _Driver(_load_driver())
        self.region = region
        start = region.address & ~(PAGE - 1)
        end = (region.address + region.byte_size + PAGE - 1) & ~(PAGE - 1)
        self._host = start
        result = self._driver.register(
            ctypes.c_void_p(start),
            end - start,
            CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
        )
        # Already registered (by this process's runtime, e.g. a pinned torch view): use it as is.
        self._owned = result == 0
        if result not in (0, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED):
            _check(result, "cuMemHostRegister")
        device = ctypes.c_uint64(0)
        _check(
            self._driver.device_pointer(ctypes.byref(device), ctypes.c_void_p(start), 0),
            "cuMemHostGetDevicePointer",
        )
        self._device = device.value
        self._batch = getattr(self._driver, "batch", None)
        self._batch_params = ctypes.create_string_buffer(_WRITE_THEN_WAIT.size)
        self._batch_address = ctypes.c_void_p(ctypes.addressof(self._batch_params))
        self._batch_lock = threading.Lock()

    def device_address(self, word: SignalWord) -> int:
        """The device address of `word` (it must lie in this region)."""
        if word.region is not self.region:
            raise ValueError(
                f"signal word of region {word.region.name!r}, not {self.region.name!r}"
            )
        return self._device + (self.region.address + word.offset - self._host)

    def write(self, word: SignalWord, value: int, stream: int) -> None:
        """Enqueues `word = value` on `stream` (a CUstream / cudaStream_t handle; 0 = legacy
        default), after a memory barrier: what the stream ran before is visible to the daemon
        once it sees the value."""
        _check(
            self._driver.write(
                ctypes.c_void_p(stream),
                self.device_address(word),
                int(value),
                CU_STREAM_WRITE_VALUE_DEFAULT,
            ),
            "cuStreamWriteValue64",
        )

    def wait(self, word: SignalWord, value: int, stream: int) -> None:
        """Enqueues a wait on `stream` until `word >= value`, compared as the driver documents
        CU_STREAM_WAIT_VALUE_GEQ: cyclically, `(int64)(word - value) >= 0`. A failed call's done
        word, value | FAILURE_BIT (bit 62), ends the wait too (word - value is 2^62): check
        `word.get() & FAILURE_BIT` afterwards. Values must stay below 2^62 (docs/SERVICE.md
        "Failure bit"). A word the daemon never writes (a refused ring entry's device word) still
        holds the stream: a caller that may see those bounds the wait itself."""
        _check(
            self._driver.wait(
                ctypes.c_void_p(stream),
                self.device_address(word),
                int(value),
                CU_STREAM_WAIT_VALUE_GEQ,
            ),
            "cuStreamWaitValue64",
        )

    def write_then_wait(
        self, ready: SignalWord, ready_value: int, done: SignalWord, done_value: int, stream: int
    ) -> None:
        """write(ready, ready_value, stream) then wait(done, done_value, stream), in one driver
        call (cuStreamBatchMemOp: the same two operations, enqueued in this order; refused, it
        enqueues neither) where the driver has it, else in two (CudaDriverError with
        `ready_written` when only the wait was refused). Each driver call costs the caller's
        thread ~4–5 µs on a GPU host (docs/BENCHMARKS.md "Ordered callers: caller CPU")."""
        batch = self._batch
        if batch is not None:
            ready_address, done_address = self.device_address(ready), self.device_address(done)
            with self._batch_lock:  # one parameter buffer per StreamSignals
                _WRITE_THEN_WAIT.pack_into(
                    self._batch_params,
                    0,
                    CU_STREAM_MEM_OP_WRITE_VALUE_64,
                    ready_address,
                    int(ready_value),
                    CU_STREAM_WRITE_VALUE_DEFAULT,
                    0,
                    CU_STREAM_MEM_OP_WAIT_VALUE_64,
                    done_address,
                    int(done_value),
                    CU_STREAM_WAIT_VALUE_GEQ,
                    0,
                )
                result = batch(ctypes.c_void_p(stream), 2, self._batch_address, 0)
            if result != CUDA_ERROR_NOT_SUPPORTED:
                _check(result, "cuStreamBatchMemOp")
                return
            self._batch = None  # nothing was enqueued: two calls from now on
        self.write(ready, ready_value, stream)
        try:
            self.wait(done, done_value, stream)
        except CudaDriverError as e:
            e.ready_written = True
            raise

    def close(self) -> None:
        if self._owned:
            self._owned = False
            _check(self._driver.unregister(ctypes.c_void_p(self._host)), "cuMemHostUnregister")

    def __enter__(self) -> StreamSignals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
