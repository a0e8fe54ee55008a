// CPU DSA layer: for each block of tokens, indexer logits (cleaned to -inf outside the windows)
// → top-k over each window → sparse MLA on the chosen rows (table form, -1 padded), each step
// through its own Run(). Scratch for the logits and, when not requested, the indices is
// allocated here per call and bounded by processing tokens in blocks.
#include "kernels/dsa/cpu.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "kernels/topk/topk.h"

namespace attnd::kernels::dsa {
namespace {

absl::Status InStep(const char* step, absl::Status s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(step, ": ", s.message()));
}

Tensor Rows(const Tensor& t, int64_t begin, int64_t count) {
  Tensor r = t;
  if (count > 0) {
    r.data = static_cast<char*>(t.data) + begin * t.strides[0] * DTypeSize(t.dtype);
  }
  r.shape[0] = count;
  return r;
}

}  // namespace

absl::Status RunCpuWithScratch(const Params& p, const ExecContext& ctx, int64_t scratch_bytes) {
  const int64_t t = p.index_q.dim(0), n = p.index_k.dim(0);
  if (t == 0) return absl::OkStatus();
  const int64_t row_bytes = std::max<int64_t>(n, 1) * static_cast<int64_t>(sizeof(float));
  const int64_t block =
      p.logits.present() ? t : std::clamp<int64_t>(scratch_bytes / row_bytes, 1, t);
  std::vector<float> logits_scratch;
  if (!p.logits.present()) {
    logits_scratch.resize(static_cast<size_t>(block * std::max<int64_t>(n, 1)));
  }
  std::vector<int32_t> indices_scratch;
  if (!p.indices.present()) indices_scratch.resize(static_cast<size_t>(block * p.topk));

  for (int64_t t0 = 0; t0 < t; t0 += block) {
    if (StopRequested(ctx)) return StoppedStatus();
    const int64_t count = std::min(block, t - t0);
    const Tensor logits = p.logits.present()
                              ? Rows(p.logits, t0, count)
                              : MakeTensor(logits_scratch.data(), DType::kF32, {count, n});
    const Tensor indices = p.indices.present()
                               ? Rows(p.indices, t0, count)
                               : MakeTensor(indices_scratch.data(), DType::kI32, {count, p.topk});
    absl::Status s = indexer_logits::Run(IndexerStep(p, t0, count, logits), ctx);
    if (!s.ok()) return InStep("indexer_logits", s);
    s = topk::Run(TopkStep(p, t0, count, logits, indices), ctx);
    if (!s.ok()) return InStep("topk", s);
    s = sparse_mla::Run(SparseMlaStep(p, t0, count, indices), ctx);
    if (!s.ok()) return InStep("sparse_mla", s);
  }
  return absl::OkStatus();
}

}  // namespace attnd::kernels::dsa
