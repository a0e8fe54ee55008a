"""The attnd round trips of the plugin, on any attnd_client.Client, without vLLM: the indexer
(prefill chunks and decode) writing request positions into vLLM's topk_indices_buffer, and sparse
MLA. The vLLM classes (_vllm_glue) call these; the tests call them on CPU daemons.

    client = attnd_client.Client("unix:/run/attnd/attnd.sock")
    run_indexer(client, indexer_metadata, q_fp8, weights, kv_cache, 128, 2048, buffer)
    out, lse = run_sparse_mla(client, q, mla_cache, buffer, req_id_per_token, table, scale)
"""

import os
from typing import Any

import numpy as np

from . import mapping

DEFAULT_TARGET = "unix:/run/attnd/attnd.sock"
_clients: dict[str, Any] = {}


def get_client(target: str | None = None) -> Any:
    """One attnd_client.Client per target, created on first use; the target defaults to
    $ATTND_TARGET, then unix:/run/attnd/attnd.sock."""
    import attnd_client

    target = target or os.environ.get("ATTND_TARGET") or DEFAULT_TARGET
    if target not in _clients:
        _clients[target] = attnd_client.Client(target)
    return _clients[target]


def close_clients() -> None:
    """Closes the clients get_client() created."""
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
) -> Any:
    """vLLM's sparse_attn_indexer after its cache write, on attnd: rows [0, num_tokens) of
    topk_indices_buffer are set to -1, then each prefill chunk's and the decode tokens' top-k
    positions (inside their request) are written. `metadata` has the attributes of vLLM's
    DeepseekV32IndexerMetadata (num_prefills, num_decodes, num_decode_tokens, prefill.chunks,
    decode). Returns the buffer."""
    if num_tokens is None:
        num_tokens = int(q_fp8.shape[0])
    topk_indices_buffer[:num_tokens] = -1
    if getattr(metadata, "num_prefills", 0) > 0:
        for chunk in metadata.prefill.chunks:
            call = mapping.indexer_prefill_chunk(
                chunk, q_fp8, weights, kv_cache, head_dim, topk_tokens
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
        call = mapping.indexer_decode(
            metadata.decode, q_fp8, weights, kv_cache, num_decode_tokens, head_dim, topk_tokens
        )
        logits = client.indexer_logits_paged(**call.indexer_logits_paged).logits
        res = client.topk(logits=logits, **call.topk)
        indices = np.asarray(res.indices)[call.token_rows]
        _store(topk_indices_buffer, np.arange(num_decode_tokens), indices)
    return topk_indices_buffer


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
    [T, H, 512], lse f32 [T, H]) as attnd_client returns them (uint16 bits / float32 arrays).
    k_scale: the layer's, for the per-tensor "fp8" cache."""
    fields = mapping.sparse_mla(
        q, kv_cache, topk_positions, req_id_per_token, block_table, sm_scale, k_scale
    )
    res = client.sparse_mla(**fields)
    return res.out, res.lse
