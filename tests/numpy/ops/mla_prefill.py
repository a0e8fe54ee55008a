"""Dense MLA prefill recomputed with NumPy from the raw inputs (docs/CONTRACTS.md "mla_prefill"),
against attnd's fp64 reference: sequence b owns queries [cu_q[b], cu_q[b+1]) and keys
[cu_k[b], cu_k[b+1]); query head h reads kv head h // (H / H_kv); with causal, query i of Lq sees
keys j <= i + Lk − Lq (bottom-right aligned), without it all Lk keys; s = sm_scale·q·kᵀ, softmax
written out, out = P·V / Σ, lse = m + log Σ. Rows that see no key, and rows past the last
sequence, give out 0 and lse -inf."""

import numpy as np

import common


def check(inputs, scalars, refs):
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    cu_q = inputs["cu_seqlens_q"].astype(np.int64)
    cu_k = inputs["cu_seqlens_k"].astype(np.int64)
    total_q, heads, _ = q.shape
    heads_kv, d_v = v.shape[1], v.shape[2]
    group = heads // heads_kv
    scale = float(scalars["sm_scale"])
    causal = bool(scalars["causal"])
    out = np.zeros((total_q, heads, d_v))
    lse = np.full((total_q, heads), -np.inf)
    for b in range(cu_q.shape[0] - 1):
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        if lq == 0 or lk == 0:
            continue
        qs = q[cu_q[b] : cu_q[b + 1]]  # [Lq, H, d_qk]
        ks = k[cu_k[b] : cu_k[b + 1]][:, np.arange(heads) // group]  # [Lk, H, d_qk]
        vs = v[cu_k[b] : cu_k[b + 1]][:, np.arange(heads) // group]  # [Lk, H, d_v]
        s = scale * np.einsum("ihd,jhd->hij", qs, ks)  # [H, Lq, Lk]
        if causal:
            i = np.arange(lq)[:, None]
            j = np.arange(lk)[None, :]
            s = np.where(j <= i + lk - lq, s, -np.inf)
        m = s.max(axis=2, keepdims=True)  # -inf for rows that see nothing
        seen = np.isfinite(m[:, :, 0])  # [H, Lq]
        e = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
        total = e.sum(axis=2)
        o = np.einsum("hij,jhd->ihd", e, vs) / np.where(seen, total, 1.0).T[:, :, None]
        out[cu_q[b] : cu_q[b + 1]] = np.where(seen.T[:, :, None], o, 0.0)
        with np.errstate(divide="ignore"):
            lse[cu_q[b] : cu_q[b + 1]] = np.where(seen, m[:, :, 0] + np.log(total), -np.inf).T
    common.assert_close("out", out, refs["out"], rtol=1e-9, atol=1e-12)
    common.assert_close("lse", lse, refs["lse"], rtol=1e-12, atol=1e-12)
