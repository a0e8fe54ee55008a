"""The vLLM-facing classes; imported only by attnd_vllm.register() once vLLM imported. Names,
signatures and metadata fields follow the vLLM source named in docs/VLLM.md; the work is done
by attnd_vllm.calls (no vLLM there).

- AttndSparseAttnIndexer replaces vLLM's SparseAttnIndexer (CustomOp.register_oot by class name):
  it keeps vLLM's K cache write (vLLM's own indexer_k_quant_and_cache op; on ROCm vLLM's ROCm
  writer, whose cache is the shuffled layout at block size > 1) and computes the logits and
  top-k on attnd, writing request positions into vLLM's topk_indices_buffer. In a decode-only
  step read by AttndSparseMLAImpl (decode mode "fused") it defers instead: the attention call
  runs the indexer, the top-k and sparse MLA in one paged dsa_attention call.
- AttndSparseMLABackend (AttentionBackendEnum.CUSTOM) reuses FlashMLA sparse's metadata builder
  and replaces forward_mqa with attnd's sparse_mla over vLLM's paged cache, or with the deferred
  decode step (calls.run_decode_step).
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


def _platform() -> Any:
    """vLLM's current_platform, or None where vllm.platforms is not importable."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    return current_platform


def _on_rocm() -> bool:
    platform = _platform()
    return bool(platform is not None and platform.is_rocm())


def _fp8_is_fnuz() -> bool:
    """Whether the platform's fp8 is e4m3fnuz (ROCm gfx942), which attnd does not read
    (docs/INDEXER_CACHES.md "Quantization")."""
    platform = _platform()
    fp8_dtype = getattr(platform, "fp8_dtype", None)
    return fp8_dtype is not None and "fnuz" in str(fp8_dtype())


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
        if _fp8_is_fnuz():
            raise NotImplementedError("attnd_vllm: e4m3fnuz caches (ROCm gfx942) are not read")
        self.rocm = _on_rocm()
        calls.decode_mode()  # a bad $ATTND_VLLM_DECODE fails here, not at the first step
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
            if self.rocm:
                from vllm.v1.attention.ops.rocm_aiter_mla_sparse import (
                    indexer_k_quant_and_cache_triton as write,
                )
            else:
                from vllm._custom_ops import indexer_k_quant_and_cache as write

            slots = metadata.slot_mapping
            write(k[: slots.shape[0]], kv_cache, slots, self.quant_block_size, self.scale_fmt)
        q = q_quant[0] if isinstance(q_quant, tuple) else q_quant
        num_tokens = int(hidden_states.shape[0])
        layout = mapping.indexer_layout(int(kv_cache.shape[1]), self.rocm)
        buffer = self.topk_indices_buffer
        if (
            calls.decode_mode() == "fused"
            and calls.fused_enabled(buffer)
            and calls.is_decode_only(metadata)
        ):
            buffer[:num_tokens] = -1
            step = calls.DecodeStep(
                metadata,
                q,
                weights,
                kv_cache,
                int(metadata.num_decode_tokens),
                self.head_dim,
                self.topk_tokens,
                layout,
            )
            calls.defer_decode(buffer, step)
            return buffer
        return calls.run_indexer(
            calls.get_client(),
            metadata,
            q,
            weights,
            kv_cache,
            self.head_dim,
            self.topk_tokens,
            buffer,
            num_tokens=num_tokens,
            index_layout=layout,
        )

    forward_cuda = forward_native
    forward_hip = forward_native
    forward_cpu = forward_native


class AttndSparseMLAImpl(FlashMLASparseImpl):
    """FlashMLA sparse's implementation with forward_mqa on attnd."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        buffer = getattr(self, "topk_indices_buffer", None)
        if buffer is not None:  # the indexer ops writing it may defer decode steps to us
            calls.enable_fused(buffer)

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: Any, attn_metadata: Any, layer: Any) -> Any:
        """(out [T, H, 512], lse [T, H]) of q [T, H, 576] or (q_nope, q_pe); torch tensors come
        back as tensors on q's device, NumPy inputs as attnd_client's arrays."""
        if isinstance(q, tuple):
            q = _cat_last(q)
        k_scale = getattr(layer, "_k_scale_float", None)  # used with the "fp8" cache only
        step = calls.take_decode(self.topk_indices_buffer)
        if step is not None:  # a decode-only step the indexer op deferred
            out, lse = calls.run_decode_step(
                calls.get_client(),
                step,
                q,
                kv_c_and_k_pe_cache,
                self.softmax_scale,
                self.topk_indices_buffer,
                attn_metadata.req_id_per_token,
                attn_metadata.block_table,
                k_scale,
            )
        else:
            positions = self.topk_indices_buffer[: q.shape[0]]
            out, lse = calls.run_sparse_mla(
                calls.get_client(),
                q,
                kv_c_and_k_pe_cache,
                positions,
                attn_metadata.req_id_per_token,
                attn_metadata.block_table,
                self.softmax_scale,
                k_scale,
            )
        if not mapping.is_torch(q) or mapping.is_torch(out):
            return out, lse  # the device form's tensors are on q's device already
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
