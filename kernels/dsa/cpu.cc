// CPU DSA layer: for each block of tokens, indexer logits (cleaned to -inf outside the windows;
// the paged indexer in the paged form) → top-k over each window (mapped to kv rows through the
// block table in the paged form) → sparse MLA on the chosen rows (table form, -1 padded), each
// step through its own Run() (RunBlock, dsa.h). Scratch for the logits and, when not requested,
// the indices is allocated here per call and bounded by processing tokens in blocks (whole
// requests in the paged form).
#include "kernels/dsa/cpu.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/status.h"
#include "kernels/dsa/dsa.h"

namespace attnd::kernels::dsa {
namespace {

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
  const int64_t t = TokenRows(p), n = LogitsColumns(p), unit = RequestRows(p);
  if (t == 0) return absl::OkStatus();
  const int64_t unit_bytes = unit * std::max<int64_t>(n, 1) * static_cast<int64_t>(sizeof(float));
  if (!p.logits.present() && unit_bytes > kMaxScratchBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("dsa: the logits scratch of one request (", unit, " rows of ", n,
                     " columns) is ", unit_bytes, " bytes, over the CPU limit of ",
                     kMaxScratchBytes, "; place `logits` or send a narrower block table"));
  }
  const int64_t block =
      p.logits.present() ? t : std::clamp<int64_t>(scratch_bytes / unit_bytes, 1, t / unit) * unit;
  std::vector<float> logits_scratch;
  if (!p.logits.present()) {
    logits_scratch.resize(static_cast<size_t>(block * std::max<int64_t>(n, 1)));
  }
  std::vector<int32_t> indices_scratch;
  if (!p.indices.present()) indices_scratch.resize(static_cast<size_t>(block * p.topk));
  std::vector<int32_t> lengths_scratch;
  if (p.paged()) lengths_scratch.assign(static_cast<size_t>(block), kWholeRowLength);

  for (int64_t t0 = 0; t0 < t; t0 += block) {
    if (StopRequested(ctx)) return StoppedStatus();
    const int64_t count = std::min(block, t - t0);
    BlockScratch s;
    s.logits = p.logits.present() ? Rows(p.logits, t0, count)
                                  : MakeTensor(logits_scratch.data(), DType::kF32, {count, n});
    s.indices = p.indices.present()
                    ? Rows(p.indices, t0, count)
                    : MakeTensor(indices_scratch.data(), DType::kI32, {count, p.topk});
    if (p.paged()) s.lengths = MakeTensor(lengths_scratch.data(), DType::kI32, {count});
    ATTND_RETURN_IF_ERROR(RunBlock(p, t0, count, s, ctx));
  }
  return absl::OkStatus();
}

}  // namespace attnd::kernels::dsa
