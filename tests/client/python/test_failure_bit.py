"""The failure bit of done words (docs/SERVICE.md "Failure bit"): bit 62, so that a GPU stream
waiting for done >= value, which the driver compares cyclically ((int64)(word - value) >= 0,
CU_STREAM_WAIT_VALUE_GEQ), also ends on a failed call's word value | FAILURE_BIT, as bit 63 would
not; SignalWord.wait raises ABORTED on it and returns any value below it. No daemon, no CUDA: a
numpy buffer stands in for the host region."""

import random

import grpc
import numpy as np
import pytest

import attnd_client as ac
from attnd_client.errors import AttndError
from attnd_client.stream_ordered import FAILURE_BIT, SignalWord

U64 = 1 << 64


def driver_geq(word: int, value: int) -> bool:
    """CU_STREAM_WAIT_VALUE_GEQ for 64-bit words, as cuda.h documents it."""
    diff = (word - value) % U64
    return diff < 1 << 63  # (int64)(word - value) >= 0


class FakeRegion:
    """What SignalWord needs of a HostRegion: a name, an address and aligned byte views."""

    name = "words"

    def __init__(self) -> None:
        self._buf = np.zeros(64, dtype=np.uint64)  # 8-byte aligned
        self.address = self._buf.__array_interface__["data"][0]
        self._next = 0

    def array(self, dtype: str, count: int, offset: int | None = None, align: int = 8):
        assert dtype == "u8" and count == 8 and align == 8 and offset is None
        view = self._buf[self._next : self._next + 1].view(np.uint8)
        self._next += 1
        return view


def test_failure_bit_is_bit_62_and_exported():
    assert FAILURE_BIT == 1 << 62
    assert ac.FAILURE_BIT == FAILURE_BIT


def test_a_stream_wait_ends_on_a_failed_calls_done_word():
    rng = random.Random()
    values = [0, 1, 7, FAILURE_BIT - 1] + [rng.randrange(FAILURE_BIT) for _ in range(1000)]
    for value in values:
        failed = value | FAILURE_BIT
        assert failed & FAILURE_BIT and not value & FAILURE_BIT, hex(value)
        assert driver_geq(failed, value), f"a stream waiting for {value:#x} hangs on {failed:#x}"
        assert driver_geq(value, value)
        # The bug bit 62 avoids: with bit 63 the driver never counts the word as reached.
        assert not driver_geq(value | 1 << 63, value), hex(value)


def test_signal_word_wait_raises_on_the_failure_bit():
    region = FakeRegion()
    word = SignalWord(region)
    word.set(7 | FAILURE_BIT)
    with pytest.raises(AttndError) as e:
        word.wait(7, timeout=1)
    assert e.value.code == grpc.StatusCode.ABORTED
    assert "done = 7 | FAILURE_BIT" in str(e.value)
    top = SignalWord(region)
    top.set(FAILURE_BIT - 1)  # the largest value a call may use
    assert top.wait(FAILURE_BIT - 1, timeout=1) == FAILURE_BIT - 1
    with pytest.raises(AttndError) as e:
        SignalWord(region).wait(1, timeout=0.01)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_an_earlier_calls_failure_does_not_end_a_later_wait():
    region = FakeRegion()
    word = SignalWord(region)
    word.set(7 | FAILURE_BIT)  # call 7 failed; call 8 has not stored yet
    with pytest.raises(AttndError) as e:
        word.wait(8, timeout=0.02)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    word.set(8)
    assert word.wait(8, timeout=1) == 8
    word.set(9 | FAILURE_BIT)
    with pytest.raises(AttndError) as e:
        word.wait(8, timeout=1)  # a later call failed: the wait for 8 is over, badly
    assert e.value.code == grpc.StatusCode.ABORTED
