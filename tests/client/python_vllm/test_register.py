"""attnd_vllm.register(): nothing without vLLM; with the stand-in vLLM package (fake_vllm/) the
out-of-tree indexer op and the CUSTOM backend are registered, and the swapped-in indexer runs a
step on a real CPU attnd from vLLM-shaped metadata."""

import importlib
import logging
import os
import sys
import tomllib
from types import SimpleNamespace

import attnd_vllm
import numpy as np
import pytest
from attnd_vllm import calls, mapping
from test_fixtures import (
    BF16_NAN,
    HEAD_DIM,
    Recording,
    check_attention,
    check_topk,
    fill_mla_cache,
    make_batch,
    make_decode_batch,
)
from vllm_layout import bf16_round, write_indexer_k, write_mla_fp8_ds

import attnd_client as ac

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_vllm")


def _forget_vllm():
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm.") or name == "attnd_vllm._vllm_glue":
            del sys.modules[name]
    attnd_vllm._registered = False


@pytest.fixture
def fake_vllm(monkeypatch):
    _forget_vllm()
    monkeypatch.syspath_prepend(FAKE)
    yield importlib.import_module("vllm")
    _forget_vllm()


def test_without_vllm_register_logs_and_returns(monkeypatch, caplog):
    _forget_vllm()
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with caplog.at_level(logging.INFO, logger="attnd_vllm"):
        assert attnd_vllm.register() is False
    assert "not importable" in caplog.text
    assert "attnd_vllm._vllm_glue" not in sys.modules


def test_register_with_vllm(fake_vllm):
    from vllm.model_executor.custom_op import CustomOp
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.v1.attention.backends import registry

    assert attnd_vllm.register() is True
    assert attnd_vllm.register() is True  # once only: a second call registers nothing again
    assert [name for name, _ in CustomOp.oot_calls] == ["SparseAttnIndexer"]
    op_cls = CustomOp.op_registry_oot["SparseAttnIndexer"]
    assert issubclass(op_cls, SparseAttnIndexer) and op_cls.__name__ == "AttndSparseAttnIndexer"
    path = registry.OVERRIDES[registry.AttentionBackendEnum.CUSTOM]
    assert path == attnd_vllm.BACKEND_CLASS_PATH
    module, _, name = path.rpartition(".")
    backend = getattr(importlib.import_module(module), name)
    assert backend.get_name() == "CUSTOM"
    assert backend.get_impl_cls().__name__ == "AttndSparseMLAImpl"
    assert backend.get_supported_kernel_block_sizes() == [64]


def test_swapped_indexer_runs_a_step(fake_vllm, daemon, client, rng, monkeypatch):
    """vLLM constructs SparseAttnIndexer(...); CustomOp hands back the attnd op, which writes
    the step's keys with vLLM's cache op and the top-k positions into vLLM's buffer."""
    from vllm import _custom_ops, forward_context
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    monkeypatch.setenv("ATTND_TARGET", daemon.unix_target)
    attnd_vllm.register()
    batch = make_batch(rng, (2, 2), [int(rng.integers(3, 30)), int(rng.integers(3, 30))])
    md = batch.indexer_metadata(chunk_reqs=[2])
    # The cache holds the context already; this step's keys arrive through the op.
    cache = rng.integers(0, 256, (batch.num_blocks, 64, HEAD_DIM + 4), dtype=np.uint8)
    cached = batch.all_slots()
    k_all = bf16_round(rng.normal(size=(len(cached), HEAD_DIM)).astype(np.float32))
    new = {int(s) for s in md.slot_mapping}
    old = np.array([s not in new for s in cached[:, 2]])
    write_indexer_k(cache, k_all[old], cached[old, 2], HEAD_DIM)
    by_slot = {int(s): i for i, s in enumerate(cached[:, 2])}
    k_new = k_all[[by_slot[int(s)] for s in md.slot_mapping]]

    topk = 32
    buf = np.full((batch.num_tokens + 2, topk), 7, np.int32)
    k_cache = SimpleNamespace(prefix="model.layers.0.indexer.k_cache", kv_cache=cache)
    op = SparseAttnIndexer(k_cache, HEAD_DIM, "ue8m0", topk, HEAD_DIM, 4096, 8192, buf)
    assert type(op).__name__ == "AttndSparseAttnIndexer"
    forward_context.CONTEXT.attn_metadata = {k_cache.prefix: md}
    try:
        q_fp8 = ac.to_fp8_e4m3(rng.normal(size=(batch.num_tokens, 4, HEAD_DIM)))
        weights = rng.normal(size=(batch.num_tokens, 4)).astype(np.float32)
        hidden = np.zeros((batch.num_tokens, 16), np.float32)
        out = op.forward_cuda(hidden, q_fp8, k_new, weights)
    finally:
        forward_context.CONTEXT.attn_metadata = None
        calls.close_clients()
    assert out is buf and _custom_ops.CALLS[-1] == (batch.num_tokens, HEAD_DIM, "ue8m0")
    assert (buf[batch.num_tokens :] == 7).all()
    check_topk(batch, cache, q_fp8, weights, buf, topk)


def test_backend_forward_mqa(fake_vllm, daemon, client, rng, monkeypatch):
    """The CUSTOM backend's forward_mqa, given (q_nope, q_pe) as vLLM's MLA layer may pass it,
    answers what the mapping's sparse_mla call answers."""
    monkeypatch.setenv("ATTND_TARGET", daemon.unix_target)
    attnd_vllm.register()
    from vllm.v1.attention.backends import registry

    module, _, name = registry.OVERRIDES[registry.AttentionBackendEnum.CUSTOM].rpartition(".")
    impl_cls = getattr(importlib.import_module(module), name).get_impl_cls()
    batch = make_batch(rng, (1, 1), [int(rng.integers(3, 20))])
    cache = np.zeros((batch.num_blocks, 64, 656), np.uint8)
    cached = batch.all_slots()
    kv = bf16_round(rng.normal(size=(len(cached), 576)).astype(np.float32))
    write_mla_fp8_ds(cache, kv[:, :512], ac.to_bf16(kv[:, 512:]), cached[:, 2])
    positions = np.full((batch.num_tokens, 16), -1, np.int32)
    for t in range(batch.num_tokens):
        n = min(16, batch.visible(t))
        positions[t, :n] = rng.permutation(batch.visible(t))[:n]
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, 8, 576)).astype(np.float32))
    md = SimpleNamespace(req_id_per_token=batch.req_id_per_token, block_table=batch.block_table)
    impl = impl_cls(softmax_scale=0.05, topk_indices_buffer=positions)
    try:
        out, lse = impl.forward_mqa((q[..., :512], q[..., 512:]), cache, md, None)
    finally:
        calls.close_clients()
    want = client.sparse_mla(
        **mapping.sparse_mla(q, cache, positions, batch.req_id_per_token, batch.block_table, 0.05)
    )
    np.testing.assert_array_equal(out, want.out)
    np.testing.assert_array_equal(lse, want.lse)
    assert np.isfinite(lse).all()


@pytest.mark.parametrize("mode", ["fused", "split"])
@pytest.mark.parametrize("rocm", [False, True], ids=["cuda", "rocm"])
def test_decode_step_through_the_glue(fake_vllm, client, rng, monkeypatch, mode, rocm):
    """A decode-only step as vLLM runs it: the swapped-in indexer op (its cache write: vLLM's
    op, or on ROCm vLLM's ROCm writer, shuffled), then the CUSTOM backend's forward_mqa. Fused:
    the op defers (no attnd call), forward_mqa makes the one dsa_attention call and fills the
    buffer; split: three calls. Checked against the fp64 references."""
    from vllm import _custom_ops, forward_context, platforms
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.v1.attention.backends import registry
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse

    monkeypatch.setenv("ATTND_VLLM_DECODE", mode)
    monkeypatch.setattr(platforms, "ROCM", rocm)
    rec = Recording(client)
    monkeypatch.setattr(calls, "get_client", lambda target=None: rec)
    attnd_vllm.register()
    module, _, name = registry.OVERRIDES[registry.AttentionBackendEnum.CUSTOM].rpartition(".")
    impl_cls = getattr(importlib.import_module(module), name).get_impl_cls()

    batch = make_decode_batch(rng, (2, 1, 2))
    md = batch.indexer_metadata(chunk_reqs=[])
    cache = rng.integers(0, 256, (batch.num_blocks, 64, HEAD_DIM + 4), dtype=np.uint8)
    cached = batch.all_slots()
    k_all = bf16_round(rng.normal(size=(len(cached), HEAD_DIM)).astype(np.float32))
    new = {int(s) for s in md.slot_mapping}
    old = np.array([s not in new for s in cached[:, 2]])
    write_indexer_k(cache, k_all[old], cached[old, 2], HEAD_DIM, shuffle=rocm)
    by_slot = {int(s): i for i, s in enumerate(cached[:, 2])}
    k_new = k_all[[by_slot[int(s)] for s in md.slot_mapping]]
    mcache, _ = fill_mla_cache(rng, batch, "fp8_ds_mla")

    topk = int(rng.integers(20, 50))
    buf = np.full((batch.num_tokens + 2, topk), 7, np.int32)
    impl = impl_cls(softmax_scale=0.05, topk_indices_buffer=buf)
    k_cache = SimpleNamespace(prefix="model.layers.0.indexer.k_cache", kv_cache=cache)
    op = SparseAttnIndexer(k_cache, HEAD_DIM, "ue8m0", topk, HEAD_DIM, 4096, 8192, buf)
    q_fp8 = ac.to_fp8_e4m3(rng.normal(size=(batch.num_tokens, 4, HEAD_DIM)))
    weights = rng.normal(size=(batch.num_tokens, 4)).astype(np.float32)
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, 8, 576)).astype(np.float32))
    attn_md = SimpleNamespace(
        req_id_per_token=batch.req_id_per_token, block_table=batch.block_table
    )
    writer = rocm_aiter_mla_sparse if rocm else _custom_ops
    calls_before = len(writer.CALLS)
    forward_context.CONTEXT.attn_metadata = {k_cache.prefix: md}
    try:
        hidden = np.zeros((batch.num_tokens, 16), np.float32)
        assert op.forward_cuda(hidden, q_fp8, k_new, weights) is buf
        assert len(writer.CALLS) == calls_before + 1
        if mode == "fused":
            assert rec.ops == [] and (buf[: batch.num_tokens] == -1).all()
        out, lse = impl.forward_mqa(q, mcache, attn_md, None)
    finally:
        forward_context.CONTEXT.attn_metadata = None
    want_ops = ["dsa_attention"] if mode == "fused" else ["indexer_logits_paged", "topk"]
    assert rec.ops == want_ops + ([] if mode == "fused" else ["sparse_mla"])
    assert calls.take_decode(buf) is None  # consumed
    assert (buf[batch.num_tokens :] == 7).all()
    check_topk(batch, cache, q_fp8, weights, buf, topk, shuffle=rocm)
    check_attention(batch, mcache, None, q, 0.05, buf, out, lse)
    assert BF16_NAN not in np.asarray(out) and not np.isnan(lse).any()


def test_fnuz_platform_refused(fake_vllm, monkeypatch):
    """ROCm gfx942's e4m3fnuz caches are not read (docs/INDEXER_CACHES.md): the op refuses."""
    from vllm import platforms
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    monkeypatch.setattr(platforms, "ROCM", True)
    monkeypatch.setattr(platforms, "FP8_DTYPE", "torch.float8_e4m3fnuz")
    attnd_vllm.register()
    k_cache = SimpleNamespace(prefix="p", kv_cache=None)
    with pytest.raises(NotImplementedError, match="fnuz"):
        SparseAttnIndexer(k_cache, HEAD_DIM, "ue8m0", 32, HEAD_DIM, 4096, 8192, None)


def test_entry_point_declared():
    root = os.path.abspath(os.path.join(HERE, "..", "..", "..", "client", "python_vllm"))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {"attnd": "attnd_vllm:register"}
    assert project["name"] == "attnd-vllm"
    assert os.path.exists(os.path.join(root, "attnd_vllm", "py.typed"))
