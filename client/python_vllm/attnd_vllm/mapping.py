"""vLLM's DeepSeek-V3.2 tensors and metadata -> attnd request fields, as plain functions that
import neither vLLM nor torch (docs/VLLM.md says which vLLM source the layouts were read from).

Inputs are NumPy arrays, torch tensors, or objects with the attribute names of vLLM's metadata
classes (a types.SimpleNamespace does). Cache tensors are only re-viewed (never copied), so a
cache that lies in a registered attnd region still travels as a region reference (zero copy);
small metadata (block tables, lengths, req_id_per_token) is read on the host.

    rows, bs = indexer_cache_rows(kv_cache, head_dim=128)   # attnd kv_cache [blocks, bs*(D+4)]
    slots = request_positions_to_slots(req_id_per_token, block_table, positions, block_size)
    call = dsa_decode(decode, q_fp8, weights, index_cache, q, mla_cache, tokens, 128, 2048, s)

Every cache is sent with its layout named (kv_layout, kv_cache_layout, index_cache_layout:
docs/CONTRACTS.md "Named layouts"), never left to attnd's dtype / shape inference.
"""

from typing import Any, NamedTuple

import numpy as np

from attnd_client.dtypes import as_raw

# vLLM's sparse MLA cache row in its fp8_ds_mla format (docs/CONTRACTS.md "FP8 KV cache").
FP8_DS_MLA_ROW_BYTES = 656
MLA_HEAD_DIM = 576  # 512 latent + 64 rope columns (the bf16 cache, kv_cache_dtype "auto")
# kv_cache_dtype "fp8": one e4m3 code per column and the layer's k_scale (docs/CONTRACTS.md
# "Per-tensor FP8 KV cache"), 576 bytes (DeepSeek) or 512 (GLM-5.3-Flash, no rope).
FP8_PER_TENSOR_ROW_BYTES = (576, 512)

# Indexer cache layouts (docs/INDEXER_CACHES.md): vLLM on CUDA, and on ROCm at block size 1
# ("NORMAL"), stores each block's keys one after the other; on ROCm at block size > 1 ("SHUFFLE")
# the codes lie in 16-token x 16-byte tiles, which attnd reads only when the layout is named.
INDEXER_BLOCKS = "INDEXER_FP8_BLOCKS"
INDEXER_SHUFFLE = "INDEXER_AITER_SHUFFLE_16"
INDEXER_LAYOUTS = (INDEXER_BLOCKS, INDEXER_SHUFFLE)
SHUFFLE_TILE = 16  # tokens and bytes of one tile of the shuffled layout


def is_torch(x: Any) -> bool:
    """Whether x is a torch tensor (checked without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "storage_offset")


def host(x: Any, dtype: Any = None) -> np.ndarray:
    """A host NumPy array of small metadata (a torch tensor is copied to the host). bf16 / fp8
    values come as their raw bits (uint16 / uint8), also when the attnd client returned them as
    ml_dtypes arrays (it does when ml_dtypes is installed)."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    a = as_raw(np.asarray(x))
    return a.astype(dtype, copy=False) if dtype is not None else a


def _row_view(x: Any, rows: int, width: int, row_stride: int) -> Any:
    """x re-viewed as [rows, width] elements with the given row stride (elements), no copy."""
    if is_torch(x):
        return x.as_strided((rows, width), (row_stride, 1), x.storage_offset())
    itemsize = x.dtype.itemsize
    return np.lib.stride_tricks.as_strided(x, (rows, width), (row_stride * itemsize, itemsize))


def _strides(x: Any) -> tuple[int, ...]:
    """Strides in elements of an array or tensor."""
    if is_torch(x):
        return tuple(x.stride())
    return tuple(s // x.dtype.itemsize for s in x.strides)


def _is_byte_cache(x: Any) -> bool:
    """Whether a cache tensor holds bytes (uint8, or torch's float8_e4m3fn view of them)."""
    if is_torch(x):
        return str(x.dtype) in ("torch.uint8", "torch.float8_e4m3fn")
    return x.dtype == np.uint8


def _as_u8(x: Any) -> Any:
    """The bytes of a cache tensor as uint8 (a view: torch .view, NumPy .view)."""
    if is_torch(x):
        import torch  # only reached with a torch tensor in hand

        return x.view(torch.uint8)
    return x.view(np.uint8)


# ---- indexer K cache ----


def indexer_cache_rows(kv_cache: Any, head_dim: int) -> tuple[Any, int]:
    """vLLM's indexer K cache u8 [num_blocks, block_size, head_dim + 4] (its cache writer puts a
    block's block_size fp8 keys first, then their block_size f32 scales: one scale per token,
    quant block = head_dim) -> (attnd kv_cache u8 [num_blocks, block_size * (head_dim + 4)],
    block_size), a view. The block stride may exceed the block's bytes (attnd takes a row
    stride); inside a block the bytes must be dense."""
    kv = _as_u8(kv_cache)
    if len(kv.shape) != 3:
        raise ValueError(f"indexer kv_cache: rank {len(kv.shape)}, want 3 [blocks, bs, D+4]")
    blocks, block_size, width = (int(d) for d in kv.shape)
    if width != head_dim + 4:
        raise ValueError(
            f"indexer kv_cache: dim 2 is {width}, want head_dim + 4 = {head_dim + 4} "
            "(one f32 scale per token: quant block size = head_dim)"
        )
    s0, s1, s2 = _strides(kv)
    if s2 != 1 or s1 != width or s0 < block_size * width:
        raise ValueError(f"indexer kv_cache: strides {(s0, s1, s2)}, want dense blocks")
    return _row_view(kv, blocks, block_size * width, s0), block_size


def indexer_layout(block_size: int, rocm: bool = False) -> str:
    """The layout vLLM writes its indexer cache in (docs/INDEXER_CACHES.md): SHUFFLE on ROCm
    when the block holds more than one token, the blocks layout otherwise."""
    return INDEXER_SHUFFLE if rocm and block_size > 1 else INDEXER_BLOCKS


def _check_indexer_layout(layout: str, block_size: int, head_dim: int) -> str:
    if layout not in INDEXER_LAYOUTS:
        raise ValueError(f"indexer layout {layout!r}; want one of {INDEXER_LAYOUTS}")
    if layout == INDEXER_SHUFFLE and (block_size % SHUFFLE_TILE or head_dim % SHUFFLE_TILE):
        raise ValueError(
            f"indexer layout {layout}: block_size {block_size} and head_dim {head_dim} must be "
            f"multiples of {SHUFFLE_TILE}"
        )
    return layout


def _code_offsets(off: np.ndarray, head_dim: int, layout: str) -> np.ndarray:
    """Byte offsets inside a block of the head_dim codes of slots `off` ([n] -> [n, head_dim]):
    slot t's byte d at t * D + d (blocks), or at (t / 16) * 16 * D + (d / 16) * 256 +
    (t % 16) * 16 + d % 16 (shuffled; docs/CONTRACTS.md "indexer_logits_paged")."""
    d = np.arange(head_dim)
    t = off[:, None]
    if layout == INDEXER_BLOCKS:
        return t * head_dim + d
    tile = SHUFFLE_TILE
    return (t // tile) * tile * head_dim + (d // tile) * tile * tile + (t % tile) * tile + d % tile


def gather_indexer_k(
    kv_cache: Any,
    block_table: Any,
    cu_seq_lens: Any,
    head_dim: int,
    layout: str = INDEXER_BLOCKS,
) -> tuple[np.ndarray, np.ndarray]:
    """The keys of a prefill chunk's requests, gathered from the paged indexer cache in request
    order (what vLLM's cp_gather step does on the GPU): (k u8 [total, head_dim], k_scale f32
    [total]). Request r's tokens are rows cu_seq_lens[r] .. cu_seq_lens[r+1] of the result and
    its position n lives in block block_table[r, n // block_size]; `layout` says where a slot's
    codes lie in its block (INDEXER_BLOCKS or INDEXER_SHUFFLE). Runs on the host."""
    rows, block_size = indexer_cache_rows(kv_cache, head_dim)
    _check_indexer_layout(layout, block_size, head_dim)
    rows = host(rows)
    table = host(block_table, np.int64)
    cu = host(cu_seq_lens, np.int64)
    total = int(cu[-1])
    k = np.zeros((total, head_dim), np.uint8)
    scale = np.zeros(total, np.float32)
    values_bytes = block_size * head_dim
    for r in range(cu.shape[0] - 1):
        n = np.arange(int(cu[r + 1] - cu[r]))
        blocks = table[r, n // block_size]
        off = n % block_size
        k[cu[r] : cu[r + 1]] = rows[blocks[:, None], _code_offsets(off, head_dim, layout)]
        sb = values_bytes + 4 * off[:, None] + np.arange(4)
        scale[cu[r] : cu[r + 1]] = rows[blocks[:, None], sb].copy().view("<f4")[:, 0]
    return k, scale


def on_one_device(*tensors: Any) -> bool:
    """Whether every argument is a torch tensor and all lie on one device (the device forms:
    docs/VLLM.md "On the tensors' own device")."""
    if not tensors or not all(is_torch(t) for t in tensors):
        return False
    device = tensors[0].device
    return all(t.device == device for t in tensors)


def gather_indexer_k_device(
    kv_cache: Any,
    block_table: Any,
    cu_seq_lens: Any,
    head_dim: int,
    total: int,
    layout: str = INDEXER_BLOCKS,
) -> tuple[Any, Any]:
    """gather_indexer_k with torch ops on the cache's device, nothing read on the host: `total`
    (= cu_seq_lens[-1]) sizes the result. A row whose block-table column or block id lies
    outside the table or the cache (garbage metadata) gets zero codes and a zero scale instead
    of an out-of-range read."""
    import torch

    rows, block_size = indexer_cache_rows(kv_cache, head_dim)
    _check_indexer_layout(layout, block_size, head_dim)
    dev = rows.device
    rows = rows.view(torch.uint8)
    cu = cu_seq_lens.to(torch.int64)
    table = block_table.to(torch.int64)
    i = torch.arange(total, device=dev)
    req = torch.searchsorted(cu[1:].contiguous(), i, right=True).clamp(
        max=max(table.shape[0] - 1, 0)
    )
    n = i - cu[req]
    col = torch.div(n, block_size, rounding_mode="floor")
    ok = (n >= 0) & (col < table.shape[1]) & (table.shape[0] > 0)
    block = table[req, col.clamp(0, max(table.shape[1] - 1, 0))] if table.numel() else n * 0
    ok &= (block >= 0) & (block < rows.shape[0])
    block = torch.where(ok, block, 0)
    off = torch.where(ok, n % block_size, 0)
    d = torch.arange(head_dim, device=dev)
    t = off[:, None]
    if layout == INDEXER_BLOCKS:
        where_codes = t * head_dim + d
    else:
        tile = SHUFFLE_TILE
        where_codes = (
            (t // tile) * tile * head_dim + (d // tile) * tile * tile + (t % tile) * tile + d % tile
        )
    k = torch.where(ok[:, None], rows[block[:, None], where_codes], 0)
    sb = block_size * head_dim + 4 * t + torch.arange(4, device=dev)
    scale = rows[block[:, None], sb].contiguous().view(torch.float32)[:, 0]
    return k, torch.where(ok, scale, 0.0)


def request_positions_to_slots_device(
    req_id_per_token: Any, block_table: Any, positions: Any, block_size: int
) -> Any:
    """request_positions_to_slots with torch ops on the tensors' device, nothing read on the
    host; a token whose request id lies outside the table (garbage metadata) gets -1 slots."""
    import torch

    pos = positions.to(torch.int64)
    t = int(pos.shape[0])
    table = block_table.to(torch.int64)
    req = req_id_per_token[:t].to(torch.int64)
    if table.shape[0] == 0 or table.shape[1] == 0:
        return torch.full(pos.shape, -1, dtype=torch.int32, device=pos.device)
    req_ok = (req >= 0) & (req < table.shape[0])
    blk = torch.where(pos >= 0, torch.div(pos, block_size, rounding_mode="floor"), -1)
    ok = (pos >= 0) & (blk < table.shape[1]) & req_ok[:, None]
    page = table[req.clamp(0, table.shape[0] - 1)[:, None], blk.clamp(0, table.shape[1] - 1)]
    slots = torch.where(ok, page * block_size + pos % block_size, -1)
    good = (slots >= 0) & (slots <= torch.iinfo(torch.int32).max)
    return torch.where(good, slots, -1).to(torch.int32)


class PrefillChunkCalls(NamedTuple):
    """attnd's two calls for one vLLM indexer prefill chunk, and where the result goes."""

    indexer_logits: dict[str, Any]  # client.indexer_logits(**...) (without logits)
    topk: dict[str, Any]  # client.topk(logits=..., **...)
    token_start: int  # rows token_start .. token_end of vLLM's topk_indices_buffer
    token_end: int


def _chunk_attr(chunk: Any, *names: str) -> Any:
    for name in names:
        if getattr(chunk, name, None) is not None:
            return getattr(chunk, name)
    raise AttributeError(f"prefill chunk has none of {names}")


def indexer_prefill_chunk(
    chunk: Any,
    q_fp8: Any,
    weights: Any,
    kv_cache: Any,
    head_dim: int,
    topk_tokens: int,
    layout: str = INDEXER_BLOCKS,
) -> PrefillChunkCalls:
    """One chunk of vLLM's indexer prefill metadata (cu_seqlen_ks / cu_seqlen_ke per token into
    the chunk's gathered keys, block_table and cu_seq_lens of its requests, token_start /
    token_end) -> attnd indexer_logits + topk with index_base "row_start", so the written
    indices are positions inside each request, the form vLLM's top-k writes and its sparse MLA
    backend converts to cache slots."""
    start, end = int(chunk.token_start), int(chunk.token_end)
    cu = _chunk_attr(chunk, "local_cu_seq_lens", "cu_seq_lens")
    k, k_scale = gather_indexer_k(kv_cache, chunk.block_table, cu, head_dim, layout)
    ks = host(chunk.cu_seqlen_ks, np.int32)
    ke = host(chunk.cu_seqlen_ke, np.int32)
    logits_call = {
        "q": q_fp8[start:end],
        "k": k,
        "k_scale": k_scale,
        "weights": weights[start:end],
        "ks": ks,
        "ke": ke,
        "clean_logits": True,
    }
    topk_call = {"ks": ks, "ke": ke, "k": topk_tokens, "index_base": "row_start"}
    return PrefillChunkCalls(logits_call, topk_call, start, end)


class DecodeRows(NamedTuple):
    """Where vLLM's decode tokens go in attnd's [B, next_n] rows, and their lengths."""

    batch: int  # B, the decode requests
    next_n: int
    token_rows: np.ndarray  # int64 [num_decode_tokens]: the row b * next_n + j of each token
    packed: bool  # rows != 0 .. tokens - 1 (uneven decode_lens): inputs are packed, rows zeroed
    seq_lens: np.ndarray  # i32 [B] or [B, next_n], vLLM's as given
    lengths: np.ndarray  # i32 [B * next_n]: each row's length (docs/CONTRACTS.md), 0 if padding


def decode_token_rows(decode_lens: Any, next_n: int) -> np.ndarray:
    """Row b * next_n + j of each decode token (request b's j-th new token), in token order."""
    lens = host(decode_lens, np.int64)
    return np.concatenate(
        [b * next_n + np.arange(n) for b, n in enumerate(lens)] or [np.zeros(0, np.int64)]
    ).astype(np.int64)


def decode_rows(decode: Any, num_decode_tokens: int) -> DecodeRows:
    """vLLM's indexer decode metadata (seq_lens [B, next_n] per token or [B], decode_lens [B],
    requires_padding) -> the rows of its tokens and the per-row lengths: [B] lengths mean token
    j sees L - next_n + j + 1 positions (docs/CONTRACTS.md); rows no token fills get 0."""
    decode_lens = host(decode.decode_lens, np.int64)
    batch = int(decode_lens.shape[0])
    seq_lens = host(decode.seq_lens, np.int32)[:batch]
    padded = bool(getattr(decode, "requires_padding", False))
    if seq_lens.ndim == 2:
        next_n = int(seq_lens.shape[1])
    elif padded:
        next_n = int(decode_lens.max(initial=1))
    else:
        next_n = max(num_decode_tokens // max(batch, 1), 1)
    rows = decode_token_rows(decode_lens, next_n)
    if rows.shape[0] != num_decode_tokens:
        raise ValueError(f"decode_lens sum to {rows.shape[0]}, want {num_decode_tokens} tokens")
    if seq_lens.ndim == 2:
        lengths = seq_lens.astype(np.int64).reshape(-1)
    else:
        j = np.arange(next_n, dtype=np.int64)
        lengths = (seq_lens.astype(np.int64)[:, None] - next_n + j[None, :] + 1).reshape(-1)
    lengths = np.clip(lengths, 0, np.iinfo(np.int32).max).astype(np.int32)
    packed = padded or rows.shape[0] != batch * next_n
    if packed:
        used = np.zeros(batch * next_n, bool)
        used[rows] = True
        lengths = np.where(used, lengths, 0).astype(np.int32)
    return DecodeRows(batch, next_n, rows, packed, seq_lens, lengths)


def pack_rows(x: Any, rows: np.ndarray, total: int) -> Any:
    """x [n, ...] placed at `rows` of a zeroed [total, ...] (same dtype and device), for NumPy
    arrays and torch tensors (1-byte dtypes such as float8 moved as bytes)."""
    if is_torch(x):
        import torch

        src = x.view(torch.uint8) if x.element_size() == 1 else x
        out = torch.zeros((total, *src.shape[1:]), dtype=src.dtype, device=src.device)
        out.index_copy_(0, torch.as_tensor(rows, device=src.device), src.contiguous())
        return out.view(x.dtype) if src is not x else out
    out = np.zeros((total, *x.shape[1:]), x.dtype)
    out[rows] = x
    return out


def _decode_inputs(layout: DecodeRows, num_tokens: int, *tensors: Any) -> list[Any]:
    """The decode tokens' rows of each tensor, packed into B * next_n rows when uneven."""
    total = layout.batch * layout.next_n
    cut = [t[:num_tokens] for t in tensors]
    return [pack_rows(t, layout.token_rows, total) for t in cut] if layout.packed else cut


class DecodeCalls(NamedTuple):
    """attnd's two calls for vLLM's indexer decode metadata, and where each row goes."""

    indexer_logits_paged: dict[str, Any]  # client.indexer_logits_paged(**...)
    topk: dict[str, Any]  # client.topk(logits=..., **...)
    token_rows: np.ndarray  # int64 [num_decode_tokens]: the logits row of each decode token


def indexer_decode(
    decode: Any,
    q_fp8: Any,
    weights: Any,
    kv_cache: Any,
    num_decode_tokens: int,
    head_dim: int,
    topk_tokens: int,
    layout: str = INDEXER_BLOCKS,
) -> DecodeCalls:
    """vLLM's indexer decode metadata (block_table [B, max_blocks], seq_lens [B, next_n] per
    token or [B], decode_lens [B], requires_padding) and the decode tokens' fp8 q [tokens, H, D]
    and weights [tokens, H] -> attnd indexer_logits_paged (context_lens taken as they are;
    kv_cache_layout = `layout`) + topk with per-row lengths, whose indices are positions inside
    each request. Uneven decode_lens (requires_padding) are packed into [B, next_n] rows."""
    rows = decode_rows(decode, num_decode_tokens)
    q, w = _decode_inputs(rows, num_decode_tokens, q_fp8, weights)
    cache, block_size = indexer_cache_rows(kv_cache, head_dim)
    paged = {
        "q": q.reshape(rows.batch, rows.next_n, *q.shape[1:]),
        "kv_cache": cache,
        "kv_cache_layout": _check_indexer_layout(layout, block_size, head_dim),
        "block_size": block_size,
        "block_table": host(decode.block_table, np.int32)[: rows.batch],
        "context_lens": rows.seq_lens,
        "weights": w,
    }
    return DecodeCalls(paged, {"lengths": rows.lengths, "k": topk_tokens}, rows.token_rows)


class DsaDecodeCall(NamedTuple):
    """attnd's one paged dsa_attention call for a decode-only step, and how to read it back."""

    dsa_attention: dict[str, Any]  # client.dsa_attention(**...): out, lse and indices (kv rows)
    token_rows: np.ndarray  # int64 [num_decode_tokens]: the output row of each decode token
    block_table: np.ndarray  # i32 [B, max_blocks], shared by both caches (vLLM's)
    block_size: int  # tokens per block of both caches
    lengths: np.ndarray  # i32 [B * next_n]: the rows' lengths (bounds the table entries read)


def _dsa_caches(
    index_cache: Any, mla_cache: Any, head_dim: int, index_layout: str, k_scale: float | None
) -> tuple[Any, int, str, Any, str, float | None]:
    """Both caches of a paged dsa_attention call as attnd views: (index rows, block size, index
    layout, kv rows, kv layout, kv_scale or None). ValueError for a cache the paged form does not
    take, the per-tensor "fp8" MLA cache without k_scale, or caches of different block sizes."""
    cache, block_size = indexer_cache_rows(index_cache, head_dim)
    index_layout = _check_indexer_layout(index_layout, block_size, head_dim)
    kv, kv_block_size = mla_cache_rows(mla_cache)
    kv_layout = mla_cache_layout(kv)
    kv_scale = _kv_scale(kv_layout, k_scale)
    if kv_block_size != block_size:
        raise ValueError(
            f"mla kv_cache block size {kv_block_size} != indexer cache block size {block_size}: "
            "one block table cannot address both"
        )
    return cache, block_size, index_layout, kv, kv_layout, kv_scale


def dsa_decode(
    decode: Any,
    q_fp8: Any,
    weights: Any,
    index_cache: Any,
    q: Any,
    mla_cache: Any,
    num_decode_tokens: int,
    head_dim: int,
    topk_tokens: int,
    sm_scale: float,
    index_layout: str = INDEXER_BLOCKS,
    k_scale: float | None = None,
) -> DsaDecodeCall:
    """A decode-only step as one paged dsa_attention call (docs/CONTRACTS.md "dsa_attention",
    "Paged form"): vLLM's indexer decode metadata, the indexer's fp8 q [tokens, H_i, D] and
    weights [tokens, H_i], its paged cache, the MLA q [tokens, H, d_qk] and the MLA cache
    (fp8_ds_mla 656-byte rows, bf16 576, or the per-tensor "fp8" cache's 576 / 512 codes with
    the layer's k_scale sent as kv_scale) viewed flat as kv rows. vLLM gives both caches one
    block table and one block size, so kv_block_table stays unset. Both layouts are named.
    ValueError for the per-tensor "fp8" MLA cache without k_scale, or caches of different block
    sizes."""
    rows = decode_rows(decode, num_decode_tokens)
    index_q, w, mla_q = _decode_inputs(rows, num_decode_tokens, q_fp8, weights, q)
    cache, block_size, index_layout, kv, kv_layout, kv_scale = _dsa_caches(
        index_cache, mla_cache, head_dim, index_layout, k_scale
    )
    table = host(decode.block_table, np.int32)[: rows.batch]
    fields = {
        "index_q": index_q.reshape(rows.batch, rows.next_n, *index_q.shape[1:]),
        "index_weights": w,
        "index_cache": cache,
        "index_cache_layout": index_layout,
        "index_block_size": block_size,
        "index_block_table": table,
        "context_lens": rows.lengths.reshape(rows.batch, rows.next_n)
        if rows.packed
        else rows.seq_lens,
        "topk": int(topk_tokens),
        "q": mla_q,
        "kv": kv,
        "kv_layout": kv_layout,
        "sm_scale": float(sm_scale),
        "indices": True,
    }
    if kv_scale is not None:
        fields["kv_scale"] = kv_scale
    return DsaDecodeCall(fields, rows.token_rows, table, block_size, rows.lengths)


def kv_rows_to_positions(call: DsaDecodeCall, kv_rows: Any) -> np.ndarray:
    """dsa_attention's chosen kv rows [B * next_n, topk] (table[b, n / bs] * bs + n % bs, -1
    padded) -> positions n inside each row's request, -1 padded: the form vLLM's
    topk_indices_buffer holds. Only the table entries a row's request can read (its longest
    length) are searched, so vLLM's zeroed unused entries do not alias page 0; a page repeated
    inside that range (hostile or garbage tables) reads back as its first entry's position."""
    got = host(kv_rows, np.int64)
    bs = call.block_size
    table = call.block_table.astype(np.int64)
    next_n = got.shape[0] // max(table.shape[0], 1)
    pos = np.full(got.shape, -1, np.int64)
    for b in range(table.shape[0]):
        r = slice(b * next_n, (b + 1) * next_n)
        longest = int(call.lengths[r].max(initial=0))
        entries = table[b, : min(-(-longest // bs), table.shape[1])]
        if entries.shape[0] == 0:
            continue
        order = np.argsort(entries, kind="stable")  # a repeated page: its first entry
        ordered = entries[order]
        rows = got[r]
        k = np.minimum(np.searchsorted(ordered, rows // bs), ordered.shape[0] - 1)
        hit = (rows >= 0) & (ordered[k] == rows // bs)
        pos[r] = np.where(hit, order[k] * bs + rows % bs, -1)
    return pos.astype(np.int32)


# ---- the fused decode on the tensors' own device ----


class DsaDecodeDevice(NamedTuple):
    """The fused decode call with every tensor left where vLLM keeps it (dsa_decode_device)."""

    dsa_attention: dict[str, Any]  # client.dsa_attention(**...), outputs not yet placed
    batch: int  # B
    next_n: int
    block_table: Any  # i32 [B, max_blocks] tensor, shared by both caches
    block_size: int
    blocks: Any  # i64 [B] tensor: the table entries each request's longest row can reach
    shape: Any  # DecodeShape: the rows of the tokens (uneven decodes are packed)


def dsa_decode_device(
    decode: Any,
    q_fp8: Any,
    weights: Any,
    index_cache: Any,
    q: Any,
    mla_cache: Any,
    num_decode_tokens: int,
    head_dim: int,
    topk_tokens: int,
    sm_scale: float,
    index_layout: str = INDEXER_BLOCKS,
    k_scale: float | None = None,
) -> DsaDecodeDevice | None:
    """dsa_decode for a step whose tensors (q, weights, both caches, block_table, seq_lens,
    decode_lens) are torch tensors on one device and whose decodes are even (not
    requires_padding, tokens = B * next_n): the same fields, with nothing read on the host —
    block_table and seq_lens go as the tensors they are (int32), shapes give B and next_n, and
    the lengths kv_rows_to_positions_device needs are computed on the device. None when the step
    needs the host path (dsa_decode); ValueError as dsa_decode's."""
    shape = _decode_shape(decode, num_decode_tokens, q_fp8, weights, index_cache, q, mla_cache)
    if shape is None:
        return None
    import torch

    batch, next_n = shape.batch, shape.next_n
    cache, block_size, index_layout, kv, kv_layout, kv_scale = _dsa_caches(
        index_cache, mla_cache, head_dim, index_layout, k_scale
    )
    table = decode.block_table[:batch].to(torch.int32)
    seq = _context_lens_device(decode, shape)
    t = num_decode_tokens
    fields = {
        "index_q": _pack(shape, q_fp8[:t]).reshape(batch, next_n, *q_fp8.shape[1:]),
        "index_weights": _pack(shape, weights[:t]),
        "index_cache": cache,
        "index_cache_layout": index_layout,
        "index_block_size": block_size,
        "index_block_table": table,
        "context_lens": seq,
        "topk": int(topk_tokens),
        "q": _pack(shape, q[:t]),
        "kv": kv,
        "kv_layout": kv_layout,
        "sm_scale": float(sm_scale),
    }
    if kv_scale is not None:
        fields["kv_scale"] = kv_scale
    # The table entries the longest row of a request reaches (its length: docs/CONTRACTS.md
    # "dsa_attention", "Paged form"): what kv_rows_to_positions searches.
    longest = _row_lengths_device(seq, next_n).amax(dim=1)  # seq: unused rows already 0
    blocks = torch.div(longest + block_size - 1, block_size, rounding_mode="floor")
    blocks = blocks.clamp(max=int(table.shape[1]))
    return DsaDecodeDevice(fields, batch, next_n, table, block_size, blocks, shape)


class DecodeShape(NamedTuple):
    """Where a decode step's tokens go in attnd's [B, next_n] rows, on the tensors' device."""

    batch: int  # B
    next_n: int
    token_rows: Any  # None (even: token t is row t), or i64 [tokens]: the row of each token
    source: Any  # None, or i64 [B * next_n]: the token each row packs (clamped; see `used`)
    used: Any  # None, or bool [B * next_n]: the rows a token fills


def _decode_shape(decode: Any, num_decode_tokens: int, *tensors: Any) -> DecodeShape | None:
    """The rows of a decode whose tensors all lie on one torch device, nothing read on the host:
    even decodes (not requires_padding, tokens = B * next_n) from shapes alone; uneven ones
    (requires_padding) when seq_lens is per token [B, next_n] (next_n from its shape), each
    request's tokens packed into its first decode_lens rows as decode_rows packs them, with
    every index clamped (decode_lens that do not add up give rows of zeros, never an
    out-of-range index). None otherwise (the host form)."""
    meta = (decode.block_table, decode.seq_lens, decode.decode_lens)
    if not on_one_device(*tensors, *meta):
        return None
    batch = int(decode.decode_lens.shape[0])
    seq = decode.seq_lens
    t = num_decode_tokens
    if not getattr(decode, "requires_padding", False):
        next_n = int(seq.shape[1]) if seq.dim() == 2 else t // max(batch, 1)
        if batch == 0 or next_n < 1 or batch * next_n != t:
            return None
        return DecodeShape(batch, next_n, None, None, None)
    if seq.dim() != 2 or batch == 0 or int(seq.shape[1]) < 1 or t < 1:
        return None
    import torch

    next_n, dev = int(seq.shape[1]), seq.device
    lens = decode.decode_lens[:batch].to(torch.int64).clamp(0, next_n)
    ends = torch.cumsum(lens, 0)
    starts = ends - lens
    j = torch.arange(next_n, device=dev, dtype=torch.int64)
    token = starts[:, None] + j[None, :]
    used = ((j[None, :] < lens[:, None]) & (token < t)).reshape(-1)
    source = token.clamp(0, t - 1).reshape(-1)
    tok = torch.arange(t, device=dev, dtype=torch.int64)
    b = torch.searchsorted(ends, tok, right=True).clamp(max=batch - 1)
    rows = (b * next_n + tok - starts[b]).clamp(0, batch * next_n - 1)
    return DecodeShape(batch, next_n, rows, source, used)


def _pack(shape: DecodeShape, x: Any) -> Any:
    """x [tokens, ...] in the shape's rows [B * next_n, ...] (zeros in rows no token fills), as
    pack_rows packs it; x itself when the decode is even."""
    if shape.token_rows is None:
        return x
    import torch

    src = x.view(torch.uint8) if x.element_size() == 1 else x
    packed = src.index_select(0, shape.source)
    mask = shape.used.reshape(-1, *([1] * (packed.dim() - 1)))
    packed = torch.where(mask, packed, torch.zeros((), dtype=packed.dtype, device=packed.device))
    return packed.view(x.dtype) if src is not x else packed


def _unpack(shape: DecodeShape, x: Any) -> Any:
    """Rows [B * next_n, ...] back in token order [tokens, ...] (x itself when even)."""
    if shape.token_rows is None:
        return x
    return x.index_select(0, shape.token_rows)


def _row_lengths_device(seq: Any, next_n: int) -> Any:
    """Each decode row's length as i64 [B, next_n] from seq_lens [B, next_n] (per token) or [B]
    (token j sees L - next_n + j + 1), clamped at 0: decode_rows' lengths, on the device."""
    import torch

    lengths = seq.to(torch.int64)
    if lengths.dim() == 1:
        j = torch.arange(next_n, device=seq.device, dtype=torch.int64)
        lengths = lengths[:, None] - next_n + j[None, :] + 1
    return lengths.clamp(min=0).reshape(-1, next_n)


def _context_lens_device(decode: Any, shape: DecodeShape) -> Any:
    """context_lens of the call, i32: vLLM's seq_lens as given when even; packed decodes send
    [B, next_n] with the rows no token fills set to 0, as dsa_decode does."""
    import torch

    seq = decode.seq_lens[: shape.batch].to(torch.int32)
    if shape.token_rows is None:
        return seq
    lengths = seq.to(torch.int64).clamp(0, torch.iinfo(torch.int32).max).reshape(-1)
    lengths = torch.where(shape.used, lengths, 0).to(torch.int32)
    return lengths.reshape(shape.batch, shape.next_n)


class IndexerDecodeDevice(NamedTuple):
    """indexer_decode's two calls with every tensor left on its device (indexer_decode_device)."""

    indexer_logits_paged: dict[str, Any]  # without logits: the caller places them
    topk: dict[str, Any]  # without logits and indices: the caller places them
    rows: int  # B * next_n
    columns: int  # the logits' width: max_blocks * block_size, as the inline reply has
    shape: Any  # DecodeShape: the rows of the tokens (uneven decodes are packed)


def indexer_decode_device(
    decode: Any,
    q_fp8: Any,
    weights: Any,
    kv_cache: Any,
    num_decode_tokens: int,
    head_dim: int,
    topk_tokens: int,
    layout: str = INDEXER_BLOCKS,
) -> IndexerDecodeDevice | None:
    """indexer_decode for a decode whose tensors all lie on one torch device and whose decodes
    are even: the same calls, nothing read on the host (the top-k's per-row lengths computed on
    the device). None when it needs the host form."""
    shape = _decode_shape(decode, num_decode_tokens, q_fp8, weights, kv_cache)
    if shape is None:
        return None
    import torch

    batch, next_n = shape.batch, shape.next_n
    cache, block_size = indexer_cache_rows(kv_cache, head_dim)
    table = decode.block_table[:batch].to(torch.int32)
    seq = decode.seq_lens[:batch].to(torch.int32)  # as given, as indexer_decode sends it
    t = num_decode_tokens
    paged = {
        "q": _pack(shape, q_fp8[:t]).reshape(batch, next_n, *q_fp8.shape[1:]),
        "kv_cache": cache,
        "kv_cache_layout": _check_indexer_layout(layout, block_size, head_dim),
        "block_size": block_size,
        "block_table": table,
        "context_lens": seq,
        "weights": _pack(shape, weights[:t]),
    }
    lengths = _row_lengths_device(seq, next_n).reshape(-1)
    if shape.used is not None:  # rows no token fills: length 0 (decode_rows)
        lengths = torch.where(shape.used, lengths, 0)
    lengths = lengths.clamp(max=torch.iinfo(torch.int32).max).to(torch.int32)
    topk = {"lengths": lengths, "k": topk_tokens}
    return IndexerDecodeDevice(paged, topk, batch * next_n, int(table.shape[1]) * block_size, shape)


def kv_rows_to_positions_device(call: DsaDecodeDevice, kv_rows: Any) -> Any:
    """kv_rows_to_positions on the kv rows' device (torch ops, nothing read on the host): the
    chosen kv rows [B * next_n, topk] -> positions inside each row's request, -1 padded, i32.
    The same answer: only a request's reachable table entries are searched, a repeated page
    reads back as its first entry's position."""
    import torch

    table = call.block_table.to(torch.int64)
    batch, width = int(table.shape[0]), int(table.shape[1])
    rows = kv_rows.to(torch.int64).reshape(batch, -1)
    if width == 0:
        return torch.full_like(kv_rows, -1, dtype=torch.int32)
    bs = call.block_size
    reach = torch.arange(width, device=table.device)[None, :] < call.blocks[:, None]
    never = torch.iinfo(torch.int64).max  # past every page: unreachable entries never match
    ordered, order = torch.sort(torch.where(reach, table, never), dim=1, stable=True)
    page = torch.div(rows, bs, rounding_mode="floor")
    k = torch.searchsorted(ordered, page).clamp(max=width - 1)
    hit = (rows >= 0) & (torch.gather(ordered, 1, k) == page)
    pos = torch.where(hit, torch.gather(order, 1, k) * bs + rows % bs, -1)
    return pos.reshape(kv_rows.shape).to(torch.int32)


# ---- sparse MLA ----


def mla_cache_rows(kv_cache: Any) -> tuple[Any, int]:
    """vLLM's sparse MLA cache [num_blocks, block_size, 656] (fp8_ds_mla bytes),
    [num_blocks, block_size, 576] (bf16), or the bytes of the "fp8" cache [num_blocks,
    block_size, 576 or 512] (per-tensor e4m3 codes) -> (attnd kv [num_blocks * block_size, row],
    block_size), a view: slot s is row s. The blocks must be dense (slot arithmetic assumes block
    stride = block_size rows)."""
    if len(kv_cache.shape) != 3:
        raise ValueError(f"mla kv_cache: rank {len(kv_cache.shape)}, want 3 [blocks, bs, row]")
    blocks, block_size, width = (int(d) for d in kv_cache.shape)
    kv = kv_cache
    if width == FP8_DS_MLA_ROW_BYTES or _is_byte_cache(kv):
        kv = _as_u8(kv)
        if width != FP8_DS_MLA_ROW_BYTES and width not in FP8_PER_TENSOR_ROW_BYTES:
            raise ValueError(
                f"mla kv_cache: {width}-byte rows, want {FP8_DS_MLA_ROW_BYTES} (fp8_ds_mla) or "
                f"576 / 512 (fp8, per-tensor scale)"
            )
    elif width != MLA_HEAD_DIM:
        raise ValueError(f"mla kv_cache: dim 2 is {width}, want 656 (fp8_ds_mla) or 576 (bf16)")
    s0, s1, s2 = _strides(kv)
    if s2 != 1 or s1 < width or s0 != block_size * s1:
        raise ValueError(f"mla kv_cache: strides {(s0, s1, s2)}, want dense blocks")
    return _row_view(kv, blocks * block_size, width, s1), block_size


# The per-tensor "fp8" MLA cache's layouts: read with the layer's k_scale as kv_scale, by
# sparse_mla and dsa_attention alike (docs/CONTRACTS.md "Per-tensor FP8 KV cache").
PER_TENSOR_KV_LAYOUTS = ("FP8_576_PER_TENSOR", "FP8_512_PER_TENSOR")


def _kv_scale(layout: str, k_scale: float | None) -> float | None:
    """The kv_scale field of an MLA cache in `layout`: the layer's k_scale for the per-tensor
    "fp8" cache (ValueError without it), None (unset) for every other layout."""
    if layout not in PER_TENSOR_KV_LAYOUTS:
        return None
    if k_scale is None:
        raise ValueError("mla kv_cache: the per-tensor fp8 cache needs the layer's k_scale")
    return float(k_scale)


def mla_cache_layout(kv: Any) -> str:
    """The attnd layout name of an MLA cache view from mla_cache_rows: FLASHMLA_FP8_656,
    BF16_576, or (bytes of the "fp8" cache) FP8_576_PER_TENSOR / FP8_512_PER_TENSOR."""
    width = int(kv.shape[-1])
    if not _is_byte_cache(kv):
        return "BF16_576"
    if width == FP8_DS_MLA_ROW_BYTES:
        return "FLASHMLA_FP8_656"
    return f"FP8_{width}_PER_TENSOR"


def request_positions_to_slots(
    req_id_per_token: Any, block_table: Any, positions: Any, block_size: int
) -> np.ndarray:
    """Positions inside each token's request (vLLM's top-k output, -1 padded) -> global cache
    slots block_table[req, p // block_size] * block_size + p % block_size; -1 where the position
    is negative or its block lies past the table (the conversion vLLM's sparse MLA backend
    makes before FlashMLA). Runs on the host."""
    req = host(req_id_per_token, np.int64)
    table = host(block_table, np.int64)
    pos = host(positions, np.int64)
    t = pos.shape[0]
    req = req[:t]
    blk = np.where(pos >= 0, pos // block_size, -1)
    ok = (pos >= 0) & (blk < table.shape[1])
    page = table[req[:, None], np.clip(blk, 0, table.shape[1] - 1)]
    slots = np.where(ok, page * block_size + pos % block_size, -1)
    return np.where((slots >= 0) & (slots <= np.iinfo(np.int32).max), slots, -1).astype(np.int32)


def sparse_mla(
    q: Any,
    kv_cache: Any,
    topk_positions: Any,
    req_id_per_token: Any,
    block_table: Any,
    sm_scale: float,
    k_scale: float | None = None,
) -> dict[str, Any]:
    """vLLM's sparse MLA inputs (q bf16 [T, H, d_qk]; its paged cache; the indexer's top-k
    positions [T, topk]; the metadata's req_id_per_token and block_table; the layer's k_scale,
    used with the per-tensor "fp8" cache only and required there) -> the fields of
    client.sparse_mla (table form, slots already global; kv_layout named)."""
    kv, block_size = mla_cache_rows(kv_cache)
    t = int(q.shape[0])
    slots = request_positions_to_slots(
        req_id_per_token, block_table, topk_positions[:t], block_size
    )
    layout = mla_cache_layout(kv)
    fields = {"q": q, "kv": kv, "kv_layout": layout, "indices": slots, "sm_scale": float(sm_scale)}
    kv_scale = _kv_scale(layout, k_scale)
    if kv_scale is not None:
        fields["kv_scale"] = kv_scale
    return fields
