"""Stream-ordered op calls without the bookkeeping (docs/SERVICE.md "Stream-ordered calls and
prepared calls", "Submission rings"; client/python/README.md "Ordered callers"): an
OrderedCaller turns `call(op, stream=..., **arguments)` into a prepared call (made once per
distinct set of tensors, shapes and scalars, then cached), a ready word the caller's CUDA stream
writes after what it has queued, one submission-ring entry, and a wait for the call's done word
enqueued on the same stream. Nothing synchronises and no RPC is made once the call is prepared:
the stream's later work sees the outputs, the host thread runs ahead of the GPU.

    caller = client.ordered_caller()                  # or session.ordered_caller()
    s = torch.cuda.current_stream()
    caller.call("dsa_attention", stream=s, q=q, ..., out=out, lse=lse)   # every tensor CUDA
    consumer(out)                                     # queued on s after the done wait
    caller.wait()                                     # host: every call so far over (optional)
    bound = caller.bind("dsa_attention", q=q, ..., out=out, lse=lse)  # fixed tensors: once
    bound(s)                                          # as caller.call(...), without the key
    caller.close()

Without `stream` the call is host-ordered: the daemon starts it as soon as it takes the entry
(after the earlier calls of the queue), so its inputs must already be in place, and the thread
learns of its end through wait(). Arguments must all lie in regions (CUDA tensors, registered
through the client's device-region cache; arrays or RegionRefs in host regions).

Failures. A call that fails after it was accepted (its done word carries FAILURE_BIT; its
outputs are undefined) raises AttndError ABORTED from the next call(), wait() or check() that
sees it, once. A GPU stream's wait ends on a failed call's word too, so the stream never hangs on
a failure; it hangs only if the daemon stops storing done words (it exited): wait() then raises
UNAVAILABLE and stores the failure bit into the pending calls' words itself, which releases the
streams (their outputs are undefined). A call whose stream ops were only partly enqueued, or
enqueued without its ring entry going in, leaves the caller refusing further calls (_break).

Lifetimes. Every tensor and array of a call is held by the caller until the call's done word is
seen, so no region a queued call uses can be unregistered under it.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from typing import Any

import grpc
import numpy as np

from . import rings as _rings
from .cuda_signals import CudaDriverError
from .errors import AttndError
from .stream_ordered import FAILURE_BIT, SignalWord
from .tensors import RegionRef, Typed
from .torch_support import ordered_by_ready

WORD_BYTES = 64  # one signal word per cache line
_names = itertools.count()


def _is_cuda_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and bool(getattr(value, "is_cuda", False))


def _stream_handle(stream: Any) -> int:
    """A CUstream handle from an int or an object with `cuda_stream` (torch.cuda.Stream)."""
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(
            f"stream: want a CUstream handle (int) or a torch.cuda.Stream, got "
            f"{type(stream).__name__}"
        )
    return handle


class BoundCall:
    """An OrderedCaller's call with its arguments fixed (OrderedCaller.bind): `bound(stream)`
    runs it and returns its call number; release() gives its prepared call back (after its
    last call), as the caller's close() does."""

    __slots__ = ("call_id", "caller", "held", "key", "last", "op", "released")

    def __init__(self, caller: OrderedCaller, op: str, call_id: int, key: Any, held: list[Any]):
        self.caller = caller
        self.op = op
        self.call_id = call_id
        self.key = key
        self.held = held
        self.last = 0  # its latest call's number
        self.released = False

    def __call__(self, stream: Any = None) -> int:
        return self.caller._run_bound(self, stream)

    def release(self) -> None:
        self.caller._release_bound(self)

    def __enter__(self) -> BoundCall:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class OrderedCaller:
    """Stream-ordered calls of prepared calls through a submission ring of the caller's own
    (module docstring). One host region holds the ring, one ready word and `depth` done words
    (call n uses word n % depth, so at most `depth` calls are pending: call() waits for the
    oldest before it reuses its word). Thread-safe (one call at a time)."""

    def __init__(
        self,
        owner: Any,
        *,
        entries: int = 256,
        depth: int = 512,
        max_prepared: int = 1024,
        timeout: float = 60.0,
        spin: float = 2e-4,
        driver: Any = None,
    ) -> None:
        if entries < 1 or entries > _rings.MAX_ENTRIES or entries & (entries - 1):
            raise ValueError(
                f"entries: {entries} is not a power of two from 1 to {_rings.MAX_ENTRIES}"
            )
        if not 1 <= depth <= 4096:
            raise ValueError(f"depth: {depth} is not from 1 to 4096 (the daemon's queue bound)")
        if not 1 <= max_prepared <= 4096:
            raise ValueError(f"max_prepared: {max_prepared} is not from 1 to 4096")
        if timeout <= 0 or spin < 0:
            raise ValueError("timeout must be > 0 and spin >= 0")
        self.owner = owner
        self.depth = int(depth)
        self.max_prepared = int(max_prepared)
        self.timeout = float(timeout)
        self.spin = float(spin)
        self.calls = 0  # calls submitted (call n's signal value is n)
        self.retired = 0  # every call <= retired has its done word stored
        self.prepares = 0  # PrepareCall RPCs made (cache misses)
        self._lock = threading.RLock()
        self._driver = driver
        self._signals: Any = None  # cuda_signals.StreamSignals, made on the first stream call
        self._used_streams = False
        # Pending calls, oldest first: (n, op, (key, call id), the objects held for it).
        self._pending: collections.deque[tuple[int, str, Any, list[Any]]] = collections.deque()
        self._prepared: collections.OrderedDict[Any, list[int]] = collections.OrderedDict()
        self._failures: list[tuple[int, str]] = []
        self._dropped: list[tuple[int, int]] = []  # (call id, its last call) to release
        self._broken: str | None = None  # why no more calls are taken (_break)
        self._bound: set[BoundCall] = set()  # bind()'s calls not released yet
        ring = _rings.ring_bytes(entries)
        name = f"ordered-{os.getpid()}-{next(_names)}"
        self.region = owner.create_host_region(name, ring + WORD_BYTES * (depth + 1))
        try:
            self.ring: _rings.SubmissionRing | None = owner.open_ring(
                self.region, offset=0, entries=entries, timeout=timeout
            )
            self.ready = SignalWord(self.region, ring)
            self._done = [
                SignalWord(self.region, ring + WORD_BYTES * (1 + i)) for i in range(depth)
            ]
        except BaseException:
            self.region.close()
            raise

    # ---- calls ----

    def call(self, op: str, stream: Any = None, **arguments: Any) -> int:
        """Runs op `op` stream-ordered; returns its call number n (wait(n) waits for it). With
        `stream` (a CUstream handle or a torch.cuda.Stream) the stream writes the ready word
        after what it has queued and waits for the done word before what it queues next; without,
        the call starts once the daemon takes it. Raises the failure of an earlier call first
        (AttndError ABORTED; this call is then not made), AttndError from PrepareCall when the
        call is new and refused (e.g. INVALID_ARGUMENT for an argument outside every region),
        TypeError for an argument that cannot be named in a prepared call."""
        with self._lock:
            ring = self._ready_to_call()
            handle = None if stream is None else _stream_handle(stream)
            # The caller's stream orders the inputs: CUDA tensors are named (registered on first
            # use) and prepared without a synchronise.
            with ordered_by_ready():
                key, held = self._key(op, arguments)
                n = self._next_number()
                call_id = self._prepared_call(op, key, arguments, n)
            return self._submit(ring, op, key, call_id, held, n, handle)

    def bind(self, op: str, **arguments: Any) -> BoundCall:
        """Prepares op `op` with these arguments once and returns a BoundCall: `bound(stream)`
        then runs it as call(op, stream=stream, **arguments) would, without naming the
        arguments again (no key, no cache look-up per call: the call's host cost is the ring
        entry and the stream's two operations). The arguments are fixed: the same tensors at
        the same addresses, shapes and strides, their contents written in place between calls
        (static buffers, as a CUDA-graph serving loop keeps). The BoundCall holds them and its
        prepared call (outside the `max_prepared` cache) until release() or close(). Raises as
        call() does for refused arguments (PrepareCall's AttndError, TypeError)."""
        with self._lock:
            self._ready_to_call()
            with ordered_by_ready():
                key, held = self._key(op, arguments)
                call_id = int(self.owner.prepare_call(op, timeout=self.timeout, **arguments))
            self.prepares += 1
            bound = BoundCall(self, op, call_id, key, held)
            self._bound.add(bound)
            return bound

    def _run_bound(self, bound: BoundCall, stream: Any) -> int:
        with self._lock:
            ring = self._ready_to_call()
            if bound.released:
                raise ValueError(f"bound {bound.op} call {bound.call_id} was released")
            handle = None if stream is None else _stream_handle(stream)
            n = self._next_number()
            bound.last = n
            return self._submit(ring, bound.op, bound.key, bound.call_id, bound.held, n, handle)

    def _release_bound(self, bound: BoundCall) -> None:
        with self._lock:
            if bound.released:
                return
            bound.released = True
            self._bound.discard(bound)
            # Released on the daemon once its last call is over (an entry still queued with it
            # would be refused).
            self._dropped.append((bound.call_id, min(bound.last, self.calls)))
            if self.ring is not None:
                self._poll()
                self._release_dropped()

    def _ready_to_call(self) -> _rings.SubmissionRing:
        """The ring, after raising what stops a new call: closed, broken, an earlier failure."""
        ring = self._open_ring()
        if self._broken is not None:
            raise AttndError(grpc.StatusCode.FAILED_PRECONDITION, self._broken)
        self._poll()
        self._raise_failures()
        return ring

    def _next_number(self) -> int:
        """The next call's number, once its done word (n % depth) is free."""
        n = self.calls + 1
        if n > self.depth:
            self._wait_retired(n - self.depth, self.timeout)
            self._raise_failures()
        return n

    def _submit(
        self,
        ring: _rings.SubmissionRing,
        op: str,
        key: Any,
        call_id: int,
        held: list[Any],
        n: int,
        handle: int | None,
    ) -> int:
        done = self._done[n % self.depth]
        if handle is not None:
            # The stream's ready write and done wait in one driver call, before the entry goes
            # in: refused, nothing is enqueued or submitted (the next call takes n).
            try:
                self._stream_signals().write_then_wait(self.ready, n, done, n, handle)
            except CudaDriverError as e:
                if e.ready_written:
                    self._break(n, op, done, f"its stream's done wait was refused ({e})")
                raise
            self._used_streams = True
        try:
            ready_offset = None if handle is None else self.ready.offset
            if not ring.submit(call_id, ready_offset, n, done.offset, n):
                deadline = time.monotonic() + self.timeout
                while not ring.submit(call_id, ready_offset, n, done.offset, n):
                    if time.monotonic() >= deadline:
                        raise AttndError(
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"ordered caller: ring {ring.ring_id} stayed full for {self.timeout} s",
                        )
                    time.sleep(20e-6)
        except BaseException as e:
            if handle is not None:
                self._break(n, op, done, f"its ring entry was not submitted ({e})")
            raise
        self.calls = n
        self._pending.append((n, op, (key, call_id), held))
        if self._dropped:
            self._release_dropped()
        return n

    def _break(self, n: int, op: str, done: SignalWord, why: str) -> None:
        """Call n's stream has its ready word written (and maybe a done wait) but the daemon
        will never have the call: a later call numbered n would find its ready word reached
        before its inputs are, so no call follows. The failure bit in the done word releases the
        stream's wait (no call of this number exists to store it); later calls raise."""
        done.set(n | FAILURE_BIT)
        self._broken = (
            f"ordered caller: call {n} ({op}) is not made: {why}; this caller takes no more "
            "calls (close it and make another)"
        )

    def wait(self, n: int | None = None, timeout: float | None = None) -> None:
        """Waits on the host until call `n` (default: the latest) and every call before it are
        over, then raises the first failure seen (AttndError ABORTED). DEADLINE_EXCEEDED after
        `timeout` seconds (default: the caller's), UNAVAILABLE when the daemon stopped polling
        the ring, FAILED_PRECONDITION when the ring was closed with calls not taken (the calls
        that cannot end any more get the failure bit from here, releasing their streams). Does
        not synchronise a GPU stream: the daemon's kernels are over, the caller's stream may
        still have work queued."""
        with self._lock:
            target = self.calls if n is None else min(int(n), self.calls)
            self._wait_retired(target, self.timeout if timeout is None else timeout)
            self._raise_failures()

    def check(self) -> None:
        """Raises the first failure among the calls seen over so far (no waiting)."""
        with self._lock:
            self._poll()
            self._raise_failures()

    def abort(self) -> None:
        """Gives up on the pending calls: stores the failure bit into their done words (a stream
        waiting on one goes on; their outputs are undefined), so they are reported as failed.
        For a daemon that will not end them (it hangs); wait() does it itself when the daemon is
        gone."""
        with self._lock:
            self._abort_pending()

    @property
    def pending(self) -> int:
        """Calls submitted whose done word has not been seen yet."""
        with self._lock:
            self._poll()
            return len(self._pending)

    @property
    def prepared(self) -> int:
        """Prepared calls in the cache."""
        with self._lock:
            return len(self._prepared)

    def close(self, timeout: float | None = None) -> None:
        """Waits for the pending calls (failures then raise after the ring is closed), closes
        the ring, releases the prepared calls, synchronises the CUDA context once when a stream
        was used (its queued waits read the words being unmapped) and unregisters the region.
        Idempotent."""
        with self._lock:
            if self.ring is None:
                return
            error: BaseException | None = None
            try:
                self._wait_retired(self.calls, self.timeout if timeout is None else timeout)
            except AttndError as e:
                error = e
                self._abort_pending(reported=True)
            ring, self.ring = self.ring, None
            try:
                ring.close()
            except AttndError:
                pass  # the lease that held it has ended
            for call_id, _ in self._prepared.values():
                self._release(call_id)
            self._prepared.clear()
            for bound in self._bound:
                bound.released = True
                self._release(bound.call_id)
            self._bound.clear()
            self._release_dropped(everything=True)
            self._pending.clear()
            if self._signals is not None:
                signals, self._signals = self._signals, None
                if self._used_streams:
                    sync = getattr(signals._driver, "synchronize", None)
                    if sync is not None:
                        sync()
                signals.close()
            try:
                self.region.close()
            except AttndError:
                pass
            if error is None and self._failures:
                self._raise_failures()
            if error is not None:
                raise error

    def __enter__(self) -> OrderedCaller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----

    def _open_ring(self) -> _rings.SubmissionRing:
        if self.ring is None:
            raise AttndError(grpc.StatusCode.FAILED_PRECONDITION, "ordered caller: closed")
        return self.ring

    def _stream_signals(self) -> Any:
        if self._signals is None:
            from .cuda_signals import StreamSignals

            self._signals = StreamSignals(self.region, driver=self._driver)
        return self._signals

    def _key(self, op: str, arguments: dict[str, Any]) -> tuple[Any, list[Any]]:
        """A hashable key naming the prepared call these arguments make (the regions, offsets,
        shapes, strides and dtypes of the tensors; the scalars), and the objects to hold while
        the call is pending. CUDA tensors, the common case on a GPU, take the short path: the
        region of a storage seen before comes from the cache without a lock or an RPC, and the
        cache collects dead storages once per call rather than once per tensor."""
        held: list[Any] = []
        parts: list[Any] = [op]
        names: list[str] = []
        tensors: list[Any] = []
        for name in sorted(arguments):
            value = arguments[name]
            if value is None:
                continue
            if _is_cuda_tensor(value):
                names.append(name)
                tensors.append(value)
                continue
            parts.append((name, self._part(name, value, held)))
        if tensors:  # the CUDA tensors: one cache call for all of them
            held.extend(tensors)
            regions = self._device_regions()
            regions.collect()
            parts.extend(zip(names, regions.key_parts(tensors), strict=True))
        return tuple(parts), held

    def _part(self, name: str, value: Any, held: list[Any]) -> Any:
        if type(value) is np.ndarray:  # the common host form first
            held.append(value)
            interface = value.__array_interface__
            address = int(interface["data"][0])
            region = self._host_region(address, value.nbytes)
            return (
                "array",
                region,
                address,
                value.shape,
                interface["strides"],
                interface["typestr"],
            )
        if isinstance(value, (bool, int, float, str)):
            return (type(value).__name__, value)
        if isinstance(value, np.generic):
            return (value.dtype.str, value.item())
        if isinstance(value, RegionRef):
            return ("ref", value.region, value.dtype, value.shape, value.offset, value.strides)
        if isinstance(value, Typed):
            return ("typed", self._part(name, value.array, held), value.dtype, value.inline)
        if _is_cuda_tensor(value):  # inside a Typed; _key takes the top-level ones itself
            return self._cuda_part(self._device_regions(), value, held)
        if type(value).__module__.startswith("torch") and hasattr(value, "data_ptr"):
            held.append(value)  # a CPU tensor (in a host region, or PrepareCall refuses it)
            address = int(value.data_ptr())
            return (
                "cpu",
                self._host_region(address, value.numel() * value.element_size()),
                address,
                tuple(value.shape),
                tuple(value.stride()),
                str(value.dtype),
            )
        if isinstance(value, np.ndarray):
            held.append(value)
            address = int(value.__array_interface__["data"][0])
            region = self._host_region(address, value.nbytes)
            return ("array", region, address, value.shape, value.strides, value.dtype.str)
        raise TypeError(
            f"ordered caller: argument {name!r} is a {type(value).__name__}; a prepared call "
            "takes tensors in regions (CUDA tensors, arrays or RegionRefs in host regions) and "
            "scalars"
        )

    @staticmethod
    def _cuda_part(regions: Any, value: Any, held: list[Any]) -> Any:
        """A CUDA tensor's part of the key inside a Typed (DeviceRegionCache.key_parts())."""
        held.append(value)
        return ("cuda", *regions.key_parts([value])[0])

    def _host_region(self, address: int, nbytes: int) -> str | None:
        """The name of the client's host region holding [address, +nbytes), so that memory of a
        region registered again elsewhere gets a prepared call of its own (None: in no region,
        which PrepareCall refuses)."""
        client = getattr(self.owner, "client", self.owner)
        find = getattr(client, "_find_region", None)
        found = find(address, max(nbytes, 1)) if find is not None else None
        return None if found is None else found[0]

    def _device_regions(self) -> Any:
        owner = self.owner
        cache = getattr(owner, "device_regions", None) or owner.client.device_regions
        return cache()

    def _prepared_call(self, op: str, key: Any, arguments: dict[str, Any], n: int) -> int:
        entry = self._prepared.get(key)
        if entry is not None:
            self._prepared.move_to_end(key)
            entry[1] = n
            return entry[0]
        while len(self._prepared) >= self.max_prepared:
            _, (old_id, last) = next(iter(self._prepared.items()))
            # Its last call, or the latest submitted one: `last` may name a call that was never
            # submitted (a stream or ring error), whose number the next call takes.
            last = min(last, self.calls)
            if last > self.retired:
                self._wait_retired(last, self.timeout)
            self._prepared.popitem(last=False)
            self._release(old_id)
        call_id = int(self.owner.prepare_call(op, timeout=self.timeout, **arguments))
        self.prepares += 1
        self._prepared[key] = [call_id, n]
        return call_id

    def _release_dropped(self, everything: bool = False) -> None:
        kept = []
        for call_id, last in self._dropped:
            if everything or last <= self.retired:
                self._release(call_id)
            else:
                kept.append((call_id, last))
        self._dropped = kept

    def _release(self, call_id: int) -> None:
        try:
            self.owner.release_call(call_id, timeout=self.timeout)
        except AttndError:
            pass  # released already (a region it named went, or its lease ended)

    def _poll(self) -> None:
        """Retires the oldest pending calls whose done word holds their value (calls of one
        queue end in order; a refused entry may end earlier and waits for its turn here)."""
        pending = self._pending
        while pending:
            n, op, (key, call_id), _ = pending[0]
            got = self._done[n % self.depth].get()
            if got & ~FAILURE_BIT != n:
                return
            pending.popleft()
            self.retired = n
            if got & FAILURE_BIT:
                self._failures.append((n, op))
                # The prepared call may be what failed (e.g. a region it names was registered
                # again under its name): the next call with these arguments prepares anew. It is
                # released once its calls still queued are over (released now, an entry the
                # daemon has not taken yet would be refused).
                entry = self._prepared.get(key)
                if entry is not None and entry[0] == call_id:  # not one made since
                    del self._prepared[key]
                    self._dropped.append((entry[0], entry[1]))

    def _raise_failures(self) -> None:
        if not self._failures:
            return
        failures, self._failures = self._failures, []
        n, op = failures[0]
        more = f" (and {len(failures) - 1} later call(s))" if len(failures) > 1 else ""
        raise AttndError(
            grpc.StatusCode.ABORTED,
            f"ordered caller: call {n} ({op}) failed{more}; its outputs are undefined (the "
            "daemon's log and attnd_requests_total say why)",
        )

    def _wait_retired(self, n: int, timeout: float) -> None:
        start = time.monotonic()
        deadline, spin_until = start + timeout, start + self.spin
        ring = self.ring
        while True:
            self._poll()
            if self.retired >= n:
                return
            now = time.monotonic()
            if now < spin_until:
                continue
            if ring is not None:
                self._check_daemon(ring, now)
            if now >= deadline:
                raise AttndError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"ordered caller: call {n} not over after {timeout} s ({self.retired} of "
                    f"{self.calls} calls over)",
                )
            time.sleep(50e-6)

    def _check_daemon(self, ring: _rings.SubmissionRing, now: float) -> None:
        """Raises (after failing the calls that cannot end) when the ring was closed or errored
        with entries not taken, or when the daemon stopped polling it."""
        state, taken = ring.state, ring.taken
        if state != _rings.STATE_OPEN and taken < ring.submitted:
            self._abort_pending(after=taken, reported=True)
            raise AttndError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"ordered caller: ring {ring.ring_id} was "
                f"{'errored' if state == _rings.STATE_ERRORED else 'closed'} with "
                f"{ring.submitted - taken} entries not taken",
            )
        silent = ring.silence(now)
        if silent is not None:
            failed = len(self._pending)
            self._abort_pending(reported=True)
            raise AttndError(
                grpc.StatusCode.UNAVAILABLE,
                f"ordered caller: the daemon has not polled ring {ring.ring_id} for "
                f"{silent:.1f} s (it exited or hangs); {failed} pending calls failed here",
            )

    def _abort_pending(self, after: int = 0, reported: bool = False) -> None:
        """Stores the failure bit into the done words of the pending calls whose ring entry is
        not among the first `after` (the ring is this caller's own: call n is entry n - 1):
        the daemon will not store them, and a stream waiting on one would hang. `reported`: the
        error raised next reports them (the ring closed under them, the daemon silent, a failed
        close), so they are not raised again as ABORTED; failures the daemon stored stay."""
        aborted = set()
        for n, _, _, _ in self._pending:
            if n > after:
                word = self._done[n % self.depth]
                if word.get() & ~FAILURE_BIT != n:
                    word.set(n | FAILURE_BIT)
                    aborted.add(n)
        self._poll()
        if reported and aborted:
            self._failures = [f for f in self._failures if f[0] not in aborted]
