"""Stand-in for vLLM's SparseAttnIndexer (its __init__ refuses to run without DeepGEMM)."""

from vllm.model_executor.custom_op import CustomOp


@CustomOp.register("sparse_attn_indexer")
class SparseAttnIndexer(CustomOp):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("requires DeepGEMM")
