"""Stand-in for vLLM's indexer cache writer: the tests' NumPy builder of the same layout."""

CALLS = []


def indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt):
    from vllm_layout import write_indexer_k

    CALLS.append((len(slot_mapping), quant_block_size, scale_fmt))
    write_indexer_k(kv_cache, k, slot_mapping, quant_block_size, ue8m0=scale_fmt == "ue8m0")
