"""Dense MLA decode recomputed with NumPy from the raw inputs (docs/CONTRACTS.md "mla_decode"),
against attnd's fp64 reference: request b's length is clamped to [0, max_pages·page_size]; token
n lives in page block_table[b, n // page_size] at slot n % page_size, and a page id outside
[0, num_pages) hides the token; query i of s_q sees tokens n < len − s_q + i + 1 with causal,
n < len without; s = sm_scale·q·kᵀ, softmax written out, out = P·V / Σ with V = the first 512
columns, lse = m + log Σ; a row with no visible token gives out 0 and lse -inf."""

import numpy as np

import common

D_V = 512


def check(inputs, scalars, refs):
    q, kv = inputs["q"], inputs["kv_cache"]
    table = inputs["block_table"].astype(np.int64)
    lens = inputs["cache_seqlens"].astype(np.int64)
    batch, s_q, heads, _ = q.shape
    num_pages, page_size, _ = kv.shape
    scale = float(scalars["sm_scale"])
    causal = bool(scalars["causal"])
    out = np.zeros((batch, s_q, heads, D_V))
    lse = np.full((batch, s_q, heads), -np.inf)
    for b in range(batch):
        length = int(np.clip(lens[b], 0, table.shape[1] * page_size))
        pos = np.arange(length)
        page = table[b, pos // page_size]
        readable = (page >= 0) & (page < num_pages)
        pos, page = pos[readable], page[readable]
        keys = kv[page, pos % page_size]  # [n, d_qk]
        for i in range(s_q):
            limit = length - s_q + i + 1 if causal else length
            k = keys[pos < limit]
            if k.shape[0] == 0:
                continue
            s = scale * np.einsum("hd,nd->hn", q[b, i], k)
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            total = e.sum(axis=1)
            out[b, i] = (e @ k[:, :D_V]) / total[:, None]
            lse[b, i] = m[:, 0] + np.log(total)
    common.assert_close("out", out, refs["out"], rtol=1e-9, atol=1e-12)
    common.assert_close("lse", lse, refs["lse"], rtol=1e-12, atol=1e-12)
