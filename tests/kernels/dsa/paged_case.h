// Random paged DsaAttention calls for the tests, with both caches built the way vLLM builds them
// (docs/VLLM.md): the indexer cache in block rows (a block's keys, then their f32 scales; each key
// quantised with its own amax / 448 scale), the MLA cache as a pool of rows (bf16 or the FP8
// 656-byte rows) viewed flat; each request's blocks drawn from a shuffled pool, so the block
// tables scatter a request through both caches; unused table entries and the rows of other
// layers interleaved in the MLA pool (kv_block_stride > kv_block_size) are poison that would
// show if read. Outputs NaN-poisoned by the runner.
//   PagedDsaCase c(spec, rng);  c.SetContexts({70, 3});  dsa::Params p = c.MakeParams();
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/dsa/params.h"
#include "tests/harness/host_tensor.h"

namespace attnd::testing {

struct PagedDsaSpec {
  int64_t batch = 3;
  int64_t next_n = 1;
  int64_t index_heads = 16;
  int64_t index_dim = 128;
  int64_t topk = 64;
  int64_t heads = 16;
  int64_t d_qk = 576;
  int64_t index_block_size = 16;
  int64_t max_blocks = 8;     // index_block_table columns
  int64_t index_blocks = 40;  // blocks in the indexer cache (and the MLA pool when shared)
  // A separate kv_block_table (SGLang-like: its own page size and pool) instead of one table.
  bool separate_kv_table = false;
  int64_t kv_block_size = 0;    // separate table: tokens per entry (0: index_block_size)
  int64_t kv_block_stride = 0;  // rows per block in the MLA pool (0: kv_block_size)
  int64_t kv_blocks = 0;        // separate table: blocks in the MLA pool (0: index_blocks)
  bool fp8_kv = false;          // the FP8 656-byte MLA rows (d_qk 576) instead of bf16
  // The per-tensor FP8 MLA rows (u8 [S, d_qk], vLLM's kv_cache_dtype "fp8"; tests/harness/
  // fp8_kv.h's writer) with kv_scale, named in kv_layout.
  bool per_tensor_kv = false;
  float kv_scale = 0.03125f;
  bool per_token_lens = false;  // context_lens [B, next_n] instead of [B]
  bool with_logits = false;
  bool with_indices = true;
  bool with_lse = true;
  int64_t pad = 0;  // extra elements on leading strides (index_q, index_cache, tables, q, kv, …)
};

// The paged indexer's Hopper kernel shape (H_i 64, D_i 128, block 64) at next_n 2, three
// requests of up to three blocks: the spec of the index_precision FAST cases.
inline PagedDsaSpec FastIndexerSpec() {
  PagedDsaSpec spec;
  spec.next_n = 2;
  spec.index_heads = 64;
  spec.index_block_size = 64;
  spec.max_blocks = 3;
  spec.index_blocks = 12;
  return spec;
}

class PagedDsaCase {
 public:
  PagedDsaCase(const PagedDsaSpec& spec, std::mt19937_64& rng);

  // Request b's context (the [B] form: tokens in its cache, the next_n new ones included), and
  // the block tables: each request gets distinct blocks of each pool for ceil(L / block) entries,
  // every other entry an out-of-range id. With per_token_lens, token j of request b sees
  // contexts[b] − next_n + j + 1 positions unless SetTokenLength overrides it.
  void SetContexts(const std::vector<int64_t>& contexts);
  void SetTokenLength(int64_t b, int64_t j, int32_t length);  // per_token_lens only
  // Overwrites entry i of request b's row in the index table / the separate kv table (hostile
  // ids: negative, past the pool), after SetContexts.
  void SetIndexBlock(int64_t b, int64_t i, int32_t id);
  void SetKvBlock(int64_t b, int64_t i, int32_t id);  // separate_kv_table only
  kernels::dsa::Params MakeParams();
  std::vector<HostTensor*> Outputs();  // out, lse, indices, logits (those present)

  const PagedDsaSpec& spec() const { return spec_; }
  int64_t t() const { return spec_.batch * spec_.next_n; }
  int64_t kv_block_size() const;
  HostTensor& out() { return out_; }
  HostTensor& lse() { return lse_; }
  HostTensor& indices() { return indices_; }
  HostTensor& logits() { return logits_; }

 private:
  PagedDsaSpec spec_;
  std::mt19937_64 rng_;
  HostTensor index_q_, index_cache_, index_table_, context_lens_, index_weights_;
  HostTensor kv_table_, q_, kv_;
  HostTensor logits_, out_, lse_, indices_;
};

}  // namespace attnd::testing
