"""The attnd round trips of the plugin, on any attnd_client.Client, without vLLM: the indexer
(prefill chunks and decode) writing request positions into vLLM's topk_indices_buffer, sparse
MLA, and the fused decode step (one paged dsa_attention call). The vLLM classes (_vllm_glue) call
these; the tests call them on CPU daemons.

    client = attnd_client.Client("unix:/run/attnd/attnd.sock")
    run_indexer(client, indexer_metadata, q_fp8, weights, kv_cache, 128, 2048, buffer)
    out, lse = run_sparse_mla(client, q, mla_cache, buffer, req_id_per_token, table, scale)

    # decode-only step, fused: the indexer op defers, the attention runs both in one call
    step = DecodeStep(indexer_metadata, q_fp8, weights, kv_cache, tokens, 128, 2048)
    out, lse = run_decode_step(client, step, q, mla_cache, scale, buffer, req_id, table)

Decode mode: $ATTND_VLLM_DECODE = "fused" (the default: one paged dsa_attention call when the
step is decode-only, the daemon has the paged form and its dsa_attention takes the MLA cache's
layout: fp8_ds_mla, bf16, or the per-tensor "fp8" cache with the layer's k_scale) or "split"
(always indexer_logits_paged -> topk -> sparse_mla). docs/VLLM.md "Decode".
"""

import os
from typing import Any, NamedTuple

import numpy as np

from attnd_client.dtypes import as_raw

from . import mapping

DEFAULT_TARGET = "unix:/run/attnd/attnd.sock"
DECODE_MODES = ("fused", "split")
_clients: dict[str, Any] = {}
# id(client) -> (client, has the paged form, the kv_layout values its dsa_attention takes)
_dsa_info: dict[int, tuple[Any, bool, frozenset[int]]] = {}


def decode_mode(mode: str | None = None) -> str:
    """The decode mode: `mode` if given, else $ATTND_VLLM_DECODE, else "fused"; ValueError for
    anything but "fused" and "split"."""
    mode = (mode or os.environ.get("ATTND_VLLM_DECODE") or "fused").strip().lower()
    if mode not in DECODE_MODES:
        raise ValueError(f"ATTND_VLLM_DECODE={mode!r}; want one of {DECODE_MODES}")
    return mode


def _dsa_attention_info(client: Any) -> tuple[Any, bool, frozenset[int]]:
    """What the daemon's GetInfo says of dsa_attention (docs/SERVICE.md "GetInfo"): whether it
    lists the layout field index_cache_layout (the paged form) and the values it accepts for
    kv_layout. Asked once per client."""
    known = _dsa_info.get(id(client))
    if known is None or known[0] is not client:
        paged, kv_layouts = False, frozenset()
        for op in client.info().ops:
            if op.name != "dsa_attention":
                continue
            for c in op.cache_layouts:
                if c.field == "index_cache_layout":
                    paged = True
                elif c.field == "kv_layout":
                    kv_layouts = frozenset(int(v) for v in c.accepted)
        known = _dsa_info[id(client)] = (client, paged, kv_layouts)
    return known


def has_paged_dsa(client: Any) -> bool:
    """Whether the daemon runs dsa_attention's paged form: its GetInfo lists the layout field
    index_cache_layout for dsa_attention (docs/SERVICE.md "GetInfo"). Asked once per client."""
    return _dsa_attention_info(client)[1]


def dsa_takes_kv_layout(client: Any, layout: str) -> bool:
    """Whether the daemon's dsa_attention takes kv in `layout` (an attnd layout name): its GetInfo
    lists it for kv_layout. A daemon from before DsaAttentionRequest.kv_scale lists no per-tensor
    FP8 layout there."""
    from attnd_client.ops import cache_layout_value

    return cache_layout_value(layout) in _dsa_attention_info(client)[2]


def get_client(target: str | None = None) -> Any:
    """One attnd_client.Client per target, created on first use; the target defaults to
    $ATTND_TARGET, then unix:/run/attnd/attnd.sock."""
    import attnd_client

    target = target or os.environ.get("ATTND_TARGET") or DEFAULT_TARGET
    if target not in _clients:
        _clients[target] = attnd_client.Client(target)
    return _clients[target]


def close_clients() -> None:
    """Closes the ordered callers and the clients get_client() created."""
    while _ordered:
        _ordered.popitem()[1][1].close()
    while _clients:
        _clients.popitem()[1].close()


def _store(buffer: Any, rows: Any, values: np.ndarray) -> None:
    """buffer[rows, :k] = values, for a NumPy or torch buffer (values copied to its device)."""
    k = values.shape[1]
    if mapping.is_torch(buffer):
        import torch

        idx = torch.as_tensor(np.asarray(rows), device=buffer.device)
        buffer[idx, :k] = torch.as_tensor(np.ascontiguousarray(values), device=buffer.device)
    else:
        buffer[np.asarray(rows), :k] = values


def run_indexer(
    client: Any,
    metadata: Any,
    q_fp8: Any,
    weights: Any,
    kv_cache: Any,
    head_dim: int,
    topk_tokens: int,
    topk_indices_buffer: Any,
    num_tokens: int | None = None,
    index_layout: str = mapping.INDEXER_BLOCKS,
) -> Any:
    """vLLM's sparse_attn_indexer after its cache write, on attnd: rows [0, num_tokens) of
    topk_indices_buffer are set to -1, then each prefill chunk's and the decode tokens' top-k
    positions (inside their request) are written. `metadata` has the attributes of vLLM's
    DeepseekV32IndexerMetadata (num_prefills, num_decodes, num_decode_tokens, prefill.chunks,
    decode); index_layout is the indexer cache's (mapping.indexer_layout). A prefill chunk whose
    tensors all lie on one torch device runs there (_prefill_chunk_on_device). Returns the
    buffer."""
    if num_tokens is None:
        num_tokens = int(q_fp8.shape[0])
    topk_indices_buffer[:num_tokens] = -1
    if getattr(metadata, "num_prefills", 0) > 0:
        for chunk in metadata.prefill.chunks:
            if _prefill_chunk_on_device(
                client,
                chunk,
                q_fp8,
                weights,
                kv_cache,
                head_dim,
                topk_tokens,
                topk_indices_buffer,
                index_layout,
            ):
                continue
            call = mapping.indexer_prefill_chunk(
                chunk, q_fp8, weights, kv_cache, head_dim, topk_tokens, index_layout
            )
            if call.token_end <= call.token_start:
                continue
            if call.indexer_logits["k"].shape[0] == 0:
                continue  # no keys: the rows stay -1, as vLLM leaves them
            logits = client.indexer_logits(**call.indexer_logits).logits
            res = client.topk(logits=logits, **call.topk)
            rows = np.arange(call.token_start, call.token_end)
            _store(topk_indices_buffer, rows, np.asarray(res.indices))
    num_decode_tokens = int(getattr(metadata, "num_decode_tokens", 0))
    if getattr(metadata, "num_decodes", 0) > 0 and num_decode_tokens > 0:
        args = (
            metadata.decode,
            q_fp8,
            weights,
            kv_cache,
            num_decode_tokens,
            head_dim,
            topk_tokens,
            index_layout,
        )
        device = mapping.indexer_decode_device(*args)
        if device is not None and mapping.is_torch(topk_indices_buffer):
            _decode_on_device(client, device, topk_tokens, topk_indices_buffer)
            return topk_indices_buffer
        call = mapping.indexer_decode(*args)
        logits = client.indexer_logits_paged(**call.indexer_logits_paged).logits
        res = client.topk(logits=logits, **call.topk)
        indices = np.asarray(res.indices)[call.token_rows]
        _store(topk_indices_buffer, np.arange(num_decode_tokens), indices)
    return topk_indices_buffer


def _prefill_chunk_on_device(
    client: Any,
    chunk: Any,
    q_fp8: Any,
    weights: Any,
    kv_cache: Any,
    head_dim: int,
    topk_tokens: int,
    topk_indices_buffer: Any,
    index_layout: str,
) -> bool:
    """One prefill chunk of run_indexer on its tensors' device, when they all lie on one
    (docs/VLLM.md "On the tensors' own device"): the keys gathered there
    (mapping.gather_indexer_k_device), the logits placed in a tensor there and read in place by
    the top-k, the indices written into the buffer there. False (nothing done) when the chunk
    needs the host form. Reads on the host only the chunk's key count, when vLLM's metadata
    does not carry it (total_seq_lens)."""
    cu = mapping._chunk_attr(chunk, "local_cu_seq_lens", "cu_seq_lens")
    tensors = (q_fp8, weights, kv_cache, chunk.block_table, cu, chunk.cu_seqlen_ks)
    if not mapping.on_one_device(*tensors, chunk.cu_seqlen_ke, topk_indices_buffer):
        return False
    import torch

    start, end = int(chunk.token_start), int(chunk.token_end)
    total = getattr(chunk, "total_seq_lens", None)
    total = int(total) if total is not None else int(cu[-1])
    if end <= start or total == 0:
        return True  # no rows, or no keys: the rows stay -1, as vLLM leaves them
    dev = q_fp8.device
    k, k_scale = mapping.gather_indexer_k_device(
        kv_cache, chunk.block_table, cu, head_dim, total, index_layout
    )
    ks = chunk.cu_seqlen_ks.to(torch.int32)
    ke = chunk.cu_seqlen_ke.to(torch.int32)
    logits = torch.empty((end - start, total), dtype=torch.float32, device=dev)
    client.indexer_logits(
        q=q_fp8[start:end],
        k=k,
        k_scale=k_scale,
        weights=weights[start:end],
        ks=ks,
        ke=ke,
        clean_logits=True,
        logits=logits,
    )
    indices = torch.empty((end - start, topk_tokens), dtype=torch.int32, device=dev)
    client.topk(logits=logits, ks=ks, ke=ke, k=topk_tokens, index_base="row_start", indices=indices)
    width = min(topk_tokens, int(topk_indices_buffer.shape[1]))
    topk_indices_buffer[start:end, :width] = indices[:, :width].to(topk_indices_buffer.dtype)
    return True


def _decode_on_device(
    client: Any, call: mapping.IndexerDecodeDevice, topk_tokens: int, topk_indices_buffer: Any
) -> None:
    """run_indexer's decode tokens on their device (docs/VLLM.md "On the tensors' own
    device"): the paged logits placed in a tensor there and read in place by the top-k, whose
    indices (positions inside each request) go into the buffer's rows there."""
    import torch

    dev = call.indexer_logits_paged["q"].device
    logits = torch.empty((call.rows, call.columns), dtype=torch.float32, device=dev)
    client.indexer_logits_paged(**call.indexer_logits_paged, logits=logits)
    indices = torch.empty((call.rows, topk_tokens), dtype=torch.int32, device=dev)
    client.topk(logits=logits, **call.topk, indices=indices)
    indices = mapping._unpack(call.shape, indices)  # token order (uneven decodes packed)
    width = min(topk_tokens, int(topk_indices_buffer.shape[1]))
    rows = int(indices.shape[0])
    topk_indices_buffer[:rows, :width] = indices[:, :width].to(topk_indices_buffer.dtype)


def run_sparse_mla(
    client: Any,
    q: Any,
    kv_cache: Any,
    topk_positions: Any,
    req_id_per_token: Any,
    block_table: Any,
    sm_scale: float,
    k_scale: float | None = None,
) -> tuple[Any, Any]:
    """Sparse MLA of q [T, H, d_qk] over vLLM's paged cache at the top-k positions: (out bf16
    [T, H, 512], lse f32 [T, H]) as attnd_client returns them (uint16 bits / float32 arrays),
    or, when every tensor is a torch tensor on one device, as tensors on that device (the
    positions turned into slots there). k_scale: the layer's, for the per-tensor "fp8" cache."""
    if mapping.on_one_device(q, kv_cache, topk_positions, req_id_per_token, block_table):
        # The device form (docs/VLLM.md "On the tensors' own device"): slots made and outputs
        # placed on the tensors' device.
        import torch

        kv, block_size = mapping.mla_cache_rows(kv_cache)
        t, heads = int(q.shape[0]), int(q.shape[1])
        slots = mapping.request_positions_to_slots_device(
            req_id_per_token, block_table, topk_positions[:t], block_size
        )
        layout = mapping.mla_cache_layout(kv)
        out = torch.empty((t, heads, 512), dtype=torch.bfloat16, device=q.device)
        lse = torch.empty((t, heads), dtype=torch.float32, device=q.device)
        fields = {
            "q": q,
            "kv": kv,
            "kv_layout": layout,
            "indices": slots,
            "sm_scale": float(sm_scale),
        }
        kv_scale = mapping._kv_scale(layout, k_scale)
        if kv_scale is not None:
            fields["kv_scale"] = kv_scale
        client.sparse_mla(**fields, out=out, lse=lse)
        return out, lse
    fields = mapping.sparse_mla(
        q, kv_cache, topk_positions, req_id_per_token, block_table, sm_scale, k_scale
    )
    res = client.sparse_mla(**fields)
    return res.out, res.lse


def is_decode_only(metadata: Any) -> bool:
    """Whether vLLM's indexer metadata describes a step of decode tokens only (no prefill
    chunk; tokens past num_decode_tokens, if any, are padding)."""
    return (
        int(getattr(metadata, "num_prefills", 0) or 0) == 0
        and int(getattr(metadata, "num_decodes", 0) or 0) > 0
        and int(getattr(metadata, "num_decode_tokens", 0) or 0) > 0
        and getattr(metadata, "decode", None) is not None
    )


class DecodeStep(NamedTuple):
    """The indexer op's inputs of a decode-only step, kept for the attention call that follows
    (the fused path): everything run_indexer needs too, for the fallback."""

    metadata: Any  # vLLM's indexer metadata (DeepseekV32IndexerMetadata attributes)
    q_fp8: Any
    weights: Any
    kv_cache: Any  # the indexer cache, after vLLM's own cache write
    num_tokens: int
    head_dim: int
    topk_tokens: int
    index_layout: str = mapping.INDEXER_BLOCKS


# The decode steps deferred by the indexer op, keyed by the topk_indices_buffer it shares with
# the attention implementation of the same layers (vLLM calls them in that order, per layer).
_deferred: dict[int, tuple[Any, DecodeStep]] = {}
_fused_buffers: dict[int, Any] = {}


def enable_fused(topk_indices_buffer: Any) -> None:
    """Marks the buffer as read by an attnd attention implementation, which consumes deferred
    decode steps: only then does the indexer op defer (another backend reads the buffer)."""
    _fused_buffers[id(topk_indices_buffer)] = topk_indices_buffer


def fused_enabled(topk_indices_buffer: Any) -> bool:
    return _fused_buffers.get(id(topk_indices_buffer)) is topk_indices_buffer


def defer_decode(topk_indices_buffer: Any, step: DecodeStep) -> None:
    """Keeps the step for take_decode (the layer's attention call); replaces an unconsumed one."""
    _deferred[id(topk_indices_buffer)] = (topk_indices_buffer, step)


def take_decode(topk_indices_buffer: Any) -> DecodeStep | None:
    """The step the indexer op deferred on this buffer, once; None when there is none."""
    entry = _deferred.pop(id(topk_indices_buffer), None)
    if entry is None or entry[0] is not topk_indices_buffer:
        return None
    return entry[1]


def run_dsa_decode(
    client: Any,
    step: DecodeStep,
    q: Any,
    mla_cache: Any,
    sm_scale: float,
    topk_indices_buffer: Any,
    k_scale: float | None = None,
) -> tuple[Any, Any]:
    """A decode-only step in one paged dsa_attention call (indexer over the indexer cache,
    top-k, sparse MLA over the MLA cache; mapping.dsa_decode): (out bf16 [T, H, 512], lse f32
    [T, H]) as attnd_client returns them, T = q's rows in vLLM's token order (rows past
    step.num_tokens, padding, get out 0 and lse -inf). Rows [0, step.num_tokens) of
    topk_indices_buffer get the chosen positions inside each request (-1 padded), as
    run_indexer writes them. k_scale: the layer's, for the per-tensor "fp8" MLA cache (required
    there). ValueError for a cache the paged form does not take.

    When every tensor of the step is a torch tensor on q's device and its decodes are even
    (mapping.dsa_decode_device), nothing goes through the host: the outputs are torch tensors
    on that device placed in the call (device regions for CUDA tensors), and the kv rows ->
    positions step runs there (run_dsa_decode_device)."""
    args = (
        step.metadata.decode,
        step.q_fp8,
        step.weights,
        step.kv_cache,
        q,
        mla_cache,
        step.num_tokens,
        step.head_dim,
        step.topk_tokens,
        sm_scale,
        step.index_layout,
    )
    device = mapping.dsa_decode_device(*args, k_scale=k_scale)
    if device is not None and mapping.is_torch(topk_indices_buffer):
        return run_dsa_decode_device(client, device, q, step.num_tokens, topk_indices_buffer)
    call = mapping.dsa_decode(*args, k_scale=k_scale)
    res = client.dsa_attention(**call.dsa_attention)
    out, lse = np.asarray(res.out), np.asarray(res.lse)
    positions = mapping.kv_rows_to_positions(call, res.indices)
    rows = call.token_rows
    if rows.shape[0] != out.shape[0] or (rows != np.arange(rows.shape[0])).any():
        out, lse, positions = out[rows], lse[rows], positions[rows]
    topk_indices_buffer[: step.num_tokens] = -1
    _store(topk_indices_buffer, np.arange(step.num_tokens), positions)
    extra = int(q.shape[0]) - step.num_tokens
    if extra > 0:
        out = np.concatenate([out, np.zeros((extra, *out.shape[1:]), out.dtype)])
        lse = np.concatenate([lse, np.full((extra, *lse.shape[1:]), -np.inf, lse.dtype)])
    return out, lse


# ATTND_VLLM_ORDERED=1: the device form's call runs stream-ordered (docs/VLLM.md "Decode").
_ordered: dict[int, tuple[Any, Any]] = {}  # id(client) -> (client, its OrderedCaller)


def ordered_enabled() -> bool:
    """Whether $ATTND_VLLM_ORDERED asks for stream-ordered decode calls ("1"; read per step;
    anything but "0", "1" or unset is a ValueError)."""
    value = (os.environ.get("ATTND_VLLM_ORDERED") or "0").strip()
    if value not in ("0", "1"):
        raise ValueError(f"ATTND_VLLM_ORDERED={value!r}; want 0 or 1")
    return value == "1"


def ordered_caller(client: Any) -> Any:
    """The OrderedCaller of `client` (attnd_client "Ordered callers"), made on first use and kept
    for the process: its prepared calls are cached by the tensors' regions, shapes and scalars."""
    known = _ordered.get(id(client))
    if known is None or known[0] is not client:
        known = _ordered[id(client)] = (client, client.ordered_caller())
    return known[1]


def run_dsa_decode_device(
    client: Any, call: mapping.DsaDecodeDevice, q: Any, num_tokens: int, topk_indices_buffer: Any
) -> tuple[Any, Any]:
    """run_dsa_decode's device form: the call's outputs allocated on q's device (out bf16
    [rows of q, H, 512], lse f32 [rows of q, H], the kv rows i32 [num_tokens, topk]) and placed
    in it, rows past num_tokens set to out 0 / lse -inf, then the kv rows turned into positions
    and written into topk_indices_buffer's rows [0, num_tokens) on that device. Returns (out,
    lse) as tensors."""
    import torch

    rows, heads = int(q.shape[0]), int(q.shape[1])
    topk = int(call.dsa_attention["topk"])
    out = torch.empty((rows, heads, 512), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((rows, heads), dtype=torch.float32, device=q.device)
    packed = call.shape.token_rows is not None
    call_rows = call.batch * call.next_n
    if packed:  # uneven decodes: the call's rows [B * next_n], back in token order below
        out_c = torch.empty((call_rows, heads, 512), dtype=torch.bfloat16, device=q.device)
        lse_c = torch.empty((call_rows, heads), dtype=torch.float32, device=q.device)
    else:
        out_c, lse_c = out[:num_tokens], lse[:num_tokens]
    kv_rows = torch.empty((call_rows, topk), dtype=torch.int32, device=q.device)
    outputs = {"out": out_c, "lse": lse_c, "indices": kv_rows}
    if ordered_enabled() and q.is_cuda:
        # Stream-ordered on the current stream of q's device: queued, not waited for; the
        # torch work below and vLLM's after it run once the call's done word is stored.
        stream = torch.cuda.current_stream(q.device)
        ordered_caller(client).call("dsa_attention", stream=stream, **call.dsa_attention, **outputs)
    else:
        client.dsa_attention(**call.dsa_attention, **outputs)
    if packed:
        out[:num_tokens] = mapping._unpack(call.shape, out_c)
        lse[:num_tokens] = mapping._unpack(call.shape, lse_c)
    if rows > num_tokens:
        out[num_tokens:].zero_()
        lse[num_tokens:].fill_(float("-inf"))
    positions = mapping.kv_rows_to_positions_device(call, kv_rows)
    if packed:
        positions = mapping._unpack(call.shape, positions)
    buffer = topk_indices_buffer
    buffer[:num_tokens] = -1
    width = min(topk, int(buffer.shape[1]))
    buffer[:num_tokens, :width] = positions[:, :width].to(device=buffer.device, dtype=buffer.dtype)
    return out, lse


def can_fuse(client: Any, mla_cache: Any, mode: str | None = None) -> bool:
    """Whether a deferred decode step runs fused: decode_mode(mode) is "fused", the daemon has
    the paged form and its dsa_attention takes the MLA cache's layout (fp8_ds_mla, bf16, or the
    per-tensor "fp8" cache, which it takes with kv_scale; an older daemon does not)."""
    if decode_mode(mode) != "fused":
        return False
    kv, _ = mapping.mla_cache_rows(mla_cache)
    return has_paged_dsa(client) and dsa_takes_kv_layout(client, mapping.mla_cache_layout(kv))


def run_decode_step(
    client: Any,
    step: DecodeStep,
    q: Any,
    mla_cache: Any,
    sm_scale: float,
    topk_indices_buffer: Any,
    req_id_per_token: Any,
    block_table: Any,
    k_scale: float | None = None,
    mode: str | None = None,
    out: Any = None,
    lse: Any = None,
) -> tuple[Any, Any]:
    """A deferred decode step: fused (run_dsa_decode) when can_fuse, else the three calls
    (run_indexer's decode, then run_sparse_mla with the attention metadata's req_id_per_token
    and block_table). Both write topk_indices_buffer and return (out, lse) alike; given `out`
    (bf16 bits or a bf16 tensor [T, H, 512]) and `lse` (f32 [T, H]), the results are copied
    into them and they are returned."""
    if can_fuse(client, mla_cache, mode):
        res = run_dsa_decode(client, step, q, mla_cache, sm_scale, topk_indices_buffer, k_scale)
        return _into(out, res[0]), _into(lse, res[1])
    run_indexer(
        client,
        step.metadata,
        step.q_fp8,
        step.weights,
        step.kv_cache,
        step.head_dim,
        step.topk_tokens,
        topk_indices_buffer,
        num_tokens=step.num_tokens,
        index_layout=step.index_layout,
    )
    res = run_sparse_mla(
        client, q, mla_cache, topk_indices_buffer, req_id_per_token, block_table, sm_scale, k_scale
    )
    return _into(out, res[0]), _into(lse, res[1])


def _into(dst: Any, values: Any) -> Any:
    """values copied into dst (NumPy, or torch on any device: bf16 bits viewed as bf16), or
    values themselves when dst is None. Torch values (the device form) are copied on their
    device into a torch dst of the same dtype."""
    if dst is None:
        return values if mapping.is_torch(values) else as_raw(np.asarray(values))
    if mapping.is_torch(values) and mapping.is_torch(dst) and dst.dtype == values.dtype:
        dst.copy_(values.reshape(dst.shape))
        return dst
    if mapping.is_torch(values):
        if str(values.dtype) == "torch.bfloat16":  # no NumPy bf16: its bits
            import torch

            values = values.view(torch.int16)
        values = mapping.host(values)
        values = values.view(np.uint16) if values.dtype == np.int16 else values
    values = as_raw(np.asarray(values))
    if mapping.is_torch(dst):
        import torch

        if str(dst.dtype) == "torch.bfloat16":  # bits through int16 (older torch: no uint16)
            src = torch.from_numpy(np.ascontiguousarray(values).view(np.int16))
            src = src.view(torch.bfloat16)
        else:
            src = torch.from_numpy(np.ascontiguousarray(values))
        dst.copy_(src.reshape(dst.shape))
    else:
        np.copyto(dst, values.reshape(dst.shape).astype(dst.dtype, copy=False))
    return dst
