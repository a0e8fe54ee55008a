#include "kernels/dsa/gpu.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/common/math.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/sparse_mla/sparse_mla.h"
#include "kernels/topk/topk.h"

namespace attnd::kernels::dsa {
namespace {

constexpr int64_t kAlign = 256;

// Stands in for scratch in Supports/workspace queries (aligned like the real workspace; never
// dereferenced on the host).
alignas(kAlign) char placeholder[kAlign];

int64_t AlignUp(int64_t bytes) { return CeilDiv(bytes, kAlign) * kAlign; }

Tensor Rows(const Tensor& t, int64_t begin, int64_t count) {
  Tensor r = t;
  if (count > 0) r.data = static_cast<char*>(t.data) + begin * t.strides[0] * DTypeSize(t.dtype);
  r.shape[0] = count;
  return r;
}

// The block of tokens each pass handles, and the scratch it needs.
struct Layout {
  int64_t block = 1;
  int64_t logits_bytes = 0;   // 0 when the caller placed the logits
  int64_t indices_bytes = 0;  // 0 when the caller placed the indices
};

Layout MakeLayout(const Params& p) {
  const int64_t t = p.index_q.dim(0), n = std::max<int64_t>(p.index_k.dim(0), 1);
  Layout l;
  l.block = p.logits.present()
                ? std::max<int64_t>(t, 1)
                : std::clamp<int64_t>(kGpuLogitsScratchBytes / (n * 4), 1, std::max<int64_t>(t, 1));
  if (!p.logits.present()) l.logits_bytes = AlignUp(l.block * n * 4);
  if (!p.indices.present()) l.indices_bytes = AlignUp(l.block * p.topk * 4);
  return l;
}

Tensor LogitsView(const Params& p, int64_t t0, int64_t count, void* scratch) {
  if (p.logits.present()) return Rows(p.logits, t0, count);
  return MakeTensor(scratch, DType::kF32, {count, p.index_k.dim(0)});
}

Tensor IndicesView(const Params& p, int64_t t0, int64_t count, void* scratch) {
  if (p.indices.present()) return Rows(p.indices, t0, count);
  return MakeTensor(scratch, DType::kI32, {count, p.topk});
}

template <class P>
const Impl<P>* Pick(const std::vector<Impl<P>>& impls, const P& sp, std::string* why) {
  ExecContext ctx;
  ctx.backend = kGpuBackend;
  return SelectImpl(impls, sp, ctx, why);
}

template <class P>
int64_t WorkspaceOf(const std::vector<Impl<P>>& impls, const P& sp) {
  std::string why;
  const Impl<P>* impl = Pick(impls, sp, &why);
  return impl != nullptr && impl->workspace ? impl->workspace(sp) : 0;
}

absl::Status InStep(const char* step, absl::Status s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(step, ": ", s.message()));
}

}  // namespace

bool GpuSupports(const Params& p, std::string* why) {
  const Layout l = MakeLayout(p);
  const int64_t count = std::min(l.block, p.index_q.dim(0));
  const Tensor logits = LogitsView(p, 0, count, placeholder);
  const Tensor indices = IndicesView(p, 0, count, placeholder);
  std::string w;
  if (Pick(indexer_logits::Implementations(), IndexerStep(p, 0, count, logits), &w) == nullptr) {
    *why = absl::StrCat("indexer_logits step: ", w);
    return false;
  }
  if (Pick(topk::Implementations(), TopkStep(p, 0, count, logits, indices), &w) == nullptr) {
    *why = absl::StrCat("topk step: ", w);
    return false;
  }
  if (Pick(sparse_mla::Implementations(), SparseMlaStep(p, 0, count, indices), &w) == nullptr) {
    *why = absl::StrCat("sparse_mla step: ", w);
    return false;
  }
  return true;
}

int64_t GpuWorkspaceBytes(const Params& p) {
  const Layout l = MakeLayout(p);
  const int64_t count = std::min(l.block, p.index_q.dim(0));
  const Tensor logits = LogitsView(p, 0, count, placeholder);
  const Tensor indices = IndicesView(p, 0, count, placeholder);
  int64_t steps = WorkspaceOf(indexer_logits::Implementations(), IndexerStep(p, 0, count, logits));
  steps =
      std::max(steps, WorkspaceOf(topk::Implementations(), TopkStep(p, 0, count, logits, indices)));
  steps = std::max(steps,
                   WorkspaceOf(sparse_mla::Implementations(), SparseMlaStep(p, 0, count, indices)));
  return l.logits_bytes + l.indices_bytes + AlignUp(steps);
}

absl::Status RunGpu(const Params& p, const ExecContext& ctx) {
  const int64_t t = p.index_q.dim(0);
  if (t == 0) return absl::OkStatus();
  const Layout l = MakeLayout(p);
  const int64_t scratch = l.logits_bytes + l.indices_bytes;
  if (scratch > 0 && (ctx.workspace == nullptr || ctx.workspace_bytes < scratch)) {
    return absl::InternalError(
        absl::StrCat("dsa: workspace of ", ctx.workspace_bytes, " bytes, want at least ", scratch));
  }
  char* ws = static_cast<char*>(ctx.workspace);
  void* logits_scratch = l.logits_bytes > 0 ? ws : nullptr;
  void* indices_scratch = l.indices_bytes > 0 ? ws + l.logits_bytes : nullptr;
  ExecContext step_ctx = ctx;
  step_ctx.workspace = ctx.workspace_bytes > scratch ? ws + scratch : nullptr;
  step_ctx.workspace_bytes = ctx.workspace_bytes > scratch ? ctx.workspace_bytes - scratch : 0;
  for (int64_t t0 = 0; t0 < t; t0 += l.block) {
    // Host-side: no further launches once the call is asked to stop (what is enqueued runs).
    if (StopRequested(ctx)) return StoppedStatus();
    const int64_t count = std::min(l.block, t - t0);
    const Tensor logits = LogitsView(p, t0, count, logits_scratch);
    const Tensor indices = IndicesView(p, t0, count, indices_scratch);
    absl::Status s = indexer_logits::Run(IndexerStep(p, t0, count, logits), step_ctx);
    if (!s.ok()) return InStep("indexer_logits", s);
    s = topk::Run(TopkStep(p, t0, count, logits, indices), step_ctx);
    if (!s.ok()) return InStep("topk", s);
    s = sparse_mla::Run(SparseMlaStep(p, t0, count, indices), step_ctx);
    if (!s.ok()) return InStep("sparse_mla", s);
  }
  return absl::OkStatus();
}

}  // namespace attnd::kernels::dsa
