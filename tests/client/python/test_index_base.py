"""TopK's index_base argument in the Python client (docs/CONTRACTS.md "topk"), without a daemon:
names to the proto enum, unset by default, unknown names refused before anything is sent."""

import numpy as np
import pytest

from attnd_client import ops, tensors
from attnd_client._proto import pb


def _request(**extra):
    codec = tensors.TensorCodec(lambda a, n: None)
    arguments = {
        "logits": np.ones((2, 8), np.float32),
        "k": 2,
        "ks": np.array([0, 3], np.int32),
        "ke": np.array([8, 6], np.int32),
    }
    return ops.build_request(ops.spec("topk"), codec, {**arguments, **extra})[0]


def test_index_base_names():
    assert _request().index_base == pb.TopKRequest.INDEX_BASE_UNSPECIFIED
    assert _request(index_base="absolute").index_base == pb.TopKRequest.INDEX_BASE_ABSOLUTE
    assert _request(index_base="row_start").index_base == pb.TopKRequest.INDEX_BASE_ROW_START


def test_unknown_index_base_refused():
    with pytest.raises(ValueError, match="index_base"):
        _request(index_base="relative")
