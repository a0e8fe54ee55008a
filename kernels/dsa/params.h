// Parameters of the fused DSA attention layer (docs/CONTRACTS.md "dsa_attention"): indexer
// logits → top-k → sparse MLA in one call. T query tokens, N cache tokens (row n of index_k and of
// kv is the same token), indexer heads H_i of dim D_i, attention heads H of dim d_qk (512 or 576).
// Two forms, told apart by index_cache: gathered (index_k, ks/ke; the fields below as written)
// and paged (decode over the frontend's two paged caches; docs/CONTRACTS.md "dsa_attention",
// "Paged form"), whose differences each field states.
#pragma once

#include <cstdint>

#include "kernels/common/cache_layout.h"
#include "kernels/common/precision.h"
#include "kernels/common/tensor.h"

namespace attnd::kernels::dsa {

struct Params : WithTensors<Params> {
  // Indexer inputs (kernels/indexer_logits/params.h).
  Tensor index_q;        // fp8 e4m3 [T, H_i, D_i]; paged: [B, next_n, H_i, D_i], T = B·next_n
  Tensor index_k;        // fp8 e4m3 [N, D_i]; paged: absent
  Tensor index_k_scale;  // f32 [N]; paged: absent
  Tensor index_weights;  // f32 [T, H_i] (paged: row b·next_n + j is token j of request b)
  // Token t's candidates are cache rows [max(ks[t], 0), min(ke[t], N)) (causal prefill of a
  // prompt after P cached tokens: ks = 0, ke = P + t + 1). Untrusted values are clamped.
  // Paged: absent (the windows come from context_lens).
  Tensor ks;            // i32 [T]
  Tensor ke;            // i32 [T]
  int64_t topk = 2048;  // k: 1 <= k <= 4096; a token keeps min(k, window) rows

  // Paged form (present index_cache selects it; kernels/indexer_logits_paged/params.h). The
  // indexer keys of request b's position n are in index_cache block index_block_table[b, n /
  // index_block_size], slot n % index_block_size; its MLA row is kv row
  //   kv_block_table[b, n / kv_block_size] · kv_block_stride + n % kv_block_size.
  // Untrusted table entries and lengths are masked or clamped, never rejected.
  Tensor index_cache;  // u8 [num_blocks, index_block_size·(D_i + 4)]: keys, then f32 scales
  // index_cache's named layout (indexer_logits_paged::kKvCacheLayouts) or kUnspecified.
  CacheLayout index_cache_layout = CacheLayout::kUnspecified;
  int64_t index_block_size = 64;  // tokens per index_cache block, >= 1
  Tensor index_block_table;       // i32 [B, max_blocks]
  // i32 [B] (token j of request b sees context_lens[b] − next_n + j + 1 positions) or
  // [B, next_n] (token j sees context_lens[b, j]); clamped to [0, N].
  Tensor context_lens;
  // i32 [B, max_kv_blocks], optional: absent = index_block_table (one table for both caches,
  // as vLLM keeps them).
  Tensor kv_block_table;
  int64_t kv_block_size = 0;    // tokens per kv_block_table entry; 0 = index_block_size
  int64_t kv_block_stride = 0;  // kv rows per block; 0 = kv_block_size, else >= kv_block_size
  bool paged() const { return index_cache.present(); }

  // Sparse MLA inputs (kernels/sparse_mla/params.h).
  Tensor q;   // bf16 [T, H, d_qk]
  Tensor kv;  // bf16 [N, d_qk], row stride >= d_qk; or sparse_mla's FP8 cache, u8
              // [N, 656] with d_qk 576; or its per-tensor FP8 rows, u8 [N, d_qk] with
              // kv_scale (kernels/sparse_mla/params.h). Paged: [S, …], the MLA cache's pool
              // of rows (S any), row = slot as mapped above
  // The per-tensor FP8 cache's scale (value = e4m3 code × kv_scale; finite, > 0): required
  // with the per-tensor layouts, 0 (unset) with every other one. Both forms.
  float kv_scale = 0;
  // kv's named layout: one of sparse_mla::kKvLayouts, or kUnspecified (inferred from its dtype
  // and shape). Checked by Validate; the math does not read it.
  CacheLayout kv_layout = CacheLayout::kUnspecified;
  float sm_scale = 0;  // softmax scale (> 0, finite)
  // Numerics of out (kernels/common/precision.h): kFast rounds P to bf16 before P·V.
  Precision precision = Precision::kFast;
  // Numerics of the indexer step (indexer_logits / indexer_logits_paged `precision`; docs/
  // ACCURACY.md "Indexer logits"): kHigh the exact f32 sums, kFast the FP8 tensor-core
  // accumulation (opt-in). `precision` above stays the attention output's.
  Precision index_precision = Precision::kHigh;
  // The sparse MLA step's batch-invariant plan (sparse_mla::Params::batch_invariant): each
  // token's out and lse bitwise the same whatever else is in the call.
  bool batch_invariant = false;

  // Scratch, optional: f32 [T, N] (row stride >= N). Present: the call leaves the cleaned
  // indexer logits there (-inf outside each window). Absent: the CPU implementation allocates
  // blocks of rows itself (at most 64 MiB at a time). Paged: N is its dim 1 when present (a
  // token sees at most N positions), else max_blocks · index_block_size.
  Tensor logits;

  // Outputs.
  Tensor out;      // bf16 [T, H, 512]
  Tensor lse;      // f32 [T, H], optional (natural log; -inf for a token with an empty window)
  Tensor indices;  // i32 [T, topk], optional: the chosen cache rows, ascending, then -1
                   // (paged: the kv rows of the chosen positions, in ascending position order)

  template <class Self, class F>
  static void Tensors(Self& self, F& f) {
    f("index_q", self.index_q, Role::kInput);
    f("index_k", self.index_k, Role::kInput);
    f("index_k_scale", self.index_k_scale, Role::kInput);
    f("index_weights", self.index_weights, Role::kInput);
    f("ks", self.ks, Role::kInput);
    f("ke", self.ke, Role::kInput);
    f("index_cache", self.index_cache, Role::kInput);
    f("index_block_table", self.index_block_table, Role::kInput);
    f("context_lens", self.context_lens, Role::kInput);
    f("kv_block_table", self.kv_block_table, Role::kInput);
    f("q", self.q, Role::kInput);
    f("kv", self.kv, Role::kInput);
    f("logits", self.logits, Role::kOutput);
    f("out", self.out, Role::kOutput);
    f("lse", self.lse, Role::kOutput);
    f("indices", self.indices, Role::kOutput);
  }
};

}  // namespace attnd::kernels::dsa
