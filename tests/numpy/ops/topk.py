"""Top-k recomputed with NumPy from the raw inputs (docs/CONTRACTS.md "topk"), against attnd's fp64
reference: per row, the window [max(ks, 0), min(ke, N)) (or [0, lengths)), NaN and -inf never
chosen, the k largest by value descending with ties by ascending column (the reference's
documented order), -1 / -inf padding; with a block table each column n maps to
block_table[b, n // page] * block_stride + n % page (block_stride 0: page), b being the row's
request: r // rows_per_request, req_id_per_row[r] (none outside [0, R)), or the b with
cu_seqlens_q[b] <= r < cu_seqlens_q[b + 1] (none when no interval holds r); -1 for a row without
a request, a page past the table, a negative entry, or a slot past INT32_MAX. With row_start (index base ROW_START) a chosen column
n is written as n - max(ks, 0), its position in the window, and that position is what the block
table maps."""

import numpy as np

import common

INT32_MAX = 2**31 - 1


def _window(inputs, r, n):
    if "lengths" in inputs:
        lo, hi = 0, int(inputs["lengths"][r])
    else:
        lo, hi = int(inputs["ks"][r]), int(inputs["ke"][r])
    return max(lo, 0), min(hi, n)


def _request(inputs, scalars, r, requests):
    if "req_id_per_row" in inputs:
        b = int(inputs["req_id_per_row"][r])
        return b if 0 <= b < requests else -1
    if "cu_seqlens_q" in inputs:
        # Every b whose interval holds r; the cases keep cu_seqlens_q non-decreasing, so at most
        # one (empty intervals hold none).
        cu = inputs["cu_seqlens_q"].astype(np.int64)
        hits = [b for b in range(requests) if cu[b] <= r < cu[b + 1]]
        return hits[0] if hits else -1
    return r // int(scalars["rows_per_request"])


def _slot(inputs, scalars, r, col):
    table = inputs["block_table"].astype(np.int64)
    page = int(scalars["page_size"])
    stride = int(scalars.get("block_stride", 0)) or page
    b = _request(inputs, scalars, r, table.shape[0])
    if b < 0:
        return -1
    row = table[b]
    if col // page >= row.shape[0] or row[col // page] < 0:
        return -1
    slot = int(row[col // page]) * stride + col % page
    return slot if slot <= INT32_MAX else -1


def check(inputs, scalars, refs):
    logits = inputs["logits"]
    m, n = logits.shape
    k = int(scalars["k"])
    cols = np.full((m, k), -1.0)
    values = np.full((m, k), -np.inf)
    slots = np.full((m, k), -1.0)
    written = np.full((m, k), -1.0)
    row_start = scalars.get("row_start", 0) == 1
    for r in range(m):
        lo, hi = _window(inputs, r, n)
        cand = np.arange(lo, hi) if hi > lo else np.arange(0)
        v = logits[r, cand]
        keep = ~np.isnan(v) & (v != -np.inf)
        cand, v = cand[keep], v[keep]
        order = np.lexsort((cand, -v))[:k]  # value descending, then column ascending
        cols[r, : order.size] = cand[order]
        values[r, : order.size] = v[order]
        origin = lo if row_start else 0
        if "block_table" in inputs:
            slots[r, : order.size] = [
                _slot(inputs, scalars, r, int(c) - origin) for c in cand[order]
            ]
            written[r, : order.size] = slots[r, : order.size]
        else:
            written[r, : order.size] = cand[order] - origin
    assert np.array_equal(cols, refs["cols"]), "cols differ from the reference"
    if row_start:
        assert np.array_equal(written, refs["written"]), "row-start output differs"
    common.assert_close("values", values, refs["values"], rtol=0, atol=0)
    if "block_table" in inputs:
        assert np.array_equal(slots, refs["slots"]), "slots differ from the reference"
