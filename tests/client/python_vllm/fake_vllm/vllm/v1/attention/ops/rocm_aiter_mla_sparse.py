"""Stand-in for vLLM's ROCm indexer cache writer (docs/INDEXER_CACHES.md): the tests' NumPy
builder, SHUFFLE at block size > 1, NORMAL at block size 1."""

CALLS = []


def indexer_k_quant_and_cache_triton(k, kv_cache, slot_mapping, quant_block_size, scale_fmt):
    from vllm_layout import write_indexer_k

    CALLS.append((len(slot_mapping), quant_block_size, scale_fmt))
    shuffle = kv_cache.shape[1] > 1
    write_indexer_k(
        kv_cache, k, slot_mapping, quant_block_size, ue8m0=scale_fmt == "ue8m0", shuffle=shuffle
    )
