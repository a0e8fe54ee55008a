"""The region error matrix of Triton's shared-memory tests, end to end through a real daemon with
the Python client: registration errors with their codes, slices out of range in op calls,
unregister while requests are in flight (they finish), unregister-all, and the shm-disabled and
device-region answers of a CPU daemon."""

import threading
import time

import grpc
import numpy as np
import pytest

import attnd_client as ac

import cases
import reference
from daemon import wait_until
from slow import SlowCall

U64_MAX = 2**64 - 1
PAGE = 4096


def code_of(fn, *args, **kwargs):
    with pytest.raises(ac.AttndError) as e:
        fn(*args, **kwargs)
    return e.value.code, e.value.details


@pytest.fixture
def shm():
    with ac.ShmObject(4 * PAGE) as obj:
        yield obj


def names(client):
    return {r.name for r in client.list_regions()}


def test_unregister_before_register_is_not_found(client):
    code, details = code_of(client.unregister_region, "never-registered")
    assert code == grpc.StatusCode.NOT_FOUND and "never-registered" in details


def test_register_list_unregister(client, shm):
    client.register_host_region("m-basic", shm.key, PAGE, offset=PAGE)
    info = {r.name: r for r in client.list_regions()}["m-basic"]
    assert (info.kind, info.key, info.offset, info.byte_size, info.in_flight) == (
        ac.pb.RegionInfo.KIND_HOST,
        shm.key,
        PAGE,
        PAGE,
        0,
    )
    assert client.unregister_region("m-basic") == ["m-basic"]
    assert "m-basic" not in names(client)
    code, _ = code_of(client.unregister_region, "m-basic")  # twice
    assert code == grpc.StatusCode.NOT_FOUND


def test_duplicate_name_already_exists(client, shm):
    client.register_host_region("m-dup", shm.key, PAGE)
    try:
        code, details = code_of(client.register_host_region, "m-dup", shm.key, PAGE, PAGE)
        assert code == grpc.StatusCode.ALREADY_EXISTS and "m-dup" in details
        # Device regions share the namespace.
        code, _ = code_of(client.register_device_region, "m-dup", b"\0" * 64, "GPU-x", PAGE)
        assert code in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNIMPLEMENTED)
    finally:
        client.unregister_region("m-dup")


@pytest.mark.parametrize(
    "offset,size,why",
    [
        (4 * PAGE, 1, "offset == size"),
        (4 * PAGE + 7, 1, "offset > size"),
        (3 * PAGE, 2 * PAGE, "offset + size past the end"),
        (0, 4 * PAGE + 1, "size past the object's size"),
        (U64_MAX, 2, "offset + size wraps 2^64"),
        (1, U64_MAX, "size wraps 2^64"),
        (2**63, PAGE, "offset past off_t"),
        (0, 0, "size 0"),
    ],
)
def test_bad_ranges_invalid_argument(client, shm, offset, size, why):
    code, details = code_of(client.register_host_region, "m-range", shm.key, size, offset)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (why, details)
    assert "m-range" not in names(client)


@pytest.mark.parametrize(
    "key,want",
    [
        ("/", grpc.StatusCode.INVALID_ARGUMENT),
        ("//", grpc.StatusCode.INVALID_ARGUMENT),
        ("///", grpc.StatusCode.INVALID_ARGUMENT),
        ("/a/b", grpc.StatusCode.INVALID_ARGUMENT),
        ("no-leading-slash", grpc.StatusCode.INVALID_ARGUMENT),
        ("", grpc.StatusCode.INVALID_ARGUMENT),
        ("/..", grpc.StatusCode.INVALID_ARGUMENT),
        ("/x\ty", grpc.StatusCode.INVALID_ARGUMENT),
        ("/" + "k" * 300, grpc.StatusCode.INVALID_ARGUMENT),
        ("/attnd-internal-pool", grpc.StatusCode.PERMISSION_DENIED),
        ("/attnd-no-such-object-9f1c", grpc.StatusCode.NOT_FOUND),
    ],
)
def test_bad_keys(client, key, want):
    code, details = code_of(client.register_host_region, "m-key", key, PAGE)
    assert code == want, details


def test_bad_names(client, shm):
    for name in ["", "x" * 300, "tab\there"]:
        code, _ = code_of(client.register_host_region, name, shm.key, PAGE)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, repr(name)


def test_slices_checked_in_op_calls(client, rng):
    case = cases.make_case("topk", rng)
    logits = case.inputs["logits"]
    with client.create_host_region("m-slice", logits.nbytes + PAGE) as region:
        size = region.byte_size
        shape = logits.shape
        for offset in [size, size - 4, U64_MAX - 3, 2**63]:
            args = case.arguments(logits=ac.RegionRef("m-slice", "f32", shape, offset=offset))
            code, details = code_of(client.call, "topk", **args)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "logits" in details, offset
        # Misaligned f32.
        args = case.arguments(logits=ac.RegionRef("m-slice", "f32", shape, offset=2))
        code, _ = code_of(client.call, "topk", **args)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        # Output slice past the end; strides whose span overflows.
        args = case.arguments(indices=ac.RegionRef("m-slice", "i32", (16, 64), offset=size - 8))
        code, details = code_of(client.call, "topk", **args)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "indices" in details
        args = case.arguments(logits=ac.RegionRef("m-slice", "f32", shape, 0, (2**62, 1)))
        code, _ = code_of(client.call, "topk", **args)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        # In range: works, and the region view equals the inline result.
        view = region.put(logits, "f32")
        res = client.topk(**case.arguments(logits=view), values=True)
        case.check(res.outputs)


def test_unregister_waits_for_in_flight_requests(client, rng):
    # Unregister must not return before the call that pins the region has ended. The pin goes
    # no earlier than `submitted` + the call's queue and compute time, so that is checked
    # exactly. The run proves something only when the call was still running as the
    # unregistration was sent (that bound > started); on a loaded machine the calibrated call may turn out short
    # and end first, and such a run is repeated with a longer call.
    for attempt in range(3):
        slow = SlowCall(client, "m-inflight", seconds=1.5 * (attempt + 1))
        submitted = time.monotonic()
        future = slow.submit()
        # Every one of its tensors pinned: the call has resolved them all (one pin per tensor).
        wait_until(lambda s=slow: s.in_flight() >= s.PINS, what="the slow call to pin its tensors")
        started = time.monotonic()
        removed = client.unregister_region(slow.region_name)  # blocks until the call ends
        returned = time.monotonic()
        assert removed == [slow.region_name]
        result = future.result(timeout=120)
        # The region stays pinned at least through the call's queueing and compute.
        busy = result.stats.queue_seconds + result.stats.compute_seconds
        call_end = submitted + busy  # a lower bound of when the pin went
        assert returned >= call_end - 1e-3, (
            f"unregister returned after {returned - started:.3f} s, before the call could end "
            f"(queued and computed for {busy:.3f} s)"
        )
        if call_end > started:
            break
        slow.close()
    else:
        pytest.fail("three calibrated calls all ended before their unregistration was sent")
    try:
        slow.check(result)  # the call finished correctly
        assert slow.region_name not in names(client)
        args = slow.arguments()  # the name is gone
        args["q"] = ac.RegionRef(slow.region_name, "bf16", args["q"].shape)
        code, _ = code_of(client.call, "sparse_mla", **args)
        assert code == grpc.StatusCode.NOT_FOUND
    finally:
        slow.close()


def test_unregister_during_call_name_reusable_at_once(client):
    slow = SlowCall(client, "m-reuse", seconds=1.5)
    try:
        future = slow.submit()
        wait_until(lambda: slow.in_flight() >= slow.PINS, what="every tensor pinned")
        done = threading.Event()
        waiter = threading.Thread(
            target=lambda: (client.unregister_region(slow.region_name), done.set())
        )
        waiter.start()
        wait_until(lambda: slow.region_name not in names(client), what="name removed")
        assert not done.is_set() and not future.done()
        with ac.ShmObject(PAGE) as other:  # the name can be taken again meanwhile
            client.register_host_region(slow.region_name, other.key, PAGE)
            client.unregister_region(slow.region_name)
        waiter.join(120)
        assert done.is_set()
        slow.check(future.result(timeout=120))
    finally:
        slow.close()


def test_unregister_all(client, daemon):
    objs = [ac.ShmObject(PAGE) for _ in range(3)]
    try:
        with client.session("keeps-its-region") as session:
            session_region = session.create_host_region("m-all-leased", PAGE)
            for i, obj in enumerate(objs):
                client.register_host_region(f"m-all-{i}", obj.key, PAGE)
            removed = client.unregister_region("")
            assert {f"m-all-{i}" for i in range(3)} <= set(removed)
            assert "m-all-leased" not in removed
            left = names(client)
            assert not any(n.startswith("m-all-") and n != "m-all-leased" for n in left)
            assert "m-all-leased" in left and session_region.registered
        wait_until(lambda: "m-all-leased" not in names(client), timeout=10, what="lease end")
        wait_until(
            lambda: not any(o.key[1:] in line for o in objs for line in daemon.shm_mappings()),
            what="unmapped",
        )
    finally:
        for obj in objs:
            obj.close()


def test_client_shm_disabled(make_daemon):
    d = make_daemon(allow_shm=False, tcp=False, metrics=False)
    c = d.client()
    with ac.ShmObject(PAGE) as obj:
        code, details = code_of(c.register_host_region, "m-off", obj.key, PAGE)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "allow-client-shm" in details
    assert not c.info().limits.allow_client_shm


def test_device_regions_on_cpu_daemon(client):
    """A CPU daemon has no device regions (UNIMPLEMENTED); a GPU daemon refuses the unknown device
    "GPU-x" (INVALID_ARGUMENT). Both check the handle's size and the range first."""
    code, _ = code_of(client.register_device_region, "m-dev", b"\1" * 63, "GPU-x", PAGE)
    assert code == grpc.StatusCode.INVALID_ARGUMENT  # handle must be exactly 64 bytes
    code, details = code_of(client.register_device_region, "m-dev", b"\1" * 64, "GPU-x", PAGE)
    if client.info().backend == "cpu":
        assert code == grpc.StatusCode.UNIMPLEMENTED and "GPU" in details
    else:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    code, _ = code_of(client.register_device_region, "m-dev", b"\1" * 64, "GPU-x", 2, U64_MAX)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "m-dev" not in names(client)


def test_region_reads_what_the_client_wrote_last(client, rng):
    """Zero-copy means the daemon sees later writes to the same region without re-registering."""
    case = cases.make_case("topk", rng)
    with client.create_host_region("m-live", 1 << 20) as region:
        view = region.put(case.inputs["logits"], "f32")
        first = client.topk(**case.arguments(logits=view), values=True)
        case.check(first.outputs)
        view[...] = -view
        second = client.topk(**case.arguments(logits=view), values=True)
        want_idx, want_val = reference.topk(
            np.array(view), case.scalars["k"], lengths=case.inputs["lengths"]
        )
        np.testing.assert_array_equal(second.indices, want_idx)
        np.testing.assert_array_equal(second.values, want_val)
