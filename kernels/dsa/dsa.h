// Fused DSA attention layer: the host entry. Validate checks the whole call (each step's
// constraints, with messages naming this op's tensors), Count gives FLOPs and logical bytes,
// Run validates and dispatches.
//   ATTND_RETURN_IF_ERROR(dsa::Run(params, ctx));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/dsa/params.h"
#include "kernels/indexer_logits/params.h"
#include "kernels/indexer_logits_paged/params.h"
#include "kernels/sparse_mla/params.h"
#include "kernels/topk/params.h"

namespace attnd::kernels::dsa {

inline constexpr int64_t kMaxTopk = 4096;

// The paged form's top-k takes every logits column of a row as its window (the indexer leaves
// -inf outside each token's visible positions, and -inf is never chosen): its `lengths` scratch
// holds this value in every entry, bytes of 0x7F, so a byte memset writes it on a GPU.
inline constexpr int kWholeRowByte = 0x7F;
inline constexpr int32_t kWholeRowLength = 0x7F7F7F7F;

// T: the token rows (B·next_n in the paged form). Needs a validated call, or one whose index_q
// has its rank.
int64_t TokenRows(const Params& p);
// N: the indexer logits columns (gathered: index_k's rows; paged: logits' dim 1 when given, else
// max_blocks · index_block_size).
int64_t LogitsColumns(const Params& p);
// The rows one block of the steps never splits: next_n in the paged form (a request's tokens
// share its block tables), else 1.
int64_t RequestRows(const Params& p);
// The kv_block_table the paged form maps positions through (kv_block_table, or
// index_block_table when absent) and its tokens per entry.
const Tensor& KvBlockTable(const Params& p);
int64_t KvBlockSize(const Params& p);

// Every shape, dtype, stride and scalar of the three steps plus their agreement (T, N, topk).
// INVALID_ARGUMENT names the tensor as this op calls it (index_q, index_k, …). Reads no data.
absl::Status Validate(const Params& p);

// FLOPs: the indexer's 2·H_i·D_i per in-window (token, row) pair plus sparse MLA's
// 2·H·(d_qk + 512)·E, E = Σ_t min(topk, window_t). Logical bytes: each input read once (kv: one
// row per selection: 2·d_qk bytes bf16, 656 FP8, d_qk per-tensor FP8), each output written once;
// the logits are internal and not counted.
// Reads ks / ke (host-resident calls only). Paged form: the paged indexer's count (its logits
// writes left out) with E over each token's visible length; reads context_lens.
WorkCount Count(const Params& p);

// The three steps' params for tokens [t0, t0 + count) of p, with the given logits scratch and
// indices (each [count, …]); the building blocks of the CPU implementation and the tests.
indexer_logits::Params IndexerStep(const Params& p, int64_t t0, int64_t count,
                                   const Tensor& logits);
topk::Params TopkStep(const Params& p, int64_t t0, int64_t count, const Tensor& logits,
                      const Tensor& indices);
sparse_mla::Params SparseMlaStep(const Params& p, int64_t t0, int64_t count, const Tensor& indices);
// The paged form's first two steps for token rows [t0, t0 + count), t0 and count multiples of
// next_n; lengths is i32 [count] of kWholeRowLength.
indexer_logits_paged::Params PagedIndexerStep(const Params& p, int64_t t0, int64_t count,
                                              const Tensor& logits);
topk::Params PagedTopkStep(const Params& p, int64_t t0, int64_t count, const Tensor& logits,
                           const Tensor& lengths, const Tensor& indices);

// One block's scratch views ([count, …] each): logits f32 [count, N], indices i32 [count, topk],
// lengths i32 [count] (paged form only).
struct BlockScratch {
  Tensor logits, indices, lengths;
};
// The three steps on token rows [t0, t0 + count) through their own Run() on ctx, which picks
// the backend (CPU or GPU); each step's error comes back with the step's name. Shared by the
// CPU and GPU implementations.
absl::Status RunBlock(const Params& p, int64_t t0, int64_t count, const BlockScratch& scratch,
                      const ExecContext& ctx);
// A step's status with the step's name in front of its message (payloads kept); OK as is.
absl::Status InStep(const char* step, absl::Status s);

const std::vector<Impl<Params>>& Implementations();

// Validate + Dispatch. *impl (optional) receives the implementation's name.
absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl = nullptr);

}  // namespace attnd::kernels::dsa
