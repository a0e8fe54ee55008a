"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/) from the integration tests' cases
(tests/integration/cases.py), shrunk so that each seed is a few KiB and runs in microseconds.

    /usr/bin/python3 fuzz/make_seeds.py   # after a build (the Python client's generated stubs)

ops: one Session message per op call: the case inline, and its tensors placed in the fuzz
targets' regions ("h" host, "d" device, "g" misaligned host). regions and session: runs of
length-prefixed Session messages (fuzz/env.h ReadRequests) that open a lease, register host and
device regions, call an op on them, cancel and unregister; session also opens submission rings and
writes their words (the ring-write fields of fuzz/session_fuzz.cc, appended to a message's bytes).
Deterministic: the same files each run.
"""

import hashlib
import pathlib
import sys

import numpy as np
from google.protobuf.message import Message

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "client/python"), str(ROOT / "tests/integration")]

from attnd_client import ops  # noqa: E402
from attnd_client._proto import pb  # noqa: E402
from attnd_client.tensors import TensorCodec  # noqa: E402

import cases  # noqa: E402

# Small shapes the ops accept (the fixed head dimensions stay as the contracts want them).
SMALL = {
    "indexer_logits": dict(m=5, heads=2, dim=16, n=9),
    "indexer_logits_paged": dict(
        batch=3, next_n=1, heads=2, dim=16, block_size=4, max_blocks=3, num_blocks=9
    ),
    "topk": dict(m=5, n=40, k=8),
    "sparse_mla": dict(tokens=2, heads=1, rows=6, k=4),
    "mla_decode": dict(batch=3, s_q=1, heads=1, page=4, num_pages=6, max_pages=2),
    "mla_prefill": dict(lens_q=(2, 3), lens_k=(3, 3), heads=2, heads_kv=1, d_qk=32, d_v=16),
    "dsa_attention": dict(tokens=2, heads_idx=2, dim_idx=16, rows=8, topk_k=4, heads=1),
}
HOST_REGION_BYTES = 256 << 10  # fuzz/env.h: "h" is all of shm object @0
DEVICE_REGION_BYTES = 256 << 10


def op_request(op: str) -> tuple[ops.OpSpec, Message]:
    case = cases.make_case(op, np.random.default_rng(7), **SMALL[op])
    spec = ops.spec(op)
    codec = TensorCodec(lambda address, nbytes: None)
    request, _ = ops.build_request(spec, codec, case.arguments(**cases.inline_outputs(case)))
    return spec, request


def placed(spec: ops.OpSpec, request: Message, region: str, limit: int) -> Message:
    """The request with every inline tensor moved into `region` (outputs placed there too)."""
    out = type(request)()
    out.CopyFrom(request)
    offset = 0
    for name in list(spec.inputs) + list(spec.outputs):
        if not out.HasField(name):
            continue
        t = getattr(out, name)
        size = len(t.inline_data) if name in spec.inputs else 1 << 12
        if offset + size > limit:
            continue
        t.ClearField("inline_data")
        t.region.region, t.region.offset = region, offset
        offset += (size + 63) // 64 * 64
    return out


def session_message(spec: ops.OpSpec, request: Message, request_id: int = 0) -> Message:
    m = pb.SessionRequest(request_id=request_id)
    getattr(m, spec.session_field).CopyFrom(request)
    return m


def varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


# The ring writes of fuzz/session_fuzz.cc (kRing*): fields SessionRequest does not define.
RING_AT, RING_WORD, RING_SLOT, RING_HEAD, RING_SUBMIT, RING_WAIT = range(1000, 1006)


def ring_write(field: int, *values: int) -> bytes:
    """One ring write: a varint field for one value, else packed varints."""
    if field in (RING_SLOT, RING_SUBMIT):
        payload = b"".join(varint(v) for v in values)
        return varint(field << 3 | 2) + varint(len(payload)) + payload
    return varint(field << 3) + varint(values[0])


def with_writes(m: Message, *writes: bytes) -> bytes:
    """The message's bytes followed by ring writes (parsed as unknown fields)."""
    return m.SerializeToString() + b"".join(writes)


def stream(messages: list[Message | bytes]) -> bytes:
    data = b""
    for m in messages:
        raw = m if isinstance(m, bytes) else m.SerializeToString()
        n = len(raw)
        while True:  # varint length
            byte, n = n & 0x7F, n >> 7
            data += bytes([byte | (0x80 if n else 0)])
            if not n:
                break
        data += raw
    return data


def write(target: str, data: bytes) -> None:
    folder = ROOT / "fuzz/corpus" / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def main() -> None:
    for op in SMALL:
        spec, request = op_request(op)
        write("ops", session_message(spec, request).SerializeToString())
        for region, limit in (("h", HOST_REGION_BYTES), ("d", DEVICE_REGION_BYTES), ("g", 1000)):
            write(
                "ops",
                session_message(spec, placed(spec, request, region, limit)).SerializeToString(),
            )

        opened = pb.SessionRequest(request_id=1, open=pb.SessionOpen(client_name="fuzz"))
        host = pb.SessionRequest(request_id=2)
        host.register_host_region.name, host.register_host_region.key = "h", "@0"
        host.register_host_region.byte_size = HOST_REGION_BYTES
        device = pb.SessionRequest(request_id=3)
        device.register_device_region.name = "d"
        device.register_device_region.raw_handle = b"d" * 64
        device.register_device_region.byte_size = DEVICE_REGION_BYTES
        call = session_message(spec, placed(spec, request, "h", HOST_REGION_BYTES), 4)
        inline = session_message(spec, request, 5)
        cancel = pb.SessionRequest(request_id=6)
        cancel.cancel.target_request_id = 5
        unregister = pb.SessionRequest(request_id=7)
        unregister.unregister_region.name = "h"
        write("session", stream([opened, host, device, call, inline, cancel, unregister]))
        # Stream-ordered and prepared calls (signal words at the end of "h", past the tensors):
        # one whose ready word is reached (>= 0), one that waits for a value never written (the
        # watchdog fails it), and a prepared call run blocking and stream-ordered, then released.
        tensors = placed(spec, request, "h", HOST_REGION_BYTES - 4096)
        word = HOST_REGION_BYTES - 64

        def signal(offset: int, value: int) -> Message:
            return pb.Signal(slice=pb.RegionSlice(region="h", offset=offset), value=value)

        ordered = session_message(spec, tensors, 8)
        getattr(ordered, spec.session_field).ready.CopyFrom(signal(word, 0))
        getattr(ordered, spec.session_field).done.CopyFrom(signal(word + 8, 1))
        waiting = session_message(spec, tensors, 9)
        getattr(waiting, spec.session_field).ready.CopyFrom(signal(word, 1 << 40))
        getattr(waiting, spec.session_field).done.CopyFrom(signal(word + 16, 2))
        prepare = pb.SessionRequest(request_id=10)
        getattr(prepare.prepare_call, spec.session_field).CopyFrom(tensors)
        run = pb.SessionRequest(request_id=11, run_prepared=pb.RunPreparedRequest(call_id=1))
        run_ordered = pb.SessionRequest(request_id=12)
        run_ordered.run_prepared.call_id = 1
        run_ordered.run_prepared.ready.CopyFrom(signal(word, 0))
        run_ordered.run_prepared.done.CopyFrom(signal(word + 24, 3))
        release = pb.SessionRequest(request_id=13, release_call=pb.ReleaseCallRequest(call_id=1))
        write(
            "session",
            stream(
                [opened, host, ordered, waiting, prepare, run, run_ordered, release, unregister]
            ),
        )
        if op in ("sparse_mla", "topk"):
            write("session", ring_stream(opened, host, prepare, release))
        if op == "sparse_mla":
            # A stream-ordered call that pins "s" until its ready word times out.
            pinning = session_message(spec, tensors, 30)
            getattr(pinning, spec.session_field).ready.CopyFrom(
                pb.Signal(
                    slice=pb.RegionSlice(region="s", offset=RING_SIGNALS), value=(1 << 64) - 1
                )
            )
            getattr(pinning, spec.session_field).done.CopyFrom(
                pb.Signal(slice=pb.RegionSlice(region="s", offset=RING_SIGNALS + 8), value=1)
            )
            for data in ring_edge_streams(opened, host, prepare, pinning):
                write("session", data)
            leased = pb.SessionRequest()
            leased.CopyFrom(host)
            leased.register_host_region.lease_id = "L0"
            small = pb.SessionRequest()
            small.register_host_region.name, small.register_host_region.key = "s", "@2"
            small.register_host_region.offset, small.register_host_region.byte_size = 4095, 905
            release = pb.SessionRequest(request_id=9, top_k=pb.TopKRequest())
            unleased = pb.SessionRequest()
            unleased.unregister_region.lease_id = "L0"
            write(
                "regions",
                stream([opened, leased, device, small, call, unregister, release, unleased]),
            )
            write("regions", stream([host, device, call, cancel, unregister]))


# Submission rings in the session target: the ring and its signal words in "s" (all of @1, 4096
# bytes, which no tensor names, so that the target checks every done word), the prepared call's
# tensors in "h"; call_id 1 is the call `prepare` makes.
RING_SIGNALS = 1024  # signal words in "s": ready at +0, done words from +8


def register_signals(request_id: int = 20) -> Message:
    m = pb.SessionRequest(request_id=request_id)
    m.register_host_region.name, m.register_host_region.key = "s", "@1"
    m.register_host_region.byte_size = 4096
    return m


def open_ring(entries: int, offset: int = 0, request_id: int = 21) -> Message:
    return pb.SessionRequest(
        request_id=request_id,
        open_ring=pb.OpenRingRequest(region="s", offset=offset, entries=entries),
    )


def entry(
    call_id: int, done: int, value: int, ready: int | None = None, flags: int = 0
) -> tuple[int, ...]:
    """A slot's fields: the ready word at RING_SIGNALS (value `ready`), done at RING_SIGNALS + done."""
    if ready is not None:
        flags |= 1
    return (call_id, RING_SIGNALS, ready or 0, RING_SIGNALS + done, value, flags)


def ring_stream(opened: Message, host: Message, prepare: Message, release: Message) -> bytes:
    """Entries run in order: two good ones (with and without a ready word), then one with an
    unknown flag and one naming no prepared call (both refused: failure bit), then CloseRing."""
    ring = with_writes(
        open_ring(4),
        ring_write(RING_SUBMIT, *entry(1, 8, 7, ready=0)),
        ring_write(RING_SUBMIT, *entry(1, 16, 8)),
        ring_write(RING_WAIT, 2000),
    )
    bad = with_writes(
        pb.SessionRequest(request_id=22),
        ring_write(RING_SUBMIT, *entry(1, 24, 9, flags=2)),
        ring_write(RING_SUBMIT, *entry(99, 32, 10)),
        ring_write(RING_SUBMIT, *entry(1, 40, 11, ready=0)),
        ring_write(RING_WAIT, 2000),
    )
    close = pb.SessionRequest(request_id=23, close_ring=pb.CloseRingRequest(ring_id=1))
    return stream([opened, host, register_signals(), prepare, ring, bad, close, release])


def ring_edge_streams(
    opened: Message, host: Message, prepare: Message, pinning: Message
) -> list[bytes]:
    never = (1 << 64) - 1  # a ready value no word of @1 reaches
    # Head overrun: head 5 on a ring of 2 errors it; a second ring opens on the same bytes.
    overrun = stream(
        [
            opened,
            host,
            register_signals(),
            prepare,
            with_writes(
                open_ring(2),
                ring_write(RING_SLOT, 0, *entry(1, 8, 1)),
                ring_write(RING_HEAD, 5),
                ring_write(RING_WAIT, 500),
            ),
            with_writes(
                open_ring(2, request_id=22),
                ring_write(RING_SUBMIT, *entry(1, 16, 2)),
                ring_write(RING_WAIT, 2000),
            ),
        ]
    )
    # Slots rewritten while the poller reads them: entry 0 written, published, rewritten at once;
    # a slot with a stale seq; raw words over the header and a slot (the cursor moves on).
    rewrite = stream(
        [
            opened,
            host,
            register_signals(),
            prepare,
            with_writes(
                open_ring(8),
                ring_write(RING_SLOT, 0, *entry(1, 8, 1)),
                ring_write(RING_HEAD, 1),
                ring_write(RING_SLOT, 0, *entry(1, 16, 2, ready=0)),
                ring_write(RING_SLOT, 1, *entry(1, 24, 3), 7),
                ring_write(RING_HEAD, 2),
                ring_write(RING_AT, 192 + 2 * 64),
                ring_write(RING_WORD, 3),
                ring_write(RING_WORD, 1),
                ring_write(RING_WORD, RING_SIGNALS),
                ring_write(RING_WORD, 0),
                ring_write(RING_WORD, RING_SIGNALS + 32),
                ring_write(RING_WORD, 4),
                ring_write(RING_WORD, 1),
                ring_write(RING_HEAD, 3),
                ring_write(RING_WAIT, 2000),
            ),
        ]
    )
    # Entries pending when their region goes: ready words never reached, then "s" unregistered
    # (the ring closes first; the calls fail at the signal timeout), and a ring left open at the end.
    unregister = pb.SessionRequest(request_id=23)
    unregister.unregister_region.name = "s"
    pending = stream(
        [
            opened,
            host,
            register_signals(),
            prepare,
            with_writes(
                open_ring(4),
                ring_write(RING_SUBMIT, *entry(1, 8, 1, ready=never)),
                ring_write(RING_SUBMIT, *entry(1, 16, 2)),
            ),
            unregister,
            register_signals(24),
            with_writes(
                open_ring(16, offset=2048, request_id=25),
                ring_write(RING_SUBMIT, *entry(1, 48, 5, ready=never)),
                ring_write(RING_SUBMIT, *entry(1, 56, 6)),
            ),
        ]
    )
    # "s" unregistered while a call pins it, registered again, a ring opened on the new "s": the
    # old region's unregistration completes (the call times out) while the ring is open.
    late = stream(
        [
            opened,
            host,
            register_signals(),
            prepare,
            pinning,
            unregister,
            register_signals(24),
            with_writes(
                open_ring(4, offset=2048, request_id=25),
                ring_write(RING_SUBMIT, *entry(1, 16, 2)),
                ring_write(RING_WAIT, 2000),
            ),
        ]
    )
    return [overrun, rewrite, pending, late]


if __name__ == "__main__":
    main()
