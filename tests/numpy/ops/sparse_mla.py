"""Sparse MLA recomputed with NumPy from the raw inputs (docs/CONTRACTS.md "sparse_mla"), against
attnd's fp64 reference: per token, the valid slots (inside the row / topk_length, index in [0, S)),
duplicates kept; s = sm_scale·q·kᵀ, softmax written out, out = P·V / Σ, lse = m + log Σ; a token
with no valid slot gives out 0 and lse -inf. An FP8 cache (raw u8 [S, 656] rows) is decoded here
from its bytes: 512 e4m3 codes × the f32 scale of their 128 columns, then 64 bf16 rope values."""

import numpy as np

import common

D_V = 512
FP8_ROW_BYTES, FP8_SCALES, FP8_ROPE = 656, 512, 528


def _kv_values(kv):
    """The cache as float64 [S, d_qk] (bf16 decoded already; FP8 rows decoded from bytes)."""
    if kv.dtype != np.uint8:
        return kv
    assert kv.shape[1] == FP8_ROW_BYTES, kv.shape
    rows = np.ascontiguousarray(kv)
    codes = common.fp8_e4m3_to_f64(rows[:, :FP8_SCALES])
    scales = rows[:, FP8_SCALES:FP8_ROPE].copy().view("<f4").astype(np.float64)  # [S, 4]
    rope = common.bf16_to_f64(rows[:, FP8_ROPE:].copy().view("<u2"))
    return np.concatenate([codes * np.repeat(scales, 128, axis=1), rope], axis=1)


def _rows(inputs, t, num_rows):
    indices = inputs["indices"].astype(np.int64)
    if "indptr" in inputs:
        indptr = inputs["indptr"].astype(np.int64)
        row = indices[indptr[t] : indptr[t + 1]]
    else:
        row = indices[t]
        if "topk_length" in inputs:
            row = row[: int(np.clip(inputs["topk_length"][t], 0, row.shape[0]))]
    return row[(row >= 0) & (row < num_rows)]


def check(inputs, scalars, refs):
    q, kv = inputs["q"], _kv_values(inputs["kv"])
    tokens, heads, _ = q.shape
    scale = float(scalars["sm_scale"])
    out = np.zeros((tokens, heads, D_V))
    lse = np.full((tokens, heads), -np.inf)
    for t in range(tokens):
        rows = _rows(inputs, t, kv.shape[0])
        if rows.size == 0:
            continue
        k = kv[rows]  # [n, d_qk]
        s = scale * np.einsum("hd,nd->hn", q[t], k)
        m = s.max(axis=1, keepdims=True)
        e = np.exp(s - m)
        total = e.sum(axis=1)
        out[t] = (e @ k[:, :D_V]) / total[:, None]
        lse[t] = m[:, 0] + np.log(total)
    common.assert_close("out", out, refs["out"], rtol=1e-9, atol=1e-12)
    common.assert_close("lse", lse, refs["lse"], rtol=1e-12, atol=1e-12)
