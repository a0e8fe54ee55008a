// The decode-step benchmark's in-process baseline (docs/BENCHMARKS.md "Decode step"): the paged
// DsaAttention that attnd would run, called in the caller's own process on the caller's stream,
// through the same operator entry the daemon uses (validate, then the first implementation of
// the GPU backend that supports the call) with a caller-owned workspace. A C ABI for ctypes:
//   bytes = attnd_inproc_dsa_paged(&shape, &ptrs, stream, nullptr, 0, err, n)  // workspace query
//   rc    = attnd_inproc_dsa_paged(&shape, &ptrs, stream, ws, bytes, err, n)   // launches only
// Returns >= 0 (the workspace bytes, or 0 after a launch) or -1 with the reason in err. Nothing
// here synchronises or allocates, so a torch stream keeps its order and can run ahead.
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/common/tensor.h"
#include "kernels/dsa/dsa.h"
#include "kernels/dsa/params.h"

namespace {

using attnd::kernels::DType;
using attnd::kernels::MakeTensor;
using attnd::kernels::Tensor;
namespace dsa = attnd::kernels::dsa;

}  // namespace

extern "C" {

// The call's sizes (the paged form with one block table for both caches, as vLLM keeps them).
struct AttndInprocShape {
  int64_t batch, next_n, heads, d_qk, index_heads, index_dim, topk;
  int64_t num_index_blocks, index_block_size, max_blocks, kv_rows, kv_row_bytes;
  float sm_scale;
};

// Device pointers (contiguous tensors; lse may be null).
struct AttndInprocPointers {
  void *index_q, *index_weights, *index_cache, *block_table, *context_lens, *q, *kv, *out, *lse;
};

int64_t attnd_inproc_dsa_paged(const AttndInprocShape* s, const AttndInprocPointers* d,
                               void* stream, void* workspace, int64_t workspace_bytes, char* err,
                               int64_t err_len) {
  auto fail = [&](const std::string& why) -> int64_t {
    if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", why.c_str());
    return -1;
  };
  const int64_t t = s->batch * s->next_n;
  dsa::Params p;
  p.index_q =
      MakeTensor(d->index_q, DType::kFp8E4M3, {s->batch, s->next_n, s->index_heads, s->index_dim});
  p.index_weights = MakeTensor(d->index_weights, DType::kF32, {t, s->index_heads});
  p.index_cache = MakeTensor(d->index_cache, DType::kU8,
                             {s->num_index_blocks, s->index_block_size * (s->index_dim + 4)});
  p.index_block_size = s->index_block_size;
  p.index_block_table = MakeTensor(d->block_table, DType::kI32, {s->batch, s->max_blocks});
  p.context_lens = MakeTensor(d->context_lens, DType::kI32, {s->batch});
  p.q = MakeTensor(d->q, DType::kBF16, {t, s->heads, s->d_qk});
  p.kv = s->kv_row_bytes == 2 * s->d_qk
             ? MakeTensor(d->kv, DType::kBF16, {s->kv_rows, s->d_qk})
             : MakeTensor(d->kv, DType::kU8, {s->kv_rows, s->kv_row_bytes});
  p.topk = s->topk;
  p.sm_scale = s->sm_scale;
  p.out = MakeTensor(d->out, DType::kBF16, {t, s->heads, 512});
  if (d->lse != nullptr) p.lse = MakeTensor(d->lse, DType::kF32, {t, s->heads});

  attnd::kernels::ExecContext ctx;
  ctx.backend = attnd::kernels::kGpuBackend;
  ctx.stream = stream;
  if (absl::Status v = dsa::Validate(p); !v.ok()) return fail(v.ToString());
  std::string why;
  const auto* impl = attnd::kernels::SelectImpl(dsa::Implementations(), p, ctx, &why);
  if (impl == nullptr) return fail("no GPU implementation: " + why);
  const int64_t need = impl->workspace ? impl->workspace(p) : 0;
  if (workspace == nullptr) return need;
  if (workspace_bytes < need) {
    return fail("workspace of " + std::to_string(workspace_bytes) + " bytes, want " +
                std::to_string(need));
  }
  ctx.workspace = workspace;
  ctx.workspace_bytes = workspace_bytes;
  std::string name;
  if (absl::Status st = dsa::Run(p, ctx, &name); !st.ok()) return fail(name + ": " + st.ToString());
  return 0;
}

}  // extern "C"
