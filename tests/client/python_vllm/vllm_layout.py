"""Fixtures built the way vLLM builds its DeepSeek-V3.2 tensors (the source read is named in
docs/VLLM.md), written from that reading with NumPy only, plus fp64 references that read the
vLLM-layout bytes directly (never attnd's views of them).

Cache writers: the indexer K cache (per block: block_size fp8 keys, then block_size f32 scales;
scale = max(amax, 1e-4) / 448, rounded up to a power of two with ue8m0; with shuffle=True the
codes as vLLM's ROCm writer places them at block_size > 1, docs/INDEXER_CACHES.md) and the sparse MLA
fp8_ds_mla cache (656-byte rows: 512 fp8, 4 f32 tile scales = max(amax / 448, FLT_MIN), 64 bf16
rope). Metadata: requests ordered decodes first, block tables, slot_mapping, query_start_loc,
req_id_per_token, the indexer's prefill chunks (cu_seq_lens, cu_seqlen_ks / cu_seqlen_ke) and
decode metadata (2-D seq_lens [B, next_n], decode_lens).
"""

from types import SimpleNamespace

import numpy as np

import attnd_client as ac

FLT_MIN = np.float32(1.1754944e-38)


def bf16_round(x):
    return ac.from_bf16(ac.to_bf16(np.asarray(x, np.float32)), np.float32)


def fp8_decode(codes):
    return ac.from_fp8_e4m3(np.asarray(codes, np.uint8), np.float64)


# ---- cache writers ----


SHUFFLE_TILE = 16


def _shuffled_pieces(off, head_dim):
    """(first byte in the block, columns) of each 16-byte piece of slot off's key in the ROCm
    SHUFFLE layout: the block's slots in groups of 16, a group's codes in tiles of 16 slots x 16
    bytes, tile c holding bytes [16c, 16c + 16) of the group's keys one after the other."""
    group, lane = divmod(off, SHUFFLE_TILE)
    for c in range(head_dim // SHUFFLE_TILE):
        start = group * SHUFFLE_TILE * head_dim + c * SHUFFLE_TILE * SHUFFLE_TILE
        start += lane * SHUFFLE_TILE
        yield start, slice(c * SHUFFLE_TILE, (c + 1) * SHUFFLE_TILE)


def write_indexer_k(kv_cache, k, slot_mapping, quant_block_size, ue8m0=True, shuffle=False):
    """vLLM's indexer_k_quant_and_cache: k float32 (bf16 values) [T, D] into kv_cache u8
    [blocks, block_size, D + D * 4 / quant_block_size] at slot_mapping (int64, -1 skipped).
    shuffle: the codes where vLLM's ROCm writer puts them at block_size > 1 (one quant block
    per key there)."""
    blocks, block_size, width = kv_cache.shape
    head_dim = k.shape[1]
    page = kv_cache.reshape(blocks, block_size * width)
    for t, slot in enumerate(slot_mapping):
        if slot < 0:
            continue
        b, off = divmod(int(slot), block_size)
        for g in range(head_dim // quant_block_size):
            cols = slice(g * quant_block_size, (g + 1) * quant_block_size)
            amax = np.float32(np.abs(k[t, cols]).max())
            scale = np.float32(max(amax, np.float32(1e-4)) / np.float32(448.0))
            if ue8m0:
                scale = np.float32(2.0 ** np.ceil(np.log2(np.float64(scale))))
            codes = ac.to_fp8_e4m3((k[t, cols] / scale).astype(np.float32))
            if shuffle:
                assert quant_block_size == head_dim
                for start, piece in _shuffled_pieces(off, head_dim):
                    page[b, start : start + SHUFFLE_TILE] = codes[piece]
            else:
                start = off * head_dim + g * quant_block_size
                page[b, start : start + quant_block_size] = codes
            s = (
                block_size * head_dim
                + (off * head_dim + g * quant_block_size) * 4 // quant_block_size
            )
            page[b, s : s + 4] = np.frombuffer(np.float32(scale).astype("<f4").tobytes(), np.uint8)


def write_mla_fp8_ds(kv_cache, kv_c, k_pe_bits, slot_mapping):
    """vLLM's concat_and_cache_mla in the fp8_ds_mla format: kv_c float32 (bf16 values)
    [T, 512], k_pe bf16 bits [T, 64] into kv_cache u8 [blocks, block_size, 656]."""
    block_size = kv_cache.shape[1]
    for t, slot in enumerate(slot_mapping):
        if slot < 0:
            continue
        row = kv_cache[int(slot) // block_size, int(slot) % block_size]
        for j in range(4):
            tile = kv_c[t, 128 * j : 128 * (j + 1)]
            scale = np.float32(max(np.float32(np.abs(tile).max()) / np.float32(448.0), FLT_MIN))
            row[128 * j : 128 * (j + 1)] = ac.to_fp8_e4m3((tile / scale).astype(np.float32))
            row[512 + 4 * j : 516 + 4 * j] = np.frombuffer(np.float32(scale).tobytes(), np.uint8)
        row[528:656] = np.frombuffer(k_pe_bits[t].astype("<u2").tobytes(), np.uint8)


def write_mla_fp8(kv_cache, kv_bits, k_scale, slot_mapping):
    """vLLM's concat_and_cache_mla with kv_cache_dtype "fp8": each bf16 value (kv_c, then k_pe)
    widened to f32, divided by the layer's k_scale in f32, e4m3fn with saturation; u8
    [blocks, block_size, 576]."""
    block_size = kv_cache.shape[1]
    scale = np.float32(k_scale)
    for t, slot in enumerate(slot_mapping):
        if slot >= 0:
            x = ac.from_bf16(kv_bits[t], np.float32) / scale
            kv_cache[int(slot) // block_size, int(slot) % block_size] = ac.to_fp8_e4m3(x)


def write_mla_bf16(kv_cache, kv_bits, slot_mapping):
    """vLLM's concat_and_cache_mla with kv_cache_dtype auto: bf16 [blocks, block_size, 576]."""
    block_size = kv_cache.shape[1]
    for t, slot in enumerate(slot_mapping):
        if slot >= 0:
            kv_cache[int(slot) // block_size, int(slot) % block_size] = kv_bits[t]


# ---- references reading the vLLM layouts ----


def indexer_key(kv_cache, table_row, n, head_dim, shuffle=False):
    """fp64 key and scale of request position n from the vLLM indexer cache bytes (shuffle:
    the ROCm SHUFFLE layout)."""
    blocks, block_size, width = kv_cache.shape
    page = kv_cache.reshape(blocks, block_size * width)[table_row[n // block_size]]
    off = n % block_size
    if shuffle:
        codes = np.zeros(head_dim, np.uint8)
        for start, piece in _shuffled_pieces(off, head_dim):
            codes[piece] = page[start : start + SHUFFLE_TILE]
        key = fp8_decode(codes)
    else:
        key = fp8_decode(page[off * head_dim : (off + 1) * head_dim])
    s = block_size * head_dim + 4 * off
    return key, float(page[s : s + 4].copy().view("<f4")[0])


def mla_row(kv_cache, slot, k_scale=None, bf16_rounded=False):
    """fp64 [576] K row (V = first 512) of a cache slot, fp8_ds_mla, bf16 or (with k_scale)
    per-tensor fp8 layout. FP8 values are decoded exactly (code x scale), or with
    `bf16_rounded` as the GPU kernels decode them: code x scale in f32, rounded to bf16 once
    (docs/ACCURACY.md "FP8 KV cache": the GPU result is bounded against that reference)."""

    def scaled(codes, scale):
        exact = fp8_decode(codes) * scale
        if not bf16_rounded:
            return exact
        return ac.from_bf16(ac.to_bf16(exact.astype(np.float32)), np.float64)

    block_size = kv_cache.shape[1]
    row = kv_cache[slot // block_size, slot % block_size]
    if kv_cache.dtype == np.uint16:
        return ac.from_bf16(row, np.float64)
    if k_scale is not None:
        return scaled(row, np.float64(np.float32(k_scale)))
    scales = row[512:528].copy().view("<f4").astype(np.float64)
    nope = scaled(row[:512], np.repeat(scales, 128))
    rope = ac.from_bf16(row[528:656].copy().view("<u2"), np.float64)
    return np.concatenate([nope, rope])


# ---- metadata ----


class Batch:
    """One vLLM step: requests (query_len, seq_len), decodes first; paged caches of
    block_size; random distinct pages per request, unused table entries 0 (vLLM's zeroed
    block table)."""

    def __init__(self, rng, q_lens, seq_lens, num_decodes, block_size, num_blocks, max_blocks):
        self.q_lens = np.asarray(q_lens, np.int64)
        self.seq_lens = np.asarray(seq_lens, np.int64)
        self.num_reqs = len(q_lens)
        self.num_decodes = num_decodes
        self.block_size = block_size
        self.num_blocks = num_blocks
        need = -(-self.seq_lens // block_size)
        pages = rng.permutation(num_blocks)
        assert need.sum() <= num_blocks and need.max() <= max_blocks
        self.block_table = np.zeros((self.num_reqs, max_blocks), np.int32)
        at = 0
        for r, n in enumerate(need):
            self.block_table[r, :n] = pages[at : at + n]
            at += n
        self.query_start_loc = np.concatenate([[0], np.cumsum(self.q_lens)]).astype(np.int32)
        self.num_tokens = int(self.query_start_loc[-1])
        self.num_decode_tokens = int(self.query_start_loc[num_decodes])
        # req_id_per_token as vLLM's sparse MLA metadata builder makes it
        self.req_id_per_token = np.repeat(np.arange(self.num_reqs, dtype=np.int32), self.q_lens)
        # token t = request r's i-th new token, at position seq_len - q_len + i
        self.token_pos = np.concatenate(
            [np.arange(s - q, s) for q, s in zip(self.q_lens, self.seq_lens, strict=True)]
        ).astype(np.int64)

    def slots(self, r, positions):
        positions = np.asarray(positions, np.int64)
        pages = self.block_table[r, positions // self.block_size].astype(np.int64)
        return pages * self.block_size + positions % self.block_size

    def all_slots(self):
        """(request, position, slot) of every cached token, context and new ones."""
        out = []
        for r, s in enumerate(self.seq_lens):
            pos = np.arange(s)
            out.append(np.stack([np.full(s, r), pos, self.slots(r, pos)], axis=1))
        return np.concatenate(out)

    def slot_mapping(self):
        """vLLM's slot_mapping of this step's new tokens (int64)."""
        return self.slots_of_tokens(np.arange(self.num_tokens))

    def slots_of_tokens(self, tokens):
        return np.array(
            [self.slots(self.req_id_per_token[t], [self.token_pos[t]])[0] for t in tokens],
            np.int64,
        )

    def visible(self, t):
        """Keys token t sees (causal): positions [0, seq_len - q_len + i + 1)."""
        return int(self.token_pos[t]) + 1

    def indexer_metadata(self, chunk_reqs):
        """DeepseekV32IndexerMetadata-shaped namespace: decode part (2-D per-token seq_lens
        [B, next_n], decode_lens, requires_padding) and prefill chunks of the given request
        counts (each: block_table rows, cu_seq_lens over its requests' whole contexts,
        cu_seqlen_ks / cu_seqlen_ke per token into that gather, token_start / token_end)."""
        nd = self.num_decodes
        decode = None
        if nd:
            next_n = int(self.q_lens[:nd].max())
            seq2d = np.zeros((nd, next_n), np.int32)
            for b in range(nd):
                for j in range(next_n):
                    seq2d[b, j] = self.seq_lens[b] - self.q_lens[b] + j + 1
            decode = SimpleNamespace(
                block_table=self.block_table[:nd],
                seq_lens=seq2d,
                decode_lens=self.q_lens[:nd].astype(np.int32),
                requires_padding=bool((self.q_lens[:nd] != next_n).any()),
            )
        chunks, r0 = [], nd
        for count in chunk_reqs:
            reqs = range(r0, r0 + count)
            cu = np.concatenate([[0], np.cumsum(self.seq_lens[r0 : r0 + count])]).astype(np.int32)
            ks, ke = [], []
            for local, r in enumerate(reqs):
                for i in range(self.q_lens[r]):
                    ks.append(cu[local])
                    ke.append(cu[local] + self.seq_lens[r] - self.q_lens[r] + i + 1)
            chunks.append(
                SimpleNamespace(
                    block_table=self.block_table[r0 : r0 + count],
                    local_cu_seq_lens=cu,
                    cu_seqlen_ks=np.array(ks, np.int32),
                    cu_seqlen_ke=np.array(ke, np.int32),
                    token_start=int(self.query_start_loc[r0]),
                    token_end=int(self.query_start_loc[r0 + count]),
                )
            )
            r0 += count
        assert r0 == self.num_reqs
        return SimpleNamespace(
            slot_mapping=self.slot_mapping(),
            num_decodes=nd,
            num_prefills=self.num_reqs - nd,
            num_decode_tokens=self.num_decode_tokens,
            decode=decode,
            prefill=SimpleNamespace(chunks=chunks) if chunks else None,
        )
