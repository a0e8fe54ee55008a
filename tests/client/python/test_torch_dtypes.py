"""CPU torch tensors as op arguments (skipped without torch): each goes as the attnd dtype its
torch dtype names, also for the fields that take alternatives (kv, kv_cache: bf16 or u8) where a
uint8 / float8_e4m3fn tensor once fell back to bf16 (its bytes converted to twice as many), and
through build_request as Client, Session and the stream-ordered calls use it."""

import numpy as np
import pytest

from attnd_client import dtypes, ops, tensors
from attnd_client._proto import pb

torch = pytest.importorskip("torch")
FP8 = getattr(torch, "float8_e4m3fn", None)


def codec():
    return tensors.TensorCodec(lambda address, nbytes: None)


def build(op, **arguments):
    return ops.build_request(ops.spec(op), codec(), arguments)[0]


def random_bytes(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


@pytest.mark.parametrize(("op", "field"), [("sparse_mla", "kv"), ("mla_decode", "kv_cache")])
def test_uint8_tensor_goes_as_u8_bytes(op, field):
    codes = random_bytes(3, 4, 656) if field == "kv_cache" else random_bytes(5, 656)
    t = getattr(build(op, **{field: codes}), field)
    assert t.dtype == pb.DTYPE_U8
    assert list(t.shape) == list(codes.shape)
    assert len(t.inline_data) == codes.numel()  # one byte each, not a bf16 per byte
    assert t.inline_data == codes.numpy().tobytes()


@pytest.mark.skipif(FP8 is None, reason="torch without float8_e4m3fn")
def test_float8_tensor_goes_as_u8_bits():
    codes = random_bytes(5, 512, seed=1)
    fp8 = codes.view(FP8)
    t = build("sparse_mla", kv=fp8, kv_layout="fp8_512_per_tensor", kv_scale=0.5).kv
    assert t.dtype == pb.DTYPE_U8
    assert len(t.inline_data) == codes.numel()
    assert t.inline_data == codes.numpy().tobytes()
    # An fp8 field takes it as fp8, its bits as they are.
    q = build("indexer_logits", q=fp8.reshape(5, 4, 128)).q
    assert q.dtype == pb.DTYPE_FP8_E4M3 and q.inline_data == codes.numpy().tobytes()


def test_bf16_tensor_stays_bf16():
    x = torch.randn(6, 576, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    t = build("sparse_mla", kv=x).kv
    assert t.dtype == pb.DTYPE_BF16
    assert len(t.inline_data) == x.numel() * 2
    assert t.inline_data == x.view(torch.int16).numpy().tobytes()
    t = build("mla_decode", kv_cache=x.reshape(2, 3, 576)).kv_cache
    assert t.dtype == pb.DTYPE_BF16 and t.inline_data == x.view(torch.int16).numpy().tobytes()


def test_f32_tensor_for_an_alternatives_field_converts_to_the_default():
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(3))
    t = build("sparse_mla", kv=x).kv
    assert t.dtype == pb.DTYPE_BF16
    assert t.inline_data == dtypes.to_bf16(x.numpy()).tobytes()


def test_other_storage_converts_by_value():
    # A bf16 tensor for an f32 field (and fp8 for a bf16 one) goes by value, not as its bits.
    g = torch.Generator().manual_seed(4)
    w = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    t = build("indexer_logits", weights=w).weights
    assert t.dtype == pb.DTYPE_F32
    np.testing.assert_array_equal(
        np.frombuffer(t.inline_data, np.float32), w.float().numpy().ravel()
    )
    if FP8 is not None:
        q = (torch.randn(2, 16, 576, generator=g) * 4).to(FP8)
        t = build("sparse_mla", q=q).q
        assert t.dtype == pb.DTYPE_BF16
        want = dtypes.to_bf16(q.float().numpy())  # e4m3 values are exact in bf16
        assert t.inline_data == want.tobytes()


def test_i32_and_typed_tensors():
    idx = torch.arange(12, dtype=torch.int32).reshape(3, 4) - 1
    t = build("sparse_mla", indices=idx).indices
    assert t.dtype == pb.DTYPE_I32 and t.inline_data == idx.numpy().tobytes()
    codes = random_bytes(4, 576, seed=5)
    # typed() still wins: uint8 values sent as bf16 when asked.
    t = build("sparse_mla", kv=tensors.typed(codes, "bf16")).kv
    assert t.dtype == pb.DTYPE_BF16
    assert t.inline_data == dtypes.to_bf16(codes.numpy().astype(np.float32)).tobytes()
    # typed(..., inline=True) keeps the tensor's own dtype choice.
    t = build("sparse_mla", kv=tensors.typed(codes, inline=True)).kv
    assert t.dtype == pb.DTYPE_U8 and len(t.inline_data) == codes.numel()


def test_uint8_numpy_and_dlpack_choose_u8_too():
    codes = random_bytes(2, 656, seed=6)
    assert build("sparse_mla", kv=codes.numpy()).kv.dtype == pb.DTYPE_U8

    class DlpackOnly:
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, **kwargs):
            return self.x.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    t = build("sparse_mla", kv=DlpackOnly(codes)).kv
    assert t.dtype == pb.DTYPE_U8 and t.inline_data == codes.numpy().tobytes()
