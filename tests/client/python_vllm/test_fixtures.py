"""The plugin's tensor mapping against fixtures built as vLLM builds them (vllm_layout.py), on a
real CPU attnd, checked against fp64 references computed from the vLLM-layout bytes."""

import numpy as np
import pytest
from attnd_vllm import calls, mapping
from vllm_layout import (
    Batch,
    bf16_round,
    indexer_key,
    mla_row,
    write_indexer_k,
    write_mla_bf16,
    write_mla_fp8,
    write_mla_fp8_ds,
)

import attnd_client as ac

HEAD_DIM = 128  # indexer
BLOCK = 64
POISON = 0x5EED


def make_batch(rng, decode_q_lens, prefill_q_lens, spare_blocks=3):
    nd = len(decode_q_lens)
    q_lens = list(decode_q_lens) + list(prefill_q_lens)
    seq = [int(rng.integers(q + 40, q + 200)) for q in decode_q_lens]
    seq += [q + int(rng.integers(0, 130)) for q in prefill_q_lens]
    need = sum(-(-s // BLOCK) for s in seq)
    max_blocks = max(-(-s // BLOCK) for s in seq) + 1
    return Batch(rng, q_lens, seq, nd, BLOCK, need + spare_blocks, max_blocks)


def fill_indexer_cache(rng, batch):
    cache = rng.integers(0, 256, (batch.num_blocks, BLOCK, HEAD_DIM + 4), dtype=np.uint8)
    cached = batch.all_slots()
    k = bf16_round(rng.normal(size=(len(cached), HEAD_DIM)).astype(np.float32))
    write_indexer_k(cache, k, cached[:, 2], quant_block_size=HEAD_DIM, ue8m0=True)
    return cache


def check_topk(batch, cache, q_fp8, weights, buf, topk):
    """Each token's row of buf holds a true top-`topk` set of positions of its request, from the
    fp64 logits of the vLLM-layout cache."""
    qf = ac.from_fp8_e4m3(q_fp8, np.float64)
    w = weights.astype(np.float64)
    for t in range(batch.num_tokens):
        r = int(batch.req_id_per_token[t])
        n_vis = batch.visible(t)
        pairs = [indexer_key(cache, batch.block_table[r], n, HEAD_DIM) for n in range(n_vis)]
        keys, scales = [p[0] for p in pairs], [p[1] for p in pairs]
        dots = qf[t] @ np.array(keys).T  # [H, n]
        ref = (np.maximum(dots, 0) * w[t][:, None]).sum(0) * np.array(scales)
        ref_abs = (np.abs(dots) * np.abs(w[t])[:, None]).sum(0) * np.abs(np.array(scales))
        row = buf[t]
        want = min(topk, n_vis)
        assert (row[:want] >= 0).all() and (row[want:] == -1).all(), f"token {t}: {row}"
        picked = row[:want]
        assert len(set(picked.tolist())) == want and (picked < n_vis).all(), f"token {t}"
        kth = np.sort(ref)[::-1][want - 1]
        tol = 1e-4 * ref_abs.max() + 1e-30
        assert (ref[picked] >= kth - tol).all(), f"token {t}: not a top-{topk} set"


@pytest.mark.parametrize("decode_q_lens", [(2, 2), (1, 2), ()], ids=["mtp2", "uneven", "none"])
@pytest.mark.parametrize("mla_cache", ["fp8_ds_mla", "bf16", "fp8"])
def test_indexer_then_sparse_mla(client, rng, decode_q_lens, mla_cache):
    prefill_q_lens = [int(rng.integers(3, 40)) for _ in range(3)]
    batch = make_batch(rng, decode_q_lens, prefill_q_lens)
    md = batch.indexer_metadata(chunk_reqs=[1, 2])
    heads_idx, topk = int(rng.choice([4, 64])), int(rng.integers(20, 90))

    # ---- indexer ----
    cache = fill_indexer_cache(rng, batch)
    q_fp8 = ac.to_fp8_e4m3(rng.normal(scale=2.0, size=(batch.num_tokens, heads_idx, HEAD_DIM)))
    weights = rng.normal(size=(batch.num_tokens, heads_idx)).astype(np.float32)
    buf = np.full((batch.num_tokens + 3, topk), POISON, np.int32)
    calls.run_indexer(client, md, q_fp8, weights, cache, HEAD_DIM, topk, buf)
    assert (buf[batch.num_tokens :] == POISON).all(), "rows past the step were written"
    check_topk(batch, cache, q_fp8, weights, buf, topk)

    # ---- sparse MLA over the positions the indexer wrote ----
    heads = int(rng.choice([8, 16]))
    cached = batch.all_slots()
    kv = bf16_round(rng.normal(size=(len(cached), 576)).astype(np.float32))
    k_scale = None
    if mla_cache == "fp8_ds_mla":
        mcache = rng.integers(0, 256, (batch.num_blocks, BLOCK, 656), dtype=np.uint8)
        write_mla_fp8_ds(mcache, kv[:, :512], ac.to_bf16(kv[:, 512:]), cached[:, 2])
    elif mla_cache == "fp8":  # kv_cache_dtype "fp8": one calibrated-style scale, amax / 448
        k_scale = float(np.float32(np.abs(kv).max() / 448.0))
        mcache = rng.integers(0, 256, (batch.num_blocks, BLOCK, 576), dtype=np.uint8)
        write_mla_fp8(mcache, ac.to_bf16(kv), k_scale, cached[:, 2])
    else:
        mcache = rng.integers(0, 1 << 16, (batch.num_blocks, BLOCK, 576), dtype=np.uint16)
        write_mla_bf16(mcache, ac.to_bf16(kv), cached[:, 2])
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, heads, 576)).astype(np.float32))
    sm_scale = float(rng.uniform(0.03, 0.08))
    out, lse = calls.run_sparse_mla(
        client, q, mcache, buf, batch.req_id_per_token, batch.block_table, sm_scale, k_scale
    )
    out = ac.from_bf16(out, np.float64)
    qf = ac.from_bf16(q, np.float64)
    for t in range(batch.num_tokens):
        r = int(batch.req_id_per_token[t])
        pos = buf[t][buf[t] >= 0]
        rows = np.array([mla_row(mcache, int(batch.slots(r, [p])[0]), k_scale) for p in pos])
        s = sm_scale * qf[t] @ rows.T  # [H, n]
        m = s.max(1, keepdims=True)
        p = np.exp(s - m)
        ref = (p @ rows[:, :512]) / p.sum(1, keepdims=True)
        ref_lse = m[:, 0] + np.log(p.sum(1))
        ref_abs = (p @ np.abs(rows[:, :512])) / p.sum(1, keepdims=True)
        err = np.abs(out[t] - ref)
        assert (err <= 1e-2 * ref_abs + 1e-2 * np.abs(ref) + 1e-6).all(), f"token {t} out"
        assert np.allclose(lse[t], ref_lse, rtol=1e-4, atol=1e-3), f"token {t} lse"


def test_decode_cache_in_region_is_zero_copy(client, rng):
    batch = make_batch(rng, (2, 2), [])
    md = batch.indexer_metadata(chunk_reqs=[])
    dense = fill_indexer_cache(rng, batch)
    q_fp8 = ac.to_fp8_e4m3(rng.normal(size=(batch.num_tokens, 4, HEAD_DIM)))
    weights = rng.normal(size=(batch.num_tokens, 4)).astype(np.float32)
    with client.create_host_region("vllm-indexer", dense.nbytes + 4096) as region:
        cache = region.array("u8", dense.shape)
        cache[...] = dense
        call = mapping.indexer_decode(
            md.decode, q_fp8, weights, cache, batch.num_tokens, HEAD_DIM, 16
        )
        res = client.indexer_logits_paged(**call.indexer_logits_paged)
        assert res.stats.copied_bytes_in < dense.nbytes, res.stats
    inline = client.indexer_logits_paged(
        **mapping.indexer_decode(
            md.decode, q_fp8, weights, dense, batch.num_tokens, HEAD_DIM, 16
        ).indexer_logits_paged
    )
    assert res.stats.copied_bytes_in + dense.nbytes <= inline.stats.copied_bytes_in
    np.testing.assert_array_equal(res.logits, inline.logits)


def test_strided_indexer_blocks(client, rng):
    """A block stride larger than the block's bytes (other layers' data between blocks) maps to
    attnd's row stride: the same logits as the dense cache."""
    batch = make_batch(rng, (1, 1, 1), [])
    md = batch.indexer_metadata(chunk_reqs=[])
    dense = fill_indexer_cache(rng, batch)
    wide = np.zeros((batch.num_blocks, BLOCK * (HEAD_DIM + 4) + 192), np.uint8)
    strided = wide[:, : BLOCK * (HEAD_DIM + 4)].reshape(batch.num_blocks, BLOCK, HEAD_DIM + 4)
    strided[...] = dense
    rows, bs = mapping.indexer_cache_rows(strided, HEAD_DIM)
    assert bs == BLOCK and rows.strides[0] == wide.strides[0]
    q_fp8 = ac.to_fp8_e4m3(rng.normal(size=(batch.num_tokens, 4, HEAD_DIM)))
    weights = rng.normal(size=(batch.num_tokens, 4)).astype(np.float32)
    got = [
        client.indexer_logits_paged(
            **mapping.indexer_decode(
                md.decode, q_fp8, weights, c, batch.num_tokens, HEAD_DIM, 8
            ).indexer_logits_paged
        ).logits
        for c in (strided, dense)
    ]
    np.testing.assert_array_equal(got[0], got[1])


def test_positions_to_slots(rng):
    table = rng.integers(0, 50, (3, 4)).astype(np.int32)
    req = np.array([0, 0, 1, 2], np.int32)
    pos = rng.integers(-1, 4 * 16 + 20, (4, 9)).astype(np.int32)
    got = mapping.request_positions_to_slots(req, table, pos, 16)
    for t in range(4):
        for j in range(9):
            p = int(pos[t, j])
            want = -1 if p < 0 or p // 16 >= 4 else int(table[req[t], p // 16]) * 16 + p % 16
            assert got[t, j] == want


def test_hostile_layouts():
    with pytest.raises(ValueError, match="dim 2 is 136"):
        mapping.indexer_cache_rows(np.zeros((2, 64, 136), np.uint8), HEAD_DIM)
    with pytest.raises(ValueError, match="656"):
        mapping.mla_cache_rows(np.zeros((2, 64, 600), np.uint8))
    with pytest.raises(ValueError, match="576"):
        mapping.mla_cache_rows(np.zeros((2, 64, 512), np.uint16))
    # The per-tensor "fp8" cache needs the layer's k_scale.
    cache = np.zeros((2, 64, 576), np.uint8)
    empty = np.zeros((1, 0), np.int32)
    with pytest.raises(ValueError, match="k_scale"):
        mapping.sparse_mla(np.zeros((1, 8, 576), np.uint16), cache, empty, [0], [[0]], 0.1)
    fields = mapping.sparse_mla(
        np.zeros((1, 8, 512), np.uint16), cache[:, :, :512], empty, [0], [[0]], 0.1, 0.5
    )
    assert fields["kv_scale"] == 0.5 and fields["kv"].shape == (128, 512)
