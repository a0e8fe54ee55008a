"""Random cases of every attnd operator for the integration tests: fresh inputs (never zeros) in
the raw dtypes the daemon takes, the expected output layouts, and a check against reference.py.

    case = make_case("sparse_mla", rng)
    res = client.call(case.op, **case.arguments())         # inline
    case.check(res.outputs)
    run_in_region(client, region, case)                    # zero-copy, outputs poisoned first
"""

import numpy as np

from attnd_client import dtypes, to_bf16, to_fp8_e4m3

import reference as ref

POISON = {"bf16": 0x7FC0, "f32": np.nan, "i32": -7}  # NaN bits / an impossible index


class Case:
    def __init__(self, op, inputs, input_dtypes, scalars, outputs, check):
        self.op = op
        self.inputs = inputs  # name -> raw NumPy array
        self.input_dtypes = input_dtypes  # name -> attnd dtype
        self.scalars = scalars  # name -> Python scalar
        self.outputs = outputs  # name -> (attnd dtype, shape), what the check expects
        self._check = check

    def arguments(self, **outputs):
        args = dict(self.inputs)
        args.update(self.scalars)
        args.update(outputs)
        return args

    def check(self, outputs):
        for name in self.outputs:
            assert outputs.get(name) is not None, f"{self.op}: output {name} missing"
        self._check({name: np.asarray(outputs[name]) for name in self.outputs})


def _fp8(rng, shape, scale=1.0):
    return to_fp8_e4m3(rng.standard_normal(shape) * scale)


def _bf16(rng, shape, scale=1.0):
    return to_bf16(rng.standard_normal(shape) * scale)


def _i32(values):
    return np.asarray(values, dtype=np.int32)


def indexer_logits(rng, m=24, heads=32, dim=128, n=300, precision=None):
    q, k = _fp8(rng, (m, heads, dim)), _fp8(rng, (n, dim))
    k_scale = rng.uniform(0.5, 2.0, n).astype(np.float32)
    weights = rng.standard_normal((m, heads)).astype(np.float32)
    # Causal rows, context-parallel offsets, empty (ke <= ks, ke < 0), past-end, misaligned.
    ks = rng.integers(-20, n // 2, m)
    ke = ks + rng.integers(1, n, m)
    ks[0], ke[0] = 0, n  # the whole row
    ks[1], ke[1] = 10, 5  # empty
    ks[2], ke[2] = -5, -1  # empty, negative
    ks[3], ke[3] = n - 3, n + 50  # past the end
    ks[4], ke[4] = n + 5, n + 9  # entirely past the end
    inputs = {
        "q": q,
        "k": k,
        "k_scale": k_scale,
        "weights": weights,
        "ks": _i32(ks),
        "ke": _i32(ke),
    }

    def check(out):
        want = ref.indexer_logits(q, k, k_scale, weights, ks, ke)
        magnitude = ref.indexer_logits_magnitude(q, k, k_scale, weights)
        ref.assert_indexer_logits_close(
            "logits", out["logits"], want, magnitude, heads, dim, precision
        )

    return Case(
        "indexer_logits",
        inputs,
        {
            "q": "fp8_e4m3",
            "k": "fp8_e4m3",
            "k_scale": "f32",
            "weights": "f32",
            "ks": "i32",
            "ke": "i32",
        },
        _precision(precision),
        {"logits": ("f32", (m, n))},
        check,
    )


def indexer_logits_paged(
    rng,
    batch=3,
    next_n=2,
    heads=32,
    dim=128,
    block_size=64,
    max_blocks=5,
    num_blocks=17,
    per_token=False,
    precision=None,
):
    q = _fp8(rng, (batch, next_n, heads, dim))
    kv_cache = np.empty((num_blocks, block_size * (dim + 4)), dtype=np.uint8)
    kv_cache[:, : block_size * dim] = _fp8(rng, (num_blocks, block_size * dim))
    scales = rng.uniform(0.5, 2.0, (num_blocks, block_size)).astype(np.float32)
    kv_cache[:, block_size * dim :] = scales.view(np.uint8).reshape(num_blocks, -1)
    block_table = rng.permutation(num_blocks)[: batch * max_blocks].reshape(batch, max_blocks)
    block_table = block_table.astype(np.int32)
    block_table[1, 1] = -1  # masked block
    block_table[2, 0] = num_blocks + 3
    context_lens = _i32([130, 1, max_blocks * block_size])
    if per_token:  # [B, next_n] as DeepGEMM takes them: varlen, any order, 0, past the table
        context_lens = _i32(
            [
                [130, 129, 0, 131][:next_n],
                [1, 0, 1, 1][:next_n],
                [max_blocks * block_size + 9] * next_n,
            ]
        )
    weights = rng.standard_normal((batch * next_n, heads)).astype(np.float32)
    inputs = {
        "q": q,
        "kv_cache": kv_cache,
        "block_table": block_table,
        "context_lens": context_lens,
        "weights": weights,
    }
    n = max_blocks * block_size

    def check(out):
        args = (q, kv_cache, block_table, context_lens, weights, block_size)
        want = ref.indexer_logits_paged(*args)
        magnitude = ref.indexer_logits_paged(*args, magnitude=True)
        ref.assert_indexer_logits_close(
            "logits", out["logits"], want, magnitude, heads, dim, precision
        )

    return Case(
        "indexer_logits_paged",
        inputs,
        {
            "q": "fp8_e4m3",
            "kv_cache": "u8",
            "block_table": "i32",
            "context_lens": "i32",
            "weights": "f32",
        },
        {"block_size": block_size, **_precision(precision)},
        {"logits": ("f32", (batch * next_n, n))},
        check,
    )


def topk(rng, m=16, n=1000, k=64, fused=False, row_start=False, request_map=None):
    logits = rng.standard_normal((m, n)).astype(np.float32)
    logits[0, 5:40] = -np.inf
    logits[1, 7] = np.nan
    lengths = rng.integers(k, n + 1, m)
    lengths[2], lengths[3], lengths[4] = 0, k // 2, n + 100  # empty, short, past the end
    inputs = {"logits": logits, "lengths": _i32(lengths)}
    in_dtypes = {"logits": "f32", "lengths": "i32"}
    scalars = {"k": k}
    ks = ke = None
    if row_start:  # a prefill chunk: 4 requests' keys gathered in turn, causal rows of each
        starts, ks, ke = [0, 100, 350, 700], [], []
        ends = starts[1:] + [n]
        for row in range(m):
            req = row % 4
            ks.append(starts[req])
            ke.append(starts[req] + (ends[req] - starts[req]) * (row // 4 + 1) // (m // 4))
        ks, ke = _i32(ks), _i32(ke)
        lengths = None
        inputs = {"logits": logits, "ks": ks, "ke": ke}
        in_dtypes = {"logits": "f32", "ks": "i32", "ke": "i32"}
        scalars["index_base"] = "row_start"
    page, table = 0, None
    if fused:
        page = 64
        table = rng.integers(0, 10_000, (m, -(-n // page))).astype(np.int32)
        table[0, 1] = -1
        inputs["block_table"], in_dtypes["block_table"] = table, "i32"
        scalars["page_size"] = page
    req_ids = cu = None
    stride = 0
    if request_map:  # 4 requests' table rows, pages two pages apart in the pool
        table = table[:4]
        inputs["block_table"] = table
        stride = scalars["block_stride"] = 2 * page
    if request_map == "req_ids":  # vLLM req_id_per_token (row % 4: the chunk's requests), one bad
        req_ids = _i32([row % 4 for row in range(m)])
        req_ids[5] = 7
        inputs["req_id_per_row"], in_dtypes["req_id_per_row"] = req_ids, "i32"
    elif request_map == "cu":  # SGLang extend: an empty request, the last two rows in none
        cu = _i32([0, 3, 3, 10, m - 2])
        inputs["cu_seqlens_q"], in_dtypes["cu_seqlens_q"] = cu, "i32"

    def check(out):
        want_idx, want_val = ref.topk(
            logits,
            k,
            ks=ks,
            ke=ke,
            lengths=lengths,
            block_table=table,
            page_size=page,
            row_start=row_start,
            req_id_per_row=req_ids,
            cu_seqlens_q=cu,
            block_stride=stride,
        )
        np.testing.assert_array_equal(out["indices"], want_idx, err_msg="indices")
        np.testing.assert_array_equal(out["values"], want_val, err_msg="values")

    return Case(
        "topk",
        inputs,
        in_dtypes,
        scalars,
        {"indices": ("i32", (m, k)), "values": ("f32", (m, k))},
        check,
    )


def _fp8_kv_cache(rng, rows):
    """The FP8 cache (u8 [rows, 656]): 512 e4m3 codes, 4 f32 power-of-two scales, 64 bf16 rope."""
    codes = to_fp8_e4m3(rng.standard_normal((rows, 512)) * 64)
    scales = np.exp2(rng.integers(-9, -4, (rows, 4))).astype(np.float32)
    rope = _bf16(rng, (rows, 64))
    return np.concatenate([codes, scales.view(np.uint8), rope.view(np.uint8)], axis=1)


# The per-tensor FP8 cache's scale in the integration cases: a power of two, so every
# implementation (the GPU ones round e4m3 x scale to bf16) sees the reference's exact values.
PER_TENSOR_KV_SCALE = 0.0625


def per_tensor_fp8_cache(rng, shape, scale):
    """vLLM's kv_cache_dtype "fp8" MLA cache (docs/CONTRACTS.md "Per-tensor FP8 KV cache"), written
    as its cache writer does: each bf16 row (latent, then rope) widened to f32, divided by the one
    scale in f32, converted to e4m3fn rounding to nearest even and saturating to +-448. The rows
    include values past 448 x scale (saturated) and in the e4m3 subnormal range."""
    src = rng.standard_normal(shape)
    src.flat[::97] *= 1000.0  # saturates
    src.flat[1::89] *= 1e-4  # subnormal codes
    bits = to_bf16(src)
    quotient = dtypes.from_bf16(bits, np.float32) / np.float32(scale)  # f32 / f32
    return to_fp8_e4m3(quotient)


def _precision(precision, name="precision"):
    """The `precision` scalar (or dsa_attention's `index_precision`) of a case: none (the
    daemon's default: fast for attention, high for the indexer) or given."""
    return {} if precision is None else {name: precision}


def _topk_tolerance(scores, magnitude, heads, dim, index_precision):
    """How far below the k-th best logit a chosen one may lie: 1e-4 of the largest |logit| (the
    f32 sums), or with index_precision "fast" FAST's closed-form bound on the largest magnitude
    (docs/ACCURACY.md "Indexer logits, FAST")."""
    tol = 1e-4 * np.max(np.abs(scores[np.isfinite(scores)]))
    if index_precision == "fast":
        tol += ref.indexer_fast_bound(heads, dim) * np.max(magnitude[np.isfinite(magnitude)])
    return tol


def sparse_mla(
    rng,
    tokens=8,
    heads=16,
    d_qk=576,
    rows=500,
    k=70,
    form="table",
    kv_format="bf16",
    precision=None,
):
    # kv_format: "bf16", "fp8" (the FlashMLA 656-byte rows) or "fp8_per_tensor" (u8 [rows, d_qk]
    # with kv_scale, d_qk 576 or 512).
    fp8_kv = kv_format in ("fp8", "fp8_per_tensor")
    kv_scale = PER_TENSOR_KV_SCALE if kv_format == "fp8_per_tensor" else None
    q = _bf16(rng, (tokens, heads, d_qk))
    if kv_scale is not None:
        kv = per_tensor_fp8_cache(rng, (rows, d_qk), kv_scale)
    else:
        kv = _fp8_kv_cache(rng, rows) if fp8_kv else _bf16(rng, (rows, d_qk))
    indices = rng.integers(-3, rows + 3, (tokens, k)).astype(np.int32)
    indices[0] = -1  # a row with no valid index: out 0, lse -inf
    inputs = {"q": q, "kv": kv}
    in_dtypes = {"q": "bf16", "kv": "u8" if fp8_kv else "bf16", "indices": "i32"}
    indptr = topk_length = None
    if form == "csr":
        counts = rng.integers(0, k, tokens)
        counts[1] = 0
        indptr = _i32(np.concatenate([[0], np.cumsum(counts)]))
        indices = rng.integers(-3, rows + 3, int(indptr[-1])).astype(np.int32)
        inputs["indptr"], in_dtypes["indptr"] = indptr, "i32"
    elif form == "topk_length":
        topk_length = _i32(rng.integers(0, k + 5, tokens))
        inputs["topk_length"], in_dtypes["topk_length"] = topk_length, "i32"
    inputs["indices"] = indices
    scale = float(1.0 / np.sqrt(d_qk))

    def check(out):
        want_abs = []
        want_out, want_lse = ref.sparse_mla(
            q, kv, indices, scale, indptr, topk_length, want_abs, kv_scale=kv_scale
        )
        ref.assert_attention_close("out", out["out"], want_out, want_abs[0], precision)
        ref.assert_lse_close("lse", out["lse"], want_lse)

    scalars = {"sm_scale": scale, **_precision(precision)}
    if kv_scale is not None:
        scalars["kv_scale"] = kv_scale
    return Case(
        "sparse_mla",
        inputs,
        in_dtypes,
        scalars,
        {"out": ("bf16", (tokens, heads, 512)), "lse": ("f32", (tokens, heads))},
        check,
    )


def mla_decode(
    rng,
    batch=3,
    s_q=2,
    heads=16,
    d_qk=576,
    page=64,
    num_pages=14,
    max_pages=4,
    precision=None,
    kv_format="bf16",
):
    # kv_format: "bf16" or "fp8_per_tensor" (u8 codes with kv_scale, d_qk 576 or 512).
    kv_scale = PER_TENSOR_KV_SCALE if kv_format == "fp8_per_tensor" else None
    q = _bf16(rng, (batch, s_q, heads, d_qk))
    if kv_scale is not None:
        cache = per_tensor_fp8_cache(rng, (num_pages, page, d_qk), kv_scale)
    else:
        cache = _bf16(rng, (num_pages, page, d_qk))
    block_table = rng.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages)
    block_table = block_table.astype(np.int32)
    block_table[0, 1] = -1
    seqlens = _i32([100, 1, max_pages * page])
    scale = float(1.0 / np.sqrt(d_qk))
    inputs = {"q": q, "kv_cache": cache, "block_table": block_table, "cache_seqlens": seqlens}

    def check(out):
        want_abs = []
        want_out, want_lse = ref.mla_decode(
            q, cache, block_table, seqlens, scale, True, want_abs, kv_scale=kv_scale
        )
        ref.assert_attention_close("out", out["out"], want_out, want_abs[0], precision)
        ref.assert_lse_close("lse", out["lse"], want_lse)

    scalars = {"sm_scale": scale, "causal": True, **_precision(precision)}
    if kv_scale is not None:
        scalars["kv_scale"] = kv_scale
    return Case(
        "mla_decode",
        inputs,
        {
            "q": "bf16",
            "kv_cache": "bf16" if kv_scale is None else "u8",
            "block_table": "i32",
            "cache_seqlens": "i32",
        },
        scalars,
        {"out": ("bf16", (batch, s_q, heads, 512)), "lse": ("f32", (batch, s_q, heads))},
        check,
    )


def mla_prefill(
    rng, lens_q=(5, 17), lens_k=(9, 17), heads=8, heads_kv=2, d_qk=192, d_v=128, precision=None
):
    cu_q = _i32(np.concatenate([[0], np.cumsum(lens_q)]))
    cu_k = _i32(np.concatenate([[0], np.cumsum(lens_k)]))
    q = _bf16(rng, (int(cu_q[-1]), heads, d_qk))
    k, v = _bf16(rng, (int(cu_k[-1]), heads_kv, d_qk)), _bf16(rng, (int(cu_k[-1]), heads_kv, d_v))
    scale = float(1.0 / np.sqrt(d_qk))
    inputs = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}

    def check(out):
        want_abs = []
        want_out, want_lse = ref.mla_prefill(q, k, v, cu_q, cu_k, scale, True, want_abs)
        ref.assert_attention_close("out", out["out"], want_out, want_abs[0], precision)
        ref.assert_lse_close("lse", out["lse"], want_lse)

    return Case(
        "mla_prefill",
        inputs,
        {"q": "bf16", "k": "bf16", "v": "bf16", "cu_seqlens_q": "i32", "cu_seqlens_k": "i32"},
        {"sm_scale": scale, "causal": True, **_precision(precision)},
        {"out": ("bf16", (int(cu_q[-1]), heads, d_v)), "lse": ("f32", (int(cu_q[-1]), heads))},
        check,
    )


def _dsa_attention_paged(
    rng, heads_idx, dim_idx, topk_k, heads, d_qk, kv_format, precision, index_precision, **paged
):
    """The paged form (docs/CONTRACTS.md "dsa_attention", "Paged form"): B requests of next_n
    tokens over an indexer cache in block rows and an MLA pool of rows (kv_format as
    dsa_attention's), both scattered by shuffled block tables; kv_table "shared" (one table,
    vLLM) or "page1" (a token-granular MLA table, SGLang); per_token: context_lens [B, next_n]."""
    batch, next_n, block_size, max_blocks = 3, paged.get("next_n", 2), 16, 6
    num_blocks = batch * max_blocks + 2
    per_token, kv_table = paged.get("per_token", False), paged.get("kv_table", "shared")
    tokens, n = batch * next_n, max_blocks * block_size
    index_q = _fp8(rng, (batch, next_n, heads_idx, dim_idx))
    index_cache = np.empty((num_blocks, block_size * (dim_idx + 4)), dtype=np.uint8)
    index_cache[:, : block_size * dim_idx] = _fp8(rng, (num_blocks, block_size * dim_idx))
    scales = rng.uniform(0.5, 2.0, (num_blocks, block_size)).astype(np.float32)
    index_cache[:, block_size * dim_idx :] = scales.view(np.uint8).reshape(num_blocks, -1)
    index_block_table = rng.permutation(num_blocks)[: batch * max_blocks].reshape(batch, -1)
    index_block_table = index_block_table.astype(np.int32)
    # Request 1's first token sees 0 positions (an empty window); request 2 the whole table.
    context_lens = _i32([topk_k + 20, 1, n])
    if per_token:
        context_lens = _i32([[topk_k + 20, 9][:next_n], [0, 1][:next_n], [n + 5] * next_n])
    index_weights = rng.standard_normal((tokens, heads_idx)).astype(np.float32)
    q = _bf16(rng, (tokens, heads, d_qk))
    inputs = {
        "index_q": index_q,
        "index_weights": index_weights,
        "index_cache": index_cache,
        "index_block_table": index_block_table,
        "context_lens": context_lens,
        "q": q,
    }
    scalars = {"index_block_size": block_size}
    if kv_table == "page1":  # each position its own pool row, scattered
        kv_block_size, pool_rows = 1, batch * n + 7
        table = rng.permutation(pool_rows)[: batch * n].reshape(batch, n).astype(np.int32)
        inputs["kv_block_table"] = table
        scalars["kv_block_size"] = 1
    else:
        kv_block_size, pool_rows, table = block_size, num_blocks * block_size, index_block_table
    kv, kv_scale = _dsa_kv(rng, pool_rows, d_qk, kv_format)
    inputs["kv"] = kv
    if kv_scale is not None:
        scalars["kv_scale"] = kv_scale
    scale = float(1.0 / np.sqrt(d_qk))

    def check(out):
        args = (index_q, index_cache, index_block_table, context_lens, index_weights, block_size)
        scores = ref.indexer_logits_paged(*args)
        magnitude = ref.indexer_logits_paged(*args, magnitude=True)
        tol = _topk_tolerance(scores, magnitude, heads_idx, dim_idx, index_precision)
        chosen = out["indices"]
        for t in range(tokens):
            b = t // next_n
            slot_to_pos = {
                int(table[b, p // kv_block_size]) * kv_block_size + p % kv_block_size: p
                for p in range(n)
            }
            picked = [int(c) for c in chosen[t] if c >= 0]
            assert all(c in slot_to_pos for c in picked), f"indices[{t}]: not a position's row"
            positions = [slot_to_pos[c] for c in picked]
            assert positions == sorted(positions), f"indices[{t}]: positions not ascending"
            row = np.full(topk_k, -1)
            row[: len(positions)] = positions
            ref.assert_true_topk(f"indices[{t}]", row, scores[t], topk_k, 0, n, tol)
        want_abs = []
        want_out, want_lse = ref.sparse_mla(
            q, kv, chosen, scale, weighted_abs=want_abs, kv_scale=kv_scale
        )
        ref.assert_attention_close("out", out["out"], want_out, want_abs[0], precision)
        ref.assert_lse_close("lse", out["lse"], want_lse)
        ref.assert_indexer_logits_close(
            "logits", out["logits"], scores, magnitude, heads_idx, dim_idx, index_precision
        )

    input_dtypes = {
        "index_q": "fp8_e4m3",
        "index_weights": "f32",
        "index_cache": "u8",
        "index_block_table": "i32",
        "context_lens": "i32",
        "q": "bf16",
        "kv": "bf16" if kv_format == "bf16" else "u8",
    }
    if "kv_block_table" in inputs:
        input_dtypes["kv_block_table"] = "i32"
    return Case(
        "dsa_attention",
        inputs,
        input_dtypes,
        {
            "topk": topk_k,
            "sm_scale": scale,
            **scalars,
            **_precision(precision),
            **_precision(index_precision, "index_precision"),
        },
        {
            "out": ("bf16", (tokens, heads, 512)),
            "lse": ("f32", (tokens, heads)),
            "indices": ("i32", (tokens, topk_k)),
            "logits": ("f32", (tokens, n)),
        },
        check,
    )


def _dsa_kv(rng, rows, d_qk, kv_format):
    """dsa_attention's kv of `rows` rows and its kv_scale (None but for the per-tensor cache):
    kv_format "bf16", "fp8" (the FlashMLA 656-byte rows, d_qk 576) or "fp8_per_tensor" (u8
    [rows, d_qk] codes with kv_scale, d_qk 576 or 512)."""
    if kv_format == "fp8":
        return _fp8_kv_cache(rng, rows), None
    if kv_format == "fp8_per_tensor":
        kv_scale = PER_TENSOR_KV_SCALE
        return per_tensor_fp8_cache(rng, (rows, d_qk), kv_scale), kv_scale
    return _bf16(rng, (rows, d_qk)), None


def dsa_attention(
    rng,
    tokens=6,
    heads_idx=32,
    dim_idx=128,
    rows=400,
    topk_k=64,
    heads=16,
    d_qk=576,
    kv_format="bf16",
    precision=None,
    index_precision=None,
    paged=False,
    **paged_options,
):
    if paged:
        return _dsa_attention_paged(
            rng,
            heads_idx,
            dim_idx,
            topk_k,
            heads,
            d_qk,
            kv_format,
            precision,
            index_precision,
            **paged_options,
        )
    index_q, index_k = _fp8(rng, (tokens, heads_idx, dim_idx)), _fp8(rng, (rows, dim_idx))
    index_k_scale = rng.uniform(0.5, 2.0, rows).astype(np.float32)
    index_weights = rng.standard_normal((tokens, heads_idx)).astype(np.float32)
    ke = _i32(rows - tokens + 1 + np.arange(tokens))  # causal prefill of the last tokens
    ke[0] = topk_k // 2  # a window shorter than k
    ks = np.zeros(tokens, dtype=np.int32)
    q = _bf16(rng, (tokens, heads, d_qk))
    kv, kv_scale = _dsa_kv(rng, rows, d_qk, kv_format)
    scale = float(1.0 / np.sqrt(d_qk))
    inputs = {
        "index_q": index_q,
        "index_k": index_k,
        "index_k_scale": index_k_scale,
        "index_weights": index_weights,
        "ks": ks,
        "ke": ke,
        "q": q,
        "kv": kv,
    }

    def check(out):
        scores = ref.indexer_logits(index_q, index_k, index_k_scale, index_weights, ks, ke)
        magnitude = ref.indexer_logits_magnitude(index_q, index_k, index_k_scale, index_weights)
        tol = _topk_tolerance(scores, magnitude, heads_idx, dim_idx, index_precision)
        chosen = out["indices"]
        for t in range(tokens):
            ref.assert_true_topk(
                f"indices[{t}]",
                chosen[t],
                scores[t],
                topk_k,
                int(ks[t]),
                min(int(ke[t]), rows),
                tol,
            )
        want_abs = []
        want_out, want_lse = ref.sparse_mla(
            q, kv, chosen, scale, weighted_abs=want_abs, kv_scale=kv_scale
        )
        ref.assert_attention_close("out", out["out"], want_out, want_abs[0], precision)
        ref.assert_lse_close("lse", out["lse"], want_lse)
        ref.assert_indexer_logits_close(
            "logits", out["logits"], scores, magnitude, heads_idx, dim_idx, index_precision
        )

    return Case(
        "dsa_attention",
        inputs,
        {
            "index_q": "fp8_e4m3",
            "index_k": "fp8_e4m3",
            "index_k_scale": "f32",
            "index_weights": "f32",
            "ks": "i32",
            "ke": "i32",
            "q": "bf16",
            "kv": "bf16" if kv_format == "bf16" else "u8",
        },
        {
            "topk": topk_k,
            "sm_scale": scale,
            **({} if kv_scale is None else {"kv_scale": kv_scale}),
            **_precision(precision),
            **_precision(index_precision, "index_precision"),
        },
        {
            "out": ("bf16", (tokens, heads, 512)),
            "lse": ("f32", (tokens, heads)),
            "indices": ("i32", (tokens, topk_k)),
            "logits": ("f32", (tokens, rows)),
        },
        check,
    )


MAKERS = {
    "indexer_logits": indexer_logits,
    "indexer_logits_paged": indexer_logits_paged,
    "topk": topk,
    "sparse_mla": sparse_mla,
    "mla_decode": mla_decode,
    "mla_prefill": mla_prefill,
    "dsa_attention": dsa_attention,
}


def make_case(op, rng, **kwargs):
    return MAKERS[op](rng, **kwargs)


def inline_outputs(case):
    """Output arguments asking for every checked output inline (optional ones included)."""
    return {name: True for name in case.outputs}


def run_in_region(caller, region, case, poison=True):
    """Copies the case's inputs into `region`, places every output there (poisoned first so an
    unwritten element fails), runs the call zero-copy and checks it. Returns the OpResult."""
    region.reset()
    args = {name: region.put(array, case.input_dtypes[name]) for name, array in case.inputs.items()}
    args.update(case.scalars)
    outs = {}
    for name, (dtype, shape) in case.outputs.items():
        view = region.array(dtype, shape)
        if poison:
            view[...] = POISON[dtype]
        outs[name] = view
    result = caller.call(case.op, **args, **outs)
    case.check(outs)
    assert result.stats.copied_bytes_in == 0, "region inputs were copied"
    assert result.stats.copied_bytes_out == 0, "region outputs were copied"
    for name in case.outputs:
        assert result.outputs[name] is outs[name]
    return result


def region_bytes(case):
    """Bytes a region needs for run_in_region (with 64-byte alignment slack)."""
    total = sum(a.nbytes + 64 for a in case.inputs.values())
    total += sum(
        int(np.prod(shape)) * dtypes.itemsize(dt) + 64 for dt, shape in case.outputs.values()
    )
    return total
