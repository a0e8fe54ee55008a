"""vLLM's DeepSeek-V3.2 tensors and metadata -> attnd request fields, as plain functions that
import neither vLLM nor torch (docs/VLLM.md says which vLLM source the layouts were read from).

Inputs are NumPy arrays, torch tensors, or objects with the attribute names of vLLM's metadata
classes (a types.SimpleNamespace does). Cache tensors are only re-viewed (never copied), so a
cache that lies in a registered attnd region still travels as a region reference (zero copy);
small metadata (block tables, lengths, req_id_per_token) is read on the host.

    rows, bs = indexer_cache_rows(kv_cache, head_dim=128)   # attnd kv_cache [blocks, bs*(D+4)]
    slots = request_positions_to_slots(req_id_per_token, block_table, positions, block_size)
"""

from typing import Any, NamedTuple

import numpy as np

# vLLM's sparse MLA cache row in its fp8_ds_mla format (docs/CONTRACTS.md "FP8 KV cache").
FP8_DS_MLA_ROW_BYTES = 656
MLA_HEAD_DIM = 576  # 512 latent + 64 rope columns (the bf16 cache, kv_cache_dtype "auto")
# kv_cache_dtype "fp8": one e4m3 code per column and the layer's k_scale (docs/CONTRACTS.md
# "Per-tensor FP8 KV cache"), 576 bytes (DeepSeek) or 512 (GLM-5.3-Flash, no rope).
FP8_PER_TENSOR_ROW_BYTES = (576, 512)


def is_torch(x: Any) -> bool:
    """Whether x is a torch tensor (checked without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "storage_offset")


def host(x: Any, dtype: Any = None) -> np.ndarray:
    """A host NumPy array of small metadata (a torch tensor is copied to the host)."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
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


def gather_indexer_k(
    kv_cache: Any, block_table: Any, cu_seq_lens: Any, head_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """The keys of a prefill chunk's requests, gathered from the paged indexer cache in request
    order (what vLLM's cp_gather step does on the GPU): (k u8 [total, head_dim], k_scale f32
    [total]). Request r's tokens are rows cu_seq_lens[r] .. cu_seq_lens[r+1] of the result and
    its position n lives in block block_table[r, n // block_size]. Runs on the host."""
    rows, block_size = indexer_cache_rows(kv_cache, head_dim)
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
        k[cu[r] : cu[r + 1]] = rows[blocks[:, None], off[:, None] * head_dim + np.arange(head_dim)]
        sb = values_bytes + 4 * off[:, None] + np.arange(4)
        scale[cu[r] : cu[r + 1]] = rows[blocks[:, None], sb].copy().view("<f4")[:, 0]
    return k, scale


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
    chunk: Any, q_fp8: Any, weights: Any, kv_cache: Any, head_dim: int, topk_tokens: int
) -> PrefillChunkCalls:
    """One chunk of vLLM's indexer prefill metadata (cu_seqlen_ks / cu_seqlen_ke per token into
    the chunk's gathered keys, block_table and cu_seq_lens of its requests, token_start /
    token_end) -> attnd indexer_logits + topk with index_base "row_start", so the written
    indices are positions inside each request, the form vLLM's top-k writes and its sparse MLA
    backend converts to cache slots."""
    start, end = int(chunk.token_start), int(chunk.token_end)
    cu = _chunk_attr(chunk, "local_cu_seq_lens", "cu_seq_lens")
    k, k_scale = gather_indexer_k(kv_cache, chunk.block_table, cu, head_dim)
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


class DecodeCalls(NamedTuple):
    """attnd's two calls for vLLM's indexer decode metadata, and where each row goes."""

    indexer_logits_paged: dict[str, Any]  # client.indexer_logits_paged(**...)
    topk: dict[str, Any]  # client.topk(logits=..., **...)
    token_rows: np.ndarray  # int64 [num_decode_tokens]: the logits row of each decode token


def decode_token_rows(decode_lens: Any, next_n: int) -> np.ndarray:
    """Row b * next_n + j of each decode token (request b's j-th new token), in token order."""
    lens = host(decode_lens, np.int64)
    return np.concatenate(
        [b * next_n + np.arange(n) for b, n in enumerate(lens)] or [np.zeros(0, np.int64)]
    ).astype(np.int64)


def indexer_decode(
    decode: Any,
    q_fp8: Any,
    weights: Any,
    kv_cache: Any,
    num_decode_tokens: int,
    head_dim: int,
    topk_tokens: int,
) -> DecodeCalls:
    """vLLM's indexer decode metadata (block_table [B, max_blocks], seq_lens [B, next_n] per
    token or [B], decode_lens [B], requires_padding) and the decode tokens' fp8 q [tokens, H, D]
    and weights [tokens, H] -> attnd indexer_logits_paged (2-D per-token context_lens taken as
    they are) + topk with per-row lengths, whose indices are positions inside each request.
    Uneven decode_lens (requires_padding) are packed into [B, next_n] rows on the host."""
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
    q = host(q_fp8)[:num_decode_tokens] if padded else q_fp8[:num_decode_tokens]
    w = host(weights, np.float32)[:num_decode_tokens] if padded else weights[:num_decode_tokens]
    if padded or rows.shape[0] != batch * next_n:
        q_rows = np.zeros((batch * next_n, *q.shape[1:]), q.dtype)
        q_rows[rows] = q
        w_rows = np.zeros((batch * next_n, w.shape[1]), np.float32)
        w_rows[rows] = w
        q, w = q_rows, w_rows
    q = q.reshape(batch, next_n, *q.shape[1:])
    cache, block_size = indexer_cache_rows(kv_cache, head_dim)
    if seq_lens.ndim == 2:
        lengths = seq_lens.reshape(-1)
    else:  # per request: token j sees L - next_n + j + 1 (docs/CONTRACTS.md)
        j = np.arange(next_n, dtype=np.int64)
        lengths = (seq_lens.astype(np.int64)[:, None] - next_n + j[None, :] + 1).reshape(-1)
    lengths = np.clip(lengths, 0, np.iinfo(np.int32).max).astype(np.int32)
    paged = {
        "q": q,
        "kv_cache": cache,
        "block_size": block_size,
        "block_table": host(decode.block_table, np.int32)[:batch],
        "context_lens": seq_lens,
        "weights": w,
    }
    return DecodeCalls(paged, {"lengths": lengths, "k": topk_tokens}, rows)


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
    client.sparse_mla (table form, slots already global)."""
    kv, block_size = mla_cache_rows(kv_cache)
    t = int(q.shape[0])
    slots = request_positions_to_slots(
        req_id_per_token, block_table, topk_positions[:t], block_size
    )
    fields = {"q": q, "kv": kv, "indices": slots, "sm_scale": float(sm_scale)}
    if _is_byte_cache(kv) and int(kv.shape[1]) in FP8_PER_TENSOR_ROW_BYTES:
        if k_scale is None:
            raise ValueError("mla kv_cache: the per-tensor fp8 cache needs the layer's k_scale")
        fields["kv_scale"] = float(k_scale)
    return fields
