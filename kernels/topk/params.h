// Parameters of the top-k operator (docs/CONTRACTS.md "topk"): per row of indexer logits, the
// positions of the k largest candidates in the row's window, optionally mapped through a block
// table to global KV slot ids ready for sparse MLA. Tensors are views owned by the caller.
#pragma once

#include <cstdint>

#include "kernels/common/tensor.h"

namespace attnd::kernels::topk {

inline constexpr int64_t kMaxK = 4096;

// What a written index counts from (docs/CONTRACTS.md "topk", "Index base").
enum class IndexBase : int32_t {
  kAbsolute = 0,  // the logits column n (the default)
  kRowStart = 1,  // n minus the row's clamped window start: max(ks, 0) (0 with lengths)
};

struct Params : WithTensors<Params> {
  // Inputs.
  Tensor logits;  // f32 [M, N], row stride ld >= N. NaN counts as -inf; -inf is never chosen.
  // The window of row m: exactly one of the two forms is given.
  Tensor ks;       // i32 [M], optional: candidates are columns [max(ks,0), min(ke,N)) ...
  Tensor ke;       // i32 [M], optional: ... given together with ks (empty when ke <= ks).
  Tensor lengths;  // i32 [M], optional: the same as ks = 0, ke = lengths.
  int64_t k = 0;   // 1 <= k <= kMaxK (the model's is 2048)

  // Optional fused mapping to KV slots: a chosen column of row m, as position n in index_base, is
  // written as block_table[b, n / page_size] * block_stride + n % page_size, b being row m's
  // request; a row without a request, a negative table entry, n / page_size >= max_blocks, or a
  // slot past INT32_MAX gives -1 instead (docs/CONTRACTS.md "topk").
  Tensor block_table;        // i32 [R, max_blocks], optional
  int64_t page_size = 0;     // > 0 with block_table, 0 without
  int64_t block_stride = 0;  // slots per block in the pool: 0 (= page_size) or page_size..
  // Row m's request b, one of three forms: b = m / rows_per_request (R * rows_per_request == M);
  // b = req_id_per_row[m] (none unless in [0, R)); or the b with cu_seqlens_q[b] <= m <
  // cu_seqlens_q[b + 1] (request_map.h; none when there is no such b). With either tensor,
  // rows_per_request stays 1.
  int64_t rows_per_request = 1;  // >= 1: consecutive rows sharing one block_table row
  Tensor req_id_per_row;         // i32 [M], optional (vLLM's req_id_per_token)
  Tensor cu_seqlens_q;           // i32 [R + 1], optional (SGLang extend)

  // kRowStart: a chosen column n of row m counts as its position p = n - begin inside the row's
  // window [begin, end) (begin = the clamped ks[m]; 0 with lengths), and p is what is written, or
  // what the block table maps (page p / page_size of row m's request). -1 padding
  // and values are the same in both bases.
  IndexBase index_base = IndexBase::kAbsolute;

  // Outputs. Row m holds its min(k, selectable) chosen columns (or KV slots) in ascending column
  // order, then -1 up to k. Ties at the threshold go to the lowest columns.
  Tensor indices;  // i32 [M, k] (row stride may be larger)
  Tensor values;   // f32 [M, k], optional: the logit of each chosen column; -inf where padded

  template <class Self, class F>
  static void Tensors(Self& self, F& f) {
    f("logits", self.logits, Role::kInput);
    f("ks", self.ks, Role::kInput);
    f("ke", self.ke, Role::kInput);
    f("lengths", self.lengths, Role::kInput);
    f("block_table", self.block_table, Role::kInput);
    f("req_id_per_row", self.req_id_per_row, Role::kInput);
    f("cu_seqlens_q", self.cu_seqlens_q, Role::kInput);
    f("indices", self.indices, Role::kOutput);
    f("values", self.values, Role::kOutput);
  }
};

}  // namespace attnd::kernels::topk
