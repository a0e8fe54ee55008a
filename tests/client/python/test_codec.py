"""attnd_client.tensors and .ops without a daemon: inline encoding and dtype conversion, region
slices found from array addresses (offsets, strides, refusals), output placements, reply
decoding with strides, and the op table against the generated proto."""

import numpy as np
import pytest

import attnd_client as ac
from attnd_client import ops, tensors
from attnd_client._proto import pb


class FakeRegions:
    """A 'registered' region over a NumPy buffer."""

    def __init__(self, nbytes=1 << 16, name="r"):
        self.buffer = np.zeros(nbytes, np.uint8)
        self.name = name
        self.start = tensors.array_address(self.buffer)

    def find(self, address, nbytes):
        if self.start <= address and address + nbytes <= self.start + self.buffer.size:
            return self.name, self.start
        return None

    def view(self, offset, dtype, shape):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.buffer[offset : offset + n].view(dtype).reshape(shape)


def test_inline_inputs_convert_to_the_fields_dtype():
    codec = tensors.TensorCodec(lambda a, n: None)
    t = codec.encode_input("q", np.ones((2, 3), np.float64), "bf16")
    assert (t.dtype, list(t.shape), t.WhichOneof("data")) == (pb.DTYPE_BF16, [2, 3], "inline_data")
    assert np.frombuffer(t.inline_data, np.uint16).tolist() == [0x3F80] * 6
    t = codec.encode_input("k", np.full(4, 2.0), "fp8_e4m3")
    assert t.inline_data == bytes([0x40] * 4)
    t = codec.encode_input("x", ac.typed(np.array([7], np.uint8), "u8"), "fp8_e4m3")
    assert t.dtype == pb.DTYPE_U8
    t = codec.encode_input("ks", np.arange(3, dtype=np.int64), "i32")
    assert np.frombuffer(t.inline_data, np.int32).tolist() == [0, 1, 2]
    strided = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    t = codec.encode_input("w", strided, "f32")
    assert (
        not t.strides
        and np.frombuffer(t.inline_data, np.float32).tolist() == strided.ravel().tolist()
    )
    with pytest.raises(ValueError):
        codec.encode_input("ks", np.array([2**40]), "i32")
    with pytest.raises(ValueError):
        codec.encode_input("s", np.float32(1.0), "f32")  # rank 0


def test_region_views_become_slices():
    regions = FakeRegions()
    codec = tensors.TensorCodec(regions.find)
    kv = regions.view(128, np.uint16, (10, 640))
    t = codec.encode_input("kv", kv[:, :576], "bf16")
    assert t.WhichOneof("data") == "region"
    assert (t.region.region, t.region.offset) == ("r", 128)
    assert list(t.shape) == [10, 576] and list(t.strides) == [640, 1]
    t = codec.encode_input("kv", kv[2:], "bf16")
    assert t.region.offset == 128 + 2 * 640 * 2 and not t.strides
    t = codec.encode_input("kv", ac.typed(kv, inline=True), "bf16")
    assert t.WhichOneof("data") == "inline_data"
    # A non-contiguous last dimension is described (the daemon decides: lse takes it).
    t = codec.encode_input("kv", kv[:, ::2], "bf16")
    assert list(t.shape) == [10, 320] and list(t.strides) == [640, 2]
    with pytest.raises(ValueError, match="raw elements"):
        codec.encode_input("kv", regions.view(0, np.float32, (4,)), "bf16")
    outside = np.zeros(4, np.float32)
    assert codec.encode_input("x", outside, "f32").WhichOneof("data") == "inline_data"


def test_output_placements():
    regions = FakeRegions()
    codec = tensors.TensorCodec(regions.find)
    assert codec.encode_output("out", None, "bf16") == (None, None)
    t, sink = codec.encode_output("values", True, "f32")
    assert t == pb.Tensor() and sink is None
    view = regions.view(64, np.float32, (3, 5))
    t, sink = codec.encode_output("lse", view, "f32")
    assert t.region.offset == 64 and sink == ("view", view)
    mine = np.zeros((3, 5), np.float32)
    t, sink = codec.encode_output("lse", mine, "f32")
    assert t.WhichOneof("data") is None and list(t.shape) == [3, 5] and sink[1] is mine
    with pytest.raises(ValueError, match="dtype"):
        codec.encode_output("lse", np.zeros(3, np.float64), "f32")
    t, _ = codec.encode_output("logits", ac.Placement(shape=(2, 3), strides=(8, 1)), "f32")
    assert list(t.strides) == [8, 1] and t.dtype == pb.DTYPE_F32
    ref = ac.RegionRef("other", "i32", (4, 2), offset=16)
    t, _ = codec.encode_output("indices", ref, "i32")
    assert (t.region.region, t.region.offset, list(t.shape)) == ("other", 16, [4, 2])


def test_decode_tensor_with_strides():
    data = np.arange(2 * 8, dtype=np.float32)
    t = pb.Tensor(dtype=pb.DTYPE_F32, shape=[2, 5], strides=[8, 1], inline_data=data[:13].tobytes())
    got = tensors.decode_tensor(t)
    assert got.tolist() == [data[0:5].tolist(), data[8:13].tolist()]
    t = pb.Tensor(dtype=pb.DTYPE_BF16, shape=[3], inline_data=np.array([1, 2, 3], "<u2").tobytes())
    assert tensors.decode_tensor(t).dtype == np.uint16
    assert (
        tensors.decode_tensor(
            pb.Tensor(dtype=pb.DTYPE_F32, shape=[1], region=pb.RegionSlice(region="r"))
        )
        is None
    )


def test_op_table_matches_the_proto():
    for spec in ops.OPS.values():
        request = spec.request.DESCRIPTOR
        response = pb.DESCRIPTOR.message_types_by_name[spec.rpc + "Response"]
        for name in list(spec.inputs) + list(spec.outputs):
            assert request.fields_by_name[name].message_type.name == "Tensor", (spec.name, name)
        for name in spec.outputs:
            assert response.fields_by_name[name].message_type.name == "Tensor"
        tensor_fields = {f.name for f in request.fields if f.message_type is pb.Tensor.DESCRIPTOR}
        assert tensor_fields == set(spec.inputs) | set(spec.outputs), spec.name
        # The other message fields: the stream-ordered signals (stream_ordered.py sets them).
        others = {f.name for f in request.fields if f.message_type is not None} - tensor_fields
        assert others == {"ready", "done"}, spec.name
        scalar_fields = {f.name for f in request.fields if f.message_type is None}
        assert scalar_fields == set(spec.scalars), spec.name  # every option is reachable
        assert (
            pb.SessionRequest.DESCRIPTOR.fields_by_name[spec.session_field].message_type is request
        )
        assert pb.DESCRIPTOR.services_by_name["Attention"].methods_by_name[spec.rpc]


def test_build_request():
    codec = tensors.TensorCodec(lambda a, n: None)
    spec = ops.spec("topk")
    req, sinks = ops.build_request(
        spec,
        codec,
        {
            "logits": np.ones((2, 4), np.float32),
            "k": 2,
            "lengths": np.array([4, 1]),
            "values": True,
        },
    )
    assert req.k == 2 and req.HasField("values") and not req.HasField("indices")
    assert not req.HasField("ks") and sinks == {}
    with pytest.raises(TypeError, match="unknown"):
        ops.build_request(spec, codec, {"logit": 1})
    req, _ = ops.build_request(ops.spec("indexer_logits"), codec, {"clean_logits": False})
    assert req.HasField("clean_logits") and not req.clean_logits


def test_per_tensor_fp8_cache_request():
    # vLLM's kv_cache_dtype "fp8" MLA cache: uint8 e4m3 codes sent as u8, with kv_scale.
    codec = tensors.TensorCodec(lambda a, n: None)
    codes = np.arange(2 * 3 * 512, dtype=np.uint32).astype(np.uint8).reshape(2, 3, 512)
    req, _ = ops.build_request(
        ops.spec("mla_decode"),
        codec,
        {"kv_cache": codes, "kv_scale": 0.25, "kv_cache_layout": "fp8_512_per_tensor"},
    )
    assert req.kv_cache.dtype == pb.DTYPE_U8 and list(req.kv_cache.shape) == [2, 3, 512]
    assert req.kv_cache.inline_data == codes.tobytes()
    assert req.kv_scale == 0.25
    assert req.kv_cache_layout == pb.CACHE_LAYOUT_FP8_512_PER_TENSOR
    req, _ = ops.build_request(
        ops.spec("sparse_mla"),
        codec,
        {"kv": codes[0, :, :], "kv_scale": 2.0, "kv_layout": "FP8_512_PER_TENSOR"},
    )
    assert req.kv.dtype == pb.DTYPE_U8 and req.kv_scale == 2.0
    req, _ = ops.build_request(ops.spec("sparse_mla"), codec, {"sm_scale": 0.1})
    assert req.kv_scale == 0.0  # unset unless given
