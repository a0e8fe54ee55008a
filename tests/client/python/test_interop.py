"""ml_dtypes arrays, DLPack inputs and the asyncio client's op table, without a daemon: bf16 /
fp8 e4m3fn arrays of ml_dtypes go as their raw bits and replies come back as them; DLPack
producers that are not NumPy arrays are read through numpy.from_dlpack; AsyncClient and Client
share one set of typed op methods and one request builder."""

import asyncio
import inspect

import numpy as np
import pytest

import attnd_client as ac
from attnd_client import aio, dtypes, ops, tensors
from attnd_client._proto import pb


class DlpackOnly:
    """A DLPack producer that is not a NumPy array (as a JAX or CuPy CPU array would be)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def codec():
    return tensors.TensorCodec(lambda a, n: None)


def test_dlpack_cpu_input_is_read_through_numpy():
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 5)).astype(np.float32)
    t = codec().encode_input("weights", DlpackOnly(x), "f32")
    assert (list(t.shape), t.dtype) == ([3, 5], pb.DTYPE_F32)
    np.testing.assert_array_equal(np.frombuffer(t.inline_data, np.float32).reshape(3, 5), x)
    # Converted for the field's dtype like any array: f32 -> bf16 bits.
    t = codec().encode_input("q", DlpackOnly(x), "bf16")
    assert np.frombuffer(t.inline_data, np.uint16).tolist() == dtypes.to_bf16(x).ravel().tolist()
    ids = np.arange(7, dtype=np.int32)
    assert codec().encode_input("ks", DlpackOnly(ids), "i32").inline_data == ids.tobytes()


def test_dlpack_on_a_device_without_torch_is_refused(monkeypatch):
    class OnCuda(DlpackOnly):
        def __dlpack_device__(self):
            return (tensors.DLPACK_CUDA, 0)

    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("no torch here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(ValueError, match="q: a DLPack tensor on device type 2 needs torch"):
        codec().encode_input("q", OnCuda(np.zeros(4, np.float32)), "bf16")


def test_raw_bits_path_without_ml_dtypes(monkeypatch):
    monkeypatch.setattr(dtypes, "_ML", {})
    reply = pb.Tensor(
        dtype=pb.DTYPE_BF16, shape=[2], inline_data=np.uint16([0x3F80, 0xC000]).tobytes()
    )
    out = tensors.decode_tensor(reply, values=True)
    assert out.dtype == np.uint16 and dtypes.from_bf16(out).tolist() == [1.0, -2.0]


@pytest.fixture
def ml_dtypes():
    return pytest.importorskip("ml_dtypes")


def test_ml_dtypes_inputs_go_as_their_bits(ml_dtypes):
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 6)).astype(np.float32)
    q = x.astype(ml_dtypes.bfloat16)
    t = codec().encode_input("q", q, "bf16")
    assert t.inline_data == q.view(np.uint16).tobytes()
    assert t.inline_data == dtypes.to_bf16(x).tobytes()  # same rounding as the hand codec
    k = (x * 10).astype(ml_dtypes.float8_e4m3fn)
    t = codec().encode_input("k", k, "fp8_e4m3")
    assert t.inline_data == k.view(np.uint8).tobytes()
    assert t.inline_data == dtypes.to_fp8_e4m3(x * 10).tobytes()
    # An ml_dtypes array for an f32 field is converted by value.
    t = codec().encode_input("weights", q, "f32")
    np.testing.assert_array_equal(
        np.frombuffer(t.inline_data, np.float32), q.astype(np.float32).ravel()
    )


def test_replies_come_back_as_ml_dtypes(ml_dtypes):
    bits = np.uint16([0x3F80, 0xC000, 0x7FC0])
    reply = pb.Tensor(dtype=pb.DTYPE_BF16, shape=[3], inline_data=bits.tobytes())
    out = tensors.decode_tensor(reply, values=True)
    assert out.dtype == ml_dtypes.bfloat16 and not out.flags.writeable
    assert out.astype(np.float32)[:2].tolist() == [1.0, -2.0] and np.isnan(float(out[2]))
    assert tensors.decode_tensor(reply).dtype == np.uint16  # the raw path stays
    fp8 = pb.Tensor(dtype=pb.DTYPE_FP8_E4M3, shape=[2], inline_data=bytes([0x38, 0x7E]))
    out = tensors.decode_tensor(fp8, values=True)
    assert out.dtype == ml_dtypes.float8_e4m3fn and out.astype(np.float32).tolist() == [1.0, 448.0]
    # The hand codecs take ml_dtypes arrays too (by their bits).
    assert dtypes.from_bf16(np.float32([1.5]).astype(ml_dtypes.bfloat16)).tolist() == [1.5]
    assert dtypes.from_fp8_e4m3(np.float32([-3.0]).astype(ml_dtypes.float8_e4m3fn)).tolist() == [
        -3.0
    ]


def test_output_arrays_of_ml_dtypes_receive_the_bits(ml_dtypes):
    out = np.full((2, 2), np.nan, np.float32).astype(ml_dtypes.bfloat16)
    placement, sink = codec().encode_output("out", out, "bf16")
    assert placement.dtype == pb.DTYPE_BF16 and sink[0] == "copy"
    values = np.float32([[1, 2], [3, -4]])
    response = pb.SparseMlaResponse(
        out=pb.Tensor(
            dtype=pb.DTYPE_BF16, shape=[2, 2], inline_data=dtypes.to_bf16(values).tobytes()
        )
    )
    result = ops.decode_response(ops.OPS["sparse_mla"], response, {"out": sink})
    assert result.out is out and out.astype(np.float32).tolist() == values.tolist()


# ---- the asyncio client ----


def test_async_and_sync_clients_share_the_op_methods():
    for name in ops.OPS:
        assert (
            getattr(aio.AsyncClient, name) is getattr(ac.Client, name) is getattr(ops.OpCalls, name)
        )
    assert inspect.iscoroutinefunction(aio.AsyncClient.call)


def test_async_op_call_builds_the_same_request():
    sent = []

    class FakeStub:
        async def TopK(self, request, timeout=None, metadata=None):  # noqa: N802 (the RPC's name)
            sent.append(request)
            indices = np.arange(6, dtype=np.int32).reshape(2, 3)
            return pb.TopKResponse(
                indices=pb.Tensor(dtype=pb.DTYPE_I32, shape=[2, 3], inline_data=indices.tobytes())
            )

    async def run():
        client = aio.AsyncClient("unix:/nonexistent/attnd.sock")
        client._stub = FakeStub()
        logits = np.random.default_rng().standard_normal((2, 8)).astype(np.float32)
        lengths = np.int32([8, 5])
        pending = client.topk(logits=logits, lengths=lengths, k=3)
        assert inspect.iscoroutine(pending)
        result = await pending
        await client.close()
        return logits, lengths, result

    logits, lengths, result = asyncio.run(run())
    want, _ = ops.build_request(
        ops.OPS["topk"], codec(), {"logits": logits, "lengths": lengths, "k": 3}
    )
    assert sent == [want]
    assert result.indices.tolist() == [[0, 1, 2], [3, 4, 5]]
