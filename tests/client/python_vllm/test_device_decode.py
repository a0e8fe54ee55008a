"""The fused decode kept on the tensors' own device (mapping.dsa_decode_device,
calls.run_dsa_decode_device): with vLLM's tensors as torch tensors the step reads nothing on the
host and gives the host path's bytes. Here the tensors are CPU torch tensors against the CPU
attnd (the same code runs on CUDA tensors, placed as device regions: tests/gpu); skipped without
torch (CI has none)."""

from types import SimpleNamespace

import numpy as np
import pytest
from attnd_vllm import calls, mapping
from test_fixtures import (
    FUSED_OPS,
    POISON,
    SPLIT_OPS,
    Recording,
    decode_step,
    fill_mla_cache,
    make_decode_batch,
    run_step,
)

import attnd_client as ac

torch = pytest.importorskip("torch")


def as_torch(x, kind=None):
    """A NumPy array as the torch tensor vLLM would hold: bf16 from uint16 bits, fp8 codes as
    float8_e4m3fn, anything else as is."""
    if kind == "bf16":
        return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    if kind == "fp8":
        return torch.from_numpy(np.ascontiguousarray(x)).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(x))


def bits(t):
    """A torch tensor's values as a NumPy array (bf16 as its uint16 bits)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def torch_step(step, cache):
    """The DecodeStep with vLLM's torch tensors (metadata included)."""
    dec = step.metadata.decode
    decode = SimpleNamespace(
        block_table=as_torch(dec.block_table),
        seq_lens=as_torch(dec.seq_lens),
        decode_lens=as_torch(dec.decode_lens),
        requires_padding=dec.requires_padding,
    )
    metadata = SimpleNamespace(**{**vars(step.metadata), "decode": decode})
    return step._replace(
        metadata=metadata,
        q_fp8=as_torch(np.asarray(ac.dtypes.as_raw(np.asarray(step.q_fp8))), "fp8"),
        weights=as_torch(step.weights),
        kv_cache=as_torch(cache),
    )


def no_host_reads(monkeypatch):
    """mapping.host raises: the device form must not read any tensor on the host."""

    def refuse(*_a, **_k):
        raise AssertionError("the device form read a tensor on the host")

    monkeypatch.setattr(mapping, "host", refuse)


@pytest.mark.parametrize(
    "decode_q_lens", [(1, 1, 1), (2, 2, 2), (2, 1, 2)], ids=["next_n1", "next_n2", "uneven2"]
)
@pytest.mark.parametrize("mla_cache", ["fp8_ds_mla", "bf16", "fp8"])
@pytest.mark.parametrize("mode", ["fused", "split"])
def test_device_form_gives_the_host_forms_bytes(
    client, rng, decode_q_lens, mla_cache, mode, monkeypatch
):
    """The same step through run_decode_step with NumPy inputs (the host path) and with torch
    tensors: the same buffer rows, out and lse bytes, through the same calls (one dsa_attention,
    or the three of "split"), and nothing read on the host (uneven draft counts included: the
    fixtures' seq_lens are per token)."""
    batch = make_decode_batch(rng, decode_q_lens)
    step, cache = decode_step(rng, batch)
    mcache, k_scale = fill_mla_cache(rng, batch, mla_cache)
    buf, out, lse, q, sm_scale, ops = run_step(client, rng, batch, step, mcache, k_scale, mode)
    assert ops == (FUSED_OPS if mode == "fused" else SPLIT_OPS)

    tstep = torch_step(step, cache)
    tq = as_torch(q, "bf16")
    tcache = as_torch(mcache, "bf16" if mcache.dtype == np.uint16 else None)
    tbuf = torch.full((batch.num_tokens + 2, step.topk_tokens), POISON, dtype=torch.int32)
    # vLLM's per-token seq_lens [B, next_n] (the fixtures'): even and uneven decodes alike stay
    # on the device (uneven ones packed there).
    no_host_reads(monkeypatch)
    rec = Recording(client)
    got_out, got_lse = calls.run_decode_step(
        rec,
        tstep,
        tq,
        tcache,
        sm_scale,
        tbuf,
        as_torch(batch.req_id_per_token),
        as_torch(batch.block_table),
        k_scale,
        mode=mode,
    )
    monkeypatch.undo()
    assert rec.ops == ops
    assert mapping.is_torch(got_out) and mapping.is_torch(got_lse)
    np.testing.assert_array_equal(tbuf.numpy(), buf)
    np.testing.assert_array_equal(bits(got_out), out)
    np.testing.assert_array_equal(got_lse.numpy(), lse)


def test_positions_on_the_device_match_the_host(rng):
    """kv_rows_to_positions_device against kv_rows_to_positions on random tables with repeated
    and negative pages, rows on unreachable entries, -1 padding, 1-D and 2-D lengths."""
    for _ in range(40):
        batch, next_n, width, bs, topk = (
            int(rng.integers(1, 6)),
            int(rng.integers(1, 4)),
            int(rng.integers(0, 7)),
            int(rng.choice([1, 4, 64])),
            int(rng.integers(1, 9)),
        )
        table = rng.integers(-1, 6, (batch, width)).astype(np.int32)
        two_d = bool(rng.integers(0, 2))
        seq = rng.integers(-3, width * bs + 5, (batch, next_n) if two_d else batch).astype(np.int32)
        pages = rng.integers(-1, 7, (batch * next_n, topk))
        kv_rows = np.where(pages >= 0, pages * bs + rng.integers(0, bs, pages.shape), -1)
        kv_rows = kv_rows.astype(np.int32)
        if two_d:
            lengths = np.clip(seq.astype(np.int64).reshape(-1), 0, None)
        else:
            j = np.arange(next_n)
            lengths = np.clip(seq.astype(np.int64)[:, None] - next_n + j + 1, 0, None).reshape(-1)
        host_call = mapping.DsaDecodeCall({}, np.arange(batch * next_n), table, bs, lengths)
        want = mapping.kv_rows_to_positions(host_call, kv_rows)
        t = torch.from_numpy(seq)
        lengths_t = t.to(torch.int64)
        if not two_d:
            lengths_t = lengths_t[:, None] - next_n + torch.arange(next_n)[None, :] + 1
        longest = lengths_t.clamp(min=0).reshape(batch, next_n).amax(dim=1)
        blocks = torch.div(longest + bs - 1, bs, rounding_mode="floor").clamp(max=width)
        even = mapping.DecodeShape(batch, next_n, None, None, None)
        dev_call = mapping.DsaDecodeDevice(
            {}, batch, next_n, torch.from_numpy(table), bs, blocks, even
        )
        got = mapping.kv_rows_to_positions_device(dev_call, torch.from_numpy(kv_rows))
        np.testing.assert_array_equal(got.numpy(), want)


def test_device_form_declines_what_needs_the_host(rng):
    """Mixed tensors (a NumPy block table), uneven decodes with [B] seq_lens, and an even
    decode whose token count is not B * next_n take the host path (None)."""
    batch = make_decode_batch(rng, (1, 1))
    step, cache = decode_step(rng, batch)
    mcache, _ = fill_mla_cache(rng, batch, "bf16")
    tstep = torch_step(step, cache)
    q = torch.zeros((batch.num_tokens, 8, 576), dtype=torch.bfloat16)
    kv = as_torch(mcache, "bf16")

    def form(decode, tokens=batch.num_tokens):
        return mapping.dsa_decode_device(
            decode, tstep.q_fp8, tstep.weights, tstep.kv_cache, q, kv, tokens, 128, 16, 0.1
        )

    dec = tstep.metadata.decode
    assert form(dec) is not None
    assert form(SimpleNamespace(**{**vars(dec), "block_table": dec.block_table.numpy()})) is None
    # Uneven: packed on the device with per-token seq_lens; [B] seq_lens need the host.
    assert form(SimpleNamespace(**{**vars(dec), "requires_padding": True})) is not None
    one_d = SimpleNamespace(**{**vars(dec), "seq_lens": dec.seq_lens[:, 0]})
    assert form(one_d) is not None
    assert form(one_d, tokens=batch.num_tokens + 1) is None
    assert form(SimpleNamespace(**{**vars(one_d), "requires_padding": True})) is None


def test_ordered_setting(client, rng, monkeypatch):
    """ATTND_VLLM_ORDERED: "1" asks for the stream-ordered call, which needs CUDA tensors, so CPU
    tensors keep the blocking call (the same bytes); a value other than 0 / 1 is refused."""
    batch = make_decode_batch(rng, (1, 1))
    step, cache = decode_step(rng, batch)
    mcache, _ = fill_mla_cache(rng, batch, "bf16")
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, 8, 576)).astype(np.float32))
    got = []
    for value in ("0", "1"):
        monkeypatch.setenv("ATTND_VLLM_ORDERED", value)
        assert calls.ordered_enabled() == (value == "1")
        tbuf = torch.full((batch.num_tokens, step.topk_tokens), POISON, dtype=torch.int32)
        out, lse = calls.run_dsa_decode(
            client,
            torch_step(step, cache),
            as_torch(q, "bf16"),
            as_torch(mcache, "bf16"),
            0.05,
            tbuf,
        )
        got.append((tbuf.numpy().copy(), bits(out).copy(), lse.numpy().copy()))
    for a, b in zip(*got, strict=True):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setenv("ATTND_VLLM_ORDERED", "yes")
    with pytest.raises(ValueError, match="ATTND_VLLM_ORDERED"):
        calls.ordered_enabled()


# ---- prefill chunks and sparse MLA on the tensors' device ----


def torch_metadata(md):
    """vLLM's indexer metadata with its chunks' and decode part's arrays as torch tensors."""

    def conv(ns):
        return SimpleNamespace(
            **{k: as_torch(v) if isinstance(v, np.ndarray) else v for k, v in vars(ns).items()}
        )

    fields = dict(vars(md))
    if getattr(md, "prefill", None) is not None:
        fields["prefill"] = SimpleNamespace(
            **{**vars(md.prefill), "chunks": [conv(c) for c in md.prefill.chunks]}
        )
    if getattr(md, "decode", None) is not None:
        fields["decode"] = conv(md.decode)
    return SimpleNamespace(**fields)


@pytest.mark.parametrize("shuffle", [False, True], ids=["blocks", "shuffled"])
@pytest.mark.parametrize("mla_cache", ["fp8_ds_mla", "bf16", "fp8"])
def test_prefill_and_sparse_mla_on_the_device(client, rng, shuffle, mla_cache, monkeypatch):
    """Prefill chunks through run_indexer and the sparse MLA over the positions it wrote, with
    NumPy inputs (the host form) and with torch tensors (the device form: the keys gathered, the
    logits left for the top-k and the slots made on the tensors' device; no host read): the same
    buffer, out and lse bytes."""
    from test_fixtures import make_batch
    from vllm_layout import write_indexer_k

    prefill_q_lens = [int(rng.integers(3, 40)) for _ in range(3)]
    batch = make_batch(rng, (), prefill_q_lens)
    md = batch.indexer_metadata(chunk_reqs=[1, 2])
    cache = rng.integers(0, 256, (batch.num_blocks, 64, 132), dtype=np.uint8)
    cached = batch.all_slots()
    k = rng.normal(size=(len(cached), 128)).astype(np.float32)
    write_indexer_k(cache, k, cached[:, 2], 128, ue8m0=True, shuffle=shuffle)
    layout = mapping.INDEXER_SHUFFLE if shuffle else mapping.INDEXER_BLOCKS
    heads_idx, topk = int(rng.choice([4, 64])), int(rng.integers(20, 90))
    q_fp8 = ac.to_fp8_e4m3(rng.normal(scale=2.0, size=(batch.num_tokens, heads_idx, 128)))
    weights = rng.normal(size=(batch.num_tokens, heads_idx)).astype(np.float32)
    buf = np.full((batch.num_tokens + 3, topk), POISON, np.int32)
    calls.run_indexer(client, md, q_fp8, weights, cache, 128, topk, buf, index_layout=layout)
    mcache, k_scale = fill_mla_cache(rng, batch, mla_cache)
    heads = int(rng.choice([8, 16]))
    q = ac.to_bf16(rng.normal(size=(batch.num_tokens, heads, 576)).astype(np.float32))
    out, lse = calls.run_sparse_mla(
        client, q, mcache, buf, batch.req_id_per_token, batch.block_table, 0.05, k_scale
    )

    tbuf = torch.full(buf.shape, POISON, dtype=torch.int32)
    no_host_reads(monkeypatch)
    tmd = torch_metadata(md)
    for chunk in tmd.prefill.chunks:  # vLLM's chunks carry their key count
        chunk.total_seq_lens = int(chunk.local_cu_seq_lens[-1])
    calls.run_indexer(
        client,
        tmd,
        as_torch(np.asarray(ac.dtypes.as_raw(np.asarray(q_fp8))), "fp8"),
        as_torch(weights),
        as_torch(cache),
        128,
        topk,
        tbuf,
        index_layout=layout,
    )
    tout, tlse = calls.run_sparse_mla(
        client,
        as_torch(q, "bf16"),
        as_torch(mcache, "bf16" if mcache.dtype == np.uint16 else None),
        tbuf,
        as_torch(batch.req_id_per_token),
        as_torch(batch.block_table),
        0.05,
        k_scale,
    )
    monkeypatch.undo()
    np.testing.assert_array_equal(tbuf.numpy(), buf)
    np.testing.assert_array_equal(bits(tout), ac.dtypes.as_raw(out))
    np.testing.assert_array_equal(tlse.numpy(), lse)


def test_device_gathers_and_slots_match_the_host(rng):
    """gather_indexer_k_device and request_positions_to_slots_device against the host forms on
    valid metadata; on garbage (block ids past the cache, negative ones, request ids past the
    table) they answer zeros / -1 instead of reading out of range."""
    for shuffle in (False, True):
        layout = mapping.INDEXER_SHUFFLE if shuffle else mapping.INDEXER_BLOCKS
        cache = rng.integers(0, 256, (9, 64, 132), dtype=np.uint8)
        table = rng.permutation(9)[:8].reshape(2, 4).astype(np.int32)
        cu = np.array([0, 150, 150 + 200], np.int32)
        want = mapping.gather_indexer_k(cache, table, cu, 128, layout)
        got = mapping.gather_indexer_k_device(
            as_torch(cache), as_torch(table), as_torch(cu), 128, int(cu[-1]), layout
        )
        np.testing.assert_array_equal(got[0].numpy(), want[0])
        np.testing.assert_array_equal(got[1].numpy().view(np.uint32), want[1].view(np.uint32))
        bad = table.copy()
        bad[0, 1], bad[1, 0] = 99, -3
        k, s = mapping.gather_indexer_k_device(
            as_torch(cache), as_torch(bad), as_torch(cu), 128, int(cu[-1]), layout
        )
        assert (k[64:128] == 0).all() and (s[64:128] == 0).all()
        assert (k[150:214] == 0).all() and (s[150:214] == 0).all()
        np.testing.assert_array_equal(k[:64].numpy(), want[0][:64])
    table = rng.integers(0, 50, (3, 4)).astype(np.int32)
    req = np.array([0, 0, 1, 2], np.int32)
    pos = rng.integers(-1, 4 * 16 + 20, (4, 9)).astype(np.int32)
    want = mapping.request_positions_to_slots(req, table, pos, 16)
    got = mapping.request_positions_to_slots_device(
        as_torch(req), as_torch(table), as_torch(pos), 16
    )
    np.testing.assert_array_equal(got.numpy(), want)
    bad_req = np.array([0, 7, -1, 2], np.int32)
    got = mapping.request_positions_to_slots_device(
        as_torch(bad_req), as_torch(table), as_torch(pos), 16
    ).numpy()
    assert (got[1] == -1).all() and (got[2] == -1).all()
    np.testing.assert_array_equal(got[[0, 3]], want[[0, 3]])


def test_packing_of_garbage_decode_lens_stays_in_range():
    """Uneven decodes packed on the device with decode_lens that do not fit (too long, negative,
    not adding up to the tokens): every index clamped, rows and sources in range, no error."""
    t, next_n = 5, 3
    seq = torch.full((3, next_n), 7, dtype=torch.int32)
    for lens in ([9, -2, 4], [0, 0, 0], [3, 3, 3], [1, 1, 1]):
        decode = SimpleNamespace(
            block_table=torch.zeros((3, 2), dtype=torch.int32),
            seq_lens=seq,
            decode_lens=torch.tensor(lens, dtype=torch.int32),
            requires_padding=True,
        )
        shape = mapping._decode_shape(decode, t, torch.zeros(t, 4))
        assert shape is not None and shape.batch == 3 and shape.next_n == next_n
        assert 0 <= int(shape.token_rows.min()) and int(shape.token_rows.max()) < 3 * next_n
        assert 0 <= int(shape.source.min()) and int(shape.source.max()) < t
        x = torch.arange(t * 4, dtype=torch.float32).reshape(t, 4)
        packed = mapping._pack(shape, x)
        assert packed.shape == (3 * next_n, 4)
        assert (packed[~shape.used] == 0).all()
        assert mapping._unpack(shape, packed).shape == (t, 4)
