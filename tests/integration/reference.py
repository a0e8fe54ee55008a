"""fp64 NumPy references of attnd's operators (docs/CONTRACTS.md, kernels/<op>/params.h), written
from the contracts and sharing no code with attnd, plus the comparisons the integration tests use.
Inputs are the raw arrays sent to the daemon (bf16 as uint16, fp8 as uint8); decoding goes through
attnd_client.dtypes, which tests/client/python checks against hand-made tables.

    ref_out, ref_lse = sparse_mla(q_bits, kv_bits, indices, sm_scale=0.04)
    assert_bf16_close("out", got.out, ref_out)
"""

import numpy as np

from attnd_client import dtypes

D_V = 512


def bf16(x):
    return dtypes.from_bf16(x, np.float64)


def fp8(x):
    return dtypes.from_fp8_e4m3(x, np.float64)


def _window(ks, ke, n):
    return max(int(ks), 0), min(int(ke), n)


def indexer_logits(q, k, k_scale, weights, ks, ke, clean_logits=True, logits=None):
    """q fp8 [M,H,D], k fp8 [N,D]: logits [M,N]; outside the window -inf (clean) or `logits`'
    prior values (untouched)."""
    qf, kf = fp8(q), fp8(k)
    m_rows, n = qf.shape[0], kf.shape[0]
    scores = np.maximum(np.einsum("mhd,nd->mhn", qf, kf), 0.0)
    full = np.einsum("mhn,mh->mn", scores, weights.astype(np.float64)) * k_scale[None, :]
    out = np.full((m_rows, n), -np.inf) if logits is None else logits.astype(np.float64).copy()
    for m in range(m_rows):
        lo, hi = _window(ks[m], ke[m], n)
        if clean_logits:
            out[m, :] = -np.inf
        if hi > lo:
            out[m, lo:hi] = full[m, lo:hi]
    return out


def indexer_logits_magnitude(q, k, k_scale, weights):
    """sum_h |w[m,h]| sum_d |q[m,h,d] k[n,d]| |k_scale[n]| [M, N]: the scale of the indexer's
    error bounds (docs/ACCURACY.md "Indexer logits")."""
    qf, kf = np.abs(fp8(q)), np.abs(fp8(k))
    abs_dots = np.einsum("mhd,nd->mhn", qf, kf)
    return (
        np.einsum("mhn,mh->mn", abs_dots, np.abs(weights.astype(np.float64)))
        * np.abs(k_scale.astype(np.float64))[None, :]
    )


def paged_keys(kv_cache, block, head_dim, block_size):
    """(keys fp64 [block_size, D], scales fp64 [block_size]) of one cache block."""
    row = kv_cache[block]
    keys = fp8(row[: block_size * head_dim].reshape(block_size, head_dim))
    scales = row[block_size * head_dim : block_size * (head_dim + 4)].view(np.float32)
    return keys, scales.astype(np.float64)


def indexer_logits_paged(
    q, kv_cache, block_table, context_lens, weights, block_size, max_context_len=0, magnitude=False
):
    """q fp8 [B,next_n,H,D], kv_cache u8 [blocks, bs*(D+4)]: logits [B*next_n, N]. magnitude:
    instead sum_h |w| sum_d |q k| |scale| at the same positions (-inf elsewhere), the scale of the
    error bounds (as indexer_logits_magnitude)."""
    batch, next_n, _, head_dim = q.shape
    qf = np.abs(fp8(q)) if magnitude else fp8(q)
    max_blocks = block_table.shape[1]
    n = max_context_len or max_blocks * block_size
    out = np.full((batch * next_n, n), -np.inf)
    for b in range(batch):
        for j in range(next_n):
            row = b * next_n + j
            # context_lens [B] (token j sees L - next_n + j + 1) or per token [B, next_n]
            length = (
                int(context_lens[b, j])
                if context_lens.ndim == 2
                else int(context_lens[b]) - next_n + j + 1
            )
            visible = int(np.clip(length, 0, min(n, max_blocks * block_size)))
            for pos in range(visible):
                block = int(block_table[b, pos // block_size])
                if block < 0 or block >= kv_cache.shape[0]:
                    continue
                keys, scales = paged_keys(kv_cache, block, head_dim, block_size)
                key, scale = keys[pos % block_size], scales[pos % block_size]
                w = weights[row].astype(np.float64)
                if magnitude:
                    out[row, pos] = float((qf[b, j] @ np.abs(key)) @ np.abs(w)) * abs(scale)
                    continue
                s = np.maximum(qf[b, j] @ key, 0.0)
                out[row, pos] = float(s @ w) * scale
    return out


def topk(
    logits,
    k,
    ks=None,
    ke=None,
    lengths=None,
    block_table=None,
    page_size=0,
    rows_per_request=1,
    row_start=False,
    req_id_per_row=None,
    cu_seqlens_q=None,
    block_stride=0,
):
    """(indices [M,k] i32, values [M,k] f32): the k largest finite-or-+inf candidates of each
    row's window (NaN and -inf never chosen), ties to the lowest column, ascending columns, -1
    padded; with row_start each column n becomes n - max(ks, 0) (its position in the window);
    with block_table those columns / positions are mapped to KV slots: block_table[b, p // page] *
    block_stride + p % page, b the row's request (m // rows_per_request, req_id_per_row[m], or
    the b with cu_seqlens_q[b] <= m < cu_seqlens_q[b + 1]; -1 for every entry without one)."""
    m_rows, n = logits.shape
    indices = np.full((m_rows, k), -1, dtype=np.int64)
    values = np.full((m_rows, k), -np.inf, dtype=np.float32)
    for m in range(m_rows):
        lo, hi = _window(0, lengths[m], n) if lengths is not None else _window(ks[m], ke[m], n)
        cols = np.arange(lo, hi) if hi > lo else np.arange(0)
        row = logits[m, cols]
        ok = ~np.isnan(row) & (row != -np.inf)
        cols, row = cols[ok], row[ok]
        order = np.lexsort((cols, -row.astype(np.float64)))[:k]
        chosen = np.sort(cols[order])
        values[m, : chosen.size] = logits[m, chosen]
        if row_start:
            chosen = chosen - lo
        if block_table is not None:
            mapped = []
            req = m // rows_per_request
            if req_id_per_row is not None:
                req = int(req_id_per_row[m])
            elif cu_seqlens_q is not None:
                hits = [
                    b
                    for b in range(len(cu_seqlens_q) - 1)
                    if cu_seqlens_q[b] <= m < cu_seqlens_q[b + 1]
                ]
                req = hits[0] if hits else -1
            for c in chosen:
                page = c // page_size
                entry = (
                    block_table[req, page]
                    if 0 <= req < block_table.shape[0] and page < block_table.shape[1]
                    else -1
                )
                slot = int(entry) * (block_stride or page_size) + int(c % page_size)
                mapped.append(-1 if entry < 0 or slot > 2**31 - 1 else slot)
            chosen = np.array(mapped, dtype=np.int64)
        indices[m, : chosen.size] = chosen
    return indices.astype(np.int32), values


def _attend(q_rows, keys, values, scale, weighted_abs=None):
    """q [H,d], keys [n,d], values [n,dv]: (out [H,dv], lse [H]); n = 0 gives 0 and -inf. With
    `weighted_abs` (a list) it also appends sum_j p_j |v_j| / l [H,dv], the scale of FAST's error."""
    if keys.shape[0] == 0:
        if weighted_abs is not None:
            weighted_abs.append(np.zeros((q_rows.shape[0], values.shape[1])))
        return np.zeros((q_rows.shape[0], values.shape[1])), np.full(q_rows.shape[0], -np.inf)
    s = scale * (q_rows @ keys.T)
    mx = s.max(axis=1, keepdims=True)
    e = np.exp(s - mx)
    total = e.sum(axis=1)
    if weighted_abs is not None:
        weighted_abs.append((e @ np.abs(values)) / total[:, None])
    return (e @ values) / total[:, None], mx[:, 0] + np.log(total)


def sparse_mla_rows(indices, t, num_rows, indptr=None, topk_length=None):
    if indptr is not None:
        row = indices[indptr[t] : indptr[t + 1]].astype(np.int64)
    else:
        row = indices[t].astype(np.int64)
        if topk_length is not None:
            row = row[: int(np.clip(topk_length[t], 0, row.shape[0]))]
    return row[(row >= 0) & (row < num_rows)]


def fp8_kv_cache(kv):
    """The FP8 sparse-MLA cache u8 [S, 656] as fp64 [S, 576]: 512 e4m3 codes times the f32 scale
    of their 128 columns, then 64 bf16 rope values."""
    rows = np.ascontiguousarray(kv)
    scales = rows[:, 512:528].copy().view(np.float32).astype(np.float64)
    nope = fp8(rows[:, :512]) * np.repeat(scales, 128, axis=1)
    return np.concatenate([nope, bf16(rows[:, 528:].copy().view(np.uint16))], axis=1)


def sparse_mla(
    q, kv, indices, sm_scale, indptr=None, topk_length=None, weighted_abs=None, kv_scale=None
):
    """q bf16 [T,H,d_qk], kv bf16 [S,d_qk] (any row stride), the FP8 cache u8 [S,656], or (with
    kv_scale) the per-tensor FP8 cache u8 [S,d_qk] of e4m3 codes x kv_scale: (out [T,H,512],
    lse [T,H]). `weighted_abs` (a list) receives sum_j p_j |v_j| / l [T,H,512]."""
    qf = bf16(q)
    if kv_scale is not None:
        kvf = fp8(kv) * np.float64(kv_scale)
    else:
        kvf = fp8_kv_cache(kv) if kv.dtype == np.uint8 else bf16(kv)
    tokens, heads, _ = qf.shape
    out, lse = np.zeros((tokens, heads, D_V)), np.zeros((tokens, heads))
    rows_abs = [] if weighted_abs is not None else None
    for t in range(tokens):
        rows = sparse_mla_rows(indices, t, kvf.shape[0], indptr, topk_length)
        keys = kvf[rows]
        out[t], lse[t] = _attend(qf[t], keys, keys[:, :D_V], sm_scale, rows_abs)
    if weighted_abs is not None:
        weighted_abs.append(np.stack(rows_abs).reshape(out.shape))
    return out, lse


def mla_decode(
    q, kv_cache, block_table, cache_seqlens, sm_scale, causal, weighted_abs=None, kv_scale=None
):
    """q bf16 [B,s_q,H,d_qk], kv_cache bf16 [pages, page_size, d_qk] (or, with kv_scale, u8
    e4m3 codes x kv_scale): out [B,s_q,H,512], lse. `weighted_abs` (a list) receives
    sum_j p_j |v_j| / l [B,s_q,H,512]."""
    qf = bf16(q)
    cache = bf16(kv_cache) if kv_scale is None else fp8(kv_cache) * np.float64(kv_scale)
    batch, s_q, heads, _ = qf.shape
    num_pages, page_size, _ = cache.shape
    max_pages = block_table.shape[1]
    out, lse = np.zeros((batch, s_q, heads, D_V)), np.zeros((batch, s_q, heads))
    rows_abs = [] if weighted_abs is not None else None
    for b in range(batch):
        seqlen = int(np.clip(cache_seqlens[b], 0, max_pages * page_size))
        for i in range(s_q):
            visible = max(seqlen - s_q + i + 1, 0) if causal else seqlen
            tokens = []
            for t in range(visible):
                page = int(block_table[b, t // page_size])
                if 0 <= page < num_pages:
                    tokens.append(cache[page, t % page_size])
            keys = np.array(tokens).reshape(len(tokens), cache.shape[2])
            out[b, i], lse[b, i] = _attend(qf[b, i], keys, keys[:, :D_V], sm_scale, rows_abs)
    if weighted_abs is not None:
        weighted_abs.append(np.stack(rows_abs).reshape(out.shape))
    return out, lse


def mla_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, sm_scale, causal, weighted_abs=None):
    """Varlen GQA attention, causal bottom-right aligned: out [total_q,H,d_v], lse [total_q,H].
    `weighted_abs` (a list) receives sum_j p_j |v_j| / l [total_q,H,d_v]."""
    qf, kf, vf = bf16(q), bf16(k), bf16(v)
    total_q, heads, _ = qf.shape
    heads_kv = kf.shape[1]
    out, lse = np.zeros((total_q, heads, vf.shape[2])), np.full((total_q, heads), -np.inf)
    out_abs = np.zeros_like(out)
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        lq, lk = q1 - q0, k1 - k0
        for i in range(lq):
            seen = max(min(i + lk - lq + 1, lk), 0) if causal else lk
            for h in range(heads):
                g = h // (heads // heads_kv)
                row_abs = []
                o, s = _attend(
                    qf[q0 + i, h][None],
                    kf[k0 : k0 + seen, g],
                    vf[k0 : k0 + seen, g],
                    sm_scale,
                    row_abs,
                )
                out[q0 + i, h], lse[q0 + i, h], out_abs[q0 + i, h] = o[0], s[0], row_abs[0][0]
    if weighted_abs is not None:
        weighted_abs.append(out_abs)
    return out, lse


# ---- comparisons (tolerances stated once, never widened per test) ----

BF16_RTOL = 2.0**-7  # two bf16 ulps of the output's own rounding and f32 accumulation
NORM_RTOL = 4e-3  # ||got - ref|| / ||ref|| for bf16 outputs
LSE_ATOL = 2e-3  # natural-log lse of f32 accumulation
F32_RTOL = 1e-4  # f32 accumulation of short fp8 dot products


def _check_inf(name, got, ref):
    inf_ref = np.isinf(ref)
    bad = np.flatnonzero(np.isinf(got) != inf_ref)
    assert bad.size == 0, f"{name}: infinity pattern differs at flat index {bad[:8]}"
    assert np.array_equal(got[inf_ref], ref[inf_ref]), f"{name}: infinity signs differ"
    assert not np.isnan(got).any(), f"{name}: NaN in the daemon's output"
    return ~inf_ref


def assert_bf16_close(name, got_bits, ref):
    got = bf16(got_bits)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, want {ref.shape}"
    finite = _check_inf(name, got, ref)
    g, r = got[finite], ref[finite]
    scale = np.sqrt(np.mean(r * r)) if r.size else 0.0
    err = np.abs(g - r)
    bound = BF16_RTOL * np.abs(r) + 1e-2 * BF16_RTOL * scale + 1e-30
    if err.size and not (err <= bound).all():
        i = int(np.argmax(err - bound))
        raise AssertionError(f"{name}: element {i}: got {g[i]!r}, reference {r[i]!r}")
    norm = np.linalg.norm(r)
    if norm > 0:
        assert np.linalg.norm(g - r) / norm <= NORM_RTOL, f"{name}: relative norm error"


# FAST precision (docs/ACCURACY.md): P rounded to bf16 before P·V adds at most 2^-9 of
# sum_j p_j |v_j| / l per element, the output's rounding 2^-9 |out|; each taken at 2^-8.
FAST_RTOL = 2.0**-8
FAST_ABS_RTOL = 2.0**-8
FAST_ATOL = 1e-5


def assert_attention_close(name, got_bits, ref, ref_abs, precision):
    """An attention op's out in `precision` ("fast", "high"; None: the default, fast) against the
    fp64 reference: HIGH as assert_bf16_close; FAST per element within
    2^-8 |ref| + 2^-8 ref_abs + 1e-5 and ||got - ref|| / ||ref|| <= 4e-3."""
    if precision == "high":
        assert_bf16_close(name, got_bits, ref)
        return
    got = bf16(got_bits)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, want {ref.shape}"
    finite = _check_inf(name, got, ref)
    g, r, w = got[finite], ref[finite], ref_abs[finite]
    err = np.abs(g - r)
    bound = FAST_RTOL * np.abs(r) + FAST_ABS_RTOL * w + FAST_ATOL
    if err.size and not (err <= bound).all():
        i = int(np.argmax(err - bound))
        raise AssertionError(f"{name} (fast): element {i}: got {g[i]!r}, reference {r[i]!r}")
    norm = np.linalg.norm(r)
    if norm > 0:
        assert np.linalg.norm(g - r) / norm <= NORM_RTOL, f"{name} (fast): relative norm error"


def assert_lse_close(name, got, ref):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, want {ref.shape}"
    finite = _check_inf(name, got, ref)
    err = np.abs(got[finite] - ref[finite])
    assert not err.size or err.max() <= LSE_ATOL, f"{name}: max abs error {err.max()}"


def assert_f32_close(name, got, ref, rtol=F32_RTOL):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, want {ref.shape}"
    finite = _check_inf(name, got, ref)
    g, r = got[finite], ref[finite]
    scale = np.max(np.abs(r)) if r.size else 0.0
    err = np.abs(g - r)
    bound = rtol * (np.abs(r) + 1e-3 * scale) + 1e-30
    if err.size and not (err <= bound).all():
        i = int(np.argmax(err - bound))
        raise AssertionError(f"{name}: element {i}: got {g[i]!r}, reference {r[i]!r}")


def indexer_fast_bound(heads, dim):
    """FAST's closed-form bound on an indexer logit as a multiple of its magnitude
    (docs/ACCURACY.md "Indexer logits, FAST"): ((1 + 34u + 33u^2)^ceil(D/32) - 1)(1 + (H + 4)
    2^-24) + (H + 4) 2^-24 with u = 2^-12."""
    u, f32 = 2.0**-12, (heads + 4) * 2.0**-24
    acc = (1 + 34 * u + 33 * u * u) ** ((dim + 31) // 32) - 1
    return acc * (1 + f32) + f32


def assert_indexer_logits_close(name, got, ref, magnitude, heads, dim, precision):
    """Indexer logits in `precision` ("high", "fast"; None: the default, high): HIGH as
    assert_f32_close; FAST within the closed-form bound times the magnitude per element and
    ||got - ref|| / ||ref|| <= ceil(D/32) 2^-13 (docs/ACCURACY.md)."""
    if precision != "fast":
        assert_f32_close(name, got, ref)
        return
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, want {ref.shape}"
    finite = _check_inf(name, got, ref)
    g, r = got[finite], ref[finite]
    err = np.abs(g - r)
    bound = indexer_fast_bound(heads, dim) * magnitude[finite]
    if err.size and not (err <= bound).all():
        i = int(np.argmax(err - bound))
        raise AssertionError(f"{name} (fast): element {i}: got {g[i]!r}, reference {r[i]!r}")
    norm = np.linalg.norm(r)
    if norm > 0:
        rel = np.linalg.norm(g - r) / norm
        assert rel <= ((dim + 31) // 32) * 2.0**-13, f"{name} (fast): relative norm error {rel}"


def assert_true_topk(name, chosen, scores, k, lo, hi, tol):
    """`chosen` (one row, -1 padded) is a true top-k of scores[lo:hi] up to `tol`: min(k, valid)
    distinct in-window columns, none smaller than the (k)-th best score minus tol."""
    picked = chosen[chosen >= 0]
    window = scores[lo:hi] if hi > lo else np.zeros(0)
    valid = np.flatnonzero(np.isfinite(window)) + lo
    want = min(k, valid.size)
    assert picked.size == want, f"{name}: {picked.size} chosen, want {want}"
    assert np.unique(picked).size == picked.size, f"{name}: duplicate columns"
    assert ((picked >= lo) & (picked < hi)).all(), f"{name}: a column outside [{lo}, {hi})"
    if want:
        threshold = np.sort(scores[valid])[::-1][want - 1]
        assert (scores[picked] >= threshold - tol).all(), f"{name}: not a top-{k} set"
