"""TopK's request-of-a-row arguments in the Python client (docs/CONTRACTS.md "topk"), without a
daemon: req_id_per_row and cu_seqlens_q travel as i32 tensors, block_stride as the scalar, and
unset arguments leave the fields unset."""

import numpy as np

from attnd_client import ops, tensors


def _request(**extra):
    codec = tensors.TensorCodec(lambda a, n: None)
    arguments = {
        "logits": np.ones((3, 8), np.float32),
        "k": 2,
        "lengths": np.array([8, 3, 5], np.int32),
        "block_table": np.arange(4, dtype=np.int32).reshape(2, 2),
        "page_size": 4,
    }
    return ops.build_request(ops.spec("topk"), codec, {**arguments, **extra})[0]


def _ints(t):
    return np.frombuffer(t.inline_data, np.int32).tolist()


def test_unset_by_default():
    r = _request()
    assert not r.HasField("req_id_per_row")
    assert not r.HasField("cu_seqlens_q")
    assert r.block_stride == 0


def test_req_id_per_row_and_block_stride():
    r = _request(req_id_per_row=np.array([1, 0, 1], np.int32), block_stride=8)
    assert list(r.req_id_per_row.shape) == [3]
    assert _ints(r.req_id_per_row) == [1, 0, 1]
    assert r.block_stride == 8


def test_cu_seqlens_q():
    r = _request(cu_seqlens_q=np.array([0, 1, 3], np.int32))
    assert list(r.cu_seqlens_q.shape) == [3]
    assert _ints(r.cu_seqlens_q) == [0, 1, 3]
