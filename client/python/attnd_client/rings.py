"""Submission rings (docs/SERVICE.md "Submission rings"): a ring of 64-byte slots in a host region
of the caller's through which prepared calls run stream-ordered without an RPC per call. One RPC
(OpenRing) sets it up; submit() then only writes a slot and the ring's head word in the shared
memory, and the daemon's poller queues the call as RunPrepared with signals would. Every entry's
ready and done words lie in one host region named at open time (offsets into it).

    ring = client.open_ring(ring_region, offset=0, entries=256, signals=word_region)
    while not ring.submit(call_id, ready_offset, 1, done_offset, 1):   # False: ring full
        time.sleep(50e-6)
    ...; done_word.wait(1)                       # value | FAILURE_BIT when it failed
    ring.close()

The stores are plain aligned 8-byte stores through ctypes, made in program order: on x86-64
(total store order) the daemon never sees the head before the slot, nor the slot's seq before its
other fields. Other architectures need a store fence there, which the standard library does not
offer: use the C++ client on them.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import time
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from .errors import AttndError

if TYPE_CHECKING:
    from .regions import HostRegion
    from .stream_ordered import SignalWord

# The layout, in u64 words from the ring's offset (docs/SERVICE.md "Submission rings").
HEAD, TAIL, STATE = 0, 8, 16  # bytes 0, 64, 128: each on its own 64-byte line
BEAT = 17  # byte 136: the daemon's poller advances it at least every millisecond
# call(): an open ring whose beat has moved once and then stands still this long (seconds) means
# the daemon is gone.
DAEMON_SILENCE = 3.0
HEADER_WORDS, ENTRY_WORDS = 24, 8  # 192 and 64 bytes
SEQ, CALL_ID, READY_OFFSET, READY_VALUE, DONE_OFFSET, DONE_VALUE, FLAGS = range(7)
FLAG_READY = 1
STATE_OPEN, STATE_CLOSED, STATE_ERRORED = 0, 1, 2
MAX_ENTRIES = 4096


def ring_bytes(entries: int) -> int:
    """Bytes a ring of `entries` slots covers from its offset."""
    return 8 * (HEADER_WORDS + ENTRY_WORDS * entries)


class RingOwner(Protocol):
    """What a ring was opened through (a Client or a Session)."""

    def close_ring(self, ring_id: int, timeout: float | None = None) -> None: ...


class SubmissionRing:
    """The client's side of an open ring. submit() is for one thread at a time."""

    def __init__(
        self,
        owner: RingOwner,
        ring_id: int,
        region: HostRegion,
        offset: int,
        entries: int,
        signals: HostRegion | str | None = None,
    ) -> None:
        buffer = region.shm.buffer
        if buffer is None:
            raise ValueError(f"region {region.name!r}: its shm object is closed")
        start = region.offset + offset
        nbytes = ring_bytes(entries)
        self.owner = owner
        self.ring_id = int(ring_id)
        self.entries = int(entries)
        self._mask = self.entries - 1
        self._words = (ctypes.c_uint64 * (nbytes // 8)).from_buffer(buffer[start : start + nbytes])
        self._head = 0
        self._open = True
        self._beat: list[Any] = [0, None]  # silence(): the beat word as last seen, when it moved
        # Where entries' words lie: a host region of this client's (polled by call()), or a
        # region named by `signal_name` only (a device region: the caller's stream writes ready
        # and waits for done; call() refuses).
        self.signal_name = signals_name(region, signals)
        self.signals: HostRegion | None = (
            None if isinstance(signals, str) else (signals if signals is not None else region)
        )

    def submit(
        self,
        call_id: int,
        ready_offset: int | None,
        ready_value: int,
        done_offset: int,
        done_value: int,
    ) -> bool:
        """Queues prepared call `call_id`: it runs once the u64 at `ready_offset` of the signal
        region is >= ready_value (None: no wait) and the earlier calls of the caller's ordered
        queue are over; the daemon then stores done_value at `done_offset` (| FAILURE_BIT when
        it failed, never ran, or the entry was refused, e.g. for a value >= 2^62: values must
        stay below FAILURE_BIT). False when the ring is full (retry);
        AttndError FAILED_PRECONDITION when the daemon closed or errored the ring."""
        w = self._words
        if w[STATE] != STATE_OPEN:
            raise AttndError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"submission ring {self.ring_id} is "
                f"{'errored' if w[STATE] == STATE_ERRORED else 'closed'}",
            )
        head = self._head
        if head - w[TAIL] >= self.entries:
            return False
        slot = HEADER_WORDS + (head & self._mask) * ENTRY_WORDS
        w[slot + CALL_ID] = call_id
        if ready_offset is None:
            w[slot + READY_OFFSET] = 0
            w[slot + READY_VALUE] = 0
            w[slot + FLAGS] = 0
        else:
            w[slot + READY_OFFSET] = ready_offset
            w[slot + READY_VALUE] = ready_value
            w[slot + FLAGS] = FLAG_READY
        w[slot + DONE_OFFSET] = done_offset
        w[slot + DONE_VALUE] = done_value
        head += 1
        w[slot + SEQ] = head  # last: the slot is complete
        self._head = head
        w[HEAD] = head
        return True

    def call(
        self,
        call_id: int,
        done: SignalWord,
        done_value: int,
        ready: SignalWord | None = None,
        ready_value: int = 0,
        timeout: float | None = None,
        spin: float = 0.0,
    ) -> int:
        """A blocking call through the ring (docs/SERVICE.md "Blocking calls through a ring"):
        submits prepared call `call_id` (retried while the ring is full) and waits until `done`
        (a word of the ring's signal region that only this caller uses, below done_value now)
        reaches done_value, polling it without sleeping for `spin` seconds first (a core busy
        meanwhile). The word's value; AttndError ABORTED when it carries FAILURE_BIT,
        DEADLINE_EXCEEDED after `timeout` seconds (the call may still run later),
        FAILED_PRECONDITION when the ring is closed or errored before the daemon took the entry,
        UNAVAILABLE when the daemon stopped polling the open ring (its beat word still for
        DAEMON_SILENCE seconds: it exited or hangs). No RPC per call; nothing synchronises the caller's GPU stream: its inputs must be in
        place (or `ready` reached) when it runs."""
        if self.signals is None:
            raise ValueError(
                f"submission ring {self.ring_id}: its signal words are in region "
                f"{self.signal_name!r}, which this process does not poll: submit(), and wait for "
                "the done word on a stream (cuda_signals)"
            )
        for word, name in ((done, "done"), (ready, "ready")):
            if word is not None and word.region.name != self.signal_name:
                raise ValueError(
                    f"{name}: word of region {word.region.name!r}, not of the ring's signal "
                    f"region {self.signal_name!r}"
                )
        deadline = None if timeout is None else time.monotonic() + timeout
        ready_offset = None if ready is None else ready.offset
        while not self.submit(call_id, ready_offset, ready_value, done.offset, done_value):
            if deadline is not None and time.monotonic() >= deadline:
                raise AttndError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"submission ring {self.ring_id} stayed full for {timeout} s",
                )
            time.sleep(20e-6)
        seq = self._head
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        w = self._words

        def check() -> None:
            state = int(w[STATE])
            if state != STATE_OPEN and int(w[TAIL]) < seq:
                raise AttndError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"submission ring {self.ring_id} was closed or errored before the daemon "
                    "took the entry",
                )
            silent = self.silence()
            if silent is not None:
                raise AttndError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the daemon has not polled submission ring {self.ring_id} for "
                    f"{silent:.1f} s (it exited or hangs); done word {done.get()}",
                )

        return done.wait(done_value, timeout=left, spin=spin, check=check)

    def silence(self, now: float | None = None) -> float | None:
        """Seconds the daemon has not polled this open ring, once past DAEMON_SILENCE (it exited
        or hangs); None otherwise. The beat seen last and when it moved are the ring's, kept
        across calls: after the daemon died, the first look one silence after the last move
        reports it. A daemon that never beats (an older one) leaves the word at 0: never."""
        now = time.monotonic() if now is None else now
        b, beat = int(self._words[BEAT]), self._beat
        if b != beat[0] or beat[1] is None:
            beat[0], beat[1] = b, now
            return None
        if self._words[STATE] == STATE_OPEN and b and now - beat[1] > DAEMON_SILENCE:
            return now - beat[1]
        return None

    @property
    def submitted(self) -> int:
        return self._head

    @property
    def taken(self) -> int:
        """Entries the daemon has taken off the ring (its tail word)."""
        return int(self._words[TAIL])

    @property
    def beat(self) -> int:
        """The daemon's beat word: advanced while its poller polls this ring (0 before)."""
        return int(self._words[BEAT])

    @property
    def state(self) -> int:
        """STATE_OPEN, STATE_CLOSED or STATE_ERRORED (the daemon's state word)."""
        return int(self._words[STATE])

    def close(self, timeout: float | None = None) -> None:
        """CloseRing (idempotent; also quiet when the daemon closed the ring already: a region it
        uses unregistered, its lease over, a protocol error, which CloseRing answers NOT_FOUND).
        Entries the daemon took already still run."""
        if self._open:
            self._open = False
            try:
                self.owner.close_ring(self.ring_id, timeout)
            except AttndError as e:
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise

    def __enter__(self) -> SubmissionRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_caller_names = itertools.count()


class RingCallerFactory:
    """ring_caller() for the objects a RingCaller runs on (the Client, through
    stream_ordered.StreamOrderedClient, and a Session): each provides the open_ring / prepared-call
    methods RingCaller uses."""

    def ring_caller(self, entries: int = 16, spin: float = 5e-4, driver: Any = None) -> RingCaller:
        """Blocking calls through a submission ring of their own (RingCaller): a region and a
        ring set up here, then caller.run(call_id) per call without an RPC. `driver`:
        cuda_signals' CUDA driver for run(stream=...) (tests; None: libcuda)."""
        return RingCaller(self, entries=entries, spin=spin, driver=driver)

    def ordered_caller(self, **options: Any) -> Any:
        """Stream-ordered calls with the bookkeeping done (ordered.OrderedCaller: prepared calls
        cached by their arguments, a ring, ready and done words the caller's CUDA stream writes
        and waits on); `options` are OrderedCaller's (entries, depth, max_prepared, timeout,
        spin, driver)."""
        from .ordered import OrderedCaller

        return OrderedCaller(self, **options)


class RingCaller:
    """Blocking calls through a submission ring of the caller's own (docs/SERVICE.md "Blocking
    calls through a ring"): one host region holding a ring, a done word and a ready word, set up
    once (two RPCs); run() then runs a prepared call and returns once it is over (its outputs in
    place), with no RPC per call. One thread at a time.

        caller = client.ring_caller()             # or session.ring_caller(): the Session's queue
        call_id = client.prepare_call("sparse_mla", **tensors_in_regions)
        caller.run(call_id)                       # as client.run_prepared(call_id), no RPC
        caller.run(call_id, stream=torch.cuda.current_stream().cuda_stream)  # no synchronize
        caller.close()

    run() polls the done word without sleeping for `spin` seconds (a core busy meanwhile), then
    every 50 µs. Without `stream` nothing synchronises the caller's GPU work: its inputs must be
    complete. With `stream` (a CUstream handle) that stream writes the ready word after what it
    has queued (cuda_signals.StreamSignals; the region is registered with CUDA on first use) and
    the daemon starts the call when it sees it: the thread still waits for the call, never for
    the whole device."""

    def __init__(
        self,
        owner: Any,
        entries: int = 16,
        spin: float = 5e-4,
        timeout: float = 60.0,
        driver: Any = None,
    ):
        from .stream_ordered import SignalWord

        if entries < 1 or entries > MAX_ENTRIES or entries & (entries - 1):
            raise ValueError(f"entries: {entries} is not a power of two from 1 to {MAX_ENTRIES}")
        if spin < 0:
            raise ValueError("spin must be >= 0")
        self.spin = float(spin)
        self.calls = 0  # run() calls so far (the done and ready words' latest value)
        self._driver = driver  # cuda_signals' driver (tests); None: libcuda when first needed
        self._signals: Any = None
        name = f"ring-caller-{os.getpid()}-{next(_caller_names)}"
        words = ring_bytes(entries)
        self.region = owner.create_host_region(name, words + 128)
        try:
            self.ring = owner.open_ring(self.region, offset=0, entries=entries, timeout=timeout)
            self.done = SignalWord(self.region, words)  # each word on a line of its own
            self.ready = SignalWord(self.region, words + 64)
        except BaseException:
            self.region.close()
            raise

    def run(self, call_id: int, timeout: float | None = None, stream: int | None = None) -> None:
        """Runs prepared call `call_id` once the caller's earlier calls on the same ordered queue
        are over (and, with `stream`, once that stream has run what it has queued so far) and
        waits for it. AttndError ABORTED when it failed, DEADLINE_EXCEEDED after `timeout`
        seconds (it may still run: the next run() waits behind it), FAILED_PRECONDITION when
        the ring was closed (e.g. its Session ended), UNAVAILABLE when the daemon is gone."""
        if self.ring is None:
            raise AttndError(grpc.StatusCode.FAILED_PRECONDITION, "RingCaller: closed")
        # Each run waits for values of its own: a call that timed out and ends later cannot end
        # a later run's wait.
        self.calls += 1
        n = self.calls
        if stream is None:
            self.ring.call(call_id, self.done, n, timeout=timeout, spin=self.spin)
            return
        if self._signals is None:
            from .cuda_signals import StreamSignals

            self._signals = StreamSignals(self.region, driver=self._driver)
        self._signals.write(self.ready, n, int(stream))
        self.ring.call(
            call_id, self.done, n, ready=self.ready, ready_value=n, timeout=timeout, spin=self.spin
        )

    def close(self) -> None:
        """Closes the ring, then unregisters the region (idempotent; errors of an ended
        Session's lease are ignored)."""
        if self.ring is not None:
            ring, self.ring = self.ring, None
            try:
                ring.close()
            except AttndError:
                pass  # the lease that held it has ended
        if self._signals is not None:
            signals, self._signals = self._signals, None
            signals.close()
        if self.region is not None:
            region, self.region = self.region, None
            try:
                region.close()
            except AttndError:
                pass

    def __enter__(self) -> RingCaller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_request(
    region: HostRegion, offset: int, entries: int, signals: HostRegion | str | None, lease_id: str
) -> Any:
    from ._proto import pb

    if offset < 0 or offset + ring_bytes(entries) > region.byte_size:
        raise ValueError(
            f"region {region.name!r}: a ring of {entries} entries ({ring_bytes(entries)} bytes) "
            f"at offset {offset} does not fit in {region.byte_size}"
        )
    if isinstance(signals, str) and not signals:
        raise ValueError("signals: an empty region name (None: the ring's own region)")
    return pb.OpenRingRequest(
        lease_id=lease_id,
        region=region.name,
        offset=offset,
        entries=entries,
        signal_region=signals_name(region, signals),
    )


def signals_name(region: HostRegion, signals: HostRegion | str | None) -> str:
    """The name of the region holding a ring's signal words: `signals` given by name or as a
    HostRegion, else the ring's own `region`."""
    if isinstance(signals, str):
        return signals
    return (signals if signals is not None else region).name
