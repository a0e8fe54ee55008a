"""Prefill indexer logits recomputed with NumPy from the decoded inputs (docs/CONTRACTS.md
"indexer_logits"), against attnd's fp64 reference: logits[m, n] = sum_h relu(q[m,h] . k[n]) *
k_scale[n] * w[m,h] for n in [max(ks,0), min(ke,N)); elsewhere -inf with clean_logits, untouched
without (expect 0)."""

import numpy as np

import common


def check(inputs, scalars, refs):
    q, k = inputs["q"], inputs["k"]  # [M, H, D], [N, D] as float64
    m, n = q.shape[0], k.shape[0]
    scores = np.maximum(np.einsum("mhd,nd->mhn", q, k), 0.0)
    logits = np.einsum("mhn,mh->mn", scores, inputs["weights"]) * inputs["k_scale"][None, :]
    cols = np.arange(n)[None, :]
    lo = np.maximum(inputs["ks"].astype(np.int64), 0)[:, None]
    hi = np.minimum(inputs["ke"].astype(np.int64), n)[:, None]
    inside = (cols >= lo) & (cols < hi)
    clean = scalars["clean_logits"] != 0
    expect = np.where(inside, 2.0, 1.0 if clean else 0.0)
    assert expect.shape == (m, n)
    assert np.array_equal(expect, refs["expect"]), "window / clean_logits masks differ"
    want = np.where(inside, logits, -np.inf if clean else 0.0)
    common.assert_close("logits", want, refs["logits"])
