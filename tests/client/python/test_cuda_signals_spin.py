"""cuda_signals.StreamMemOps.spin_wait without CUDA: a fake driver records the module load (once
per context), the function lookup and the one-thread launch with the word's address, the value
and the sleep (docs/SERVICE.md "The gate's two forms" says when a frontend spins)."""

import pytest

from attnd_client.cuda_signals import CudaDriverError, StreamMemOps


class FakeSpinDriver:
    """The driver calls of StreamMemOps.spin_wait: a current context, a module from PTX text, its
    function and one launch; every call recorded."""

    def __init__(self, ctx=0x5000):
        self.ctx = ctx
        self.calls = []

    def ctx_current(self, out):
        out._obj.value = self.ctx
        return 0

    def module_load(self, out, ptx):
        self.calls.append(("load", self.ctx, b".entry attnd_spin_wait" in ptx))
        out._obj.value = 0x6000 + len(self.calls)
        return 0

    def module_function(self, out, module, name):
        self.calls.append(("function", module.value, name))
        out._obj.value = 0x7000 + module.value
        return 0

    def launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        import ctypes

        values = [
            ctypes.cast(params[0], ctypes.POINTER(ctypes.c_uint64))[0],
            ctypes.cast(params[1], ctypes.POINTER(ctypes.c_uint64))[0],
            ctypes.cast(params[2], ctypes.POINTER(ctypes.c_uint32))[0],
        ]
        self.calls.append(
            ("launch", fn.value, (gx, gy, gz, bx, by, bz, smem), stream.value, values)
        )
        return 0


def test_spin_wait_loads_the_kernel_once_per_context_and_launches_one_thread():
    drv = FakeSpinDriver()
    ops = StreamMemOps(drv)
    ops.spin_wait(0x7F0000001008, 3, 0x1234)
    ops.spin_wait(0x7F0000001010, (1 << 64) - 1, 0x1234, sleep_ns=500)
    drv.ctx = 0x5100  # another context: the module again
    ops.spin_wait(0x7F0000001018, 4, 0)
    loads = [c for c in drv.calls if c[0] == "load"]
    assert loads == [("load", 0x5000, True), ("load", 0x5100, True)]
    launches = [c for c in drv.calls if c[0] == "launch"]
    assert [c[2] for c in launches] == [(1, 1, 1, 1, 1, 1, 0)] * 3
    assert [c[3] for c in launches] == [0x1234, 0x1234, None]  # stream 0 goes as NULL
    assert [c[4] for c in launches] == [
        [0x7F0000001008, 3, 64],
        [0x7F0000001010, (1 << 64) - 1, 500],
        [0x7F0000001018, 4, 64],
    ]
    assert launches[0][1] == launches[1][1] != launches[2][1]


def test_spin_wait_needs_a_current_context():
    ops = StreamMemOps(FakeSpinDriver(ctx=0))
    with pytest.raises(CudaDriverError, match="no CUDA context"):
        ops.spin_wait(8, 1, 0)
