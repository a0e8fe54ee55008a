"""The vLLM-facing classes; imported only by attnd_vllm.register() once vLLM imported. Names,
signatures and metadata fields follow the vLLM source named in docs/VLLM.md; the work is done
by attnd_vllm.calls (no vLLM there).

- AttndSparseAttnIndexer replaces vLLM's SparseAttnIndexer (CustomOp.register_oot by class name):
  it keeps vLLM's K cache write (vLLM's own indexer_k_quant_and_cache op) and computes the
  logits and top-k on attnd, writing request positions into vLLM's topk_indices_buffer.
- AttndSparseMLABackend (AttentionBackendEnum.CUSTOM) reuses FlashMLA sparse's metadata builder
  and replaces forward_mqa with attnd's sparse_mla over vLLM's paged cache.
"""

from typing import Any

from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.v1.attention.backends.mla.flashmla_sparse import (
    FlashMLASparseBackend,
    FlashMLASparseImpl,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

from . import BACKEND_CLASS_PATH, INDEXER_OP_NAME, calls, mapping


def _layer_metadata(prefix: str) -> Any:
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    return metadata.get(prefix) if isinstance(metadata, dict) else None


class AttndSparseAttnIndexer(SparseAttnIndexer):
    """vLLM's sparse attention indexer with the logits and top-k on attnd."""

    def __init__(
        self,
        k_cache: Any,
        quant_block_size: int,
        scale_fmt: str,
        topk_tokens: int,
        head_dim: int,
        max_model_len: int,
        max_total_seq_len: int,
        topk_indices_buffer: Any,
        skip_k_cache_insert: bool = False,
        use_fp4_cache: bool = False,
        **_: Any,
    ) -> None:
        CustomOp.__init__(self)  # not SparseAttnIndexer's: it requires DeepGEMM
        if use_fp4_cache:
            raise NotImplementedError("attnd_vllm: the MXFP4 indexer cache is not supported")
        if quant_block_size != head_dim:
            raise NotImplementedError("attnd_vllm: one indexer K scale per token is supported")
        self.k_cache = k_cache
        self.quant_block_size = quant_block_size
        self.scale_fmt = scale_fmt
        self.topk_tokens = topk_tokens
        self.head_dim = head_dim
        self.max_model_len = max_model_len
        self.max_total_seq_len = max_total_seq_len
        self.topk_indices_buffer = topk_indices_buffer
        self.skip_k_cache_insert = skip_k_cache_insert
        self.use_fp4_cache = False

    def forward_native(self, hidden_states: Any, q_quant: Any, k: Any, weights: Any) -> Any:
        metadata = _layer_metadata(self.k_cache.prefix)
        if metadata is None:  # profiling run: no metadata, nothing to compute
            return self.topk_indices_buffer
        kv_cache = self.k_cache.kv_cache
        if not self.skip_k_cache_insert and k is not None:
            from vllm import _custom_ops as ops

            slots = metadata.slot_mapping
            ops.indexer_k_quant_and_cache(
                k[: slots.shape[0]], kv_cache, slots, self.quant_block_size, self.scale_fmt
            )
        q = q_quant[0] if isinstance(q_quant, tuple) else q_quant
        return calls.run_indexer(
            calls.get_client(),
            metadata,
            q,
            weights,
            kv_cache,
            self.head_dim,
            self.topk_tokens,
            self.topk_indices_buffer,
            num_tokens=int(hidden_states.shape[0]),
        )

    forward_cuda = forward_native
    forward_hip = forward_native
    forward_cpu = forward_native


class AttndSparseMLAImpl(FlashMLASparseImpl):
    """FlashMLA sparse's implementation with forward_mqa on attnd."""

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: Any, attn_metadata: Any, layer: Any) -> Any:
        """(out [T, H, 512], lse [T, H]) of q [T, H, 576] or (q_nope, q_pe); torch tensors come
        back as tensors on q's device, NumPy inputs as attnd_client's arrays."""
        if isinstance(q, tuple):
            q = _cat_last(q)
        positions = self.topk_indices_buffer[: q.shape[0]]
        out, lse = calls.run_sparse_mla(
            calls.get_client(),
            q,
            kv_c_and_k_pe_cache,
            positions,
            attn_metadata.req_id_per_token,
            attn_metadata.block_table,
            self.softmax_scale,
            getattr(layer, "_k_scale_float", None),  # used with the "fp8" cache only
        )
        if not mapping.is_torch(q):
            return out, lse
        import torch

        out_t = torch.from_numpy(mapping.host(out).copy()).view(torch.bfloat16).to(q.device)
        return out_t, torch.from_numpy(mapping.host(lse).copy()).to(q.device)


def _cat_last(parts: tuple[Any, ...]) -> Any:
    if mapping.is_torch(parts[0]):
        import torch

        return torch.cat(parts, dim=-1)
    import numpy as np

    return np.concatenate(parts, axis=-1)


class AttndSparseMLABackend(FlashMLASparseBackend):
    """FlashMLA sparse's backend (metadata builder, cache shape) with attnd's forward_mqa."""

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type:
        return AttndSparseMLAImpl


def register_all() -> None:
    CustomOp.register_oot(_decorated_op_cls=AttndSparseAttnIndexer, name=INDEXER_OP_NAME)
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_CLASS_PATH)
