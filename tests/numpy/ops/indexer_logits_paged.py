"""Paged indexer logits recomputed with NumPy from the raw cache bytes (vLLM's layout: per block,
block_size keys of D fp8 bytes, then block_size f32 scales), against attnd's fp64 reference.
Row b*next_n + j sees positions [0, L), L = clamp(ctx[b] - next_n + j + 1, 0,
min(N, max_blocks * block_size)), or with per-token context_lens [B, next_n]
L = clamp(ctx[b, j], ...); a position whose page id is outside [0, num_blocks) and every column
past L is -inf. With shuffle16 the key bytes are in AITER's order (ROCm): a block's 16-token groups
each hold dim/16 tiles of 16 tokens x 16 bytes; the scales are where they always are."""

import numpy as np

import common


def check(inputs, scalars, refs):
    q = inputs["q"]  # [B, next_n, H, D] as float64
    cache = inputs["kv_cache"].astype(np.uint8)  # [num_blocks, bs * (D + 4)] raw bytes
    table = inputs["block_table"].astype(np.int64)
    ctx = inputs["context_lens"].astype(np.int64)
    weights = inputs["weights"]
    batch, next_n, _, dim = q.shape
    bs, n = int(scalars["block_size"]), int(scalars["cols"])
    shuffle16 = bool(scalars.get("shuffle16", 0))
    num_blocks, max_blocks = cache.shape[0], table.shape[1]
    want = np.full((batch * next_n, n), -np.inf)
    expect = np.ones((batch * next_n, n))
    for b in range(batch):
        for j in range(next_n):
            row = b * next_n + j
            length = ctx[b, j] if ctx.ndim == 2 else ctx[b] - next_n + j + 1
            visible = int(np.clip(length, 0, min(n, max_blocks * bs)))
            for pos in range(visible):
                page, slot = table[b, pos // bs], pos % bs
                if page < 0 or page >= num_blocks:
                    continue
                if shuffle16:  # the slot's 16-byte pieces, one per tile of its 16-token group
                    group = cache[page, (slot // 16) * 16 * dim : (slot // 16 + 1) * 16 * dim]
                    tiles = group.reshape(dim // 16, 16, 16)  # [tile, token in group, byte]
                    key_bytes = tiles[:, slot % 16, :].reshape(dim)
                else:
                    key_bytes = cache[page, slot * dim : (slot + 1) * dim]
                key = common.fp8_e4m3_to_f64(key_bytes)
                at = bs * dim + 4 * slot
                scale = float(cache[page, at : at + 4].copy().view(np.float32)[0])
                scores = np.maximum(q[b, j] @ key, 0.0)
                want[row, pos] = float(scores @ weights[row]) * scale
                expect[row, pos] = 2.0
    assert np.array_equal(expect, refs["expect"]), "visible / masked positions differ"
    common.assert_close("logits", want, refs["logits"])
