#include "kernels/dsa/gpu.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/common/gpu/runtime.h"
#include "kernels/common/math.h"
#include "kernels/common/status.h"
#include "kernels/dsa/dsa.h"
#include "kernels/indexer_logits/indexer_logits.h"
#include "kernels/indexer_logits_paged/indexer_logits_paged.h"
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

// The block of token rows each pass handles (whole requests in the paged form), and the
// scratch it needs, in this order in the workspace.
struct Layout {
  int64_t block = 1;
  int64_t logits_bytes = 0;   // 0 when the caller placed the logits
  int64_t indices_bytes = 0;  // 0 when the caller placed the indices
  int64_t lengths_bytes = 0;  // paged form: top-k's whole-row lengths
  int64_t scratch() const { return logits_bytes + indices_bytes + lengths_bytes; }
};

Layout MakeLayout(const Params& p) {
  const int64_t t = std::max<int64_t>(TokenRows(p), 1), n = std::max<int64_t>(LogitsColumns(p), 1);
  const int64_t unit = std::max<int64_t>(RequestRows(p), 1);
  Layout l;
  l.block = p.logits.present() ? t
                               : std::clamp<int64_t>(kGpuLogitsScratchBytes / (unit * n * 4), 1,
                                                     std::max<int64_t>(t / unit, 1)) *
                                     unit;
  if (!p.logits.present()) l.logits_bytes = AlignUp(l.block * n * 4);
  if (!p.indices.present()) l.indices_bytes = AlignUp(l.block * p.topk * 4);
  if (p.paged()) l.lengths_bytes = AlignUp(l.block * 4);
  return l;
}

// The scratch views of rows [t0, t0 + count): the caller's logits / indices when placed, else
// the given scratch addresses (the workspace's, or the placeholder in queries).
BlockScratch Views(const Params& p, int64_t t0, int64_t count, char* logits, char* indices,
                   char* lengths) {
  BlockScratch s;
  s.logits = p.logits.present() ? Rows(p.logits, t0, count)
                                : MakeTensor(logits, DType::kF32, {count, LogitsColumns(p)});
  s.indices = p.indices.present() ? Rows(p.indices, t0, count)
                                  : MakeTensor(indices, DType::kI32, {count, p.topk});
  if (p.paged()) s.lengths = MakeTensor(lengths, DType::kI32, {count});
  return s;
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

// Calls f(step name, implementation or null, refusals, workspace bytes) for each step of the
// first block, with scratch views as RunGpu lays them out (placeholders).
template <class F>
void ForEachStep(const Params& p, F&& f) {
  const Layout l = MakeLayout(p);
  const int64_t count = std::min(l.block, TokenRows(p));
  const BlockScratch s = Views(p, 0, count, placeholder, placeholder, placeholder);
  auto visit = [&](const char* step, const auto& impls, const auto& sp) {
    std::string why;
    const auto* impl = Pick(impls, sp, &why);
    f(step, impl != nullptr, why, impl != nullptr && impl->workspace ? impl->workspace(sp) : 0);
  };
  if (p.paged()) {
    visit("indexer_logits_paged", indexer_logits_paged::Implementations(),
          PagedIndexerStep(p, 0, count, s.logits));
    visit("topk", topk::Implementations(),
          PagedTopkStep(p, 0, count, s.logits, s.lengths, s.indices));
  } else {
    visit("indexer_logits", indexer_logits::Implementations(), IndexerStep(p, 0, count, s.logits));
    visit("topk", topk::Implementations(), TopkStep(p, 0, count, s.logits, s.indices));
  }
  visit("sparse_mla", sparse_mla::Implementations(), SparseMlaStep(p, 0, count, s.indices));
}

}  // namespace

bool GpuSupports(const Params& p, std::string* why) {
  bool ok = true;
  ForEachStep(p, [&](const char* step, bool found, const std::string& w, int64_t) {
    if (ok && !found) {
      *why = absl::StrCat(step, " step: ", w);
      ok = false;
    }
  });
  return ok;
}

int64_t GpuWorkspaceBytes(const Params& p) {
  int64_t steps = 0;
  ForEachStep(p, [&](const char*, bool, const std::string&, int64_t bytes) {
    steps = std::max(steps, bytes);
  });
  return MakeLayout(p).scratch() + AlignUp(steps);
}

absl::Status RunGpu(const Params& p, const ExecContext& ctx) {
  const int64_t t = TokenRows(p);
  if (t == 0) return absl::OkStatus();
  const Layout l = MakeLayout(p);
  const int64_t scratch = l.scratch();
  if (scratch > 0 && (ctx.workspace == nullptr || ctx.workspace_bytes < scratch)) {
    return absl::InternalError(
        absl::StrCat("dsa: workspace of ", ctx.workspace_bytes, " bytes, want at least ", scratch));
  }
  char* ws = static_cast<char*>(ctx.workspace);
  char* const logits = ws;
  char* const indices = l.logits_bytes > 0 ? ws + l.logits_bytes : ws;
  char* const lengths = l.lengths_bytes > 0 ? ws + l.logits_bytes + l.indices_bytes : ws;
  ExecContext step_ctx = ctx;
  step_ctx.workspace = ctx.workspace_bytes > scratch ? ws + scratch : nullptr;
  step_ctx.workspace_bytes = ctx.workspace_bytes > scratch ? ctx.workspace_bytes - scratch : 0;
  if (p.paged()) {  // top-k's window: every column (dsa.h kWholeRowLength), stream-ordered
    GPU_RETURN_IF_ERROR(gpu::MemsetAsync(lengths, kWholeRowByte, static_cast<size_t>(l.block * 4),
                                         static_cast<gpu::Stream>(ctx.stream)));
  }
  for (int64_t t0 = 0; t0 < t; t0 += l.block) {
    // Host-side: no further launches once the call is asked to stop (what is enqueued runs).
    if (StopRequested(ctx)) return StoppedStatus();
    const int64_t count = std::min(l.block, t - t0);
    ATTND_RETURN_IF_ERROR(
        RunBlock(p, t0, count, Views(p, t0, count, logits, indices, lengths), step_ctx));
  }
  return absl::OkStatus();
}

}  // namespace attnd::kernels::dsa
