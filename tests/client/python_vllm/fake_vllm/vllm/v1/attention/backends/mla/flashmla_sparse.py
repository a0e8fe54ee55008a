"""Stand-in FlashMLA sparse backend and implementation (the names the plugin subclasses)."""


class FlashMLASparseImpl:
    def __init__(self, softmax_scale, topk_indices_buffer):
        self.softmax_scale = softmax_scale
        self.topk_indices_buffer = topk_indices_buffer

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        raise RuntimeError("FlashMLA needs a GPU")


class FlashMLASparseBackend:
    @staticmethod
    def get_name():
        return "FLASHMLA_SPARSE"

    @staticmethod
    def get_impl_cls():
        return FlashMLASparseImpl

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [64]
