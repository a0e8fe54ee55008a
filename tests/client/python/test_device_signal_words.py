"""Signal words in a device region without CUDA (skipped without torch): DeviceRegionCache's
region_slice() and signal() take any dtype (int64 / uint64 / uint8 word buffers) while ref()
keeps refusing a dtype attnd has none of; the word buffer is synchronised once, when it is
registered, never on later calls; cuda_signals.StreamMemOps hands the driver the address, value
and flags (a fake driver stands in for libcuda). CPU tensors stand in for CUDA ones through an
injected share function, as in test_device_region_cache.py."""

import pytest

torch = pytest.importorskip("torch")

from attnd_client import torch_support  # noqa: E402
from attnd_client.cuda_signals import (  # noqa: E402
    CU_STREAM_WAIT_VALUE_GEQ,
    CU_STREAM_WRITE_VALUE_DEFAULT,
    CudaDriverError,
    StreamMemOps,
)
from attnd_client.stream_ordered import Signal  # noqa: E402
from attnd_client.torch_support import DeviceRegionCache  # noqa: E402


class Registrar:
    def __init__(self):
        self.registered = []

    def device_uuids(self):
        return ["GPU-fake"]

    def register_device_region(self, **kwargs):
        self.registered.append(kwargs)

    def unregister_region(self, name):
        return [name]


def share(storage):
    handle = storage.data_ptr().to_bytes(8, "little") * 8
    return (0, handle, storage.nbytes(), 0, b"ref", 0, b"ev", False)


def make():
    registrar, syncs = Registrar(), []
    cache = DeviceRegionCache(
        registrar, share=share, device_uuid=lambda d: "fake", synchronize=syncs.append
    )
    return cache, registrar, syncs


def test_int64_words_region_slice_and_signals():
    cache, reg, syncs = make()
    words = torch.zeros(16, dtype=torch.int64)  # two words per cache line: 64-byte spacing = 8
    with pytest.raises(ValueError, match=r"torch\.int64 has no attnd dtype.*signal\(\)"):
        cache.ref(words)
    assert reg.registered == [] and syncs == [], "a refused ref() registers nothing"
    name, offset = cache.region_slice(words)
    assert name == reg.registered[0]["name"] and offset == 0
    assert reg.registered[0]["byte_size"] == 16 * 8
    assert syncs == [0], "the first use synchronises: the zeroed words are in place"
    ready, done = cache.signal(words[8], 7), cache.signal(words[9], 7)
    assert ready == Signal(name, 64, 7) and done == Signal(name, 72, 7)
    assert cache.region_slice(words[3:])[1] == 24
    assert len(reg.registered) == 1, "one region for the buffer"
    assert syncs == [0], "later calls (a stream-ordered loop) never synchronise"
    big = (1 << 63) | 5
    assert cache.signal(words[0], big).value == big


def test_first_use_inside_ordered_by_ready_does_not_synchronise():
    cache, reg, syncs = make()
    words = torch.zeros(4, dtype=torch.int64)
    with torch_support.ordered_by_ready():
        cache.signal(words[1], 1)
    assert syncs == [] and len(reg.registered) == 1


def test_ref_of_the_buffer_still_synchronises_each_call():
    # region_slice() only skips the synchronise that ref() keeps for op tensors.
    cache, _, syncs = make()
    t = torch.zeros(8, dtype=torch.int32)
    cache.ref(t)
    cache.region_slice(t)
    cache.ref(t)
    assert syncs == [0, 0]


@pytest.mark.skipif(not hasattr(torch, "uint64"), reason="torch without uint64")
def test_uint64_and_uint8_words():
    cache, _, _ = make()
    u64 = torch.zeros(4, dtype=torch.uint64)
    name, _ = cache.region_slice(u64)
    assert cache.signal(u64[2], 3) == Signal(name, 16, 3)
    u8 = torch.zeros(32, dtype=torch.uint8)  # tests/gpu/device_ordered_test.py's buffer
    name8, _ = cache.region_slice(u8)
    assert cache.signal(u8[8:16], 1) == Signal(name8, 8, 1)


def test_signal_rejects_what_is_not_one_aligned_word():
    cache, reg, _ = make()
    words = torch.zeros(8, dtype=torch.int64)
    with pytest.raises(ValueError, match="8 contiguous bytes"):
        cache.signal(words[:2], 1)
    with pytest.raises(ValueError, match="8 contiguous bytes"):
        cache.signal(torch.zeros(4, dtype=torch.int32)[1], 1)
    with pytest.raises(ValueError, match="8 contiguous bytes"):
        cache.signal(torch.zeros(4, 4, dtype=torch.int32)[:, 0][:2], 1)
    with pytest.raises(ValueError, match="not 8-byte aligned"):
        cache.signal(words.view(torch.uint8)[4:12], 1)
    assert reg.registered == [], "nothing registered for a refused word"


class FakeDriver:
    def __init__(self, result=0):
        self.calls = []
        self.result = result

    def write(self, stream, address, value, flags):
        self.calls.append(("write", stream.value, address, value, flags))
        return self.result

    def wait(self, stream, address, value, flags):
        self.calls.append(("wait", stream.value, address, value, flags))
        return self.result


def test_stream_mem_ops_pass_address_value_and_flags():
    drv = FakeDriver()
    ops = StreamMemOps(drv)
    ops.write(0x7F0000001000, 5, 0x1234)
    ops.wait(0x7F0000001008, (1 << 64) - 1, 0)
    assert drv.calls == [
        ("write", 0x1234, 0x7F0000001000, 5, CU_STREAM_WRITE_VALUE_DEFAULT),
        # stream 0 (the legacy default stream) goes as a NULL c_void_p
        ("wait", None, 0x7F0000001008, (1 << 64) - 1, CU_STREAM_WAIT_VALUE_GEQ),
    ]


def test_stream_mem_ops_raise_on_a_driver_error():
    ops = StreamMemOps(FakeDriver(result=1))
    with pytest.raises(CudaDriverError, match="cuStreamWriteValue64 failed: CUresult 1"):
        ops.write(8, 1, 0)
    with pytest.raises(CudaDriverError, match="cuStreamWaitValue64 failed: CUresult 1"):
        ops.wait(8, 1, 0)
