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


def fill_mla_cache(rng, batch, mla_cache):
    """The MLA cache of every cached token, written as vLLM writes `mla_cache` ("fp8_ds_mla",
    "bf16", or "fp8" with a calibrated-style k_scale = amax / 448), over random bytes: (cache,
    k_scale or None)."""
    cached = batch.all_slots()
    kv = bf16_round(rng.normal(size=(len(cached), 576)).astype(np.float32))
    k_scale = None
    if mla_cache == "fp8_ds_mla":
        mcache = rng.integers(0, 256, (batch.num_blocks, BLOCK, 656), dtype=np.uint8)
        write_mla_fp8_ds(mcache, kv[:, :512], ac.to_bf16(kv[:, 512:]), cached[:, 2])
    elif mla_cache == "fp8":
        k_scale = float(np.float32(np.abs(kv).max() / 448.0))
        mcache = rng.integers(0, 256, (batch.num_blocks, BLOCK, 576), dtype=np.uint8)
        write_mla_fp8(mcache, ac.to_bf16(kv), k_scale, cached[:, 2])
    else:
        mcache = rng.integers(0, 1 << 16, (batch.num_blocks, BLOCK, 576), dtype=np.uint16)
        write_mla_bf16(mcache, ac.to_bf16(kv), cached[:, 2])
    return mcache, k_scale


def check_attention(batch, mcache, k_scale, q, sm_scale, buf, out, lse):
    """out / lse of each token: the fp64 attention over the MLA cache rows (read from the
    vLLM-layout bytes) of the positions its row of buf holds."""
    out = ac.from_bf16(out, np.float64)
    qf = ac.from_bf16(q, np.float64)
    for t in range(batch.num_tokens):
        r = int(batch.req_id_per_token[t])
        pos = buf[t][buf[t] >= 0]
        if pos.shape[0] == 0:
            assert (out[t] == 0).all() and (lse[t] == -np.inf).all(), f"token {t}: empty"
            continue
        # An FP8 cache: the CPU decodes it exactly, the GPU kernels round each decoded value to
        # bf16 once, and each is bounded against its own decode (docs/ACCURACY.md "FP8 KV
        # cache"); the result must meet the bounds against one of the two.
        errors = []
        for rounded in (False, True) if mcache.dtype == np.uint8 else (False,):
            slots = [int(batch.slots(r, [p])[0]) for p in pos]
            rows = np.array([mla_row(mcache, sl, k_scale, bf16_rounded=rounded) for sl in slots])
            s = sm_scale * qf[t] @ rows.T  # [H, n]
            m = s.max(1, keepdims=True)
            p = np.exp(s - m)
            ref = (p @ rows[:, :512]) / p.sum(1, keepdims=True)
            ref_lse = m[:, 0] + np.log(p.sum(1))
            ref_abs = (p @ np.abs(rows[:, :512])) / p.sum(1, keepdims=True)
            out_ok = (np.abs(out[t] - ref) <= 1e-2 * ref_abs + 1e-2 * np.abs(ref) + 1e-6).all()
            # lse: docs/ACCURACY.md "lse", |lse - ref| <= 1e-4 + 1e-5 |ref|.
            lse_err = np.abs(lse[t] - ref_lse) - (1e-4 + 1e-5 * np.abs(ref_lse))
            if out_ok and (lse_err <= 0).all():
                break
            errors.append(
                f"{'bf16-rounded' if rounded else 'exact'} decode: out ok {out_ok}, "
                f"lse over its bound by {lse_err.max():.2e}"
            )
        else:
            raise AssertionError(f"token {t}: " + "; ".join(errors))


def check_topk(batch, cache, q_fp8, weights, buf, topk, shuffle=False, masked_blocks=()):
    """Each token's row of buf holds a true top-`topk` set of positions of its request, from the
    fp64 logits of the vLLM-layout cache (shuffle: the ROCm layout). Positions in a block of
    masked_blocks (an out-of-range table entry, hostile) are never candidates."""
    qf = ac.from_fp8_e4m3(q_fp8, np.float64)
    w = weights.astype(np.float64)
    for t in range(batch.num_tokens):
        r = int(batch.req_id_per_token[t])
        table = batch.block_table[r]
        seen = [n for n in range(batch.visible(t)) if table[n // BLOCK] not in masked_blocks]
        n_vis = len(seen)
        pairs = [indexer_key(cache, table, n, HEAD_DIM, shuffle) for n in seen]
        keys, scales = [p[0] for p in pairs], [p[1] for p in pairs]
        dots = qf[t] @ np.array(keys).T  # [H, n]
        ref = (np.maximum(dots, 0) * w[t][:, None]).sum(0) * np.array(scales)
        ref_abs = (np.abs(dots) * np.abs(w[t])[:, None]).sum(0) * np.abs(np.array(scales))
        row = buf[t]
        want = min(topk, n_vis)
        assert (row[:want] >= 0).all() and (row[want:] == -1).all(), f"token {t}: {row}"
        picked = row[:want]
        assert len(set(picked.tolist())) == want, f"token {t}"
        column = {n: i for i, n in enumerate(seen)}
        assert all(int(p) in column for p in picked), f"token {t}: {picked} not visible"
        if want == 0:
            continue
        kth = np.sort(ref)[::-1][want - 1]
        tol = 1e-4 * ref_abs.max() + 1e-30
        got = ref[[column[int(p)] for p in picked]]
        assert (got >= kth - tol).all(), f"token {t}: not a top-{topk} set"


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
    mcache, k_scale = fill_mla_cache(rng, batch, mla_cache)
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, heads, 576)).astype(np.float32))
    sm_scale = float(rng.uniform(0.03, 0.08))
    out, lse = calls.run_sparse_mla(
        client, q, mcache, buf, batch.req_id_per_token, batch.block_table, sm_scale, k_scale
    )
    check_attention(batch, mcache, k_scale, q, sm_scale, buf, out, lse)


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


# ---- decode-only steps: the fused paged dsa_attention call and the 3-call path ----

BF16_NAN = 0x7FC0


class Recording:
    """A client that records the ops called through it (everything else passes through)."""

    OPS = ("indexer_logits", "indexer_logits_paged", "topk", "sparse_mla", "dsa_attention")

    def __init__(self, client):
        self.client, self.ops = client, []

    def __getattr__(self, name):
        attr = getattr(self.client, name)
        if name not in self.OPS:
            return attr

        def call(*args, **kwargs):
            self.ops.append(name)
            return attr(*args, **kwargs)

        return call


def make_decode_batch(rng, decode_q_lens):
    """Decode requests only, of uneven contexts: the first shorter than any top-k the tests use
    (its rows are -1 padded), the others over several blocks."""
    seq = [q + int(rng.integers(3, 15)) for q in decode_q_lens[:1]]
    seq += [q + int(rng.integers(100, 330)) for q in decode_q_lens[1:]]
    need = sum(-(-s // BLOCK) for s in seq)
    max_blocks = max(-(-s // BLOCK) for s in seq) + 1
    return Batch(rng, list(decode_q_lens), seq, len(decode_q_lens), BLOCK, need + 3, max_blocks)


def decode_step(rng, batch, shuffle=False, topk=None):
    """A decode-only step as vLLM hands it to the indexer op (its cache already written): the
    calls.DecodeStep, the indexer cache, q and weights."""
    md = batch.indexer_metadata(chunk_reqs=[])
    cache = rng.integers(0, 256, (batch.num_blocks, BLOCK, HEAD_DIM + 4), dtype=np.uint8)
    cached = batch.all_slots()
    k = bf16_round(rng.normal(size=(len(cached), HEAD_DIM)).astype(np.float32))
    write_indexer_k(cache, k, cached[:, 2], HEAD_DIM, ue8m0=True, shuffle=shuffle)
    heads_idx = int(rng.choice([4, 64]))
    q_fp8 = ac.to_fp8_e4m3(rng.normal(scale=2.0, size=(batch.num_tokens, heads_idx, HEAD_DIM)))
    weights = rng.normal(size=(batch.num_tokens, heads_idx)).astype(np.float32)
    topk = topk or int(rng.integers(20, 60))
    layout = mapping.INDEXER_SHUFFLE if shuffle else mapping.INDEXER_BLOCKS
    step = calls.DecodeStep(md, q_fp8, weights, cache, batch.num_tokens, HEAD_DIM, topk, layout)
    return step, cache


def run_step(client, rng, batch, step, mcache, k_scale, mode, heads=8, q=None, table=None):
    """run_decode_step into NaN-poisoned out / lse and a poisoned buffer (two spare rows):
    (buffer, out, lse, q, sm_scale, ops called)."""
    if q is None:
        q = ac.to_bf16(rng.normal(size=(batch.num_tokens, heads, 576)).astype(np.float32))
    sm_scale = 0.05
    buf = np.full((batch.num_tokens + 2, step.topk_tokens), POISON, np.int32)
    out = np.full((batch.num_tokens, q.shape[1], 512), BF16_NAN, np.uint16)
    lse = np.full((batch.num_tokens, q.shape[1]), np.nan, np.float32)
    rec = Recording(client)
    got = calls.run_decode_step(
        rec,
        step,
        q,
        mcache,
        sm_scale,
        buf,
        batch.req_id_per_token,
        batch.block_table if table is None else table,
        k_scale,
        mode=mode,
        out=out,
        lse=lse,
    )
    assert got[0] is out and got[1] is lse
    assert (buf[batch.num_tokens :] == POISON).all(), "rows past the step were written"
    assert not np.isnan(lse).any() and not np.isnan(ac.from_bf16(out, np.float32)).any()
    return buf, out, lse, q, sm_scale, rec.ops


FUSED_OPS = ["dsa_attention"]
SPLIT_OPS = ["indexer_logits_paged", "topk", "sparse_mla"]


@pytest.mark.parametrize(
    "decode_q_lens", [(1, 1, 1), (2, 2, 2), (2, 1, 2)], ids=["next_n1", "next_n2", "uneven2"]
)
@pytest.mark.parametrize("mla_cache", ["fp8_ds_mla", "bf16", "fp8"])
def test_fused_decode_against_reference(client, rng, decode_q_lens, mla_cache):
    """A decode-only step through run_decode_step in the fused mode: one paged dsa_attention
    call for every MLA cache (the per-tensor "fp8" one with the layer's k_scale as kv_scale),
    checked against the fp64 top-k and attention of the vLLM-layout bytes."""
    batch = make_decode_batch(rng, decode_q_lens)
    step, cache = decode_step(rng, batch)
    mcache, k_scale = fill_mla_cache(rng, batch, mla_cache)
    buf, out, lse, q, sm_scale, ops = run_step(
        client, rng, batch, step, mcache, k_scale, "fused", heads=int(rng.choice([8, 16]))
    )
    assert ops == FUSED_OPS
    check_topk(batch, cache, step.q_fp8, step.weights, buf, step.topk_tokens)
    assert (buf[0, : batch.visible(0)] >= 0).all() and (buf[0, batch.visible(0) :] == -1).all()
    check_attention(batch, mcache, k_scale, q, sm_scale, buf, out, lse)


@pytest.mark.parametrize("decode_q_lens", [(1, 1), (2, 2, 2), (1, 2, 2)])
@pytest.mark.parametrize("mla_cache", ["fp8_ds_mla", "bf16", "fp8"])
def test_fused_matches_split(client, rng, decode_q_lens, mla_cache):
    """The same step in both modes: the same top-k sets and the same attention (the fused call
    reads the chosen rows in position order, the 3-call path in top-k order: f32 sums may differ
    in the last bits)."""
    batch = make_decode_batch(rng, decode_q_lens)
    step, _ = decode_step(rng, batch)
    mcache, k_scale = fill_mla_cache(rng, batch, mla_cache)
    fused = run_step(client, rng, batch, step, mcache, k_scale, "fused")
    split = run_step(client, rng, batch, step, mcache, k_scale, "split", q=fused[3])
    assert fused[5] == FUSED_OPS and split[5] == SPLIT_OPS
    for t in range(batch.num_tokens):
        assert sorted(fused[0][t]) == sorted(split[0][t]), f"token {t}"
        assert (fused[0][t][1:] > fused[0][t][:-1])[fused[0][t][1:] >= 0].all(), "ascending"
    a, b = ac.from_bf16(fused[1], np.float64), ac.from_bf16(split[1], np.float64)
    assert (np.abs(a - b) <= 2**-7 * np.abs(b) + 1e-6).all()  # one bf16 rounding step apart
    np.testing.assert_allclose(fused[2], split[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["fused", "split"])
def test_shuffled_indexer_cache(client, rng, mode):
    """vLLM's ROCm indexer cache at block size 64 (SHUFFLE, docs/INDEXER_CACHES.md), named
    INDEXER_AITER_SHUFFLE_16: decode in both modes, and a prefill chunk gathered on the host."""
    batch = make_decode_batch(rng, (2, 1, 2))
    step, cache = decode_step(rng, batch, shuffle=True)
    mcache, _ = fill_mla_cache(rng, batch, "fp8_ds_mla")
    buf, out, lse, q, sm_scale, ops = run_step(client, rng, batch, step, mcache, None, mode)
    assert ops == (FUSED_OPS if mode == "fused" else SPLIT_OPS)
    check_topk(batch, cache, step.q_fp8, step.weights, buf, step.topk_tokens, shuffle=True)
    check_attention(batch, mcache, None, q, sm_scale, buf, out, lse)
    # The same cache read as the blocks layout gives other keys: the name matters.
    blocks = step._replace(index_layout=mapping.INDEXER_BLOCKS)
    wrong = run_step(client, rng, batch, blocks, mcache, None, mode, q=q)[0]
    assert any(sorted(wrong[t]) != sorted(buf[t]) for t in range(batch.num_tokens))
    # A prefill step over a shuffled cache: the host gather reads the tiles.
    pre = make_batch(rng, (), [int(rng.integers(3, 30)), int(rng.integers(3, 30))])
    md = pre.indexer_metadata(chunk_reqs=[1, 1])
    pcache = rng.integers(0, 256, (pre.num_blocks, BLOCK, HEAD_DIM + 4), dtype=np.uint8)
    cached = pre.all_slots()
    k = bf16_round(rng.normal(size=(len(cached), HEAD_DIM)).astype(np.float32))
    write_indexer_k(pcache, k, cached[:, 2], HEAD_DIM, shuffle=True)
    q_fp8 = ac.to_fp8_e4m3(rng.normal(size=(pre.num_tokens, 4, HEAD_DIM)))
    weights = rng.normal(size=(pre.num_tokens, 4)).astype(np.float32)
    pbuf = np.full((pre.num_tokens, 24), POISON, np.int32)
    calls.run_indexer(
        client, md, q_fp8, weights, pcache, HEAD_DIM, 24, pbuf, index_layout=mapping.INDEXER_SHUFFLE
    )
    check_topk(pre, pcache, q_fp8, weights, pbuf, 24, shuffle=True)


def test_fused_hostile_block_table(client, rng):
    """Untrusted table entries (docs/CONTRACTS.md "dsa_attention", "Paged form"): a block id
    past the caches and a negative one mask their positions (never chosen, never read) in both
    modes; lengths past the table are clamped. Both modes agree, the top-k sets are true over
    the remaining positions and the attention matches the reference."""
    batch = make_decode_batch(rng, (1, 2, 2))
    step, cache = decode_step(rng, batch, topk=200)
    mcache, _ = fill_mla_cache(rng, batch, "fp8_ds_mla")
    bad = batch.num_blocks + int(rng.integers(0, 1000))
    batch.block_table[1, 0] = bad
    batch.block_table[2, 1] = -3
    step.metadata.decode.block_table[...] = batch.block_table  # the same (shared) table
    fused = run_step(client, rng, batch, step, mcache, None, "fused")
    split = run_step(client, rng, batch, step, mcache, None, "split", q=fused[3])
    for buf in (fused[0], split[0]):
        check_topk(batch, cache, step.q_fp8, step.weights, buf, 200, masked_blocks=(bad, -3))
        assert not (buf[1:3] // BLOCK == 0).any() and not (buf[3:5] // BLOCK == 1).any()
    for t in range(batch.num_tokens):
        assert sorted(fused[0][t]) == sorted(split[0][t]), f"token {t}"
    check_attention(batch, mcache, None, fused[3], fused[4], fused[0], fused[1], fused[2])
    # Lengths past the table's capacity: clamped to it. The rows then read include vLLM's zeroed
    # unused table entries (block 0), so this MLA cache is finite everywhere.
    long = batch.indexer_metadata(chunk_reqs=[])
    long.decode.seq_lens[...] = 10**6
    wide = step._replace(metadata=long)
    finite = ac.to_bf16(rng.normal(size=(batch.num_blocks, BLOCK, 576)).astype(np.float32))
    fused = run_step(client, rng, batch, wide, finite, None, "fused", q=fused[3])
    split = run_step(client, rng, batch, wide, finite, None, "split", q=fused[3])
    # Zeroed entries repeat page 0 inside the clamped window: positions on it are ambiguous when
    # read back from kv rows (docs/VLLM.md), so the two modes are compared by cache slot.
    cap = batch.block_table.shape[1] * BLOCK
    slots = [
        mapping.request_positions_to_slots(
            batch.req_id_per_token, batch.block_table, b[0][: batch.num_tokens], BLOCK
        )
        for b in (fused, split)
    ]
    for t in range(batch.num_tokens):
        assert sorted(slots[0][t]) == sorted(slots[1][t]), f"token {t}"
        assert (fused[0][t] < cap).all() and (fused[0][t] >= 0).sum() > 0, f"token {t}"


def test_fused_refuses_cleanly(client, rng):
    """What the fused call cannot take raises before any call: the per-tensor "fp8" MLA cache
    without the layer's k_scale, caches of different block sizes, a shuffled indexer cache
    whose block size is not a multiple of 16, an unknown decode mode. With k_scale the "fp8"
    cache maps to kv_scale and its named per-tensor layout."""
    batch = make_decode_batch(rng, (1, 1))
    step, _ = decode_step(rng, batch)
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, 8, 576)).astype(np.float32))
    mcache, _ = fill_mla_cache(rng, batch, "fp8")
    args = (step.metadata.decode, step.q_fp8, step.weights, step.kv_cache, q)
    rest = (batch.num_tokens, HEAD_DIM, step.topk_tokens, 0.05)
    with pytest.raises(ValueError, match="k_scale"):
        mapping.dsa_decode(*args, mcache, *rest)
    fields = mapping.dsa_decode(*args, mcache, *rest, k_scale=0.25).dsa_attention
    assert fields["kv_scale"] == 0.25 and fields["kv_layout"] == "FP8_576_PER_TENSOR"
    bf16, _ = fill_mla_cache(rng, batch, "bf16")  # k_scale is for the "fp8" cache only
    assert "kv_scale" not in mapping.dsa_decode(*args, bf16, *rest, k_scale=0.25).dsa_attention
    half = np.zeros((mcache.shape[0] * 2, BLOCK // 2, 656), np.uint8)
    with pytest.raises(ValueError, match="block size 32"):
        mapping.dsa_decode(*args, half, *rest)
    odd = np.zeros((4, 24, HEAD_DIM + 4), np.uint8)
    with pytest.raises(ValueError, match="multiples of 16"):
        mapping.dsa_decode(*args[:3], odd, q, half, *rest, mapping.INDEXER_SHUFFLE)
    with pytest.raises(ValueError, match="ATTND_VLLM_DECODE"):
        calls.decode_mode("graph")
    assert calls.decode_mode("SPLIT") == "split" and calls.decode_mode() in calls.DECODE_MODES


@pytest.mark.parametrize("decode_q_lens", [(1, 1, 1), (2, 2)], ids=["next_n1", "next_n2"])
def test_fused_decode_per_request_lengths(client, rng, decode_q_lens):
    """Older vLLM's decode seq_lens [B] (token j of next_n sees L - next_n + j + 1 positions),
    sent to dsa_attention as they are."""
    batch = make_decode_batch(rng, decode_q_lens)
    step, cache = decode_step(rng, batch)
    step.metadata.decode.seq_lens = batch.seq_lens.astype(np.int32)
    mcache, _ = fill_mla_cache(rng, batch, "bf16")
    buf, out, lse, q, sm_scale, ops = run_step(client, rng, batch, step, mcache, None, "fused")
    assert ops == FUSED_OPS
    check_topk(batch, cache, step.q_fp8, step.weights, buf, step.topk_tokens)
    check_attention(batch, mcache, None, q, sm_scale, buf, out, lse)


def test_daemon_without_paged_dsa_falls_back(client, rng):
    """A daemon whose GetInfo lists no index_cache_layout for dsa_attention (one from before
    the paged form) gets the three calls, with the same answer."""

    class Older(Recording):
        def info(self, timeout=None):
            info = self.client.info()
            for op in info.ops:
                if op.name == "dsa_attention":
                    keep = [c for c in op.cache_layouts if c.field != "index_cache_layout"]
                    del op.cache_layouts[:]
                    op.cache_layouts.extend(keep)
            return info

    batch = make_decode_batch(rng, (2, 2))
    step, cache = decode_step(rng, batch)
    mcache, _ = fill_mla_cache(rng, batch, "bf16")
    older = Older(client)
    assert calls.has_paged_dsa(client) and not calls.has_paged_dsa(older)
    buf = np.full((batch.num_tokens, step.topk_tokens), POISON, np.int32)
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, 8, 576)).astype(np.float32))
    out, lse = calls.run_decode_step(
        older, step, q, mcache, 0.05, buf, batch.req_id_per_token, batch.block_table, mode="fused"
    )
    assert older.ops == SPLIT_OPS
    check_topk(batch, cache, step.q_fp8, step.weights, buf, step.topk_tokens)
    check_attention(batch, mcache, None, q, 0.05, buf, out, lse)


def test_daemon_without_dsa_kv_scale_falls_back_for_fp8(client, rng):
    """A daemon whose dsa_attention lists no per-tensor FP8 kv_layout (one from before
    DsaAttentionRequest.kv_scale) still fuses the caches it lists, and gets the three calls for
    the per-tensor "fp8" cache, with the same answer."""

    class Older(Recording):
        def info(self, timeout=None):
            info = self.client.info()
            for op in info.ops:
                if op.name != "dsa_attention":
                    continue
                for c in op.cache_layouts:
                    if c.field == "kv_layout":
                        keep = [
                            v
                            for v in c.accepted
                            if ac.ops.cache_layout_name(v) not in mapping.PER_TENSOR_KV_LAYOUTS
                        ]
                        del c.accepted[:]
                        c.accepted.extend(keep)
            return info

    batch = make_decode_batch(rng, (2, 1))
    step, cache = decode_step(rng, batch)
    mcache, k_scale = fill_mla_cache(rng, batch, "fp8")
    older = Older(client)
    assert calls.has_paged_dsa(older)
    assert calls.dsa_takes_kv_layout(client, "FP8_576_PER_TENSOR")
    assert not calls.dsa_takes_kv_layout(older, "FP8_576_PER_TENSOR")
    assert calls.dsa_takes_kv_layout(older, "FLASHMLA_FP8_656")
    buf = np.full((batch.num_tokens, step.topk_tokens), POISON, np.int32)
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, 8, 576)).astype(np.float32))
    out, lse = calls.run_decode_step(
        older,
        step,
        q,
        mcache,
        0.05,
        buf,
        batch.req_id_per_token,
        batch.block_table,
        k_scale,
        mode="fused",
    )
    assert older.ops == SPLIT_OPS
    check_topk(batch, cache, step.q_fp8, step.weights, buf, step.topk_tokens)
    check_attention(batch, mcache, k_scale, q, 0.05, buf, out, lse)
